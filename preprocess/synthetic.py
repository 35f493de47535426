"""Synthetic SciML-Bench stand-ins: fields that look like the real data, made in milliseconds, no download.

Used by `dctdata demo`, the examples, the tests and the benchmarks. Four map-style datasets (each a
`torch.utils.data.Dataset`: `len(ds)`, `ds[i]` -> dict of numpy arrays, `ds.fields` -> the suggested
field kinds) and the factories the pack CLI calls as a `module:callable` source:

=====================================  ===================================================================
factory                                 sample (channels first)
=====================================  ===================================================================
``em_denoise(n, size, seed)``           em_graphene_sim: ``noisy`` and ``clean`` float32 (1, 256, 256). A
                                        graphene (honeycomb) lattice of Gaussian atoms with random spacing,
                                        rotation and offset; ``noisy`` adds a beam profile, Poisson noise
                                        (``noisy * dose`` are integer counts) and dead pixels (zeros).
``optical_damage(n, shape, seed)``      optical_damage: ``image`` uint16 (1, 492, 656) -- deliberately not
                                        a multiple of 8 -- a speckled laser beam; ``label`` int64, 1 when
                                        the frame has damage sites (dark spots with diffraction rings).
``slstr_cloud(n, size, seed)``          slstr_cloud: ``refs`` float32 (6, H, W) reflectances in 0-1,
                                        ``bts`` float32 (3, H, W) brightness temperatures in K (~220-310,
                                        cold cloud tops), ``bayes`` uint8 (1, H, W) cloud mask {0, 1}. A
                                        swath edge leaves NaN in refs/bts (bayes is 0 there); the pack must
                                        be told what to do with them (``--nan fill=VALUE``).
``cifar_like(n, seed)``                 CIFAR-10-like: ``image`` uint8 (3, 32, 32), ``label`` int64 in 0..9;
                                        the class sets shape, texture and (loosely) colour.
=====================================  ===================================================================

Field names follow the real files (HDF5 keys ``refs``/``bts``/``bayes``; image folders give
``image``/``label``), so one training script reads either. Suggested kinds (``ds.fields``): image-like
floats are ``dct``; masks are ``array`` (stored exactly); ``label`` is ``label``. The denoising target
``clean`` may be ``dct`` (at a high ``--target-psnr``: the target is smooth and compresses well) or
``array`` (bit-exact target, larger): both are valid choices, pick with ``--field clean=array``.
Integer images (optical uint16, CIFAR uint8) default to ``array`` in the pack, so pass
``--field image=dct`` to compress them.

Every sample is a pure function of (seed, dataset kind, index): ``ds[i]`` is identical in any process
or DataLoader worker, in any order.

Packing the synthetic sets (the pack calls the factory with no arguments, so these are the defaults:
64 EM pairs of 256^2, 32 optical frames, 16 SLSTR scenes of 256^2, 1000 CIFAR-like images)::

    dctdata pack dctdata.preprocess.synthetic:em_denoise     em.zarr     --target-psnr 40
    dctdata pack dctdata.preprocess.synthetic:optical_damage optics.zarr --field image=dct --target-psnr 40
    dctdata pack dctdata.preprocess.synthetic:slstr_cloud    slstr.zarr  --nan fill=0 --field bayes=array --target-psnr 40
    dctdata pack dctdata.preprocess.synthetic:cifar_like     cifar.zarr  --field image=dct --cf 6

Other sizes: bind the arguments in a module of your own and pack that (the factories also accept
strings of ints, e.g. ``size="492x656"``)::

    # my_sets.py
    import functools
    from dctdata.preprocess.synthetic import em_denoise
    em_big = functools.partial(em_denoise, n=10000, size=256, seed=7)

    dctdata pack my_sets:em_big em_big.zarr --target-psnr 40

Packing the REAL SciML-Bench files (the same readers; each command was checked on files of the
real layout written from these generators)::

    # em_graphene_sim: two HDF5 files, dataset `images`, (N, 256, 256, 1) float32, aligned by index.
    # The field is named after the key (`images`), once per pack.
    dctdata pack em_graphene_sim/train/graphene_img_noise.h5 em_noisy.zarr --key images --channels-last --target-psnr 40
    dctdata pack em_graphene_sim/train/graphene_img_clean.h5 em_clean.zarr --key images --channels-last --target-psnr 45

    # optical_damage: folders of 16-bit TIFF frames (492 x 656). Class subfolders (e.g. damaged/,
    # undamaged/) give `label` (sorted folder names, as torchvision's ImageFolder).
    dctdata pack optical_damage/train optics.zarr --field image=dct --target-psnr 40

    # slstr_cloud: one HDF5 file per scene with datasets refs (1200, 1500, 6), bts (1200, 1500, 3)
    # and bayes (1200, 1500, 1) (flags; SciML-Bench trains on bayes > 0), NaN outside the swath.
    # The pack reads one HDF5 file per source, so list the scenes in a module:callable:
    #
    #   # slstr_scenes.py
    #   import glob, h5py, numpy as np
    #   FILES = sorted(glob.glob("slstr_cloud/one-day/*.hdf"))
    #   class Scenes:
    #       def __len__(self): return len(FILES)
    #       def __getitem__(self, i):
    #           with h5py.File(FILES[i], "r") as f:
    #               return {k: np.moveaxis(f[k][...], -1, 0) for k in ("refs", "bts", "bayes")}
    #   def scenes(): return Scenes()
    #
    dctdata pack slstr_scenes:scenes slstr.zarr --nan fill=0 --field bayes=array --target-psnr 40

Add ``--format webdataset`` for tar shards. One ``--nan fill`` value serves every field: 0 is exact
for the mask but puts a step down to 0 K at the swath edge of ``bts``: the blocks along the edge ring
and, at a fixed ``--cf``, the achieved PSNR of ``bts`` is set by that edge (the mask is 0 there, so
a masked loss ignores it; ``--target-psnr`` compensates with finer steps, at some size).
"""

