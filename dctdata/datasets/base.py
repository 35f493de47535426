"""What every synthetic stand-in shares: argument parsing (ints, shapes, fractions; strings of them
as a command line passes), fractal noise, and the map-style `SyntheticDataset` whose samples are pure
functions of (seed, kind, index), identical in any process or DataLoader worker, in any order."""

from __future__ import annotations

import operator
import zlib
from typing import Any

import numpy as np
import torch.utils.data

from dctdata.errors import DctDataError
from dctdata.parse import parse_int, parse_number


# Argument parsing ----------------------------------------------------------------------------------
def as_int(name: str, value: object, minimum: int) -> int:
    """An int (or a string of one, as a command line passes it) >= minimum."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise DctDataError(f"{name}: expected an integer >= {minimum}. Got {value!r}") from None
    return parse_int(value, name, minimum=minimum, expected=f"an integer >= {minimum}")


def as_shape(name: str, value: object, minimum: int = 8) -> tuple[int, int]:
    """An int (square) or an (H, W) pair; strings like '256' or '492x656' are accepted for the CLI."""
    if isinstance(value, str) and "x" in value:
        value = tuple(value.split("x"))
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise DctDataError(f"{name}: expected an int or a pair (H, W). Got {value!r}")
        return as_int(f"{name}[0]", value[0], minimum), as_int(f"{name}[1]", value[1], minimum)
    s = as_int(name, value, minimum)
    return s, s


def as_fraction(name: str, value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise DctDataError(f"{name}: expected a number in [0, 1]. Got {value!r}") from None
    v = parse_number(value, name, minimum=0.0, expected="a number in [0, 1]")
    if v > 1.0:
        raise DctDataError(f"{name}: expected a number in [0, 1]. Got {value}")
    return v


def check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng: expected a numpy.random.Generator (np.random.default_rng(seed)). Got {type(rng).__name__}"
        )
    return rng


# Shared building blocks ----------------------------------------------------------------------------
def fractal_noise(rng: np.random.Generator, shape: tuple[int, int], beta: float = 3.0, count: int = 1) -> np.ndarray:
    """`count` Gaussian random fields with power spectrum ~ 1/f^beta, each zero mean and unit std.

    beta ~ 2 gives rough, cloud-like texture; beta ~ 4 gives smooth terrain. float32 (count, H, W).
    """
    rng = check_rng(rng)
    h, w = shape
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f = np.sqrt(fy * fy + fx * fx)
    f[0, 0] = 1.0
    amp = f ** np.float32(-beta / 2.0)
    amp[0, 0] = 0.0
    planes = rng.standard_normal((count, h, w // 2 + 1, 2), dtype=np.float32)
    spec = (planes[..., 0] + 1j * planes[..., 1]).astype(np.complex64) * amp
    out = np.fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)
    out -= out.mean(axis=(1, 2), keepdims=True)
    out /= out.std(axis=(1, 2), keepdims=True) + np.float32(1e-12)
    return out


def grid(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates (y, x) as float32, broadcastable (H, 1) and (1, W)."""
    h, w = shape
    return np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]


# Datasets ------------------------------------------------------------------------------------------
class SyntheticDataset(torch.utils.data.Dataset):
    """Map-style base: `ds[i]` is `self.sample(rng_i, i)` with rng_i seeded by (seed, kind, i).

    `fields` maps each sample key to the kind the pack should use (dct / array / label).
    """

    kind: str = "synthetic"
    fields: dict[str, str] = {}

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = as_int("n", n, 1)
        self.seed = as_int("seed", seed, 0)
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
