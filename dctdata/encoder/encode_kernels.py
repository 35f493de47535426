"""The encode's elementwise passes in C (`dctdata/encoder/_encode.c`): per-item normalization and quantization,
and the pack's per-item error figures.

Why: in torch each is several passes over the batch with full-size temporaries (normalize: to float64,
subtract, divide, back to float32; quantize: a finiteness check, subtract, divide, round or dead-zone,
two comparisons and a sum for the overflow count, clamp, cast), so a pack's encode spent more time in
them than in the DCT. The C loops do each in one pass, with the same IEEE-754 operations in the same
order per value, so their results are the torch path's bit for bit (tests/core/test_encode_kernels.py
compares them on random and edge-case inputs).

The figures (`figures`: squared error summed and at its largest per item, the reference's extremes) are the
pack's check of every item against its source: in torch they were a float64 copy of the error, a square, a
mean, two maxima and two minima per batch, more time than the decode they measure. The squares and extremes
are torch's own values; the float64 sum runs in another order (its last bits may differ from torch's).

Used for plain contiguous CPU float32 tensors (no autograd) with int8/int16 wire dtypes; everything else
(float16/float32 wires, CUDA, tensors that need grad) keeps the torch path. `DCTDATA_ENCODE_KERNEL=0`
turns the kernels off.
"""

from __future__ import annotations

import os

import torch

try:
    import dctdata.encoder._encode as _encode
except ImportError:  # a source tree without the built extension: the torch paths run
    _encode = None

ENABLED = os.environ.get("DCTDATA_ENCODE_KERNEL", "1") != "0"
QKINDS = {torch.int8: 0, torch.int16: 1}


def available() -> bool:
    """True when the extension is built and not turned off."""
    return _encode is not None and ENABLED


def _plain(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and not t.requires_grad and t.layout == torch.strided and not t.is_neg()


def normalize(x: torch.Tensor, side: torch.Tensor, dims: int) -> torch.Tensor | None:
    """(x - mid) / range per item in float64, rounded to float32, or None where the kernel does not apply."""
    if not available() or x.dtype != torch.float32 or not _plain(x) or x.dim() < dims or x.numel() == 0:
        return None
    n = 1
    for s in x.shape[x.dim() - dims :]:
        n *= int(s)
    items = x.numel() // n
    if tuple(side.shape) != (*x.shape[: x.dim() - dims], 2) or side.dtype != torch.float32 or not _plain(side):
        return None
    xc = x.detach().contiguous()
    rng = side[..., 0].detach().contiguous().reshape(items)
    mid = side[..., 1].detach().contiguous().reshape(items)
    out = torch.empty_like(xc)
    _encode.normalize(xc.numpy(), rng.numpy(), mid.numpy(), out.numpy(), n)
    return out


def quantize(
    c: torch.Tensor, rows: tuple[int, ...], dtype: torch.dtype, offsets, steps, theta: float | None
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """float32 coefficients viewed as (..., C, R, K, Wb) `rows` -> (wire tensor of c's shape, clamped count per
    leading index, non-finite count), or None where the kernel does not apply. With non-finite values
    nothing is quantized (the count says how many; the caller raises)."""
    if not available() or dtype not in QKINDS or c.dtype != torch.float32 or not _plain(c):
        return None
    lead = tuple(int(s) for s in rows[:-4])
    n_lead = 1
    for s in lead:
        n_lead *= s
    ch, r, k, wb = (int(s) for s in rows[-4:])
    cc = c.detach().contiguous()
    q = torch.empty(cc.shape, dtype=dtype)
    over = torch.empty(lead, dtype=torch.int64)
    tables = [None if t is None else torch.as_tensor(t, dtype=torch.float32).reshape(-1).contiguous().numpy()
              for t in (offsets, steps)]  # fmt: skip
    bad = _encode.quantize(
        cc.numpy(), QKINDS[dtype], q.numpy(), over.numpy(), (n_lead, ch, r, k, wb), *tables,
        -1.0 if theta is None else float(theta),
    )  # fmt: skip
    return q, over, bad


def figures(reference: torch.Tensor, estimate: torch.Tensor, dims: int):
    """(per-item MSE, value range, max abs error) in float64 of float32 `estimate` against float32 `reference` over
    their last `dims` axes (`dctdata.codec.metrics.item_figures` without a mask), or None where the kernel does not
    apply (other dtypes or devices, shapes that differ, non-finite values: the caller's torch path)."""
    if not available() or reference.dtype != torch.float32 or estimate.dtype != torch.float32:
        return None
    if not (_plain(reference) and _plain(estimate)) or reference.shape != estimate.shape or reference.dim() < dims:
        return None
    lead = tuple(reference.shape[: reference.dim() - dims])
    n = 1
    for s in reference.shape[reference.dim() - dims :]:
        n *= int(s)
    if n == 0 or reference.numel() == 0:
        return None
    ref, est = reference.detach().contiguous(), estimate.detach().contiguous()
    sse, peak = torch.empty(lead, dtype=torch.float64), torch.empty(lead, dtype=torch.float64)
    lo, hi = torch.empty(lead, dtype=torch.float32), torch.empty(lead, dtype=torch.float32)
    if _encode.figures(ref.numpy(), est.numpy(), n, sse.numpy(), lo.numpy(), hi.numpy(), peak.numpy()):
        return None
    return sse / n, hi.to(torch.float64) - lo.to(torch.float64), peak.sqrt_()


def vector_isa() -> str | None:
    """The instruction set the loops use on this CPU ("avx2" or "portable"), None without the extension."""
    return None if _encode is None else _encode.vector_isa()
