"""Synthetic SciML-like fields for the tests and the benchmarks, as (N, 1, S, S) float32 stacks.

A thin adapter over the SciML stand-ins of `dctdata.datasets` (one generator per stand-in). `synthetic_fields`
picks the three kinds whose statistics stress a transform coder differently:
- "atoms": graphene lattice imaged with Poisson (shot) noise and dead pixels (an electron micrograph);
- "beam": a speckled laser beam, 16-bit camera counts (optics);
- "clouds": the 3.7 um brightness-temperature channel of an SLSTR-like scene, ~220-310 K (huge
  offset, small detail: PSNR against each item's range is demanding).

`micrographs` gives the em stand-in's noisy micrographs as 8-bit-like counts, the loader benchmarks' data.
A test helper that the benchmarks import too (`benchmarks/__init__.py` puts tests/ on their path).
"""

from __future__ import annotations

import numpy as np

from dctdata.datasets.em import lattice_field, noisy_observation
from dctdata.datasets.optics import speckle_beam
from dctdata.datasets.slstr import cloud_field
from dctdata.errors import DctDataError

KINDS = ("atoms", "beam", "clouds")


def _atoms(rng: np.random.Generator, s: int) -> np.ndarray:
    clean = lattice_field(rng, s)
    return noisy_observation(rng, clean, dose=float(rng.uniform(20.0, 200.0)))


def _beam(rng: np.random.Generator, s: int) -> np.ndarray:
    return speckle_beam(rng, (s, s))


def _clouds(rng: np.random.Generator, s: int) -> np.ndarray:
    image, _mask = cloud_field(rng, s, nan_border=False)
    return image[6]


def synthetic_fields(
    n: int = 16, size: int = 128, seed: int = 0, kinds: tuple[str, ...] = KINDS
) -> dict[str, np.ndarray]:
    """kind -> float32 (n, 1, size, size). Same (n, size, seed) gives the same arrays."""
    makers = {"atoms": _atoms, "beam": _beam, "clouds": _clouds}
    out = {}
    for idx, kind in enumerate(kinds):
        if kind not in makers:
            raise DctDataError(f"kind: expected one of {KINDS}. Got {kind!r}")
        rng = np.random.default_rng([seed, idx])
        out[kind] = np.stack([np.asarray(makers[kind](rng, size), dtype=np.float32)[None] for _ in range(n)])
    return out


def micrographs(n: int, size: int, seed: int = 0) -> np.ndarray:
    """float32 (n, 1, size, size) in 0..255 (whole numbers): noisy micrographs from the em stand-in."""
    from dctdata.datasets import em_denoise

    ds = em_denoise(n=n, size=size, seed=seed)
    x = np.stack([ds[i]["noisy"] for i in range(n)]).astype(np.float64)
    lo, hi = x.min(axis=(1, 2, 3), keepdims=True), x.max(axis=(1, 2, 3), keepdims=True)
    return np.rint(255.0 * (x - lo) / np.maximum(hi - lo, 1e-12)).astype(np.float32)
