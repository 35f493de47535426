"""zarr v3 metadata (zarr.json) of a pack, written and read by dctdata itself.

Why not zarr-python: the chunks of dct fields may go through dctdata's entropy coder, which zarr does not
know, and a pack's reader checks everything against the manifest anyway. So dctdata writes the group and
array zarr.json (compact JSON, deterministic bytes) and the shards (`shards.py`), and reads them back
with the checks below. Arrays whose chunks use only spec codecs (bytes, zstd, blosc, crc32c, sharding)
stay readable by any zarr v3 reader (zarr-python, tensorstore); a stage zarr does not know (the entropy
coder: its model is in manifest.json) names itself and needs dctdata. Each stage writes its own entry
(`dctdata.stages.Stage.zarr_codecs`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dctdata.errors import IntegrityError
from dctdata.stages import get_stage


def compact(d: Mapping[str, Any]) -> bytes:
    return (json.dumps(d, separators=(",", ":"), sort_keys=False) + "\n").encode()


def group_json() -> bytes:
    """The root group: no `attributes` (optional in zarr v3; a pack's metadata is its manifest)."""
    return compact({"zarr_format": 3, "node_type": "group"})


def check_group_json(raw: bytes, where: str) -> None:
    """The pack root's zarr.json must be zarr v3 group metadata (other zarr readers start there)."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where}: expected zarr v3 group metadata. Got {type(exc).__name__}: {exc}") from exc
    if not isinstance(meta, Mapping) or meta.get("zarr_format") != 3 or meta.get("node_type") != "group":
        raise IntegrityError(f"{where}: expected zarr v3 group metadata (zarr_format 3, node_type 'group')")


def chunk_codecs(lossless: Mapping[str, Any] | None, itemsize: int, little: bool = True) -> list[dict[str, Any]]:
    """The inner chunk codecs of a field in zarr v3 JSON: array -> bytes, the lossless stage, crc32c."""
    return [*get_stage(lossless).zarr_codecs(itemsize, little), {"name": "crc32c"}]


def array_json(
    shape: tuple[int, ...],
    dtype: str,
    shard: tuple[int, ...],
    chunk: tuple[int, ...],
    lossless: Mapping[str, Any] | None,
) -> bytes:
    """The array's zarr.json: regular shard grid, '.'-separated chunk keys, fill 0, sharded with a crc32c
    index at the end, inner chunks coded by `chunk_codecs`. Only what zarr v3 requires or what differs
    from its defaults (no `attributes`, no `index_location`: "end" is the default): every small pack
    stores these files, and the manifest says the rest (packs before 0.1.x wrote both; read alike).
    A shard of one chunk (`shard == chunk`) is not sharded (format 8): the file is the chunk and its crc32c,
    and the metadata has no sharding codec (no index to store, 20 bytes a file and 200 of metadata less)."""
    itemsize = np.dtype(dtype).itemsize
    codecs: list[dict[str, Any]] = chunk_codecs(lossless, itemsize)
    if tuple(shard) != tuple(chunk):
        index = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
        sharding = {"chunk_shape": list(chunk), "codecs": codecs, "index_codecs": index}
        codecs = [{"name": "sharding_indexed", "configuration": sharding}]
    return compact(
        {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(shape),
            "data_type": np.dtype(dtype).name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "fill_value": False if np.dtype(dtype).kind == "b" else 0,
            "codecs": codecs,
        }
    )


@dataclasses.dataclass(frozen=True)
class ArrayMeta:
    """What a reader needs from an array's zarr.json (sharding_indexed over a regular grid)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    shard: tuple[int, ...]  # samples per shard x the sample shape
    chunk: tuple[int, ...]  # inner chunk shape
    codecs: tuple[dict[str, Any], ...]  # inner chunk codecs, bytes codec included
    index_codecs: tuple[dict[str, Any], ...]
    index_at_end: bool
    little: bool  # byte order of the inner chunks
    sharded: bool = True  # False: one chunk a file, no index (format 8, `array_json`)


def _codec(c: object, where: str) -> dict[str, Any]:
    if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
        raise IntegrityError(f"{where}: expected codecs as {{'name': ..., 'configuration': ...}}. Got {c!r}")
    conf = c.get("configuration", {})
    if not isinstance(conf, Mapping):
        raise IntegrityError(f"{where}: codec {c['name']!r}: expected a configuration object. Got {conf!r}")
    return {"name": c["name"], "configuration": dict(conf)}


def _shape(v: object, what: str, where: str) -> tuple[int, ...]:
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in v)
    ):
        raise IntegrityError(f"{where}: {what}: expected a list of non-negative ints. Got {v!r}")
    return tuple(v)


