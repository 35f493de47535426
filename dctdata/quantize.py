"""Quantize/dequantize kept coefficients as a CodecSpec says (q = round((coef - offset) / step)).

Overflow is never silent: values outside the wire dtype's range are clamped *and counted*; callers
report the count and `--strict` turns any into an error. Choosing the steps from data (calibration)
lives elsewhere; this module only applies them.
"""

from __future__ import annotations

import torch

from dctdata.errors import DctDataError
from dctdata.spec import INTEGER_DTYPES, CodecSpec
from dctdata.transform import compress

_FP16_MAX = float(torch.finfo(torch.float16).max)
# Largest |x| whose 8x8 orthonormal DCT stays finite in float32 (a coefficient is at most 8 max|x|).
F32_SAFE_MAX = float(torch.finfo(torch.float32).max) / 8


def _table(values, spec: CodecSpec, device) -> torch.Tensor:
    """(C, K) table shaped to broadcast over (..., C, Hb, K, Wb)."""
    return torch.as_tensor(values, dtype=torch.float32, device=device).reshape(spec.channels, 1, spec.kept, 1)


def check_coeff_shape(coeffs: torch.Tensor, spec: CodecSpec, name: str = "coefficients") -> None:
    """Raise unless coeffs end in the spec's (C, K, Hb, Wb)."""
    if tuple(coeffs.shape[-4:]) != spec.coeff_shape or coeffs.dim() < 4:
        raise DctDataError(
            f"{name}: expected shape (..., {', '.join(map(str, spec.coeff_shape))}) = (..., C, Hb, K, Wb) "
            f"for cf={spec.cf} mask={spec.mask!r} and size {spec.sample_shape}. Got {tuple(coeffs.shape)}"
        )


def quantize(coeffs: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, int]:
    """float32 (..., C, Hb, K, Wb) -> (wire-dtype tensor, number of clamped values)."""
    check_coeff_shape(coeffs, spec)
    c = coeffs.to(torch.float32)
    bad = int((~torch.isfinite(c)).sum())
    if bad:  # NaN would cast to an arbitrary integer: never store it silently
        raise DctDataError(
            f"coefficients: expected finite values. Got {bad} NaN/Inf (non-finite input, or |x| beyond "
            f"float32 max / 8 = {F32_SAFE_MAX:.3g}, where the 8x8 DCT overflows float32)"
        )
    if spec.offsets is not None:
        c = c - _table(spec.offsets, spec, c.device)
    if spec.steps is not None:
        c = c / _table(spec.steps, spec, c.device)
    if spec.dtype in INTEGER_DTYPES:
        info = torch.iinfo(spec.torch_dtype)
        q = torch.round(c)
        overflow = int(((q < info.min) | (q > info.max)).sum())
        return q.clamp_(info.min, info.max).to(spec.torch_dtype), overflow
    if spec.dtype == "float16":
        overflow = int((c.abs() > _FP16_MAX).sum())
        return c.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16), overflow
    return c.to(spec.torch_dtype), 0


def dequantize(q: torch.Tensor, spec: CodecSpec) -> torch.Tensor:
    """Wire-dtype coefficients -> float32 coefficients (reference; `Decompress` folds this)."""
    check_coeff_shape(q, spec)
    c = q.to(torch.float32)
    if spec.steps is not None:
        c = c * _table(spec.steps, spec, c.device)
    if spec.offsets is not None:
        c = c + _table(spec.offsets, spec, c.device)
    return c


def encode(x: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, int]:
    """(..., C, H, W) float samples -> (quantized (..., C, Hb, K, Wb), overflow count)."""
    if isinstance(x, torch.Tensor) and tuple(x.shape[-3:]) != spec.sample_shape:
        raise DctDataError(
            f"sample: expected shape (..., {', '.join(map(str, spec.sample_shape))}) = (..., C, H, W). "
            f"Got {tuple(x.shape)}"
        )
    return quantize(compress(x, spec.cf, spec.mask), spec)
