"""optical_damage stand-in: a speckled laser beam as 16-bit camera counts (492 x 656, deliberately not
a multiple of 8); damaged frames have dark spots with diffraction rings (`label` 1).
"""

from __future__ import annotations

import math

import numpy as np

from dctdata.datasets.base import (
    SyntheticDataset,
    as_fraction,
    as_int,
    as_shape,
    check_rng,
    grid,
)

OPTICAL_SHAPE = (492, 656)


# optical_damage ------------------------------------------------------------------------------------
def _fft_size(n: int) -> int:
    """Smallest m >= n whose prime factors are 2, 3, 5, 7."""
    m = n
    while True:
        k = m
        for p in (2, 3, 5, 7):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


def speckle_beam(
    rng: np.random.Generator,
    shape: int | tuple[int, int] = OPTICAL_SHAPE,
    damage_spots: int = 0,
    peak: float | None = None,
) -> np.ndarray:
    """A camera frame of a laser beam, uint16 (H, W): super-Gaussian beam x speckle x faint fringes.

    Speckle is |FFT(aperture x circular Gaussian)|^2 (fully developed: exponential statistics) mixed with a
    uniform part (contrast 0.3-0.7). `damage_spots` dark sites with Fresnel-like rings are multiplied
    in. Counts: dark level ~200, peak 20k-50k (or `peak`), shot and read noise, clipped to 0..65535.
    """
    rng = check_rng(rng)
    h, w = as_shape("shape", shape, minimum=8)
    damage_spots = as_int("damage_spots", damage_spots, 0)
    y, x = grid((h, w))
    # Beam: super-Gaussian (order 1 = Gaussian, up to a soft flat top), random centre and waist.
    cy, cx = h * rng.uniform(0.4, 0.6), w * rng.uniform(0.4, 0.6)
    wy, wx = h * rng.uniform(0.22, 0.35), w * rng.uniform(0.22, 0.35)
    order = rng.uniform(1.0, 2.5)
    beam = np.exp(-((((y - cy) / wy) ** 2 + ((x - cx) / wx) ** 2) ** order))
    # Speckle: grain ~ H / aperture diameter, 3-8 pixels.
    # Computed on a 2^a 3^b 5^c 7^d grid (FFT-friendly) and cropped: 492 = 4 * 3 * 41 is slow to FFT.
    fh, fw = _fft_size(h), _fft_size(w)
    fy = np.fft.fftfreq(fh).astype(np.float32)[:, None]
    fx = np.fft.fftfreq(fw).astype(np.float32)[None, :]
    radius = 1.0 / rng.uniform(6.0, 16.0)
    iy, ix = np.nonzero((fy * fy + fx * fx) < radius * radius)
    spectrum = np.zeros((fh, fw), dtype=np.complex64)  # circular Gaussian field inside the aperture only
    g = rng.standard_normal((len(iy), 2), dtype=np.float32)
    spectrum[iy, ix] = g[:, 0] + 1j * g[:, 1]
    field = np.fft.ifft2(spectrum)[:h, :w]
    speckle = (field.real**2 + field.imag**2).astype(np.float32)
    speckle /= speckle.mean()
    contrast = rng.uniform(0.3, 0.7)
    img = beam * ((1 - contrast) + contrast * speckle)
    # Fringes from the optics in the path: a few percent, random period and direction.
    d, period, depth = rng.uniform(0, np.pi), rng.uniform(20.0, 60.0), rng.uniform(0.02, 0.06)
    kx, ky = 2 * math.pi * math.cos(d) / period, 2 * math.pi * math.sin(d) / period
    # cos(kx x + ky y) = cos cos - sin sin: separable, so only 1-D trigonometry.
    img *= 1.0 + depth * (np.cos(kx * x) * np.cos(ky * y) - np.sin(kx * x) * np.sin(ky * y))
    for _ in range(damage_spots):
        sy, sx = rng.uniform(cy - 1.2 * wy, cy + 1.2 * wy), rng.uniform(cx - 1.2 * wx, cx + 1.2 * wx)
        s = rng.uniform(3.0, 12.0)
        depth, ring, chirp = rng.uniform(0.5, 0.95), rng.uniform(0.15, 0.35), rng.uniform(0.8, 1.6)
        # Only a window of +-8 spot radii is touched (the rings have died out beyond it).
        y0, y1 = max(int(sy - 8 * s), 0), min(int(sy + 8 * s) + 1, h)
        x0, x1 = max(int(sx - 8 * s), 0), min(int(sx + 8 * s) + 1, w)
        if y0 >= y1 or x0 >= x1:
            continue
        r2 = ((y[y0:y1] - sy) ** 2 + (x[:, x0:x1] - sx) ** 2) / (s * s)
        spot = 1.0 - depth * np.exp(-0.5 * r2) + ring * np.cos(chirp * r2) * np.exp(-r2 / 12.0)
        img[y0:y1, x0:x1] *= np.clip(spot, 0.0, None)
    top = rng.uniform(20000.0, 50000.0) if peak is None else float(peak)
    counts = 200.0 + img * np.float32(top / max(float(img.max()), 1e-12))
    # Shot noise (variance = counts) and read noise (8 counts rms) in one Gaussian draw.
    counts += rng.standard_normal((h, w), dtype=np.float32) * np.sqrt(counts + 64.0)
    return np.clip(np.rint(counts), 0, 65535).astype(np.uint16)


class OpticalDamage(SyntheticDataset):
    """optical_damage-like frames: `image` uint16 (1, H, W), `label` int64 (1 = damaged)."""

    kind = "optical_damage"
    fields = {"image": "dct", "label": "label"}

    def __init__(
        self, n: int = 32, shape: int | tuple[int, int] = OPTICAL_SHAPE, seed: int = 0, damaged: float = 0.5
    ) -> None:
        super().__init__(n, seed)
        self.shape = as_shape("shape", shape)
        self.damaged = as_fraction("damaged", damaged)

    def sample(self, rng, index):
        bad = bool(rng.random() < self.damaged)
        spots = int(rng.integers(1, 5)) if bad else 0
        return {
            "image": speckle_beam(rng, self.shape, damage_spots=spots)[None],
            "label": np.asarray(int(bad), dtype=np.int64),
        }

    def _params(self):
        return {"shape": self.shape, "damaged": self.damaged}


def optical_damage(
    n: int = 32, shape: int | tuple[int, int] = OPTICAL_SHAPE, seed: int = 0, damaged: float = 0.5
) -> OpticalDamage:
    """`dctdata pack dctdata.datasets:optical_damage OUT --field image=dct`."""
    return OpticalDamage(n=n, shape=shape, seed=seed, damaged=damaged)