def parse_array_json(raw: bytes, where: str) -> ArrayMeta:
    """The array metadata a pack's reader relies on, validated (the zarr v3 spec's sharding_indexed over a
    regular chunk grid, as dctdata and zarr-python write it); anything else is an IntegrityError."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(
            f"{where}: expected readable zarr v3 array metadata. Got {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(meta, Mapping) or meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise IntegrityError(f"{where}: expected zarr v3 array metadata (zarr_format 3, node_type 'array')")
    try:
        dtype = np.dtype(meta.get("data_type"))
    except TypeError as exc:
        raise IntegrityError(f"{where}: data_type: expected a numpy dtype name. Got {meta.get('data_type')!r}") from exc
    grid = meta.get("chunk_grid")
    if (
        not isinstance(grid, Mapping)
        or grid.get("name") != "regular"
        or not isinstance(grid.get("configuration"), Mapping)
    ):
        raise IntegrityError(f"{where}: chunk_grid: expected a regular grid. Got {grid!r}")
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or not codecs:
        raise IntegrityError(f"{where}: codecs: expected a list of codecs. Got {codecs!r}")
    if _codec(codecs[-1], where)["name"] == "crc32c" and len(codecs) > 1:  # not sharded: one chunk a file
        inner = tuple(_codec(c, where) for c in codecs)
        first = inner[0]
        endian = first["configuration"].get("endian", "little") if first["name"] == "bytes" else "little"
        grid_shape = _shape(grid["configuration"].get("chunk_shape"), "chunk_grid chunk_shape", where)
        return ArrayMeta(
            _shape(meta.get("shape"), "shape", where), dtype, grid_shape, grid_shape, inner, (), True,
            endian != "big", sharded=False,
        )  # fmt: skip
    if len(codecs) != 1 or _codec(codecs[0], where)["name"] != "sharding_indexed":
        raise IntegrityError(
            f"{where}: codecs: expected one sharding_indexed codec, or chunk codecs ending in crc32c. Got {codecs!r}"
        )
    conf = _codec(codecs[0], where)["configuration"]
    inner, index = conf.get("codecs"), conf.get("index_codecs")
    if not isinstance(inner, list) or not inner or not isinstance(index, list):
        raise IntegrityError(f"{where}: sharding_indexed: expected codecs and index_codecs lists. Got {conf!r}")
    inner = tuple(_codec(c, where) for c in inner)
    first = inner[0]
    endian = first["configuration"].get("endian", "little") if first["name"] == "bytes" else "little"
    return ArrayMeta(
        shape=_shape(meta.get("shape"), "shape", where),
        dtype=dtype,
        shard=_shape(grid["configuration"].get("chunk_shape"), "chunk_grid chunk_shape", where),
        chunk=_shape(conf.get("chunk_shape"), "sharding chunk_shape", where),
        codecs=inner,
        index_codecs=tuple(_codec(c, where) for c in index),
        index_at_end=conf.get("index_location", "end") == "end",
        little=endian != "big",
    )


# A stage's configuration that packs before format 8 wrote and that means no configuration.
_LEGACY_CONFIG = {"dctdata_ctxrans": {"model": "manifest.json"}}


def _normal(codecs: Iterable[Mapping[str, Any]], itemsize: int) -> list[dict[str, Any]]:
    """Codecs with the bytes codec's byte order dropped for one-byte types (zarr-python writes it anyway), and
    the entropy coder's former {"model": "manifest.json"} configuration as none."""
    return [
        {"name": c["name"], "configuration": {}}
        if (c["name"] == "bytes" and itemsize == 1) or _LEGACY_CONFIG.get(c["name"]) == c["configuration"]
        else c
        for c in (_codec(c, "") for c in codecs)
    ]


def check_chunk_codecs(meta: ArrayMeta, lossless: Mapping[str, Any] | None, field: str, where: str) -> None:
    """The inner chunk codecs must be exactly the manifest's lossless stage with the bytes codec first (unless
    the stage takes arrays itself) and crc32c last; the shard index must be crc32c-protected."""
    itemsize = meta.dtype.itemsize
    want = _normal(chunk_codecs(lossless, itemsize, little=meta.little), itemsize)
    got = _normal(meta.codecs, itemsize)
    if got != want:
        raise IntegrityError(
            f"{where}: field {field!r}: expected chunk codecs {[c['name'] for c in want]} (the manifest's lossless "
            f"stage {dict(lossless or {})}). Got {got}"
        )
    if meta.sharded and not any(c["name"] == "crc32c" for c in meta.index_codecs):
        raise IntegrityError(f"{where}: field {field!r}: expected a crc32c shard index. Got {list(meta.index_codecs)}")
