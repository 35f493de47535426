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
`DecompressBatches` is the one for `open_dataset(..., decode="device")` loaders: the group's stored bytes
merged into one launch of the lossless stage's device decoder (the entropy coder's kernel, nvCOMP's zstd),
then `Decompress`, on a side stream; each batch comes back with its stored fields replaced by the decoded
arrays. A `Decompress` layer (or a dict of them by field, or a list of them by position) given as the decoder
is wrapped in one. A window dataset's `ds.decompressor()` (`WindowDecompress`) is a group decoder itself:
the group's distinct frames decoded in one `DecompressBatches` call, then each batch's windows gathered.
Stored bytes carry their pack's codec: a batch holding several packs' samples, or two packs
paired (`StackDataset(noisy, clean)`: both fields named "image"), decodes each pack with its own codec.
`dctdata.stages.nvcomp_zstd.ZstdBatches` is a lower-level one (zstd streams -> sample tensors on the GPU).

Typical use, with batches of stored streams already on the device (`DevicePrefetcher`)::

    ds = dctdata.open_dataset(path, decode="device")
    loader = make_loader(ds, 32, num_workers=8, pin_memory=True)
    for batch in DecodeAhead(DevicePrefetcher(loader, "cuda"), ds.decompressor().cuda(), group=8):
        images = batch["image"]  # (32, C, H, W) float32 on the GPU
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, NamedTuple

import torch
from torch import nn

from dctdata.decoder.wire import STORED_TYPES, MixedStoredBatch, StoredBatch, merge_stored
from dctdata.errors import DctDataError
from dctdata.loaders.device import map_leaves
from dctdata.parse import is_int

__all__ = ["DecodeAhead", "DecompressBatches"]


