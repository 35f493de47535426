"""Rate-distortion points and the equal-PSNR comparison.

Every codec gives (stored bytes, dataset PSNR) points from a sweep of its knob. Settings another setting
beats (more bytes for less PSNR) are dropped; between the two remaining points that bracket a PSNR
level, log(bytes) (so log CR) is interpolated linearly in PSNR; outside the swept range the size is
unknown (NaN), never extrapolated. Ratios of compression ratios
are then summarized by geometric means over packs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import torch

from dctdata.encoder.calibrate import dataset_psnr


@dataclasses.dataclass
class Point:
    """One setting of one codec on one pack."""

    setting: str
    bytes: int | None  # every stored byte (headers, metadata); None when the setting failed
    psnr: float | None  # dataset PSNR of the reconstruction (the project's definition)
    encode_s: float = 0.0
    decode_s: float = 0.0
    note: str = ""


def pack_psnr(x: np.ndarray, reconstruction: np.ndarray) -> float:
    """The project's PSNR of a pack (N, C, H, W): per item (channel of a sample) against its own range,
    then 10 log10(1 / mean(MSE / range^2)) over items (`dctdata.encoder.calibrate.dataset_psnr`). A pack of volumes
    (N, C, D, H, W) has one item per (sample, channel) volume."""
    x, reconstruction = np.asarray(x), np.asarray(reconstruction)
    if x.ndim == 5:  # dataset_psnr's items are its last two axes: a volume's (D * H, W) view is the whole volume
        x = x.reshape(*x.shape[:2], -1, x.shape[-1])
        reconstruction = reconstruction.reshape(x.shape)
    return dataset_psnr(torch.from_numpy(x), torch.from_numpy(reconstruction))


def pareto(points: list[Point]) -> list[tuple[float, int]]:
    """(PSNR, bytes) of the settings no other setting beats (as many or fewer bytes for as much or more
    PSNR), by rising PSNR: the sizes a user of the codec can actually get, so both rise together."""
    pts = sorted(
        ((p.psnr, p.bytes) for p in points if p.bytes and p.psnr is not None and math.isfinite(p.psnr)),
        key=lambda pb: (-pb[0], pb[1]),
    )
    front: list[tuple[float, int]] = []
    for psnr, size in pts:  # from the highest PSNR down, keep a point only if it is smaller than all kept
        if not front or size < front[-1][1]:
            front.append((psnr, size))
    return front[::-1]


def bytes_at(points: list[Point], level: float) -> float:
    """Stored bytes at exactly `level` dB: log-linear in PSNR between the two Pareto points that bracket it,
    NaN outside the swept range (never extrapolated)."""
    front = pareto(points)
    for (p0, b0), (p1, b1) in itertools.pairwise(front):
        if p0 <= level <= p1:
            w = (level - p0) / (p1 - p0)
            return math.exp((1 - w) * math.log(b0) + w * math.log(b1))
    return float(front[0][1]) if len(front) == 1 and front[0][0] == level else math.nan


def cr_at(points: list[Point], raw_bytes: int, level: float) -> float:
    """Compression ratio (float32 bytes / stored bytes) at `level` dB, NaN where the sweep does not reach it."""
    b = bytes_at(points, level)
    return raw_bytes / b if math.isfinite(b) else math.nan


def best_of(values: list[float]) -> float:
    """The largest finite value (the best peer's CR), NaN if there is none."""
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else math.nan


def geomean(values: list[float]) -> float:
    """Geometric mean of the finite positive values, NaN if there are none."""
    v = [x for x in values if math.isfinite(x) and x > 0]
    return float(np.exp(np.mean(np.log(v)))) if v else math.nan
