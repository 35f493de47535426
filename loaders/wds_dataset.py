"""`DCTWebDataset`: stream a webdataset-stored dctdata dataset (tar shards) as a torch IterableDataset.

Samples are tuples of tensors in manifest field order (`as_dict=True`: a dict), decoded exactly like
`DCTZarrDataset`: a `dct` field is its stored coefficient tensor (C, Hb, K, Wb) in the wire dtype
(bfloat16 viewed back from its uint16 bits), `array` fields as stored, labels as 0-d tensors. Decode
on the device with `ds.decompressor()`.

Order and splitting (every sample exactly once per epoch):
- The shard list of the manifest is permuted by a generator seeded with (seed, epoch) - the same
  permutation in every rank and worker - then dealt round-robin to ranks (`perm[rank::world]`) and,
  within a rank, to DataLoader workers (`[worker::num_workers]`). Each worker streams its shards and
  mixes their samples in a shuffle buffer (`webdataset.shuffle`, `buffer_size` samples) seeded with
  (seed, epoch, rank, worker). So for a fixed world size and worker count the order is a pure
  function of (seed, epoch). Call `ds.set_epoch(e)` before each epoch (as with DistributedSampler;
  without it every epoch repeats epoch 0's order). The epoch lives in shared memory, so it also
  reaches `persistent_workers=True` workers.
- rank/world size come from the `rank=`/`world_size=` arguments, else webdataset's
  `pytorch_worker_info` (RANK/WORLD_SIZE env or an initialized torch.distributed). `split_by_node=False`
  gives every rank all shards.
- Fewer shards than ranks x workers is an error (whole shards are the unit of work, so some workers
  would get nothing and the split could not be balanced): repack with smaller shards or use fewer
  workers. A sample-level split was not chosen because it would make every worker read every shard.
- `len(ds)` is the number of samples *this rank* yields in the current epoch: the manifest count on
  one rank; with several ranks the sum over the shards dealt to this rank, which can differ between
  ranks by up to about one shard (DDP users: `torch.distributed.algorithms.Join`, or repack with
  `--samples-per-shard` so shard counts divide evenly).

Integrity (verify, then yield): each shard is read whole and verified by
`dctdata.format.webdataset.ShardReader` (size, sha256, tar structure, keys) before its first sample is
yielded (one shard per worker in memory at a time). With `on_error="raise"` (default) a bad shard
raises `IntegrityError` naming it; with `on_error="skip"` it is skipped, logged and counted in
`ds.stats` (shared across workers); a sample that fails to decode drops the rest of its shard.

Sources: a local directory or a URL prefix opened with fsspec (http(s)://, s3://, ...; pass
`storage_options`). Shell `pipe:` URLs are refused unless `allow_pipe=True`; then `pipe:CMD` must
contain `{}`, replaced by the file name relative to the dataset (`manifest.json`, `shard-000000.tar`).
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import webdataset as wds
from webdataset.utils import pytorch_worker_info

from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.location import MANIFEST_NAME, manifest_location
from dctdata.format.manifest import Manifest
from dctdata.format.webdataset.layout import shard_list
from dctdata.format.webdataset.reader import Files, ShardReader, check_location, codecs_for
from dctdata.loaders.base import PackedDataset
from dctdata.parse import is_int, parse_int

log = logging.getLogger(__name__)

_STAT_OK, _STAT_SKIPPED, _STAT_SAMPLES, _STAT_LOST = 0, 1, 2, 3


# The dataset -------------------------------------------------------------------------------------
class DCTWebDataset(PackedDataset, torch.utils.data.IterableDataset):
    """Iterable dataset over webdataset shards of a dctdata pack (see the module docstring)."""

    def __init__(
        self,
        path_or_url: str | os.PathLike,
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
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip"):
            raise DctDataError(f"on_error: expected 'raise' or 'skip'. Got {on_error!r}")
        seed = parse_int(seed, "seed", minimum=0)
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
        s = check_location(path_or_url, allow_pipe)
        self.root = s if s.startswith("pipe:") else manifest_location(s)[0]
        self._files = Files(self.root, storage_options)
        self.manifest = manifest if manifest is not None else self._files.manifest()
        if self.manifest.storage != "webdataset":
            raise DctDataError(
                f"{self.root}: expected a webdataset dataset. Got storage {self.manifest.storage!r} (use "
                "dctdata.open_dataset)"
            )
        self.shards = shard_list(self.manifest, self._files.location(MANIFEST_NAME))
        self.fields = self.manifest.fields
        self.shuffle, self.seed, self.buffer_size = bool(shuffle), seed, buffer_size
        self.initial = min(buffer_size, 100) if initial is None else initial
        self.as_dict, self.on_error, self.split_by_node = bool(as_dict), on_error, bool(split_by_node)
        self.rank, self.world_size = rank, world_size
        # Shared memory: set_epoch reaches persistent workers, and workers' counts reach ds.stats.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._counts = torch.zeros(len(self.shards), 4, dtype=torch.int64).share_memory_()

    # Epochs and splitting ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration's order the one of `epoch` (a pure function of seed and epoch)."""
        self._epoch[0] = parse_int(epoch, "epoch", minimum=0, type_error=DctDataError)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def _node(self) -> tuple[int, int]:
        if not self.split_by_node:
            return 0, 1
        if self.world_size is not None:
            return self.rank, self.world_size
        rank, world, _, _ = pytorch_worker_info()
        return rank, world

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.shards)))
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def shards_for(
        self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1
    ) -> list[dict[str, Any]]:
        """The shard entries one (rank, worker) reads in `epoch`, in reading order."""
        n = len(self.shards)
        if 0 < n < world_size * num_workers:
            raise DctDataError(
                f"{self.root}: expected at least {world_size * num_workers} shards for {world_size} rank(s) x "
                f"{num_workers} "
                f"DataLoader worker(s) (whole shards are split between them). Got {n} shards "
                "(repack with a smaller --max-shard-size or --samples-per-shard, or use fewer workers)"
            )
        return [self.shards[i] for i in self._permutation(epoch)[rank::world_size][worker::num_workers]]

    def __len__(self) -> int:
        rank, world = self._node()
        if world == 1:
            return self.manifest.samples
        return sum(s["samples"] for s in self.shards_for(self.epoch, rank, world))

    # Iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        rank, world = self._node()
        _, _, worker, num_workers = pytorch_worker_info()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
        epoch = self.epoch
        shards = self.shards_for(epoch, rank, world, worker, num_workers)
        stages = [lambda: iter(shards), self._samples]
        if self.shuffle:
            state = np.random.SeedSequence([self.seed, epoch, rank, worker]).generate_state(2)
            rng = random.Random(int(state[0]) << 32 | int(state[1]))
            stages.append(wds.shuffle(self.buffer_size, self.initial, rng=rng))
        stages.append(self._containers)
        return iter(wds.DataPipeline(*stages))

    def _skip(self, entry: Mapping[str, Any], exc: Exception, done: int = 0) -> None:
        self._counts[entry["index"], _STAT_SKIPPED] += 1
        self._counts[entry["index"], _STAT_LOST] += entry["samples"] - done
        log.warning("skipping shard %s: %s", entry["name"], exc)

    def _samples(self, shards) -> Iterator[list[torch.Tensor]]:
        codecs = codecs_for(self.fields)
        for entry in shards:
            try:
                shard = ShardReader(self._files, entry, self.fields, codecs)
            except DctDataError as exc:
                if self.on_error == "raise":
                    raise
                self._skip(entry, exc)
                continue
            done = 0
            try:
                for j in range(entry["samples"]):
                    values = shard.decode(j)
                    done += 1
                    yield values
            except IntegrityError as exc:
                if self.on_error == "raise":
                    raise
                self._skip(entry, exc, done)
            else:
                self._counts[entry["index"], _STAT_OK] += 1
            finally:
                self._counts[entry["index"], _STAT_SAMPLES] += done
            del shard

    def _containers(self, samples):
        for values in samples:
            yield self._make(values)

    # Reporting and decoding ----------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """Counts since creation, summed over this process and its DataLoader workers."""
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
