"""`Decompress`: the model's first layer. Dequantize + inverse DCT + crop (+ per-sample scale, channel
rotation, normalization), as matmuls.

It takes a field's value exactly as a DataLoader collates it: the coefficient batch (B, C, Hb, K, Wb)
in the wire dtype (integer or float), or the pair (coefficients, side) when the spec carries
per-sample side information (side (B, C, 2) = [range, mid]), or, from `open_dataset(...,
decode="device")`, the field's stored bytes as one `dctdata.decoder.wire.StoredBatch`, whose lossless stage it
decodes first on the batch's device (`decode_stored`; the layer then needs the field's stage: `lossless=`,
which `from_manifest` and `ds.decompressor()` pass). It returns (B, C, H, W) in `dtype` on the input's
device. Stored bytes carry their pack's codec (`dctdata.decoder.wire.PackCodec`): bytes of another pack (a
`ConcatDataset` of packs, a noisy and a clean pack paired) are decoded with that pack's codec (its layer,
built once with this layer's settings), never with this layer's steps; a `MixedStoredBatch` (samples of
several packs) part by part, its samples put back in batch order.

Two paths, both only matmul/reshape/transpose/cat-class ops plus a few elementwise ones (so they
export to ONNX):
- v1 specs (no recon, rotation or side): steps, offsets and normalization are folded into the
  weights it holds (non-persistent buffers, so model checkpoints do not depend on them), so decoding
  is one pass: two small matmuls per block.
- v2 specs: one affine pass over the coefficient tensor (K/64 of the output or smaller):
  coef = q * S + O - sign(q) * D (dequantization with the dead zone's reconstruction offsets D), the
  C x C inverse rotation as one small matmul over the channel axis, the per-sample (range, mid) and
  normalization as one multiply-add on the coefficients (a constant moves the DC term: an orthonormal
  8x8 DC basis function is 1/8 everywhere), then the same two synthesis matmuls with unit weights.

Which kernel decodes a batch is chosen in one place, `dctdata.decoder.kernels` (the functional decode
and the volume layer use it too). On CUDA tensors in eager mode both run through the fused Triton kernel
(`dctdata.decoder.fused_cuda`: the same steps in one pass, any float output dtype) where Triton is
installed. On plain CPU tensors in eager mode both run through the fused C kernel
(`dctdata.decoder.fused`: dequantization, rotation, side, normalization and the inverse DCT in one pass, float32
output), or where it does not apply (float64, other output dtypes, the extension off) through
`transform.synthesize_chunked` with one thread (a few block rows at a time, the affine pass included,
intermediates in cache) and the portable graph with more; `layer(q, out=buf)` writes into a reused
buffer, which saves the page faults of a fresh output (several times the decode itself on outputs of
tens of MB).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeGuard

import torch
from torch import nn

import dctdata.decoder.corrections as corrections
import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda
import dctdata.decoder.kernels as kernels
from dctdata.codec import lattice, transform3d
from dctdata.codec.spec import CodecSpec, dequant_tables
from dctdata.codec.transform import BLOCK, _dct_matrix_f64, augment_bias, fold_basis, fold_shift, synthesize
from dctdata.decoder.stored import decode_batch_deferred
from dctdata.decoder.wire import MixedStoredBatch, StoredBatch, describe_pack, split_wire, stage_key
from dctdata.errors import DctDataError
from dctdata.kinds import FieldKind
from dctdata.stages import parse_config

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Coefficient dtypes the layer takes: the wire dtypes a spec names, and float64 (exact values, float64
# math). Others are refused: uint8 holds int8 wire values wrapped (-1 reads as 255) and decodes wrong.
_IN_DTYPES = (torch.int8, torch.int16, torch.float16, torch.bfloat16, torch.float32, torch.float64)


# (checks, indices): where a deferred decode queues its checks, and the samples' indices in their pack (None:
# messages count within the batch)
Deferred: TypeAlias = tuple[list[Callable[[], None]], Sequence[int] | None]


class _Field(Protocol):
    """What `Decompress.from_manifest` reads of a manifest's field (a `dctdata.format.FieldSpec`: the format
    sits above the decoder, which does not import it)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> FieldKind: ...
    @property
    def codec(self) -> CodecSpec | None: ...
    @property
    def lossless(self) -> Mapping[str, Any]: ...


