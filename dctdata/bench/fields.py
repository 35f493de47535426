"""Synthetic SciML-like fields for benchmarks and tests (numpy only, deterministic, no downloads).

Three kinds, each a float32 array (N, 1, S, S) with the value scales real data has:
- "atoms": a rotated hexagonal lattice of Gaussian atoms imaged with Poisson (shot) noise, in
  counts (an electron micrograph);
- "beam": a Gaussian laser beam with fully developed speckle and a little detector noise (optics);
- "clouds": a power-law (1/f^beta) random field around 300 K, range ~10 K (a temperature swath:
  huge offset, small range, so PSNR against the item's range is demanding).
"""

from __future__ import annotations

import numpy as np

from dctdata.errors import DctDataError

KINDS = ("atoms", "beam", "clouds")


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Periodic Gaussian blur via FFT."""
    s = img.shape[-1]
    f = np.fft.fftfreq(s)
    g = np.exp(-2 * (np.pi * sigma) ** 2 * (f[:, None] ** 2 + f[None, :] ** 2))
    return np.real(np.fft.ifft2(np.fft.fft2(img) * g))


def _atoms(rng: np.random.Generator, s: int) -> np.ndarray:
    a = rng.uniform(7.0, 12.0)  # lattice constant, pixels
    theta = rng.uniform(0, np.pi / 3)
    r = int(np.ceil(1.5 * s / a)) + 2
    i, j = np.meshgrid(np.arange(-r, r), np.arange(-r, r), indexing="ij")
    x = a * (i + 0.5 * j)
    y = a * (np.sqrt(3) / 2) * j
    c, sn = np.cos(theta), np.sin(theta)
    px = c * x - sn * y + s / 2 + rng.uniform(0, a)
    py = sn * x + c * y + s / 2 + rng.uniform(0, a)
    keep = (px >= 0) & (px < s) & (py >= 0) & (py < s)
    img = np.zeros((s, s))
    np.add.at(img, (py[keep].astype(int), px[keep].astype(int)), 1.0)
    sigma = a / rng.uniform(4.0, 6.0)
    img = _blur(img, sigma) * (2 * np.pi * sigma**2)
    dose = rng.uniform(20.0, 200.0)  # counts at an atom peak
    background = rng.uniform(0.05, 0.2)
    return rng.poisson(np.clip(img + background, 0, None) * dose).astype(np.float64)


def _beam(rng: np.random.Generator, s: int) -> np.ndarray:
    yy, xx = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    cx, cy = rng.uniform(0.35, 0.65, size=2) * s
    w = rng.uniform(0.15, 0.3) * s
    envelope = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * w**2))
    f = np.fft.fftfreq(s)
    aperture = (f[:, None] ** 2 + f[None, :] ** 2) < rng.uniform(0.04, 0.12) ** 2
    field = np.fft.ifft2(aperture * np.exp(2j * np.pi * rng.random((s, s))))
    speckle = np.abs(field) ** 2
    speckle /= speckle.mean()
    return 1000.0 * envelope * speckle + rng.normal(0, 2.0, (s, s))


def _clouds(rng: np.random.Generator, s: int) -> np.ndarray:
    f = np.fft.fftfreq(s)
    k = np.sqrt(f[:, None] ** 2 + f[None, :] ** 2)
    k[0, 0] = 1.0
    beta = rng.uniform(3.0, 4.0)  # power spectrum ~ k^-beta
    amp = k ** (-beta / 2)
    amp[0, 0] = 0.0
    field = np.real(np.fft.ifft2(amp * np.exp(2j * np.pi * rng.random((s, s)))))
    field = (field - field.mean()) / (field.max() - field.min())
    return 300.0 + rng.uniform(5.0, 15.0) * field


def synthetic_fields(n: int = 16, size: int = 128, seed: int = 0, kinds: tuple[str, ...] = KINDS) -> dict[str, np.ndarray]:
    """kind -> float32 (n, 1, size, size). Same (n, size, seed) gives the same arrays."""
    makers = {"atoms": _atoms, "beam": _beam, "clouds": _clouds}
    out = {}
    for idx, kind in enumerate(kinds):
        if kind not in makers:
            raise DctDataError(f"kind: expected one of {KINDS}. Got {kind!r}")
        rng = np.random.default_rng([seed, idx])
        out[kind] = np.stack([makers[kind](rng, size)[None] for _ in range(n)]).astype(np.float32)
    return out
