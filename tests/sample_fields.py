"""Small SciML-like test data shared by the test folders (one generator, seeded), and helpers to compare packs."""

from __future__ import annotations

import os

import numpy as np

# A small labelled set split into several parts: enough to exercise parallel, resumable and remote packs.
N = 64
OPTS = {"zarr": {"shard_samples": 8}, "webdataset": {"samples_per_shard": 8}}


def smooth_fields(n: int, c: int = 1, h: int = 24, w: int = 40, seed: int = 0, offset: float = 20.0,
                  amp: float = 10.0, noise: str = "poisson") -> np.ndarray:  # fmt: skip
    """Smooth random fields (offset + amp * a product of sines) with Poisson counts (at 4 per unit) or
    Gaussian noise of std amp / 100, float32 (N, C, H, W)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    out = np.empty((n, c, h, w), np.float32)
    for i in range(n):
        for ch in range(c):
            a, b, p = rng.uniform(1, 4, 3)
            smooth = offset + amp * np.sin(a * np.pi * xx + p) * np.cos(b * np.pi * yy)
            out[i, ch] = (
                rng.poisson(smooth * 4) / 4.0 if noise == "poisson" else smooth + rng.normal(0, amp / 100, (h, w))
            )
    return out


def poisson_fields(n: int, c: int = 1, h: int = 24, w: int = 40, seed: int = 0) -> np.ndarray:
    """Smooth random fields + Poisson noise, float32 (N, C, H, W)."""
    return smooth_fields(n, c, h, w, seed)


def labelled_npz(directory) -> str:
    """N smooth 24x24 fields with noise (`image`) and their index (`label`) in an .npz."""
    rng = np.random.default_rng(0)
    y = np.linspace(0, 6, 24, dtype=np.float32)
    image = (np.sin(y)[None, :, None] * np.cos(y)[None, None, :] + 0.1 * rng.standard_normal((N, 24, 24))).astype(
        np.float32
    )
    path = os.path.join(os.fspath(directory), "d.npz")
    np.savez(path, image=image, label=np.arange(N, dtype=np.int64))
    return path


def files(root) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes): two packs are byte-identical when these are."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out
