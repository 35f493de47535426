"""Error figures used everywhere (pack reports, bench tables, tests): PSNR against each item's value
range, and max absolute error. One definition so every number in the project means the same."""

from __future__ import annotations

import math

import torch


def item_range(x: torch.Tensor, dims: int = 2) -> torch.Tensor:
    """max - min over the last `dims` dimensions (per item), in float64."""
    flat = x.detach().to(torch.float64).flatten(start_dim=x.dim() - dims)
    return flat.amax(-1) - flat.amin(-1)


def psnr(reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2, data_range: float | None = None) -> torch.Tensor:
    """PSNR in dB per item over the last `dims` dims: 10 log10(range^2 / MSE).

    range is each reference item's max - min unless `data_range` is given. A perfect reconstruction
    gives +inf; a constant item (zero range) with any error gives -inf.
    """
    ref = reference.detach().to(torch.float64)
    est = estimate.detach().to(torch.float64)
    mse = (ref - est).pow(2).flatten(start_dim=ref.dim() - dims).mean(-1)
    rng = item_range(ref, dims) if data_range is None else torch.full_like(mse, float(data_range))
    with torch.no_grad():
        out = 10.0 * torch.log10(rng.pow(2) / mse)
    out = torch.where(mse == 0, torch.full_like(out, math.inf), out)
    return out


def max_abs_error(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    return float((reference.detach().to(torch.float64) - estimate.detach().to(torch.float64)).abs().max())
