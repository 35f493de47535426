"""Error figures used everywhere (pack reports, calibration, bench tables, inspect, tests): PSNR against
each item's value range, and max absolute error. One definition so every number in the project means
the same.

An *item* is what the last `dims` dimensions hold: one channel of one sample with dims=2 (what pack,
info and the manifest report), a whole sample with dims=3.

Masked data: every function takes an optional `valid` mask (bool, broadcastable to the reference).
Then only valid pixels count: the MSE is their mean squared error, the range is max - min of the
valid reference values, and the max error is over valid pixels. An item with no valid pixel has no
figure (MSE NaN, range 0); a constant item (zero range) has no PSNR against its range either, so
callers keep only items with `range > 0`.
"""

from __future__ import annotations

import math

import torch


def _flat(t: torch.Tensor, dims: int) -> torch.Tensor:
    return t.flatten(start_dim=t.dim() - dims)


def _valid(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    if valid is None:
        return None
    v = torch.as_tensor(valid, device=like.device)
    if v.dtype != torch.bool:
        v = v != 0
    return v.expand_as(like)


def item_range(x: torch.Tensor, dims: int = 2, valid: torch.Tensor | None = None) -> torch.Tensor:
    """max - min over the last `dims` dimensions (per item), in float64; over valid pixels when
    `valid` is given (0 for an item without any)."""
    v = _valid(valid, x)
    if v is None and x.dtype == torch.float32:  # float32 extremes are exact: no float64 copy
        flat = _flat(x.detach(), dims)
        return flat.amax(-1).to(torch.float64) - flat.amin(-1).to(torch.float64)
    flat = _flat(x.detach().to(torch.float64), dims)
    if v is None:
        return flat.amax(-1) - flat.amin(-1)
    fv = _flat(v, dims)
    hi = torch.where(fv, flat, torch.full_like(flat, -math.inf)).amax(-1)
    lo = torch.where(fv, flat, torch.full_like(flat, math.inf)).amin(-1)
    return torch.where(fv.any(-1), hi - lo, torch.zeros_like(hi))


def item_figures(
    reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-item MSE, per-item value range, per-item max abs error) over the last `dims` dims, in
    float64, from one float64 error tensor (the pack computes these per batch).

    With `valid`, over valid pixels only (an item without valid pixels: MSE NaN, range 0, max error 0).
    """
    ref = reference.detach()
    sq = (estimate.detach().to(torch.float64) - ref).square_()  # a new float64 tensor (type promotion)
    v = _valid(valid, ref)
    if v is None:
        flat = _flat(ref, dims)
        rng = flat.amax(-1).to(torch.float64) - flat.amin(-1).to(torch.float64)
        sq_flat = _flat(sq, dims)
        mse = sq_flat.mean(-1)
    else:
        sq = sq.masked_fill_(~v, 0.0)  # invalid pixels may hold anything (NaN included)
        sq_flat = _flat(sq, dims)
        mse = sq_flat.sum(-1) / _flat(v, dims).sum(-1)  # NaN where an item has no valid pixel
        rng = item_range(ref, dims, v)
    peak = sq_flat.amax(-1).sqrt_() if sq_flat.shape[-1] else torch.zeros_like(mse)  # sqrt(x^2) == |x| in IEEE
    return mse, rng, peak


def item_errors(
    reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(per-item MSE, per-item value range, max abs error) over the last `dims` dims, in float64; with
    `valid`, over valid pixels only (see `item_figures`)."""
    mse, rng, peak = item_figures(reference, estimate, dims, valid)
    return mse, rng, float(peak.max()) if peak.numel() else 0.0


def psnr_from_mse(mse: torch.Tensor, value_range: torch.Tensor) -> torch.Tensor:
    """10 log10(range^2 / MSE); +inf where MSE is 0, -inf for a zero range with any error."""
    out = 10.0 * torch.log10(value_range.pow(2) / mse)
    return torch.where(mse == 0, torch.full_like(out, math.inf), out)


def psnr(
    reference: torch.Tensor,
    estimate: torch.Tensor,
    dims: int = 2,
    data_range: float | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """PSNR in dB per item over the last `dims` dims: 10 log10(range^2 / MSE).

    range is each reference item's max - min (over its valid pixels when `valid` is given) unless
    `data_range` is given. A perfect reconstruction gives +inf; a constant item (zero range) with any
    error gives -inf; an item without valid pixels gives NaN.
    """
    mse, rng, _ = item_errors(reference, estimate, dims, valid)
    if data_range is not None:
        rng = torch.full_like(mse, float(data_range))
    return psnr_from_mse(mse, rng)


def pooled_psnr(scores: list[float] | torch.Tensor) -> float | None:
    """Dataset-level PSNR of items given their PSNRs: 10 log10(1 / mean_i(MSE_i / range_i^2)), the
    PSNR of the mean range-normalised MSE (what `--target-psnr` promises, per channel). Never above the
    mean of the item PSNRs. None for no items; +inf when every item is exact."""
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    s = s[~torch.isnan(s)]
    if s.numel() == 0:
        return None
    nmse = float(torch.pow(10.0, -s / 10.0).mean())
    return math.inf if nmse == 0 else -10.0 * math.log10(nmse)


def max_abs_error(reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """Largest |estimate - reference| (over valid pixels when `valid` is given)."""
    err = (reference.detach().to(torch.float64) - estimate.detach().to(torch.float64)).abs()
    v = _valid(valid, err)
    if v is not None:
        err = torch.where(v, err, torch.zeros_like(err))
    return float(err.max()) if err.numel() else 0.0


# Item ranges whose errors square safely in float32: a 1e-4 nmse (40 dB) of a range of 1e-15 squares to
# 1e-34, well above float32's smallest normal (1.2e-38); an error of a whole range of 1e15 to 1e30, below
# its largest (3.4e38)
FLOAT32_SQUARE_RANGE = (1e-15, 1e15)


class ItemErrors:
    """MSE / range^2 of every item (channel of a sample) of many estimates of one fixed reference: the
    ranges, valid-pixel counts and which items have a figure are computed once, and each estimate costs
    one float32 difference summed in float64 (calibration evaluates dozens of estimates of the same
    subset). Items without a range or without valid pixels have no figure (`ok` False, nmse 0). An item is
    the last `dims` axes (3: a channel of a volume).

    Where some item's range is far from 1 (below FLOAT32_SQUARE_RANGE[0] or above [1]: subnormal or huge
    values), the float32 difference is squared in float64 instead: its square would underflow to 0 (every
    error read as none: calibration then took the coarsest steps tried for ones that meet the target) or
    overflow to inf. The difference itself is exact or rounded as float32 always is."""

    def __init__(self, reference: torch.Tensor, valid: torch.Tensor | None = None, dims: int = 2) -> None:
        self.reference = reference.detach().to(torch.float32)
        self.valid = _valid(valid, self.reference)
        self.dims = dims
        rng = item_range(reference, dims, self.valid)
        n = math.prod(reference.shape[-dims:])
        count = torch.full_like(rng, float(n)) if self.valid is None else _flat(self.valid, dims).sum(-1).double()
        self.ok = (rng > 0) & (count > 0)
        self._scale = torch.where(self.ok, 1.0 / (count * rng.square()).clamp(min=1e-300), torch.zeros_like(rng))
        lo, hi = FLOAT32_SQUARE_RANGE
        self._wide = bool((self.ok & ((rng < lo) | (rng > hi))).any())

    def nmse(self, estimate: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """MSE / range^2 per item of `estimate` (of the reference's leading `rows` when given)."""
        ref = self.reference if rows is None else self.reference[rows]
        d = estimate.detach().to(torch.float32) - ref
        if self.valid is not None:
            d = d.masked_fill(~(self.valid if rows is None else self.valid[rows]), 0.0)
        if self._wide:
            d = d.to(torch.float64)
        d = d.square_().flatten(-self.dims, -2) if self.dims > 2 else d.square_()  # (..., rows, W)
        sse = d.sum(-1).sum(-1, dtype=torch.float64)  # float32 rows (~1e-7), float64 over rows
        return sse * (self._scale if rows is None else self._scale[rows])

    def channel_nmse(self, nm: torch.Tensor) -> torch.Tensor:
        """(C,) mean of the items' nmse per channel (axis -1 of nm), items without a figure left out."""
        ok = self.ok.reshape(-1, self.ok.shape[-1])
        return (nm.reshape(ok.shape) * ok).sum(0) / ok.sum(0).clamp(min=1)


def item_nmse(
    reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(MSE / range^2 of every item (one channel of one sample), which items have a figure): the
    quantity calibration drives. Items without a range or without valid pixels get 0 and False."""
    mse, rng, _ = item_figures(reference, estimate, 2, valid)
    has = (rng > 0) & torch.isfinite(mse)
    return torch.where(has, mse / torch.where(has, rng, torch.ones_like(rng)).square(), torch.zeros_like(mse)), has


def channel_nmse(reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(C,) mean over the items of each channel (axis -3) of MSE / range^2: the dataset-level figure a
    target PSNR promises per channel. Items without a figure are left out."""
    nm, has = item_nmse(reference, estimate, valid)
    nm, has = nm.reshape(-1, nm.shape[-1]), has.reshape(-1, has.shape[-1])
    return (nm * has).sum(0) / has.sum(0).clamp(min=1)


NORM32_LOW = 1e-18  # a float32 norm above this lost nothing to squares that underflowed (below 1e-38)


def item_mean_square(reference: torch.Tensor, dims: int = 2, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of the squared reference values of every item (over its valid pixels), in float64: with the
    item's MSE, its relative L2 error sqrt(MSE / mean square) = ||x̂ - x|| / ||x||, the figure surrogate
    papers report. NaN for an item without valid pixels."""
    v = _valid(valid, reference)
    if v is None:
        flat = _flat(reference.detach(), dims)
        n = max(1, flat.shape[-1])
        if flat.dtype == torch.float32:  # a float32 norm, without a float64 copy of the items
            norm = torch.linalg.vector_norm(flat, dim=-1)
            # kept where no square overflowed (a norm past float32) or underflowed (a norm near 0 of nonzero values)
            doubt = ~torch.isfinite(norm) | (norm <= NORM32_LOW)
            if bool(doubt.any()):
                doubt &= flat.abs().amax(-1) > 0  # an all-zero item's norm is 0 in any precision
            if not bool(doubt.any()):
                out: torch.Tensor = norm.to(torch.float64).square() / n
                return out
        return _flat(reference.detach().to(torch.float64).square(), dims).sum(-1) / n
    sq = reference.detach().to(torch.float64).square()
    return _flat(sq.masked_fill_(~v, 0.0), dims).sum(-1) / _flat(v, dims).sum(-1)


def frame_figures(
    reference: torch.Tensor, estimate: torch.Tensor, dims: int = 2, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(PSNR, relative L2 error, max abs error) of every item, float64: the PSNR against the item's range
    (NaN for a constant item, which has none; +inf for an exact one), the relative L2 error against its norm
    (NaN for an all-zero item, which has none). The per-frame figures a trajectory pack reports by time step."""
    mse, rng, peak = item_figures(reference, estimate, dims, valid)
    ms = item_mean_square(reference, dims, valid)
    scores = torch.where(rng > 0, psnr_from_mse(mse, rng), torch.full_like(mse, math.nan))
    rel = torch.where(
        ms > 0, (mse / torch.where(ms > 0, ms, torch.ones_like(ms))).sqrt(), torch.full_like(ms, math.nan)
    )
    return scores, rel, peak
