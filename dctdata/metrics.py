"""Error figures used everywhere (pack reports, bench tables, tests): PSNR against each item's value
range, and max absolute error. One definition so every number in the project means the same."""

from __future__ import annotations

import math

import torch


def item_range(x: torch.Tensor, dims: int = 2) -> torch.Tensor:
    """max - min over the last `dims` dimensions (per item), in float64."""
    flat = x.detach().to(torch.float64).flatten(start_dim=x.dim() - dims)
    return flat.amax(-1) - flat.amin(-1)


def item_errors(
    reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(per-item MSE, per-item value range, max abs error) over the last `dims` dims, in float64.

    One float64 error tensor serves all three (the pack computes these per batch), instead of
    converting reference and estimate separately.
    """
    ref = reference.detach()
    err = estimate.detach().to(torch.float64) - ref  # a new float64 tensor (type promotion)
    flat = ref.flatten(start_dim=ref.dim() - dims)
    rng = flat.amax(-1).to(torch.float64) - flat.amin(-1).to(torch.float64)
    sq = err.square_()
    mse = sq.flatten(start_dim=sq.dim() - dims).mean(-1)
    max_abs = math.sqrt(float(sq.max())) if sq.numel() else 0.0  # sqrt(x^2) == |x| exactly in IEEE arithmetic
    return mse, rng, max_abs


def psnr_from_mse(mse: torch.Tensor, value_range: torch.Tensor) -> torch.Tensor:
    """10 log10(range^2 / MSE); +inf where MSE is 0, -inf for a zero range with any error."""
    out = 10.0 * torch.log10(value_range.pow(2) / mse)
    return torch.where(mse == 0, torch.full_like(out, math.inf), out)


def psnr(
    reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2, data_range: float | None = None
) -> torch.Tensor:
    """PSNR in dB per item over the last `dims` dims: 10 log10(range^2 / MSE).

    range is each reference item's max - min unless `data_range` is given. A perfect reconstruction
    gives +inf; a constant item (zero range) with any error gives -inf.
    """
    mse, rng, _ = item_errors(reference, estimate, dims)
    if data_range is not None:
        rng = torch.full_like(mse, float(data_range))
    return psnr_from_mse(mse, rng)


def max_abs_error(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    return float((reference.detach().to(torch.float64) - estimate.detach().to(torch.float64)).abs().max())


def item_nmse(
    reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(MSE / range^2 of every item (leading dims), which items have a range) over the last two dims,
    counting only `valid` pixels (a bool mask broadcastable to the reference) when given, and each
    item's range over its valid pixels. float64."""
    ref = reference.detach().to(torch.float64)
    err = (estimate.detach().to(torch.float64) - ref).square().flatten(-2)
    flat = ref.flatten(-2)
    if valid is None:
        mse, lo, hi = err.mean(-1), flat.amin(-1), flat.amax(-1)
    else:
        ok = torch.broadcast_to(valid, ref.shape).flatten(-2)
        count = ok.sum(-1)
        mse = err.masked_fill(~ok, 0).sum(-1) / count.clamp(min=1)
        lo = flat.masked_fill(~ok, math.inf).amin(-1)
        hi = flat.masked_fill(~ok, -math.inf).amax(-1)
    rng = (hi - lo).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    has = rng > 0
    return torch.where(has, mse / torch.where(has, rng, torch.ones_like(rng)).square(), torch.zeros_like(mse)), has


def channel_nmse(reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(C,) mean over the items of each channel (axis -3) of MSE / range^2: the dataset-level figure a
    target PSNR promises per channel. Items without a range are left out."""
    nm, has = item_nmse(reference, estimate, valid)
    nm, has = nm.reshape(-1, nm.shape[-1]), has.reshape(-1, has.shape[-1])
    return (nm * has).sum(0) / has.sum(0).clamp(min=1)
