"""`FieldSpec`: one field of every sample, and how it is stored (shared by every writer and reader).

Conventions both sides rely on:
- A `dct` field's per-sample `shape` is always (C, H, W) (2-D sources get C=1); it is stored as the
  codec's (C, Hb, K, Wb) coefficients (`stored_shape`). A volume (format version 5, `codec.depth`) is
  (C, D, H, W), stored as (C, Db, Hb, K, Wb). `array`/`label` fields are stored as they are.
- Sample axis first: storage of a field holds (N, *stored_shape).
- bfloat16 has no numpy dtype: such coefficients are stored as their uint16 bit patterns and viewed
  back as torch.bfloat16 (`to_tensor`).
- Masked data (format version 2): a `dct` field may name the field holding its validity mask
  (`valid`: an exact `array` field of bool or integers, nonzero = valid, broadcastable to the field's
  (C, H, W)); error figures of the field count only valid pixels. `attrs` carries what the source said
  about the field (units, long_name, the source's dimension names), as JSON.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dctdata.codec.spec import INTEGER_DTYPES, MAX_SAMPLE_VALUES, CodecSpec
from dctdata.errors import DctDataError, FormatError
from dctdata.format.kinds import EXACT, Kind, get_kind
from dctdata.kinds import FieldKind
from dctdata.parse import is_int, parse_object
from dctdata.stages import DEFAULT_CODEC, get_stage, parse_config

# Field names become zarr paths and webdataset extensions: keep them plain.
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A dct field whose spec carries per-sample side information is stored with a partner `array` field
# `<name>__side` ((C, 2) float32: range, mid); readers hand the two to the user as one value.
SIDE_SUFFIX = "__side"
# Sample dtypes a field may hold (numpy names); no objects/strings: never pickle.
SAMPLE_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
# An array field's per-sample dims at most (numpy allows 64); its values are bounded as a dct field's
# (MAX_SAMPLE_VALUES): a manifest must not size a reader's arrays past what numpy can even describe.
MAX_DIMS = 32
# Coefficient dtype (CodecSpec.dtype) -> numpy dtype used on disk.
_CODEC_STORAGE_DTYPE = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "uint16",
    "int8": "int8",
    "int16": "int16",
}


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One field of every sample.

    name: plain identifier. kind: a `FieldKind` (or its name). shape: per-sample shape ((C, H, W) for
    dct, () for label). dtype: numpy name of the source samples. codec: the CodecSpec (dct only; its
    shape must be `shape`). lossless: numcodecs config of the lossless stage ({} for none). valid: name
    of the field holding this dct field's validity mask (None: every pixel is valid). attrs: JSON
    metadata from the source (units, ...).
    """

    name: str
    kind: FieldKind
    shape: tuple[int, ...]
    dtype: str
    codec: CodecSpec | None = None
    lossless: Mapping[str, Any] = dataclasses.field(default_factory=lambda: dict(DEFAULT_CODEC))
    valid: str | None = None
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Why the pack gave the field its kind (the pack summary prints it). Not stored: a manifest read back has
    # None, and it takes no part in equality.
    reason: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise DctDataError(f"field name: expected a plain identifier ([A-Za-z_][A-Za-z0-9_]*). Got {self.name!r}")
        where = f"field {self.name!r}"
        kind = FieldKind.parse(self.kind, f"{where}: kind")
        object.__setattr__(self, "kind", kind)
        if not isinstance(self.shape, (tuple, list)) or any(not is_int(s) or s < 1 for s in self.shape):
            raise DctDataError(f"{where}: shape: expected a tuple of positive ints. Got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if len(self.shape) > MAX_DIMS or math.prod(self.shape) > MAX_SAMPLE_VALUES:
            raise DctDataError(
                f"{where}: shape: expected at most {MAX_DIMS} dims and {MAX_SAMPLE_VALUES} values per sample. Got "
                f"{list(self.shape)} ({math.prod(self.shape)} values)"
            )
        dtype = np.dtype(self.dtype).name if isinstance(self.dtype, (np.dtype, type)) else self.dtype
        if dtype not in SAMPLE_DTYPES:
            raise DctDataError(f"{where}: dtype: expected one of {SAMPLE_DTYPES}. Got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "lossless", parse_config(self.lossless or None, f"{where}: lossless"))
        self.kind_type.check_spec(self, where)
        if self.valid is not None:
            if not self.coded:  # only a coded field's figures count valid pixels
                raise DctDataError(f"{where}: valid: expected None for a {kind} field. Got {self.valid!r}")
            if not isinstance(self.valid, str) or not NAME_RE.match(self.valid) or self.valid == self.name:
                raise DctDataError(f"{where}: valid: expected the name of another field. Got {self.valid!r}")
        stage = get_stage(self.lossless)
        if stage.needs_shape and not (self.coded and (self.stored_dtype in INTEGER_DTYPES or not stage.integer_only)):
            raise DctDataError(
                f"{where}: lossless: expected a bytes codec for a {kind} field of {self.stored_dtype} (the "
                f"{stage.codec_id!r} stage codes {'integer ' if stage.integer_only else ''}dct coefficients only). "
                f"Got {stage.codec_id!r}"
            )
        object.__setattr__(self, "attrs", check_attrs(self.attrs, f"{where}: attrs"))

    @property
    def kind_type(self) -> Kind:
        """The kind's behaviour (`dctdata.format.kinds`): its checks, encode, decode and description."""
        return get_kind(self.kind)

    @property
    def coded(self) -> bool:
        """Whether the field is stored as its codec's coefficients (a dct field), not exactly as given."""
        return self.kind_type.coded

    @property
    def is_dct(self) -> bool:
        """Whether the field is coded (`coded`; the older name, kept for callers)."""
        return self.coded

    @property
    def dct_codec(self) -> CodecSpec:
        """The CodecSpec of a dct field (every dct field has one, no other field has one), for code that handles
        dct fields only; DctDataError naming the field for any other."""
        if self.codec is None:
            raise DctDataError(f"field {self.name!r}: expected a dct field with a codec. Got a {self.kind} field")
        return self.codec

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """Per-sample shape on disk and as the loader yields it."""
        return tuple(self.codec.coeff_shape) if self.codec is not None else self.shape  # dct fields have a codec

    @property
    def stored_dtype(self) -> str:
        """numpy dtype name on disk."""
        return _CODEC_STORAGE_DTYPE[self.codec.dtype] if self.codec is not None else self.dtype

    @property
    def tensor_dtype(self) -> torch.dtype:
        """torch dtype the loader yields (the codec's wire dtype for dct)."""
        if self.codec is not None:
            return self.codec.torch_dtype
        return torch.from_numpy(np.zeros(0, self.dtype)).dtype

    @property
    def stored_sample_bytes(self) -> int:
        return int(np.dtype(self.stored_dtype).itemsize * math.prod(self.stored_shape))

    @property
    def source_sample_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.shape))

    def to_tensor(self, stored: npt.NDArray[Any]) -> torch.Tensor:
        """Stored numpy array (any leading dims) -> torch tensor in `tensor_dtype` (no copy if possible)."""
        stored = np.asarray(stored)
        t = torch.from_numpy(stored if stored.flags.c_contiguous else np.ascontiguousarray(stored))  # keeps 0-d
        if self.codec is not None and self.codec.dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t

    def to_stored(self, tensor: torch.Tensor) -> npt.NDArray[Any]:
        """Loader-side tensor -> the numpy array written to disk (inverse of `to_tensor`)."""
        t = tensor.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.uint16) if hasattr(torch, "uint16") else t.view(torch.int16)
            return t.numpy().view(np.uint16)
        return t.numpy()

    def check_valid_field(self, mask: FieldSpec) -> None:
        """`mask` can be this dct field's validity mask: exact, bool/integer, broadcastable to (C, H, W)."""
        where = f"field {self.name!r}: valid field {mask.name!r}"
        if mask.kind is not EXACT or mask.dtype.startswith("float"):
            raise DctDataError(f"{where}: expected an array field of bool or integers. Got {mask.kind} {mask.dtype}")
        try:
            np.broadcast_shapes(mask.shape, self.shape)
            ok = len(mask.shape) <= len(self.shape) and np.broadcast_shapes(mask.shape, self.shape) == self.shape
        except ValueError:
            ok = False
        if not ok:
            raise DctDataError(
                f"{where}: expected a per-sample shape broadcastable to {self.shape} ((C, H, W), (1, H, W) or (H, W)). "
                f"Got {mask.shape}"
            )

    def to_dict(self, packed: bool = True) -> dict[str, Any]:
        """The manifest's JSON of the field; `packed`: its codec's large tables as `pack_tables` writes them
        (manifest version >= TABLES_VERSION)."""
        codec = None if self.codec is None else self.codec.to_dict()
        out = {
            "name": self.name,
            "kind": self.kind.value,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "codec": pack_tables(codec) if packed and codec is not None else codec,
            "lossless": dict(self.lossless),
        }
        if self.valid is not None:
            out["valid"] = self.valid
        if self.attrs:
            out["attrs"] = json_copy(self.attrs)
        return out

    @classmethod
    def from_dict(cls, d: object, where: str = "field", version: int = 2) -> FieldSpec:
        """From a manifest's JSON; `version` is the manifest's (keys `valid`/`attrs` exist from version 2, codec
        `weights` from version 5)."""
        optional = {"valid", "attrs"} if version >= 2 else set()
        d = parse_object(d, where, {"name", "kind", "shape", "dtype", "codec", "lossless"}, optional, error=FormatError)
        where = f"field {d['name']!r}" if isinstance(d["name"], str) else where
        if not isinstance(d["shape"], list):
            raise FormatError(f"{where}: shape: expected a list of ints. Got {d['shape']!r}")
        codec = None
        if version < 5 and isinstance(d["codec"], Mapping) and "weights" in d["codec"]:
            raise FormatError(
                f"{where}: codec: weights: expected none in a version {version} manifest (channel weights are version "
                f"5). Got {d['codec']['weights']!r}"
            )
        if d["codec"] is not None:
            try:
                codec = CodecSpec.from_dict(unpack_tables(d["codec"], version))
            except (DctDataError, TypeError) as exc:
                raise FormatError(f"{where}: codec: {exc}") from exc
            if codec.bounded and version < BOUNDS_VERSION:
                raise FormatError(
                    f"{where}: codec: expected no max_error/max_rel_error in a version {version} manifest (they "
                    f"came with version {BOUNDS_VERSION}). Got {codec.max_error}/{codec.max_rel_error}"
                )
        try:
            return cls(
                d["name"],
                d["kind"],
                tuple(d["shape"]),
                d["dtype"],
                codec,
                d["lossless"],
                d.get("valid"),
                d["attrs"] if d.get("attrs") is not None else {},  # none: no metadata
            )
        except (DctDataError, TypeError) as exc:
            raise FormatError(str(exc)) from exc


