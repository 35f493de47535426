"""Pointwise error bounds (`--max-error E`, `--max-rel-error R`): the encoder's guarantee that every decoded
value of every packed sample is within the bound, SZ3's and ZFP's promise.

A bound is per item (one channel of one sample): E in the field's units, R times the item's value range
over its valid pixels (both given: the smaller). It is checked on the float32 decode of the stored
coefficients by `Decompress` on the CPU, the arithmetic the readers use, against the bound less a margin
for float32 rounding elsewhere (another device, another kernel): MARGIN_REL times the item's largest
magnitude, |mid| + range / 2. An item whose decode misses is coded again with a finer effective step (its
stored range shrinks; the decoder is unchanged, so every reader, both storages, `decode="device"` and ONNX
decode it as before) until it holds; one that cannot (integer overflow, or a bound below float32's
precision) is an error naming it, and nothing is written.

Hand-written: the bound has to hold for this codec's own decoder, which no error-bounded library knows.
Why per-item re-coding and not a sparse list of corrections: it needs no new stored part and no new
decoder op; the cost is bytes on items with a few outlying pixels (docs/guides/max-error.md measures it).
"""

from __future__ import annotations

import math

import torch

from dctdata.errors import DctDataError
from dctdata.metrics import item_range
from dctdata.spec import CodecSpec

# float32 rounding margin, relative to an item's largest magnitude: 2^-19 (16 float32 ulps at the top of
# the item's values). A float32 decode differs from the exact one by a few ulps of the values it adds
# (the inverse DCT's 64 terms of the normalized sample, then range * y + mid); 16 ulps covers another
# summation order or fused multiply-adds on another device with room to spare.
MARGIN_REL = 2.0**-19
ROUNDS = 16  # re-codes of an item before its bound is declared unreachable


class BoundError(DctDataError):
    """An item whose decode cannot meet the field's error bound (`sample` is its index in the batch)."""

    def __init__(self, message: str, sample: int, channel: int) -> None:
        super().__init__(message)
        self.sample, self.channel = sample, channel


def bound_text(spec: CodecSpec) -> str:
    """The bound as the messages and the CLI spell it."""
    parts = []
    if spec.max_error is not None:
        parts.append(f"--max-error {spec.max_error:g}")
    if spec.max_rel_error is not None:
        parts.append(f"--max-rel-error {spec.max_rel_error:g}")
    return " and ".join(parts)


def item_bounds(
    x: torch.Tensor, spec: CodecSpec, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bound, margin, range) per item (..., C) in float64: the absolute bound each item's decode must
    meet, the float32 margin kept from it, and the item's value range over its valid pixels."""
    rng = item_range(x, 2, valid)
    bound = torch.full_like(rng, math.inf)
    if spec.max_error is not None:
        bound = torch.minimum(bound, torch.full_like(rng, spec.max_error))
    if spec.max_rel_error is not None:
        bound = torch.minimum(bound, spec.max_rel_error * rng)
    flat = x.detach().to(torch.float64).flatten(-2).abs()
    if valid is not None:
        flat = flat.masked_fill(~torch.broadcast_to(valid, x.shape).flatten(-2), 0.0)
    return bound, MARGIN_REL * flat.amax(-1), rng


