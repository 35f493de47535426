"""Run pack parts in parallel: `--workers N` (default: this machine's cores) forks N worker processes on
this machine; `--scheduler ADDRESS` sends the same tasks to an existing Dask cluster.

One task per part (`dctdata.preprocess.parts.run_part`, the same encoder a serial pack runs); tasks write
their own files under OUT's temporary directory (or URL prefix) and only small results (file checksums,
error figures) come back; the client journals them, and writes the manifest when all are in. A part's
bytes depend only on its samples and the specs, so the dataset is the same whatever the worker count.

Why forked processes and not a Dask LocalCluster on one machine: a LocalCluster's start (a scheduler,
nanny processes that each import torch and dctdata again) and the pickled job per task cost more than
two workers saved on a pack of a few hundred MB, so `--workers 2` was slower than one. Forked workers
start in milliseconds with everything imported, inherit the job (specs, writer) and an in-memory source
without pickling, and each runs torch on one thread, so N workers use N cores without oversubscribing.
A source given by name (a path, URL or module:callable) is reopened in each worker, as a cluster's
workers do (an open file handle is not shared across a fork), and read one part at a time, so memory
stays that of N parts. Where fork is not available (Windows) the parts run in this process.

A remote cluster's workers need the source and OUT at the same paths (a shared filesystem, or URLs).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import uuid

from dctdata.errors import DctDataError

log = logging.getLogger(__name__)


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_workers(workers: int | None, parts: int) -> int:
    """Worker processes for `parts` parts on this machine: `workers` (None: every core), at most one per
    part, and 1 (run in this process) where fork is not available."""
    n = cores() if workers is None else workers
    if n > 1 and "fork" not in multiprocessing.get_all_start_methods():
        log.info("--workers %d: this platform cannot fork; packing in one process", n)
        return 1
    return max(1, min(n, parts))


_FORKED: tuple | None = None  # (job, source or None, run) the forked workers inherit; set while a pool runs
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _start_worker(parent: int) -> None:
    import torch

    torch.set_num_threads(1)  # one core each: N workers on N cores (run_part sets it again per part)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's to handle: it stops the pool
    try:  # a client killed outright (kill -9) takes its workers with it: none writes into a resumed pack
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's own checks end the workers with the client
        pass
    if os.getppid() != parent:  # the client died before the signal was armed
        os._exit(1)


def _forked_part(task: tuple[int, int, int]) -> dict:
    job, src, run = _FORKED
    i, a, b = task
    return run(job, i, a, b, src=src)


def run_parts_local(job, todo, *, src, workers: int, on_done, run=None) -> None:
    """Run every (index, start, stop) of `todo` on `workers` forked processes; call on_done(result) (in
    this process) as each finishes. `src`: the open source, used by the workers only when the job has no
    name to reopen it by (an in-memory object, inherited by the fork). `run`: the part function
    (default `dctdata.preprocess.parts.run_part`).

    A part's error (any exception, KeyboardInterrupt included) is raised here and the parts not started
    are dropped; a worker that dies (killed, out of memory) raises BrokenProcessPool instead of waiting
    for its part forever. On the way out the workers are ended, so none writes after the pack returns."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from dctdata.preprocess.parts import run_part
    from dctdata.preprocess.sources import is_path

    global _FORKED
    _FORKED = (job, None if is_path(job.source) else src, run or run_part)
    ctx = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker, initargs=(os.getpid(),))
    finished = False
    try:
        pending = {pool.submit(_forked_part, task) for task in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: f.exception() is not None):  # finished parts count, then errors
                on_done(fut.result())
        finished = True
    finally:
        if not finished:  # parts still running after an error or Ctrl-C stop now
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        _FORKED = None


def require_dask():
    try:
        import dask.distributed  # noqa: F401
    except ImportError as exc:
        raise DctDataError(
            "--scheduler: expected dask.distributed to be installed (pip install 'dctdata[dask]'). "
            f"Got {type(exc).__name__}: {exc}"
        ) from exc


def run_parts(job, todo, *, workers: int | None, scheduler: str | None, on_done) -> None:
    """Submit every (index, start, stop) of `todo` to Dask; call on_done(result) as each finishes.
    `scheduler`: an existing cluster's address; None starts a LocalCluster of `workers` processes (kept for
    callers that want Dask on one machine; `pack` forks its own workers instead, `run_parts_local`)."""
    require_dask()
    from dask.distributed import Client, LocalCluster, as_completed

    from dctdata.preprocess.parts import run_part

    cluster = None
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the CLI logs at INFO; Dask's start/stop chatter is not news
    try:
        if scheduler is not None:
            try:
                client = Client(scheduler, timeout="30s")
            except (OSError, TimeoutError) as exc:
                raise DctDataError(
                    f"--scheduler {scheduler}: expected a reachable Dask scheduler. Got {type(exc).__name__}: {exc}"
                ) from exc
        else:
            import dask

            # Dask sets MALLOC_TRIM_THRESHOLD_ for its workers, which turns off glibc's adaptive mmap
            # threshold: every 16 MiB batch buffer then becomes a fresh mmap and page faults cost more
            # than the encoding. Pack tasks reuse a few large buffers.
            with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
                cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            client = Client(cluster)
        token = uuid.uuid4().hex[:8]
        with client:
            futures = [
                client.submit(run_part, job, i, a, b, key=f"dctdata-part-{token}-{i}", pure=False) for i, a, b in todo
            ]
            try:
                for fut in as_completed(futures):
                    on_done(fut.result())
            finally:
                client.cancel(futures)
    finally:
        if cluster is not None:
            cluster.close()
        quiet.setLevel(level)
