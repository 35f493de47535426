"""`Decompress`: the model's first layer. Dequantize + inverse DCT + crop (+ normalize), as matmuls.

It takes the coefficient batch exactly as a DataLoader collates it, (B, C, Hb, K, Wb) in the wire
dtype (integer or float), and returns (B, C, H, W) in `dtype` on the input's device. The steps,
offsets and normalization are folded into the weights it holds (non-persistent buffers, so model
checkpoints do not depend on them), so decoding is one pass: two small matmuls per block.
"""

from __future__ import annotations

import torch
from torch import nn

from dctdata.errors import DctDataError
from dctdata.kinds import FieldKind
from dctdata.spec import CodecSpec
from dctdata.transform import augment_bias, fold_basis, synthesize

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Decompress(nn.Module):
    """Coefficients -> images. `normalize=False` ignores the spec's mean/std."""

    def __init__(self, spec: CodecSpec, dtype: torch.dtype = torch.float32, normalize: bool = True) -> None:
        super().__init__()
        if not isinstance(spec, CodecSpec):
            raise TypeError(f"spec: expected a dctdata.CodecSpec. Got {type(spec).__name__}")
        if dtype not in _OUT_DTYPES:
            raise TypeError(f"dtype: expected one of {_OUT_DTYPES}. Got {dtype!r}")
        self.spec = spec
        self.dtype = dtype
        self.normalize = normalize
        wcol, zbias, trows = fold_basis(
            spec.cf,
            spec.mask,
            spec.channels,
            spec.steps,
            spec.offsets,
            spec.mean if normalize else None,
            spec.std if normalize else None,
        )
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        self.bias_row = zbias is not None
        self.register_buffer("weight", augment_bias(wcol, zbias).to(compute), persistent=False)
        self.register_buffer("trows", trows.to(compute), persistent=False)

    @classmethod
    def from_manifest(cls, manifest, field: str | None = None, **kwargs) -> "Decompress":
        """The layer for a packed dataset's dct field (the only one when `field` is None)."""
        f = manifest.field(field, kind=FieldKind.DCT) if field is None else manifest.field(field)
        if f.kind is not FieldKind.DCT:
            raise DctDataError(f"field {f.name!r}: expected a dct field for decompressor(). Got kind {f.kind!r}")
        return cls(f.codec, **kwargs)

    def forward(self, coeffs: torch.Tensor) -> torch.Tensor:
        if not isinstance(coeffs, torch.Tensor):
            raise TypeError(f"coeffs: expected a torch.Tensor. Got {type(coeffs).__name__}")
        if coeffs.is_complex() or coeffs.dtype == torch.bool:
            raise TypeError(f"coeffs: expected an integer or floating tensor. Got {coeffs.dtype}")
        spec = self.spec
        expected = spec.coeff_shape
        if coeffs.dim() not in (4, 5) or tuple(coeffs.shape[-4:]) != expected:
            raise DctDataError(
                f"coeffs: expected shape (B, {', '.join(map(str, expected))}) = (B, C, Hb, K, Wb) for "
                f"cf={spec.cf} mask={spec.mask!r} and sample shape {spec.sample_shape}. Got {tuple(coeffs.shape)}"
            )
        unbatched = coeffs.dim() == 4
        y = coeffs.unsqueeze(0) if unbatched else coeffs
        compute = torch.float64 if y.dtype == torch.float64 else self.weight.dtype
        out = synthesize(
            y,
            self.weight.to(device=y.device, dtype=compute),
            self.trows.to(device=y.device, dtype=compute),
            spec.mask,
            (spec.height, spec.width),
            bias_row=self.bias_row,
        )
        out = out.to(self.dtype)
        return out.squeeze(0) if unbatched else out

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"cf={s.cf}, mask={s.mask!r}, channels={s.channels}, size=({s.height}, {s.width}), "
            f"wire={s.dtype}, out={str(self.dtype).removeprefix('torch.')}"
        )
