"""The packed-dataset format: one module that writers and readers share (FFCV style).

A packed dataset is a directory (or URL prefix) holding `manifest.json` plus storage-specific files.
The manifest is the only thing a reader trusts: it names the format and an integer version (a reader
refuses versions newer than it knows), the dctdata version that wrote it, the sample count, the fields
in sample order and, per field, how it is stored. It also records the pack settings, the error figures
achieved per field, overflow counts, checksums of every stored file, and a free `layout` dict for
storage-specific entries (the zarr writer records its chunking there; the webdataset writer its shard
list `[{name, samples, bytes, sha256}]`).

Conventions (both sides rely on them):
- Field kinds: `dct` (float image-like samples, stored as quantized block-DCT coefficients), `array`
  (stored exactly with the lossless codec: masks, targets), `label` (a scalar per sample).
- A `dct` field's per-sample `shape` is always (C, H, W) (2-D sources get C=1); it is stored as the
  codec's (C, Hb, K, Wb) coefficients (`FieldSpec.stored_shape`). `array`/`label` are stored as-is.
- Sample axis first: storage of a field holds (N, *stored_shape).
- bfloat16 has no numpy dtype: such coefficients are stored as their uint16 bit patterns and viewed
  back as torch.bfloat16 (`to_tensor`).
- zarr: a zarr v3 group at the dataset root, one array per field at path `<field name>`.
- webdataset: sample keys are `sample_key(index)` (zero-padded), entries `<field>.npy` (`entry_name`).
- JSON has no infinities: +/-inf error figures are written as the strings "inf"/"-inf".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Mapping

import numpy as np
import torch

from dctdata.errors import DctDataError, FormatError
from dctdata.lossless import DEFAULT_CODEC, parse_codec_config
from dctdata.spec import CodecSpec

FORMAT_NAME = "dctdata"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
FIELD_KINDS = ("dct", "array", "label")
STORAGES = ("zarr", "webdataset")
SAMPLE_KEY_DIGITS = 9
# Field names become zarr paths and webdataset extensions: keep them plain.
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Sample dtypes a field may hold (numpy names); no objects/strings: never pickle.
SAMPLE_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)  # fmt: skip
# Coefficient dtype (CodecSpec.dtype) -> numpy dtype used on disk.
_CODEC_STORAGE_DTYPE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", "int8": "int8", "int16": "int16"}


def sample_key(index: int) -> str:
    """webdataset `__key__` of sample `index` (zero-padded so lexical order is sample order)."""
    return f"{index:0{SAMPLE_KEY_DIGITS}d}"


def zarr_shard_key(field: str, shard_index: int, ndim: int) -> str:
    """Path (relative to the dataset root) of shard `shard_index` of a field's zarr array of `ndim`
    dims; the zarr writer uses '.'-separated chunk keys so shards are flat files `<field>/c.<i>.0...`."""
    return f"{field}/c." + ".".join([str(shard_index)] + ["0"] * (ndim - 1))


def entry_name(field: str, compressed: bool = False) -> str:
    """webdataset member suffix holding a field (`<field>.npy`, `.npy.zst` with the lossless stage)."""
    return f"{field}.npy.zst" if compressed else f"{field}.npy"


# .npy members of webdataset shards: numpy writes the header as a Python dict literal and parses it
# back with ast.literal_eval. Shard bytes are untrusted, and CPython 3.11's AST construction has a
# recursion-depth bookkeeping bug (gh-106905) that can turn a later, valid parse into a SystemError.
# We only ever read headers in the exact form numpy writes, so match that form strictly instead.
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_RE = re.compile(r"\{'descr': '([<>|=][biuf][0-9]{1,2})', 'fortran_order': (False|True), 'shape': \(((?:[0-9]+, )*[0-9]+,?|)\), \} *\n")


def decode_npy(raw: bytes | bytearray | memoryview, where: str) -> np.ndarray:
    """`.npy` bytes -> a writable numeric array. Strict: the header form numpy writes, numeric dtypes
    only (never objects, so never pickle), and exactly the data bytes the header promises."""
    from dctdata.errors import IntegrityError

    b = memoryview(raw).cast("B")
    if len(b) < 10 or bytes(b[:6]) != _NPY_MAGIC:
        raise IntegrityError(f"{where}: expected .npy bytes. Got no .npy magic")
    major = b[6]
    if major == 1:
        start, hlen = 10, int.from_bytes(b[8:10], "little")
    elif major in (2, 3):
        start, hlen = 12, int.from_bytes(b[8:12], "little")
    else:
        raise IntegrityError(f"{where}: expected .npy format version 1, 2 or 3. Got {major}")
    header = bytes(b[start : start + hlen]).decode("latin1")
    m = _NPY_HEADER_RE.fullmatch(header)
    if m is None:
        if "'descr': '|O'" in header:
            raise IntegrityError(f"{where}: expected a numeric .npy array. Got an object array, which only pickle could load")
        raise IntegrityError(f"{where}: expected a numeric .npy header as numpy writes it. Got {header[:80]!r}")
    dtype = np.dtype(m.group(1))
    shape = tuple(int(v) for v in m.group(3).replace(",", " ").split())
    count = math.prod(shape)
    data = b[start + hlen :]
    if len(data) != count * dtype.itemsize:
        raise IntegrityError(f"{where}: expected {count * dtype.itemsize} data bytes for {dtype} {shape}. Got {len(data)}")
    order = "F" if m.group(2) == "True" else "C"
    return np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order=order).copy(order="C")


def _err(where: str, expected: str, got: object) -> FormatError:
    return FormatError(f"{where}: expected {expected}. Got {got!r}")


def _check_keys(where: str, d: object, required: set[str], optional: set[str] = frozenset()) -> dict:
    if not isinstance(d, Mapping):
        raise _err(where, "a JSON object", d)
    unknown = sorted(set(d) - required - set(optional))
    missing = sorted(required - set(d))
    if unknown:
        raise FormatError(f"{where}: expected keys {sorted(required | set(optional))}. Got unknown keys {unknown}")
    if missing:
        raise FormatError(f"{where}: expected keys {sorted(required | set(optional))}. Got missing keys {missing}")
    return dict(d)


def _int(where: str, v: object, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(where, f"an int >= {minimum}", v)
    return v


def _float_out(v: float | None):
    if v is None or math.isfinite(v):
        return v
    return "inf" if v > 0 else "-inf" if v < 0 else "nan"


def _float_in(where: str, v: object) -> float | None:
    if v is None:
        return None
    if v in ("inf", "-inf", "nan"):
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(where, 'a number, "inf", "-inf" or null', v)
    return float(v)


# Fields ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One field of every sample.

    name: plain identifier. kind: dct|array|label. shape: per-sample shape ((C, H, W) for dct, () for
    label). dtype: numpy name of the source samples. codec: the CodecSpec (dct only; its shape must be
    `shape`). lossless: numcodecs config of the lossless stage ({} for none).
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    codec: CodecSpec | None = None
    lossless: Mapping[str, Any] = dataclasses.field(default_factory=lambda: dict(DEFAULT_CODEC))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise DctDataError(f"field name: expected a plain identifier ([A-Za-z_][A-Za-z0-9_]*). Got {self.name!r}")
        where = f"field {self.name!r}"
        if self.kind not in FIELD_KINDS:
            raise DctDataError(f"{where}: kind: expected one of {FIELD_KINDS}. Got {self.kind!r}")
        if not isinstance(self.shape, (tuple, list)) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.shape):
            raise DctDataError(f"{where}: shape: expected a tuple of positive ints. Got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        dtype = np.dtype(self.dtype).name if isinstance(self.dtype, (np.dtype, type)) else self.dtype
        if dtype not in SAMPLE_DTYPES:
            raise DctDataError(f"{where}: dtype: expected one of {SAMPLE_DTYPES}. Got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "lossless", parse_codec_config(self.lossless or None))
        if self.kind == "dct":
            if not isinstance(self.codec, CodecSpec):
                raise DctDataError(f"{where}: codec: expected a CodecSpec for a dct field. Got {self.codec!r}")
            if self.codec.sample_shape != self.shape:
                raise DctDataError(
                    f"{where}: codec sample shape: expected {self.shape} (C, H, W). Got {self.codec.sample_shape}"
                )
            if dtype == "bool":
                raise DctDataError(f"{where}: dtype: expected a numeric dtype for a dct field. Got 'bool'")
        elif self.codec is not None:
            raise DctDataError(f"{where}: codec: expected None for a {self.kind} field. Got {self.codec!r}")
        if self.kind == "label" and self.shape != ():
            raise DctDataError(f"{where}: shape: expected () for a label field (one scalar per sample). Got {self.shape}")

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """Per-sample shape on disk and as the loader yields it."""
        return tuple(self.codec.coeff_shape) if self.kind == "dct" else self.shape

    @property
    def stored_dtype(self) -> str:
        """numpy dtype name on disk."""
        return _CODEC_STORAGE_DTYPE[self.codec.dtype] if self.kind == "dct" else self.dtype

    @property
    def tensor_dtype(self) -> torch.dtype:
        """torch dtype the loader yields (the codec's wire dtype for dct)."""
        if self.kind == "dct":
            return self.codec.torch_dtype
        return torch.from_numpy(np.zeros(0, self.dtype)).dtype

    @property
    def stored_sample_bytes(self) -> int:
        return int(np.dtype(self.stored_dtype).itemsize * math.prod(self.stored_shape))

    @property
    def source_sample_bytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.shape))

    def to_tensor(self, stored: np.ndarray) -> torch.Tensor:
        """Stored numpy array (any leading dims) -> torch tensor in `tensor_dtype` (no copy if possible)."""
        stored = np.asarray(stored)
        t = torch.from_numpy(stored if stored.flags.c_contiguous else np.ascontiguousarray(stored))  # keeps 0-d
        if self.kind == "dct" and self.codec.dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t

    def to_stored(self, tensor: torch.Tensor) -> np.ndarray:
        """Loader-side tensor -> the numpy array written to disk (inverse of `to_tensor`)."""
        t = tensor.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.uint16) if hasattr(torch, "uint16") else t.view(torch.int16)
            return t.numpy().view(np.uint16)
        return t.numpy()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "codec": None if self.codec is None else self.codec.to_dict(),
            "lossless": dict(self.lossless),
        }

    @classmethod
    def from_dict(cls, d: object, where: str = "field") -> "FieldSpec":
        d = _check_keys(where, d, {"name", "kind", "shape", "dtype", "codec", "lossless"})
        where = f"field {d['name']!r}" if isinstance(d["name"], str) else where
        if not isinstance(d["shape"], list):
            raise _err(f"{where}: shape", "a list of ints", d["shape"])
        codec = None
        if d["codec"] is not None:
            try:
                codec = CodecSpec.from_dict(d["codec"])
            except (DctDataError, TypeError) as exc:
                raise FormatError(f"{where}: codec: {exc}") from exc
        try:
            return cls(d["name"], d["kind"], tuple(d["shape"]), d["dtype"], codec, d["lossless"])
        except (DctDataError, TypeError) as exc:
            raise FormatError(str(exc)) from exc