from __future__ import annotations

import math
import operator
import zlib
from typing import Any, Callable

import numpy as np
import torch.utils.data

from dctdata.errors import DctDataError

__all__ = [
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

OPTICAL_SHAPE = (492, 656)
CIFAR_CLASSES = ("disc", "square", "triangle", "ring", "cross", "hstripes", "vstripes", "checker", "diagonal", "blobs")
SLSTR_CHANNELS = ("S1 0.55um", "S2 0.66um", "S3 0.87um", "S4 1.375um", "S5 1.61um", "S6 2.25um", "S7 3.7um", "S8 10.8um", "S9 12um")


# Argument parsing ----------------------------------------------------------------------------------
def _as_int(name: str, value: object, minimum: int) -> int:
    """An int (or a string of one, as a command line passes it) >= minimum."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise DctDataError(f"{name}: expected an integer >= {minimum}. Got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer >= {minimum}. Got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise DctDataError(f"{name}: expected an integer >= {minimum}. Got {value}")
    return int(value)


def _as_shape(name: str, value: object, minimum: int = 8) -> tuple[int, int]:
    """An int (square) or an (H, W) pair; strings like '256' or '492x656' are accepted for the CLI."""
    if isinstance(value, str) and "x" in value:
        value = tuple(value.split("x"))
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise DctDataError(f"{name}: expected an int or a pair (H, W). Got {value!r}")
        return _as_int(f"{name}[0]", value[0], minimum), _as_int(f"{name}[1]", value[1], minimum)
    s = _as_int(name, value, minimum)
    return s, s


def _as_fraction(name: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise DctDataError(f"{name}: expected a number in [0, 1]. Got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"{name}: expected a number in [0, 1]. Got {value!r} of type {type(value).__name__}")
    if not 0.0 <= float(value) <= 1.0:
        raise DctDataError(f"{name}: expected a number in [0, 1]. Got {value}")
    return float(value)


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator (np.random.default_rng(seed)). Got {type(rng).__name__}")
    return rng


# Shared building blocks ----------------------------------------------------------------------------
def fractal_noise(rng: np.random.Generator, shape: tuple[int, int], beta: float = 3.0, count: int = 1) -> np.ndarray:
    """`count` Gaussian random fields with power spectrum ~ 1/f^beta, each zero mean and unit std.

    beta ~ 2 gives rough, cloud-like texture; beta ~ 4 gives smooth terrain. float32 (count, H, W).
    """
    rng = _check_rng(rng)
    h, w = shape
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f = np.sqrt(fy * fy + fx * fx)
    f[0, 0] = 1.0
    amp = f ** np.float32(-beta / 2.0)
    amp[0, 0] = 0.0
    spec = rng.standard_normal((count, h, w // 2 + 1, 2), dtype=np.float32)
    spec = (spec[..., 0] + 1j * spec[..., 1]).astype(np.complex64) * amp
    out = np.fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)
    out -= out.mean(axis=(1, 2), keepdims=True)
    out /= out.std(axis=(1, 2), keepdims=True) + np.float32(1e-12)
    return out


def _grid(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates (y, x) as float32, broadcastable (H, 1) and (1, W)."""
    h, w = shape
    return np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]


