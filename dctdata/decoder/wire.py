"""The wire value of a `dct` field: what a packed dataset yields for it and `Decompress` takes. This
module is the one place that defines the wire forms.

- `decode="cpu"` (the default): a coefficient tensor (..., C, Hb, K, Wb), or the pair (coefficients,
  side) when the field's spec carries per-sample side information (side (..., C, 2) float32 = [range,
  mid] per channel; with corrections, `dctdata.decoder.corrections`, their rows follow: (..., C + 1 + cap, 2);
  with a lattice, `dctdata.codec.lattice`, C (step, origin) rows come last).
  A DataLoader collates the pair into a pair of batched tensors.
- `decode="device"`: the field's checked stored bytes. A sample is a `StoredSample`; a DataLoader
  collates a batch of them (`collate`, registered in torch's default collate map) into one `StoredBatch`:
  one contiguous uint8 buffer of the batch's streams, an int64 offsets table, each sample's row and its
  side values, and the `StreamForm` that says how the streams decode. The decompressor decodes the
  lossless stage on the batch's device (`dctdata.decoder.stored`), then dequantizes and inverts the DCT.
  Stored bytes carry their pack's identity and codec (`StreamForm.pack`, `StreamForm.codec`: a
  `PackCodec`), so a batch holding samples of several packs (a `ConcatDataset` or `ChainDataset` of packs,
  two packs paired) never decodes one pack's samples from another's bytes or with another's codec: it
  collates into a `MixedStoredBatch` (one `StoredBatch` per pack and each sample's place), and a layer
  decodes each part with its own pack's codec.

Either way the first layer takes the collated batch unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError


def split_wire(wire: object, spec: CodecSpec, name: str = "coeffs") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(coefficients, side or None) from a field's wire value, checking it has the spec's form. Runs on every
    decode call, so the usual case (a batch) compares ints only."""
    if spec.side is None:
        if not isinstance(wire, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor. Got {type(wire).__name__}")
        return wire, None
    if isinstance(wire, (tuple, list)) and len(wire) == 2:
        q, side = wire
        if isinstance(q, torch.Tensor) and isinstance(side, torch.Tensor):
            shape, q_shape = side.shape, q.shape
            lead = len(q_shape) - len(spec.coeff_shape)
            if len(shape) == 3 and lead == 1:
                if shape[0] == q_shape[0] and shape[1] == spec.side_rows and shape[2] == 2:
                    return q, side
            elif shape[-2:] == (spec.side_rows, 2) and shape[:-2] == q_shape[: max(0, lead)]:
                return q, side  # torch.Size compares equal to a tuple
            parts = [f"C={spec.channels}"]
            if spec.corrections is not None:
                parts.append(f"1 + {spec.corrections} correction rows")
            if spec.lattice is not None:
                parts.append("C lattice rows")
            rows = "" if len(parts) == 1 else " (" + " + ".join(parts) + ")"
            raise DctDataError(
                f"side: expected shape (..., {spec.side_rows}, 2){rows} matching coefficients {tuple(q.shape)}. "
                f"Got {tuple(side.shape)}"
            )
    raise TypeError(
        f"{name}: expected the pair (coefficients, side) of torch.Tensors the field yields (its spec has "
        f"per-sample side information). Got {type(wire).__name__}"
    )


# Stored bytes on the wire (`open_dataset(..., decode="device")`) ------------------------------------
DECODE_CHOICES = ("cpu", "device")


def parse_decode(value: object) -> str:
    """`decode=`: "cpu" (workers decode the lossless stage; coefficients cross) or "device" (workers check
    the stored bytes; they cross, and the decompressor decodes them where it runs)."""
    if not isinstance(value, str):
        raise TypeError(f"decode: expected 'cpu' or 'device'. Got {type(value).__name__}")
    if value not in DECODE_CHOICES:
        raise DctDataError(f"decode: expected one of {DECODE_CHOICES}. Got {value!r}")
    return value


def stage_key(lossless: Mapping[str, Any] | None) -> str:
    """A short name of a lossless stage config (its canonical JSON's sha256): a stored batch carries it so
    a decompressor built for another stage refuses it instead of decoding garbage."""
    text = json.dumps(dict(lossless or {}), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def codec_key(spec: CodecSpec | None, lossless: Mapping[str, Any] | None) -> str:
    """A short name of what decoding a dct field's stored bytes depends on (its codec spec, None for a field
    that is not dct, and lossless stage: the canonical JSON's sha256): equal keys decode the same bytes to the
    same values."""
    fields = None if spec is None else spec.to_dict()
    text = json.dumps(fields, sort_keys=True, separators=(",", ":")) + stage_key(lossless)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, eq=False)
class PackCodec:
    """What a dct field's stored bytes need to decode right, carried with them (`StreamForm.codec`): the
    identity of the pack they come from (`pack`: its manifest's seal, `dctdata.format.reader.pack_identity`),
    where it was read (`source`, for messages) and the field's codec (`spec`, `lossless`). Why: stream keys
    and field names are the same in every pack, so without it a batch of two packs' samples decoded one
    pack's samples from the other's bytes, or with the other's quantization steps."""

    pack: str
    source: str
    spec: CodecSpec | None  # None: a field that is not dct (its stored bytes go through the lossless stage only)
    lossless: Mapping[str, Any] | None

    @property
    def key(self) -> str:
        """`codec_key` of the field's codec (computed once)."""
        key = self.__dict__.get("_key")
        if key is None:
            key = codec_key(self.spec, self.lossless)
            object.__setattr__(self, "_key", key)
        return key

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_key"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def describe(self) -> str:
        """The pack as messages name it: where it was read and its identity."""
        return f"pack {self.source!r} ({self.pack[:19]})"


def describe_pack(form: StreamForm) -> str:
    """A stream form's pack as messages name it."""
    if form.codec is not None:
        return form.codec.describe()
    return "an unnamed pack" if form.pack is None else f"pack {form.pack[:19]}"


@dataclasses.dataclass(frozen=True)
class StreamForm:
    """How the stored streams of one dct field decode; the same for every stream of a batch.

    A stream goes through the field's lossless stage (`stage` names its config) to `decoded` bytes. A raw
    form (zarr chunks, the entropy coder's streams) decodes straight to `rows` samples of coefficients
    (rows, *shape) in `dtype` (`little` endian or not); otherwise (a webdataset `.npy` member) the decoded
    stream holds `expect`'s bytes at their offsets (.npy headers), the coefficients at byte `at` and, when
    `side_at` is set, the sample's (C, 2) little-endian float32 side values there (else they travel
    beside, in `StoredBatch.side`). `pack` is the identity of the pack the streams come from (None: a form made
    by hand) and `codec` its field's codec (`PackCodec`, not compared: `pack` names it): forms of two packs
    differ, so their samples never share a stream or a decoder."""

    field: str
    stage: str
    shape: tuple[int, ...]
    dtype: str
    rows: int = 1
    decoded: int = 0
    at: int = 0
    side_at: int | None = None
    expect: tuple[tuple[int, bytes], ...] = ()
    little: bool = True
    pack: str | None = None
    codec: PackCodec | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def sample_bytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def raw(self) -> bool:
        """True when a decoded stream is its coefficients and nothing else."""
        return (
            not self.at and self.side_at is None and not self.expect and self.decoded == self.rows * self.sample_bytes
        )


class StoredSample:
    """One sample of a dct field as a worker hands it over with `decode="device"`: the checked stored
    stream holding it (`key` names that stream: samples of one zarr chunk share it), its row in the
    decoded stream, the stream's form, the sample's index and its side values (or None)."""

    __slots__ = ("form", "index", "key", "row", "side", "stream")

    def __init__(
        self,
        stream: bytes | memoryview,
        key: Any,
        row: int,
        form: StreamForm,
        index: int,
        side: torch.Tensor | None = None,
    ) -> None:
        self.stream, self.key, self.row, self.form, self.index, self.side = stream, key, row, form, index, side

    def with_side(self, side: torch.Tensor | None) -> StoredSample:
        """This sample with its side values (None: they are in its stream, or it has none)."""
        if side is None:
            return self
        return StoredSample(self.stream, self.key, self.row, self.form, self.index, side)

    def __reduce__(self) -> tuple[type[StoredSample], tuple[Any, ...]]:
        # a memoryview into a fetched chunk does not pickle; its bytes do
        return StoredSample, (bytes(self.stream), self.key, self.row, self.form, self.index, self.side)

    def __repr__(self) -> str:
        return f"StoredSample(field={self.form.field!r}, index={self.index}, stream={len(self.stream)} bytes)"


@dataclasses.dataclass
class StoredBatch:
    """A batch of one dct field's stored bytes, as `decode="device"` collates it: the value
    `ds.decompressor(field)` takes unchanged, on any device.

    data: uint8 (total,), every distinct stream of the batch back to back (one contiguous, pinnable
    buffer); offsets: int64 (streams + 1,), stream k is data[offsets[k]:offsets[k+1]]; rows: int64 (N,),
    which decoded row is sample k (None: stream k is sample k); side: float32 (N, C, 2) per-sample (range,
    mid), or None; form: how the streams decode (`StreamForm`); indices: the samples' indices in the pack
    (for messages; they stay on the host). `pin_memory()` and `to(device, non_blocking=)` make it travel
    like a tensor (DataLoader's pin-memory thread, `DevicePrefetcher`); `nbytes` is what crosses."""

    data: torch.Tensor
    offsets: torch.Tensor
    rows: torch.Tensor | None
    side: torch.Tensor | None
    form: StreamForm
    indices: tuple[int, ...]

    @classmethod
    def empty(cls, form: StreamForm) -> StoredBatch:
        """A batch of no samples."""
        return cls(torch.zeros(0, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), None, None, form, ())

    def with_side(self, side: torch.Tensor | None) -> StoredBatch:
        """This batch with its side values (`dctdata.format.fields.with_side`)."""
        return self if side is None else dataclasses.replace(self, side=side)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def streams(self) -> int:
        return len(self.offsets) - 1

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors: the stored streams plus the offsets, rows and side values."""
        return sum(t.nbytes for t in (self.data, self.offsets, self.rows, self.side) if t is not None)

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> StoredBatch:
        """The same batch with `fn` applied to each of its tensors, except that the offsets table stays on the
        host (pinned by `pin_memory`, never moved to an accelerator): the decoders check it and plan their
        launches there, and copy it to their device themselves, so decoding a batch needs no read back from
        the device (a synchronization that would stop the host queueing the next batch's work)."""

        def opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        data = fn(self.data)
        offsets = fn(self.offsets) if data.device.type == "cpu" else self.offsets  # never copied off the host
        return StoredBatch(data, offsets, opt(self.rows), opt(self.side), self.form, self.indices)

    def pin_memory(self, device: object = None) -> StoredBatch:
        return self.apply(lambda t: t if t.is_pinned() else t.pin_memory())

    def is_pinned(self) -> bool:
        return self.data.is_pinned()

    def to(self, device: torch.device | str | int | None, non_blocking: bool = False) -> StoredBatch:
        return self.apply(lambda t: t.to(device, non_blocking=non_blocking))

    def __repr__(self) -> str:
        return (
            f"StoredBatch(field={self.form.field!r}, samples={len(self)}, streams={self.streams}, "
            f"bytes={self.data.numel()}, device={self.device})"
        )


@dataclasses.dataclass
class MixedStoredBatch:
    """A batch of one dct field's stored bytes from several packs (a `ConcatDataset` or `ChainDataset` of
    packs, groups merged by `DecodeAhead`): one `StoredBatch` per pack (`parts`), and for each part the places
    of its samples in the batch (`positions`: int64 tensors on the host). A `Decompress` layer decodes each part
    with its own pack's codec and puts the samples back in batch order; it travels like a `StoredBatch`."""

    parts: tuple[StoredBatch, ...]
    positions: tuple[torch.Tensor, ...]

    @property
    def field(self) -> str:
        return self.parts[0].form.field

    @property
    def indices(self) -> tuple[int, ...]:
        """The samples' indices in their packs, in batch order (for messages)."""
        out = [0] * len(self)
        for part, at in zip(self.parts, self.positions):
            for i, k in zip(part.indices, at.tolist()):
                out[k] = i
        return tuple(out)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def streams(self) -> int:
        return sum(p.streams for p in self.parts)

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts) + sum(t.nbytes for t in self.positions)

    def packs(self) -> str:
        """The packs of its parts, as messages name them."""
        return ", ".join(describe_pack(p.form) for p in self.parts)

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> MixedStoredBatch:
        """`StoredBatch.apply` on each part (the positions stay on the host)."""
        return MixedStoredBatch(tuple(p.apply(fn) for p in self.parts), self.positions)

    def pin_memory(self, device: object = None) -> MixedStoredBatch:
        return MixedStoredBatch(tuple(p.pin_memory() for p in self.parts), self.positions)

    def is_pinned(self) -> bool:
        return all(p.is_pinned() for p in self.parts)

    def to(self, device: torch.device | str | int | None, non_blocking: bool = False) -> MixedStoredBatch:
        return MixedStoredBatch(tuple(p.to(device, non_blocking) for p in self.parts), self.positions)

    def __repr__(self) -> str:
        return (
            f"MixedStoredBatch(field={self.field!r}, samples={len(self)}, packs={len(self.parts)}, "
            f"streams={self.streams}, bytes={sum(p.data.numel() for p in self.parts)}, device={self.device})"
        )


STORED_TYPES = (StoredBatch, MixedStoredBatch)  # what decode="device" collates a dct field's samples into


def _collate_one(samples: Sequence[StoredSample]) -> StoredBatch:
    """Samples of one form (one pack's field) as one `StoredBatch` (see `collate_stored`)."""
    form = samples[0].form
    if any((s.side is None) != (samples[0].side is None) for s in samples):
        raise DctDataError(f"field {form.field!r}: stored samples: expected side values for all or none")
    position: dict[Any, int] = {}
    streams: list[bytes | memoryview] = []
    rows: list[int] = []
    for s in samples:
        k = position.get(s.key)
        if k is None:
            k = position[s.key] = len(streams)
            streams.append(s.stream)
        rows.append(k * form.rows + s.row)
    sizes = np.fromiter((len(b) for b in streams), np.int64, len(streams))
    offsets = np.zeros(len(streams) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
    flat = data.numpy()
    for b, a, n in zip(streams, offsets[:-1].tolist(), sizes.tolist()):
        flat[a : a + n] = np.frombuffer(b, np.uint8)
    # stream k is sample k only when every decoded row is one of the batch's samples, in order (a zarr chunk
    # of 8 holding a batch's first 5 samples decodes to 8 rows: they must be picked)
    same = len(streams) * form.rows == len(rows) and rows == list(range(len(rows)))
    side = None if samples[0].side is None else torch.stack([s.side for s in samples if s.side is not None])
    return StoredBatch(
        data,
        torch.from_numpy(offsets),
        None if same else torch.tensor(rows, dtype=torch.int64),
        side,
        form,
        tuple(int(s.index) for s in samples),
    )


def _merge_one(batches: Sequence[StoredBatch]) -> StoredBatch:
    """Batches of one form as one batch, their samples in order (see `merge_stored`)."""
    form = batches[0].form
    if any((b.side is None) != (batches[0].side is None) for b in batches):
        raise DctDataError(f"field {form.field!r}: stored batches: expected side values for all or none")
    if len(batches) == 1:
        return batches[0]
    offsets, rows, base, streams = [], [], 0, 0
    picked = any(b.rows is not None for b in batches)  # then every batch's samples get their row
    for b in batches:
        offsets.append(b.offsets[:-1].cpu() + base)
        base += int(b.data.numel())
        if picked:
            own = b.rows if b.rows is not None else torch.arange(len(b), device=b.data.device)
            rows.append(own.to(b.data.device) + streams * form.rows)
        streams += b.streams
    offsets.append(torch.tensor([base], dtype=torch.int64))
    side = None if batches[0].side is None else torch.cat([b.side for b in batches if b.side is not None])
    merged = StoredBatch(
        torch.cat([b.data for b in batches]),
        torch.cat(offsets),
        torch.cat(rows) if rows else None,
        side,
        form,
        tuple(i for b in batches for i in b.indices),
    )
    return merged


def collate_stored(samples: Sequence[StoredSample]) -> StoredBatch | MixedStoredBatch:
    """The samples of a batch as one `StoredBatch`: each distinct stream once in one buffer (a zarr chunk
    holding several of the batch's samples crosses once), its offsets, each sample's row and side. Samples
    of several packs (one field) give a `MixedStoredBatch`: one such batch per pack, so no sample is read
    from another pack's stream (stream keys are the same in every pack)."""
    if not samples:
        raise DctDataError("stored samples: expected at least one to collate. Got none")
    first = samples[0].form
    if all(s.form is first or s.form == first for s in samples):  # one pack's: the usual case, no grouping
        return _collate_one(samples)
    groups: dict[StreamForm, list[int]] = {}
    for k, s in enumerate(samples):
        groups.setdefault(s.form, []).append(k)
    if len(groups) == 1:
        return _collate_one(samples)
    _check_packs(list(groups), "samples")
    parts = tuple(_collate_one([samples[k] for k in ks]) for ks in groups.values())
    return MixedStoredBatch(parts, tuple(torch.tensor(ks, dtype=torch.int64) for ks in groups.values()))


def _check_packs(forms: Sequence[StreamForm], what: str) -> None:
    """Refuse forms that may not sit in one batch: of several fields, or two forms of one pack."""
    fields = sorted({f.field for f in forms})
    if len(fields) > 1:
        raise DctDataError(
            f"stored {what}: expected one field's {what} of one form per pack. Got fields {fields} mixed"
        )
    seen: dict[Any, StreamForm] = {}
    for f in forms:
        if f.pack in seen:
            raise DctDataError(
                f"stored {what}: expected one field's {what} of one form per pack. Got two forms of field "
                f"{f.field!r} of {describe_pack(f)}: {seen[f.pack]} and {f}"
            )
        seen[f.pack] = f


def merge_stored(batches: Sequence[StoredBatch | MixedStoredBatch]) -> tuple[StoredBatch | MixedStoredBatch, list[int]]:
    """Several batches of one field's stored bytes as one batch (its samples in order) and the sample count of
    each: what lets a device decoder take a group of loader batches in one launch (`DecodeAhead`). The data are
    concatenated on their device, the offsets on the host. Batches of several packs merge pack by pack into a
    `MixedStoredBatch` (each sample keeps its pack's bytes and codec)."""
    if not batches:
        raise DctDataError("stored batches: expected at least one to merge. Got none")
    for b in batches:
        if not isinstance(b, STORED_TYPES):
            raise TypeError(f"stored batches: expected dctdata.decoder.wire.StoredBatch. Got {type(b).__name__}")
    counts = [len(b) for b in batches]
    if len(batches) == 1:
        return batches[0], counts
    groups: dict[StreamForm, tuple[list[StoredBatch], list[torch.Tensor]]] = {}
    base = 0
    for b in batches:
        parts = b.parts if isinstance(b, MixedStoredBatch) else (b,)
        places = b.positions if isinstance(b, MixedStoredBatch) else (torch.arange(len(b)),)
        for part, at in zip(parts, places):
            got = groups.setdefault(part.form, ([], []))
            got[0].append(part)
            got[1].append(at + base)
        base += len(b)
    if len(groups) == 1:
        return _merge_one(next(iter(groups.values()))[0]), counts
    _check_packs(list(groups), "batches")
    parts = tuple(_merge_one(ps) for ps, _ in groups.values())
    return MixedStoredBatch(parts, tuple(torch.cat(at) for _, at in groups.values())), counts


def _collate_stored_fn(
    batch: Sequence[StoredSample], *, collate_fn_map: dict[Any, Any] | None = None
) -> StoredBatch | MixedStoredBatch:
    return collate_stored(batch)


def _collate_map() -> dict[Any, Any]:
    from torch.utils.data._utils.collate import default_collate_fn_map

    return default_collate_fn_map


def collate(batch: Sequence[Any]) -> Any:
    """torch's `default_collate` that also collates `StoredSample`s into a `StoredBatch`: the collate_fn
    `make_loader` uses (a plain DataLoader gets the same from importing dctdata.decoder.wire, which registers it
    in torch's default collate map; pass `collate_fn=dctdata.decoder.wire.collate` to be explicit)."""
    from torch.utils.data._utils.collate import collate as _collate

    return _collate(batch, collate_fn_map={**_collate_map(), StoredSample: _collate_stored_fn})


try:  # a plain DataLoader collates stored samples too
    _collate_map().setdefault(StoredSample, _collate_stored_fn)
except ImportError:  # pragma: no cover - a torch without the collate map: pass collate_fn=collate
    pass
