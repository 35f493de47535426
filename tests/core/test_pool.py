"""The shared per-process pool (`dctdata.pool.run_split`): contiguous runs, every run finished before it
returns, and the first failing run's error."""

from __future__ import annotations

import threading
import time

import pytest

from dctdata import pool


@pytest.mark.parametrize("count, runs", [(10, 3), (4, 4), (3, 8), (5, 1), (1, 2)])
def test_runs_cover_the_range_in_contiguous_pieces(count, runs):
    got = []
    lock = threading.Lock()

    def part(lo, hi):
        with lock:
            got.append((lo, hi))

    pool.run_split(part, count, runs)
    n = max(1, min(runs, count))
    assert sorted(got) == [(count * i // n, count * (i + 1) // n) for i in range(n)]


def test_the_first_run_that_failed_is_raised_after_all_runs_end():
    done = []

    def part(lo, hi):
        if lo == 0:
            time.sleep(0.05)  # the first run fails last
            raise ValueError("run 0")
        if lo == 2:
            raise KeyError("run 1")
        time.sleep(0.05)
        done.append(lo)

    with pytest.raises(ValueError, match="run 0"):
        pool.run_split(part, 6, 3)
    assert done == [4]  # the last run was not abandoned


def test_one_run_starts_no_pool(monkeypatch):
    monkeypatch.setattr(pool, "_POOL", None)
    pool.run_split(lambda lo, hi: None, 8, 1)
    assert pool.pool_threads() == 0
    pool.run_split(lambda lo, hi: None, 8, 3)
    assert pool.pool_threads() == 2  # the caller runs the first run itself
