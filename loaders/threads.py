"""Thread counts that do not oversubscribe the cores DataLoader workers use.

Each DataLoader worker is a process that reads and unpacks chunks on one core; torch already gives
workers one intra-op thread, and `worker_init` (the default `worker_init_fn` of
`make_loader`) also limits the libraries that start their own pools (Blosc in numcodecs). The main
process is the user's: by default torch gives it one thread per core, so a CPU `Decompress` there
fights the workers for the same cores (docs/benchmarks/design.md has the measurement).
`balance_threads(num_workers)` sets the main process to the cores the workers
leave free, at least one; it changes process-wide state, so it is a call the training script makes,
never a side effect of building a loader.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

__all__ = ["available_cores", "balance_threads", "main_threads", "worker_init"]


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells it, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def main_threads(num_workers: int) -> int:
    """Intra-op threads for the main process next to `num_workers` DataLoader workers."""
    return max(1, available_cores() - max(0, int(num_workers)))


def balance_threads(num_workers: int) -> int:
    """Set the main process's torch threads to `main_threads(num_workers)`; returns the number set.

    Args:
        num_workers: The DataLoader workers running beside the main process.

    Returns:
        The number of torch threads set (at least 1).
    """
    n = main_threads(num_workers)
    torch.set_num_threads(n)
    return n


def worker_init(worker_id: int, then: Callable[[int], None] | None = None) -> None:
    """One thread for everything a DataLoader worker runs, then the user's `worker_init_fn` if any."""
    torch.set_num_threads(1)
    try:
        from numcodecs import blosc
    except ImportError:  # pragma: no cover - numcodecs built without Blosc
        blosc = None
    if blosc is not None:
        blosc.set_nthreads(1)
        blosc.use_threads = False
    if then is not None:
        then(worker_id)
