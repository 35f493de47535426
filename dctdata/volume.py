"""The first layer for volumes: `Decompress` of a spec with a depth (samples (C, D, H, W), 8x8x8 blocks).

`Decompress(spec)` returns this subclass when `spec.depth` is set, so a model, `ds.decompressor()` and
`Decompress.from_manifest` need nothing new. It takes the field's value as a DataLoader collates it: the
coefficient batch (B, C, Db, Hb, K, Wb) in the wire dtype, or the pair (coefficients, side), or a
`StoredBatch` (decode="device"), and returns (B, C, D, H, W) in `dtype` on the input's device.

Two paths with the same math:
- portable (CUDA, autograd, torch.compile, torch.export, ONNX): one affine pass over the coefficient tensor
  (dequantization with the dead zone's reconstruction offsets, the C x C inverse rotation as a small
  matmul, the per-sample (range, mid) and normalization as a multiply-add; a constant is
  sqrt(512) times itself on the DC term), then the three synthesis matmuls of `transform3d.synthesize`.
  Only matmul/reshape/transpose/cat ops plus those few elementwise ones. The affine pass is kept for every
  spec (2-D folds a plain spec's steps into its weights instead): it reads a tensor of K/512 of the output,
  and one code path is what CUDA and ONNX see.
- fused CPU (plain CPU tensors in eager mode, float32 output): the C kernel
  (`dctdata.fused.synthesize_volume`, `_synth.c`), which dequantizes, mixes channels, applies the per-sample
  values and runs the 8x8x8 inverse DCT per group of 8 neighbouring blocks in registers and L1, writing each
  output voxel once.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn

from dctdata import fused, transform3d
from dctdata.errors import DctDataError
from dctdata.layer import _OUT_DTYPES, Decompress
from dctdata.lossless import parse_codec_config
from dctdata.spec import CodecSpec, dequant_tables
from dctdata.transform import _dct_matrix_f64
from dctdata.wire import StoredBatch, split_wire

DC_GAIN = math.sqrt(transform3d.BLOCK3)  # an 8x8x8 DC basis function is 1/sqrt(512) everywhere


class VolumeDecompress(Decompress):
    """Coefficients (B, C, Db, Hb, K, Wb) -> volumes (B, C, D, H, W). `normalize=False` ignores the spec's
    mean/std. Built by `Decompress(spec)` for a spec with a depth."""

    def __init__(
        self,
        spec: CodecSpec,
        dtype: torch.dtype = torch.float32,
        normalize: bool = True,
        lossless: Mapping[str, Any] | None = None,
    ) -> None:
        nn.Module.__init__(self)
        if not isinstance(spec, CodecSpec):
            raise TypeError(f"spec: expected a dctdata.CodecSpec. Got {type(spec).__name__}")
        if spec.depth is None:
            raise DctDataError(f"spec: expected a volume spec (depth set). Got a 2-D spec of shape {spec.sample_shape}")
        if dtype not in _OUT_DTYPES:
            raise TypeError(f"dtype: expected one of {_OUT_DTYPES}. Got {dtype!r}")
        self.spec, self.dtype, self.normalize = spec, dtype, normalize
        self.lossless = None if lossless is None else parse_codec_config(lossless, "lossless")
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        self.folded, self.bias_row = False, False
        c, k = spec.channels, spec.kept
        t = dequant_tables(spec, normalize)
        per_k = lambda x: None if x is None else x.reshape(1, c, 1, k, 1).to(compute)  # noqa: E731
        self.register_buffer("scale", per_k(t.steps), persistent=False)
        self.register_buffer("shift", per_k(t.offsets), persistent=False)
        self.register_buffer("recon", per_k(None if t.recon is None else t.recon * t.steps), persistent=False)
        rot_t = t.rotation_t
        self.register_buffer("rotation_t", None if rot_t is None else rot_t.to(compute), persistent=False)
        self.register_buffer("out_scale", t.inv_std.reshape(1, c, 1, 1, 1).to(compute), persistent=False)
        self.register_buffer("out_shift", (-t.mean * t.inv_std).reshape(1, c, 1, 1, 1).to(compute), persistent=False)
        dc = torch.zeros(1, 1, 1, k, 1, dtype=torch.float64)
        dc[..., 0, :] = DC_GAIN  # frequency (0, 0, 0) is plane 0 of either mask
        self.register_buffer("dc_gain", dc.to(compute), persistent=False)
        self.register_buffer("trows", _dct_matrix_f64()[: spec.cf].to(compute), persistent=False)
        self._fused_tables = None

    def forward(self, coeffs, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode; `out` (the output's shape, `dtype` and device) receives the result and is returned."""
        spec = self.spec
        if isinstance(coeffs, StoredBatch):
            coeffs = self.decode_stored(coeffs)
        if not isinstance(coeffs, (torch.Tensor, tuple, list)):
            raise TypeError(f"coeffs: expected a torch.Tensor. Got {type(coeffs).__name__}")
        q, side = split_wire(coeffs, spec)
        if q.is_complex() or q.dtype == torch.bool:
            raise TypeError(f"coeffs: expected an integer or floating tensor. Got {q.dtype}")
        expected = spec.coeff_shape
        if q.dim() not in (5, 6) or tuple(q.shape[-5:]) != expected:
            raise DctDataError(
                f"coeffs: expected shape (B, {', '.join(map(str, expected))}) = (B, C, Db, Hb, K, Wb) for "
                f"cf={spec.cf} mask={spec.mask!r} and sample shape {spec.sample_shape}. Got {tuple(q.shape)}"
            )
        unbatched = q.dim() == 5
        y = q.unsqueeze(0) if unbatched else q
        if side is not None and unbatched:
            side = side.unsqueeze(0)
        if out is not None:
            self._check_out(out, (*q.shape[:-5], *spec.sample_shape), q.device)
        target = None if out is None else (out.unsqueeze(0) if unbatched else out)
        if fused.usable(y, self.dtype, target):
            if self._fused_tables is None:
                self._fused_tables = fused.tables_for(spec, self.normalize)
            img = fused.synthesize_volume(y, self._fused_tables, spec.cf, spec.mask, spec.size, out=target, side=side)
        else:
            compute = torch.float64 if y.dtype == torch.float64 else self.trows.dtype
            b = y.shape[0]
            rows = y.reshape(b, *spec.rows_shape)  # (B, C, Db*Hb, K, Wb): the affine pass's view
            coef = self._coefficients(rows, side, compute).reshape(y.shape)
            trows = self.trows.to(device=y.device, dtype=compute)
            img = transform3d.synthesize(coef, trows, spec.mask, spec.size).to(self.dtype)
            if target is not None:
                target.copy_(img)
        if out is not None:
            return out
        return img.squeeze(0) if unbatched else img

    def extra_repr(self) -> str:
        s = self.spec
        extra = "".join(f", {n}" for n in ("recon", "rotation", "side") if getattr(s, n) is not None)
        return (
            f"cf={s.cf}, mask={s.mask!r}, channels={s.channels}, size=({s.depth}, {s.height}, {s.width}), "
            f"wire={s.dtype}, out={str(self.dtype).removeprefix('torch.')}{extra}"
        )
