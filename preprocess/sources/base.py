"""The source interface: a sequence of samples, each a dict field name -> numpy array (0-d for scalars).
Sources never load a whole dataset; `batches()` stacks consecutive samples, `take()` a few.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from dctdata.errors import DctDataError


def trajectory_stats(sums: dict[str, np.ndarray]) -> dict[str, dict[str, list[float]]]:
    """The per-field statistics a trajectory pack records (what the window loader's normalization reads), from
    per-channel running sums: `sums[name]` is (6, C) rows of the values' count, sum and sum of squares, then the
    same of the differences between consecutive frames of a trajectory. A channel with no values (or no
    differences) gets 0, not a division by zero."""
    out = {}
    for name, (n, s, ss, nd, ds, dss) in sums.items():
        mean, msq = s / np.maximum(n, 1), ss / np.maximum(n, 1)
        dmean, dmsq = ds / np.maximum(nd, 1), dss / np.maximum(nd, 1)
        out[name] = {
            "mean": mean.tolist(),
            "std": np.sqrt(np.maximum(msq - mean**2, 0)).tolist(),
            "rms": np.sqrt(msq).tolist(),
            "mean_delta": dmean.tolist(),
            "std_delta": np.sqrt(np.maximum(dmsq - dmean**2, 0)).tolist(),
            "rms_delta": np.sqrt(dmsq).tolist(),
        }
    return out


def field_name(raw: str) -> str:
    """A stored field name from a source name (npz key, HDF5 path): non-identifier characters -> '_'."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw.strip("/"))
    return name if re.match(r"^[A-Za-z_]", name) else f"f_{name}"


class Source:
    """Base class: random access by `sample(i)`; `batches()` stacks consecutive samples."""

    description = "source"
    random_access = True
    default_kinds: dict[str, str] = {}
    info: dict[str, Any] = {}
    coords: dict[str, Any] = {}  # manifest coordinate entries (dctdata.format.coords), e.g. xarray's time
    field_attrs: dict[str, dict[str, Any]] = {}  # per field: JSON metadata (units, ...)

    def __len__(self) -> int:
        raise NotImplementedError

    def where(self, index: int) -> str:
        """Human description of sample `index` for error messages."""
        return f"{self.description} sample {index}"

    def sample(self, index: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def probe(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-sample (shape, dtype) of every field, in field order (from the first sample)."""
        if len(self) == 0:
            raise DctDataError(f"{self.description}: expected at least one sample. Got 0")
        first = next(self.batches(1, stop=1))[1]
        return {k: (tuple(v.shape[1:]), v.dtype) for k, v in first.items()}

    def read_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples [start, stop) stacked per field; ragged samples raise naming the sample."""
        samples = [self.sample(i) for i in range(start, stop)]
        out = {}
        for name in samples[0]:
            ref = samples[0][name]
            for i, s in enumerate(samples):
                if name not in s:
                    raise DctDataError(f"{self.where(start + i)}: expected field {name!r}. Got fields {sorted(s)}")
                if s[name].shape != ref.shape:
                    raise DctDataError(
                        f"{self.where(start + i)}: field {name!r}: expected shape {ref.shape} like sample {start}. "
                        f"Got {s[name].shape} (ragged samples)"
                    )
            out[name] = np.stack([s[name] for s in samples])
        return out

    def batches(
        self, batch_size: int, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        stop = len(self) if stop is None else min(stop, len(self))
        for a in range(start, stop, batch_size):
            yield a, self.read_batch(a, min(a + batch_size, stop))

    def take(self, indices: list[int]) -> dict[str, np.ndarray]:
        """Stack a few (sorted, unique) samples, e.g. a calibration subset."""
        if self.random_access:
            parts = [self.read_batch(i, i + 1) for i in indices]
        else:
            wanted, parts = set(indices), []
            for a, batch in self.batches(256):
                for i in range(a, a + len(next(iter(batch.values())))):
                    if i in wanted:
                        parts.append({k: v[i - a : i - a + 1] for k, v in batch.items()})
                if len(parts) == len(indices):
                    break
        for i, p in zip(indices, parts):  # ragged samples: the errors read_batch gives, before concatenate's
            for k, ref in parts[0].items():
                if k not in p:
                    raise DctDataError(f"{self.where(i)}: expected field {k!r}. Got fields {sorted(p)}")
                if p[k].shape[1:] != ref.shape[1:]:
                    raise DctDataError(
                        f"{self.where(i)}: field {k!r}: expected shape {ref.shape[1:]} like sample {indices[0]}. Got "
                        f"{p[k].shape[1:]} (ragged samples)"
                    )
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def close(self) -> None:
        pass


class ChannelsLast(Source):
    """Wraps a source: 3-D per-sample arrays (H, W, C) -> (C, H, W); with dims=3, 4-D ones (D, H, W, C) ->
    (C, D, H, W)."""

    def __init__(self, inner: Source, dims: int = 2) -> None:
        self.inner = inner
        self.rank = dims + 1  # per-sample rank of the arrays whose last axis is moved
        self.description = inner.description
        self.random_access = inner.random_access
        self.default_kinds = inner.default_kinds
        self.info = inner.info
        self.coords = inner.coords
        self.field_attrs = inner.field_attrs

    def __len__(self) -> int:
        return len(self.inner)

    def where(self, index: int) -> str:
        return self.inner.where(index)

    @staticmethod
    def _fix(batch, rank: int = 3):
        """Move the last axis of every field with `rank` dims per sample (a batch has one more) to axis 1."""
        return {k: np.moveaxis(v, -1, 1) if v.ndim == rank + 1 else v for k, v in batch.items()}

    def read_batch(self, start, stop):
        return self._fix(self.inner.read_batch(start, stop), self.rank)

    def batches(self, batch_size, start=0, stop=None):
        for a, b in self.inner.batches(batch_size, start, stop):
            yield a, self._fix(b, self.rank)

    def take(self, indices):
        return self._fix(self.inner.take(indices), self.rank)

    def probe(self):
        return {
            k: ((shape[-1], *shape[:-1]) if len(shape) == self.rank else shape, dtype)
            for k, (shape, dtype) in self.inner.probe().items()
        }

    def close(self):
        self.inner.close()
