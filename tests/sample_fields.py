"""Small SciML-like test arrays shared by the pack and webdataset tests (one generator, seeded)."""

from __future__ import annotations

import numpy as np


def poisson_fields(n: int, c: int = 1, h: int = 24, w: int = 40, seed: int = 0) -> np.ndarray:
    """Smooth random fields + Poisson noise, float32 (N, C, H, W)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    out = np.empty((n, c, h, w), np.float32)
    for i in range(n):
        for ch in range(c):
            a, b, p = rng.uniform(1, 4, 3)
            smooth = 20 + 10 * np.sin(a * np.pi * xx + p) * np.cos(b * np.pi * yy)
            out[i, ch] = rng.poisson(smooth * 4) / 4.0
    return out
