"""Run pack parts on Dask: `--workers N` starts a LocalCluster (N worker processes, one thread
each) on this machine; `--scheduler ADDRESS` sends the same tasks to an existing cluster.

One task per part (`dctdata.preprocess.parts.run_part`); tasks read their samples from the source
themselves and write their own files under OUT's temporary directory (or URL prefix), so the workers
of a remote cluster need the source and OUT at the same paths (a shared filesystem, or URLs). Only
small results (file checksums, error figures) come back; the client journals them, and writes the
manifest when all are in.
"""

from __future__ import annotations

import logging
import uuid

from dctdata.errors import DctDataError

log = logging.getLogger(__name__)


def require_dask():
    try:
        import dask.distributed  # noqa: F401
    except ImportError as exc:
        raise DctDataError(
            "--workers N>1/--scheduler: expected dask.distributed to be installed (pip install 'dctdata[dask]'). "
            f"Got {type(exc).__name__}: {exc}"
        ) from exc


def run_parts(job, todo, *, workers: int | None, scheduler: str | None, on_done) -> None:
    """Submit every (index, start, stop) of `todo`; call on_done(result) as each finishes."""
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