# The manifest version whose dct codecs may record a pointwise error bound (`dctdata.encoder.bounds`).
BOUNDS_VERSION = 5
# The manifest version whose dct codecs may store a table as {"f32z": base64 of zlib of its little-endian
# float32 values, row-major (C, K)}: a volume's 512-entry step and reconstruction tables took 6.1 and 3.4 KB as
# JSON numbers, more than the coefficients of a small volume; their values repeat, so zlib packs them to tens
# or hundreds of bytes. The values are float32 already (`dctdata.codec.spec`), so the round trip is exact.
TABLES_VERSION = 6
PACKED_TABLES = ("steps", "offsets", "recon")
# The manifest version whose dct codecs may say pad "extend" (`dctdata.codec.transform.extend_axis`): the encoder
# fills a partial block from its own pixels. Decoders crop the padding whatever fills it, so nothing else moves:
# the version keeps an older dctdata from reading the new value (it refuses the newer version by name), and a
# reader accepts the value in any version (no decoder depends on it).
EXTEND_VERSION = 7
PACK_MIN_VALUES = 16  # smaller tables stay JSON numbers (readable, and no larger)
_F32Z = "f32z"
_MAX_KEPT = 512  # a volume block's frequencies: no table row is longer


def table_json(table: list[Any]) -> object:
    """One (C, K) table as a manifest writes it (version 6 on): one value per channel when every row is constant
    (read back as that value for every frequency), else {"f32z": ...} when it has at least PACK_MIN_VALUES
    values, else the rows as they are. `dctdata.encoder.tables` counts a table's bytes with this."""
    values = np.asarray(table, dtype="<f4").reshape(len(table), -1)
    if values.size and bool((values == values[:, :1]).all()):
        return [row[0] for row in table]
    if values.size >= PACK_MIN_VALUES:
        return {_F32Z: base64.b64encode(zlib.compress(values.tobytes(), 9)).decode("ascii")}
    return table


