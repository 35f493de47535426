"""Value lattices of a bounded field (`CodecSpec.lattice`): items whose values all lie on a grid
origin + k * step, snapped back onto it after decoding, so a bound below half the grid's spacing costs
no more than half the spacing.

Detector counts divided by a dose, ADC readings times a scale factor, integer images: many scientific
sources take a few dozen to a few thousand distinct values, evenly spaced. A pointwise bound finer than
half their spacing (1e-4 of the range on shot-noise micrographs of a hundred counts) forces a transform
coder to spend bits on noise it cannot predict, while a codec that knows the spacing stores the values
exactly. With a lattice the encoder codes such an item to within half the spacing (less a margin) instead
of its bound, and the decoder rounds every value to the nearest grid point: the grid point of the source
value, which is within the bound of it (checked when packing).

Stored form: with `lattice`, C rows (step, origin) per sample follow everything else in its side values
(after the (range, mid) rows and the correction rows), in the side values' dtype (float32; float64 for a
float64 source's field, `CodecSpec.precision`, snapped in float64), in the field's units; step 0 leaves the
item as decoded (an item not on a grid, or one whose bound is already wider than the grid's half spacing).

The decoder (`snap`) is elementwise torch ops (sub, div, round, mul, add, where), so `Decompress` stays
portable (torch.export, ONNX Round, CUDA after the fused kernel). It snaps after the corrections: they
bring a value within the room the encoder kept, which leaves half the spacing less two float32 margins
between it and any other grid point, so a decode on another device snaps to the same point.

Hand-written: the grid is found and applied around this codec's own decoder; no library offers it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dctdata.errors import IntegrityError

# a grid is used only where half its spacing (less the margins) is at least this times the bound: below it
# the bits saved do not pay for the snap's stored rows and a second decode at pack time
WORTH = 1.25
# at most this many distinct values per item are searched for a grid (a larger set is rarely a grid whose
# half spacing beats a bound worth packing with; and it keeps detection cheap)
MAX_LEVELS = 1 << 16


def split(side: torch.Tensor, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the side rows before the lattice rows, the lattice rows (..., C, 2)) of a side tensor with them."""
    return side[..., :-channels, :], side[..., -channels:, :]


def check(rows: torch.Tensor, indices: Sequence[int] | None = None, where: str = "field") -> None:
    """Raise `IntegrityError` naming the sample unless every lattice row (N, C, 2) is finite with a step >= 0."""
    check_deferred(rows, indices, where)()


def check_deferred(
    rows: torch.Tensor, indices: Sequence[int] | None = None, where: str = "field"
) -> Callable[[], None]:
    """`check` in two halves (as `dctdata.decoder.corrections.check_deferred`): the test is queued on the rows' device
    now, the returned function reads its verdict and raises."""
    bad = (~torch.isfinite(rows).flatten(1).all(1)) | (rows[..., 0] < 0).any(1)

    def verdict() -> None:
        found = bad.cpu()
        if bool(found.any()):
            j = int(found.nonzero()[0])
            name = f"sample {j} of the batch" if indices is None else f"sample {indices[j]}"
            got = rows[j].tolist()
            raise IntegrityError(f"{where}: {name}: lattice: expected finite rows with a step >= 0. Got {got}")

    return verdict


def snap(
    img: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor | None = None, shift: torch.Tensor | None = None
) -> torch.Tensor:
    """img (B, C, *size) with each item's values rounded to its grid origin + k * step (rows (B, C, 2), in
    the field's units; step 0: left as is). scale, shift (C,): the layer's normalization x * scale + shift
    (img is normalized; the grid is mapped the same way), or None.

    Computed in the rows' dtype for every output dtype, then cast: float32 rows (a float32 decode) give float32
    grid points (the values of a float32 source, and what the encoder checked; a float64 snap would land up to
    half a float32 ulp beside them, past a bound the exact float32 values hold, `dctdata.encoder.bounds.missing`);
    float64 rows (a float64 source's field, `CodecSpec.precision`) give its float64 grid points."""
    at = (...,) + (None,) * (img.dim() - 2)
    calc = torch.float64 if rows.dtype == torch.float64 else torch.float32
    work = img if img.dtype == calc else img.to(calc)
    step = rows[..., 0].to(calc)
    origin = rows[..., 1].to(calc)
    if scale is not None and shift is not None:
        scale, shift = scale.to(calc).reshape(-1), shift.to(calc).reshape(-1)
        step, origin = step * scale, origin * scale + shift
    on = step > 0
    s = torch.where(on, step, torch.ones_like(step))[at]
    o = origin[at]
    snapped = torch.round((work - o) / s) * s + o
    return torch.where(on[at], snapped.to(img.dtype), img)