# em_graphene_sim -----------------------------------------------------------------------------------
def lattice_field(
    rng: np.random.Generator,
    size: int | tuple[int, int] = 256,
    spacing: float | None = None,
    angle: float | None = None,
    vacancy_rate: float = 0.004,
) -> np.ndarray:
    """A noiseless image of graphene: Gaussian atoms on a honeycomb lattice, float32 (H, W) in ~[0, 1].

    spacing: lattice constant in pixels (random 9-14); angle: rotation in radians (random); a random
    offset, a few vacancies, +-5 % atom brightness and a faint smooth background (contamination).
    Atoms are splatted as small Gaussian patches and summed with one bincount (a few ms at 256^2).
    """
    rng = _check_rng(rng)
    h, w = _as_shape("size", size, minimum=1)
    a = float(rng.uniform(9.0, 14.0)) if spacing is None else float(spacing)
    if not a > 1.0:
        raise DctDataError(f"spacing: expected a lattice constant > 1 pixel. Got {spacing!r}")
    theta = float(rng.uniform(0.0, math.pi / 3.0)) if angle is None else float(angle)
    sigma = a * float(rng.uniform(0.12, 0.16))
    oy, ox = rng.uniform(0.0, a, size=2)
    table = rng.uniform(0.95, 1.05, size=(64, 64)).astype(np.float32)
    table[rng.random((64, 64)) < vacancy_rate] = 0.0

    # Atom positions: lattice sites i*a1 + j*a2 (+ basis) covering the frame, rotated and shifted.
    c, s = math.cos(theta), math.sin(theta)
    a1 = np.array([c, s]) * a  # (x, y) of the lattice vectors in the image frame
    a2 = np.array([0.5 * c - math.sqrt(3.0) / 2.0 * s, 0.5 * s + math.sqrt(3.0) / 2.0 * c]) * a
    corners = np.array([[0, 0], [w, 0], [0, h], [w, h]], dtype=np.float64) - (ox, oy)
    frac = corners @ np.linalg.inv(np.stack([a1, a2]))  # corner (x, y) = f1 a1 + f2 a2
    lo, hi = np.floor(frac.min(0)) - 1, np.ceil(frac.max(0)) + 1
    i, j = np.meshgrid(np.arange(lo[0], hi[0] + 1), np.arange(lo[1], hi[1] + 1), indexing="ij")
    sites = i.reshape(-1, 1) * a1 + j.reshape(-1, 1) * a2 + (ox, oy)
    pos = np.concatenate([sites, sites + (a1 + a2) / 3.0])  # the two atoms of the honeycomb basis
    reach = 3.5 * sigma
    keep = (pos[:, 0] > -reach) & (pos[:, 0] < w + reach) & (pos[:, 1] > -reach) & (pos[:, 1] < h + reach)
    pos = pos[keep]
    amp = rng.uniform(0.95, 1.05, size=len(pos))
    amp[rng.random(len(pos)) < vacancy_rate] = 0.0
    # Splat: each atom adds a Gaussian over its (2R+1)^2 pixel neighbourhood, accumulated by bincount.
    r = int(math.ceil(reach))
    off = np.arange(-r, r + 1)
    px = np.floor(pos[:, 0]).astype(np.int64)[:, None, None] + off[None, None, :]
    py = np.floor(pos[:, 1]).astype(np.int64)[:, None, None] + off[None, :, None]
    dx = (px - pos[:, 0, None, None]).astype(np.float32)
    dy = (py - pos[:, 1, None, None]).astype(np.float32)
    val = amp[:, None, None].astype(np.float32) * np.exp((dx * dx + dy * dy) * np.float32(-0.5 / (sigma * sigma)))
    ok = (px >= 0) & (px < w) & (py >= 0) & (py < h)
    out = np.bincount((py * w + px)[ok], weights=val[ok], minlength=h * w).reshape(h, w).astype(np.float32)
    y, x = _grid((h, w))
    # Faint low-frequency background: a few random long-wavelength cosines.
    bg = np.zeros((h, w), dtype=np.float32)
    for _ in range(3):
        k = rng.uniform(0.5, 2.0) * 2 * math.pi / max(h, w)
        phi = rng.uniform(0.0, 2 * math.pi)
        d = rng.uniform(0.0, 2 * math.pi)
        bg += np.cos(k * (math.cos(d) * x + math.sin(d) * y) + phi).astype(np.float32)
    out = 0.85 * out + 0.05 + 0.02 * bg
    return np.clip(out, 0.0, None).astype(np.float32, copy=False)