def pack_tables(codec: dict[str, Any]) -> dict[str, Any]:
    """A codec's JSON (`CodecSpec.to_dict`) with each (C, K) table as `table_json` writes it (see
    TABLES_VERSION); one-value-per-channel tables stay lists."""
    out = dict(codec)
    for name in PACKED_TABLES:
        table = out.get(name)
        if isinstance(table, list) and table and isinstance(table[0], list):
            out[name] = table_json(table)
    return out


def unpack_tables(codec: object, version: int) -> object:
    """Inverse of `pack_tables` on a manifest's codec JSON of `version`: packed tables back to nested lists
    (C rows, C the codec's `channels`). A packed table in an older manifest, or one that is not valid base64
    of zlib of whole rows of float32, is a FormatError naming the table; at most C x 512 values are inflated."""
    if not isinstance(codec, Mapping) or not any(isinstance(codec.get(n), Mapping) for n in PACKED_TABLES):
        return codec
    out = dict(codec)
    channels = out.get("channels", 1)
    for name in PACKED_TABLES:
        table = out.get(name)
        if not isinstance(table, Mapping):
            continue
        if version < TABLES_VERSION:
            raise FormatError(
                f"{name}: expected a list of numbers in a version {version} manifest (packed tables came with "
                f"version {TABLES_VERSION}). Got {dict(table)!r}"
            )
        if set(table) != {_F32Z} or not isinstance(table[_F32Z], str) or not is_int(channels) or channels < 1:
            raise FormatError(f"{name}: expected {{{_F32Z!r}: base64 text}} and an int channels. Got {dict(table)!r}")
        limit = channels * _MAX_KEPT * 4
        try:
            inflate = zlib.decompressobj()
            raw = inflate.decompress(base64.b64decode(table[_F32Z], validate=True), limit + 1)
            complete = inflate.eof and not inflate.unconsumed_tail and not inflate.unused_data
        except (binascii.Error, ValueError, zlib.error) as exc:
            raise FormatError(f"{name}: expected base64 of zlib-compressed float32 values. Got {exc}") from None
        if not complete or len(raw) > limit or len(raw) % (4 * channels) or not raw:
            raise FormatError(
                f"{name}: expected one zlib stream of {channels} rows of at most {_MAX_KEPT} float32 values. Got "
                f"{len(raw)} bytes{'' if complete else ' (a stream that does not end there)'}"
            )
        out[name] = np.frombuffer(raw, "<f4").reshape(channels, -1).astype(float).tolist()
    return out