def item_max_error(x: torch.Tensor, x_hat: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(..., C) the largest |x_hat - x| of every item over its valid pixels, in float64."""
    d = (x_hat.detach().to(torch.float64) - x.detach().to(torch.float64)).abs_()
    if valid is not None:
        d = d.masked_fill_(~torch.broadcast_to(valid, d.shape), 0.0)
    return d.flatten(-2).amax(-1)


def initial_scale(bound: torch.Tensor, rng: torch.Tensor, spec: CodecSpec) -> torch.Tensor | None:
    """(B, C) the factor each item's stored range starts at: its normalized bound (bound / range) over the
    spec's bound_ref, so every item starts at the step its own bound needs; None without bound_ref.
    Items without a range (constant) decode exactly and keep 1."""
    if spec.bound_ref is None:
        return None
    g = bound / (spec.bound_ref * rng.clamp(min=1e-300))
    return torch.where((rng > 0) & torch.isfinite(g), g.clamp(1e-6, 1e6), torch.ones_like(g))


def missing(err: torch.Tensor, bound: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """Items whose decode misses the bound less the margin (an exact decode always holds)."""
    return (err + margin > bound) & (err > 0)


def keep_bound(coeffs, spec: CodecSpec, q, side, over, x, valid=None, bound=None, margin=None):
    """Re-code the items whose float32 decode misses spec's bound with a smaller stored range until every
    item holds: (q, side, over, largest error per item). `coeffs` are the coded coefficients `q` was
    quantized from with `side`; `x` the samples (B, C, H, W). Raises `BoundError` for an item that cannot
    hold (re-coding it would overflow the integer dtype, or the bound is below float32's precision)."""
    from dctdata.layer import Decompress  # the readers' decoder; layer does not import this module
    from dctdata.quantize import quantize_per_sample, rescaled

    if bound is None or margin is None:
        bound, margin, _ = item_bounds(x, spec, valid)
    layer = Decompress(spec, normalize=False)
    with torch.no_grad():
        err = item_max_error(x, layer((q, side)), valid)
    g = torch.ones(side.shape[:-1], dtype=torch.float64)
    base = side[..., 0].to(torch.float64).clone()  # the ranges `coeffs` were coded with (g = 1)
    stuck = torch.zeros_like(err, dtype=torch.bool)
    for _ in range(ROUNDS):
        bad = missing(err, bound, margin) & ~stuck
        if not bool(bad.any()):
            break
        rows = bad.any(1).nonzero().flatten()
        room = (bound[rows] - margin[rows]).clamp(min=0)
        # pixel errors scale with the step: aim 10% under the room, and move at least 10% per round
        want = (0.9 * room / err[rows].clamp(min=1e-300)).clamp(min=0.05, max=0.9)
        trial = g[rows] * torch.where(bad[rows], want, torch.ones_like(want))
        qb, ob = quantize_per_sample(rescaled(coeffs[rows], trial, spec), spec, checked=True)
        grew = ob > over[rows]  # finer steps would clamp coefficients: these items cannot be helped
        stuck[rows[grew]] |= bad[rows[grew]]
        rows, trial, qb, ob = rows[~grew], trial[~grew], qb[~grew], ob[~grew]
        if not len(rows):
            continue
        sb = side[rows].clone()
        sb[..., 0] = (base[rows] * trial).to(side.dtype)
        with torch.no_grad():
            eb = item_max_error(x[rows], layer((qb, sb)), None if valid is None else _rows(valid, rows, x))
        g[rows], side[rows], q[rows], over[rows], err[rows] = trial, sb, qb, ob, eb
    bad = missing(err, bound, margin)
    if bool(bad.any()):
        j, c = (int(v) for v in bad.nonzero()[0])
        why = (
            "the bound is below float32's precision for these values: loosen it or subtract an offset"
            if float(margin[j, c]) >= float(bound[j, c])
            else f"finer steps overflow {spec.dtype}: use --quant int16"
            if bool(stuck[j, c]) and spec.dtype == "int8"
            else "finer steps overflow the integer dtype: loosen the bound"
            if bool(stuck[j, c])
            else "the bound is near float32's precision for these values: loosen it or subtract an offset"
        )
        raise BoundError(
            f"expected |decoded - x| <= {float(bound[j, c]):.6g} ({bound_text(spec)}, less a float32 margin of "
            f"{float(margin[j, c]):.3g}) on every value. Got {float(err[j, c]):.6g} in channel {c} ({why})",
            j,
            c,
        )
    return q, side, over, err


def _rows(valid: torch.Tensor, rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.broadcast_to(valid, x.shape)[rows]
