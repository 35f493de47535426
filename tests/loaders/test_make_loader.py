"""make_loader on default packs: the quick start's loop exactly once for any worker count and 2 ranks,
shuffle=False in the manifest's order, len(loader) equal to the batches yielded, and the fallback split
when shards are fewer than ranks x workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sample_fields import N

import dctdata
from dctdata.errors import DctDataError
from dctdata.loaders.distributed import make_loader, set_epoch
from dctdata.loaders.stateful import PackLoader
from dctdata.loaders.wds_dataset import DCTWebDataset

FORMATS = ("zarr", "webdataset")


@pytest.fixture(scope="module")
def packs(labelled_source, tmp_path_factory):
    """Default packs (no writer options) of the small labelled set: zarr, and webdataset in 16 shards."""
    root = tmp_path_factory.mktemp("packs")
    out = {fmt: root / fmt for fmt in FORMATS}
    for fmt, path in out.items():
        dctdata.pack(labelled_source, path, format=fmt, quant="int8", target_psnr=35, quiet=True)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A default webdataset pack of 5 samples: 5 one-sample shards, fewer than 2 ranks x 3 workers."""
    root = tmp_path_factory.mktemp("tiny")
    np.savez(root / "t.npz", image=np.random.default_rng(0).random((5, 8, 8), np.float32), label=np.arange(5))
    dctdata.pack(root / "t.npz", root / "wds", format="webdataset", quiet=True)
    return root / "wds"


def labels(loader):
    return [int(v) for _, label in loader for v in label]


def test_default_small_pack_has_a_shard_per_rank_and_worker(packs):
    m = dctdata.format.read_manifest(packs["webdataset"])
    assert len(m.layout["shards"]) == 16  # 64 samples: the >= 16 shards rule, not one 256 MiB shard


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_readme_snippet_exactly_once_with_workers_and_two_ranks(packs, fmt, workers):
    seen = {0: [], 1: []}
    for rank in (0, 1):
        ds = dctdata.open_dataset(packs[fmt])
        loader = make_loader(ds, batch_size=8, num_workers=workers, rank=rank, world_size=2)
        model = torch.nn.Sequential(ds.decompressor(), torch.nn.Flatten())
        for epoch in range(2):
            set_epoch(loader, epoch)
            batches = 0
            for coeffs, label in loader:
                assert model(coeffs).shape == (len(label), 24 * 24)
                seen[epoch] += label.tolist()
                batches += 1
            assert batches == len(loader)
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(N)), f"epoch {epoch}: not exactly once"
    assert seen[0] != seen[1]  # set_epoch reshuffles


