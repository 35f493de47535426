"""A loopback HTTP server for the tests and the benchmarks (which import it from here): serves a directory on
127.0.0.1 with single byte ranges (as object stores and real web servers do), optionally throttled to a
bandwidth shared by all connections, and counts the requests it answers and the body bytes it sends. A body
piece is counted before it is written: counted after, a loaded machine let the client read a response and `reset()` the
counts before the server thread added it, so one epoch's count could hold bytes of a request made before it
(a loader's opening reads).

http.server is enough here: the point is a faithful stand-in for a remote store (ranges, a
bandwidth cap), not speed. It reads only the asked range from disk, keeps connections alive
(HTTP/1.1) and has a deep accept queue, so dozens of concurrent range requests do not wait on TCP
retries.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
import time

_PIECE = 64 << 10


class _Throttle:
    """A bandwidth cap shared by every connection: each piece waits for its slot on one timeline."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n: int) -> None:
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - now - n / self.rate
        if wait > 0:
            time.sleep(wait)


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._send(body=True)

    def do_HEAD(self) -> None:
        self._send(body=False)

    def _send(self, body: bool) -> None:
        server = self.server
        with server.lock:
            server.requests.append((self.command, self.path, self.headers.get("Range")))
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, stop = 0, size
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[len("bytes=") :].partition("-")
            start, stop = (max(0, size - int(b)), size) if a == "" else (int(a), min(size, int(b) + 1 if b else size))
            if start >= stop:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not body:
            return
        with open(path, "rb") as fh:
            fh.seek(start)
            left = stop - start
            while left:
                piece = fh.read(min(left, _PIECE))
                if not piece:
                    break
                server.throttle.take(len(piece))
                with server.lock:  # counted before it is written: once a client has the bytes they are counted
                    server.bytes_sent += len(piece)
                self.wfile.write(piece)
                left -= len(piece)


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True


class LoopbackServer:
    """`with LoopbackServer(directory, rate=25e6) as srv:` serves `directory` at `srv.url`;
    `srv.requests` lists (method, path, Range header) and `srv.bytes_sent` counts body bytes.
    `rate` is a shared cap in bytes/s (None: unthrottled)."""

    def __init__(self, directory: str | os.PathLike, rate: float | None = None) -> None:
        self.directory = os.fspath(directory)
        self.rate = rate

    def __enter__(self) -> LoopbackServer:
        self._server = _Server(("127.0.0.1", 0), functools.partial(_Handler, directory=self.directory))
        self._server.requests, self._server.bytes_sent = [], 0
        self._server.lock, self._server.throttle = threading.Lock(), _Throttle(self.rate)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        return self._server.requests

    @property
    def bytes_sent(self) -> int:
        return self._server.bytes_sent

    def reset(self) -> None:
        """Forget the counts so far."""
        with self._server.lock:
            self._server.requests.clear()
            self._server.bytes_sent = 0
