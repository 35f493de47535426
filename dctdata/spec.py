"""CodecSpec: everything a reader needs to turn stored coefficients back into arrays.

A frozen, validated dataclass in the style of numcodecs/zarr specs: `to_dict()` gives a JSON-ready
config, `from_dict(to_dict())` gives an equal spec, and equality is config equality.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from dctdata.errors import DctDataError
from dctdata.parse import parse_int
from dctdata.transform import BLOCK, grid_shape, num_kept, parse_cf, parse_mask

# Wire dtypes of coefficients, with their torch dtype and bits per value.
COEFF_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 32),
    "float16": (torch.float16, 16),
    "bfloat16": (torch.bfloat16, 16),
    "int16": (torch.int16, 16),
    "int8": (torch.int8, 8),
}
INTEGER_DTYPES = ("int8", "int16")
# --quant names (CLI) -> coefficient dtype.
QUANT_TO_DTYPE = {"none": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8", "int16": "int16"}


def parse_coeff_dtype(dtype: object) -> str:
    """Accept a wire dtype name or a --quant alias; return the canonical dtype name."""
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str):
        raise TypeError(f"dtype: expected one of {sorted(COEFF_DTYPES)}. Got {dtype!r}")
    name = QUANT_TO_DTYPE.get(dtype, dtype)
    if name not in COEFF_DTYPES:
        raise DctDataError(
            f"dtype: expected one of {sorted(COEFF_DTYPES)} or a --quant name {sorted(QUANT_TO_DTYPE)}. Got {dtype!r}"
        )
    return name


def _parse_pos_int(name: str, value: object) -> int:
    return parse_int(value, name, minimum=1, expected="a positive int")


def _parse_table(name: str, value: object, shape: tuple[int, ...], positive: bool) -> tuple | None:
    """Nested sequences of finite floats with an exact shape -> nested tuples (hashable, JSON-ready)."""
    if value is None:
        return None
    try:
        t = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name}: expected nested numbers of shape {shape}. Got {value!r}") from exc
    if tuple(t.shape) != shape:
        raise DctDataError(f"{name}: expected shape {shape}. Got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise DctDataError(f"{name}: expected finite values. Got {value!r}")
    if positive and not (t > 0).all():
        raise DctDataError(f"{name}: expected values > 0. Got {value!r}")
    # Tables are applied in float32: values that overflow it, or positive ones that flush to 0, are bad.
    f32 = torch.finfo(torch.float32)
    if (t.abs() > f32.max).any() or (positive and (t < f32.tiny).any()):
        raise DctDataError(
            f"{name}: expected values representable in float32 ({f32.tiny:.3g} .. {f32.max:.3g}). Got {value!r}"
        )

    def nest(x: torch.Tensor):
        return tuple(nest(r) for r in x) if x.dim() else float(x)

    return nest(t)


@dataclasses.dataclass(frozen=True)
class CodecSpec:
    """How one `dct` field is encoded.

    cf, mask: which frequencies are kept (K of them). channels, height, width: the decoded sample
    shape (C, H, W). dtype: the coefficient dtype on the wire. steps/offsets (C x K): dequantization,
    coefficient = q * step + offset (required for integer dtypes, optional otherwise). mean/std (C):
    optional normalization applied after decoding, (x - mean) / std.
    """

    cf: int
    height: int
    width: int
    channels: int = 1
    mask: str = "square"
    dtype: str = "float32"
    steps: tuple | None = None
    offsets: tuple | None = None
    mean: tuple | None = None
    std: tuple | None = None
    block: int = BLOCK

    def __post_init__(self) -> None:
        if self.block != BLOCK:
            raise DctDataError(f"block: expected {BLOCK}. Got {self.block!r}")
        parse_cf(self.cf)
        parse_mask(self.mask)
        for name in ("height", "width", "channels"):
            _parse_pos_int(name, getattr(self, name))
        object.__setattr__(self, "dtype", parse_coeff_dtype(self.dtype))
        ck = (self.channels, self.kept)
        object.__setattr__(self, "steps", _parse_table("steps", self.steps, ck, positive=True))
        object.__setattr__(self, "offsets", _parse_table("offsets", self.offsets, ck, positive=False))
        object.__setattr__(self, "mean", _parse_table("mean", self.mean, (self.channels,), positive=False))
        object.__setattr__(self, "std", _parse_table("std", self.std, (self.channels,), positive=True))
        if self.dtype in INTEGER_DTYPES and self.steps is None:
            raise DctDataError(f"steps: expected a (C x K) table for integer dtype {self.dtype!r}. Got None")
        if (self.mean is None) != (self.std is None):
            raise DctDataError("mean/std: expected both or neither. Got only one")

    # Derived sizes -------------------------------------------------------------------------------
    @property
    def kept(self) -> int:
        """K, kept coefficients per block."""
        return num_kept(self.cf, self.mask)

    @property
    def grid(self) -> tuple[int, int]:
        """(Hb, Wb) blocks per sample."""
        return grid_shape(self.height, self.width)

    @property
    def coeff_shape(self) -> tuple[int, int, int, int]:
        """Per-sample coefficient tensor shape (C, Hb, K, Wb) (see dctdata.transform for the layout)."""
        hb, wb = self.grid
        return (self.channels, hb, self.kept, wb)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Decoded sample shape (C, H, W)."""
        return (self.channels, self.height, self.width)

    @property
    def torch_dtype(self) -> torch.dtype:
        return COEFF_DTYPES[self.dtype][0]

    @property
    def bits(self) -> int:
        return COEFF_DTYPES[self.dtype][1]

    @property
    def transfer_ratio(self) -> float:
        """float32 sample bytes / coefficient bytes sent to the device (~ 64/K x 32/bits)."""
        raw = self.channels * self.height * self.width * 32
        return raw / (math.prod(self.coeff_shape) * self.bits)

    # Config round trip --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready config (tuples become lists)."""

        def plain(v):
            return [plain(x) for x in v] if isinstance(v, tuple) else v

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "CodecSpec":
        """Inverse of `to_dict`; unknown or missing keys are errors, not silently dropped."""
        if not isinstance(config, Mapping):
            raise TypeError(f"CodecSpec config: expected a mapping. Got {type(config).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        unknown = sorted(set(config) - names)
        missing = sorted(required - set(config))
        if unknown:
            raise DctDataError(f"CodecSpec config: unknown keys {unknown}. Expected a subset of {sorted(names)}")
        if missing:
            raise DctDataError(f"CodecSpec config: missing keys {missing}")
        return cls(**dict(config))

    def replace(self, **changes: Any) -> "CodecSpec":
        return dataclasses.replace(self, **changes)
