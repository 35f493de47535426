"""A loopback HTTP server for the tests: serves a directory with byte ranges (zarr reads shard indexes
and chunks with range requests, as real servers allow) and counts the requests it answers and the
bytes it sends. One implementation, which the benchmarks share: `loopback.py` beside this module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from loopback import LoopbackServer

__all__ = ["LoopbackServer", "ServedURL", "serve"]


class ServedURL(str):
    """The base URL of a running server; `.requests` lists the paths it was asked for, in order, and
    `.clear()` forgets them."""

    server: LoopbackServer

    @property
    def requests(self) -> list[str]:
        return [path for _, path, _ in self.server.requests]

    def clear(self) -> None:
        self.server.reset()


@contextlib.contextmanager
def serve(directory) -> Iterator[ServedURL]:
    """Serve `directory` on 127.0.0.1; yields its base URL (`LoopbackServer` gives the counts too)."""
    with LoopbackServer(directory) as server:
        url = ServedURL(server.url)
        url.server = server
        yield url
