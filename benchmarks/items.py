"""The rate-distortion bench's items and packs: arrays that ship inside installed packages, plus the
synthetic SciML stand-ins of `dctdata.datasets`; nothing is downloaded. "fmri" is nibabel's real fMRI run
(example4d.nii.gz, its first volume's 24 slices as one 384 x 768 int16 mosaic; skipped without nibabel).

An item is one array (C, H, W) in float32 holding its original values (counts, metres, 0..255). Each
item becomes up to two packs: "tiles" (a deterministic grid of 60x76 tiles, at most `max_tiles` of
them, evenly spaced: many small samples, where per-pack metadata and per-sample headers weigh most) and
"whole" (the item as one sample).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from dctdata.errors import DctDataError
from dctdata.parse import parse_choice

TILE = (60, 76)
MAX_TILES = 48
MODES = ("tiles", "whole")


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    group: str  # sci | photo | rgb | multi: what kind of data it is (shown per pack)
    x: np.ndarray  # float32 (C, H, W), original values
    u8: bool  # an 8-bit source: JPEG and JPEG 2000 can code it natively


@dataclasses.dataclass(frozen=True)
class Pack:
    """One dataset the codecs compress: (N, C, H, W) float32 samples cut from one item."""

    item: Item
    mode: str
    x: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.item.name}/{self.mode}"

    @property
    def raw_bytes(self) -> int:
        """The float32 size, the numerator of every compression ratio."""
        return int(self.x.size) * 4


def _u8(loader: Callable[[], np.ndarray]) -> Callable[[], tuple[np.ndarray, bool]]:
    return lambda: (loader(), True)


def _shipped(name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from shipped_images import shipped_image

        return shipped_image(name)

    return load


def _grey_hubble() -> np.ndarray:
    rgb = _shipped("hubble_deep_field.jpg")().astype(np.float32)
    return np.round(rgb.mean(-1)).astype(np.uint8)


def _sklearn(name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        from shipped_images import sklearn_images

        return sklearn_images()[name]

    return load


def _sci(loader_name: str) -> Callable[[], tuple[np.ndarray, bool]]:
    def load() -> tuple[np.ndarray, bool]:
        import shipped_images as images

        return getattr(images, loader_name)(), False

    return load


def _em() -> tuple[np.ndarray, bool]:
    from dctdata.datasets import em_pair

    return em_pair(np.random.default_rng(0), 256)[0], False


def _speckle() -> tuple[np.ndarray, bool]:
    from dctdata.datasets import speckle_beam

    return speckle_beam(np.random.default_rng(2)), False


def _slstr(channels: slice) -> Callable[[], tuple[np.ndarray, bool]]:
    def load() -> tuple[np.ndarray, bool]:
        from dctdata.datasets import cloud_field

        image, _ = cloud_field(np.random.default_rng(1), 256, nan_border=False)
        return image[channels], False

    return load


# name -> (group, loader returning (array (H, W), (H, W, C) for 8-bit photos or (C, H, W), is 8-bit))
ITEMS: dict[str, tuple[str, Callable[[], tuple[np.ndarray, bool]]]] = {
    "mri": ("sci", _sci("mri_slice")),
    "dem": ("sci", _sci("elevation_model")),
    "fmri": ("sci", _sci("fmri_mosaic")),  # nibabel's example4d: int16 on a dark background
    "disparity": ("sci", _sci("motorcycle_disparity")),
    "moon": ("sci", _u8(_shipped("moon.png"))),
    "cell": ("sci", _u8(_shipped("cell.png"))),
    "hubble": ("sci", _u8(_grey_hubble)),
    "em": ("sci", _em),
    "speckle": ("sci", _speckle),
    "camera": ("photo", _u8(_shipped("camera.png"))),
    "coins": ("photo", _u8(_shipped("coins.png"))),
    "gravel": ("photo", _u8(_shipped("gravel.png"))),
    "astronaut": ("rgb", _u8(_shipped("astronaut.png"))),
    "coffee": ("rgb", _u8(_shipped("coffee.png"))),
    "chelsea": ("rgb", _u8(_shipped("chelsea.png"))),
    "china": ("rgb", _u8(_sklearn("china"))),
    "flower": ("rgb", _u8(_sklearn("flower"))),
    "slstr_refs": ("multi", _slstr(slice(0, 6))),
    "slstr_bts": ("multi", _slstr(slice(6, 9))),
}


def load_items(names: list[str] | None = None) -> tuple[list[Item], list[str]]:
    """The named items (all by default) and one line per item skipped because its package is missing."""
    names = list(ITEMS) if names is None else list(dict.fromkeys(parse_choice(n, "--items", ITEMS) for n in names))
    items, skipped = [], []
    for name in names:
        group, loader = ITEMS[name]
        try:
            array, u8 = loader()
        except ModuleNotFoundError as exc:
            skipped.append(f"item {name} skipped: {exc.name} is not installed (pip install 'dctdata[bench]')")
            continue
        x = np.asarray(array, dtype=np.float32)
        if x.ndim == 3 and u8:  # photos ship as (H, W, 3)
            x = x.transpose(2, 0, 1)
        items.append(Item(name, group, np.ascontiguousarray(x[None] if x.ndim == 2 else x), u8))
    return items, skipped


def tile_grid(x: np.ndarray, tile: tuple[int, int] = TILE, max_tiles: int = MAX_TILES) -> np.ndarray:
    """(N, C, th, tw) tiles of x (C, H, W): the row-major grid from the top-left corner, thinned to at most
    `max_tiles` evenly spaced tiles."""
    _, h, w = x.shape
    th, tw = tile
    grid = [(i, j) for i in range(h // th) for j in range(w // tw)]
    if not grid:
        raise DctDataError(f"item of shape {x.shape}: expected at least one {th}x{tw} tile. Got none")
    if len(grid) > max_tiles:
        grid = [grid[int(k)] for k in np.linspace(0, len(grid) - 1, max_tiles).round()]
    return np.stack([x[:, i * th : (i + 1) * th, j * tw : (j + 1) * tw] for i, j in grid])


def packs_of(items: list[Item], modes: tuple[str, ...] = MODES, max_tiles: int = MAX_TILES) -> list[Pack]:
    """Every item in every mode, item by item."""
    return [
        Pack(item, mode, tile_grid(item.x, max_tiles=max_tiles) if mode == "tiles" else item.x[None])
        for item in items
        for mode in modes
    ]
