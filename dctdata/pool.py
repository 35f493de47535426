"""One small thread pool per process for C kernels that release the GIL: the fused CPU decode
(`dctdata.decoder.fused`) and the zarr reader's chunk decode (`dctdata.format.zarr.reader`).

Why one shared pool: both split work that is already sized to torch's intra-op thread count, never
nest, and a second pool would only add idle threads. Why by hand: `ThreadPoolExecutor` does not survive
`fork` (a DataLoader worker's copy holds threads that do not exist), so the pool is keyed by pid and a
fork child starts its own on first use; it only ever grows (the smaller pool's threads end).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, threads, pool)
_LOCK = threading.Lock()  # pool replacement and submission together: no submit to a pool shut down


def _new_lock() -> None:  # a fork child must not inherit a lock held by a parent's thread
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


def run_split(part: Callable[[int, int], object], count: int, runs: int) -> None:
    """`part(lo, hi)` over [0, count) in `runs` contiguous runs: the caller runs the first itself and a
    per-process pool the others. Every run finishes before this returns; the exception of the first run
    that raised (in order) is raised, so a run that stops at its first failing item gives the first failing
    item overall. `runs` <= 1 is one plain call (no pool is started)."""
    runs = max(1, min(runs, count))
    if runs == 1:
        part(0, count)
        return
    global _POOL
    bounds = [count * i // runs for i in range(runs + 1)]
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < runs - 1:
            if _POOL is not None and _POOL[0] == os.getpid():
                _POOL[2].shutdown(wait=False)  # more threads asked for: the smaller pool's threads end
            _POOL = (os.getpid(), runs - 1, ThreadPoolExecutor(runs - 1, thread_name_prefix="dctdata"))
        futures: list[Future] = [_POOL[2].submit(part, lo, hi) for lo, hi in itertools.pairwise(bounds[1:])]
    errors: list[BaseException | None] = []
    try:
        part(bounds[0], bounds[1])
        errors.append(None)
    except BaseException as exc:  # re-raised below, after the other runs end
        errors.append(exc)
    for f in futures:
        errors.append(f.exception())
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def pool_threads() -> int:
    """Worker threads of this process's pool (0 before the first split; tests and benchmarks)."""
    pool = _POOL
    return pool[1] if pool is not None and pool[0] == os.getpid() else 0