# Error figures -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FieldStats:
    """Achieved fidelity of one field over all samples (PSNR against each sample's value range)."""

    psnr_min: float | None = None
    psnr_median: float | None = None
    max_abs_error: float | None = None
    overflow: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "psnr_min": _float_out(self.psnr_min),
            "psnr_median": _float_out(self.psnr_median),
            "max_abs_error": _float_out(self.max_abs_error),
            "overflow": self.overflow,
        }

    @classmethod
    def from_dict(cls, d: object, where: str) -> "FieldStats":
        d = _check_keys(where, d, {"psnr_min", "psnr_median", "max_abs_error", "overflow"})
        return cls(
            _float_in(f"{where}: psnr_min", d["psnr_min"]),
            _float_in(f"{where}: psnr_median", d["psnr_median"]),
            _float_in(f"{where}: max_abs_error", d["max_abs_error"]),
            _int(f"{where}: overflow", d["overflow"]),
        )


# Manifest ----------------------------------------------------------------------------------------
def _default_version() -> str:
    from dctdata import __version__

    return __version__


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs; written last by a pack, read first by a loader.

    checksums: relative file path -> {"sha256": hex, "bytes": n} for every stored data file.
    layout: storage-specific entries (zarr chunking, webdataset shard list).
    """

    storage: str
    samples: int
    fields: tuple[FieldSpec, ...]
    pack: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stats: Mapping[str, FieldStats] = dataclasses.field(default_factory=dict)
    checksums: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    layout: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    dctdata_version: str = dataclasses.field(default_factory=_default_version)

    def __post_init__(self) -> None:
        if self.format != FORMAT_NAME:
            raise FormatError(f"manifest format: expected {FORMAT_NAME!r}. Got {self.format!r}")
        _check_version(self.version)
        if self.storage not in STORAGES:
            raise DctDataError(f"storage: expected one of {STORAGES}. Got {self.storage!r}")
        _int("samples", self.samples)
        fields = tuple(self.fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise DctDataError(f"fields: expected one or more FieldSpec. Got {self.fields!r}")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise DctDataError(f"fields: expected unique names. Got {names}")
        object.__setattr__(self, "fields", fields)
        unknown = sorted(set(self.stats) - set(names))
        if unknown:
            raise DctDataError(f"stats: expected entries for fields {names}. Got unknown {unknown}")
        for path, entry in self.checksums.items():
            where = f"checksums[{path!r}]"
            check_relative_path(where, path)
            entry = _check_keys(where, entry, {"sha256", "bytes"})
            if not isinstance(entry["sha256"], str) or not _SHA256_RE.match(entry["sha256"]):
                raise _err(f"{where}: sha256", "64 lowercase hex digits", entry["sha256"])
            _int(f"{where}: bytes", entry["bytes"])
        for name in ("pack", "layout"):
            if not isinstance(getattr(self, name), Mapping):
                raise TypeError(f"{name}: expected a mapping. Got {type(getattr(self, name)).__name__}")
            # Store what JSON will give back, so a manifest equals its read-back copy.
            object.__setattr__(self, name, _json_ready(dict(getattr(self, name))))
        object.__setattr__(self, "stats", dict(self.stats))
        object.__setattr__(self, "checksums", {k: dict(v) for k, v in self.checksums.items()})

    # Convenience ---------------------------------------------------------------------------------
    @property
    def stored_bytes(self) -> int:
        """Bytes of every stored file the manifest lists (recorded at pack time with their sha256)."""
        return sum(e["bytes"] for e in self.checksums.values())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str | None = None, kind: str | None = None) -> FieldSpec:
        """The named field; with name=None, the only field of `kind` (error if zero or several)."""
        if name is not None:
            for f in self.fields:
                if f.name == name:
                    return f
            raise DctDataError(f"field: expected one of {list(self.names)}. Got {name!r}")
        matches = [f for f in self.fields if kind is None or f.kind == kind]
        if len(matches) != 1:
            raise DctDataError(
                f"field: expected a field name; this dataset has {len(matches)} {kind + ' ' if kind else ''}fields "
                f"{[f.name for f in matches]}"
            )
        return matches[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "dctdata_version": self.dctdata_version,
            "storage": self.storage,
            "samples": self.samples,
            "fields": [f.to_dict() for f in self.fields],
            "pack": _json_ready(dict(self.pack)),
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
            "checksums": {k: dict(v) for k, v in self.checksums.items()},
            "layout": _json_ready(dict(self.layout)),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: object, where: str = "manifest") -> "Manifest":
        if not isinstance(d, Mapping):
            raise _err(where, "a JSON object", type(d).__name__)
        # Format and version first, so a newer file is refused with the right message.
        if d.get("format") != FORMAT_NAME:
            raise _err(f"{where}: format", repr(FORMAT_NAME), d.get("format"))
        _check_version(d.get("version"), where)
        d = _check_keys(
            where,
            d,
            {"format", "version", "dctdata_version", "storage", "samples", "fields", "pack", "stats", "checksums", "layout"},
        )
        if not isinstance(d["fields"], list):
            raise _err(f"{where}: fields", "a list", d["fields"])
        fields = tuple(FieldSpec.from_dict(f, f"{where}: fields[{i}]") for i, f in enumerate(d["fields"]))
        if not isinstance(d["stats"], Mapping):
            raise _err(f"{where}: stats", "a JSON object", d["stats"])
        stats = {k: FieldStats.from_dict(v, f"{where}: stats[{k!r}]") for k, v in d["stats"].items()}
        if not isinstance(d["dctdata_version"], str):
            raise _err(f"{where}: dctdata_version", "a string", d["dctdata_version"])
        if not isinstance(d["checksums"], Mapping):
            raise _err(f"{where}: checksums", "a JSON object", d["checksums"])
        try:
            return cls(
                storage=d["storage"],
                samples=_int(f"{where}: samples", d["samples"]),
                fields=fields,
                pack=d["pack"],
                stats=stats,
                checksums=d["checksums"],
                layout=d["layout"],
                format=d["format"],
                version=d["version"],
                dctdata_version=d["dctdata_version"],
            )
        except FormatError:
            raise
        except (DctDataError, TypeError) as exc:
            raise FormatError(f"{where}: {exc}") from exc


def _check_version(version: object, where: str = "manifest") -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _err(f"{where}: version", f"an int in 1..{FORMAT_VERSION}", version)
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{where}: version: expected <= {FORMAT_VERSION} (the newest this dctdata reads). Got {version}: "
            "the dataset was written by a newer dctdata; upgrade dctdata to read it"
        )
    return version


def _json_ready(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_ready(x) for x in v]
    if isinstance(v, float):
        return _float_out(v)
    if isinstance(v, (np.integer, np.floating)):
        return _json_ready(v.item())
    return v


# Layout ------------------------------------------------------------------------------------------
def check_relative_path(where: str, path: object) -> str:
    """A stored file's path relative to the dataset root: '/'-separated plain names, never absolute,
    never '..' or '.', no backslashes or drive letters, so nothing a manifest names lies outside it."""
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or any(p in ("", ".", "..") or "\\" in p or ":" in p or "\x00" in p for p in parts):
        raise _err(where, "a relative path inside the dataset ('/'-separated names, no '..', no absolute path)", path)
    return path


def zarr_layout(m: "Manifest", fields: tuple[FieldSpec, ...] | None = None, where: str = "manifest") -> dict[str, dict[str, Any]]:
    """The zarr writer's `layout.arrays` entries, validated: {field: {path, chunk, shard}} with path the
    field name (a plain identifier, so it cannot point outside the dataset) and shard a multiple of chunk."""
    arrays = m.layout.get("arrays") if isinstance(m.layout, Mapping) else None
    if not isinstance(arrays, Mapping):
        raise _err(f"{where}: layout.arrays", "an object {field: {path, chunk, shard}}", arrays)
    out = {}
    for f in m.fields if fields is None else fields:
        w = f"{where}: layout.arrays[{f.name!r}]"
        if f.name not in arrays:
            raise FormatError(f"{w}: expected an entry for field {f.name!r}. Got entries {sorted(arrays)}")
        e = _check_keys(w, arrays[f.name], {"path", "chunk", "shard"})
        if not isinstance(e["path"], str) or not _NAME_RE.match(e["path"]):
            raise _err(f"{w}.path", "a plain identifier (the array's name in the group)", e["path"])
        chunk, shard = _int(f"{w}.chunk", e["chunk"], 1), _int(f"{w}.shard", e["shard"], 1)
        if shard % chunk:
            raise _err(f"{w}.shard", f"a multiple of chunk={chunk}", shard)
        out[f.name] = {"path": e["path"], "chunk": chunk, "shard": shard}
    return out


# Locations ---------------------------------------------------------------------------------------
def is_url(path_or_url: object) -> bool:
    return isinstance(path_or_url, str) and "://" in path_or_url and not path_or_url.startswith("file://")


def join(root: str | os.PathLike, *parts: str) -> str:
    """Join a dataset root (local path or URL prefix) with relative parts, using '/' for URLs."""
    root = os.fspath(root)
    if is_url(root):
        return "/".join([root.rstrip("/"), *parts])
    return os.path.join(root, *parts)


def manifest_location(path_or_url: str | os.PathLike) -> tuple[str, str]:
    """(dataset root, manifest path/URL): accepts the dataset root or its manifest.json."""
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url: expected a path or URL string. Got {type(path_or_url).__name__}")
    s = os.fspath(path_or_url)
    if s.startswith("file://"):
        s = s[len("file://") :]
    if s.rstrip("/").endswith("/" + MANIFEST_NAME) or s == MANIFEST_NAME:
        root = s.rstrip("/")[: -len(MANIFEST_NAME)].rstrip("/") or "."
        return root, s
    return s, join(s, MANIFEST_NAME)


def read_manifest(path_or_url: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """Read and strictly validate a manifest (local path or fsspec URL; the root or manifest.json).
    `storage_options` go to fsspec for URLs (e.g. an S3 endpoint)."""
    root, loc = manifest_location(path_or_url)
    try:
        if is_url(loc):
            import fsspec

            with fsspec.open(loc, "rb", **dict(storage_options or {})) as fh:
                raw = fh.read()
        else:
            if not os.path.isdir(root):
                raise FileNotFoundError(f"dataset: expected a packed dataset directory. Got missing path {root!r}")
            with open(loc, "rb") as fh:
                raw = fh.read()
    except FileNotFoundError as exc:
        raise FormatError(
            f"{loc}: expected a dctdata manifest ({MANIFEST_NAME}). Got no such file"
            + ("" if os.path.exists(root) or is_url(root) else f" (no dataset at {root!r})")
        ) from exc
    except OSError as exc:  # a directory named manifest.json, permissions, I/O errors
        raise FormatError(f"{loc}: expected a readable dctdata manifest. Got {type(exc).__name__}: {exc}") from exc
    return parse_manifest(raw, loc)


def parse_manifest(raw: bytes, where: str = "manifest") -> Manifest:
    """Manifest from the raw bytes of a manifest.json; any malformed input raises FormatError (never
    another exception: fuzzed in tests/test_fuzz.py). JSON only: nothing in it is ever evaluated."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"raw: expected bytes. Got {type(raw).__name__}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    # ValueError: numbers past Python's int-digit limit; RecursionError: absurdly deep nesting.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{where}: expected a JSON manifest. Got unreadable JSON: {type(exc).__name__}: {str(exc)[:200]}") from exc
    return Manifest.from_dict(d, where=where)


def write_manifest(manifest: Manifest, directory: str | os.PathLike) -> str:
    """Write `directory/manifest.json` atomically (temporary sibling + rename); returns its path."""
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest: expected a dctdata.format.Manifest. Got {type(manifest).__name__}")
    text = manifest.to_json()
    # Validate what a reader will see before committing.
    Manifest.from_dict(json.loads(text))
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path
