"""Images and arrays that ship inside installed packages: no download, ever.

- `sample_images`: the 8-bit photos of scikit-image and scikit-learn, exactly as the packages ship them.
- `shipped_image`, `mri_slice`, `elevation_model`, `motorcycle_disparity`: files read straight from the
  installed package's data folder (scikit-image's `skimage/data`, matplotlib's `mpl-data/sample_data`),
  never through a fetcher that could download. They are the scientific counterparts of the photos:
  a 16-bit MRI slice, a digital elevation model in metres and a stereo disparity map.

Used by the benchmarks and tests. scikit-image, scikit-learn and matplotlib come with the `bench` and
`dev` extras, not with the product; a missing one raises ModuleNotFoundError.
"""

from __future__ import annotations

import gzip
import importlib
import os

import numpy as np

from dctdata.errors import DctDataError

SKIMAGE_NAMES = ("camera", "astronaut", "coffee", "chelsea", "coins")


def sample_images(names: tuple[str, ...] = SKIMAGE_NAMES, include_sklearn: bool = True) -> dict[str, np.ndarray]:
    """name -> uint8 array (H, W) or (H, W, 3), exactly as the packages ship them."""
    import skimage.data

    images = {name: np.asarray(getattr(skimage.data, name)()) for name in names}
    if include_sklearn:
        try:
            images.update(sklearn_images())
        except ImportError:  # scikit-learn is optional outside the dev extra
            pass
    return images


def sklearn_images() -> dict[str, np.ndarray]:
    """scikit-learn's two sample photos ("china", "flower"): uint8 (H, W, 3)."""
    from sklearn.datasets import load_sample_images

    data = load_sample_images()
    return {
        os.path.basename(fname).removesuffix(".jpg"): np.asarray(img) for fname, img in zip(data.filenames, data.images)
    }


def package_file(package: str, *parts: str) -> str:
    """Path of a data file inside an installed package (ModuleNotFoundError if the package is not)."""
    module = importlib.import_module(package)
    path = os.path.join(os.path.dirname(module.__file__), *parts)
    if not os.path.isfile(path):
        raise DctDataError(f"{path}: expected a data file shipped with {package}. Got no such file")
    return path


def shipped_image(name: str) -> np.ndarray:
    """An image file of scikit-image's data folder (e.g. "moon.png"), decoded by Pillow: uint8 (H, W[, 3])."""
    from PIL import Image

    with Image.open(package_file("skimage", "data", name)) as img:
        return np.asarray(img)


def _mpl_sample(name: str) -> str:
    return package_file("matplotlib", "mpl-data", "sample_data", name)


def mri_slice() -> np.ndarray:
    """matplotlib's s1045.ima.gz: one 256x256 MRI slice, big-endian 16-bit counts -> uint16 (256, 256)."""
    with gzip.open(_mpl_sample("s1045.ima.gz")) as f:
        raw = f.read()
    return np.frombuffer(raw, ">u2").reshape(256, 256).astype(np.uint16)


def elevation_model() -> np.ndarray:
    """matplotlib's Jacksboro fault DEM: elevations in metres, int16 (344, 403)."""
    with np.load(_mpl_sample("jacksboro_fault_dem.npz"), allow_pickle=False) as data:
        return np.asarray(data["elevation"])


def motorcycle_disparity() -> np.ndarray:
    """scikit-image's Middlebury motorcycle disparity map, float32 (500, 741). About 7% of the pixels are
    unknown (inf); they are set to the smallest known disparity (background), so the map is finite."""
    with np.load(package_file("skimage", "data", "motorcycle_disp.npz"), allow_pickle=False) as data:
        d = np.asarray(data["arr_0"], dtype=np.float32)
    known = np.isfinite(d)
    return np.where(known, d, d[known].min()).astype(np.float32)


def to_chw_float(img: np.ndarray) -> np.ndarray:
    """uint8 (H, W[, 3]) -> float32 (C, H, W) in [0, 1]."""
    x = np.asarray(img, dtype=np.float32) / 255.0
    return x[None] if x.ndim == 2 else np.ascontiguousarray(x.transpose(2, 0, 1))