def beam_profile(rng: np.random.Generator, size: int | tuple[int, int] = 256) -> np.ndarray:
    """Illumination: a broad, slightly elliptical Gaussian with a random centre, peak 1, float32 (H, W)."""
    rng = _check_rng(rng)
    h, w = _as_shape("size", size, minimum=1)
    y, x = _grid((h, w))
    cy, cx = h * rng.uniform(0.3, 0.7), w * rng.uniform(0.3, 0.7)
    sy, sx = h * rng.uniform(0.6, 1.1), w * rng.uniform(0.6, 1.1)
    return np.exp(-0.5 * (((y - cy) / sy) ** 2 + ((x - cx) / sx) ** 2)).astype(np.float32)


def noisy_observation(
    rng: np.random.Generator,
    clean: np.ndarray,
    dose: float,
    beam: np.ndarray | None = None,
    dead_fraction: float = 0.001,
) -> np.ndarray:
    """What the detector records: Poisson(dose * beam * clean) / dose, dead pixels read 0. float32.

    `noisy * dose` is integer counts; where nothing is dead, mean = beam * clean and
    variance = beam * clean / dose (Poisson statistics).
    """
    rng = _check_rng(rng)
    if not isinstance(clean, np.ndarray):
        raise TypeError(f"clean: expected a numpy array. Got {type(clean).__name__}")
    if not (isinstance(dose, (int, float, np.floating)) and dose > 0):
        raise DctDataError(f"dose: expected counts per unit intensity > 0. Got {dose!r}")
    dead_fraction = _as_fraction("dead_fraction", dead_fraction)
    lam = clean.astype(np.float64) * dose
    if beam is not None:
        if beam.shape != clean.shape:
            raise DctDataError(f"beam: expected shape {clean.shape} (the clean image's). Got {beam.shape}")
        lam *= beam
    if (lam < 0).any() or not np.isfinite(lam).all():
        raise DctDataError("clean: expected finite intensities >= 0 for Poisson noise. Got negative or non-finite values")
    noisy = (rng.poisson(lam) / dose).astype(np.float32)
    if dead_fraction > 0:
        noisy[rng.random(noisy.shape) < dead_fraction] = 0.0
    return noisy


