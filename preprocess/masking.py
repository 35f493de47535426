"""Masked data at pack time: which pixels of a `dct` field are valid, and what goes in the others.

Policies (`--nan`, `dctdata.pack(nan=...)`):
- `error` (default): a non-finite value in a dct field is an error naming the sample and field.
- `mask`: non-finite values are invalid pixels. They are filled (below) before encoding, and the
  validity mask is stored exactly as the automatic `array` field `<field>_valid` (bool, the field's
  (C, H, W)), returned with every sample.
- `fill=V`: invalid pixels get the constant V and no mask is stored (kept for old commands; a V far
  outside the data's range costs bits and, before format version 2, made the reported PSNR
  meaningless).
An explicit mask (`--valid FIELD=MASKFIELD`, `valid={"field": "mask"}`) names a source field
(bool/integers, nonzero = valid, broadcastable to (C, H, W)) instead; it is stored as it is.

Every error figure of a masked field counts valid pixels only, against the valid range
(`dctdata.codec.metrics`, `valid=`), per channel.

The fill (`fill_invalid`) is a pull-push pyramid (Gortler et al., "The Lumigraph", 1996): valid values
are averaged down a 2x pyramid (weighted by how many valid pixels each coarse pixel covers), then
the holes are filled back up with bilinear interpolation of the coarser level, blended by those
weights. Why this fill: the DCT codes smooth blocks in a few coefficients, so a hole that continues
its valid neighbours smoothly costs few bits, while a constant far from the data makes an edge at
every swath border (the old `fill=0` next to 290 K temperatures). Each filled value is a convex
combination of the item's valid values, so the fill never leaves the item's valid range: a
calibration that sees the filled data sees the right range. O(pixels) per item, in torch; scipy
(not a dependency) has no pyramid fill, and its `griddata` is O(n log n) per item with a Delaunay step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from dctdata.errors import DctDataError
from dctdata.settings import NAN_MODES, NanPolicy, parse_nan  # noqa: F401 (the policy is a pack setting)

VALID_SUFFIX = "_valid"


def valid_name(field: str) -> str:
    """Name of the automatic mask field of a dct field packed with nan='mask'."""
    return field + VALID_SUFFIX


def check_items_have_valid(valid: np.ndarray, name: str, where) -> None:
    """Every item (channel of a sample) needs a valid pixel: there is nothing to measure or fill from otherwise."""
    b, c = valid.shape[:2]
    has = valid.reshape(b, c, -1).any(-1)
    if not has.all():
        j, ch = (int(v) for v in np.argwhere(~has)[0])
        raise DctDataError(
            f"{where(j)}: field {name!r} channel {ch}: expected at least one valid (finite, unmasked) pixel. Got none "
            "(an all-NaN or fully masked channel: drop the sample or fix the mask)"
        )


def fill_invalid(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """x (B, C, H, W) (or volumes (B, C, D, H, W)) with its invalid pixels replaced by the pull-push fill of
    the valid ones (see the module docstring; a volume's pyramid halves all three axes). Valid pixels are kept
    bit-exactly; every item needs at least one valid pixel."""
    valid = np.broadcast_to(valid, x.shape)
    if valid.all():
        return x
    b, c, *size = x.shape
    flat_valid = valid.reshape(b * c, *size)
    todo = np.flatnonzero(~flat_valid.reshape(b * c, -1).all(-1))  # only items with holes
    out = np.array(x, dtype=np.float32, copy=True).reshape(b * c, *size)
    v = torch.from_numpy(np.ascontiguousarray(flat_valid[todo]))[:, None]
    vals = torch.from_numpy(np.where(flat_valid[todo], out[todo], 0).astype(np.float64))[:, None]
    filled = _pull_push(vals, v.to(torch.float64))
    out[todo] = np.where(flat_valid[todo], out[todo], filled[:, 0].numpy().astype(np.float32))
    return out.reshape(b, c, *size)


def _pull_push(vals: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """vals (M, 1, H, W) or (M, 1, D, H, W) (0 where weight is 0), weight in [0, 1]: every pixel gets a value."""
    volume = vals.dim() == 5
    pool, mode = (F.avg_pool3d, "trilinear") if volume else (F.avg_pool2d, "bilinear")
    levels = [(vals, weight)]
    while max(vals.shape[2:]) > 1:
        # a volume's axis already at 1 stays (avg_pool3d refuses a window past an axis of 1; avg_pool2d takes it)
        kernel = tuple(2 if n > 1 else 1 for n in vals.shape[2:]) if volume else (2, 2)
        children = math.prod(kernel)
        s = pool(vals * weight, kernel, ceil_mode=True)
        wsum = pool(weight, kernel, ceil_mode=True)
        vals = torch.where(wsum > 0, s / wsum.clamp(min=1e-300), torch.zeros_like(s))
        weight = (children * wsum).clamp(max=1.0)  # a coarse pixel with one fully valid child is fully known
        levels.append((vals, weight))
    filled = levels[-1][0]
    for vals, weight in reversed(levels[:-1]):
        up = F.interpolate(filled, size=vals.shape[2:], mode=mode, align_corners=False)
        filled = weight * vals + (1 - weight) * up
    return filled
