"""CIFAR-10-like stand-in: uint8 (3, 32, 32) images whose class sets shape, texture and (loosely) colour."""

from __future__ import annotations

import numpy as np

from dctdata.datasets.base import SyntheticDataset, as_int, check_rng, grid
from dctdata.errors import DctDataError

CIFAR_CLASSES = ("disc", "square", "triangle", "ring", "cross", "hstripes", "vstripes", "checker", "diagonal", "blobs")

# CIFAR-like ---------------------------------------------------------------------------------------
_CLASS_HUES = np.array([0.0, 0.33, 0.62, 0.15, 0.85, 0.5, 0.08, 0.75, 0.0, 0.05])


def _hsv_to_rgb(hue: float, sat: float, val: float) -> np.ndarray:
    k = (np.array([5.0, 3.0, 1.0]) + hue * 6.0) % 6.0
    return val - val * sat * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def cifar_image(rng: np.random.Generator, label: int) -> np.ndarray:
    """A 32 x 32 RGB uint8 image (3, 32, 32) of class `label` (0..9, see CIFAR_CLASSES).

    The class fixes the shape or texture and biases the foreground hue (+-0.1, wide on purpose);
    position, scale, rotation of textures, background gradient and pixel noise are random, so a
    convnet learns it well and a nearest-class-mean on pixels clearly beats chance but not by much.
    """
    rng = check_rng(rng)
    label = as_int("label", label, 0)
    if label >= len(CIFAR_CLASSES):
        raise DctDataError(f"label: expected a class in 0..{len(CIFAR_CLASSES) - 1}. Got {label}")
    n = 32
    y, x = grid((n, n))
    cy, cx = rng.uniform(10, 22, size=2)
    r = rng.uniform(6.0, 11.0)
    dy, dx = (y - cy) / r, (x - cx) / r
    rad = np.sqrt(dy * dy + dx * dx)
    period = rng.uniform(3.0, 6.0)
    ph = rng.uniform(0, 2 * np.pi)
    if label == 0:  # disc
        m = rad < 1.0
    elif label == 1:  # square
        m = np.maximum(np.abs(dy), np.abs(dx)) < 0.85
    elif label == 2:  # triangle (pointing up)
        m = (dy < 0.7) & (np.abs(dx) < (dy + 0.9) / 1.6)
    elif label == 3:  # ring
        m = (rad < 1.0) & (rad > 0.55)
    elif label == 4:  # plus
        m = ((np.abs(dy) < 0.28) & (np.abs(dx) < 1.0)) | ((np.abs(dx) < 0.28) & (np.abs(dy) < 1.0))
    elif label == 5:  # horizontal stripes
        m = np.broadcast_to(np.cos(2 * np.pi * y / period + ph) > 0, (n, n))
    elif label == 6:  # vertical stripes
        m = np.broadcast_to(np.cos(2 * np.pi * x / period + ph) > 0, (n, n))
    elif label == 7:  # checkerboard
        m = np.cos(2 * np.pi * y / period + ph) * np.cos(2 * np.pi * x / period) > 0
    elif label == 8:  # diagonal bar
        sgn = 1.0 if rng.random() < 0.5 else -1.0
        m = (np.abs(dy - sgn * dx) < 0.35) & (rad < 1.4)
    else:  # two blobs
        oy, ox = rng.uniform(-1, 1, 2) * 0.6
        m = (((dy - oy) ** 2 + (dx - ox) ** 2) < 0.2) | (((dy + oy) ** 2 + (dx + ox) ** 2) < 0.2)
    m = np.broadcast_to(m, (n, n)).astype(np.float32)
    fg = _hsv_to_rgb((_CLASS_HUES[label] + rng.normal(0.0, 0.1)) % 1.0, rng.uniform(0.5, 1.0), rng.uniform(0.6, 1.0))
    bg0 = _hsv_to_rgb(rng.random(), rng.uniform(0.0, 0.5), rng.uniform(0.1, 0.6))
    bg1 = _hsv_to_rgb(rng.random(), rng.uniform(0.0, 0.5), rng.uniform(0.1, 0.6))
    t = np.clip(
        (np.cos(rng.uniform(0, 2 * np.pi)) * (x - 16) + np.sin(rng.uniform(0, 2 * np.pi)) * (y - 16)) / 32 + 0.5, 0, 1
    )
    bg = bg0[:, None, None] * (1 - t) + bg1[:, None, None] * t
    img = bg * (1 - m) + fg[:, None, None] * m + rng.normal(0.0, 0.04, (3, n, n))
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


class CifarLike(SyntheticDataset):
    """CIFAR-10-like: `image` uint8 (3, 32, 32), `label` int64; classes balanced (label = index % 10)."""

    kind = "cifar_like"
    fields = {"image": "dct", "label": "label"}
    classes = CIFAR_CLASSES

    def __init__(self, n: int = 1000, seed: int = 0) -> None:
        super().__init__(n, seed)

    def sample(self, rng, index):
        label = index % len(CIFAR_CLASSES)
        return {"image": cifar_image(rng, label), "label": np.asarray(label, dtype=np.int64)}


def cifar_like(n: int = 1000, seed: int = 0) -> CifarLike:
    """`dctdata pack dctdata.datasets:cifar_like OUT --field image=dct`."""
    return CifarLike(n=n, seed=seed)
