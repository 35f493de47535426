"""In-memory Python objects as pack sources: a NumPy array or torch tensor (samples on the first axis;
one field `image`), a dict of them (one field each, the same sample count), or a list of already
normalized samples (the incremental `Writer`'s calibration window).

Arrays are sliced per batch, never copied whole: a memory-mapped array stays on disk. Tensors are
viewed as NumPy arrays (on the CPU; bfloat16 becomes float32). A masked array's masked entries become
NaN (then `nan="mask"` stores the mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.arrays import ArraySource
from dctdata.preprocess.sources.base import Source, field_name
from dctdata.preprocess.sources.callables import tensor_to_numpy


def is_array(obj: object) -> bool:
    return isinstance(obj, np.ndarray) or (hasattr(obj, "detach") and hasattr(obj, "numpy") and hasattr(obj, "shape"))


def _as_numpy(value: Any, where: str) -> np.ndarray:
    value = tensor_to_numpy(value)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{where}: expected a NumPy array or torch tensor. Got {type(value).__name__}")
    if value.dtype.hasobject or value.dtype.kind in "OUSVMm":
        raise DctDataError(f"{where}: expected a numeric array. Got dtype {value.dtype}")
    if value.ndim == 0:
        raise DctDataError(f"{where}: expected samples on the first axis. Got a 0-d array")
    return value


def array_source(obj: Any) -> ArraySource:
    """An array or tensor (field `image`) or a dict of them (a field each)."""
    if isinstance(obj, Mapping):
        if not obj:
            raise DctDataError("source: expected a dict of arrays with at least one field. Got an empty dict")
        arrays = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"source: expected string keys (field names). Got {k!r}")
            arrays[field_name(k)] = _as_numpy(v, f"source[{k!r}]")
        shapes = ", ".join(f"{k} {tuple(a.shape)}" for k, a in arrays.items())
        return ArraySource(f"<dict: {shapes}>", arrays)
    arr = _as_numpy(obj, "source")
    return ArraySource(f"<{type(obj).__name__} {tuple(arr.shape)} {arr.dtype}>", {"image": arr})


class SampleListSource(Source):
    """Samples already normalized to {field: array} (see `callables.sample_dict`), held in memory."""

    def __init__(self, samples: list[dict[str, np.ndarray]], description: str = "samples", first: int = 0) -> None:
        self.samples = samples
        self.description = description
        self.first = first
        self.default_kinds = {}

    def __len__(self) -> int:
        return len(self.samples)

    def where(self, index: int) -> str:
        return f"{self.description} sample {self.first + index}"

    def sample(self, index: int) -> dict[str, np.ndarray]:
        return self.samples[index]
