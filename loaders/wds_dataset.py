"""`DCTWebDataset`: stream a webdataset-stored dctdata dataset (tar shards) as a torch IterableDataset.

Samples are tuples of tensors in manifest field order (`as_dict=True`: a dict), decoded exactly like
`DCTZarrDataset`: a `dct` field is its stored coefficient tensor (C, Hb, K, Wb) in the wire dtype
(bfloat16 viewed back from its uint16 bits), `array` fields as stored, labels as 0-d tensors. Decode
on the device with `ds.decompressor()`. With `decode="device"` a `dct` field is its member's checked
stored stream (`dctdata.decoder.wire.StoredSample`; collated: one `StoredBatch`), decoded by `ds.decompressor()`
where it runs.

Order and splitting (every sample exactly once per epoch; `dctdata.loaders.wds_plan` has the rules):
- Training path: the shard list is permuted by a generator seeded with (seed, epoch), dealt
  round-robin to ranks and then to DataLoader workers, and each worker mixes its shards' samples in a
  shuffle buffer (`buffer_size` samples) seeded with (seed, epoch, rank, worker). Each shard is read
  once per epoch.
- `shuffle=False` through `make_loader` (which tells the dataset its batch size), or fewer shards
  than ranks x workers: the rank's stream (the manifest's order, or buffer-shuffled) is cut into
  batches dealt to workers in the order the DataLoader collects them, so the loader yields the stream
  in order and never fails for want of shards; a worker then reads every shard it has a batch in (a
  warning says so when shuffling).
- Call `ds.set_epoch(e)` before each epoch (as with DistributedSampler); the order is a pure function
  of (seed, epoch) for a fixed world size, worker count and batch size. The epoch lives in shared
  memory, so it also reaches `persistent_workers=True` workers.
- rank/world size come from `rank=`/`world_size=`, else webdataset's `pytorch_worker_info`
  (RANK/WORLD_SIZE env or an initialized torch.distributed). `split_by_node=False` gives every rank
  all shards.
- `len(ds)` is the number of samples *this rank* yields per epoch. Through `make_loader` with several
  ranks (DDP) the ranks split at sample level and yield the same number of batches every epoch
  (`wds_plan.even_split`: floor/ceil shares, exactly once unless equal counts need a repeated sample,
  at most world - 1 of them); a plain DataLoader over several ranks takes whole shards, and ranks can
  differ by up to about one shard.

Resume: `iter(ds)` returns a torchdata-`Stateful` iterator whose state is its position in the
worker's planned order; loading it fast-forwards without reading (deterministic replay), so
`torchdata.stateful_dataloader.StatefulDataLoader` (what `make_loader` returns) resumes mid-epoch
exactly once. Shards are read when the first sample they must yield enters the worker's stream, and
dropped once their last one has entered the buffer.

Integrity (verify, then yield): each shard is read whole and verified by the pack's storage reader
(`dctdata.format.webdataset.WebDatasetReader`: size, sha256, tar structure, keys) before its first sample is
yielded (a worker holds about one shard's bytes, plus its shuffle buffer's decoded samples). With
`on_error="raise"` (default) a bad shard raises `IntegrityError` naming it; with `on_error="skip"` it
is skipped, logged and counted in `ds.stats` (shared across workers); a sample that fails to decode
drops the rest of its shard.

Sources: a local directory or a URL prefix opened with fsspec (http(s)://, s3://, ...; pass
`storage_options`), its manifest.json, or a list / brace expression of its shards (the manifest is read
beside them; the dataset is then those shards). `cache_dir=` keeps fetched shards in a bounded local
cache (`dctdata.format.cache`, `cache_limit` bytes, sha256-checked on reuse). Shell `pipe:` URLs are
refused unless `allow_pipe=True`; then `pipe:CMD` must contain `{}`, replaced by the file name
relative to the dataset (`manifest.json`, `shard-000000.tar`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from webdataset.utils import pytorch_worker_info

from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import storages
from dctdata.format.cache import DEFAULT_CACHE_LIMIT, ShardCache
from dctdata.format.location import check_location, shard_selection
from dctdata.format.manifest import Manifest
from dctdata.format.reader import UnitReader
from dctdata.format.webdataset.reader import Files
from dctdata.loaders import wds_plan
from dctdata.loaders.base import PackedDataset
from dctdata.loaders.options import ReadOptions
from dctdata.parse import SEED_MAX, is_int, parse_int

log = logging.getLogger(__name__)

_STAT_OK, _STAT_SKIPPED, _STAT_SAMPLES, _STAT_LOST = 0, 1, 2, 3


# The dataset -------------------------------------------------------------------------------------
class DCTWebDataset(PackedDataset, torch.utils.data.IterableDataset):
    """Iterable dataset over webdataset shards of a dctdata pack (see the module docstring)."""

    def __init__(
        self,
        path_or_url: str | os.PathLike | list,
        *,
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 1000,
        initial: int | None = None,
        as_dict: bool = False,
        on_error: str = "raise",
        split_by_node: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        allow_pipe: bool = False,
        manifest: Manifest | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str = DEFAULT_CACHE_LIMIT,
        decode: str = "cpu",
        options: ReadOptions | None = None,
    ) -> None:
        super().__init__()
        given = {"decode": decode, "on_error": on_error, "cache_dir": cache_dir, "cache_limit": cache_limit}
        self.options = options = ReadOptions.resolve(options, given, "DCTWebDataset")
        if options.read_threads is not None:
            raise DctDataError(
                f"read_threads: expected a zarr pack (its batches' chunks are decoded on threads). Got "
                f"read_threads={options.read_threads} for a webdataset pack, read shard by shard"
            )
        on_error, cache_dir, cache_limit = options.on_error, options.cache_dir, options.cache_limit
        seed = parse_int(seed, "seed", minimum=0, maximum=SEED_MAX)
        buffer_size = parse_int(buffer_size, "buffer_size", minimum=1)
        if (rank is None) != (world_size is None):
            raise DctDataError(
                f"rank/world_size: expected both or neither. Got rank={rank!r} world_size={world_size!r}"
            )
        if world_size is not None:
            if not is_int(world_size) or not is_int(rank):
                raise TypeError(f"rank/world_size: expected ints. Got rank={rank!r} world_size={world_size!r}")
            if world_size < 1 or not 0 <= rank < world_size:
                raise DctDataError(
                    f"rank/world_size: expected 0 <= rank < world_size. Got rank={rank} world_size={world_size}"
                )
        if isinstance(path_or_url, (list, tuple)):
            self.root, names = shard_selection(path_or_url)
        else:
            s = check_location(path_or_url, allow_pipe)
            self.root, names = (s, None) if s.startswith("pipe:") else shard_selection(s)
        self.manifest = manifest if manifest is not None else Files(self.root, storage_options).manifest()
        reader = storages.get(self.manifest.storage).reader
        if reader.random_access:  # a storage read shard by shard is what this class streams
            raise DctDataError(
                f"{self.root}: expected a webdataset dataset. Got storage {self.manifest.storage!r} (use "
                "dctdata.open_dataset)"
            )
        self.reader = reader(self.root, self.manifest, storage_options=storage_options, shards=names)
        self.shards = self.reader.shards
        if cache_dir is not None:
            largest = max((e["bytes"] for e in self.shards), default=0)
            self.reader.files.cache = ShardCache(cache_dir, cache_limit, largest=largest)
        self.fields = self.manifest.fields
        self.decode = options.decode
        # decode="device": the dct fields cross as their checked stored bytes
        self._stored = frozenset(f.name for f in self.fields if f.coded and self.decode == "device")
        self.shuffle, self.seed, self.buffer_size = bool(shuffle), seed, buffer_size
        self.initial = min(buffer_size, 100) if initial is None else initial
        self.as_dict, self.on_error, self.split_by_node = bool(as_dict), on_error, bool(split_by_node)
        self.rank, self.world_size = rank, world_size
        self.batch_size: int | None = None  # make_loader's batch size (see wds_plan)
        self.drop_last = False  # make_loader's drop_last (wds_plan.even_split's batch counts)
        self._warned = False
        # Shared memory: set_epoch reaches persistent workers, and workers' counts reach ds.stats.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._counts = torch.zeros(len(self.reader.all_shards), 4, dtype=torch.int64).share_memory_()

    # Epochs and splitting ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration's order the one of `epoch` (a pure function of seed and epoch)."""
        self._epoch[0] = parse_int(epoch, "epoch", minimum=0, maximum=SEED_MAX, type_error=DctDataError)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    @property
    def samples(self) -> int:
        """Samples of the (selected) shards, over all ranks."""
        return sum(e["samples"] for e in self.shards)

    def _node(self) -> tuple[int, int]:
        if not self.split_by_node:
            return 0, 1
        if self.world_size is not None:
            return self.rank, self.world_size
        rank, world, _, _ = pytorch_worker_info()
        return rank, world

    def split(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> wds_plan.Split:
        """What the order of one (rank, worker) in `epoch` depends on (see `wds_plan`)."""
        return wds_plan.Split(
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            buffer_size=self.buffer_size,
            initial=self.initial,
            rank=rank,
            world=world_size,
            worker=worker,
            workers=max(1, num_workers),
            batch=self.batch_size,
            drop_last=self.drop_last,
        )

    def indices_for(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> list[int]:
        """The sample indices one (rank, worker) yields in `epoch`, in order (no data is read)."""
        split = self.split(epoch, rank, world_size, worker, num_workers)
        return wds_plan.worker_indices(self._sizes(), self._starts(), split).tolist()

    def _sizes(self) -> list[int]:
        return [e["samples"] for e in self.shards]

    def _starts(self) -> list[int]:
        return [e["start"] for e in self.shards]

    def __len__(self) -> int:
        rank, world = self._node()
        return wds_plan.rank_size(self._sizes(), self.split(self.epoch, rank, world))

    def batches(self, batch_size: int | None, num_workers: int, drop_last: bool = False) -> int:
        """Batches a DataLoader of `num_workers` workers yields from this rank in the current epoch
        (each worker batches its own samples, so this can exceed ceil(len(ds) / batch_size))."""
        rank, world = self._node()
        split = self.split(self.epoch, rank, world, 0, num_workers)
        split = dataclasses.replace(split, batch=batch_size, drop_last=drop_last) if batch_size else split
        return wds_plan.batches(self._sizes(), split, drop_last) if batch_size else len(self)

    def fallback_warning(self, num_workers: int) -> str | None:
        """The warning for a split that cannot give every worker whole shards of its own, else None."""
        rank, world = self._node()
        split = self.split(self.epoch, rank, world, 0, num_workers)
        if not self.shuffle or wds_plan.whole_shards(len(self.shards), split) or wds_plan.even_split(split):
            return None
        readers = split.world * split.workers
        per = self.samples // readers
        fix = (
            f"repack with --samples-per-shard {per} for one read per shard"
            if per
            else f"there are fewer samples ({self.samples}) than that: use fewer DataLoader workers"
        )
        return (
            f"{self.root}: {len(self.shards)} shards for {split.world} rank(s) x {split.workers} DataLoader worker(s): "
            "each worker reads every shard it has a batch in instead of whole shards of its own (every sample is "
            f"still seen exactly once); {fix}"
        )

    def __getitem__(self, index):
        """Refused with a message that says what to do: a stream of tar shards has no random access
        (torch's IterableDataset raises a bare NotImplementedError)."""
        raise TypeError(
            f"{self.root}: DCTWebDataset[{index!r}]: expected iteration (`for sample in ds`, or a DataLoader). Got an "
            "index: a webdataset pack is a stream of tar shards without random access; pack with --format zarr for "
            "ds[i]"
        )

    # Iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> _Stream:
        rank, world = self._node()
        _, _, worker, num_workers = pytorch_worker_info()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
        if worker == 0 and not self._warned and (message := self.fallback_warning(num_workers)):
            log.warning(message)
        split = self.split(self.epoch, rank, world, worker, num_workers)
        return _Stream(self, split, *wds_plan.worker_plan(self._sizes(), self._starts(), split))

    # Reporting and decoding ----------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """Counts since creation, summed over this process and its DataLoader workers (a shard that
        several workers read counts once per read)."""
        c = self._counts
        skipped = c[:, _STAT_SKIPPED] > 0
        return {
            "shards_read": int(c[:, _STAT_OK].sum()),
            "shards_skipped": int(c[:, _STAT_SKIPPED].sum()),
            "samples": int(c[:, _STAT_SAMPLES].sum()),
            "samples_skipped": int(c[:, _STAT_LOST].sum()),
            "bad_shards": [s["name"] for s in self.shards if skipped[s["index"]]],
        }

    def __repr__(self) -> str:
        return self._describe(shards=len(self.shards))


# One worker's pass -------------------------------------------------------------------------------
class _Stream:
    """One (rank, worker)'s pass over its plan (`wds_plan.worker_plan`): `order` is the yield order,
    `entry` the same samples in stream order, as they would enter a shuffle buffer. Samples are decoded
    in entry order, just ahead of being needed, so a worker holds about one shard's bytes and at most a
    buffer of decoded samples, as webdataset's own shuffle stage would. torchdata `Stateful`:
    `state_dict()` is the yield position; `load_state_dict()` fast-forwards to it without reading, and
    shards whose remaining samples were all yielded before it are never fetched."""

    def __init__(self, ds: DCTWebDataset, split: wds_plan.Split, order: np.ndarray, entry: np.ndarray) -> None:
        self.ds, self.split, self.order, self.entry = ds, split, order, entry
        starts = np.array(ds._starts(), dtype=np.int64)
        self.shard_of = np.searchsorted(starts, entry, side="right") - 1  # per entry position
        by_value = np.argsort(order, kind="stable")
        self.entry_pos = np.empty(len(order), np.int64)  # yield position -> entry position
        self.entry_pos[by_value] = np.argsort(entry, kind="stable")
        self.yield_pos = np.empty(len(order), np.int64)  # entry position -> yield position
        self.yield_pos[self.entry_pos] = np.arange(len(order))
        self.last_entry = np.full(len(ds.shards), -1, np.int64)
        np.maximum.at(self.last_entry, self.shard_of, np.arange(len(entry)))
        self.position = 0  # next yield position
        self._floor = 0  # yield positions below it were yielded before a resume
        self._next_entry = 0
        self._decoded: dict[int, list[torch.Tensor]] = {}
        self._open: dict[int, UnitReader] = {}
        self._bad: set[int] = set()
        self._units = ds.reader.units()
        self._counts = ds._counts.numpy()  # a view of the shared counters: a count is a plain store, not a torch op

    def __iter__(self) -> _Stream:
        return self

    def __next__(self):
        while self.position < len(self.order):
            p = self.position
            self.position += 1
            while self._next_entry <= self.entry_pos[p]:
                self._enter(self._next_entry)
                self._next_entry += 1
            i = int(self.order[p])
            values = self._decoded.pop(i, None)
            s = int(self.shard_of[self.entry_pos[p]])
            if values is None:  # its shard was skipped (on_error="skip")
                self._counts[self.ds.shards[s]["index"], _STAT_LOST] += 1
                continue
            self._counts[self.ds.shards[s]["index"], _STAT_SAMPLES] += 1
            return self.ds._make(values)
        for s in list(self._open):
            self._release(s)
        raise StopIteration

    def _enter(self, k: int) -> None:
        """Decode the sample at entry position k (unless yielded before a resume or in a bad shard)."""
        s, ds = int(self.shard_of[k]), self.ds
        if self.yield_pos[k] >= self._floor and s not in self._bad:
            entry = ds.shards[s]
            try:
                reader = self._open.get(s)
                if reader is None:
                    reader = self._open[s] = ds.reader.open_unit(self._units[s])
                i = int(self.entry[k])
                self._decoded[i] = reader.sample(i - entry["start"], ds._stored)
            except IntegrityError as exc:
                if ds.on_error == "raise":
                    raise
                self._bad.add(s)
                self._counts[entry["index"], _STAT_SKIPPED] += 1
                self._open.pop(s, None)
                log.warning("skipping shard %s: %s", entry["name"], exc)
        if k == self.last_entry[s]:
            self._release(s)

    def _release(self, s: int) -> None:
        if self._open.pop(s, None) is not None:
            self._counts[self.ds.shards[s]["index"], _STAT_OK] += 1

    # torchdata Stateful --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        sp = self.split
        where = {"epoch": sp.epoch, "rank": sp.rank, "worker": sp.worker, "workers": sp.workers}
        return {**where, "position": self.position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        sp = self.split
        expected = {"epoch": sp.epoch, "rank": sp.rank, "worker": sp.worker, "workers": sp.workers}
        got = {k: state.get(k) for k in expected} if isinstance(state, Mapping) else state
        if got != expected:
            raise DctDataError(f"{self.ds.root}: worker state: expected {expected}. Got {got}")
        position = parse_int(state.get("position"), "worker state position", minimum=0, maximum=len(self.order),
                             type_error=DctDataError)  # fmt: skip
        self.position = self._floor = position
        self._next_entry = 0
        self._decoded.clear()
        self._open.clear()