def em_pair(rng: np.random.Generator, size: int | tuple[int, int] = 256) -> tuple[np.ndarray, np.ndarray]:
    """(noisy, clean), float32 (H, W) each: one em_graphene_sim-like training pair (dose 20-100)."""
    clean = lattice_field(rng, size)
    beam = beam_profile(rng, clean.shape)
    dose = float(rng.uniform(20.0, 100.0))
    return noisy_observation(rng, clean, dose, beam=beam, dead_fraction=float(rng.uniform(0.0005, 0.002))), clean


# optical_damage ------------------------------------------------------------------------------------
def _fft_size(n: int) -> int:
    """Smallest m >= n whose prime factors are 2, 3, 5, 7."""
    m = n
    while True:
        k = m
        for p in (2, 3, 5, 7):
            while k % p == 0:
                k //= p
        if k == 1:
            return m
        m += 1


def speckle_beam(
    rng: np.random.Generator,
    shape: int | tuple[int, int] = OPTICAL_SHAPE,
    damage_spots: int = 0,
    peak: float | None = None,
) -> np.ndarray:
    """A camera frame of a laser beam, uint16 (H, W): super-Gaussian beam x speckle x faint fringes.

    Speckle is |FFT(aperture x circular Gaussian)|^2 (fully developed: exponential statistics) mixed with a
    uniform part (contrast 0.3-0.7). `damage_spots` dark sites with Fresnel-like rings are multiplied
    in. Counts: dark level ~200, peak 20k-50k (or `peak`), shot and read noise, clipped to 0..65535.
    """
    rng = _check_rng(rng)
    h, w = _as_shape("shape", shape, minimum=8)
    damage_spots = _as_int("damage_spots", damage_spots, 0)
    y, x = _grid((h, w))
    # Beam: super-Gaussian (order 1 = Gaussian, up to a soft flat top), random centre and waist.
    cy, cx = h * rng.uniform(0.4, 0.6), w * rng.uniform(0.4, 0.6)
    wy, wx = h * rng.uniform(0.22, 0.35), w * rng.uniform(0.22, 0.35)
    order = rng.uniform(1.0, 2.5)
    beam = np.exp(-((((y - cy) / wy) ** 2 + ((x - cx) / wx) ** 2) ** order))
    # Speckle: grain ~ H / aperture diameter, 3-8 pixels.
    # Computed on a 2^a 3^b 5^c 7^d grid (FFT-friendly) and cropped: 492 = 4 * 3 * 41 is slow to FFT.
    fh, fw = _fft_size(h), _fft_size(w)
    fy = np.fft.fftfreq(fh).astype(np.float32)[:, None]
    fx = np.fft.fftfreq(fw).astype(np.float32)[None, :]
    radius = 1.0 / rng.uniform(6.0, 16.0)
    iy, ix = np.nonzero((fy * fy + fx * fx) < radius * radius)
    spectrum = np.zeros((fh, fw), dtype=np.complex64)  # circular Gaussian field inside the aperture only
    g = rng.standard_normal((len(iy), 2), dtype=np.float32)
    spectrum[iy, ix] = g[:, 0] + 1j * g[:, 1]
    field = np.fft.ifft2(spectrum)[:h, :w]
    speckle = (field.real**2 + field.imag**2).astype(np.float32)
    speckle /= speckle.mean()
    contrast = rng.uniform(0.3, 0.7)
    img = beam * ((1 - contrast) + contrast * speckle)
    # Fringes from the optics in the path: a few percent, random period and direction.
    d, period, depth = rng.uniform(0, np.pi), rng.uniform(20.0, 60.0), rng.uniform(0.02, 0.06)
    kx, ky = 2 * math.pi * math.cos(d) / period, 2 * math.pi * math.sin(d) / period
    # cos(kx x + ky y) = cos cos - sin sin: separable, so only 1-D trigonometry.
    img *= 1.0 + depth * (np.cos(kx * x) * np.cos(ky * y) - np.sin(kx * x) * np.sin(ky * y))
    for _ in range(damage_spots):
        sy, sx = rng.uniform(cy - 1.2 * wy, cy + 1.2 * wy), rng.uniform(cx - 1.2 * wx, cx + 1.2 * wx)
        s = rng.uniform(3.0, 12.0)
        depth, ring, chirp = rng.uniform(0.5, 0.95), rng.uniform(0.15, 0.35), rng.uniform(0.8, 1.6)
        # Only a window of +-8 spot radii is touched (the rings have died out beyond it).
        y0, y1 = max(int(sy - 8 * s), 0), min(int(sy + 8 * s) + 1, h)
        x0, x1 = max(int(sx - 8 * s), 0), min(int(sx + 8 * s) + 1, w)
        if y0 >= y1 or x0 >= x1:
            continue
        r2 = ((y[y0:y1] - sy) ** 2 + (x[:, x0:x1] - sx) ** 2) / (s * s)
        spot = 1.0 - depth * np.exp(-0.5 * r2) + ring * np.cos(chirp * r2) * np.exp(-r2 / 12.0)
        img[y0:y1, x0:x1] *= np.clip(spot, 0.0, None)
    top = rng.uniform(20000.0, 50000.0) if peak is None else float(peak)
    counts = 200.0 + img * np.float32(top / max(float(img.max()), 1e-12))
    # Shot noise (variance = counts) and read noise (8 counts rms) in one Gaussian draw.
    counts += rng.standard_normal((h, w), dtype=np.float32) * np.sqrt(counts + 64.0)
    return np.clip(np.rint(counts), 0, 65535).astype(np.uint16)


