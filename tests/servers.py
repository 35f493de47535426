"""A loopback HTTP server for the tests: serves a directory with byte ranges (zarr reads shard indexes
with range requests, as real servers allow) and counts the requests it answers."""

from __future__ import annotations

import contextlib
import functools
import http.server
import io
import os
import threading
from typing import Iterator


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """http.server plus single byte ranges; quiet; counts requests on the server."""

    def log_message(self, *args):
        pass

    def send_head(self):
        self.server.requests.append(self.path)
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or not os.path.isfile(path):
            return super().send_head()
        with open(path, "rb") as fh:
            data = fh.read()
        a, _, b = rng.removeprefix("bytes=").partition("-")
        start, stop = (
            (len(data) - int(b), len(data)) if a == "" else (int(a), min(len(data), int(b) + 1 if b else len(data)))
        )
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        return io.BytesIO(data[start:stop])


class ServedURL(str):
    """The base URL of a running server; `.requests` lists the paths it was asked for, in order."""

    requests: list[str]


@contextlib.contextmanager
def serve(directory) -> Iterator[ServedURL]:
    """Serve `directory` on 127.0.0.1; yields its base URL, whose `.requests` lists the paths asked."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(directory))
    )
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = ServedURL(f"http://127.0.0.1:{server.server_address[1]}")
        url.requests = server.requests
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
