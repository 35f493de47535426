"""Hostile servers and cache directories (issue 30, round two): one regression test per finding, each
reproducing it from scratch. The server counts the bytes it sends, so a bound is checked by a counter,
not by memory or time.

4: a range request answered 200 with an endless body (or 206 with an overlong one) is never read past
   what was asked.
8: every HTTP request has a total deadline, not only an idle timeout (a dripping server).
14: a server without Range support is named as such, and no chunk read downloads the whole shard.
7: cache entries are opened as the pack's own files are (FIFO, directory, link), sizes are taken from
   the file, and a lying manifest neither raises MemoryError nor evicts another pack's good entry.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from pack_checks import read_all, verify

import dctdata
from dctdata.errors import DctDataError, FormatError, IntegrityError
from dctdata.format import read_manifest

N = 16
CAP = 256 << 20  # what a misbehaving answer may send at most here: "endless" stops there


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packs")
    x = (20 + 5 * np.random.default_rng(0).standard_normal((N, 1, 16, 16))).astype(np.float32)
    np.save(tmp / "x.npy", x)
    dctdata.pack(tmp / "x.npy", tmp / "zarr", cf=4, quiet=True, writer_options={"chunk_samples": 1, "shard_samples": 8})
    dctdata.pack(tmp / "x.npy", tmp / "webdataset", format="webdataset", cf=4, quiet=True)
    return tmp


class Server:
    """Serves a directory on 127.0.0.1 with one misbehaviour per path (`modes`: path -> mode); counts the
    body bytes it sends (`sent`, per path). Modes: "endless" (200, no length, zeros until CAP), "endless206"
    (206 for the asked start, no length, zeros until CAP), "norange" (200 with the whole file, as
    `python -m http.server`), "drip" (honest 200, one byte every `delay` s)."""

    def __init__(self, directory: Path, modes: dict[str, str], delay: float = 0.5) -> None:
        self.directory, self.modes, self.delay = directory, modes, delay
        self.sent: dict[str, int] = {}
        self.stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                try:
                    self._answer(body=True)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                    pass

            def _send(self, rel: str, data: bytes) -> None:
                self.wfile.write(data)
                outer.sent[rel] = outer.sent.get(rel, 0) + len(data)

            def _answer(self, body: bool) -> None:
                rel = self.path.lstrip("/")
                mode = outer.modes.get(rel)
                path = outer.directory / rel
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if mode in ("endless", "endless206"):
                    self.send_response(200 if mode == "endless" or not ranged else 206)
                    if mode == "endless206" and ranged:
                        self.send_header("Content-Range", f"bytes {ranged.group(1)}-{len(data) - 1}/{len(data)}")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    block = bytes(1 << 20)
                    while body and outer.sent.get(rel, 0) < CAP and not outer.stop.is_set():
                        self._send(rel, block)
                    self.close_connection = True
                    return
                status = 200
                if ranged and mode != "norange":
                    a, b = int(ranged.group(1)), int(ranged.group(2) or len(data) - 1)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {a}-{min(b, len(data) - 1)}/{len(data)}")
                    data, status = data[a : b + 1], 206
                else:
                    self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not body:
                    return
                if mode == "drip":
                    for i in range(len(data)):
                        if outer.stop.wait(outer.delay):
                            return
                        self._send(rel, data[i : i + 1])
                        self.wfile.flush()
                    return
                self._send(rel, data)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # a client that hung up, as it should
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self.server = Quiet(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


class deadline:
    """Fail instead of hanging the suite when the block runs past `seconds` (SIGALRM, main thread)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self):
        def fail(*_):
            raise TimeoutError(f"still running after {self.seconds} s")

        self.old = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc) -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


SHARD = "image/c.0.0.0.0.0"


