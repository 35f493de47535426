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


def volume_stack(n: int = 8, depth: int = 4, size: int = 32, beta: float = 3.6, seed: int = 0) -> np.ndarray:
    """Synthetic volumes (N, D, size, size) float32: `depth` adjacent slices of 3-D power-law noise (spectrum
    k^-beta) around 1000 counts with Gaussian read noise of 2, depth as channels (correlated channels)."""
    rng = np.random.default_rng(seed)
    d = depth * 4
    k = np.sqrt(
        np.fft.fftfreq(d)[:, None, None] ** 2
        + np.fft.fftfreq(size)[None, :, None] ** 2
        + np.fft.rfftfreq(size)[None, None, :] ** 2
    )
    k[0, 0, 0] = 1.0
    amp = k ** (-beta / 2)
    amp[0, 0, 0] = 0.0
    out = []
    for _ in range(n):
        v = np.fft.irfftn(
            amp * (rng.standard_normal(amp.shape) + 1j * rng.standard_normal(amp.shape)), s=(d, size, size)
        )
        v = v[:depth]
        out.append(1000 + 300 * v / v.std() + rng.normal(0, 2, v.shape))
    return np.stack(out).astype(np.float32)


def dem_tiles(tile: int = 64, stride: int = 32) -> np.ndarray:
    """matplotlib's Jacksboro fault elevation model (int16 metres) cut into tiles (N, tile, tile) int16."""
    from shipped_images import elevation_model

    z = elevation_model()
    h, w = z.shape
    return np.stack(
        [z[i : i + tile, j : j + tile] for i in range(0, h - tile + 1, stride) for j in range(0, w - tile + 1, stride)]
    )