def detect(
    x: torch.Tensor,
    valid: torch.Tensor | None,
    bound: torch.Tensor,
    margin: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows (B, C, 2) in `dtype`, the bound each item's decode must meet before the snap (B, C) float64) of
    samples x (B, C, *size) with their bounds and float32 margins (B, C). An item gets a grid (step > 0)
    when all its valid values lie on one (each snaps, in float32 as `snap` computes it, to within its bound
    less the margin) and half the spacing, less two margins and the values' own distance from the grid,
    is at least WORTH times its bound; that distance is the bound it keeps before the snap (the encoder
    subtracts the margin once more). Others keep step 0 and their own bound. `dtype`: the side values' (float64
    for a field that decodes in float64: float64 grid points, snapped in float64)."""
    b, c = x.shape[:2]
    rows = torch.zeros(b, c, 2, dtype=dtype)
    eff = bound.clone()
    flat = x.detach().to(torch.float64).reshape(b, c, -1)  # the source as given (a float64 one's own values)
    mask = None if valid is None else torch.broadcast_to(valid, x.shape).reshape(b, c, -1)
    for i in range(b):
        for ch in range(c):
            v = flat[i, ch] if mask is None else flat[i, ch][mask[i, ch]]
            found = _grid(v, float(bound[i, ch]), float(margin[i, ch]), dtype == torch.float64)
            if found is not None:
                step, origin, room = found
                rows[i, ch, 0], rows[i, ch, 1], eff[i, ch] = step, origin, room
    return rows, eff


def _point(value: float, bound: float, margin: float, f64: bool = False) -> tuple[float, float, float] | None:
    """(step, origin, bound before the snap) of a constant item whose bound no decode holds but an exact one (a
    relative bound: 0 on a constant item), else None: a one-point grid at its value, with a step of the value's
    own magnitude (at least 1), so a decode within a few float32 ulps of it snaps to it on every path. None
    where float32 does not hold the value (a float64 source's, unless `f64`: float64 rows hold it): no decode
    is exact there. The snap gives round(0) * step + origin = origin, exact in either arithmetic."""
    if bound > margin:  # the item's decode holds its bound without a grid
        return None
    kind = np.float64 if f64 else np.float32
    origin = kind(value)
    if float(origin) != value or not np.isfinite(origin):
        return None
    step = kind(max(abs(float(origin)), 1.0))
    room = float(step) / 2 - margin
    return float(step), float(origin), room


def _grid(v: torch.Tensor, bound: float, margin: float, f64: bool = False) -> tuple[float, float, float] | None:
    """(step, origin, bound before the snap) of the values v (float64: the source's values as given) when
    they lie on a grid worth snapping to, else None. The grid points are float32 numbers: a float64 value
    float32 does not hold is that far from its point, counted in the deviation like any other.

    The grid points must hold the bound less the margin, like any decode, unless they are the values
    themselves: an exact decode holds any bound (`dctdata.encoder.bounds.missing`), even one below the float32
    margin (integers of a small range on a large offset, at a tight relative bound). The snap's last two
    operations are checked both as float32 multiply then add (torch, ONNX Runtime) and as one fused
    multiply-add (a compiler may contract them): the two can land one float32 step apart, and either
    holds the bound.

    With `f64` (a field that decodes in float64) the grid points are float64 numbers, snapped in float64; a
    float64 multiply-add and a fused one differ by an ulp, which the float64 margin covers, so the grid
    points must hold the bound less the margin even where they are the values themselves (only a one-point
    grid, `_point`, is exact on every path)."""
    if not v.numel() or not bool(torch.isfinite(v).all()):
        return None
    u = np.unique(v.numpy().astype(np.float64))
    if len(u) == 1:
        return _point(float(u[0]), bound, margin, f64)
    if len(u) > MAX_LEVELS:
        return None
    d = np.diff(u)
    q0 = float(d.min())
    if not 2 * q0 > WORTH * 2 * bound:  # even the closest pair is within the bound: no grid beats it
        return None
    k = np.round((u - u[0]) / q0)
    if np.abs((u - u[0]) / q0 - k).max() > 0.25:  # not multiples of the closest spacing
        return None
    if f64:
        return _grid64(u, k, bound, margin)
    step = np.float32(np.dot(k, u - u[0]) / np.dot(k, k))  # least squares over the levels: no drift at large k
    origin = np.float32(u[0])
    s, o = torch.tensor(step), torch.tensor(origin)
    u32 = torch.from_numpy(u.astype(np.float32))
    snapped = (torch.round((u32 - o) / s) * s + o).double()
    if not torch.equal(torch.round((u32 - o) / s).double(), torch.from_numpy(k)):
        return None
    fused = (k * np.float64(step) + np.float64(origin)).astype(np.float32).astype(np.float64)  # one rounding
    dev = max(float(np.abs(snapped.numpy() - u).max()), float(np.abs(fused - u).max()))
    if dev > 0 and dev + margin > bound:  # the grid points themselves would miss the bound
        return None
    room = float(step) / 2 - margin - dev
    if room < WORTH * bound:
        return None
    return float(step), float(origin), room


def _grid64(
    u: np.ndarray[Any, Any], k: np.ndarray[Any, Any], bound: float, margin: float
) -> tuple[float, float, float] | None:
    """`_grid`'s float64 grid of the distinct values u (their multiples k of the closest spacing): step and
    origin as float64 numbers, the snap `round((u - o) / s) * s + o` simulated in float64."""
    step = float(np.dot(k, u - u[0]) / np.dot(k, k))
    origin = float(u[0])
    s, o = torch.tensor(step, dtype=torch.float64), torch.tensor(origin, dtype=torch.float64)
    t = torch.from_numpy(u)
    levels = torch.round((t - o) / s)
    if not torch.equal(levels, torch.from_numpy(k)):
        return None
    dev = float((levels * s + o - t).abs().max())
    if dev + margin > bound:  # the grid points themselves would miss the bound
        return None
    room = step / 2 - margin - dev
    if room < WORTH * bound:
        return None
    return step, origin, room
