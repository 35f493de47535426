"""CodecSpec: everything a reader needs to turn stored coefficients back into arrays.

A frozen, validated dataclass in the style of numcodecs/zarr specs: `to_dict()` gives a JSON-ready
config, `from_dict(to_dict())` gives an equal spec, and equality is config equality.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch

import dctdata.codec.transform3d as transform3d
from dctdata.codec.transform import BLOCK, DEFAULT_PAD, PADS, grid_shape, num_kept, parse_cf, parse_mask
from dctdata.errors import DctDataError
from dctdata.parse import parse_choice, parse_int, parse_number

# Wire dtypes of coefficients, with their torch dtype and bits per value.
COEFF_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 32),
    "float16": (torch.float16, 16),
    "bfloat16": (torch.bfloat16, 16),
    "int16": (torch.int16, 16),
    "int8": (torch.int8, 8),
}
INTEGER_DTYPES = ("int8", "int16")
# A spec's tables once validated: (C,) rows and (C, K) / (C, C) tables of float32-exact floats, nested tuples so the
# frozen spec stays hashable.
Row: TypeAlias = tuple[float, ...]
Table: TypeAlias = tuple[tuple[float, ...], ...]
# --quant names (CLI) -> coefficient dtype.
QUANT_TO_DTYPE = {"none": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8", "int16": "int16"}


def check_bound_dtype(dtype: str | None) -> None:
    """The rule of a pointwise bound (`max_error`, `max_rel_error`), checked here for every entry (the pack's
    settings, calibration, a CodecSpec): integer coefficients, or the dtype left for calibration to choose,
    since the bound is kept by re-coding the items that miss with finer integer steps. `dtype`: a --quant
    spelling or a coefficient dtype name (None: not set)."""
    if dtype is not None and dtype not in INTEGER_DTYPES:
        raise DctDataError(
            "max_error/max_rel_error: expected quant int8, int16 or unset (the bound is kept by re-coding the items "
            f"that miss with finer integer steps). Got quant {dtype!r}"
        )


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


def f32(v: float) -> float:
    """The float64 nearest the shortest decimal that round-trips v through float32: tables are applied
    in float32, and this value prints as that short decimal in JSON (compact manifests) while
    float32(value) is exactly the float32 the encoder used."""
    return float(str(np.float32(v)))


def _parse_table(name: str, value: object, shape: tuple[int, ...], positive: bool) -> Any:
    """Nested sequences of finite floats with an exact shape -> nested tuples of float32-exact floats
    (hashable, JSON-ready): a Row or a Table, by `shape`. A (C,) table is accepted for a (C, K) shape: one value
    per channel."""
    if value is None:
        return None
    try:
        t = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name}: expected nested numbers of shape {shape}. Got {value!r}") from exc
    if len(shape) == 2 and tuple(t.shape) == shape[:1]:
        t = t.unsqueeze(1).expand(shape)
    if tuple(t.shape) != shape:
        raise DctDataError(f"{name}: expected shape {shape}. Got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise DctDataError(f"{name}: expected finite values. Got {value!r}")
    if positive and not (t > 0).all():
        raise DctDataError(f"{name}: expected values > 0. Got {value!r}")
    # Tables are applied in float32: values that overflow it, or positive ones that flush to 0, are bad.
    fi = torch.finfo(torch.float32)
    if (t.abs() > fi.max).any() or (positive and (t < fi.tiny).any()):
        raise DctDataError(
            f"{name}: expected values representable in float32 ({fi.tiny:.3g} .. {fi.max:.3g}). Got {value!r}"
        )

    def nest(x: torch.Tensor) -> Any:  # a Row or a Table, by the shape asked for
        return tuple(nest(r) for r in x) if x.dim() else f32(float(x))

    return nest(t)


def _compact(table: Table | None) -> list[float] | list[list[float]] | None:
    """A (C, K) table as JSON: one value per channel when a channel's row is constant."""
    if table is None:
        return None
    if all(len(set(row)) == 1 for row in table):
        return [row[0] for row in table]
    return [list(row) for row in table]


