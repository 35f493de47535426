"""Which samples each rank and DataLoader worker of a webdataset pack reads in an epoch, and in which
order: a pure function of the shard list and `Split` (seed, epoch, shuffle, buffer, rank, world size,
worker, worker count, batch size). Nothing here reads data, so a resumed worker fast-forwards by
position (deterministic replay), and a shard none of its remaining samples need is never fetched.

Two ways to split, chosen the same way by every rank and worker:

- **Whole shards** (the training path: each shard is read once per epoch). When `shuffle` is on (or
  the batch size is unknown) and there are at least ranks x workers shards: the shard order is a
  permutation seeded with (seed, epoch), dealt round-robin to ranks (`order[rank::world]`) and then to
  workers (`[worker::workers]`); each worker mixes its shards' samples in a shuffle buffer
  (`webdataset.shuffle`, `buffer_size` samples) seeded with (seed, epoch, rank, worker).
- **Batches of the rank's stream** (`shuffle=False` through `make_loader`, or too few shards). The rank
  takes whole shards when there are at least as many shards as ranks, else every world-th sample of
  all of them; with `shuffle` its stream is mixed by a buffer seeded with (seed, epoch, rank). The
  stream is cut into DataLoader batches and batch b goes to worker b % workers, which is the order in
  which the DataLoader collects batches from its workers: the loader yields the rank's stream in order
  (the manifest's order for one rank with `shuffle=False`), and its length is exactly
  ceil(samples / batch). The cost: every worker reads each shard it has a batch in.

With several ranks and `make_loader`'s batch size (`even_split`), the ranks split at sample level instead,
so that DDP's collectives never wait on a rank that has run out of batches (a rank of whole shards could
get 45 batches and the other 44, and the first all-reduce of the extra step hung): the epoch's samples in
shard order (permuted by (seed, epoch) when shuffling) are cut into `world` contiguous runs of
floor/ceil(samples / world) samples, so every rank reads about the same and a shard is read by at most two
ranks. Every rank then yields the same number of batches (`batches`): ceil(n / batch) (floor with
`drop_last`) is the same for n = floor and ceil unless floor(samples / world) is a multiple of the batch
(ceil with `drop_last`); only then do the shorter ranks take one more sample, the first of the next rank's
run (as torch's DistributedSampler pads), so at most world - 1 samples repeat in such an epoch, and
otherwise every sample is read exactly once. Within a rank, with `shuffle` each worker takes a contiguous
run of whole batches of the rank's samples (reads only the shards under it) and mixes it in a buffer
seeded with (seed, epoch, rank, worker); without, the rank's run is cut into batches dealt to workers as
above (the loader yields it in order).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

import numpy as np
import webdataset as wds


@dataclasses.dataclass(frozen=True)
class Split:
    """Everything the order of one epoch depends on, besides the shard list."""

    seed: int
    epoch: int
    shuffle: bool
    buffer_size: int
    initial: int
    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1
    batch: int | None = None  # samples per DataLoader batch; None when the loader is not make_loader's
    drop_last: bool = False  # the loader drops each worker's last short batch (`even_split`'s counts)


def even_split(split: Split) -> bool:
    """True when ranks split at sample level so that each yields the same number of batches: several ranks
    and a known batch size (see the module docstring)."""
    return split.world > 1 and split.batch is not None


def whole_shards(n_shards: int, split: Split) -> bool:
    """True when every worker of every rank reads whole shards of its own (one read per shard)."""
    if even_split(split):
        return False
    return (split.shuffle or split.batch is None) and n_shards >= split.world * split.workers


def shard_order(n_shards: int, split: Split) -> list[int]:
    """Positions in the shard list in reading order: a permutation seeded with (seed, epoch) when
    shuffling, else the manifest's order."""
    order = list(range(n_shards))
    if split.shuffle:
        np.random.default_rng([split.seed, split.epoch]).shuffle(order)
    return order


def _ranges(counts: Sequence[int], starts: Sequence[int], shards: Sequence[int]) -> np.ndarray:
    if not shards:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(starts[s], starts[s] + counts[s], dtype=np.int64) for s in shards])


def _buffered(indices: np.ndarray, split: Split, key: Sequence[int]) -> np.ndarray:
    """`indices` through webdataset's shuffle buffer with a generator seeded by `key`."""
    if not split.shuffle or len(indices) < 2:
        return indices
    state = np.random.SeedSequence(list(key)).generate_state(2)
    rng = random.Random(int(state[0]) << 32 | int(state[1]))
    stage = wds.shuffle(split.buffer_size, split.initial, rng=rng)
    return np.fromiter(stage(iter(indices.tolist())), np.int64, len(indices))


def rank_stream(counts: Sequence[int], starts: Sequence[int], split: Split) -> np.ndarray:
    """The rank's samples (global indices) in stream order, before the cut into worker batches."""
    return _buffered(_rank_entry(counts, starts, split), split, (split.seed, split.epoch, split.rank))


