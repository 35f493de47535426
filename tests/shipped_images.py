"""Images and arrays that ship inside installed packages: no download, ever.

- `sample_images`: the 8-bit photos of scikit-image and scikit-learn, exactly as the packages ship them.
- `shipped_image`, `mri_slice`, `elevation_model`, `motorcycle_disparity`: files read straight from the
  installed package's data folder (scikit-image's `skimage/data`, matplotlib's `mpl-data/sample_data`),
  never through a fetcher that could download. They are the scientific counterparts of the photos:
  a 16-bit MRI slice, a digital elevation model in metres and a stereo disparity map.
- `fmri_slices`, `fmri_volumes`, `anatomical_volume`, `functional_volumes`, `real_volumes`: nibabel's own test
  images (`nibabel/tests/data`), read by nibabel: a real 4-D fMRI run (int16, a dark background), a real
  anatomical MRI volume of odd sizes (big-endian int16) and a small functional run (int16 scaled to floats).

A test helper that the benchmarks import too (`benchmarks/__init__.py` puts tests/ on their path).
scikit-image, scikit-learn, matplotlib and nibabel come with the `bench` extra (all but nibabel with `dev` too),
not with the product; a missing one raises ModuleNotFoundError (tests that need nibabel `importorskip` it).
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


def fmri_series(slices: int = 24, volumes: int = 2, seed: int = 0) -> np.ndarray:
    """An fMRI-like int16 stand-in built from `mri_slice`: `volumes` x `slices` slices of 96 x 128 (the head's
    outline changing with depth, a small shift per slice), the same slices again in each volume with 1% more
    signal, noise on a dark (mostly zero) background: (volumes * slices, 96, 128). A time series repeats
    its slices, which one zstd stream over all of them finds and one stream per chunk does not."""
    from scipy import ndimage

    im = mri_slice().astype(np.float64) * 8
    rng = np.random.default_rng(seed)
    out = []
    for k in range(volumes * slices):
        t = (k % slices) / max(1, slices - 1)
        z = ndimage.zoom(im, 0.5 + 0.08 * np.sin(2 * np.pi * t), order=1)
        canvas = np.zeros((128, 128))
        h, w = min(128, z.shape[0]), min(128, z.shape[1])
        oy, ox = (128 - h) // 2, (128 - w) // 2
        canvas[oy : oy + h, ox : ox + w] = z[:h, :w]
        canvas = ndimage.shift(canvas, (3 * np.sin(5 * t), 2 * np.cos(3 * t)), order=1)
        sl = canvas[16:112] * (0.9 + 0.2 * t) * (1 + 0.01 * (k // slices))
        noise = rng.normal(0, 0.004 * sl.max(), sl.shape)
        out.append(np.round(np.abs(sl + np.where(sl > 0.05 * sl.max(), noise, 0.3 * noise))))
    return np.stack(out).astype(np.int16)


def mri_volume(shape: tuple[int, int, int] = (25, 41, 33)) -> np.ndarray:
    """One int16 head-like volume of an odd size from `fmri_series`' first slice: each depth a smaller copy
    where a sphere's cross-section is, on a zero background: (D, H, W)."""
    from scipy import ndimage

    d, h, w = shape
    base = fmri_series(slices=1, volumes=1)[0].astype(np.float64)
    out = []
    for k in range(d):
        r = np.sqrt(max(0.05, 1 - ((k - d / 2) / (d / 2 + 1)) ** 2))
        z = ndimage.zoom(base, (h * r / base.shape[0], w * r / base.shape[1]), order=1)[:h, :w]
        c = np.zeros((h, w))
        oy, ox = (h - z.shape[0]) // 2, (w - z.shape[1]) // 2
        c[oy : oy + z.shape[0], ox : ox + z.shape[1]] = z
        out.append(c)
    return np.round(np.stack(out)).astype(np.int16)


def nibabel_image(name: str) -> np.ndarray:
    """A NIfTI file of nibabel's test data folder as nibabel reads it: the stored integers as they are where
    the header has no scaling (in native byte order), else the scaled values in float64; axes reversed to
    C order, (t, z, y, x) for a 4-D run, (z, y, x) for a volume."""
    import nibabel

    image = nibabel.load(package_file("nibabel", "tests", "data", name))
    proxy = image.dataobj
    scaled = getattr(proxy, "slope", 1.0) not in (None, 1.0) or getattr(proxy, "inter", 0.0) not in (None, 0.0)
    a = np.asarray(image.get_fdata() if scaled else np.asanyarray(proxy))
    a = a.astype(a.dtype.newbyteorder("=")) if not scaled else a
    return np.ascontiguousarray(a.transpose(tuple(range(a.ndim))[::-1]))


def fmri_volumes() -> np.ndarray:
    """nibabel's example4d.nii.gz: a real fMRI run of 2 volumes of 24 slices of 96 x 128, int16 counts on a
    dark background (about 60% zeros): (2, 24, 96, 128)."""
    return nibabel_image("example4d.nii.gz")


def fmri_slices() -> np.ndarray:
    """The 48 slices of `fmri_volumes` (volume after volume), int16 (48, 96, 128): the 2-D set of issue 46."""
    return fmri_volumes().reshape(-1, 96, 128)


def anatomical_volume() -> np.ndarray:
    """nibabel's anatomical.nii: one real anatomical MRI volume of odd sizes, stored big-endian int16 (some
    values negative), returned native int16 (25, 41, 33)."""
    return nibabel_image("anatomical.nii")


def functional_volumes() -> np.ndarray:
    """nibabel's functional.nii: a small real functional run of 20 volumes of 3 x 21 x 17, int16 scaled by the
    header's slope and intercept, as float32 (20, 3, 21, 17)."""
    return nibabel_image("functional.nii").astype(np.float32)


def fmri_mosaic() -> np.ndarray:
    """The first volume of `fmri_volumes` as one 2-D image: its 24 slices of 96 x 128 tiled 4 rows by 6 (slice
    edges fall on 8-pixel block edges), int16 (384, 768)."""
    v = fmri_volumes()[0]
    return np.ascontiguousarray(v.reshape(4, 6, 96, 128).transpose(0, 2, 1, 3).reshape(4 * 96, 6 * 128))


def real_volumes() -> dict[str, np.ndarray]:
    """The real volumes of issue 46, name -> (N, D, H, W): the fMRI run as 2 volumes, the anatomical volume,
    the functional run's 20 small volumes."""
    return {
        "example4d": fmri_volumes(),
        "anatomical": anatomical_volume()[None],
        "functional": functional_volumes(),
    }


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
