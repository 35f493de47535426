"""Field kinds as objects: each kind owns what differs between kinds, so no other module compares kind names.

`dctdata.kinds.FieldKind` is the kind's name as the manifest writes it ("dct", "array", "label"); this module is
its behaviour, one small class per kind (as FFCV's fields own their encoder and decoder) registered by name (as
numcodecs registers codecs): `get(kind)` or a field's `FieldSpec.kind_type`. A kind answers:

- what it is: `coded` (stored as a `CodecSpec`'s coefficients, decoded by `Decompress`; the other kinds are
  stored exactly as given), `ratios` (whether size ratios mean anything for it: not for one scalar per sample);
- validation: `check_spec` (a `FieldSpec` of the kind: its codec, shape and dtype) and `check_source` (a source
  field the pack gives the kind);
- encode: `batch_shape` (the per-sample shape a source batch may have) and `store` (the array written for an
  exact kind; a coded kind's encode is the encoder's, with its error figures);
- decode: `layer` (the `Decompress` of a coded field, None for an exact one) and `decode` (stored values to
  what a loader yields without `decode="device"`);
- describe: `describe` (the codec column of `dctdata info`), `summary` (what the pack summary says of the
  field's figures) and `transfer_ratio` (float32 bytes over the bytes sent to the device).

Which kind a field gets (`kind_and_reason`) is here too: the rules name the kinds, so they live beside them.
Adding a kind is a `FieldKind` member and one class here (`tests/core/test_field_kinds.py` checks that nothing
outside this module and `dctdata.kinds` names one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError
from dctdata.kinds import FieldKind

# An integer field whose calibration subset holds at most this many distinct values is a mask, a label map
# or class indices, which a user expects back exactly: it stays `array` under a lossy setting. Measured
# integer data (elevations, detector counts, 8-bit photos) holds hundreds or thousands of values.
FEW_VALUES = 32


class _Spec(Protocol):
    """What a kind reads of a field (a `dctdata.format.FieldSpec`, which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> FieldKind: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def codec(self) -> CodecSpec | None: ...
    @property
    def lossless(self) -> Mapping[str, Any]: ...
    @property
    def stored_sample_bytes(self) -> int: ...

    def to_tensor(self, stored: npt.NDArray[Any]) -> Any: ...


class Kind:
    """One field kind's behaviour (the base: a field stored exactly as given)."""

    kind: ClassVar[FieldKind]
    coded: ClassVar[bool] = False  # stored as a CodecSpec's coefficients, decoded by `Decompress`
    ratios: ClassVar[bool] = True  # size ratios against the source mean something

    # validation ---------------------------------------------------------------------------------------
    def check_spec(self, f: _Spec, where: str) -> None:
        """A `FieldSpec` of this kind is consistent (its codec, shape and dtype)."""
        if f.codec is not None:
            raise DctDataError(f"{where}: codec: expected None for a {self.kind} field. Got {f.codec!r}")

    def check_source(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], where: str) -> None:
        """A source field of per-sample `shape` and `dtype` can be packed as this kind."""

    # encode -------------------------------------------------------------------------------------------
    def batch_shape(self, f: _Spec, ndim: int) -> tuple[int, ...]:
        """The per-sample shape a source batch of `ndim` dims (samples first) must have."""
        return f.shape

    def store(self, f: _Spec, x: npt.NDArray[Any], where: str) -> npt.NDArray[Any]:
        """The array written for a batch `x` of the field: its values as they are, in native byte order (a
        big-endian source array, ">i8" from an .npz or HDF5, is stored as the little-endian values every reader
        expects); `where` names the batch's first sample."""
        if x.dtype.name != f.dtype:
            raise DctDataError(f"{where}: field {f.name!r}: expected dtype {f.dtype} like sample 0. Got {x.dtype}")
        return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))

    # decode -------------------------------------------------------------------------------------------
    def layer(self, f: _Spec, **kwargs: Any) -> Any:
        """The module that decodes the field's stored values (None: they are the values)."""
        return None

    def decode(self, f: _Spec, stored: npt.NDArray[Any], layer: Callable[[Any], Any] | None = None) -> Any:
        """Stored values of the field (one sample or a batch) -> what a loader yields."""
        return f.to_tensor(stored)

    # describe -----------------------------------------------------------------------------------------
    def describe(self, f: _Spec) -> str:
        """The field's coding in a word or a few (the codec column of `dctdata info`)."""
        return "exact"

    def summary(self, f: _Spec, stats: Any, num: Callable[[float | None], str]) -> str:
        """What the pack summary adds after the field's kind, shape and dtype (`stats`: its `FieldStats`; `num`:
        the summary's number cell, `dctdata.report.num`): nothing for a field stored exactly."""
        return ""

    def transfer_ratio(self, f: _Spec) -> float | None:
        """The field's float32 bytes over the bytes sent to the device per sample (None: not meaningful)."""
        return 4 * math.prod(f.shape) / max(1, f.stored_sample_bytes)