def worker_plan(counts: Sequence[int], starts: Sequence[int], split: Split) -> tuple[np.ndarray, np.ndarray]:
    """(order, entry) of one (rank, worker) in `split.epoch`: the global sample indices it yields, in
    yield order, and the same indices in stream order (shard by shard, as they enter the shuffle
    buffer), which is the order a reader decodes them in."""
    if whole_shards(len(counts), split):
        mine = shard_order(len(counts), split)[split.rank :: split.world][split.worker :: split.workers]
        entry = _ranges(counts, starts, mine)
        return _buffered(entry, split, (split.seed, split.epoch, split.rank, split.worker)), entry
    entry = _rank_entry(counts, starts, split)
    if even_split(split) and split.shuffle:  # a contiguous run of whole batches per worker, mixed on its own
        lo, hi = _worker_run(len(entry), split, split.worker)
        run = entry[lo:hi]
        return _buffered(run, split, (split.seed, split.epoch, split.rank, split.worker)), run
    stream = _buffered(entry, split, (split.seed, split.epoch, split.rank))
    batch = split.batch or 1
    order = stream[(np.arange(len(stream)) // batch) % split.workers == split.worker]
    return order, entry[np.isin(entry, order)]


def _worker_run(n: int, split: Split, worker: int) -> tuple[int, int]:
    """[lo, hi) of a rank's n samples that `worker` takes in an `even_split` with shuffle: whole batches,
    the batches dealt in contiguous runs (the last worker's last batch may be short)."""
    batch = split.batch or 1
    n_batches = math.ceil(n / batch)
    lo = worker * n_batches // split.workers * batch
    hi = (worker + 1) * n_batches // split.workers * batch
    return min(lo, n), min(hi, n)


def even_size(total: int, split: Split) -> int:
    """Samples the rank yields in an `even_split` of `total` samples: its floor/ceil(total / world) share, or
    ceil(total / world) when the shorter shares would make one batch fewer (see the module docstring)."""
    own = (split.rank + 1) * total // split.world - split.rank * total // split.world
    lo, hi, batch = total // split.world, -(-total // split.world), split.batch or 1
    count = (lambda n: n // batch) if split.drop_last else (lambda n: -(-n // batch))
    return hi if count(lo) != count(hi) else own


def _rank_entry(counts: Sequence[int], starts: Sequence[int], split: Split) -> np.ndarray:
    """The rank's samples shard by shard (whole shards when there are enough, else every world-th; with
    `even_split` its contiguous run of the epoch's samples)."""
    order = shard_order(len(counts), split)
    if even_split(split):
        every = _ranges(counts, starts, order)
        total = len(every)
        if not total:
            return every
        first = split.rank * total // split.world
        return every[np.arange(first, first + even_size(total, split)) % total]
    if len(counts) >= split.world:
        return _ranges(counts, starts, order[split.rank :: split.world])
    return _ranges(counts, starts, order)[split.rank :: split.world]


def worker_indices(counts: Sequence[int], starts: Sequence[int], split: Split) -> np.ndarray:
    """The global sample indices one (rank, worker) yields in `split.epoch`, in order."""
    return worker_plan(counts, starts, split)[0]


def rank_size(counts: Sequence[int], split: Split) -> int:
    """Samples the rank yields per epoch (no data read, no shuffle simulated)."""
    n = len(counts)
    if even_split(split):
        return even_size(int(sum(counts)), split)
    if n >= split.world:
        return int(sum(counts[s] for s in shard_order(n, split)[split.rank :: split.world]))
    return len(range(split.rank, int(sum(counts)), split.world))


def worker_sizes(counts: Sequence[int], split: Split) -> list[int]:
    """Samples each worker of the rank yields per epoch (no data read)."""
    if whole_shards(len(counts), split):
        mine = shard_order(len(counts), split)[split.rank :: split.world]
        return [int(sum(counts[s] for s in mine[w :: split.workers])) for w in range(split.workers)]
    total, batch = rank_size(counts, split), split.batch or 1
    if even_split(split) and split.shuffle:
        return [(lambda r: r[1] - r[0])(_worker_run(total, split, w)) for w in range(split.workers)]
    n_batches = math.ceil(total / batch)
    sizes = [len(range(w, n_batches, split.workers)) * batch for w in range(split.workers)]
    if n_batches:
        sizes[(n_batches - 1) % split.workers] -= n_batches * batch - total  # the last batch may be short
    return sizes


def batches(counts: Sequence[int], split: Split, drop_last: bool = False) -> int:
    """Batches a DataLoader over this rank yields: each worker batches its own samples."""
    batch = split.batch or 1
    sizes = worker_sizes(counts, split)
    return sum(s // batch if drop_last else math.ceil(s / batch) for s in sizes)
