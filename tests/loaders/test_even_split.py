"""Several ranks over a webdataset pack through `make_loader` (`wds_plan.even_split`): whatever the shard sizes,
every rank yields the same number of batches each epoch (DDP's collectives wait on every rank: a rank with one
batch fewer hung the others), and every sample is read once, or at most world - 1 repeat when equal counts
cannot be had otherwise. No data read: the plan is a pure function of the shard list and the split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dctdata.loaders import wds_plan


def _epoch(counts, world, workers, batch, shuffle, drop_last, epoch=0):
    """Per rank: (the samples it yields, the batches its loader yields)."""
    starts = np.cumsum([0, *counts[:-1]]).tolist()
    out = []
    for rank in range(world):
        samples, steps = [], 0
        for worker in range(workers):
            split = wds_plan.Split(
                seed=3, epoch=epoch, shuffle=shuffle, buffer_size=16, initial=4, rank=rank, world=world,
                worker=worker, workers=workers, batch=batch, drop_last=drop_last,
            )  # fmt: skip
            order = wds_plan.worker_indices(counts, starts, split)
            assert wds_plan.worker_sizes(counts, split)[worker] == len(order)
            samples += order.tolist()
            steps += len(order) // batch if drop_last else math.ceil(len(order) / batch)
        assert steps == wds_plan.batches(counts, split, drop_last)
        out.append((samples, steps))
    return out


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_uneven_shards_give_every_rank_the_same_batches(shuffle, drop_last):
    rng = np.random.default_rng(0)
    repeated = 0
    for trial in range(40):
        counts = rng.integers(1, 40, int(rng.integers(1, 12))).tolist()
        total = sum(counts)
        for world in (2, 3, 4):
            for workers in (1, 2, 3):
                for batch in (1, 3, 8):
                    ranks = _epoch(counts, world, workers, batch, shuffle, drop_last, epoch=trial)
                    steps = {s for _, s in ranks}
                    assert len(steps) == 1, f"{counts} world {world} workers {workers} batch {batch}: steps {steps}"
                    seen = [i for samples, _ in ranks for i in samples]
                    assert set(seen) == set(range(total))
                    extra = len(seen) - total
                    assert 0 <= extra <= world - 1
                    lo = total // world
                    # a repeat only when the shorter shares would give one batch fewer
                    hi = -(-total // world)
                    fewer = lo // batch != hi // batch if drop_last else -(-lo // batch) != -(-hi // batch)
                    assert (extra > 0) == (fewer and total % world != 0)
                    repeated += extra > 0
    assert repeated  # the case that needs a repeat was met


def test_the_epochs_shuffle_and_shares_stay_contiguous():
    """With shuffle each worker reads a contiguous run of its rank's samples (few shards), reshuffled per epoch;
    the shares are floor/ceil(total / world)."""
    counts = [7] * 9 + [1]  # 64 samples; whole shards would give 2 ranks 35 and 29
    a = _epoch(counts, 2, 2, 4, True, False, epoch=0)
    b = _epoch(counts, 2, 2, 4, True, False, epoch=1)
    assert [len(s) for s, _ in a] == [32, 32] and [n for _, n in a] == [8, 8]
    assert a[0][0] != b[0][0]
    ordered = _epoch(counts, 2, 2, 4, False, False)
    assert sorted(ordered[0][0]) == list(range(32)) and sorted(ordered[1][0]) == list(range(32, 64))


def test_one_rank_and_plain_dataloaders_keep_whole_shards():
    """Without several ranks or without make_loader's batch size, the split is the whole-shard one."""
    one = wds_plan.Split(seed=0, epoch=0, shuffle=True, buffer_size=8, initial=2, world=1, workers=2, batch=4)
    plain = wds_plan.Split(seed=0, epoch=0, shuffle=True, buffer_size=8, initial=2, rank=0, world=2, workers=1)
    assert not wds_plan.even_split(one) and wds_plan.whole_shards(10, one)
    assert not wds_plan.even_split(plain) and wds_plan.whole_shards(10, plain)
