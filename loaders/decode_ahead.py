"""Decode several loader batches per call of a batched device decoder, one group ahead of the consumer.

Why: a GPU decoder whose calls have a fixed cost (nvCOMP's zstd: milliseconds per call whatever its size,
issue 28) caps a loader at (batch size / fixed cost) samples per second when it decodes each batch on its
own. `DecodeAhead` hands it `group` batches at a time, and queues the next group's call before the current
group's batches are handed out, so the device decodes group g+1 while the model consumes group g. The
price: `group` batches of decoded samples held at once, and the loader read `group` batches ahead.

The decoder is any object with
- `start(batches: list, first: int) -> pending`: queue one decode of `batches` (numbered from `first` in
  error messages) and return at once;
- `finish(pending) -> list`: wait for it, check it (raise naming the batch and sample), and return one
  result per batch, in order.
`dctdata.nvcomp_zstd.ZstdBatches` is one (zstd streams -> sample tensors on the GPU).

Typical use, with batches of stored streams already on the device (`DevicePrefetcher`)::

    decoder = ZstdBatches(spec.coeff_shape, spec.torch_dtype)
    for coeffs in DecodeAhead(DevicePrefetcher(loader, "cuda"), decoder, group=8):
        images = layer(coeffs)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from dctdata.errors import DctDataError
from dctdata.parse import is_int

__all__ = ["DecodeAhead"]


class DecodeAhead:
    """Iterate `batches` decoded by `decoder`, `group` batches per decoder call, the next call queued before the
    current group is handed out. len() is the batches' (when they have one); each `iter()` is a new pass."""

    def __init__(self, batches: Iterable, decoder: Any, group: int = 8) -> None:
        if not isinstance(batches, Iterable):
            raise TypeError(f"batches: expected an iterable such as a DataLoader. Got {type(batches).__name__}")
        if not (callable(getattr(decoder, "start", None)) and callable(getattr(decoder, "finish", None))):
            raise TypeError(
                f"decoder: expected an object with start(batches, first) and finish(pending), such as "
                f"dctdata.nvcomp_zstd.ZstdBatches. Got {type(decoder).__name__}"
            )
        if not is_int(group) or group < 1:
            raise DctDataError(f"group: expected a positive int (batches per decoder call). Got {group!r}")
        self.batches = batches
        self.decoder = decoder
        self.group = int(group)

    def __len__(self) -> int:
        try:
            return len(self.batches)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"len(DecodeAhead): expected batches with a length. Got {type(self.batches).__name__} without __len__"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.batches)
        current = self._start(source, 0)
        while current is not None:
            pending, first, count = current
            following = self._start(source, first + count)  # queued before this group is handed out
            results = list(self.decoder.finish(pending))
            if len(results) != count:
                raise DctDataError(
                    f"decoder: expected one result per batch ({count} for batches {first}..{first + count - 1}). "
                    f"Got {len(results)}"
                )
            yield from results
            current = following

    def _start(self, source: Iterator, first: int) -> tuple[Any, int, int] | None:
        """(pending decode, number of its first batch, batches in it) of the next group; None at the end."""
        chunk = list(islice(source, self.group))
        if not chunk:
            return None
        return self.decoder.start(chunk, first), first, len(chunk)

    def __repr__(self) -> str:
        return f"DecodeAhead(decoder={type(self.decoder).__name__}, group={self.group})"
