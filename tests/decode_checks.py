"""The one invariant checker every decode test reuses (torchvision-v2 style).

`check_decompress(spec, wire)` asserts that the `Decompress` layer (folded weights or the v2 affine
pass) equals the plain decoder `dctdata.encoder.quantize.decode_reference` (dequantize -> inverse DCT ->
inverse rotation -> per-sample range/mid -> normalize), in shape, dtype, device and value.
"""

from __future__ import annotations

import torch

import dctdata
from dctdata.decoder.wire import split_wire
from dctdata.encoder.quantize import decode_reference


def check_decompress(
    spec: dctdata.CodecSpec, wire, dtype: torch.dtype = torch.float32, atol: float = 1e-4
) -> torch.Tensor:
    layer = dctdata.Decompress(spec, dtype=dtype)
    out = layer(wire)
    q, side = split_wire(wire, spec)
    lead = tuple(q.shape[: q.dim() - len(spec.coeff_shape)])
    assert out.shape == lead + spec.sample_shape, (out.shape, lead, spec.sample_shape)
    assert out.dtype == dtype
    assert out.device == q.device
    cpu = q.cpu() if side is None else (q.cpu(), side.cpu())
    ref = decode_reference(cpu, spec).to(out.device)
    scale = max(1.0, float(ref.abs().max()))
    tol = atol * scale if dtype in (torch.float32, torch.float64) else 1e-2 * scale
    torch.testing.assert_close(out.to(torch.float32), ref.to(torch.float32), atol=tol, rtol=0)
    return out
