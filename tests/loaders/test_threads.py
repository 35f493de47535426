"""Thread settings that keep DataLoader workers and the main process off each other's cores."""

from __future__ import annotations

import os

import torch

from dctdata.loaders import threads
from dctdata.loaders.distributed import make_loader


class ThreadReport(torch.utils.data.Dataset):
    """Each sample reports the worker's torch threads, Blosc's threading and what a user init left."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from numcodecs import blosc

        return torch.tensor([torch.get_num_threads(), int(blosc.use_threads is False), int(os.environ.get("MARK", 0))])


def mark(worker_id):
    os.environ["MARK"] = str(10 + worker_id)


def test_make_loader_workers_run_one_thread_and_keep_the_users_init():
    rows = torch.cat(list(make_loader(ThreadReport(), batch_size=2, num_workers=2, shuffle=False)))
    assert rows[:, 0].tolist() == [1] * 4 and rows[:, 1].tolist() == [1] * 4
    assert rows[:, 2].tolist() == [0] * 4  # no user init: nothing else ran
    rows = torch.cat(list(make_loader(ThreadReport(), batch_size=2, num_workers=2, shuffle=False, worker_init_fn=mark)))
    assert sorted(set(rows[:, 2].tolist())) == [10, 11] and rows[:, 0].tolist() == [1] * 4


def test_main_process_threads_leave_the_workers_their_cores(monkeypatch):
    assert 1 <= threads.available_cores() <= (os.cpu_count() or 1)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    assert [threads.main_threads(w) for w in (0, 2, 7, 8, 16)] == [8, 6, 1, 1, 1]
    before = torch.get_num_threads()
    try:
        assert threads.balance_threads(5) == 3 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
