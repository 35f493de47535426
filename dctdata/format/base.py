"""The writer interface every storage format implements, and its incremental (streaming) use.

A dataset is written as *parts*: sample ranges that each own whole output files (a zarr shard of every
field; one webdataset tar), so parts can be written in any order, in parallel (Dask) and resumed. A
writer holds only options (it is pickled to Dask workers); the pack orchestrator
(`dctdata.preprocess.pack`) drives it and writes the manifest last:

    plan(fields, n) -> [(start, stop), ...]        # the parts; part i owns its files alone
    open(root, fields, n) -> None                  # client, once: metadata files (zarr.json)
    write_part(root, fields, n, i, start, stop, batches) -> {"files": {rel: {"sha256", "bytes"}}, ...}
        # anywhere: batches yields dicts field -> (B, *stored_shape) arrays in the stored dtype
        # covering [start, stop) in order
    finish(root, fields, n, part_results) -> {"layout": {...}, "checksums": {rel: {...}}}  # client

Writers never compute error figures and never write the manifest.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format.fields import FieldSpec

Batch = Mapping[str, np.ndarray]
Fields = tuple[FieldSpec, ...]


@runtime_checkable
class Writer(Protocol):
    storage: str

    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]: ...

    def open(self, root: str, fields: Fields, n: int) -> None: ...

    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict: ...

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict]) -> dict[str, Any]: ...


class PartWriter:
    """Base of the format writers: option handling (only options travel to Dask workers) and the
    streaming use in one process: `open(root, fields, n)`, then `write(start, batch)` with consecutive
    starts (whole parts are written as they fill), `close()` -> {"layout", "checksums"}, or `abort()`."""

    storage = ""
    options: tuple[str, ...] = ()

    def __getstate__(self) -> dict:
        return {k: getattr(self, k) for k in self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _begin(self, root: str, fields: Fields, n: int) -> None:
        self._root, self._fields, self._n = root, tuple(fields), n
        self._plan = self.plan(self._fields, n)
        self._parts: list[dict] = []
        self._pending: list[dict[str, Any]] = []
        self.count = 0

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
        for i in range(b):
            self._pending.append({f.name: arrays[f.name][i] for f in self._fields})
            self.count += 1
            index = len(self._parts)
            a, z = self._plan[index]
            if self.count == z:
                stacked = {f.name: np.stack([s[f.name] for s in self._pending]) for f in self._fields}
                self._pending = []
                self._parts.append(self.write_part(self._root, self._fields, self._n, index, a, z, [stacked]))

    def close(self) -> dict[str, Any]:
        """Check every sample arrived; returns {"layout": ..., "checksums": ...} for the manifest."""
        if self.count != self._n:
            raise DctDataError(f"{self.storage} writer: expected {self._n} samples. Got {self.count}")
        return self.finish(self._root, self._fields, self._n, self._parts)

    def abort(self) -> None:
        """Drop buffered samples after an error (the orchestrator removes the directory)."""
        self._pending = []