# slstr_cloud ---------------------------------------------------------------------------------------
def cloud_field(
    rng: np.random.Generator,
    size: int | tuple[int, int] = 256,
    nan_border: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """A Sentinel-3 SLSTR-like daytime scene: (image float32 (9, H, W), cloud mask uint8 (H, W)).

    Channels S1-S6 are reflectances in [0, 1] (ocean dark, land bright in the near infrared, cloud
    bright in the visible and darker in the SWIR; S4 at 1.375 um sees only high cloud); S7-S9 are
    brightness temperatures in K (surface 285-310 K, cloud tops 220-265 K; S7 at 3.7 um adds reflected
    sunlight over cloud). Cloud optical depth is 1/f^2 fractal noise above a coverage threshold;
    the mask is optical depth above 0.3. With `nan_border`, one side beyond a slanted swath edge is NaN
    in every channel and 0 in the mask.
    """
    rng = _check_rng(rng)
    h, w = _as_shape("size", size, minimum=8)
    land_n, cloud_n, top_n, surf_n = fractal_noise(rng, (h, w), beta=3.2, count=4)
    cloud_n = 0.7 * cloud_n + 0.3 * fractal_noise(rng, (h, w), beta=2.0)[0]  # rough edges on smooth decks
    land = land_n > np.quantile(land_n, 1.0 - rng.uniform(0.0, 0.6))
    coverage = rng.uniform(0.15, 0.65)
    thr = float(np.quantile(cloud_n, 1.0 - coverage))
    tau = np.clip(cloud_n - thr, 0.0, None) * rng.uniform(6.0, 15.0)  # optical depth
    alpha = 1.0 - np.exp(-tau)  # cloud opacity
    high = np.clip(0.5 + 0.35 * top_n, 0.0, 1.0)  # 0 low cloud, 1 high cloud
    # Reflectances: surface mix, then cloud on top, then illumination across the swath.
    ocean_r = np.array([0.06, 0.04, 0.02, 0.004, 0.01, 0.005], np.float32)
    land_r = np.array([0.08, 0.10, 0.30, 0.01, 0.25, 0.15], np.float32)
    cloud_r = np.array([0.75, 0.73, 0.70, 0.0, 0.45, 0.28], np.float32)
    veg = np.clip(0.5 + 0.25 * surf_n, 0.1, 1.0)
    surf = np.where(land[None], land_r[:, None, None] * (0.6 + 0.6 * veg[None]), ocean_r[:, None, None])
    cr = cloud_r[:, None, None] * (0.8 + 0.2 * np.clip(tau / 5.0, 0.0, 1.0))[None]
    cr[3] = 0.35 * high * np.clip(tau / 3.0, 0.0, 1.0)  # 1.375 um: water vapour hides all but high cloud
    refl = (1.0 - alpha[None]) * surf + alpha[None] * cr
    y, x = _grid((h, w))
    refl *= (0.85 + 0.15 * np.cos(rng.uniform(-0.6, 0.6) + 1.2 * (x / w - 0.5)))[None]
    refl += np.float32(0.004) * rng.standard_normal(refl.shape, dtype=np.float32)
    refl = np.clip(refl, 0.0, 1.0)
    # Brightness temperatures.
    t_ocean = rng.uniform(285.0, 298.0)
    t_surf = np.where(land, t_ocean + rng.uniform(2.0, 10.0) + 3.0 * surf_n, t_ocean + 0.8 * surf_n)
    t_top = 265.0 - 45.0 * high + 2.0 * top_n
    bt11 = (1.0 - alpha) * t_surf + alpha * t_top
    bt12 = bt11 - (0.8 + 1.5 * alpha * high)
    bt37 = bt11 + 12.0 * alpha * (1.0 - 0.5 * high) + 1.0
    bts = np.stack([bt37, bt11, bt12]) + np.float32(0.1) * rng.standard_normal((3, h, w), dtype=np.float32)
    image = np.concatenate([refl, bts]).astype(np.float32, copy=False)
    mask = (tau > 0.3).astype(np.uint8)
    if nan_border:
        # A slanted swath edge entering from the left or right, 4-20 % of the width.
        frac = rng.uniform(0.04, 0.2)
        slope = rng.uniform(-0.15, 0.15)
        edge = w * frac + slope * (y - h / 2.0)
        outside = x < edge if rng.random() < 0.5 else (w - 1 - x) < edge
        outside = np.broadcast_to(outside, (h, w))
        image[:, outside] = np.nan
        mask[outside] = 0
    return image, mask


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
    rng = _check_rng(rng)
    label = _as_int("label", label, 0)
    if label >= len(CIFAR_CLASSES):
        raise DctDataError(f"label: expected a class in 0..{len(CIFAR_CLASSES) - 1}. Got {label}")
    n = 32
    y, x = _grid((n, n))
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
        m = (np.cos(2 * np.pi * y / period + ph) * np.cos(2 * np.pi * x / period) > 0)
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
    t = np.clip((np.cos(rng.uniform(0, 2 * np.pi)) * (x - 16) + np.sin(rng.uniform(0, 2 * np.pi)) * (y - 16)) / 32 + 0.5, 0, 1)
    bg = bg0[:, None, None] * (1 - t) + bg1[:, None, None] * t
    img = bg * (1 - m) + fg[:, None, None] * m + rng.normal(0.0, 0.04, (3, n, n))
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)