SIDES = ("range_mid",)
PRECISIONS = ("float64",)  # `CodecSpec.precision`: the arithmetic of the decode the bound is kept for
# Bounds a manifest cannot exceed (a hostile one must not make a reader allocate without limit).
MAX_CHANNELS = 4096
MAX_SAMPLE_VALUES = 1 << 32
MAX_CORRECTIONS = 1 << 22  # correction rows per sample (`dctdata.decoder.corrections`)


@dataclasses.dataclass(frozen=True)
class CodecSpec:
    """How one `dct` field is encoded.

    cf, mask: which frequencies are kept (K of them). channels, height, width: the decoded sample
    shape (C, H, W). dtype: the coefficient dtype on the wire. steps/offsets (C x K): dequantization,
    coefficient = step * (q - recon * sign(q)) + offset (steps required for integer dtypes; a (C,)
    steps table means one step per channel). mean/std (C): optional normalization applied after
    decoding, (x - mean) / std.

    Codec v2 (each default reproduces a v1 pack; v1 manifests have no `pad` key and read as "edge"):
    pad: how the encoder fills a sample to whole blocks ("symmetric", half-sample mirror, codes cheaper
    than "edge" replication; "extend", format version 7, fills each partial block from its own pixels, cheaper
    still; the decoder crops either way, so no decoder depends on it). theta: dead-zone rounding of the encoder,
    q = sign(v) floor(|v| + theta) (None: round half to even, as v1). recon (C x K): reconstruction
    offsets in steps (the centroid shift of the dead zone). rotation (C x C): an orthonormal channel
    rotation applied before the DCT (the decoder applies its transpose). side: "range_mid" when every
    sample carries its own (range, mid) per channel, stored beside the coefficients: the encoder codes
    (x - mid) / range, the first layer applies x = range * y + mid.

    Codec v3: weights (C,), with a rotation only: each channel is multiplied by its weight before the
    rotation and divided by it after the inverse rotation (the decoders fold 1/w into the rotation's
    transpose, `dequant_tables`). A rotation mixes every channel into every coded channel, so steps per
    coded channel cannot give each output channel its own error; a weight does: channel c's error scales
    by 1/w_c^2 at the same steps, and calibration lands every channel at its target with them.

    Volumes (codec v3 too): depth D makes the sample (C, D, H, W), coded as 8x8x8 blocks with a volume mask
    ("cube" or "tetra", `dctdata.codec.transform3d`); every table keeps its (C, K) form with K the kept
    frequencies of a block. None (the default): 2-D samples.

    Pointwise error bounds (manifest version 5 records them; without corrections every decoder is
    unchanged, so the spec version does not move): max_error, an absolute bound in the field's units, and/or
    max_rel_error, a bound relative to each item's (sample channel's) value range. The encoder checks every
    item's float32 decode (the readers' arithmetic) against the bound less a float32 margin
    (`dctdata.encoder.bounds`) and codes an item that exceeds it again with a finer effective step (a smaller
    stored range). bound_ref: the normalized bound the steps were chosen for; the encoder stores each item's
    range scaled by its own normalized bound over bound_ref, so items of any range get the step their
    bound needs. corrections: the capacity (rows per sample) of the sparse correction list
    (`dctdata.decoder.corrections`, manifest version 5, optional): steps coarser than the bound alone needs, and
    the values that still miss it corrected one by one; the side partner grows to (C + 1 + corrections, 2).
    lattice: True when items whose values lie on an evenly spaced grid are snapped back onto it after
    decoding (`dctdata.codec.lattice`, manifest version 5, optional): C rows (step, origin) follow the other side
    rows.

    precision: "float64" for a float64 source's bounded field (format version 6, optional): its bound holds
    against the float64 values as given, for a decode in float64 arithmetic (what `Decompress` and every
    reader then run by default): the side values (range, mid, correction and lattice rows) are stored as
    float64, and the encoder checks the float64 decode against the bound less a float64 margin. None: the
    float32 decode of every other field.

    Args:
        cf: The chop factor 1..8 (with `mask`: the K kept frequencies).
        height: The decoded sample height H.
        width: The decoded sample width W.
        channels: The channel count C.
        mask: The kept-frequency mask: "square" or "triangle" (volumes: "cube" or "tetra").
        dtype: The coefficient dtype on the wire (float32, float16, bfloat16, int16, int8, ...).
        steps: Dequantization steps (C x K, or (C,) for one per channel); required for integer dtypes.
        offsets: Dequantization offsets (C x K).
        mean: Per-channel mean (C) of the normalization applied after decoding.
        std: Per-channel std (C) of the normalization applied after decoding.
        block: The block size; only 8.
        pad: How the encoder fills a sample to whole blocks: "extend", "symmetric" or "edge".
        theta: The encoder's dead-zone rounding (None: round half to even).
        recon: Reconstruction offsets in steps (C x K).
        rotation: An orthonormal C x C channel rotation applied before the DCT.
        side: "range_mid" when every sample carries its own (range, mid) per channel.
        min_psnr: A per-item PSNR floor the encoder enforces with finer effective steps (needs `side`).
        weights: Per-channel weights (C,) around the rotation (needs `rotation`).
        depth: The sample depth D of a volume spec (None: 2-D samples).
        max_error: A pointwise absolute error bound, in the field's units.
        max_rel_error: A pointwise error bound relative to each item's value range.
        bound_ref: The normalized bound the steps were chosen for.
        corrections: The capacity (rows per sample) of the sparse correction list.
        lattice: True when items on an evenly spaced grid are snapped back onto it after decoding.
        precision: "float64" when the field decodes in float64 (a float64 source's bounded field), else None.

    Raises:
        DctDataError: A field is out of range, a table has the wrong shape, or fields contradict each other.
        TypeError: A field has the wrong type.
    """

    cf: int
    height: int
    width: int
    channels: int = 1
    mask: str = "square"
    dtype: str = "float32"
    steps: Table | None = None
    offsets: Table | None = None
    mean: Row | None = None
    std: Row | None = None
    block: int = BLOCK
    pad: str = DEFAULT_PAD
    theta: float | None = None
    recon: Table | None = None
    rotation: Table | None = None
    side: str | None = None
    min_psnr: float | None = None
    weights: Row | None = None
    depth: int | None = None
    max_error: float | None = None
    max_rel_error: float | None = None
    bound_ref: float | None = None
    corrections: int | None = None
    lattice: bool | None = None
    precision: str | None = None

    def __post_init__(self) -> None:
        if self.block != BLOCK:
            raise DctDataError(f"block: expected {BLOCK}. Got {self.block!r}")
        parse_cf(self.cf)
        if self.depth is None:
            parse_mask(self.mask)
        else:
            object.__setattr__(self, "mask", transform3d.parse_mask3(self.mask))
        for name in ("height", "width") if self.depth is None else ("depth", "height", "width"):
            _parse_pos_int(name, getattr(self, name))
        parse_int(
            self.channels,
            "channels",
            minimum=1,
            maximum=MAX_CHANNELS,
            expected=f"a positive int (at most {MAX_CHANNELS})",
        )
        if math.prod(self.sample_shape) > MAX_SAMPLE_VALUES:
            raise DctDataError(
                f"sample shape: expected at most {MAX_SAMPLE_VALUES} values per sample. "
                f"Got {' x '.join(map(str, self.sample_shape))}"
            )
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
        parse_choice(self.pad, "pad", PADS)
        if self.theta is not None:
            object.__setattr__(self, "theta", f32(parse_number(self.theta, "theta", above=0, below=1)))
        recon = _parse_table("recon", self.recon, ck, positive=False)
        if recon is not None and (self.steps is None or max(abs(v) for row in recon for v in row) >= 1):
            raise DctDataError(f"recon: expected offsets in (-1, 1) steps with a steps table. Got {self.recon!r}")
        object.__setattr__(self, "recon", recon)
        rotation = _parse_table("rotation", self.rotation, (self.channels, self.channels), positive=False)
        if rotation is not None:
            r = torch.tensor(rotation, dtype=torch.float64)
            if not torch.allclose(r @ r.T, torch.eye(self.channels, dtype=torch.float64), atol=1e-5):
                raise DctDataError(
                    f"rotation: expected an orthonormal {self.channels}x{self.channels} matrix. Got {self.rotation!r}"
                )
        object.__setattr__(self, "rotation", rotation)
        weights = _parse_table("weights", self.weights, (self.channels,), positive=True)
        if weights is not None and rotation is None:
            raise DctDataError(
                f"weights: expected a rotation whose channels they weight. Got weights {self.weights!r} without one"
            )
        object.__setattr__(self, "weights", weights)
        if self.side is not None:
            parse_choice(self.side, "side", SIDES)
        if self.min_psnr is not None:
            if self.side is None:
                raise DctDataError(
                    "min_psnr: expected side information (side='range_mid') to enforce it with. Got none"
                )
            object.__setattr__(self, "min_psnr", f32(parse_number(self.min_psnr, "min_psnr", above=0, below=200)))
        self._check_bounds()

    def _check_bounds(self) -> None:
        for name in ("max_error", "max_rel_error", "bound_ref"):
            value = getattr(self, name)
            if value is not None:
                below = float(torch.finfo(torch.float32).max)
                value = parse_number(value, name, above=0, below=below)
                object.__setattr__(self, name, f32(value) if name == "bound_ref" else value)
        if self.corrections is not None:
            parse_int(self.corrections, "corrections", minimum=1, maximum=MAX_CORRECTIONS,
                      expected=f"a positive int (at most {MAX_CORRECTIONS} rows)")  # fmt: skip
            object.__setattr__(self, "corrections", int(self.corrections))
        if self.lattice is not None and self.lattice is not True:
            raise DctDataError(f"lattice: expected True or None. Got {self.lattice!r}")
        if self.precision is not None:
            parse_choice(self.precision, "precision", PRECISIONS)
            if self.side is None:
                raise DctDataError(
                    "precision: expected side information (side='range_mid') to carry float64 values. Got none"
                )
        if self.max_error is None and self.max_rel_error is None:
            if self.bound_ref is not None:
                raise DctDataError("bound_ref: expected max_error or max_rel_error with it. Got neither")
            if self.corrections is not None:
                raise DctDataError("corrections: expected max_error or max_rel_error with them. Got neither")
            if self.lattice is not None:
                raise DctDataError("lattice: expected max_error or max_rel_error with it. Got neither")
            return
        check_bound_dtype(self.dtype)
        if self.side is None:
            raise DctDataError(
                "max_error/max_rel_error: expected side information (side='range_mid') to enforce the bound with. "
                f"Got side {self.side!r}"
            )

    @functools.cached_property
    def side_rows(self) -> int:
        """Rows of a sample's side values: C (range, mid), then with corrections a header row and the
        correction rows (`dctdata.decoder.corrections`), then with a lattice C (step, origin) rows
        (`dctdata.codec.lattice`).
        Cached like `coeff_shape`: every decode call checks it."""
        lattice = 0 if self.lattice is None else self.channels
        return self.channels + (0 if self.corrections is None else 1 + self.corrections) + lattice

    @property
    def bounded(self) -> bool:
        """True when the encoder enforces a pointwise error bound."""
        return self.max_error is not None or self.max_rel_error is not None

    @property
    def decode_dtype(self) -> torch.dtype:
        """The dtype a decode of this field computes in by default: float64 for a float64 source's field
        (`precision`), else float32. Its side values are stored in it (`side_dtype`)."""
        return torch.float64 if self.precision == "float64" else torch.float32

    @property
    def side_dtype(self) -> str:
        """The stored side values' dtype: "float64" with `precision` (a float64 source's range, mid, correction
        and lattice rows, which float32 would round past its bound), else "float32"."""
        return "float64" if self.precision == "float64" else "float32"

    # Derived sizes -------------------------------------------------------------------------------
    @property
    def dims(self) -> int:
        """Spatial dims of a sample: 2 (C, H, W) or 3 (C, D, H, W), a volume."""
        return 2 if self.depth is None else 3

    @property
    def kept(self) -> int:
        """K, kept coefficients per block."""
        return num_kept(self.cf, self.mask) if self.depth is None else transform3d.num_kept(self.cf, self.mask)

    @property
    def grid(self) -> tuple[int, ...]:
        """(Hb, Wb) blocks per sample, (Db, Hb, Wb) for a volume."""
        if self.depth is None:
            return grid_shape(self.height, self.width)
        return transform3d.grid_shape(self.depth, self.height, self.width)

    @functools.cached_property
    def coeff_shape(self) -> tuple[int, ...]:
        """Per-sample coefficient tensor shape (C, Hb, K, Wb), (C, Db, Hb, K, Wb) for a volume (see
        dctdata.codec.transform and dctdata.codec.transform3d for the layouts). Cached (the spec is frozen): every
        decode call checks its input against it."""
        *rows, wb = self.grid
        return (self.channels, *rows, self.kept, wb)

    @property
    def rows_shape(self) -> tuple[int, int, int, int]:
        """The coefficients of a sample as (C, R, K, Wb) block rows (R = Hb, or Db * Hb for a volume): the
        view the quantizer and the lossless stage work on."""
        *rows, wb = self.grid
        return (self.channels, math.prod(rows), self.kept, wb)

    @property
    def size(self) -> tuple[int, ...]:
        """Spatial size (H, W), (D, H, W) for a volume."""
        return (self.height, self.width) if self.depth is None else (self.depth, self.height, self.width)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Decoded sample shape (C, H, W), (C, D, H, W) for a volume."""
        return (self.channels, *self.size)

    @property
    def torch_dtype(self) -> torch.dtype:
        return COEFF_DTYPES[self.dtype][0]

    @property
    def bits(self) -> int:
        return COEFF_DTYPES[self.dtype][1]

    @property
    def transfer_ratio(self) -> float:
        """float32 sample bytes / coefficient bytes sent to the device (~ 64/K x 32/bits)."""
        raw = math.prod(self.sample_shape) * 32
        bits = 64 if self.precision == "float64" else 32  # the side values' dtype
        side = 0 if self.side is None else self.side_rows * 2 * bits  # (range, mid) per channel (+ corrections)
        return raw / (math.prod(self.coeff_shape) * self.bits + side)

    # Config round trip --------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """1 when the spec only uses what a v1 reader knows (edge padding, plain rounding), 3 with channel
        weights or for a volume, else 2."""
        if self.weights is not None or self.depth is not None:
            return 3
        v2 = (self.pad != "edge", self.theta, self.recon, self.rotation, self.side, self.min_psnr)
        return 2 if any(v not in (False, None) for v in v2) else 1

    def to_dict(self) -> dict[str, Any]:
        """Compact JSON-ready config: fields at their defaults are left out, a (C, K) table with constant
        rows becomes one value per channel, offsets that only move the DC term become `dc_offset`."""
        d: dict[str, Any] = {
            "cf": self.cf, "height": self.height, "width": self.width, "channels": self.channels,
            "mask": self.mask, "dtype": self.dtype, "pad": self.pad,
        }  # fmt: skip
        if self.depth is not None:
            d["depth"] = self.depth
        if self.steps is not None:
            d["steps"] = _compact(self.steps)
        if self.offsets is not None:
            if all(v == 0 for row in self.offsets for v in row[1:]):
                d["dc_offset"] = [row[0] for row in self.offsets]
            else:
                d["offsets"] = [list(row) for row in self.offsets]
        for name in ("mean", "std", "theta", "side", "min_psnr", "weights", "max_error", "max_rel_error", "bound_ref",
                     "corrections", "lattice", "precision"):  # fmt: skip
            if getattr(self, name) is not None:
                d[name] = list(getattr(self, name)) if isinstance(getattr(self, name), tuple) else getattr(self, name)
        for name in ("recon", "rotation"):
            if getattr(self, name) is not None:
                d[name] = [list(row) for row in getattr(self, name)]
        return d

    @classmethod
    def from_dict(cls, config: object) -> CodecSpec:
        """Inverse of `to_dict` (also reads v1 configs: every key written, no `pad`, which means edge
        padding); unknown or missing keys are errors, not silently dropped."""
        if not isinstance(config, Mapping):
            raise TypeError(f"CodecSpec config: expected a mapping. Got {type(config).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        unknown = sorted(set(config) - names - {"dc_offset"})
        missing = sorted(required - set(config))
        if unknown:
            raise DctDataError(
                f"CodecSpec config: unknown keys {unknown}. Expected a subset of {sorted(names | {'dc_offset'})}"
            )
        if missing:
            raise DctDataError(f"CodecSpec config: missing keys {missing}")
        kw = dict(config)
        kw.setdefault("pad", "edge")
        if "dc_offset" in kw:
            if kw.get("offsets") is not None:
                raise DctDataError("CodecSpec config: expected offsets or dc_offset. Got both")
            dc = kw.pop("dc_offset")
            if not isinstance(dc, (list, tuple)):
                raise DctDataError(f"dc_offset: expected one number per channel. Got {dc!r}")
            if kw.get("depth") is None:
                k = num_kept(kw["cf"], kw.get("mask", "square"))
            else:
                k = transform3d.num_kept(kw["cf"], kw.get("mask", "cube"))
            kw["offsets"] = [[v] + [0.0] * (k - 1) for v in dc]
        return cls(**kw)

    def replace(self, **changes: Any) -> CodecSpec:
        return dataclasses.replace(self, **changes)


class DequantTables(NamedTuple):
    """A spec's decode tables in float64, defaults filled: steps and offsets (C, K); recon (C, K) in steps, or
    None; rotation_t (C, C), the transpose the decoder applies, or None; inv_std and mean (C,), the
    normalization (ones and zeros when there is none or `normalize` is off)."""

    steps: torch.Tensor
    offsets: torch.Tensor
    recon: torch.Tensor | None
    rotation_t: torch.Tensor | None
    inv_std: torch.Tensor
    mean: torch.Tensor


def _rotation_t(spec: CodecSpec) -> torch.Tensor:
    """diag(1 / weights) R^T in float64 (R^T without weights): what the decoder applies over the channels,
    so every decoder of a v3 spec is a v2 decoder."""
    rt = torch.tensor(spec.rotation, dtype=torch.float64).T
    if spec.weights is not None:
        rt = rt / torch.tensor(spec.weights, dtype=torch.float64)[:, None]
    return rt.contiguous()


def dequant_tables(spec: CodecSpec, normalize: bool = True) -> DequantTables:
    """The tables every decoder of `spec` starts from (`Decompress` and the fused CPU kernel), in one place."""
    c, k = spec.channels, spec.kept
    f64 = torch.float64

    def table(v: Table | None) -> torch.Tensor | None:
        return None if v is None else torch.as_tensor(v, dtype=f64).reshape(c, k)

    std, mean = (spec.std, spec.mean) if normalize else (None, None)
    steps, offsets = table(spec.steps), table(spec.offsets)
    return DequantTables(
        torch.ones(c, k, dtype=f64) if steps is None else steps,
        torch.zeros(c, k, dtype=f64) if offsets is None else offsets,
        table(spec.recon),
        None if spec.rotation is None else _rotation_t(spec),
        torch.ones(c, dtype=f64) if std is None else 1.0 / torch.as_tensor(std, dtype=f64).reshape(c),
        torch.zeros(c, dtype=f64) if mean is None else torch.as_tensor(mean, dtype=f64).reshape(c),
    )
