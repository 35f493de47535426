"""Photos that ship inside installed packages (scikit-image, scikit-learn): no download, ever.

Used by the benchmarks and tests as the 8-bit photo counterpart of the synthetic fields. scikit-image
and scikit-learn come with the `bench` and `dev` extras, not with the product.
"""

from __future__ import annotations

import numpy as np

SKIMAGE_NAMES = ("camera", "astronaut", "coffee", "chelsea", "coins")


def sample_images(names: tuple[str, ...] = SKIMAGE_NAMES, include_sklearn: bool = True) -> dict[str, np.ndarray]:
    """name -> uint8 array (H, W) or (H, W, 3), exactly as the packages ship them."""
    import skimage.data

    images = {name: np.asarray(getattr(skimage.data, name)()) for name in names}
    if include_sklearn:
        try:
            from sklearn.datasets import load_sample_images
        except ImportError:  # scikit-learn is optional outside the dev extra
            return images
        data = load_sample_images()
        for fname, img in zip(data.filenames, data.images):
            images[fname.rsplit("/", 1)[-1].removesuffix(".jpg")] = np.asarray(img)
    return images


def to_chw_float(img: np.ndarray) -> np.ndarray:
    """uint8 (H, W[, 3]) -> float32 (C, H, W) in [0, 1]."""
    x = np.asarray(img, dtype=np.float32) / 255.0
    return x[None] if x.ndim == 2 else np.ascontiguousarray(x.transpose(2, 0, 1))
