"""DataLoaders for torch.distributed (torchrun/DDP): every sample exactly once per epoch across ranks
and DataLoader workers.

    import torch.distributed as dist
    from dctdata.loaders.distributed import make_loader, set_epoch
    dist.init_process_group("gloo")                      # or "nccl"; torchrun sets RANK/WORLD_SIZE
    ds = dctdata.open_dataset("s3://bucket/em.zarr")     # or a webdataset pack
    loader = make_loader(ds, batch_size=32, num_workers=4)
    for epoch in range(epochs):
        set_epoch(loader, epoch)
        for batch in loader: ...

- The loader is a `PackLoader` (`dctdata.loaders.stateful`): torchdata's `StatefulDataLoader`, so
  `loader.state_dict()` / `loader.load_state_dict(state)` resume mid-epoch exactly once (workers and
  ranks included), and `len(loader)` is the number of batches it yields.
- `shuffle` and `seed` apply to either kind; left as None they mean the dataset's own setting for a
  webdataset pack (`open_dataset(..., shuffle=False)` stays unshuffled) and shuffle=True, seed=0 for
  zarr. `shuffle=False` yields the manifest's order (one rank), whatever the worker count.
- Map-style `DCTZarrDataset`: a `DistributedSampler` (shuffle with `seed`, reshuffled by `set_epoch`)
  gives each rank `ceil(N / world)` indices; batches are read with `__getitems__`. When N is not a
  multiple of the world size, DistributedSampler repeats a few samples so ranks stay in step
  (`drop_last=True` drops them instead): exactly once holds when world divides N.
- Iterable `DCTWebDataset`: splits by rank (from `rank=`/`world_size=`, torch.distributed or
  RANK/WORLD_SIZE) and by DataLoader worker itself, so it needs no sampler. The loader works on a
  shallow copy that knows the batch size and the settings above (epoch and counters stay shared with
  `ds`). With at least world x workers shards each shard is read once per epoch; with fewer, a warning
  says so and the split falls back to batches of the rank's stream (still exactly once; see
  `dctdata.loaders.wds_plan`). With several ranks every rank yields the same number of batches each
  epoch, whatever the shard sizes (a rank with fewer would leave the others waiting in DDP's all-reduce):
  the ranks split the epoch's samples at sample level (`wds_plan.even_split`), every sample exactly once
  unless equal counts need a repeated sample (at most world - 1 of them; as DistributedSampler pads).
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from dctdata.decoder.wire import collate
from dctdata.errors import DctDataError
from dctdata.loaders.stateful import PackLoader
from dctdata.loaders.threads import worker_init
from dctdata.parse import SEED_MAX, parse_int

log = logging.getLogger(__name__)


def _world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise DctDataError(f"rank/world_size: expected both or neither. Got rank={rank!r} world_size={world_size!r}")
    if rank is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    num_workers: int = 0,
    shuffle: bool | None = None,
    seed: int | None = None,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **loader_kwargs: Any,
) -> PackLoader:
    """A stateful DataLoader that gives this rank its share of `dataset` (see the module docstring). Workers
    run one thread each (`dctdata.loaders.threads.worker_init`, before any `worker_init_fn` given).

    Args:
        dataset: A dataset `open_dataset` returned (map-style or iterable).
        batch_size: Samples per batch (>= 1).
        num_workers: DataLoader worker processes (0: load in the main process).
        shuffle: Shuffle the order (None: the dataset's own setting for webdataset, True for zarr).
        seed: The seed of the order (None: the dataset's for webdataset, 0 for zarr).
        drop_last: Drop the last incomplete batch (zarr: also the samples DistributedSampler would repeat).
        rank: This process's rank (with `world_size`; default: torch.distributed or RANK/WORLD_SIZE).
        world_size: The number of ranks (with `rank`).
        **loader_kwargs: Passed on to the DataLoader (pin_memory, persistent_workers, worker_init_fn, collate_fn,
            ...).

    Returns:
        A `PackLoader` (torchdata's StatefulDataLoader: `state_dict()`/`load_state_dict()` resume mid-epoch).

    Raises:
        DctDataError: `batch_size`, `num_workers` or `seed` is out of range, or only one of `rank`/`world_size` is
            given.
        TypeError: `dataset` is an iterable that is not a dctdata dataset.
    """
    parse_int(batch_size, "batch_size", minimum=1, expected="a positive int", type_error=DctDataError)
    parse_int(num_workers, "num_workers", minimum=0, type_error=DctDataError)
    loader_kwargs["worker_init_fn"] = functools.partial(worker_init, then=loader_kwargs.get("worker_init_fn"))
    loader_kwargs.setdefault("collate_fn", collate)  # torch's default, and decode="device" batches
    if isinstance(dataset, IterableDataset):
        dataset = _configured(dataset, batch_size, shuffle, seed, rank, world_size)
        dataset.drop_last = bool(drop_last)
        if message := dataset.fallback_warning(num_workers):
            log.warning(message)
        dataset._warned = True
        r, w = dataset._node()
        split = dict(rank=r, world_size=w, shuffle=dataset.shuffle, seed=dataset.seed)
        return PackLoader(
            dataset,
            split={**split, "num_workers": num_workers, "batch_size": batch_size, "drop_last": drop_last},
            batch_size=batch_size,
            num_workers=num_workers,
            drop_last=drop_last,
            **loader_kwargs,
        )
    r, w = _world(rank, world_size)
    shuffle = True if shuffle is None else bool(shuffle)
    seed = 0 if seed is None else parse_int(seed, "seed", minimum=0, maximum=SEED_MAX)
    sampler = DistributedSampler(dataset, num_replicas=w, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last)
    split = dict(rank=r, world_size=w, num_workers=num_workers, batch_size=batch_size, drop_last=drop_last)
    return PackLoader(
        dataset,
        split={**split, "shuffle": shuffle, "seed": seed},
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        drop_last=drop_last,
        **loader_kwargs,
    )


def _configured(dataset: Any, batch_size: int, shuffle, seed, rank, world_size) -> Any:
    """A shallow copy of an iterable dctdata dataset with this loader's settings (the epoch and the
    stats counters live in shared tensors, so `set_epoch` and `ds.stats` still reach both)."""
    if not hasattr(dataset, "split"):
        raise TypeError(f"dataset: expected a dctdata dataset (open_dataset). Got {type(dataset).__name__}")
    if (rank is None) != (world_size is None):
        raise DctDataError(f"rank/world_size: expected both or neither. Got rank={rank!r} world_size={world_size!r}")
    out = copy.copy(dataset)
    out.batch_size = batch_size
    if shuffle is not None:
        out.shuffle = bool(shuffle)
    if seed is not None:
        out.seed = parse_int(seed, "seed", minimum=0, maximum=SEED_MAX)
    if rank is not None:
        if not 0 <= parse_int(rank, "rank", minimum=0) < parse_int(world_size, "world_size", minimum=1):
            raise DctDataError(
                f"rank/world_size: expected 0 <= rank < world_size. Got rank={rank} world_size={world_size}"
            )
        out.rank, out.world_size = int(rank), int(world_size)
    return out


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Make the next epoch's order a function of (seed, epoch) for either dataset kind.

    Args:
        loader: The loader `make_loader` returned (or a DataLoader over a dctdata dataset).
        epoch: The epoch number (>= 0).

    Raises:
        DctDataError: `epoch` is not a non-negative int.
    """
    epoch = parse_int(epoch, "set_epoch: epoch", minimum=0, maximum=SEED_MAX)
    if isinstance(loader, PackLoader):
        loader.set_epoch(epoch)
        return
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
