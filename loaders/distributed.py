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

- Map-style `DCTZarrDataset`: a `DistributedSampler` (shuffle with `seed`, reshuffled by `set_epoch`)
  gives each rank `ceil(N / world)` indices; batches are read with `__getitems__`. When N is not a
  multiple of the world size, DistributedSampler repeats a few samples so ranks stay in step
  (`drop_last=True` drops them instead): exactly once holds when world divides N.
- Iterable `DCTWebDataset`: splits whole shards by rank (from torch.distributed or RANK/WORLD_SIZE)
  and then by DataLoader worker itself, so it needs no sampler; pack with enough shards
  (>= world x workers; `--samples-per-shard`) and, for equal steps per rank, a shard count that the
  world size divides.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from dctdata.errors import DctDataError
from dctdata.loaders.threads import worker_init
from dctdata.parse import parse_int


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
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    **loader_kwargs: Any,
) -> DataLoader:
    """A DataLoader that gives this rank its share of `dataset` (see the module docstring). Workers run
    one thread each (`dctdata.loaders.threads.worker_init`, before any `worker_init_fn` given)."""
    parse_int(batch_size, "batch_size", minimum=1, expected="a positive int", type_error=DctDataError)
    loader_kwargs["worker_init_fn"] = functools.partial(worker_init, then=loader_kwargs.get("worker_init_fn"))
    if isinstance(dataset, IterableDataset):
        if rank is not None or world_size is not None:
            raise DctDataError(
                "rank/world_size: expected them on the DCTWebDataset itself (it splits by rank). Got them for "
                "make_loader"
            )
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, drop_last=drop_last, **loader_kwargs)
    r, w = _world(rank, world_size)
    sampler = DistributedSampler(dataset, num_replicas=w, rank=r, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, drop_last=drop_last, **loader_kwargs
    )


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """Make the next epoch's order a function of (seed, epoch) for either dataset kind."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
