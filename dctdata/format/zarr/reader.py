"""Read access to a zarr pack with every integrity check: the primitive under the map-style dataset
and `dctdata verify`.

Reading a batch: the reader works out which inner chunks of which shards hold the asked samples,
fetches every shard index it does not hold yet (one batch of range reads) and checks it
(`layout.check_shard_index`: crc32c, an in-file entry for every chunk that holds samples), then
fetches the byte ranges of all needed chunks of all fields in one batch (`dctdata.format.ranges`:
concurrent requests on HTTP/S3, read-ahead hints locally) and decodes each chunk itself: its
length, its crc32c, the field's lossless codec (`dctdata.lossless.get_codec`, the numcodecs codec
the writer used), the decoded size. zarr-python opens and validates the metadata only (zarr.json,
once per process): its per-read overhead (about 1.3 ms per field read on sharded arrays) was the
loader's bottleneck, and it reads missing chunks as fill values. The chunk codecs in zarr.json are
checked to be exactly the manifest's lossless codec followed by crc32c, so this decode gives the
bytes zarr would. A missing shard, a missing chunk, a truncated shard, a damaged index or chunk
raises `IntegrityError` naming the file, field and samples; unreadable zarr.json metadata too.

Process safety: zarr v3 runs an asyncio loop in a background thread and fsspec filesystems hold
connections, so nothing opened in one process is used in another. Everything is opened lazily, once
per process (keyed by pid), and dropped when the reader is pickled (spawn), so DataLoader workers
under fork and spawn each open their own.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dctdata.errors import IntegrityError
from dctdata.format.fields import FieldSpec
from dctdata.format.location import is_url, join
from dctdata.format.manifest import Manifest
from dctdata.format.ranges import RangeSource
from dctdata.format.zarr.layout import CRC_BYTES, check_shard_index, index_bytes, shard_key, zarr_layout
from dctdata.kinds import FieldKind

# Fields whose whole stored array is at most this big are read once per process and kept in memory
# (labels, small targets), so random access does not decompress a chunk per sample for them.
CACHE_BYTES = 16 << 20
# Parsed shard indexes kept per process (16 bytes per chunk entry): 1M entries is 16 MiB.
INDEX_CACHE_ENTRIES = 1 << 20
_PROCESS_STATE = ("_cache", "_no_cache", "_indexes", "_index_entries", "_plans", "_lock")


class ZarrReader:
    """Stored samples of a zarr pack's fields, integrity-checked (see the module docstring)."""

    def __init__(
        self,
        root: str,
        manifest: Manifest,
        fields: tuple[FieldSpec, ...] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.fields = tuple(manifest.fields if fields is None else fields)
        self.storage_options = dict(storage_options or {})
        self.layout = zarr_layout(manifest, self.fields, where=join(root, "manifest.json"))
        self.source = RangeSource(root, self.storage_options)
        self._pid: int | None = None

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k not in _PROCESS_STATE}
        state["_pid"] = None
        return state

    def ensure_open(self) -> None:
        """Open the group and check each field's array metadata, once per process."""
        if self._pid == os.getpid():
            return
        import zarr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numcodecs-in-zarr-v3 notice
            try:
                options = self.storage_options or None
                group = (
                    zarr.open_group(self.root, mode="r", storage_options=options)
                    if is_url(self.root)
                    else zarr.open_group(self.root, mode="r")
                )
            except Exception as exc:  # noqa: BLE001 - zarr raises many types on missing/damaged metadata
                raise IntegrityError(
                    f"{join(self.root, 'zarr.json')}: expected readable zarr v3 group metadata. Got "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            arrays = {}
            for f in self.fields:
                path = self.layout[f.name]["path"]
                meta = join(self.root, path, "zarr.json")
                try:
                    arrays[f.name] = group[path]
                except KeyError as exc:
                    raise IntegrityError(f"{meta}: field {f.name!r}: expected zarr array {path!r}. Got none") from exc
                except Exception as exc:  # noqa: BLE001
                    raise IntegrityError(
                        f"{meta}: field {f.name!r}: expected readable zarr array metadata. Got {type(exc).__name__}: "
                        f"{exc}"
                    ) from exc
        for f in self.fields:
            arr = arrays[f.name]
            expect = (self.manifest.samples, *f.stored_shape)
            if tuple(arr.shape) != expect or arr.dtype != np.dtype(f.stored_dtype):
                raise IntegrityError(
                    f"{self.root}: field {f.name!r}: expected zarr array {expect} {f.stored_dtype}. Got {arr.shape} "
                    f"{arr.dtype}"
                )
        self._plans = {f.name: _field_plan(arrays[f.name], f, self.layout[f.name], self.root) for f in self.fields}
        self._cache: dict[str, np.ndarray] = {}
        self._no_cache: set[str] = set()
        self._indexes: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._index_entries = 0
        self._lock = threading.Lock()  # the caches, when threads share a reader
        self._pid = os.getpid()

    # Reading -------------------------------------------------------------------------------------
    def read(self, f: FieldSpec, a: int, b: int) -> np.ndarray:
        """Stored samples [a, b) of a field, integrity-checked."""
        return self.read_samples((f,), range(a, b))[f.name]

    def read_samples(self, fields: Iterable[FieldSpec], indices: Sequence[int]) -> dict[str, np.ndarray]:
        """{field name: stored samples `indices` (in that order)} for each field, integrity-checked.
        Every chunk of every field is fetched in one batch."""
        self.ensure_open()
        fields = tuple(fields)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out: dict[str, np.ndarray] = {}
        direct = []
        for f in fields:
            whole = self._whole(f)
            if whole is not None:
                out[f.name] = whole[idx]
            else:
                direct.append(f)
        if direct:
            out.update(self._read_chunks(direct, idx))
        return {f.name: out[f.name] for f in fields}

    def _whole(self, f: FieldSpec) -> np.ndarray | None:
        """The whole stored array of a small non-dct field, read once per process; None for others."""
        if f.name in self._cache:
            return self._cache[f.name]
        small = f.kind is not FieldKind.DCT and f.stored_sample_bytes * self.manifest.samples <= CACHE_BYTES
        if not small or f.name in self._no_cache:
            return None
        try:
            self._cache[f.name] = self._read_chunks((f,), np.arange(self.manifest.samples))[f.name]
        except IntegrityError:
            self._no_cache.add(f.name)  # read only what is asked, so the error names those samples
            return None
        return self._cache[f.name]

    def _read_chunks(self, fields: Sequence[FieldSpec], idx: np.ndarray) -> dict[str, np.ndarray]:
        n = self.manifest.samples
        groups = {}  # field name -> (chunk numbers, for each the output rows it fills)
        for f in fields:
            of_chunk = idx // self.layout[f.name]["chunk"]
            order = np.argsort(of_chunk, kind="stable")
            chunks, first = np.unique(of_chunk[order], return_index=True)
            groups[f.name] = (chunks.tolist(), np.split(order, first[1:]))
        indexes = self._load_indexes(
            [
                (f, s)
                for f in fields
                for s in sorted({c // self._plans[f.name].chunks_per_shard for c in groups[f.name][0]})
            ]
        )
        requests, todo = [], []
        for f in fields:
            plan = self._plans[f.name]
            for c, rows in zip(*groups[f.name]):
                s, k = divmod(c, plan.chunks_per_shard)
                off, nbytes = (int(v) for v in indexes[(f.name, s)][k])
                requests.append((plan.key(s), off, off + nbytes))
                todo.append((f, c, rows))
        got = self.source.fetch(requests)
        out = {f.name: np.empty((len(idx), *f.stored_shape), dtype=f.stored_dtype) for f in fields}
        for (f, c, rows), (rel, start, stop), data in zip(todo, requests, got):
            chunk = self.layout[f.name]["chunk"]
            lo, hi = c * chunk, min((c + 1) * chunk, n)
            where = f"{join(self.root, rel)}: field {f.name!r} samples {lo}..{hi - 1} (chunk {c})"
            values = self._plans[f.name].decode(data, stop - start, where)
            out[f.name][rows] = values[idx[rows] - lo]
        return out

    # Shard indexes -------------------------------------------------------------------------------
    def _load_indexes(self, shards: list[tuple[FieldSpec, int]]) -> dict[tuple[str, int], np.ndarray]:
        """{(field name, shard): index entries} for `shards`; those not held yet are fetched in one batch
        and checked."""
        held, todo = {}, []
        with self._lock:
            for f, s in shards:
                entries = self._indexes.get((f.name, s))
                if entries is None:
                    todo.append((f, s))
                else:
                    self._indexes.move_to_end((f.name, s))
                    held[(f.name, s)] = entries
        if not todo:
            return held
        sizes, requests = [], []
        for f, s in todo:
            plan = self._plans[f.name]
            rel, where = plan.key(s), self._shard_where(f, s)
            need = index_bytes(plan.chunks_per_shard)
            size = self._shard_size(rel, where)
            start = max(size - need, 0) if plan.index_at_end else 0
            sizes.append(size)
            requests.append((rel, start, min(start + need, size)))
        got = self.source.fetch(requests)
        for (f, s), size, (_, start, stop), data in zip(todo, sizes, requests, got):
            plan, where = self._plans[f.name], self._shard_where(f, s)
            if isinstance(data, FileNotFoundError):
                raise IntegrityError(f"{where}: expected a shard file. Got none (missing)") from data
            if isinstance(data, Exception):
                said = " (the manifest's size; a truncated shard?)" if self.source.remote else ""
                raise IntegrityError(
                    f"{where}: expected a readable shard index at bytes {start}..{stop}{said}. Got "
                    f"{type(data).__name__}: {data}"
                ) from data
            need = index_bytes(plan.chunks_per_shard)
            if size >= need and len(data) != need:
                raise IntegrityError(
                    f"{where}: expected {need} index bytes of a {size}-byte shard. Got {len(data)} (truncated shard)"
                )
            n, chunk = self.manifest.samples, self.layout[f.name]["chunk"]
            entries = check_shard_index(
                data,
                size,
                chunks_per_shard=plan.chunks_per_shard,
                index_at_end=plan.index_at_end,
                first=s * self.layout[f.name]["shard"],
                chunk=chunk,
                samples=n,
                where=where,
                key_where=f"{join(self.root, plan.key(s))}: field {f.name!r}",
            )
            held[(f.name, s)] = entries
            with self._lock:
                if (f.name, s) not in self._indexes:
                    self._indexes[(f.name, s)] = entries
                    self._index_entries += len(entries)
                while self._index_entries > INDEX_CACHE_ENTRIES and len(self._indexes) > 1:
                    self._index_entries -= len(self._indexes.popitem(last=False)[1])
        return held

    def _shard_where(self, f: FieldSpec, s: int) -> str:
        shard, n = self.layout[f.name]["shard"], self.manifest.samples
        lo, hi = s * shard, min((s + 1) * shard, n) - 1
        return f"{join(self.root, self._plans[f.name].key(s))}: field {f.name!r} samples {lo}..{hi}"

    def _shard_size(self, rel: str, where: str) -> int:
        """A shard's size: the file's own locally; the manifest's byte count for URLs (one request less
        per shard; a shorter file then fails the length checks as truncated)."""
        entry = self.manifest.checksums.get(rel) if isinstance(self.manifest.checksums, Mapping) else None
        if self.source.remote and isinstance(entry, Mapping) and isinstance(entry.get("bytes"), int):
            return entry["bytes"]
        try:
            return self.source.size(rel)
        except FileNotFoundError as exc:
            raise IntegrityError(f"{where}: expected a shard file. Got none (missing)") from exc
        except OSError as exc:
            raise IntegrityError(f"{where}: expected a readable shard file. Got {type(exc).__name__}: {exc}") from exc


class _FieldPlan:
    """How one field's chunks are stored: shard geometry, the chunk codec, the decoded sample layout."""

    def __init__(self, f: FieldSpec, path: str, chunks_per_shard: int, index_at_end: bool, chunk: int, little: bool):
        from dctdata.lossless import get_codec

        self.path, self.ndim = path, 1 + len(f.stored_shape)
        self.chunks_per_shard, self.index_at_end = chunks_per_shard, index_at_end
        self.codec = get_codec(f.lossless)
        self.dtype = np.dtype(f.stored_dtype).newbyteorder("<" if little else ">")
        self.shape = (chunk, *f.stored_shape)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    def key(self, s: int) -> str:
        return shard_key(self.path, s, self.ndim)

    def decode(self, data: bytes | Exception, expected: int, where: str) -> np.ndarray:
        """One stored chunk: length, crc32c, the lossless codec, the decoded size."""
        import google_crc32c
        from numcodecs.compat import ensure_contiguous_ndarray

        if isinstance(data, Exception):
            raise IntegrityError(f"{where}: expected a readable chunk. Got {type(data).__name__}: {data}") from data
        if len(data) != expected or expected < CRC_BYTES:
            raise IntegrityError(
                f"{where}: expected intact stored data ({expected} bytes). Got {len(data)} bytes (truncated shard)"
            )
        body = data[:-CRC_BYTES]
        if google_crc32c.value(body) != int.from_bytes(data[-CRC_BYTES:], "little"):
            raise IntegrityError(f"{where}: expected intact stored data. Got a chunk failing its crc32c (corrupted)")
        try:
            raw = body if self.codec is None else self.codec.decode(body)
            raw = (
                np.frombuffer(raw, np.uint8)
                if isinstance(raw, bytes)
                else ensure_contiguous_ndarray(raw).view(np.uint8)
            )
        except Exception as exc:  # noqa: BLE001 - codecs raise many types on bad bytes
            raise IntegrityError(
                f"{where}: expected intact stored data. Got {type(exc).__name__} from the lossless codec: {exc}"
            ) from exc
        if raw.nbytes != self.nbytes:
            raise IntegrityError(
                f"{where}: expected {self.nbytes} bytes after decoding. Got {raw.nbytes} (corrupted chunk)"
            )
        return raw.view(self.dtype).reshape(self.shape)


def _field_plan(arr, f: FieldSpec, layout: dict, root: str) -> _FieldPlan:
    """The field's storage plan from the array's sharding codec, cross-checked with the manifest: the
    layout's shard and chunk lengths, a crc32c shard index, and inner chunk codecs that are exactly
    bytes -> the manifest's lossless codec -> crc32c. Anything else is an IntegrityError."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    from dctdata.lossless import zarr_compressors

    codecs = getattr(arr.metadata, "codecs", ())
    sharding = codecs[0] if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec) else None
    where = join(root, layout["path"], "zarr.json")
    if sharding is None or not any(isinstance(c, Crc32cCodec) for c in sharding.index_codecs):
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected a sharded array with a crc32c shard index. Got codecs {codecs!r}"
        )
    shard_shape = tuple(arr.metadata.chunk_grid.chunk_shape)
    chunk_shape = tuple(sharding.chunk_shape)
    if shard_shape[0] != layout["shard"] or chunk_shape[0] != layout["chunk"] or shard_shape[1:] != chunk_shape[1:]:
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected shards of {layout['shard']} and chunks of {layout['chunk']} samples "
            f"(manifest layout). Got shard shape {shard_shape} and chunk shape {chunk_shape}"
        )
    inner = tuple(sharding.codecs)
    expect = [c.to_dict() for c in zarr_compressors(f.lossless)]
    if (
        len(inner) < 2
        or not isinstance(inner[0], BytesCodec)
        or not isinstance(inner[-1], Crc32cCodec)
        or [c.to_dict() for c in inner[1:-1]] != expect
    ):
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected chunk codecs bytes -> {expect} (the manifest's lossless codec) -> "
            f"crc32c. Got {[c.to_dict() for c in inner]}"
        )
    endian = getattr(inner[0], "endian", None)
    little = str(getattr(endian, "value", endian) or "little") == "little"
    at_end = str(getattr(sharding.index_location, "value", sharding.index_location)) == "end"
    return _FieldPlan(f, layout["path"], layout["shard"] // layout["chunk"], at_end, layout["chunk"], little)
