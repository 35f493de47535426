"""Synthetic SciML-Bench stand-ins: the data of `dctdata demo` and of the paper-task examples, made in
milliseconds with no download, so a first pack needs no data set. Not part of the storage product
(nothing in dctdata imports it but the demo); the benchmarks' package-shipped photos live in the
repository's benchmarks/ folder, outside the wheel.

Map-style datasets (`len(ds)`, `ds[i]` -> dict of numpy arrays, `ds.fields` -> suggested field kinds),
one generator per stand-in, and the factories `dctdata pack` calls as a `module:callable` source
(see the README for the commands and the real SciML-Bench layouts):

- `em_denoise(n, size, seed)`: em_graphene_sim, `noisy`/`clean` float32 (1, 256, 256).
- `optical_damage(n, shape, seed)`: 16-bit speckle frames (1, 492, 656) and a damage `label`.
- `slstr_cloud(n, size, seed)`: `refs` (6, H, W), `bts` (3, H, W) with NaN swath edges, `bayes` mask.
- `cifar_like(n, seed)`: uint8 (3, 32, 32) images with a `label` in 0..9.

Factories also accept strings of ints (`size="492x656"`), so a command line can pass them.
"""

from __future__ import annotations

from collections.abc import Callable

from dctdata.datasets.base import SyntheticDataset, fractal_noise
from dctdata.datasets.cifar import CifarLike, cifar_image, cifar_like
from dctdata.datasets.em import (
    EMDenoise,
    beam_profile,
    em_denoise,
    em_pair,
    lattice_field,
    noisy_observation,
)
from dctdata.datasets.optics import (
    OPTICAL_SHAPE,
    OpticalDamage,
    optical_damage,
    speckle_beam,
)
from dctdata.datasets.slstr import SLSTRCloud, cloud_field, slstr_cloud

FACTORIES: dict[str, Callable[..., SyntheticDataset]] = {
    "em_denoise": em_denoise,
    "optical_damage": optical_damage,
    "slstr_cloud": slstr_cloud,
    "cifar_like": cifar_like,
}

__all__ = [
    "FACTORIES",
    "OPTICAL_SHAPE",
    "CifarLike",
    "EMDenoise",
    "OpticalDamage",
    "SLSTRCloud",
    "SyntheticDataset",
    "beam_profile",
    "cifar_image",
    "cifar_like",
    "cloud_field",
    "em_denoise",
    "em_pair",
    "fractal_noise",
    "lattice_field",
    "noisy_observation",
    "optical_damage",
    "slstr_cloud",
    "speckle_beam",
]
