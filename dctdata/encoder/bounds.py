"""Pointwise error bounds (`--max-error E`, `--max-rel-error R`): the encoder's guarantee that every decoded
value of every packed sample is within the bound, SZ3's and ZFP's promise.

A bound is per item (one channel of one sample): E in the field's units, R times the item's value range
over its valid pixels (both given: the smaller). A float64 source's field decodes in float64
(`CodecSpec.precision`: float64 side values, float64 arithmetic on every path, a float64 margin of
MARGIN_REL64), and its bound is checked on that decode against the float64 values as given. Every other
field's is checked on the float32 decode of the stored coefficients by `Decompress` on the CPU, the
arithmetic the readers use, against the bound less a margin for float32 rounding elsewhere (another device,
another kernel): MARGIN_REL times the item's largest magnitude, |mid| + range / 2. An item whose decode
misses is coded again with a finer effective step (its stored range shrinks; the decoder is unchanged, so
every reader, both storages, `decode="device"` and ONNX decode it as before) until it holds; one that cannot
(integer overflow, or a bound below float32's precision) is an error naming it, and nothing is written.

Hand-written: the bound has to hold for this codec's own decoder, which no error-bounded library knows.
Re-coding makes a whole item finer for a few outlying pixels; with corrections (`dctdata.decoder.corrections`,
what calibration turns on for bounded fields) each sample also tries coarser steps with those pixels
corrected one by one, and keeps whichever stores least. Items whose values lie on an evenly spaced grid
(`dctdata.codec.lattice`) are coded to half its spacing instead, where that is wider, and snapped back onto it.
"""

from __future__ import annotations

import math

import torch

from dctdata.codec.metrics import item_range
from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError

# float32 rounding margin, relative to an item's largest magnitude: 2^-19 (16 float32 ulps at the top of
# the item's values). A float32 decode differs from the exact one by a few ulps of the values it adds
# (the inverse DCT's 64 terms of the normalized sample, then range * y + mid); 16 ulps covers another
# summation order or fused multiply-adds on another device with room to spare.
MARGIN_REL = 2.0**-19
# the same 16 ulps for a field that decodes in float64 (`CodecSpec.precision`): its side values are float64 and
# every step of its decode runs in float64 on every path
MARGIN_REL64 = 2.0**-48


class BoundError(DctDataError):
    """An item whose decode cannot meet the field's error bound (`sample` is its index in the batch)."""

    def __init__(self, message: str, sample: int, channel: int) -> None:
        super().__init__(message)
        self.sample, self.channel = sample, channel

    def __reduce__(self):
        """Its three arguments: a pack's worker process sends the error back to the client pickled."""
        return type(self), (str(self), self.sample, self.channel)


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
    meet, the margin kept from it for rounding on other paths (float32's, or float64's for a field that
    decodes in float64), and the item's value range over its valid pixels."""
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
    rel = MARGIN_REL64 if spec.precision == "float64" else MARGIN_REL
    return bound, rel * flat.amax(-1), rng


def check_float32_rounding(x: torch.Tensor, spec: CodecSpec, valid: torch.Tensor | None = None) -> None:
    """Raise `BoundError` naming the first item of a float64 batch whose values float32 alone rounds by more
    than its bound: the codec stores and decodes float32, so no encoding holds that bound against the
    source as given (its float32 cast's errors would be measured against the wrong values)."""
    if x.dtype != torch.float64:
        return
    bound, _, _ = item_bounds(x, spec, valid)
    err = item_max_error(x, x.to(torch.float32), valid, spec.dims)
    bad = err > bound
    if bool(bad.any()):
        j = int(bad.any(1).nonzero()[0])
        c = int(bad[j].nonzero()[0])
        raise BoundError(
            f"expected |decoded - x| <= {float(bound[j, c]):.6g} ({bound_text(spec)}) on every value. Got float64 "
            f"values in channel {c} that float32, what the codec stores, rounds by up to {float(err[j, c]):.3g} "
            "alone (loosen the bound, cast the source to float32 first if its float32 values are what is to be "
            "bounded, or keep the field exact: --field NAME=array)",
            j,
            c,
        )


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
    Items without a range (constant) keep 1 (`constant`)."""
    if spec.bound_ref is None:
        return None
    g = bound / (spec.bound_ref * rng.clamp(min=1e-300))
    return torch.where((rng > 0) & torch.isfinite(g), g.clamp(1e-6, 1e6), torch.ones_like(g))


def missing(
    err: torch.Tensor, bound: torch.Tensor, margin: torch.Tensor, exact: torch.Tensor | None = None
) -> torch.Tensor:
    """Items whose decode misses the bound less the margin. An exact decode holds any bound only where
    `exact` (B, C) says every decode path gives the same values: an item snapped onto its lattice (the snap
    computes in the side values' dtype for every output dtype, `dctdata.codec.lattice`; a float64 grid of more
    than one point always keeps the margin, `lattice._grid`). Elsewhere a float32 decode that happens
    to round onto the source's values says nothing of a float64 decode, so the margin is kept."""
    miss = err + margin > bound
    return miss if exact is None else miss & ~(exact & (err == 0))


def constant(rng: torch.Tensor) -> torch.Tensor:
    """(B, C) the items constant over their valid pixels. A relative bound is 0 there (relative to a range of
    0): as SZ3 does with a bound of 0, such an item is stored exactly, on a one-point lattice (`dctdata.codec.lattice`
    gives it one; the snap returns its value on every path), or the pack names it."""
    return rng == 0


def constant_advice(spec: CodecSpec) -> str:
    """What helps a constant item that misses its bound (the `BoundError`'s reason). A value float32 does not
    hold is named before coding (`check_float32_rounding`); one it holds decodes exactly on a lattice."""
    instead = ", or give --max-error instead of --max-rel-error" if spec.max_rel_error is not None else ""
    return (
        "a constant item: it decodes exactly only on a lattice, which this field's codec has not (no item of "
        f"the calibration subset needed one): pack with this sample in the calibration set{instead}"
    )
