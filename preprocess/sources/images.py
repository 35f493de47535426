"""Image folders (PNG, JPEG, TIFF; 8/16-bit, gray or colour): field `image` as (C, H, W), plus `label`
from class subfolders (sorted names, as torchvision's ImageFolder).
"""

from __future__ import annotations

import os

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.arrays import FileDirSource
from dctdata.preprocess.sources.base import Source

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")


# Image folders -----------------------------------------------------------------------------------
def check_single_frame(im, where: str) -> None:
    """A sample is one image: a multi-page TIFF (or animated PNG) is refused, not silently cut to its first
    page (which pages are samples and which are channels is the user's call)."""
    frames = getattr(im, "n_frames", 1)
    if frames > 1:
        raise DctDataError(
            f"{where}: expected a single-page image (one sample per file). Got {frames} pages (a multi-page TIFF "
            "stack: save one page per file, or pack the stack as an array, e.g. np.save('x.npy', pages))"
        )


def read_image(path: str) -> np.ndarray:
    """One image file -> (C, H, W) array in its native depth (uint8, uint16, int32 or float32)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            check_single_frame(im, path)
            im.load()
            if im.mode == "P":
                im = im.convert("RGBA" if "transparency" in im.info else "RGB")
            elif im.mode in ("1", "CMYK", "YCbCr", "LAB", "HSV"):
                im = im.convert("L" if im.mode == "1" else "RGB")
            arr = np.asarray(im)
            if im.mode.startswith("I;16"):
                arr = arr.astype(np.uint16)
            elif im.mode == "I" and arr.size and arr.min() >= 0 and arr.max() <= 65535:
                arr = arr.astype(np.uint16)  # 16-bit PNGs open as 32-bit "I"
    except Image.DecompressionBombError as exc:  # not an OSError: it would escape as a traceback
        raise DctDataError(
            f"{path}: expected an image of at most {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels (Pillow's "
            f"decompression-bomb limit; raise PIL.Image.MAX_IMAGE_PIXELS to allow it). Got {exc}"
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DctDataError(f"{path}: expected a readable PNG/JPEG/TIFF image. Got {exc}") from exc
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(np.moveaxis(arr, -1, 0))


class ImageFolderSource(Source):
    default_kinds = {"image": "dct"}

    def __init__(self, path: str, files: list[str], labels: list[int] | None, classes: list[str] | None) -> None:
        self.description = path
        self.files = files
        self.labels = labels
        self.info = {"classes": classes} if classes else {}

    def __len__(self):
        return len(self.files)

    def where(self, index):
        return self.files[index]

    def sample(self, index):
        out = {"image": read_image(self.files[index])}
        if self.labels is not None:
            out["label"] = np.asarray(self.labels[index], dtype=np.int64)
        return out


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def directory_source(path: str) -> Source:
    entries = sorted(os.listdir(path))
    files = [os.path.join(path, e) for e in entries if os.path.isfile(os.path.join(path, e))]
    arrays = [f for f in files if f.endswith((".npy", ".npz"))]
    if arrays:
        kinds = {os.path.splitext(f)[1] for f in arrays}
        if len(kinds) > 1:
            raise DctDataError(f"{path}: expected per-sample files of one kind (.npy or .npz). Got both")
        return FileDirSource(path, arrays)
    images = [f for f in files if _is_image(f)]
    subdirs = [e for e in entries if os.path.isdir(os.path.join(path, e)) and not e.startswith(".")]
    if images and subdirs:
        raise DctDataError(f"{path}: expected images either at the top level or in class subfolders. Got both")
    if images:
        return ImageFolderSource(path, images, None, None)
    files, labels = [], []
    for label, cls in enumerate(subdirs):
        for root, dirs, names in os.walk(os.path.join(path, cls)):
            dirs.sort()
            for n in sorted(names):
                if _is_image(n):
                    files.append(os.path.join(root, n))
                    labels.append(label)
    if not files:
        raise DctDataError(
            f"{path}: expected per-sample .npy/.npz files or PNG/JPEG/TIFF images (optionally in class subfolders). "
            "Got none"
        )
    return ImageFolderSource(path, files, labels, subdirs)