class ArrayKind(Kind):
    """Any numeric array, stored exactly with the lossless stage (masks, targets, small vectors)."""

    kind = FieldKind.ARRAY


class LabelKind(Kind):
    """One scalar per sample (a class index, a target value)."""

    kind = FieldKind.LABEL
    ratios = False  # a scalar against its chunk and index overhead means nothing

    def check_spec(self, f: _Spec, where: str) -> None:
        super().check_spec(f, where)
        if f.shape != ():
            raise DctDataError(f"{where}: shape: expected () for a label field (one scalar per sample). Got {f.shape}")

    def check_source(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], where: str) -> None:
        if shape != ():
            raise DctDataError(
                f"{where}: field {name!r}: expected one scalar per sample for kind label. Got shape {shape}"
            )

    def transfer_ratio(self, f: _Spec) -> float | None:
        return None


class DctKind(Kind):
    """Image-like numeric arrays, stored as quantized block-DCT coefficients of the field's `CodecSpec`."""

    kind = FieldKind.DCT
    coded = True

    def check_spec(self, f: _Spec, where: str) -> None:
        if not isinstance(f.codec, CodecSpec):
            raise DctDataError(f"{where}: codec: expected a CodecSpec for a dct field. Got {f.codec!r}")
        if f.codec.sample_shape != f.shape:
            raise DctDataError(f"{where}: codec sample shape: expected {f.shape} (C, H, W). Got {f.codec.sample_shape}")
        if f.dtype == "bool":
            raise DctDataError(f"{where}: dtype: expected a numeric dtype for a dct field. Got 'bool'")

    def check_source(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any], where: str) -> None:
        if dtype.kind == "b":
            raise DctDataError(
                f"{where}: field {name!r}: expected numbers for kind dct. Got bool (use --field {name}=array)"
            )

    def batch_shape(self, f: _Spec, ndim: int) -> tuple[int, ...]:
        # (C, H, W) came from (H, W) (C = 1) or a 1-D (L,) sample (C = H = 1); a volume's (C, D, H, W) from (D, H, W)
        full = len(f.shape)
        return f.shape[full + 1 - ndim :] if 1 < ndim <= full else f.shape

    def store(self, f: _Spec, x: npt.NDArray[Any], where: str) -> npt.NDArray[Any]:
        raise TypeError(f"field {f.name!r}: a dct field is stored by the encoder (its coefficients), not as given")

    def layer(self, f: _Spec, **kwargs: Any) -> Any:
        from dctdata.decoder.layer import Decompress  # the model side: only a decoding caller needs it

        return Decompress(_codec(f), **{"lossless": f.lossless, **kwargs})

    def decode(self, f: _Spec, stored: Any, layer: Callable[[Any], Any] | None = None) -> Any:
        """The stored coefficients (or the pair (coefficients, side values)) through `layer`, the field's
        `Decompress`; without one, the coefficients as a tensor."""
        if layer is None:
            return f.to_tensor(stored) if isinstance(stored, np.ndarray) else stored
        return layer(stored)

    def describe(self, f: _Spec) -> str:
        from dctdata.encoder.bounds import bound_text  # the CLI's spelling of a bound

        c = _codec(f)
        text = f"cf={c.cf} {c.mask} {c.dtype}"
        if c.bounded:
            text += ", " + bound_text(c)
            if c.corrections is not None:  # the sparse correction list (`dctdata.decoder.corrections`)
                text += f", up to {c.corrections} corrections/sample"
            if c.lattice:  # values snapped onto their grid (`dctdata.codec.lattice`)
                text += ", value lattices"
        return text

    def summary(self, f: _Spec, stats: Any, num: Callable[[float | None], str]) -> str:
        """Its settings and lossless stage, the PSNRs and max error it reached, the bound it holds and overflow."""
        from dctdata.encoder.bounds import bound_text

        c, s = _codec(f), stats
        valid = f", {100 * s.valid_fraction:.1f}% valid pixels" if s.valid_fraction is not None else ""
        stage = (f.lossless or {}).get("id", "raw")
        return (
            f" cf={c.cf} {c.mask} {c.dtype} {stage}: PSNR min {num(s.psnr_min)} / median "
            f"{num(s.psnr_median)} / dataset {num(s.psnr_dataset)} dB, max error {s.max_abs_error:.4g}"
            f"{f' (bound {bound_text(c)}, held on every value)' if c.bounded else ''}, "
            f"overflow {s.overflow}{valid}"
        )

    def transfer_ratio(self, f: _Spec) -> float | None:
        return _codec(f).transfer_ratio