# Datasets ------------------------------------------------------------------------------------------
class SyntheticDataset(torch.utils.data.Dataset):
    """Map-style base: `ds[i]` is `self.sample(rng_i, i)` with rng_i seeded by (seed, kind, i).

    `fields` maps each sample key to the kind the pack should use (dct / array / label).
    """

    kind: str = "synthetic"
    fields: dict[str, str] = {}

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = _as_int("n", n, 1)
        self.seed = _as_int("seed", seed, 0)
        self._tag = zlib.crc32(self.kind.encode())

    def __len__(self) -> int:
        return self.n

    def rng(self, index: int) -> np.random.Generator:
        """The generator sample `index` is drawn from: the same in every process and any order."""
        return np.random.default_rng(np.random.SeedSequence([self.seed, self._tag, index]))

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"{self.kind}: expected an integer index. Got {type(index).__name__}") from None
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"{self.kind}: expected an index in [{-self.n}, {self.n}). Got {index}")
        return self.sample(self.rng(i), i)

    def sample(self, rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}(n={self.n}, {extra}, seed={self.seed})"

    def _params(self) -> dict[str, Any]:
        return {}


class EMDenoise(SyntheticDataset):
    """em_graphene_sim-like pairs: `noisy`, `clean` float32 (1, H, W)."""

    kind = "em_denoise"
    fields = {"noisy": "dct", "clean": "dct"}

    def __init__(self, n: int = 64, size: int | tuple[int, int] = 256, seed: int = 0) -> None:
        super().__init__(n, seed)
        self.size = _as_shape("size", size)

    def sample(self, rng, index):
        noisy, clean = em_pair(rng, self.size)
        return {"noisy": noisy[None], "clean": clean[None]}

    def _params(self):
        return {"size": self.size}


