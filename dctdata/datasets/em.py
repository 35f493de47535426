"""em_graphene_sim stand-in: a graphene (honeycomb) lattice of Gaussian atoms with random spacing,
rotation and offset (`clean`), imaged with a beam profile, Poisson (shot) noise and dead pixels (`noisy`).
"""

from __future__ import annotations

import math

import numpy as np

from dctdata.datasets.base import (
    SyntheticDataset,
    as_fraction,
    as_shape,
    check_rng,
    grid,
)
from dctdata.errors import DctDataError


# em_graphene_sim -----------------------------------------------------------------------------------
def lattice_field(
    rng: np.random.Generator,
    size: int | tuple[int, int] = 256,
    spacing: float | None = None,
    angle: float | None = None,
    vacancy_rate: float = 0.004,
) -> np.ndarray:
    """A noiseless image of graphene: Gaussian atoms on a honeycomb lattice, float32 (H, W) in ~[0, 1].

    spacing: lattice constant in pixels (random 9-14); angle: rotation in radians (random); a random
    offset, a few vacancies, +-5 % atom brightness and a faint smooth background (contamination).
    Atoms are splatted as small Gaussian patches and summed with one bincount (a few ms at 256^2).
    """
    rng = check_rng(rng)
    h, w = as_shape("size", size, minimum=1)
    a = float(rng.uniform(9.0, 14.0)) if spacing is None else float(spacing)
    if not a > 1.0:
        raise DctDataError(f"spacing: expected a lattice constant > 1 pixel. Got {spacing!r}")
    theta = float(rng.uniform(0.0, math.pi / 3.0)) if angle is None else float(angle)
    sigma = a * float(rng.uniform(0.12, 0.16))
    oy, ox = rng.uniform(0.0, a, size=2)
    table = rng.uniform(0.95, 1.05, size=(64, 64)).astype(np.float32)
    table[rng.random((64, 64)) < vacancy_rate] = 0.0

    # Atom positions: lattice sites i*a1 + j*a2 (+ basis) covering the frame, rotated and shifted.
    c, s = math.cos(theta), math.sin(theta)
    a1 = np.array([c, s]) * a  # (x, y) of the lattice vectors in the image frame
    a2 = np.array([0.5 * c - math.sqrt(3.0) / 2.0 * s, 0.5 * s + math.sqrt(3.0) / 2.0 * c]) * a
    corners = np.array([[0, 0], [w, 0], [0, h], [w, h]], dtype=np.float64) - (ox, oy)
    frac = corners @ np.linalg.inv(np.stack([a1, a2]))  # corner (x, y) = f1 a1 + f2 a2
    lo, hi = np.floor(frac.min(0)) - 1, np.ceil(frac.max(0)) + 1
    i, j = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1), indexing="ij")
    sites = i.reshape(-1, 1) * a1 + j.reshape(-1, 1) * a2 + (ox, oy)
    pos = np.concatenate([sites, sites + (a1 + a2) / 3.0])  # the two atoms of the honeycomb basis
    reach = 3.5 * sigma
    keep = (pos[:, 0] > -reach) & (pos[:, 0] < w + reach) & (pos[:, 1] > -reach) & (pos[:, 1] < h + reach)
    pos = pos[keep]
    amp = rng.uniform(0.95, 1.05, size=len(pos))
    amp[rng.random(len(pos)) < vacancy_rate] = 0.0
    # Splat: each atom adds a Gaussian over its (2R+1)^2 pixel neighbourhood, accumulated by bincount.
    r = math.ceil(reach)
    off = np.arange(-r, r + 1)
    px = np.floor(pos[:, 0]).astype(np.int64)[:, None, None] + off[None, None, :]
    py = np.floor(pos[:, 1]).astype(np.int64)[:, None, None] + off[None, :, None]
    dx = (px - pos[:, 0, None, None]).astype(np.float32)
    dy = (py - pos[:, 1, None, None]).astype(np.float32)
    val = amp[:, None, None].astype(np.float32) * np.exp((dx * dx + dy * dy) * np.float32(-0.5 / (sigma * sigma)))
    ok = (px >= 0) & (px < w) & (py >= 0) & (py < h)
    out = np.bincount((py * w + px)[ok], weights=val[ok], minlength=h * w).reshape(h, w).astype(np.float32)
    y, x = grid((h, w))
    # Faint low-frequency background: a few random long-wavelength cosines.
    bg = np.zeros((h, w), dtype=np.float32)
    for _ in range(3):
        k = rng.uniform(0.5, 2.0) * 2 * math.pi / max(h, w)
        phi = rng.uniform(0.0, 2 * math.pi)
        d = rng.uniform(0.0, 2 * math.pi)
        bg += np.cos(k * (math.cos(d) * x + math.sin(d) * y) + phi).astype(np.float32)
    out = 0.85 * out + 0.05 + 0.02 * bg
    return np.clip(out, 0.0, None).astype(np.float32, copy=False)