@pytest.mark.parametrize("workers", [0, 3])
def test_fewer_shards_than_ranks_times_workers_fall_back_exactly_once(tiny, workers, caplog):
    """5 samples for 2 ranks in batches of 2: shares of 3 and 2 would give 2 and 1 steps (DDP hangs on the
    missing one), so the short rank repeats one sample: the same steps on both, every sample read."""
    seen, steps = [], []
    for rank in (0, 1):
        ds = dctdata.open_dataset(tiny)
        with caplog.at_level("WARNING", logger="dctdata.loaders.distributed"):
            loader = make_loader(ds, batch_size=2, num_workers=workers, rank=rank, world_size=2)
        got = labels(loader)
        assert len(got) == len(loader.dataset) == 3 and len(loader) == -(-len(got) // 2)
        seen += got
        steps.append(len(loader))
    assert steps == [2, 2] and set(seen) == set(range(5)) and len(seen) == 6
    assert "DataLoader worker(s)" not in caplog.text  # each worker reads a run of its rank's samples


def test_exactly_once_when_the_shares_give_the_same_steps(tiny):
    seen, steps = [], []
    for rank in (0, 1):
        loader = make_loader(dctdata.open_dataset(tiny), batch_size=4, rank=rank, world_size=2)
        seen += labels(loader)
        steps.append(len(loader))
    assert steps == [1, 1] and sorted(seen) == list(range(5))  # shares of 3 and 2: one batch each


def test_the_fallback_warning_names_the_samples_per_shard_that_avoids_it(packs, caplog):
    ds = dctdata.open_dataset(packs["webdataset"])  # one rank: 16 shards for 32 readers
    with caplog.at_level("WARNING", logger="dctdata.loaders.distributed"):
        loader = make_loader(ds, batch_size=4, num_workers=32)
    assert "16 shards for 1 rank(s) x 32 DataLoader worker(s)" in caplog.text
    assert "repack with --samples-per-shard 2 for one read per shard" in caplog.text  # 64 / 32 readers
    assert len(loader) == 16  # 64 samples in 16 batches, dealt to 32 workers


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_shuffle_false_is_the_manifest_order(packs, fmt, workers):
    loader = make_loader(dctdata.open_dataset(packs[fmt]), batch_size=5, num_workers=workers, shuffle=False)
    assert labels(loader) == list(range(N))


def test_shuffle_setting_of_the_dataset_is_kept_unless_make_loader_overrides_it(packs):
    unshuffled = dctdata.open_dataset(packs["webdataset"], shuffle=False)
    assert labels(make_loader(unshuffled, batch_size=4, num_workers=2)) == list(range(N))
    shuffled = dctdata.open_dataset(packs["webdataset"])
    assert labels(make_loader(shuffled, batch_size=4, shuffle=False)) == list(range(N))
    assert shuffled.shuffle is True  # make_loader works on a copy: the dataset itself is unchanged
    a = labels(make_loader(shuffled, batch_size=4, seed=3))
    assert a != labels(make_loader(shuffled, batch_size=4)) and sorted(a) == list(range(N))  # seed honoured


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2])
def test_len_is_the_batches_yielded(packs, fmt, workers, world):
    for drop_last in (False, True):
        for rank in range(world):
            ds = dctdata.open_dataset(packs[fmt])
            loader = make_loader(
                ds, batch_size=3, num_workers=workers, rank=rank, world_size=world, drop_last=drop_last
            )
            set_epoch(loader, 1)
            assert len(loader) == sum(1 for _ in loader), f"rank {rank} drop_last={drop_last}"


def test_len_matches_the_plan_for_many_splits(packs):
    """Without running workers: per-worker sample counts and batch counts agree with the planned indices."""
    ds = DCTWebDataset(packs["webdataset"], buffer_size=8)
    for batch in (1, 3, 7, 64):
        ds.batch_size = batch
        for shuffle in (True, False):
            ds.shuffle = shuffle
            for world, workers in ((1, 1), (1, 4), (2, 3), (3, 8), (20, 1)):
                for rank in range(world):
                    per = [len(ds.indices_for(2, rank, world, w, workers)) for w in range(workers)]
                    rds = DCTWebDataset(packs["webdataset"], rank=rank, world_size=world, buffer_size=8)
                    rds.batch_size, rds.shuffle = batch, shuffle
                    rds.set_epoch(2)
                    assert rds.batches(batch, workers) == sum(-(-p // batch) for p in per)
                    assert len(rds) == sum(per)


def test_make_loader_returns_a_stateful_loader_and_checks_its_arguments(packs):
    loader = make_loader(dctdata.open_dataset(packs["webdataset"]), batch_size=4)
    assert isinstance(loader, PackLoader) and callable(loader.state_dict)
    with pytest.raises(DctDataError, match="batch_size: expected a positive int"):
        make_loader(dctdata.open_dataset(packs["zarr"]), batch_size=0)
    with pytest.raises(DctDataError, match="rank/world_size: expected both or neither"):
        make_loader(dctdata.open_dataset(packs["webdataset"]), batch_size=4, rank=0)
    with pytest.raises(DctDataError, match="expected 0 <= rank < world_size"):
        make_loader(dctdata.open_dataset(packs["webdataset"]), batch_size=4, rank=2, world_size=2)
    with pytest.raises(DctDataError, match="num_workers: expected an int >= 0"):
        make_loader(dctdata.open_dataset(packs["webdataset"]), batch_size=4, num_workers=-1)
