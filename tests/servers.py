"""A loopback HTTP server for the tests: serves a directory with byte ranges (zarr reads shard indexes
and chunks with range requests, as real servers allow) and counts the requests it answers and the
bytes it sends. One implementation, shared with the benchmarks: `dctdata.bench.loopback`."""

from __future__ import annotations

import contextlib
from typing import Iterator

from dctdata.bench.loopback import LoopbackServer

__all__ = ["LoopbackServer", "serve"]


@contextlib.contextmanager
def serve(directory) -> Iterator[str]:
    """Serve `directory` on 127.0.0.1; yields its base URL (`LoopbackServer` gives the counts too)."""
    with LoopbackServer(directory) as server:
        yield server.url
