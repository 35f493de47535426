"""The manifest: the only thing a reader trusts, written last by a pack (the commit), read first.

It names the format and an integer version (a reader refuses versions newer than it knows), the
dctdata version that wrote it, the sample count, the fields in sample order and, per field, how it is
stored. It also records the pack settings, the error figures achieved per field, overflow counts,
checksums of every stored file, and a free `layout` dict for storage-specific entries (zarr chunking,
the webdataset shard list). JSON has no infinities: +/-inf error figures are written as "inf"/"-inf".

Versions (a reader reads every version up to FORMAT_VERSION, each with its own strict key set): what
each version adds and which readers read it is the "Version history" of docs/format.md, written once
there. Where the code keeps them: version 2's compact form (`figure`, `PACK_DEFAULTS`: a reader fills the
left-out entries back); version 3 (`compact_json`, `full_json`: a `Manifest` in memory always has the
full form, so every reader of it is unchanged); version 4's inline side values
(`zarr.layout.INLINE_BYTES`); version 5's seal (`manifest_seal`), error bounds (`dctdata.encoder.bounds`), volumes
(`VOLUMES_VERSION`), channel weights (codec v3, `dctdata.codec.spec.CodecSpec`) and grouped webdataset members
(`dctdata.format.webdataset.layout`); version 6's packed tables (`dctdata.format.fields.TABLES_VERSION`); version 7's
pad "extend" (`dctdata.format.fields.EXTEND_VERSION`); version 8's fewer fixed bytes (`dctdata.format.compact`).
"""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from dctdata._version import __version__
from dctdata.errors import DctDataError, FormatError, IntegrityError
from dctdata.format.atomic import atomic_write
from dctdata.format.checksum import read_expected, with_path
from dctdata.format.compact import COMPACT_VERSION, b64_digest, compact_v8, full_v8
from dctdata.format.coords import check_coords
from dctdata.format.fields import SIDE_SUFFIX, TABLES_VERSION, FieldSpec, has_side, side_field, user_fields
from dctdata.format.kinds import CODED, get_kind
from dctdata.format.location import (
    MANIFEST_NAME,
    check_relative_path,
    fsspec_options,
    is_url,
    join,
    manifest_location,
    open_file,
)
from dctdata.format.storages import get as get_storage
from dctdata.format.storages import names as storage_names
from dctdata.kinds import FieldKind
from dctdata.parse import is_number, parse_int, parse_object

FORMAT_NAME = "dctdata"
FORMAT_VERSION = 8
SEAL_VERSION = 5  # manifests from this version on carry a `seal` (see the module docstring)
SEALED = ("format", "version", "storage", "samples", "fields", "layout", "checksums", "coords")
VOLUMES_VERSION = 5  # the first version whose dct fields may be volumes
PRECISION_VERSION = 6  # the first version whose dct fields may decode in float64 (`CodecSpec.precision`)
STORAGES = storage_names()  # the registered storages (`dctdata.format.storages`)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_MANIFEST_KEYS = {
    "format",
    "version",
    "dctdata_version",
    "storage",
    "samples",
    "fields",
    "pack",
    "stats",
    "checksums",
    "layout",
}
_MANIFEST_KEYS_V2 = {"coords"}


def _count(where: str, v: object, minimum: int = 0) -> int:
    """A count read from a manifest: wrong types are format errors too."""
    return parse_int(v, where, minimum=minimum, type_error=FormatError, range_error=FormatError)


# The manifest's `pack` entries (the pack settings, `dctdata.preprocess.plan.Settings.record`) and their
# defaults: a writer leaves out entries at their default, a reader (and every Manifest) has them all.
PACK_DEFAULTS: Mapping[str, Any] = {
    "source": None,
    "cf": None,
    "mask": None,
    "quant": None,
    "target_psnr": None,
    "max_error": None,
    "max_rel_error": None,
    "key": None,
    "channels_last": False,
    "nan": "error",
    "valid": {},
    "sample_dim": None,
    "time_dim": None,
    "variables": None,
    "stack": None,
    "nan_filled": 0,
    "source_info": {},
    "dims": 2,
}
FIGURE_DIGITS = 6


