"""Bounded HTTP reads: the byte ranges and whole files a pack's readers ask an http(s) server for.

Written by hand over fsspec's `HTTPFileSystem` (whose aiohttp session, options and event loop it uses):
fsspec's `_cat_file` reads a range request's body whole without looking at the status or the length, so a
server that ignores `Range` (Python's `http.server`, many static servers and proxies) answers 200 with
the whole file, which then reads as a "damaged" shard, and a hostile one answers an endless body, read
until memory runs out (+2 GiB for a 2-sample batch); its files read a 206 body whole too. Here:
- a range request must be answered 206 from the asked start, or 200 with at most the asked bytes (a
  server may answer a range covering the whole file with the file); at most the asked bytes are read, one
  more tells an overlong body, which is an error;
- a 200 with more than the asked bytes is a server without range support: said so (`NoRangeSupport`),
  before any of its body is read;
- a whole file (manifest, webdataset shard) is one streamed GET, read only as far as its reader asks (a
  manifest to its 64 MiB cap, a shard to its recorded size and one byte);
- every request has a total deadline besides the idle timeout (`location.fsspec_options`: aiohttp's
  `total` timeout, which covers the body), so a server dripping a byte a second cannot hold a reader;
- a forked child (a DataLoader worker) cannot stall the parent's pooled connections (`_isolate_parent_loop`).
"""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import sys
from collections.abc import Sequence
from typing import Any


class RemoteError(OSError):
    """A remote read that failed for a reason other than a missing file: a timeout, an HTTP error status,
    a body cut short, an answer that is not what was asked. Its message names the URL and the cause."""


class NoRangeSupport(RemoteError):
    """The server answered a range request with the whole file: it does not support range requests."""


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def is_http(fs: object) -> bool:
    from fsspec.implementations.http import HTTPFileSystem

    return isinstance(fs, HTTPFileSystem)


def cat_ranges(
    fs: Any, urls: Sequence[str], starts: Sequence[int], stops: Sequence[int]
) -> list[bytes | Exception]:  # fs: fsspec's HTTPFileSystem
    """The bytes [start, stop) of each URL (fewer at the end of a file), or the exception of each failed
    read in its slot; requests run concurrently on fsspec's loop."""
    from fsspec.asyn import sync

    async def run() -> list[bytes | BaseException]:
        return await asyncio.gather(
            *(_cat_range(fs, u, a, b) for u, a, b in zip(urls, starts, stops)), return_exceptions=True
        )

    got: list[bytes | BaseException] = sync(fs.loop, run)
    out: list[bytes | Exception] = []
    for g in got:
        if isinstance(g, BaseException) and not isinstance(g, Exception):
            raise g  # a cancellation or an interrupt is not one slot's failure
        out.append(g)
    return out


async def _cat_range(fs: Any, url: str, start: int, stop: int) -> bytes:
    n = stop - start
    if n <= 0:
        return b""
    kw = dict(fs.kwargs)
    kw["headers"] = {**(kw.get("headers") or {}), "Range": f"bytes={start}-{stop - 1}"}
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), **kw) as r:
        if r.status == 404:
            raise FileNotFoundError(url)
        if r.status == 416:  # the range starts past the end: a short (empty) read, which the caller names
            return b""
        r.raise_for_status()
        length = r.headers.get("Content-Length")
        if r.status == 206:
            said = _CONTENT_RANGE.match(r.headers.get("Content-Range", "").strip())
            if said is not None and int(said.group(1)) != start:
                r.close()  # drop the connection: none of this body is wanted
                raise RemoteError(
                    f"{url}: expected a 206 answer from byte {start} (bytes {start}..{stop - 1}). Got bytes "
                    f"{said.group(1)}..{said.group(2)}"
                )
        elif r.status != 200 or start != 0 or length is None or not length.isdigit() or int(length) > n:
            what = f"{length}-byte" if length is not None and length.isdigit() else "unsized"
            r.close()  # drop the connection: none of this body is wanted
            raise NoRangeSupport(
                f"{url}: expected a 206 partial answer to a range request (bytes {start}..{stop - 1}). Got {r.status} "
                f"with a {what} body: the server does not support range requests, which zarr packs are read by "
                "(serve the pack with one that does, or pack it --format webdataset, whose shards are read whole)"
            )
        data = await _read_at_most(r.content, n + 1)
        if len(data) > n:
            r.close()
            raise RemoteError(
                f"{url}: expected at most {n} bytes for bytes {start}..{stop - 1}. Got more (the server sent a longer "
                "body than asked)"
            )
        return data


async def _read_at_most(stream: Any, limit: int) -> bytes:  # an aiohttp StreamReader
    parts: list[bytes] = []
    got = 0
    while got < limit:
        chunk = await stream.read(limit - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class HTTPStream:
    """A whole remote file read front to back through one GET (a sequential file object: `read(n)` gives
    at most n bytes, b"" at the end). Only what is read is received: closing early drops the connection."""

    def __init__(self, fs: Any, url: str) -> None:  # fs: fsspec's HTTPFileSystem
        self.fs, self.url = fs, url
        self._response: Any = None  # aiohttp's response, once the body is requested
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        from fsspec.asyn import sync

        if self.closed:
            raise ValueError(f"{self.url}: read of a closed file")
        data: bytes = sync(self.fs.loop, self._read, n)
        return data

    async def _read(self, n: int) -> bytes:
        if self._response is None:
            session = await self.fs.set_session()
            r = await session.get(self.fs.encode_url(self.url), **self.fs.kwargs)
            if r.status >= 400:
                r.release()
                if r.status == 404:
                    raise FileNotFoundError(self.url)
                r.raise_for_status()
            self._response = r
        if n is None or n < 0:
            data: bytes = await self._response.content.read()
            return data
        return await _read_at_most(self._response.content, n) if n else b""

    def close(self) -> None:
        from fsspec.asyn import sync

        if self._response is not None and not self.closed:
            sync(self.fs.loop, self._close)
        self.closed = True

    async def _close(self) -> None:
        self._response.close()  # on the loop's thread; an unread rest of the body is not downloaded

    def __enter__(self) -> HTTPStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Fork safety ------------------------------------------------------------------------------------------
# A forked child holds a copy of the parent's fsspec event loop, whose epoll instance is the parent's own
# kernel object, and copies of the parent's HTTP filesystems with their pooled keep-alive connections. A
# DataLoader worker opening a URL makes fsspec drop those copies (its instance cache is per process); the
# finalizer then closes the copied connections through the copied loop, which unregisters their sockets
# from the shared epoll: the parent never hears its next answer on them and waits out the idle timeout
# (60 s, then "no answer in time"). fsspec guards new instances against fork, not this. The child's copy
# of the loop gets a selector of its own, so nothing it closes can reach the parent's.

_parent_loop: list[Any] = [None]  # fsspec's event loop (its private selector is replaced in a child)


def _note_parent_loop() -> None:
    asyn = sys.modules.get("fsspec.asyn")
    _parent_loop[0] = asyn.loop[0] if asyn is not None else None


def _isolate_parent_loop() -> None:
    loop, _parent_loop[0] = _parent_loop[0], None
    if loop is not None and isinstance(getattr(loop, "_selector", None), selectors.BaseSelector):
        loop._selector = selectors.DefaultSelector()  # the parent's stays registered in the parent only


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_note_parent_loop, after_in_child=_isolate_parent_loop)