def beam_profile(rng: np.random.Generator, size: int | tuple[int, int] = 256) -> np.ndarray:
    """Illumination: a broad, slightly elliptical Gaussian with a random centre, peak 1, float32 (H, W)."""
    rng = check_rng(rng)
    h, w = as_shape("size", size, minimum=1)
    y, x = grid((h, w))
    cy, cx = h * rng.uniform(0.3, 0.7), w * rng.uniform(0.3, 0.7)
    sy, sx = h * rng.uniform(0.6, 1.1), w * rng.uniform(0.6, 1.1)
    return np.exp(-0.5 * (((y - cy) / sy) ** 2 + ((x - cx) / sx) ** 2)).astype(np.float32)


def noisy_observation(
    rng: np.random.Generator,
    clean: np.ndarray,
    dose: float,
    beam: np.ndarray | None = None,
    dead_fraction: float = 0.001,
) -> np.ndarray:
    """What the detector records: Poisson(dose * beam * clean) / dose, dead pixels read 0. float32.

    `noisy * dose` is integer counts; where nothing is dead, mean = beam * clean and
    variance = beam * clean / dose (Poisson statistics).
    """
    rng = check_rng(rng)
    if not isinstance(clean, np.ndarray):
        raise TypeError(f"clean: expected a numpy array. Got {type(clean).__name__}")
    if not (isinstance(dose, (int, float, np.floating)) and dose > 0):
        raise DctDataError(f"dose: expected counts per unit intensity > 0. Got {dose!r}")
    dead_fraction = as_fraction("dead_fraction", dead_fraction)
    lam = clean.astype(np.float64) * dose
    if beam is not None:
        if beam.shape != clean.shape:
            raise DctDataError(f"beam: expected shape {clean.shape} (the clean image's). Got {beam.shape}")
        lam *= beam
    if (lam < 0).any() or not np.isfinite(lam).all():
        raise DctDataError(
            "clean: expected finite intensities >= 0 for Poisson noise. Got negative or non-finite values"
        )
    noisy = (rng.poisson(lam) / dose).astype(np.float32)
    if dead_fraction > 0:
        noisy[rng.random(noisy.shape) < dead_fraction] = 0.0
    return noisy


def em_pair(rng: np.random.Generator, size: int | tuple[int, int] = 256) -> tuple[np.ndarray, np.ndarray]:
    """(noisy, clean), float32 (H, W) each: one em_graphene_sim-like training pair (dose 20-100)."""
    clean = lattice_field(rng, size)
    beam = beam_profile(rng, clean.shape)
    dose = float(rng.uniform(20.0, 100.0))
    return noisy_observation(rng, clean, dose, beam=beam, dead_fraction=float(rng.uniform(0.0005, 0.002))), clean


class EMDenoise(SyntheticDataset):
    """em_graphene_sim-like pairs: `noisy`, `clean` float32 (1, H, W)."""

    kind = "em_denoise"
    fields = {"noisy": "dct", "clean": "dct"}

    def __init__(self, n: int = 64, size: int | tuple[int, int] = 256, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.size = as_shape("size", size)

    def sample(self, rng, index):
        noisy, clean = em_pair(rng, self.size)
        return {"noisy": noisy[None], "clean": clean[None]}

    def _params(self):
        return {"size": self.size}


def em_denoise(n: int = 64, size: int | tuple[int, int] = 256, seed: int = 0) -> EMDenoise:
    """`dctdata pack dctdata.datasets:em_denoise OUT`: em_graphene_sim-like pairs."""
    return EMDenoise(n=n, size=size, seed=seed)
