"""The writer interface every storage format implements, and its incremental (streaming) use.

A dataset is written as *parts*: sample ranges that each own whole output files (a zarr shard of every
field; one webdataset tar), so parts can be written in any order, in parallel (Dask) and resumed. A
writer holds only options (it is pickled to Dask workers); the pack orchestrator
(`dctdata.preprocess.pack`) drives it and writes the manifest last:

    plan(fields, n) -> [(start, stop), ...]        # the parts; part i owns its files alone
    open(root, fields, n) -> None                  # client, once: metadata files (zarr.json) via create()
    write_part(root, fields, n, i, start, stop, batches) -> {"files": {rel: {"sha256", "bytes"}}, ...}
        # anywhere: batches yields dicts field -> (B, *stored_shape) arrays in the stored dtype
        # covering [start, stop) in order
    finish(root, fields, n, part_results) -> {"layout": {...}, "checksums": {rel: {...}}}  # client

Writers never compute error figures and never write the manifest.

Streaming use (`PartWriter`: `open`, `write`, `close`, `abort`; the incremental `dctdata.Writer`)
also works when the sample count is not known in advance (`open(root, fields, None)`). Parts then
have the length they have for a large dataset (`part_samples`), each is written as soon as it is
full, the storage's metadata grows with them (`resize`), and `close()` settles the count. A dataset
shorter than one part is only written at `close()`, with the layout a known count gives, so the
files are the same as a pack of the same samples with the count known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import torch

from dctdata.errors import DctDataError
from dctdata.format.fields import FieldSpec

Batch = Mapping[str, npt.NDArray[Any]]
Fields = tuple[FieldSpec, ...]


@runtime_checkable
class Writer(Protocol):
    storage: str

    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]: ...

    def open(self, root: str, fields: Fields, n: int) -> None: ...

    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict[str, Any]: ...

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict[str, Any]]) -> dict[str, Any]: ...


class PartWriter:
    """Base of the format writers: option handling (only options travel to Dask workers) and the
    streaming use in one process: `open(root, fields, n)`, then `write(start, batch)` with consecutive
    starts (whole parts are written as they fill), `close()` -> {"layout", "checksums"}, or `abort()`."""

    storage = ""
    options: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, **state)

    if TYPE_CHECKING:  # what every format writer defines (the `Writer` protocol), used below

        def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]: ...

        def write_part(
            self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
        ) -> dict[str, Any]: ...

        def finish(self, root: str, fields: Fields, n: int, parts: list[dict[str, Any]]) -> dict[str, Any]: ...

    # Format-specific ------------------------------------------------------------------------------
    def create(self, root: str, fields: Fields, n: int) -> None:
        """Metadata files of a dataset of `n` samples (nothing for tar shards)."""
        raise NotImplementedError

    def resize(self, root: str, fields: Fields, n: int) -> None:
        """Set the sample count after create() (streaming with an unknown count); nothing by default."""

    def part_samples(self, fields: Fields) -> int:
        """Samples per part when the dataset is large (parts never get longer than this)."""
        raise NotImplementedError

    # Streaming use ---------------------------------------------------------------------------------
    def open(self, root: str, fields: Fields, n: int | None) -> None:
        """Create the metadata (known n) and start streaming; n=None: the count is settled by close()."""
        if n is not None:
            self.create(root, fields, n)
        self._begin(root, fields, n)

    def _begin(self, root: str, fields: Fields, n: int | None) -> None:
        self._root, self._fields, self._n = root, tuple(fields), n
        self._plan = None if n is None else self.plan(self._fields, n)
        self._part_len = self.part_samples(self._fields) if n is None else 0  # used only while n is unknown
        self._parts: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self.count = 0

    def _range(self, index: int) -> tuple[int, int]:
        if self._plan is not None:
            return self._plan[index]
        return index * self._part_len, (index + 1) * self._part_len

    def _flush(self, index: int, a: int, z: int) -> None:
        stacked = {f.name: np.stack([s[f.name] for s in self._pending]) for f in self._fields}
        self._pending = []
        if self._n is None:  # the count is at least z now: grow the metadata (created with the first part)
            (self.resize if index else self.create)(self._root, self._fields, z)
        self._parts.append(
            self.write_part(self._root, self._fields, z if self._n is None else self._n, index, a, z, [stacked])
        )

    def write(self, start: int, batch: Mapping[str, Any]) -> None:
        """Append samples [start, start + B) given as field -> (B, *stored_shape) arrays."""
        if getattr(self, "_root", None) is None:
            raise DctDataError("writer: expected open() before write(). Got a writer that is not open")
        if start != self.count:
            raise DctDataError(f"write: expected consecutive samples starting at {self.count}. Got start={start}")
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch: expected a mapping field name -> (B, ...) array. Got {type(batch).__name__}")
        names = [f.name for f in self._fields]
        if set(batch) != set(names):
            raise DctDataError(f"samples {start}..: expected fields {names}. Got {sorted(batch)}")
        sizes = {k: len(v) for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise DctDataError(f"samples {start}..: expected the same number of samples in every field. Got {sizes}")
        b = sizes[names[0]]
        arrays = {
            f.name: f.to_stored(batch[f.name]) if isinstance(batch[f.name], torch.Tensor) else np.asarray(batch[f.name])
            for f in self._fields
        }
        for f in self._fields:
            arr = arrays[f.name]
            if arr.dtype.name != f.stored_dtype or tuple(arr.shape[1:]) != f.stored_shape:
                raise DctDataError(
                    f"samples {start}..{start + b - 1} field {f.name!r}: expected stored {f.stored_dtype} "
                    f"{f.stored_shape}. "
                    f"Got {arr.dtype.name} {tuple(arr.shape[1:])}"
                )
        if self._n is not None and self.count + b > self._n:
            raise DctDataError(f"{self.storage} writer: expected {self._n} samples. Got more")
        for i in range(b):
            self._pending.append({f.name: arrays[f.name][i] for f in self._fields})
            self.count += 1
            index = len(self._parts)
            a, z = self._range(index)
            if self.count == z:
                self._flush(index, a, z)

    def close(self) -> dict[str, Any]:
        """Check every sample arrived (or settle the count); returns {"layout", "checksums"} for the manifest."""
        if getattr(self, "_root", None) is None:
            raise DctDataError("writer: expected open() before close(). Got a writer that is not open")
        if self._n is None:
            n = self.count
            if n == 0:
                raise DctDataError(f"{self.storage} writer: expected at least one sample. Got 0")
            if not self._parts:  # shorter than one part: lay it out for its real count
                self.create(self._root, self._fields, n)
                self._n, self._plan = n, self.plan(self._fields, n)
            else:
                self.resize(self._root, self._fields, n)
                self._n = n
                self._plan = [self._range(i) for i in range(len(self._parts))] + [
                    (len(self._parts) * self._part_len, n)
                ]
            pending, self._pending = self._pending, []
            while pending:
                index = len(self._parts)
                a, z = self._plan[index]
                self._pending, pending = pending[: z - a], pending[z - a :]
                self._flush(index, a, z)
        if self.count != self._n:
            raise DctDataError(f"{self.storage} writer: expected {self._n} samples. Got {self.count}")
        return self.finish(self._root, self._fields, self._n, self._parts)

    def abort(self) -> None:
        """Drop buffered samples after an error (the orchestrator removes the directory)."""
        self._pending = []
