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
Re-coding makes a whole item finer for a few outlying pixels; with corrections (`dctdata.corrections`,
what calibration turns on for bounded fields) each sample also tries coarser steps with those pixels
corrected one by one, and keeps whichever stores least. Items whose values lie on an evenly spaced grid
(`dctdata.lattice`) are coded to half its spacing instead, where that is wider, and snapped back onto it.
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
    dims = spec.dims
    rng = item_range(x, dims, valid)
    bound = torch.full_like(rng, math.inf)
    if spec.max_error is not None:
        bound = torch.minimum(bound, torch.full_like(rng, spec.max_error))
    if spec.max_rel_error is not None:
        bound = torch.minimum(bound, spec.max_rel_error * rng)
    flat = x.detach().to(torch.float64).flatten(-dims).abs()
    if valid is not None:
        flat = flat.masked_fill(~torch.broadcast_to(valid, x.shape).flatten(-dims), 0.0)
    return bound, MARGIN_REL * flat.amax(-1), rng


def item_max_error(
    x: torch.Tensor, x_hat: torch.Tensor, valid: torch.Tensor | None = None, dims: int = 2
) -> torch.Tensor:
    """(..., C) the largest |x_hat - x| of every item (its last `dims` axes) over its valid pixels, in float64."""
    d = (x_hat.detach().to(torch.float64) - x.detach().to(torch.float64)).abs_()
    if valid is not None:
        d = d.masked_fill_(~torch.broadcast_to(valid, d.shape), 0.0)
    return d.flatten(-dims).amax(-1)


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