def _codec(f: _Spec) -> CodecSpec:
    if f.codec is None:  # `check_spec` refuses such a FieldSpec; a duck-typed one may still lack it
        raise DctDataError(f"field {f.name!r}: expected a dct field with a codec. Got none")
    return f.codec


# The registry ------------------------------------------------------------------------------------------
_REGISTRY: dict[FieldKind, Kind] = {}


def register(kind: Kind) -> Kind:
    """Register a kind's behaviour under its name (one per `FieldKind` member)."""
    if not isinstance(kind, Kind):
        raise TypeError(f"register: expected a Kind. Got {type(kind).__name__}")
    _REGISTRY[kind.kind] = kind
    return kind


def get(kind: object) -> Kind:
    """The behaviour of a kind (a `FieldKind` or its name); DctDataError naming the kinds for anything else."""
    return _REGISTRY[kind if isinstance(kind, FieldKind) else FieldKind.parse(kind)]


def names() -> tuple[FieldKind, ...]:
    return tuple(_REGISTRY)


get_kind = get  # the name to import it by


for _k in (DctKind(), ArrayKind(), LabelKind()):
    register(_k)

# The kind a field stored exactly as given gets: masks a pack makes, a dct field's side partner, a mask field.
EXACT = FieldKind.ARRAY
# The kind of a field the codec stores (what "the only dct field" means when a caller names none).
CODED = next(k for k, v in _REGISTRY.items() if v.coded)


# Which kind a field gets ---------------------------------------------------------------------------------
def kind_and_reason(
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    *,
    lossy: bool = False,
    override: FieldKind | None = None,
    source_default: str | None = None,
    mask_of: str | None = None,
    distinct: int | None = None,
    by_bound: bool = False,
) -> tuple[FieldKind, str]:
    """(kind, why) of a field: the pack summary prints the why.

    Numeric samples of at least 2 dims are `dct`: floats always, integers when the pack has a lossy
    setting for the field (its target PSNR, --quant other than none, or --cf): a target PSNR is a request
    for lossy coding of the data fields, whatever dtype the instrument wrote (int16 elevations, uint16
    counts, uint8 photos). Without one, integers stay exact, as before; with one, integers of at most
    `FEW_VALUES` distinct values (`distinct`: counted on the calibration subset) are masks or label maps
    and stay exact too. Integer scalars are labels; bool fields, masks, and samples of fewer than 2 dims
    are stored exactly (the codec is 2-D; `--field NAME=dct` codes a 1-D sample as one row, (1, 1, L)).
    `by_bound`: the lossy setting is the field's pointwise bound alone (the why says so)."""
    dims = f"{len(shape)}-D"
    if override is not None:
        return override, f"--field {name}={override.value}"
    if mask_of is not None:
        return FieldKind.ARRAY, f"validity mask of {mask_of!r}, stored exactly"
    if source_default is not None:
        return FieldKind(source_default), "decoded images"
    if dtype.kind == "b":
        return FieldKind.ARRAY, "bool, stored exactly"
    if shape == () and dtype.kind in "iu":
        return FieldKind.LABEL, "one integer per sample"
    if len(shape) < 2:
        what = "one number per sample" if shape == () else f"{dims} samples"
        return FieldKind.ARRAY, (
            f"{what}, stored exactly (the codec is 2-D; --field {name}=dct codes a 1-D sample as one row)"
            if shape != ()
            else f"{what}, stored exactly"
        )
    if dtype.kind == "f":
        return FieldKind.DCT, f"{dtype.name} samples of {dims}"
    if lossy and distinct is not None and distinct <= FEW_VALUES:
        return FieldKind.ARRAY, (
            f"{dtype.name} samples holding {distinct} distinct value{'s' if distinct != 1 else ''} on the "
            f"calibration subset (a mask or label map), stored exactly (--field {name}=dct codes them)"
        )
    if lossy and by_bound:  # the bound alone made it lossy: say so
        return FieldKind.DCT, (
            f"{dtype.name} samples of {dims} with a pointwise bound, a request for lossy coding "
            f"(--field {name}=array keeps them exact)"
        )
    if lossy:
        return (
            FieldKind.DCT,
            f"{dtype.name} samples of {dims} with a lossy setting (--field {name}=array keeps them exact)",
        )
    return (
        FieldKind.ARRAY,
        f"{dtype.name} samples without a lossy setting, stored exactly (a target PSNR codes them as dct)",
    )


__all__ = [
    "CODED",
    "EXACT",
    "FEW_VALUES",
    "ArrayKind",
    "DctKind",
    "Kind",
    "LabelKind",
    "get",
    "get_kind",
    "kind_and_reason",
    "names",
    "register",
]