class _Manifest(Protocol):
    """What `Decompress.from_manifest` reads of a manifest (a `dctdata.format.Manifest`)."""

    def coded_field(self, name: str | None = None) -> _Field: ...


def _result(img: torch.Tensor, out: torch.Tensor | None, unbatched: bool) -> torch.Tensor:
    """What forward returns: `out` when the caller gave one, else the image without the batch axis it was lent."""
    if out is not None:
        return out
    return img.squeeze(0) if unbatched else img


class Decompress(nn.Module):
    """Coefficients -> images. `normalize=False` ignores the spec's mean/std. A volume spec (`spec.depth`) gets
    the subclass `dctdata.decoder.volume.VolumeDecompress`.

    Args:
        spec: The `CodecSpec` of the field (`ds.decompressor()` builds the layer from the pack's).
        dtype: The output dtype (float32, float16, bfloat16 or float64); None (the default): the field's decode
            dtype, float64 for a float64 source's bounded field (`CodecSpec.precision`), else float32.
        normalize: Apply the spec's mean/std after decoding (False ignores them).
        lossless: The field's lossless stage (its manifest entry), to finish `StoredBatch` inputs
            (`decode="device"`).

    Raises:
        TypeError: `spec` is not a CodecSpec or `dtype` is not a supported output dtype.
    """

    _AXES = "C, Hb, K, Wb"  # a sample's coefficient axes, for the shape error
    # the buffers (registered in __init__, not module state); those of the v2 affine pass exist for v2 specs only
    weight: torch.Tensor
    trows: torch.Tensor
    coef_shift: torch.Tensor | None
    scale: torch.Tensor
    shift: torch.Tensor
    recon: torch.Tensor | None
    rotation_t: torch.Tensor | None
    out_scale: torch.Tensor
    out_shift: torch.Tensor
    dc_gain: torch.Tensor

    def __new__(cls, spec: object = None, *args: Any, **kwargs: Any) -> Decompress:
        kind: type[Decompress] = cls
        if cls is Decompress and isinstance(spec, CodecSpec) and spec.depth is not None:
            kind = VolumeDecompress  # defined below (dctdata.decoder.volume re-exports it)
        return super().__new__(kind)

    def __init__(
        self,
        spec: CodecSpec,
        dtype: torch.dtype | None = None,
        normalize: bool = True,
        lossless: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        compute = self._settings(spec, dtype, normalize, lossless)
        mean = spec.mean if normalize else None
        std = spec.std if normalize else None
        self.folded = spec.recon is None and spec.rotation is None and spec.side is None
        if self.folded:
            wcol, zbias, trows = fold_basis(spec.cf, spec.mask, spec.channels, spec.steps, spec.offsets, mean, std)
            self.bias_row = zbias is not None
            self.register_buffer("weight", augment_bias(wcol, zbias).to(compute), persistent=False)
            shift = fold_shift((spec.channels, spec.kept), spec.steps, spec.offsets, mean)
            self.register_buffer("coef_shift", None if shift is None else shift.to(compute), persistent=False)
        else:
            wcol, _, trows = fold_basis(spec.cf, spec.mask, spec.channels)
            self.bias_row = False
            self.register_buffer("weight", wcol.to(compute), persistent=False)
            self._affine_buffers(compute, math.sqrt(BLOCK * BLOCK))  # DC basis 1/8 everywhere: a constant b is 8 b
        self.register_buffer("trows", trows.to(compute), persistent=False)
        self._fused_tables: fused.Tables | None = None  # `fused.tables_for(spec)`, built on the first fused decode
        # device -> `fused_cuda.DeviceTables`, built on its first fused CUDA decode
        self._device_tables: dict[torch.device, fused_cuda.DeviceTables] = {}

    def _settings(
        self, spec: object, dtype: torch.dtype | None, normalize: bool, lossless: Mapping[str, Any] | None
    ) -> torch.dtype:
        """The arguments both layers check and keep; returns the compute dtype."""
        if not isinstance(spec, CodecSpec):
            raise TypeError(f"spec: expected a dctdata.CodecSpec. Got {type(spec).__name__}")
        self._check_spec(spec)
        if dtype is None:
            dtype = spec.decode_dtype
        if dtype not in _OUT_DTYPES:
            raise TypeError(f"dtype: expected one of {_OUT_DTYPES}. Got {dtype!r}")
        self.spec, self.dtype, self.normalize = spec, dtype, normalize
        # the field's lossless stage, to finish a `StoredBatch` (open_dataset(..., decode="device")); None: unknown
        self.lossless = None if lossless is None else parse_config(lossless, "lossless")
        # a float64 decode (`CodecSpec.precision`) computes in float64 whatever the output dtype, then rounds
        return torch.float64 if torch.float64 in (dtype, spec.decode_dtype) else torch.float32

    def _check_spec(self, spec: CodecSpec) -> None:
        """The 2-D layer takes any spec (`__new__` routes volume specs to VolumeDecompress)."""

    def _affine_buffers(self, compute: torch.dtype, dc_value: float) -> None:
        """The buffers of the v2 affine pass (`_coefficients`), shared by both layers; `dc_value`: what a
        constant 1 is on the DC plane (8 for 8x8 blocks, sqrt(512) for 8x8x8)."""
        spec = self.spec
        c, k = spec.channels, spec.kept
        t = dequant_tables(spec, self.normalize)

        def per_k(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(1, c, 1, k, 1).to(compute)

        self.register_buffer("scale", per_k(t.steps), persistent=False)
        self.register_buffer("shift", per_k(t.offsets), persistent=False)
        self.register_buffer("recon", None if t.recon is None else per_k(t.recon * t.steps), persistent=False)
        rot_t = t.rotation_t
        self.register_buffer("rotation_t", None if rot_t is None else rot_t.to(compute), persistent=False)
        # per output channel: x_out = a * x + b (normalization); per sample it is composed with (range, mid)
        a, b = t.inv_std, -t.mean * t.inv_std
        self.register_buffer("out_scale", a.reshape(1, c, 1, 1, 1).to(compute), persistent=False)
        self.register_buffer("out_shift", b.reshape(1, c, 1, 1, 1).to(compute), persistent=False)
        dc = torch.zeros(1, 1, 1, k, 1, dtype=torch.float64)
        dc[..., 0, :] = dc_value  # frequency 0 is plane 0 of every mask
        self.register_buffer("dc_gain", dc.to(compute), persistent=False)

    @classmethod
    def from_manifest(cls, manifest: _Manifest, field: str | None = None, **kwargs: Any) -> Decompress:
        """The layer for a packed dataset's dct field (the only one when `field` is None)."""
        f = manifest.coded_field(field)
        if f.codec is None:  # only a coded (dct) field has one
            raise DctDataError(f"field {f.name!r}: expected a dct field for decompressor(). Got kind {f.kind!r}")
        return cls(f.codec, **{"lossless": f.lossless, **kwargs})

    def forward(self, coeffs: object, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode; `out` (the output's shape, `dtype` and device) receives the result and is returned, so a
        loop can reuse one buffer instead of paying for fresh pages on every batch."""
        if self._other_packs(coeffs):
            return self._decode_packs(coeffs, out, None)
        return self._decode(coeffs, out, None)

    def _other_packs(self, coeffs: object) -> TypeGuard[StoredBatch | MixedStoredBatch]:
        """True for stored bytes this layer's own codec does not decode: a batch of several packs, or of
        another pack whose codec differs from this layer's."""
        if isinstance(coeffs, MixedStoredBatch):
            return True
        return isinstance(coeffs, StoredBatch) and self._layer_for(coeffs) is not self

    def _layer_for(self, part: StoredBatch) -> Decompress:
        """The layer that decodes a stored batch of one pack: this one when the bytes carry its codec (or none:
        a batch made by hand), else their pack's layer with this layer's settings, built once per codec (kept
        outside the module's children: not in its state_dict, moved to the batch's device when used)."""
        codec = part.form.codec
        if codec is None or codec.spec is self.spec:
            return self
        if codec.spec is None:
            raise TypeError(
                f"coeffs: stored bytes of field {part.form.field!r} of {describe_pack(part.form)}, which is not a "
                "dct field: expected a dct field's stored bytes"
            )
        if codec.spec == self.spec and (self.lossless is None or _same_stage(codec.lossless, self.lossless)):
            return self
        others: dict[str, Decompress] = self.__dict__.setdefault("_packs", {})
        layer = others.get(codec.key)
        if layer is None:
            layer = others[codec.key] = Decompress(
                codec.spec, dtype=self.dtype, normalize=self.normalize, lossless=codec.lossless
            )
        return layer.to(part.device)

    def _decode_packs(
        self, coeffs: StoredBatch | MixedStoredBatch, out: torch.Tensor | None, deferred: Deferred | None
    ) -> torch.Tensor:
        """Decode a stored batch of other packs (`_other_packs`): each part through its own pack's layer, the
        samples written back in batch order. Parts whose samples decode to different shapes are refused, naming
        both packs (their samples cannot share one output)."""
        if isinstance(coeffs, StoredBatch):
            return self._decode_part(self._layer_for(coeffs), coeffs, out, deferred)
        layers = [self._layer_for(p) for p in coeffs.parts]
        shapes = [tuple(layer.spec.sample_shape) for layer in layers]
        if len(set(shapes)) > 1:
            k = next(i for i, sh in enumerate(shapes) if sh != shapes[0])
            raise DctDataError(
                f"field {coeffs.field!r}: a stored batch mixing {describe_pack(coeffs.parts[0].form)} (samples "
                f"{shapes[0]}) and {describe_pack(coeffs.parts[k].form)} (samples {shapes[k]}): expected one sample "
                "shape to decode into one batch. Batch each pack on its own"
            )
        device = coeffs.device
        if out is not None:
            self._check_out(out, (len(coeffs), *shapes[0]), device)
            result = out
        else:
            result = torch.empty((len(coeffs), *shapes[0]), dtype=self.dtype, device=device)
        for layer, part, at in zip(layers, coeffs.parts, coeffs.positions):
            img = self._decode_part(layer, part, None, deferred)
            result.index_copy_(0, at.to(device), img.to(self.dtype))
        return result

    @staticmethod
    def _decode_part(
        layer: Decompress, part: StoredBatch, out: torch.Tensor | None, deferred: Deferred | None
    ) -> torch.Tensor:
        """One pack's stored batch through its layer: at once, or with its checks queued on `deferred` (the
        lossless stage's too, so that nothing is read back from the device before they run)."""
        if deferred is None:
            return layer._decode(part, out, None)
        img, checks = layer.forward_stored_deferred(part)
        deferred[0].extend(checks)
        return img if out is None else out.copy_(img)

    def _decode(self, coeffs: object, out: torch.Tensor | None, deferred: Deferred | None) -> torch.Tensor:
        """`forward`'s work; `deferred`: None (the correction rows are checked at once), or (checks, indices)
        to queue their check on (`forward_deferred`)."""
        spec = self.spec
        indices = getattr(coeffs, "indices", None)  # a stored batch's samples in the pack, for messages
        y, side, target, unbatched = self._wire_batch(coeffs, out)
        side, fix, grid = self._split_side(side)
        size = (spec.height, spec.width)
        dtype, rounded = self._work_dtype(fix, grid)
        final: torch.Tensor | None = None  # `out` (batched), when the work dtype is rounded into it at the end
        if rounded:  # corrections and the snap in the work dtype, then rounded into `out` (if given)
            final, target = target, None
        img = kernels.decode(self, y, dtype, spec.cf, spec.mask, size, target, side)
        if fix is not None:
            img = self._correct(img if target is None else target, fix, indices, deferred)
        if grid is not None:
            img = self._snap(img if target is None else target, grid, target, indices, deferred)
        if dtype != self.dtype:
            img = img.to(self.dtype) if final is None else final.copy_(img)
        return _result(img, out, unbatched)

    def _work_dtype(self, fix: torch.Tensor | None, grid: torch.Tensor | None) -> tuple[torch.dtype, bool]:
        """(the dtype the decode, its corrections and its snap compute in, whether it is not the output dtype). A
        float64 decode (`CodecSpec.precision`) runs in float64 for any output dtype, then rounds; with corrections
        or a lattice a half-precision output is computed in float32, then rounded: a half-precision value can sit
        nearer another grid point than its own (the bound holds to the output dtype's rounding)."""
        spec, dtype = self.spec, self.dtype
        if spec.precision is not None and dtype != spec.decode_dtype:
            return spec.decode_dtype, True
        if (fix is not None or grid is not None) and dtype in (torch.float16, torch.bfloat16):
            return torch.float32, True
        return dtype, False

    def _wire_batch(
        self, coeffs: object, out: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, bool]:
        """The input handling both layers share: a `StoredBatch` decoded first, the wire value split into
        coefficients and side values, their dtype and shape checked against the spec, an unbatched sample given
        a batch axis (`out` too, after its check). Returns (coefficients, side, target, unbatched)."""
        spec = self.spec
        if isinstance(coeffs, StoredBatch):  # decode="device": the stored bytes, decoded here first
            coeffs = self.decode_stored(coeffs)
        if not isinstance(coeffs, (torch.Tensor, tuple, list)):
            raise TypeError(f"coeffs: expected a torch.Tensor. Got {type(coeffs).__name__}")
        q, side = split_wire(coeffs, spec)
        self._check_dtype(q)
        expected = spec.coeff_shape
        n = len(expected)
        if q.dim() not in (n, n + 1) or tuple(q.shape[-n:]) != expected:
            raise DctDataError(
                f"coeffs: expected shape (B, {', '.join(map(str, expected))}) = (B, {self._AXES}) for "
                f"cf={spec.cf} mask={spec.mask!r} and sample shape {spec.sample_shape}. Got {tuple(q.shape)}"
            )
        unbatched = q.dim() == n
        y = q.unsqueeze(0) if unbatched else q
        if side is not None and unbatched:
            side = side.unsqueeze(0)
        if out is not None:
            self._check_out(out, (*q.shape[:-n], *spec.sample_shape), q.device)
        target = None if out is None else (out.unsqueeze(0) if unbatched else out)
        return y, side, target, unbatched

    def _check_dtype(self, q: torch.Tensor) -> None:
        if q.dtype not in _IN_DTYPES:
            raise TypeError(
                f"coeffs: expected int8, int16, float16, bfloat16, float32 or float64 coefficients (the wire dtypes; "
                f"this spec's is {self.spec.dtype}). Got {q.dtype}"
            )

    def _split_side(
        self, side: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """(the (range, mid) rows, the correction rows or None, the lattice rows or None) of a batch's side
        values (`dctdata.decoder.corrections`, `dctdata.codec.lattice`)."""
        spec = self.spec
        if side is None or (spec.corrections is None and spec.lattice is None):
            return side, None, None
        grid = None if spec.lattice is None else lattice.split(side, spec.channels)[1]
        side, fix = corrections.split(side, spec)
        return side.contiguous(), fix, grid

    def _snap(
        self,
        img: torch.Tensor,
        grid: torch.Tensor,
        out: torch.Tensor | None = None,
        indices: Sequence[int] | None = None,
        deferred: Deferred | None = None,
    ) -> torch.Tensor:
        """img with each item's values snapped onto its grid (`dctdata.codec.lattice`); the rows are checked first
        in eager mode (a non-finite or negative step is refused, naming the sample), or that check is queued
        on `deferred` as the corrections' is (`_correct`). Written into `out` when the caller gave one (in
        every mode: a traced or compiled forward too), else returned as a new tensor (no copy back)."""
        if not _tracing():
            if deferred is None:
                lattice.check(grid, indices, where="coeffs")
            else:
                named = indices if indices is not None else deferred[1]
                deferred[0].append(lattice.check_deferred(grid, named, where="coeffs"))
        norm = self.normalize and self.spec.std is not None
        scale, shift = (self.out_scale, self.out_shift) if norm else (None, None)
        snapped = lattice.snap(img, grid.to(img.device), scale, shift)
        return snapped if out is None else out.copy_(snapped)

    def _correct(
        self,
        img: torch.Tensor,
        fix: torch.Tensor,
        indices: Sequence[int] | None = None,
        deferred: Deferred | None = None,
    ) -> torch.Tensor:
        """img with the samples' sparse corrections added (`dctdata.decoder.corrections`); their rows are checked
        first in eager mode (an exported graph clamps indices into the sample instead), or that check is
        queued on `deferred` = (checks, indices) (`forward_deferred`). `indices`: the samples' indices in
        their pack (a stored batch), else messages count within the batch."""
        if not _tracing():
            if deferred is None:
                corrections.check(fix, self.spec, indices, where="coeffs")
            else:
                named = indices if indices is not None else deferred[1]
                deferred[0].append(corrections.check_deferred(fix, self.spec, named, where="coeffs"))
        scale = self.out_scale if self.normalize and self.spec.std is not None else None
        return corrections.apply(img, fix.to(img.device), None if scale is None else scale.to(img.device))

    def forward_deferred(
        self, coeffs: object, out: torch.Tensor | None = None, indices: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, list[Callable[[], None]]]:
        """`forward` without reading anything back from the device to check the correction rows: (output,
        checks); the output is valid once each of `checks` has returned (each raises IntegrityError naming
        a sample with malformed rows, whose corrections were clamped into the sample meanwhile; `indices`:
        the samples' indices in their pack, for that message). For decoders that queue several batches
        before waiting (`DecodeAhead`). A `StoredBatch` is still decoded and checked at once: pass
        `decode_stored_deferred`'s wire."""
        checks: list[Callable[[], None]] = []
        if self._other_packs(coeffs):
            return self._decode_packs(coeffs, out, (checks, indices)), checks
        return self._decode(coeffs, out, (checks, indices)), checks

    def forward_stored_deferred(
        self, batch: StoredBatch | MixedStoredBatch
    ) -> tuple[torch.Tensor, list[Callable[[], None]]]:
        """A stored batch's decoded samples without reading anything back from the device: (output, checks),
        valid once each check has returned (the lossless stage's and the correction rows'). Batches of other
        packs are decoded with their own codecs (see `forward`). For `DecodeAhead`."""
        checks: list[Callable[[], None]] = []
        if self._other_packs(batch):
            return self._decode_packs(batch, None, (checks, None)), checks
        wire, more = self.decode_stored_deferred(batch)
        img, later = self.forward_deferred(wire, indices=batch.indices)
        return img, [*more, *later]

    def decode_stored(self, batch: StoredBatch) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The coefficients (and side values) of a stored batch, decoded on its device: what the layer
        takes from `decode="cpu"`, bit for bit (see `dctdata.decoder.stored`)."""
        wire, checks = self.decode_stored_deferred(batch)
        for check in checks:
            check()
        return wire

    def decode_stored_deferred(
        self, batch: StoredBatch | MixedStoredBatch
    ) -> tuple[torch.Tensor | tuple[torch.Tensor, torch.Tensor], list[Callable[[], None]]]:
        """`decode_stored` without reading anything back from the device: (coefficients or (coefficients,
        side), checks); the result is valid once each of `checks` has returned (each raises IntegrityError
        naming a refused sample). For decoders that queue several batches before waiting (`DecodeAhead`).
        Coefficients are those of this layer's codec: bytes of another codec are refused, naming both packs
        (decode them with `forward`, which uses their own)."""
        if isinstance(batch, MixedStoredBatch):
            raise DctDataError(
                f"field {batch.field!r}: a stored batch of several packs ({batch.packs()}): expected one pack's "
                "to give its coefficients. Decode it with the layer itself (layer(batch)), which decodes each pack "
                "with its own codec"
            )
        if isinstance(batch, StoredBatch) and self._layer_for(batch) is not self:
            raise DctDataError(
                f"field {batch.form.field!r}: stored bytes of {describe_pack(batch.form)}, whose codec differs from "
                f"this decompressor's ({self._pack_name()}): expected this layer's codec to give coefficients. Decode "
                "them with the layer itself (layer(batch)) or that pack's decompressor"
            )
        if self.lossless is None:
            raise TypeError(
                "coeffs: a StoredBatch needs the layer of its dataset, which knows the field's lossless stage "
                "(ds.decompressor(field), or Decompress(spec, lossless=field.lossless)). Got a layer without one"
            )
        q, side, checks = decode_batch_deferred(batch, self.lossless, self.spec)
        if self.spec.side is None:
            return q, checks
        if side is None:
            raise DctDataError(f"field {batch.form.field!r}: stored batch: expected side values. Got none")
        return (q, side), checks

    def _pack_name(self) -> str:
        """This layer's pack as messages name it."""
        codec = getattr(self, "pack_codec", None)
        return "a layer built from its spec" if codec is None else codec.describe()

    def _tables(self) -> fused.Tables:
        """The fused kernels' tables (`fused.tables_for`), built once."""
        if self._fused_tables is None:
            self._fused_tables = fused.tables_for(self.spec, self.normalize)
        return self._fused_tables

    def _tables_on(self, device: torch.device) -> fused_cuda.DeviceTables:
        """The fused CUDA kernel's tables on `device`, copied there once."""
        tables = self._device_tables.get(device)
        if tables is None:
            spec = self.spec
            tables = self._device_tables[device] = fused_cuda.device_tables(self._tables(), device, spec.cf, spec.mask)
        return tables

    def _portable(
        self, y: torch.Tensor, side: torch.Tensor | None, target: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The torch graph of the decode (`kernels.decode`'s last kernel): the folded weights of a v1 spec, the
        v2 affine pass a few block rows at a time otherwise."""
        spec = self.spec
        size = (spec.height, spec.width)
        compute = torch.float64 if y.dtype == torch.float64 else self.weight.dtype
        weight = self.weight.to(device=y.device, dtype=compute)
        trows = self.trows.to(device=y.device, dtype=compute)
        if self.folded:
            shift = None if self.coef_shift is None else self.coef_shift.to(device=y.device, dtype=compute)
            return synthesize(y, weight, trows, spec.mask, size, self.bias_row, dtype=dtype, out=target, shift=shift)

        def prepare(x: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
            return self._coefficients(x, None if side is None else side[b0:b1], compute)

        return synthesize(y, weight, trows, spec.mask, size, dtype=dtype, out=target, prepare=prepare)

    def _check_out(self, out: object, shape: tuple[int, ...], device: torch.device) -> None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor. Got {type(out).__name__}")
        if out.dtype != self.dtype or out.device != device:
            raise TypeError(
                f"out: expected dtype {self.dtype} on {device} (the layer's dtype, the input's device). "
                f"Got {out.dtype} on {out.device}"
            )
        if tuple(out.shape) != shape:
            raise DctDataError(f"out: expected shape {shape}. Got {tuple(out.shape)}")

    def _coefficients(self, q: torch.Tensor, side: torch.Tensor | None, compute: torch.dtype) -> torch.Tensor:
        """The v2 affine pass over the coefficient tensor (see the module docstring)."""

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=q.device, dtype=compute)

        y = q.to(compute)
        coef = y * dev(self.scale) + dev(self.shift)
        if self.recon is not None:
            coef = coef - torch.sign(y) * dev(self.recon)
        b, c, hb, k, wb = coef.shape
        if self.rotation_t is not None:
            coef = torch.matmul(dev(self.rotation_t), coef.reshape(b, c, hb * k * wb)).reshape(b, c, hb, k, wb)
        a, shift = dev(self.out_scale), dev(self.out_shift)
        if side is not None:
            rng = side[..., 0].to(compute).reshape(b, c, 1, 1, 1)
            mid = side[..., 1].to(compute).reshape(b, c, 1, 1, 1)
            a, shift = a * rng, a * mid + shift
        return coef * a + shift * dev(self.dc_gain)

    def extra_repr(self) -> str:
        s = self.spec
        extra = "".join(f", {n}" for n in ("recon", "rotation", "side") if getattr(s, n) is not None)
        return (
            f"cf={s.cf}, mask={s.mask!r}, channels={s.channels}, size=({s.height}, {s.width}), "
            f"wire={s.dtype}, out={str(self.dtype).removeprefix('torch.')}{extra}"
        )


def _same_stage(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two lossless stage configs are the same stage."""
    return stage_key(a) == stage_key(b)


def _tracing() -> bool:
    """True while torch.export, torch.compile, the ONNX exporter or the JIT tracer runs the layer (no
    data-dependent checks there)."""
    return bool(torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export())


# Volumes (samples (C, D, H, W), 8x8x8 blocks): see dctdata.decoder.volume's docstring. Here, not there, so that
# Decompress(spec) can return it without an import cycle.
DC_GAIN = math.sqrt(transform3d.BLOCK3)  # an 8x8x8 DC basis function is 1/sqrt(512) everywhere


class VolumeDecompress(Decompress):
    """Coefficients (B, C, Db, Hb, K, Wb) -> volumes (B, C, D, H, W). `normalize=False` ignores the spec's
    mean/std. Built by `Decompress(spec)` for a spec with a depth."""

    _AXES = "C, Db, Hb, K, Wb"

    def __init__(
        self,
        spec: CodecSpec,
        dtype: torch.dtype | None = None,
        normalize: bool = True,
        lossless: Mapping[str, Any] | None = None,
    ) -> None:
        nn.Module.__init__(self)
        compute = self._settings(spec, dtype, normalize, lossless)
        self.folded, self.bias_row = False, False
        self._affine_buffers(compute, DC_GAIN)
        self.register_buffer("trows", _dct_matrix_f64()[: spec.cf].to(compute), persistent=False)
        self._fused_tables = None
        self._device_tables = {}

    def _decode(self, coeffs: object, out: torch.Tensor | None, deferred: Deferred | None) -> torch.Tensor:
        """`forward`'s work for volumes (see `Decompress._decode`)."""
        spec = self.spec
        indices = getattr(coeffs, "indices", None)  # a stored batch's samples in the pack, for messages
        y, side, target, unbatched = self._wire_batch(coeffs, out)
        side, fix, grid = self._split_side(side)
        dtype, rounded = self._work_dtype(fix, grid)
        final: torch.Tensor | None = None  # `out` (batched), when the work dtype is rounded into it at the end
        if rounded:  # corrections and the snap in the work dtype, then rounded into `out` (if given)
            final, target = target, None
        img = kernels.decode(self, y, dtype, spec.cf, spec.mask, spec.size, target, side)
        if fix is not None:
            img = self._correct(img if target is None else target, fix, indices, deferred)
        if grid is not None:
            img = self._snap(img if target is None else target, grid, target, indices, deferred)
        if dtype != self.dtype:
            img = img.to(self.dtype) if final is None else final.copy_(img)
        return _result(img, out, unbatched)

    def _portable(
        self, y: torch.Tensor, side: torch.Tensor | None, target: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The torch graph of the volume decode (`kernels.decode`'s last kernel): the affine pass, then the three
        synthesis matmuls of `transform3d.synthesize`; written into `target` too when given."""
        spec = self.spec
        compute = torch.float64 if torch.float64 in (y.dtype, dtype) else self.trows.dtype
        b = y.shape[0]
        rows = y.reshape(b, *spec.rows_shape)  # (B, C, Db*Hb, K, Wb): the affine pass's view
        coef = self._coefficients(rows, side, compute).reshape(y.shape)
        trows = self.trows.to(device=y.device, dtype=compute)
        d, h, w = spec.size  # a volume's size
        img = transform3d.synthesize(coef, trows, spec.mask, (d, h, w)).to(dtype)
        if target is not None:
            target.copy_(img)
        return img

    def _check_spec(self, spec: CodecSpec) -> None:
        if spec.depth is None:
            raise DctDataError(f"spec: expected a volume spec (depth set). Got a 2-D spec of shape {spec.sample_shape}")

    def extra_repr(self) -> str:
        s = self.spec
        extra = "".join(f", {n}" for n in ("recon", "rotation", "side") if getattr(s, n) is not None)
        return (
            f"cf={s.cf}, mask={s.mask!r}, channels={s.channels}, size=({s.depth}, {s.height}, {s.width}), "
            f"wire={s.dtype}, out={str(self.dtype).removeprefix('torch.')}{extra}"
        )