def side_field(f: FieldSpec) -> FieldSpec:
    """The stored partner of a dct field with side information: (C, 2) float32 per sample (with corrections
    (C + 1 + cap, 2), `dctdata.decoder.corrections`), zstd; float64 for a field that decodes in float64
    (`CodecSpec.precision`)."""
    codec = f.dct_codec
    return FieldSpec(f.name + SIDE_SUFFIX, EXACT, (codec.side_rows, 2), codec.side_dtype, lossless=DEFAULT_CODEC)


def has_side(f: FieldSpec) -> bool:
    return f.codec is not None and f.codec.side is not None  # dct fields only have a codec


def side_partner_names(fields: Sequence[FieldSpec]) -> set[str]:
    """Names of the stored side partners among `fields`' dct fields."""
    return {f.name + SIDE_SUFFIX for f in fields if has_side(f)}


def user_fields(fields: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
    """The fields a sample has for the user: stored side partners are part of their dct field's value."""
    partners = side_partner_names(fields)
    return tuple(f for f in fields if f.name not in partners)


def with_partners(fields: tuple[FieldSpec, ...], names: Sequence[str]) -> tuple[FieldSpec, ...]:
    """The stored fields to read for the user fields `names` (each dct field's side partner included)."""
    by_name = {f.name: f for f in fields}
    out = []
    for n in names:
        f = by_name[n]
        out.append(f)
        if has_side(f):
            out.append(by_name[n + SIDE_SUFFIX])
    return tuple(out)


def assemble(fields: tuple[FieldSpec, ...], values: Sequence[Any]) -> list[Any]:
    """Stored values of one sample (or batch) in `fields` order -> the user's values: a dct field with
    side information becomes the pair (coefficients, side) that `Decompress` takes (`with_side`)."""
    by_name = dict(zip((f.name for f in fields), values))
    return [
        with_side(by_name[f.name], by_name[f.name + SIDE_SUFFIX]) if has_side(f) else by_name[f.name]
        for f in user_fields(fields)
    ]


def with_side(value: Any, side: Any) -> Any:
    """A dct field's value with its side values: the pair (coefficients, side); a stored sample
    (`dctdata.decoder.wire.StoredSample`, decode="device") carries them itself."""
    attach = getattr(value, "with_side", None)
    return attach(side) if attach is not None else (value, side)


# Metadata: JSON values (what a source says about a field or coordinate) -----------------------------
ATTRS_MAX_DEPTH = 8


def check_attrs(attrs: object, where: str) -> dict[str, Any]:
    """A JSON object of metadata: string keys; values null, bool, finite numbers, strings, lists or
    objects of those (at most ATTRS_MAX_DEPTH deep). Returned as a plain copy."""
    if attrs is None:
        return {}
    if not isinstance(attrs, Mapping):
        raise DctDataError(f"{where}: expected a JSON object (a mapping). Got {type(attrs).__name__}")
    _check_json(attrs, where, 0)
    return {k: json_copy(v) for k, v in attrs.items()}


def _check_json(v: object, where: str, depth: int) -> None:
    if depth > ATTRS_MAX_DEPTH:
        raise DctDataError(f"{where}: expected at most {ATTRS_MAX_DEPTH} levels of nesting. Got deeper")
    if v is None or isinstance(v, (bool, str)) or (isinstance(v, int) and not isinstance(v, bool)):
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise DctDataError(f"{where}: expected finite numbers. Got {v!r}")
        return
    if isinstance(v, Mapping):
        for k, x in v.items():
            if not isinstance(k, str):
                raise DctDataError(f"{where}: expected string keys. Got {k!r}")
            _check_json(x, f"{where}.{k}", depth + 1)
        return
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _check_json(x, f"{where}[{i}]", depth + 1)
        return
    raise DctDataError(
        f"{where}: expected JSON values (null, bool, number, string, list, object). Got {type(v).__name__}"
    )


def json_copy(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: json_copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_copy(x) for x in v]
    return v
