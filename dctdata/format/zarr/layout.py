"""The zarr v3 layout of a pack, shared by its writer and reader (no zarr import here).

A zarr v3 group at the dataset root, one array per field at path `<field name>`, shape
(N, *stored_shape). Arrays are chunked along the sample axis (inner chunks of `chunk` samples, the unit
a random read decompresses) inside sharding-codec shards of `shard` samples (one file each:
`<field>/c.<i>.0...`, '.'-separated chunk keys so shards are flat files). All fields share one shard
length in samples, a power of two, so shard k of every field is one independent *part* of the pack
(parallel and resumable writing); each field's chunk is a power of two dividing it. Every inner chunk
goes through the lossless codec then crc32c, and the shard index is crc32c-protected too.

The manifest's `layout.arrays` records {field: {path, chunk, shard}}. Since version 4 a dct field's side
partner whose whole stored array is at most INLINE_BYTES (a pack of up to 128 samples x channels) is kept
in the manifest instead, as {field: {"inline": base64 of its little-endian bytes}}: an array of 8 bytes per
sample otherwise costs a zarr.json, a shard index, two checksums and a layout entry (about 850 bytes),
more than the coefficients of a small image at 35 dB.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError, FormatError, IntegrityError
from dctdata.format.compact import COMPACT_VERSION
from dctdata.format.fields import NAME_RE, FieldSpec, side_partner_names
from dctdata.format.zarr.metadata import array_json, group_json
from dctdata.parse import parse_int, parse_object

if TYPE_CHECKING:
    from dctdata.format.manifest import Manifest

# Inner chunks of at most this many stored bytes (at least one sample): a random read decodes and, over
# HTTP, moves about what it asks for. Smaller chunks did not cost bytes: zstd-9 stored no more than with the
# former 128 KiB chunks (docs/benchmarks/design.md).
CHUNK_BYTES = 16 << 10
SHARD_BYTES = 32 << 20
# A shard is also a unit of parallel work: at most this much *source* data per shard, so a pack
# spreads over workers (and a task's memory stays small) even when compression is strong.
SHARD_SOURCE_BYTES = 128 << 20
INDEX_ENTRY_BYTES = 16  # (offset, nbytes) uint64 pair per chunk
CRC_BYTES = 4
MISSING = 2**64 - 1  # shard-index entry of a chunk that was never written
# What one chunk may decode to (a random read decodes a whole chunk, so this bounds what reading one
# sample can cost): one sample, whatever its size; else at most MAX_CHUNK_BYTES, and more than
# SMALL_CHUNK_BYTES only when the chunk holds fewer than twice the pack's samples. The writer's chunks are
# at most CHUNK_BYTES (128 KiB before 0.1.x); a hostile manifest and zarr.json declaring a chunk of 2^22
# samples would otherwise cost a GiB to return one.
MAX_CHUNK_BYTES = 16 << 20
SMALL_CHUNK_BYTES = 128 << 10
# Side partners of at most this many stored bytes live in the manifest (base64: 4/3 of it), version >= 4.
INLINE_BYTES = 1024
INLINE_VERSION = 4


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, int(x)).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, int(x)) - 1).bit_length()


def chunking(
    fields: tuple[FieldSpec, ...], n: int, chunk: int | None = None, shard: int | None = None
) -> tuple[int, dict[str, int]]:
    """(samples per shard shared by all fields, {field: samples per inner chunk}); chunks divide the shard."""
    biggest = max(max(1, f.stored_sample_bytes) for f in fields)
    source = sum(max(1, f.source_sample_bytes) for f in fields)
    if shard is None:
        shard = min(_pow2_floor(SHARD_BYTES // biggest), _pow2_floor(SHARD_SOURCE_BYTES // source), _pow2_ceil(n))
        if chunk is not None:
            shard = max(1, shard // chunk) * chunk
    chunks = {}
    for f in fields:
        c = chunk or math.gcd(_pow2_floor(CHUNK_BYTES // max(1, f.stored_sample_bytes)), shard)
        if shard % c:
            raise DctDataError(f"shard: expected a multiple of chunk={c} samples. Got {shard}")
        check_chunk(f, c, n, f"chunk_samples: field {f.name!r}", DctDataError)
        chunks[f.name] = c
    return shard, chunks


def check_chunk(f: FieldSpec, chunk: int, samples: int, where: str, error: type[DctDataError] = FormatError) -> None:
    """A chunk of `chunk` samples of `f` in a pack of `samples` must decode to at most MAX_CHUNK_BYTES (or be
    one sample), and to more than SMALL_CHUNK_BYTES only when it holds fewer than twice the samples."""
    nbytes = chunk * f.stored_sample_bytes
    if chunk > 1 and (nbytes > MAX_CHUNK_BYTES or (nbytes > SMALL_CHUNK_BYTES and chunk >= 2 * max(samples, 1))):
        raise error(
            f"{where}: expected chunks of one sample, or of at most {MAX_CHUNK_BYTES} bytes and fewer than twice "
            f"the {samples} samples (or at most {SMALL_CHUNK_BYTES} bytes). Got {chunk} samples = {nbytes} bytes"
        )


def shard_key(field: str, shard_index: int, ndim: int) -> str:
    """Path (relative to the dataset root) of shard `shard_index` of a field's array of `ndim` dims."""
    return f"{field}/c." + ".".join([str(shard_index)] + ["0"] * (ndim - 1))


