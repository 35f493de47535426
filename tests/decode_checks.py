"""The one invariant checker every decode test reuses (torchvision-v2 style).

`check_decompress(spec, q)` asserts that the `Decompress` layer (folded weights, one pass) equals the
reference chain dequantize -> inverse DCT -> normalize, in shape, dtype, device and value.
"""

from __future__ import annotations

import torch

import dctdata


def reference_decode(spec: dctdata.CodecSpec, q: torch.Tensor) -> torch.Tensor:
    coeffs = dctdata.dequantize(q, spec).to(torch.float64)
    x = dctdata.decompress(coeffs.to(torch.float32), spec.cf, (spec.height, spec.width), spec.mask)
    if spec.mean is not None:
        mean = torch.tensor(spec.mean, dtype=x.dtype).reshape(-1, 1, 1)
        std = torch.tensor(spec.std, dtype=x.dtype).reshape(-1, 1, 1)
        x = (x - mean) / std
    return x


def check_decompress(
    spec: dctdata.CodecSpec, q: torch.Tensor, dtype: torch.dtype = torch.float32, atol: float = 1e-4
) -> torch.Tensor:
    layer = dctdata.Decompress(spec, dtype=dtype)
    out = layer(q)
    lead = tuple(q.shape[:-4])
    assert out.shape == lead + spec.sample_shape, (out.shape, lead, spec.sample_shape)
    assert out.dtype == dtype
    assert out.device == q.device
    ref = reference_decode(spec, q.cpu()).to(out.device)
    scale = max(1.0, float(ref.abs().max()))
    tol = atol * scale if dtype in (torch.float32, torch.float64) else 1e-2 * scale
    torch.testing.assert_close(out.to(torch.float32), ref.to(torch.float32), atol=tol, rtol=0)
    return out
