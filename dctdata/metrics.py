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