# 4: a range request is never read past what it asked --------------------------------------------------------
@pytest.mark.parametrize(
    "mode, said",
    [
        ("endless", r"expected a 206 partial answer to a range request .*Got 200 with a unsized body: the server "
                    r"does not support range requests"),
        ("endless206", r"expected at most \d+ bytes for bytes \d+\.\.\d+\. Got more \(the server sent a longer body"),
    ],
)  # fmt: skip
def test_4_an_endless_answer_to_a_range_request_is_not_read(packs, capsys, mode, said):
    with Server(packs / "zarr", {SHARD: mode}) as srv, deadline(120):
        ds = dctdata.open_dataset(srv.url)
        with pytest.raises(IntegrityError, match=re.escape(SHARD) + ".*" + said):
            ds.__getitems__([0, 5])
        # the server stopped being read (it would send CAP = 256 MiB): what it got out fit the sockets' buffers
        assert srv.sent.get(SHARD, 0) < 64 << 20  # nothing, when the client hung up on the headers
        assert ds.reader.source.bytes < 1 << 20  # what the reader received and kept
        rc, text = verify(capsys, srv.url)
    assert rc == 1 and re.search(said, text), text


def test_4_an_honest_server_still_reads_by_range(packs):
    with Server(packs / "zarr", {}) as srv, deadline(120):
        ds = dctdata.open_dataset(srv.url)
        got = read_all(ds)
    local = read_all(dctdata.open_dataset(packs / "zarr"))
    assert len(got) == N and all(np.array_equal(a[0], b[0]) for a, b in zip(got, local))
    assert srv.sent[SHARD] < (packs / "zarr" / SHARD).stat().st_size * 2  # ranges, not whole shards per chunk


# 14: a server without Range support ------------------------------------------------------------------------------
def test_14_a_server_without_range_support_is_named_and_not_downloaded_per_chunk(packs, capsys):
    modes = {rel: "norange" for rel in json.loads((packs / "zarr" / "manifest.json").read_text())["checksums"]}
    with Server(packs / "zarr", modes) as srv, deadline(120):
        said = r"the server does not support range requests, which zarr packs are read by \(serve the pack with one"
        with pytest.raises(IntegrityError, match=re.escape(SHARD) + ".*" + said) as info:
            dctdata.open_dataset(srv.url)[0]
        assert "corrupted" not in str(info.value) and "damaged" not in str(info.value)
        assert srv.sent.get(SHARD, 0) <= (packs / "zarr" / SHARD).stat().st_size  # one answer, left unread
        # (that a 200 body is not read is counted in test_4's endless answers, which go the same way)
        rc, text = verify(capsys, srv.url)
    assert rc == 1 and re.search(said, text), text
    # the whole files a zarr pack reads (manifest, zarr.json) are fine from such a server; so is a webdataset
    with Server(packs / "webdataset", {"shard-000000.tar": "norange"}) as srv, deadline(120):
        assert len(read_all(dctdata.open_dataset(srv.url, shuffle=False))) == N


# 8: a total deadline per request -----------------------------------------------------------------------------------
def test_8_a_dripping_server_is_cut_off_by_the_deadline(packs):
    size = (packs / "webdataset" / "manifest.json").stat().st_size
    with Server(packs / "webdataset", {"manifest.json": "drip"}, delay=0.2) as srv, deadline(60):
        # each byte comes well inside the 1 s idle timeout: only a total deadline stops the read
        with pytest.raises(FormatError, match=r"manifest\.json: expected a readable dctdata manifest\. Got .*no answer "
                                              r"in time .*\{'deadline': seconds\} the total per request"):  # fmt: skip
            dctdata.open_dataset(srv.url, storage_options={"timeout": 1, "deadline": 2})
        assert srv.sent["manifest.json"] < size // 4  # it took 0.2 s a byte: 2 s gets about 10 of them


def test_8_the_default_deadline_follows_the_timeout_and_is_checked(packs):
    from dctdata.format.location import DEADLINE_TIMEOUTS, fsspec_options

    def total(**options):
        return fsspec_options("http://h/x", options)["client_kwargs"]["timeout"].total

    assert total(timeout=2) == 2 * DEADLINE_TIMEOUTS and total(timeout=2, deadline=30) == 30
    assert total(timeout=None) is None and total(deadline=None) is None
    assert "deadline" not in fsspec_options("memory://x", {"deadline": 3})  # only for http(s)
    for bad in (0, -1, "5", True):
        with pytest.raises(DctDataError, match=r"storage_options\['deadline'\]: expected seconds > 0 or None\. Got"):
            dctdata.open_dataset("http://127.0.0.1:9/x", storage_options={"deadline": bad})


