"""`DCTZarrDataset`: map-style random access to a zarr-stored dctdata dataset.

`ds[i]` is a tuple of tensors in manifest field order (`as_dict=True`: a dict); `dct` fields come
out as their stored coefficients (C, Hb, K, Wb) in the wire dtype, to be decoded on the device by
`ds.decompressor()` (the model's first layer). `__getitems__` serves a DataLoader batch with one
batched read: the byte ranges of every chunk the batch needs, fetched together. `ds[a:b]` (any slice) is
a batch: each field's samples stacked on a new first axis, as a DataLoader collates them, ready for
`ds.decompressor()`. With `decode="device"` a `dct` field comes out as its checked stored bytes instead
(`dctdata.decoder.wire.StoredSample`; a slice or a DataLoader batch: one `StoredBatch`), which
`ds.decompressor()` decodes where it runs.

Reading, per-process opening (fork and spawn safe) and every integrity check are the job of the pack's
storage reader (`dctdata.format.zarr.ZarrReader`, through `dctdata.format.storages`); this class is the
torch Dataset over it. A missing shard or chunk, a truncated shard or a chunk failing its crc32c raises
`IntegrityError` naming the file, field and samples; `on_error="skip"` drops bad samples from
`__getitems__` batches instead (logged and counted in `ds.skipped`, summed over the DataLoader workers).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dctdata.decoder.wire import StoredBatch, StoredSample, collate_stored
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import storages
from dctdata.format.fields import with_partners
from dctdata.format.location import manifest_location
from dctdata.format.manifest import Manifest, read_manifest
from dctdata.loaders.base import PackedDataset
from dctdata.loaders.options import ReadOptions
from dctdata.parse import is_int

log = logging.getLogger(__name__)
# Slots of the shared skipped-sample count: this process and up to 255 DataLoader workers (more workers share
# slots modulo 255).
SKIP_SLOTS = 256


class DCTZarrDataset(PackedDataset, torch.utils.data.Dataset):
    def __init__(
        self,
        path_or_url: str | os.PathLike,
        *,
        fields: Sequence[str] | None = None,
        as_dict: bool = False,
        on_error: str = "raise",
        storage_options: dict[str, Any] | None = None,
        manifest: Manifest | None = None,
        decode: str = "cpu",
        read_threads: int | None = None,
        options: ReadOptions | None = None,
    ) -> None:
        given = {"decode": decode, "on_error": on_error, "read_threads": read_threads}
        self.options = options = ReadOptions.resolve(options, given, "DCTZarrDataset")
        on_error = options.on_error
        self.root, _ = manifest_location(path_or_url)
        if options.cache_dir is not None:
            raise DctDataError(
                f"{self.root}: cache_dir: expected a webdataset pack (tar shards). Got a zarr pack, which is read by "
                "byte range"
            )
        self.manifest = (
            manifest if manifest is not None else read_manifest(path_or_url, storage_options=storage_options)
        )
        reader = storages.get(self.manifest.storage).reader
        if not reader.random_access:  # map-style needs a storage read by index
            raise DctDataError(
                f"{self.root}: expected a zarr dataset. Got storage {self.manifest.storage!r} (use "
                "dctdata.open_dataset)"
            )
        names = self.manifest.names if fields is None else tuple(fields)
        for n in names:
            self.manifest.field(n)  # unknown names fail here, naming the choices
        self.fields = with_partners(self.manifest.fields, names)
        self.as_dict = bool(as_dict)
        self.on_error = on_error
        self.decode = options.decode
        # decode="device": the dct fields cross as their checked stored bytes
        self._stored = frozenset(f.name for f in self.fields if f.coded and self.decode == "device")
        # Skipped samples, one slot per DataLoader worker (slot 0: this process), in shared memory: the
        # workers' counts reach `skipped` in the main process (a plain int stayed 0 there), and each worker
        # adds only to its own slot, so no two processes race on one count. Only on_error="skip" counts: a
        # shared tensor holds a file descriptor while the dataset lives, which the default mode does not need.
        counts = torch.zeros(SKIP_SLOTS if on_error == "skip" else 1, dtype=torch.int64)
        self._skipped = counts.share_memory_() if on_error == "skip" else counts
        self.reader = reader(self.root, self.manifest, self.fields, storage_options)
        self.reader.read_threads = options.read_threads

    def _index(self, i: object) -> int:
        if isinstance(i, torch.Tensor):
            if i.ndim:  # a batch of indices: several samples are __getitems__'s job
                raise TypeError(
                    f"index: expected an int, a 0-d tensor or a slice (use __getitems__ for several samples). Got a "
                    f"tensor of shape {tuple(i.shape)}"
                )
            i = i.item()
        if not is_int(i):
            raise TypeError(f"index: expected an int or a slice. Got {type(i).__name__}")
        n = self.manifest.samples
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        return j

    def _read_runs(self, idx: list[int]) -> dict[int, Any]:
        """{sample index: the sample} for the distinct indices of `idx`."""
        order = sorted(set(idx))
        arrays = self.reader.read_samples(self.fields, order, self._stored)  # every chunk in one batched read
        columns = [
            arrays[f.name] if f.name in self._stored else f.to_tensor(arrays[f.name]).unbind(0) for f in self.fields
        ]
        return dict(zip(order, self._make_many(columns)))

    def __len__(self) -> int:
        return self.manifest.samples

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._batch(range(*i.indices(self.manifest.samples)))
        j = self._index(i)
        return self._read_runs([j])[j]

    def _batch(self, indices: range):
        """Samples `indices` collated: every field stacked on a new first axis (empty slices too)."""
        samples = self.__getitems__(list(indices))
        if not samples:
            return self._make([self._empty(f) for f in self.fields])
        if self.as_dict:
            return {k: _stack([s[k] for s in samples]) for k in samples[0]}
        return tuple(_stack(list(column)) for column in zip(*samples))

    def _empty(self, f) -> Any:
        """A field's value of an empty batch."""
        if f.name in self._stored:
            return StoredBatch.empty(self.reader.stream_form(f))
        return f.to_tensor(np.zeros((0, *f.stored_shape), dtype=f.stored_dtype))

    def __getitems__(self, indices: Sequence[int]) -> list:
        idx = [self._index(i) for i in indices]
        try:
            got = self._read_runs(idx)
        except IntegrityError:
            if self.on_error == "raise":
                raise
            got = {}
            for j in sorted(set(idx)):
                try:
                    got.update(self._read_runs([j]))
                except IntegrityError as exc:
                    info = torch.utils.data.get_worker_info()
                    slot = 0 if info is None else 1 + info.id % (SKIP_SLOTS - 1)
                    self._skipped.numpy()[slot] += 1  # a view of the shared counts: a plain store
                    log.warning("skipping sample %d: %s", j, exc)
        return [got[j] for j in idx if j in got]

    @property
    def skipped(self) -> int:
        """Samples dropped by `on_error="skip"` since the dataset was made, summed over this process and its
        DataLoader workers (a sample skipped in two epochs counts twice)."""
        return int(self._skipped.sum())

    def close(self) -> None:
        """Close this process's file descriptors now (also done when the dataset is collected); a later
        read opens them again. `with dctdata.open_dataset(path) as ds:` closes at the end of the block."""
        self.reader.close()

    def __enter__(self) -> DCTZarrDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return self._describe()


def open_zarr_dataset(path_or_url, **kwargs) -> DCTZarrDataset:
    return DCTZarrDataset(path_or_url, **kwargs)


__all__ = ["DCTZarrDataset", "open_zarr_dataset"]


def _stack(values: list) -> Any:
    """One field's values of several samples stacked on a new first axis; a (coefficients, side) pair
    stays a pair of stacked tensors."""
    if isinstance(values[0], tuple):
        return tuple(_stack(list(part)) for part in zip(*values))
    if isinstance(values[0], StoredSample):
        return collate_stored(values)
    return torch.stack(values)