class DecodeAhead:
    """Iterate `batches` decoded by `decoder`, `group` batches per decoder call, the next call queued before the
    current group is handed out. len() is the batches' (when they have one); each `iter()` is a new pass."""

    def __init__(self, batches: Iterable, decoder: Any, group: int = 8) -> None:
        if not isinstance(batches, Iterable):
            raise TypeError(f"batches: expected an iterable such as a DataLoader. Got {type(batches).__name__}")
        group_decoder = callable(getattr(decoder, "start", None)) and callable(getattr(decoder, "finish", None))
        if not group_decoder and (
            isinstance(decoder, nn.Module)
            or (isinstance(decoder, Mapping) and decoder and all(isinstance(v, nn.Module) for v in decoder.values()))
            or (isinstance(decoder, (list, tuple)) and decoder and all(isinstance(v, nn.Module) for v in decoder))
        ):
            decoder = DecompressBatches(decoder)
        if not (callable(getattr(decoder, "start", None)) and callable(getattr(decoder, "finish", None))):
            raise TypeError(
                f"decoder: expected a Decompress layer (ds.decompressor()), a dict of them by field, a list of them by "
                f"position, or an object with start(batches, first) and finish(pending). Got {type(decoder).__name__}"
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


class _Group(NamedTuple):
    batches: list
    decoded: list  # per stored field position: the decoded samples of each batch
    whole: list  # per stored field position: the group's decoded tensor (what `decoded` splits)
    checks: list
    done: Any  # the CUDA event after the group's work on the side stream, or None off CUDA


def _is_layer(obj) -> bool:
    """What a group's decode calls on a layer: `Decompress`'s deferred decode of stored bytes."""
    return callable(getattr(obj, "forward_stored_deferred", None))


class DecompressBatches:
    """The group decoder of `DecodeAhead` for `decode="device"` loaders: each batch's `StoredBatch` fields
    (the j-th of every batch together) merged into one batch, decoded by the layer in one launch of its stage's
    device decoder and one `Decompress` call, and handed back batch by batch with those fields replaced by the
    decoded arrays (other fields unchanged). `layers`: a `Decompress` (every stored field is its field), a
    dict field -> `Decompress`, or a list of them, one per stored value of a batch in traversal order (two
    packs paired: `[noisy.decompressor(), clean.decompressor()]`). The bytes carry their pack's codec, so each
    pack decodes with its own whatever layer is given (a layer of another codec decodes them with theirs, with
    its own settings: output dtype, normalization); the layer chosen sets those settings. `timed=True` records
    each group's decode time in `timings` (for benchmarks): on CUDA a (start, end) pair of events around its
    work on the side stream (read them once the device is synchronized), elsewhere the milliseconds `start`
    took.

    Why: a loader batch of 32 small samples keeps a GPU decoder's launch mostly idle (the entropy kernel's
    work per launch is a few segments a sample) and reading each batch's status back waits for it; a group
    of batches fills the device in one launch and is checked once. On CUDA the work runs on a side stream
    after what the current stream has queued (the batches' copies); `finish` waits for it, raises the first
    refused sample's IntegrityError, and makes the current stream wait for the results."""

    def __init__(self, layers: nn.Module | Mapping[str, nn.Module], timed: bool = False) -> None:
        if isinstance(layers, Mapping):
            bad = [k for k, v in layers.items() if not _is_layer(v)]
            if not layers or bad:
                raise TypeError(f"layers: expected Decompress layers by field name. Got {bad or 'none'}")
            self.layers = dict(layers)
        elif isinstance(layers, (list, tuple)):
            bad = [k for k, v in enumerate(layers) if not _is_layer(v)]
            if not layers or bad:
                raise TypeError(f"layers: expected Decompress layers by position. Got {bad or 'none'} that are not")
            self.layers = list(layers)
        elif _is_layer(layers):
            self.layers = layers
        else:
            raise TypeError(f"layers: expected a Decompress layer (ds.decompressor()). Got {type(layers).__name__}")
        self._side: dict = {}
        self.timed = bool(timed)
        self.timings: list = []

    def _layer(self, field: str, j: int) -> nn.Module:
        """The layer of a batch's j-th stored value, of field `field`."""
        if isinstance(self.layers, list):
            if j >= len(self.layers):
                raise DctDataError(
                    f"stored value {j} (field {field!r}): expected a decompressor for it in layers. Got "
                    f"{len(self.layers)} layers for positions 0..{len(self.layers) - 1}"
                )
            return self.layers[j]
        if not isinstance(self.layers, dict):
            return self.layers
        layer = self.layers.get(field)
        if layer is None:
            raise DctDataError(f"field {field!r}: expected a decompressor for it in layers. Got {sorted(self.layers)}")
        return layer

    def start(self, batches: list, first: int = 0) -> _Group:
        """Queue the decode of `batches` (numbered from `first`)."""
        stored = [_stored(b) for b in batches]
        width = len(stored[0])
        if any(len(s) != width for s in stored):
            raise DctDataError(
                f"batches {first}..{first + len(batches) - 1}: expected the same stored fields in each. Got "
                f"{[len(s) for s in stored]} StoredBatch values"
            )
        if width == 0:
            return _Group(batches, [], [], [], None)
        device = stored[0][0].device
        side = None
        if device.type == "cuda":
            side = self._side.get(device)
            if side is None:
                side = self._side[device] = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))  # the batches' copies are there
            for s in stored:
                for b in s:
                    for part in b.parts if isinstance(b, MixedStoredBatch) else (b,):
                        for t in (part.data, part.rows, part.side):
                            if t is not None and t.device.type == "cuda":
                                t.record_stream(side)  # allocated on another stream, read on the side one
        decoded, whole, checks = [], [], []
        began = time.perf_counter()
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            if side is not None and self.timed:
                self.timings.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                self.timings[-1][0].record(side)
            for j in range(width):
                merged, counts = merge_stored([s[j] for s in stored])
                layer = self._layer(merged.field if isinstance(merged, MixedStoredBatch) else merged.form.field, j)
                img, more = layer.forward_stored_deferred(merged)  # each pack's samples with its own codec
                whole.append(img)
                decoded.append(torch.split(whole[-1], counts))
                checks += more
            done = None
            if side is not None:
                if self.timed:
                    self.timings[-1][1].record(side)
                done = torch.cuda.Event()
                done.record(side)
            elif self.timed:
                self.timings.append(1e3 * (time.perf_counter() - began))
        return _Group(batches, decoded, whole, checks, done)

    def finish(self, group: _Group) -> list:
        """The group's batches with their stored fields decoded (waits for the decode and checks it)."""
        if group.done is not None:
            group.done.synchronize()
        for check in group.checks:
            check()
        if group.done is not None:
            current = torch.cuda.current_stream(group.whole[0].device)
            current.wait_event(group.done)
            for t in group.whole:
                t.record_stream(current)  # allocated on the side stream, used on the current one
        return [_replace_stored(batch, iter([d[i] for d in group.decoded])) for i, batch in enumerate(group.batches)]

    def __repr__(self) -> str:
        fields = sorted(self.layers) if isinstance(self.layers, dict) else "all"
        if isinstance(self.layers, list):
            fields = f"{len(self.layers)} by position"
        return f"DecompressBatches(fields={fields})"


def _stored(batch: Any) -> list[StoredBatch | MixedStoredBatch]:
    """The StoredBatch values of a batch (MixedStoredBatch ones too), in traversal order."""
    found: list[StoredBatch | MixedStoredBatch] = []
    map_leaves(batch, lambda v: found.append(v) if isinstance(v, STORED_TYPES) else None)
    return found


def _replace_stored(batch: Any, values: Iterator) -> Any:
    """The batch with its StoredBatch values replaced, in traversal order, by `values`."""
    return map_leaves(batch, lambda v: next(values) if isinstance(v, STORED_TYPES) else v)