def figure(v: float | None, rounding: str = "nearest") -> float | None:
    """An error figure as the manifest keeps it: FIGURE_DIGITS significant digits (35.1468 dB, not
    35.146764592772236: the rest is noise of the measurement and costs bytes in every pack). rounding
    "down" for PSNRs and "up" for errors, so a figure never claims more than the pack achieved. Not
    `dctdata.codec.spec.f32`: figures of float64 fields may be past float32's range."""
    if v is None or not math.isfinite(v):
        return v
    mode = {"nearest": decimal.ROUND_HALF_EVEN, "down": decimal.ROUND_FLOOR, "up": decimal.ROUND_CEILING}[rounding]
    return float(decimal.Context(prec=FIGURE_DIGITS, rounding=mode).create_decimal(float(v)))


def _float_out(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "inf" if v > 0 else "-inf" if v < 0 else "nan"


def _float_in(where: str, v: object) -> float | None:
    if v is None:
        return None
    if v in ("inf", "-inf", "nan"):
        return float(v)
    if not is_number(v):
        raise FormatError(f'{where}: expected a number, "inf", "-inf" or null. Got {v!r}')
    return float(v)


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


@dataclasses.dataclass(frozen=True)
class ChannelStats:
    """Achieved fidelity of one channel of a dct field over all samples (valid pixels only)."""

    psnr_min: float | None = None
    psnr_median: float | None = None
    psnr_dataset: float | None = None
    max_abs_error: float | None = None

    _KEYS = ("psnr_min", "psnr_median", "psnr_dataset", "max_abs_error")

    def to_dict(self) -> dict[str, Any]:
        return {k: _float_out(getattr(self, k)) for k in self._KEYS}

    @classmethod
    def from_dict(cls, d: object, where: str) -> ChannelStats:
        d = parse_object(d, where, cls._KEYS, error=FormatError)
        return cls(*(_float_in(f"{where}: {k}", d[k]) for k in cls._KEYS))


@dataclasses.dataclass(frozen=True)
class FieldStats:
    """Achieved fidelity of one field over all samples. An item is one channel of one sample; its PSNR
    is against its own value range, over its valid pixels (version 1 packs: one item per sample).

    psnr_min/psnr_median: over all items. psnr_dataset: the dataset-level PSNR of the worst channel
    (10 log10(1 / mean MSE/range^2) over that channel's items: what `--target-psnr` promises per
    channel). channels: the same figures per channel. valid_fraction: share of valid pixels (None for
    fields without a validity mask).
    """

    psnr_min: float | None = None
    psnr_median: float | None = None
    max_abs_error: float | None = None
    overflow: int = 0
    psnr_dataset: float | None = None
    channels: tuple[ChannelStats, ...] | None = None
    valid_fraction: float | None = None

    def __post_init__(self) -> None:
        if self.channels is not None:
            object.__setattr__(self, "channels", tuple(self.channels))
            if not all(isinstance(c, ChannelStats) for c in self.channels):
                raise DctDataError(f"channels: expected ChannelStats. Got {self.channels!r}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "psnr_min": _float_out(self.psnr_min),
            "psnr_median": _float_out(self.psnr_median),
            "max_abs_error": _float_out(self.max_abs_error),
            "overflow": self.overflow,
        }
        if self.psnr_dataset is not None:
            out["psnr_dataset"] = _float_out(self.psnr_dataset)
        if self.channels is not None and self.channels != self._one_channel():
            out["channels"] = [c.to_dict() for c in self.channels]
        if self.valid_fraction is not None:
            out["valid_fraction"] = self.valid_fraction
        return out

    def _one_channel(self) -> tuple[ChannelStats]:
        """`channels` of a one-channel field: its own figures (left out of the JSON, filled back on read)."""
        return (ChannelStats(self.psnr_min, self.psnr_median, self.psnr_dataset, self.max_abs_error),)

    @classmethod
    def from_dict(
        cls, d: object, where: str, version: int = FORMAT_VERSION, n_channels: int | None = None
    ) -> FieldStats:
        """`n_channels`: the field's channel count when it is a dct field (version 2 fills a one-channel
        field's `channels` when the JSON leaves it out)."""
        optional = {"psnr_dataset", "channels", "valid_fraction"} if version >= 2 else ()
        d = parse_object(
            d, where, {"psnr_min", "psnr_median", "max_abs_error", "overflow"}, optional, error=FormatError
        )
        channels = d.get("channels")
        if channels is not None:
            if not isinstance(channels, list):
                raise FormatError(f"{where}: channels: expected a list. Got {channels!r}")
            channels = tuple(ChannelStats.from_dict(c, f"{where}: channels[{i}]") for i, c in enumerate(channels))
        fraction = _float_in(f"{where}: valid_fraction", d.get("valid_fraction"))
        if fraction is not None and not 0 <= fraction <= 1:
            raise FormatError(f"{where}: valid_fraction: expected a number in 0..1. Got {fraction!r}")
        out = cls(
            _float_in(f"{where}: psnr_min", d["psnr_min"]),
            _float_in(f"{where}: psnr_median", d["psnr_median"]),
            _float_in(f"{where}: max_abs_error", d["max_abs_error"]),
            _count(f"{where}: overflow", d["overflow"]),
            _float_in(f"{where}: psnr_dataset", d.get("psnr_dataset")),
            channels,
            fraction,
        )
        if "channels" not in d and version >= 2 and n_channels == 1:
            out = dataclasses.replace(out, channels=out._one_channel())
        return out


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs; written last by a pack, read first by a loader.

    checksums: relative file path -> {"sha256": hex, "bytes": n} for every stored data file.
    layout: storage-specific entries (zarr chunking, webdataset shard list).
    coords: 1-D coordinates of the source (`dctdata.format.coords`): name -> {dim, sample, dtype,
    values, attrs}; a sample coordinate has one value per sample.
    """

    storage: str
    samples: int
    fields: tuple[FieldSpec, ...]
    pack: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stats: Mapping[str, FieldStats] = dataclasses.field(default_factory=dict)
    checksums: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    layout: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    coords: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    dctdata_version: str = __version__

    def __post_init__(self) -> None:
        if self.format != FORMAT_NAME:
            raise FormatError(f"manifest format: expected {FORMAT_NAME!r}. Got {self.format!r}")
        _check_version(self.version)
        get_storage(self.storage)  # a registered storage, else an error naming them
        _count("samples", self.samples)
        fields = tuple(self.fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise DctDataError(f"fields: expected one or more FieldSpec. Got {self.fields!r}")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise DctDataError(f"fields: expected unique names. Got {names}")
        object.__setattr__(self, "fields", fields)
        for f in fields:
            if f.name.endswith(SIDE_SUFFIX) and f.name[: -len(SIDE_SUFFIX)] not in {
                g.name for g in fields if has_side(g)
            }:
                raise DctDataError(
                    f"fields: expected {f.name!r} to be the side partner of a dct field. Got no such field"
                )
            if has_side(f) and side_field(f) not in fields:
                raise DctDataError(
                    f"fields: expected the side partner {f.name + SIDE_SUFFIX!r} ((C, 2) {f.dct_codec.side_dtype}) "
                    f"of dct field {f.name!r}. Got none or another shape"
                )
        precise = [f.name for f in fields if f.codec is not None and f.codec.precision is not None]
        if precise and self.version < PRECISION_VERSION:
            raise FormatError(
                f"field {precise[0]!r}: a float64 decode (codec precision): expected manifest version >= "
                f"{PRECISION_VERSION}. Got version {self.version}"
            )
        volumes = [f.name for f in fields if f.codec is not None and f.codec.depth is not None]  # dct fields
        if volumes and self.version < VOLUMES_VERSION:
            raise FormatError(
                f"field {volumes[0]!r}: a volume (C, D, H, W): expected manifest version >= {VOLUMES_VERSION}. "
                f"Got version {self.version}"
            )
        unknown = sorted(set(self.stats) - set(names))
        if unknown:
            raise DctDataError(f"stats: expected entries for fields {names}. Got unknown {unknown}")
        for path, entry in self.checksums.items():
            where = f"checksums[{path!r}]"
            check_relative_path(where, path)
            entry = parse_object(entry, where, {"sha256", "bytes"}, error=FormatError)
            if not isinstance(entry["sha256"], str) or not _SHA256_RE.match(entry["sha256"]):
                raise FormatError(f"{where}: sha256: expected 64 lowercase hex digits. Got {entry['sha256']!r}")
            _count(f"{where}: bytes", entry["bytes"])
        for name in ("pack", "layout"):
            if not isinstance(getattr(self, name), Mapping):
                raise TypeError(f"{name}: expected a mapping. Got {type(getattr(self, name)).__name__}")
            # Store what JSON will give back, so a manifest equals its read-back copy.
            object.__setattr__(self, name, _json_ready(dict(getattr(self, name))))
        if self.version >= 2:  # entries at their default are left out of the JSON: every Manifest has them all
            object.__setattr__(self, "pack", {**_json_ready(dict(PACK_DEFAULTS)), **self.pack})
        object.__setattr__(self, "stats", dict(self.stats))
        object.__setattr__(self, "checksums", {k: dict(v) for k, v in self.checksums.items()})
        by_name = {f.name: f for f in fields}
        for f in fields:
            if f.valid is not None:
                if f.valid not in by_name:
                    raise DctDataError(f"field {f.name!r}: valid: expected one of the fields {names}. Got {f.valid!r}")
                f.check_valid_field(by_name[f.valid])
        if self.coords and self.version < 2:
            raise DctDataError(f"coords: expected none in a version {self.version} manifest. Got {sorted(self.coords)}")
        object.__setattr__(self, "coords", check_coords(self.coords, self.samples))

    # Convenience ---------------------------------------------------------------------------------
    @property
    def stored_bytes(self) -> int:
        """Bytes of every stored file: those the manifest lists (recorded at pack time with their sha256) and
        those a reader rebuilds from it (version 8's zarr.json files, `dctdata.format.compact`)."""
        return int(sum(e["bytes"] for e in self.checksums.values())) + get_storage(self.storage).derived_bytes(self)

    @property
    def names(self) -> tuple[str, ...]:
        """The user's field names, in sample order (stored side partners are part of their dct field)."""
        return tuple(f.name for f in user_fields(self.fields))

    def field(self, name: str | None = None, kind: FieldKind | str | None = None) -> FieldSpec:
        """The named field; with name=None, the only field of `kind` (error if zero or several)."""
        if name is not None:
            for f in self.fields:
                if f.name == name:
                    return f
            raise DctDataError(f"field: expected one of {list(self.names)}. Got {name!r}")
        matches = [f for f in user_fields(self.fields) if kind is None or f.kind == kind]
        if len(matches) != 1:
            raise DctDataError(
                f"field: expected a field name; this dataset has {len(matches)} "
                f"{str(kind) + ' ' if kind else ''}fields "
                f"{[f.name for f in matches]}"
            )
        return matches[0]

    def coded_field(self, name: str | None = None) -> FieldSpec:
        """The named field; with name=None, the only field the codec stores (a dct field; error if zero or
        several). Callers that need a coded field check `FieldSpec.coded` of a named one with their own message."""
        return self.field(name) if name is not None else self.field(None, kind=CODED)

    def to_dict(self) -> dict[str, Any]:
        out = self._full_dict()
        out = compact_json(out) if self.version >= 3 else out
        out = compact_v8(out) if self.version >= COMPACT_VERSION else out
        if self.version >= SEAL_VERSION:
            out["seal"] = manifest_seal(out)
        return out

    def _full_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "version": self.version,
            "dctdata_version": self.dctdata_version,
            "storage": self.storage,
            "samples": self.samples,
            "fields": [f.to_dict(packed=self.version >= TABLES_VERSION) for f in self.fields],
            "pack": _pack_out(self.pack) if self.version >= 2 else _json_ready(dict(self.pack)),
            "stats": {k: v.to_dict() for k, v in self.stats.items()},
            "checksums": {k: dict(v) for k, v in self.checksums.items()},
            "layout": _json_ready(dict(self.layout)),
            **({"coords": {k: dict(v) for k, v in self.coords.items()}} if self.coords else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: object, where: str = "manifest") -> Manifest:
        if not isinstance(d, Mapping):
            raise FormatError(f"{where}: expected a JSON object. Got {type(d).__name__!r}")
        # Format and version first, so a newer file is refused with the right message.
        if d.get("format") != FORMAT_NAME:
            raise FormatError(f"{where}: format: expected {FORMAT_NAME!r}. Got {d.get('format')!r}")
        version = _check_version(d.get("version"), where)
        optional = (_MANIFEST_KEYS_V2 if version >= 2 else set()) | ({"seal"} if version >= SEAL_VERSION else set())
        d = parse_object(d, where, _MANIFEST_KEYS, optional, error=FormatError)
        written = d
        if version >= COMPACT_VERSION:  # what it leaves out filled back, checksums as objects
            d = full_v8(d, where)
        if not isinstance(d["fields"], list):
            raise FormatError(f"{where}: fields: expected a list. Got {d['fields']!r}")
        fields = tuple(FieldSpec.from_dict(f, f"{where}: fields[{i}]", version) for i, f in enumerate(d["fields"]))
        if version >= 3:
            fields = _with_side_partners(fields)
            d = full_json(d)
        if not isinstance(d["stats"], Mapping):
            raise FormatError(f"{where}: stats: expected a JSON object. Got {d['stats']!r}")
        channels = {f.name: f.codec.channels for f in fields if f.codec is not None}  # dct fields
        stats = {
            k: FieldStats.from_dict(v, f"{where}: stats[{k!r}]", version, channels.get(k))
            for k, v in d["stats"].items()
        }
        if not isinstance(d["dctdata_version"], str):
            raise FormatError(f"{where}: dctdata_version: expected a string. Got {d['dctdata_version']!r}")
        if not isinstance(d["checksums"], Mapping):
            raise FormatError(f"{where}: checksums: expected a JSON object. Got {d['checksums']!r}")
        try:
            manifest = cls(
                storage=d["storage"],
                samples=_count(f"{where}: samples", d["samples"]),
                fields=fields,
                pack=d["pack"],
                stats=stats,
                checksums=d["checksums"],
                layout=d["layout"],
                coords=d.get("coords") or {},
                format=d["format"],
                version=d["version"],
                dctdata_version=d["dctdata_version"],
            )
        except FormatError:
            raise
        except (DctDataError, TypeError) as exc:
            raise FormatError(f"{where}: {exc}") from exc
        if "seal" in written:  # last: what is malformed gets its own message first
            want = manifest_seal(written)
            if written["seal"] != want:
                got = written["seal"] if isinstance(written["seal"], str) else type(written["seal"]).__name__
                raise IntegrityError(
                    f"{where}: seal: expected {want[:23]}... (the sha256 of the manifest's fields, codecs, layout, "
                    f"checksums and sample count as written). Got {got[:23]}... (the manifest was changed or damaged "
                    "after packing)"
                )
        return manifest


def manifest_seal(d: Mapping[str, Any]) -> str:
    """The `seal` of a manifest dict as written (version 5): "sha256:" + the hex sha256 of the canonical JSON
    of its SEALED entries; from version 8 the same digest as unpadded base64url (`compact.b64_digest`). A tool
    that edits a manifest on purpose reseals it with this."""
    body = {k: d[k] for k in SEALED if k in d}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(text.encode("ascii"))
    version = d.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version >= COMPACT_VERSION:
        return b64_digest(digest.digest())
    return "sha256:" + digest.hexdigest()


# Version 3: what the manifest can derive is left out of its JSON -----------------------------------
def compact_json(d: dict[str, Any]) -> dict[str, Any]:
    """A full-form manifest dict (`Manifest._full_dict`) without what a reader derives (`full_json`).
    Layout entries of the wrong shape are written as they are (the manifest keeps the layout free-form;
    the storage's reader names what is wrong with it)."""
    by_name = {f["name"]: f for f in d["fields"]}
    partners = {
        n + SIDE_SUFFIX
        for n, f in by_name.items()
        if get_kind(f["kind"]).coded and (f["codec"] or {}).get("side") is not None
    }
    out = dict(d, fields=[f for f in d["fields"] if f["name"] not in partners])
    layout = dict(d["layout"])
    if isinstance(layout.get("arrays"), Mapping):
        layout["arrays"] = {
            k: {x: v for x, v in e.items() if not (x == "path" and v == k)} if isinstance(e, Mapping) else e
            for k, e in layout["arrays"].items()
        }
    checksums = d["checksums"] if isinstance(d["checksums"], Mapping) else {}
    if isinstance(layout.get("shards"), list):
        layout["shards"] = [
            {
                k: v
                for k, v in e.items()
                if not (k in ("sha256", "bytes") and _checksum_of(checksums, e.get("name")).get(k) == v)
            }
            if isinstance(e, Mapping)
            else e
            for e in layout["shards"]
        ]
    out["layout"] = layout
    return out


def full_json(d: dict[str, Any]) -> dict[str, Any]:
    """A version 3 manifest dict with the layout entries it leaves out filled back: a zarr array's `path`
    (its field's name), a webdataset shard's `sha256`/`bytes` (its checksum entry). Entries of the wrong
    shape are left as they are, for the layout's own validation to name."""
    layout = d["layout"]
    if not isinstance(layout, Mapping):
        return d
    layout = dict(layout)
    arrays = layout.get("arrays")
    if isinstance(arrays, Mapping):
        layout["arrays"] = {
            k: {"path": k, **e} if isinstance(e, Mapping) and "inline" not in e else e for k, e in arrays.items()
        }
    shards, checksums = layout.get("shards"), d["checksums"]
    if isinstance(shards, list) and isinstance(checksums, Mapping):
        layout["shards"] = [
            {**_checksum_of(checksums, e.get("name")), **e} if isinstance(e, Mapping) else e for e in shards
        ]
    return dict(d, layout=layout)


def _checksum_of(checksums: Mapping[str, Any], name: object) -> dict[str, Any]:
    entry = checksums.get(name) if isinstance(name, str) else None
    return {k: entry[k] for k in ("sha256", "bytes") if k in entry} if isinstance(entry, Mapping) else {}


def _with_side_partners(fields: tuple[FieldSpec, ...]) -> tuple[FieldSpec, ...]:
    """The fields with each dct field's side partner after it, unless listed (version 3 leaves them out)."""
    names = {f.name for f in fields}
    out = []
    for f in fields:
        out.append(f)
        if has_side(f) and f.name + SIDE_SUFFIX not in names:
            out.append(side_field(f))
    return tuple(out)


def _pack_out(pack: Mapping[str, Any]) -> dict[str, Any]:
    """The `pack` entries a manifest writes: those not at their default (`PACK_DEFAULTS`)."""
    defaults = _json_ready(dict(PACK_DEFAULTS))
    return {k: v for k, v in _json_ready(dict(pack)).items() if k not in defaults or v != defaults[k]}


def _check_version(version: object, where: str = "manifest") -> int:
    v = parse_int(
        version,
        f"{where}: version",
        minimum=1,
        expected=f"an int in 1..{FORMAT_VERSION}",
        type_error=FormatError,
        range_error=FormatError,
    )
    if v > FORMAT_VERSION:
        raise FormatError(
            f"{where}: version: expected <= {FORMAT_VERSION} (the newest this dctdata reads). Got {v}: "
            "the dataset was written by a newer dctdata; upgrade dctdata to read it"
        )
    return v


# Reading and writing -----------------------------------------------------------------------------
# The most bytes a manifest may have: it is read whole, and a hostile server (an endless body) or a link to
# /dev/zero must not grow memory without end. 64 MiB is about 200 000 shard entries.
MAX_MANIFEST_BYTES = 64 << 20


def read_manifest_bytes(fh: IO[bytes], where: str) -> bytes:
    """A manifest file's bytes, read to at most MAX_MANIFEST_BYTES (FormatError past it)."""
    limit = MAX_MANIFEST_BYTES
    raw, _ = read_expected(fh, limit)  # reads to EOF or one byte past the limit, never more
    if len(raw) > limit:
        raise FormatError(
            f"{where}: expected a manifest of at most {limit} bytes. Got more (not a dctdata manifest, or hostile)"
        )
    return raw


def read_manifest(
    path_or_url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, sha256: str | None = None
) -> Manifest:
    """Read and strictly validate a manifest (local path or fsspec URL; the root or manifest.json).
    `storage_options` go to fsspec for URLs (e.g. an S3 endpoint). `sha256`: the manifest's pinned hash
    (`dctdata info` prints it): its checksums cover every stored file, so a pack fetched from elsewhere
    is then exactly the pack pinned, even when someone recomputed all its checksums."""
    if sha256 is not None and (not isinstance(sha256, str) or not _SHA256_RE.match(sha256)):
        raise DctDataError(f"sha256: expected the manifest's sha256, 64 lowercase hex digits. Got {sha256!r}")
    root, loc = manifest_location(path_or_url)
    try:
        if is_url(loc):
            with open_file(loc, "rb", storage_options) as fh:
                raw = read_manifest_bytes(fh, loc)
        else:
            if not os.path.isdir(root):
                raise FileNotFoundError(f"dataset: expected a packed dataset directory. Got missing path {root!r}")
            with open_file(loc, "rb", root=root) as fh:  # a regular file inside the pack
                raw = read_manifest_bytes(fh, loc)
    except FileNotFoundError as exc:
        raise FormatError(
            f"{loc}: expected a dctdata manifest ({MANIFEST_NAME}). Got no such file"
            + ("" if os.path.exists(root) or is_url(root) else f" (no dataset at {root!r})")
        ) from exc
    except OSError as exc:  # a directory named manifest.json, permissions, I/O errors
        raise FormatError(f"{loc}: expected a readable dctdata manifest. Got {type(exc).__name__}: {exc}") from exc
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise IntegrityError(
            f"{loc}: expected the pinned manifest (sha256 {sha256[:16]}...). Got sha256 "
            f"{hashlib.sha256(raw).hexdigest()[:16]}... (not the pack pinned: changed, or another one)"
        )
    return parse_manifest(raw, loc)


def parse_manifest(raw: bytes, where: str = "manifest") -> Manifest:
    """Manifest from the raw bytes of a manifest.json; any malformed input raises FormatError (never
    another exception: fuzzed). JSON only: nothing in it is ever evaluated."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError(f"raw: expected bytes. Got {type(raw).__name__}")
    try:
        d = json.loads(bytes(raw).decode("utf-8"))
    # ValueError: numbers past Python's int-digit limit; RecursionError: absurdly deep nesting.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(
            f"{where}: expected a JSON manifest. Got unreadable JSON: {type(exc).__name__}: {str(exc)[:200]}"
        ) from exc
    return Manifest.from_dict(d, where=where)


def _checked_json(manifest: Manifest) -> str:
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest: expected a dctdata.format.Manifest. Got {type(manifest).__name__}")
    text = manifest.to_json()
    nbytes = len(text.encode("utf-8"))
    if nbytes > MAX_MANIFEST_BYTES:  # a reader would refuse it
        check_manifest_size(nbytes, entry_sizes(manifest.to_dict()))
    Manifest.from_dict(json.loads(text))  # validate what a reader will see before committing
    return text


def check_manifest_size(nbytes: int, sizes: list[tuple[int, str]], estimated: bool = False) -> None:
    """Refuse a manifest (or the estimate of one, before packing) past MAX_MANIFEST_BYTES, which no reader
    would open: committing it would replace a good pack (--overwrite) by one nothing can read. `sizes`:
    (bytes, name) of its entries (`entry_sizes`); the error names the biggest and what to do."""
    if nbytes <= MAX_MANIFEST_BYTES:
        return
    biggest = ", ".join(f"{name} {n / 2**20:.1f} MiB" for n, name in sorted(sizes, reverse=True)[:2])
    raise DctDataError(
        f"manifest: expected at most {MAX_MANIFEST_BYTES} bytes (the most a reader opens). Got "
        f"{'about ' if estimated else ''}{nbytes} bytes, mostly {biggest} (drop long attributes or per-sample "
        "coordinates, or use fewer, bigger shards); nothing was committed"
    )


def entry_sizes(d: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(JSON bytes, name) of a manifest dict's entries, each field and coordinate on its own."""
    sizes = []
    for key, value in d.items():
        if key == "coords" and isinstance(value, Mapping):
            sizes += [(len(json.dumps(v, default=str)), f"coords[{k!r}]") for k, v in value.items()]
        elif key == "fields" and isinstance(value, list):
            sizes += [(len(json.dumps(v, default=str)), f"fields[{v.get('name')!r}]") for v in value]
        else:
            sizes.append((len(json.dumps(value, default=str)), key))
    return sizes


def write_manifest(manifest: Manifest, directory: str | os.PathLike[str]) -> str:
    """Write `directory/manifest.json` atomically (temporary sibling + rename); returns its path."""
    text = _checked_json(manifest)
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    try:
        return atomic_write(path, text.encode("utf-8"))
    except OSError as exc:  # a full disk: say which file
        raise with_path(exc, path) from exc


def write_manifest_url(manifest: Manifest, prefix: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write the manifest under an fsspec URL prefix. Object stores have no rename: the manifest,
    written last, is the commit."""
    import fsspec

    text = _checked_json(manifest)
    loc = join(prefix, MANIFEST_NAME)
    with fsspec.open(loc, "w", encoding="utf-8", **fsspec_options(loc, storage_options)) as fh:
        fh.write(text)
    return loc