class OpticalDamage(SyntheticDataset):
    """optical_damage-like frames: `image` uint16 (1, H, W), `label` int64 (1 = damaged)."""

    kind = "optical_damage"
    fields = {"image": "dct", "label": "label"}

    def __init__(self, n: int = 32, shape: int | tuple[int, int] = OPTICAL_SHAPE, seed: int = 0, damaged: float = 0.5) -> None:
        super().__init__(n, seed)
        self.shape = _as_shape("shape", shape)
        self.damaged = _as_fraction("damaged", damaged)

    def sample(self, rng, index):
        bad = bool(rng.random() < self.damaged)
        spots = int(rng.integers(1, 5)) if bad else 0
        return {"image": speckle_beam(rng, self.shape, damage_spots=spots)[None], "label": np.asarray(int(bad), dtype=np.int64)}

    def _params(self):
        return {"shape": self.shape, "damaged": self.damaged}


class SLSTRCloud(SyntheticDataset):
    """slstr_cloud-like scenes: `refs` (6, H, W), `bts` (3, H, W) float32 with NaN borders, `bayes` uint8 (1, H, W)."""

    kind = "slstr_cloud"
    fields = {"refs": "dct", "bts": "dct", "bayes": "array"}

    def __init__(self, n: int = 16, size: int | tuple[int, int] = 256, seed: int = 0, nan_border: bool = True) -> None:
        super().__init__(n, seed)
        self.size = _as_shape("size", size)
        if not isinstance(nan_border, bool):
            raise TypeError(f"nan_border: expected a bool. Got {nan_border!r}")
        self.nan_border = nan_border

    def sample(self, rng, index):
        image, mask = cloud_field(rng, self.size, nan_border=self.nan_border)
        return {"refs": image[:6], "bts": image[6:], "bayes": mask[None]}

    def _params(self):
        return {"size": self.size, "nan_border": self.nan_border}


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


# module:callable factories for `dctdata pack` ------------------------------------------------------
def em_denoise(n: int = 64, size: int | tuple[int, int] = 256, seed: int = 0) -> EMDenoise:
    """`dctdata pack dctdata.preprocess.synthetic:em_denoise OUT`: em_graphene_sim-like pairs."""
    return EMDenoise(n=n, size=size, seed=seed)


def optical_damage(n: int = 32, shape: int | tuple[int, int] = OPTICAL_SHAPE, seed: int = 0, damaged: float = 0.5) -> OpticalDamage:
    """`dctdata pack dctdata.preprocess.synthetic:optical_damage OUT --field image=dct`."""
    return OpticalDamage(n=n, shape=shape, seed=seed, damaged=damaged)


def slstr_cloud(n: int = 16, size: int | tuple[int, int] = 256, seed: int = 0, nan_border: bool = True) -> SLSTRCloud:
    """`dctdata pack dctdata.preprocess.synthetic:slstr_cloud OUT --nan fill=0`."""
    return SLSTRCloud(n=n, size=size, seed=seed, nan_border=nan_border)


def cifar_like(n: int = 1000, seed: int = 0) -> CifarLike:
    """`dctdata pack dctdata.preprocess.synthetic:cifar_like OUT --field image=dct`."""
    return CifarLike(n=n, seed=seed)


FACTORIES: dict[str, Callable[..., SyntheticDataset]] = {
    "em_denoise": em_denoise,
    "optical_damage": optical_damage,
    "slstr_cloud": slstr_cloud,
    "cifar_like": cifar_like,
}