def layout_entry(
    fields: tuple[FieldSpec, ...], n: int, chunk: int | None = None, shard: int | None = None
) -> dict[str, Any]:
    """The manifest's `layout` for a zarr pack."""
    shard, chunks = chunking(fields, n, chunk, shard)
    return {"arrays": {f.name: {"path": f.name, "chunk": chunks[f.name], "shard": shard} for f in fields}}


def inline_entry(values: npt.NDArray[Any]) -> dict[str, str]:
    """The layout entry of an array kept in the manifest: base64 of its little-endian bytes."""
    little = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return {"inline": base64.b64encode(little.tobytes()).decode("ascii")}


def inline_array(raw: bytes, f: FieldSpec, samples: int) -> npt.NDArray[Any]:
    """(samples, *stored_shape) in the stored dtype (native order) from an inline entry's decoded bytes."""
    little = np.dtype(f.stored_dtype).newbyteorder("<")
    return np.frombuffer(raw, dtype=little).reshape(samples, *f.stored_shape).astype(f.stored_dtype)


def _parse_inline(m: Manifest, f: FieldSpec, value: object, where: str) -> npt.NDArray[Any]:
    """An inline entry's values, checked: (samples, *stored_shape) in the stored dtype."""
    if m.version < INLINE_VERSION:
        raise FormatError(
            f"{where}: expected {{path, chunk, shard}} (inline arrays need version {INLINE_VERSION}). Got an inline "
            "entry"
        )
    if not isinstance(value, str):
        raise FormatError(f"{where}.inline: expected a base64 string. Got {type(value).__name__}")
    expected = m.samples * f.stored_sample_bytes
    if len(value) > 4 * (-(-INLINE_BYTES // 3)) or expected > INLINE_BYTES:
        raise FormatError(
            f"{where}.inline: expected an array of at most {INLINE_BYTES} bytes. Got {len(value)} base64 characters "
            f"for {expected} bytes ({m.samples} samples)"
        )
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"{where}.inline: expected a base64 string. Got {exc}") from None
    if len(raw) != expected:
        raise FormatError(
            f"{where}.inline: expected {expected} bytes ({m.samples} samples of {f.stored_shape} {f.stored_dtype}). "
            f"Got {len(raw)}"
        )
    return inline_array(raw, f, m.samples)


def zarr_layout(
    m: Manifest, fields: tuple[FieldSpec, ...] | None = None, where: str = "manifest"
) -> dict[str, dict[str, Any]]:
    """The manifest's `layout.arrays` entries, validated: {field: {path, chunk, shard}} with path the
    field name (a plain identifier, so it cannot point outside the dataset) and shard a multiple of chunk;
    {field: {"inline": values}} for a side partner kept in the manifest."""
    arrays = m.layout.get("arrays") if isinstance(m.layout, Mapping) else None
    if not isinstance(arrays, Mapping):
        raise FormatError(
            f"{where}: layout.arrays: expected an object {{field: {{path, chunk, shard}}}}. Got {arrays!r}"
        )
    out: dict[str, dict[str, Any]] = {}
    for f in m.fields if fields is None else fields:
        w = f"{where}: layout.arrays[{f.name!r}]"
        if f.name not in arrays:
            raise FormatError(f"{w}: expected an entry for field {f.name!r}. Got entries {sorted(arrays)}")
        if isinstance(arrays[f.name], Mapping) and "inline" in arrays[f.name]:
            if f.name not in side_partner_names(m.fields) or set(arrays[f.name]) != {"inline"}:
                raise FormatError(
                    f"{w}: expected {{path, chunk, shard}} (only a side partner may be inline, alone). Got keys "
                    f"{sorted(arrays[f.name])}"
                )
            out[f.name] = {"inline": _parse_inline(m, f, arrays[f.name]["inline"], w)}
            continue
        e = parse_object(arrays[f.name], w, {"path", "chunk", "shard"}, error=FormatError)
        if not isinstance(e["path"], str) or not NAME_RE.match(e["path"]):
            raise FormatError(
                f"{w}.path: expected a plain identifier (the array's name in the group). Got {e['path']!r}"
            )
        chunk = parse_int(e["chunk"], f"{w}.chunk", minimum=1, type_error=FormatError, range_error=FormatError)
        shard = parse_int(e["shard"], f"{w}.shard", minimum=1, type_error=FormatError, range_error=FormatError)
        if shard % chunk:
            raise FormatError(f"{w}.shard: expected a multiple of chunk={chunk}. Got {shard!r}")
        check_chunk(f, chunk, m.samples, f"{w}.chunk")
        out[f.name] = {"path": e["path"], "chunk": chunk, "shard": shard}
        _check_shard_files(m, f, e["path"], shard, w)
    return out


def _check_shard_files(m: Manifest, f: FieldSpec, path: str, shard: int, where: str) -> None:
    """The sample count must match the shard files the checksums list (one per `shard` samples): a
    hand-raised count (1e12 samples over three files) is refused here, before anything sizes itself by it."""
    checksums = m.checksums if isinstance(m.checksums, Mapping) else {}
    if not checksums:
        return  # a manifest being built (writer side): nothing listed yet
    expected = -(-m.samples // shard)
    listed = sum(1 for rel in checksums if rel.startswith(f"{path}/c."))
    keys = [] if listed != expected else [shard_key(path, i, 1 + len(f.stored_shape)) for i in range(expected)]
    missing = [k for k in keys if k not in checksums]
    if listed != expected or missing:
        raise FormatError(
            f"{where}: expected {expected} shard files listed in checksums ({m.samples} samples, {shard} per shard). "
            f"Got {listed}" + (f" (no {missing[0]})" if missing else "")
        )


def shard_of_file(m: Manifest, rel: str) -> str:
    """' (field 'x', samples a..b)' for a stored shard path, '' when `rel` is not one (for messages)."""
    import re

    match = re.match(r"^([A-Za-z_]\w*)/c\.(\d+)(\.0)*$", rel)
    try:
        arrays = zarr_layout(m)
    except DctDataError:
        return ""
    if match and "shard" in arrays.get(match.group(1), {}):
        shard = arrays[match.group(1)]["shard"]
        i = int(match.group(2))
        return f" (field {match.group(1)!r}, samples {i * shard}..{min((i + 1) * shard, m.samples) - 1})"
    return ""


def index_bytes(chunks_per_shard: int) -> int:
    return INDEX_ENTRY_BYTES * chunks_per_shard + CRC_BYTES


def check_shard_index(
    tail: bytes,
    size: int,
    *,
    chunks_per_shard: int,
    index_at_end: bool,
    first: int,
    chunk: int,
    samples: int,
    where: str,
    key_where: str,
) -> npt.NDArray[Any]:
    """Check a shard's index (its last or first `index_bytes` bytes): crc32c, and an in-file entry for
    every chunk that holds samples. zarr would read a missing shard or an empty entry as zeros.
    `first` is the shard's first sample; `samples` the pack's sample count. Returns the entries,
    (chunks_per_shard, 2) uint64 (offset, nbytes)."""
    import google_crc32c

    need = index_bytes(chunks_per_shard)
    if len(tail) < need:
        raise IntegrityError(
            f"{where}: expected a shard of at least {need} bytes (its index). Got {size} bytes (truncated)"
        )
    body, crc = bytes(tail[:-CRC_BYTES]), int.from_bytes(tail[-CRC_BYTES:], "little")
    if google_crc32c.value(body) != crc:
        raise IntegrityError(
            f"{where}: expected a shard index with a valid crc32c. Got a damaged index (corrupted or truncated shard)"
        )
    entries = np.frombuffer(body, dtype="<u8").reshape(chunks_per_shard, 2)
    data_end = size - need if index_at_end else size
    data_start = 0 if index_at_end else need
    for c in range(min(chunks_per_shard, -(-(samples - first) // chunk))):  # chunks that hold samples
        off, nbytes = int(entries[c, 0]), int(entries[c, 1])
        c_lo, c_hi = first + c * chunk, min(first + (c + 1) * chunk, samples) - 1
        at = f"{key_where} samples {c_lo}..{c_hi} (chunk {c_lo // chunk})"
        if off == nbytes == MISSING:
            raise IntegrityError(
                f"{at}: expected a stored chunk. Got an empty shard-index entry (missing chunk; zarr would read fill "
                "values)"
            )
        if off < data_start or off + nbytes > data_end:
            raise IntegrityError(
                f"{at}: expected a chunk inside the shard's {size} bytes. Got bytes {off}..{off + nbytes} (truncated "
                "shard)"
            )
    return entries


def derived_files(m: Manifest, where: str = "manifest") -> dict[str, bytes]:
    """{relative path: bytes} of the zarr.json files a version 8 pack stores and its manifest does not list
    (`dctdata.format.compact`), rebuilt from the manifest as the writer wrote them; {} for older packs (they
    list theirs with a sha256). The reader requires these exact bytes."""
    if m.version < COMPACT_VERSION:
        return {}
    out = {"zarr.json": group_json()}
    for name, e in zarr_layout(m, where=where).items():
        if "inline" in e:
            continue
        f = m.field(name)
        shape = tuple(f.stored_shape)
        out[f"{e['path']}/zarr.json"] = array_json(
            (m.samples, *shape), f.stored_dtype, (e["shard"], *shape), (e["chunk"], *shape), f.lossless
        )
    return out


def derived_bytes(m: Manifest) -> int:
    """Bytes of `derived_files` (0 where the layout is malformed: the reader names that)."""
    try:
        return sum(len(v) for v in derived_files(m).values())
    except DctDataError:
        return 0