# 7: the shard cache --------------------------------------------------------------------------------------------------
def _shard_hashes(root: Path) -> list[str]:
    return [e["sha256"] for e in read_manifest(root).checksums.values()]


@pytest.mark.parametrize("planted", ["fifo", "directory", "link_out"])
def test_7_a_planted_cache_entry_never_blocks_or_breaks_the_reader(packs, tmp_path, planted):
    cache = tmp_path / "cache"
    cache.mkdir()
    outside = tmp_path / "outside.tar"
    outside.write_bytes(b"x" * 10)
    for sha in _shard_hashes(packs / "webdataset"):  # sha256s are public: they are in every copy of the manifest
        entry = cache / f"{sha}.tar"
        if planted == "fifo":
            os.mkfifo(entry)
        elif planted == "directory":
            entry.mkdir()
        else:
            entry.symlink_to(outside)
    with deadline(60):
        got = read_all(dctdata.open_dataset(packs / "webdataset", cache_dir=cache, shuffle=False))
        again = read_all(dctdata.open_dataset(packs / "webdataset", cache_dir=cache, shuffle=False))
    assert len(got) == len(again) == N
    assert outside.read_bytes() == b"x" * 10  # never written through


def test_7_a_manifest_lying_about_a_cached_shard_size_is_an_integrity_error_and_evicts_nothing(
    packs, tmp_path, monkeypatch
):
    import collections

    import dctdata.format.cache as cache_mod

    cache = tmp_path / "cache"
    good = Path(shutil.copytree(packs / "webdataset", tmp_path / "good"))
    assert len(read_all(dctdata.open_dataset(good, cache_dir=cache))) == N  # epoch 1 fills the cache
    entries = {p.name: p.read_bytes() for p in cache.iterdir()}
    liar = Path(shutil.copytree(packs / "webdataset", tmp_path / "liar"))
    m = json.loads((liar / "manifest.json").read_text())
    m["checksums"] = {k: dict(v) for k, v in read_manifest(liar).checksums.items()}  # object form
    for name in m["checksums"]:  # the same shards (same sha256), claimed far bigger than memory
        m["checksums"][name]["bytes"] = 1 << 50
        for s in m["layout"]["shards"]:
            s.pop("bytes", None)
    from pack_checks import reseal

    (liar / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(DctDataError, match=r"cache_limit: expected at least the largest shard \(1125899906842624"):
        dctdata.open_dataset(liar, cache_dir=cache)  # refused at open: no MemoryError
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda _: usage(1 << 62, 0, 1 << 61))  # a huge cache disk
    with pytest.raises(IntegrityError, match=r"shard-000000\.tar: expected 1125899906842624 bytes .*Got \d+ bytes"):
        read_all(dctdata.open_dataset(liar, cache_dir=cache, cache_limit=1 << 51, shuffle=False))
    for k in m["checksums"]:  # a smaller lie, below RAM
        m["checksums"][k]["bytes"] = 12345
    (liar / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(IntegrityError, match=r"shard-000000\.tar: expected 12345 bytes"):
        read_all(dctdata.open_dataset(liar, cache_dir=cache, shuffle=False))
    assert {p.name: p.read_bytes() for p in cache.iterdir() if not p.name.startswith(".")} == entries  # all kept
    assert len(read_all(dctdata.open_dataset(good, cache_dir=cache))) == N


def test_7_a_damaged_cache_entry_is_still_replaced(packs, tmp_path):
    cache = tmp_path / "cache"
    assert len(read_all(dctdata.open_dataset(packs / "webdataset", cache_dir=cache))) == N
    entry = sorted(cache.glob("*.tar"))[0]
    entry.write_bytes(entry.read_bytes()[:-1])  # truncated: its own bytes no longer hash to its name
    assert len(read_all(dctdata.open_dataset(packs / "webdataset", cache_dir=cache))) == N
    assert hashlib.sha256(entry.read_bytes()).hexdigest() == entry.stem  # fetched again and stored whole
