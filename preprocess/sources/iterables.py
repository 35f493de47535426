"""Iterables and generators of samples as pack sources (`dctdata.pack(generator, ...)`): each item is a
dict, a tuple/list or a single array (the map-style dataset rule, `callables.sample_dict`).

They are read once, in order, and go through the incremental `Writer` (no random access, maybe no
length): calibration uses a first window of samples or an explicit calibration set (see
`dctdata.preprocess.writer`). `length` is the expected sample count when known (a `__len__`, or the
caller's); a stream that ends early or runs long is then an error naming the sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.parse import parse_optional_int
from dctdata.preprocess.sources.callables import sample_dict


def is_sample_iterable(obj: object) -> bool:
    """An iterable of samples that is not a path, array, dict or map-style dataset."""
    if isinstance(obj, (str, bytes, Mapping, np.ndarray)) or hasattr(obj, "__fspath__"):
        return False
    if hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        return False  # map-style (lists included): random access, packed like a dataset
    return hasattr(obj, "__iter__")


class IterableSource:
    """Normalized samples of an iterable: yields (index, {field: array}, decoded image field names)."""

    def __init__(self, iterable: Iterable[Any], length: int | None = None, description: str | None = None) -> None:
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"source: expected an iterable of samples. Got {type(iterable).__name__}")
        if length is None and hasattr(iterable, "__len__"):
            length = len(iterable)
        self.length = parse_optional_int(
            length, "length", minimum=1, expected="a positive int or None", type_error=DctDataError
        )
        self.iterable = iterable
        self.description = description or f"<{type(iterable).__name__}>"

    def where(self, index: int) -> str:
        return f"{self.description} sample {index}"

    def __iter__(self) -> Iterator[tuple[int, dict[str, np.ndarray], list[str]]]:
        try:
            it = iter(self.iterable)
        except TypeError as exc:
            raise TypeError(f"source: expected an iterable of samples. Got {type(self.iterable).__name__}") from exc
        for i, item in enumerate(it):
            sample, images = sample_dict(item, self.where(i))
            yield i, sample, images
