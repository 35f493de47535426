"""Read access to a zarr pack with every integrity check: the storage reader (`dctdata.format.reader`)
under the map-style dataset, `dctdata verify` and `inspect`. Random access; its units are the fields
(verify reads each field chunk by chunk, so one bad chunk is one problem).

Opening (once per process): each field's zarr.json is fetched (all in one batch), checked against the
manifest's sha256 when the manifest lists it, parsed (`metadata.parse_array_json`) and cross-checked
with the manifest: shape, dtype, shard and chunk lengths, and inner chunk codecs that are exactly the
field's lossless stage followed by crc32c. zarr-python is not involved: its per-read overhead on sharded
arrays was the loader's bottleneck (docs/benchmarks/design.md), it reads missing chunks as fill values, and
it does not know dctdata's entropy coder.

Reading a batch: the reader works out which inner chunks of which shards hold the asked samples,
fetches every shard index it does not hold yet (one batch of range reads) and checks it
(`layout.check_shard_index`: crc32c, an in-file entry for every chunk that holds samples), then
fetches the byte ranges of all needed chunks of all fields in one batch (`dctdata.format.ranges`:
concurrent requests on HTTP/S3, read-ahead hints locally) and decodes each chunk itself: its length,
its crc32c, the field's lossless stage bounded to the chunk's size (`dctdata.stages.Stage.decode`).
A missing shard, a missing chunk, a truncated shard, a damaged index or chunk raises `IntegrityError`
naming the file, field and samples; unreadable or modified zarr.json metadata too.

Threads: the chunks of one batch are decoded on `torch.get_num_threads()` threads (the decoders release
the GIL; `dctdata.pool`'s per-process pool, which a fork child rebuilds) when the batch has at least two
chunks and enough estimated decode work for each thread to pay for the handoff (`decode_threads`). A
`make_loader` worker runs one torch thread, so workers never take each other's cores; the main process
(`num_workers=0`, `dctdata verify`) follows its torch setting. The dataset's `read_threads` option, or
else the environment's `DCTDATA_READ_THREADS=N`, caps the threads (1: none). The output and the errors
are the same either way: each thread takes a run of chunks in batch order and stops at its first bad
chunk, and the first failing run's error is raised.
Where chunk k fills row k (one-sample chunks of the entropy coder, an increasing batch), a thread's run
is one kernel call (`CtxCodec.decode_many`), which holds the GIL once instead of once per chunk
(faster batches, most on many threads: docs/benchmarks/design.md); a stage
says whether it does (`Stage.decodes_runs`).

Process safety: fsspec filesystems hold connections and file descriptors are per process, so nothing
opened in one process is used in another. Everything is opened lazily, once per process (keyed by
pid), and dropped when the reader is pickled (spawn), so DataLoader workers under fork and spawn each
open their own.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import google_crc32c
import numpy as np
import numpy.typing as npt
import torch

from dctdata.decoder.stored import check_stream
from dctdata.decoder.wire import StoredSample, StreamForm, stage_key
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.compact import COMPACT_VERSION
from dctdata.format.fields import FieldSpec, user_fields
from dctdata.format.location import join
from dctdata.format.manifest import Manifest
from dctdata.format.ranges import RangeSource
from dctdata.format.reader import StorageReader, Unit, UnitReader, batch_values
from dctdata.format.zarr.layout import (
    CRC_BYTES,
    check_shard_index,
    derived_files,
    index_bytes,
    shard_key,
    shard_of_file,
    zarr_layout,
)
from dctdata.format.zarr.metadata import ArrayMeta, check_chunk_codecs, check_group_json, parse_array_json
from dctdata.pool import run_split
from dctdata.stages import RAW, get_stage

# Fields whose whole stored array is at most this big are read once per process and kept in memory
# (labels, small targets), so random access does not decompress a chunk per sample for them.
CACHE_BYTES = 16 << 20
# Parsed shard indexes kept per process (16 bytes per chunk entry): 1M entries is 16 MiB.
INDEX_CACHE_ENTRIES = 1 << 20
MAX_METADATA_BYTES = 1 << 20  # an array's zarr.json (a few hundred bytes as written)
# Threading a batch's chunk decode (see `decode_threads`). Handing a run of chunks to the pool costs
# about HANDOFF_US, so each thread must get at least THREAD_MIN_US of estimated decode. The handing out is
# serial in the caller (and the threads' per-chunk Python work shares the GIL), so a batch of work W spread
# on n threads takes about W/n + HANDOFF_US * n: at most sqrt(W / HANDOFF_US) threads pay. Too many threads
# slowed a cheap stage's batches (zstd) while the entropy coder's kept gaining: the measurements are in
# docs/benchmarks/design.md. The estimate is the chunks' decoded bytes over their stage's decode rate in
# bytes per microsecond (`Stage.decode_bytes_per_us`), each stage's rate rounded up so that an estimate
# errs toward one thread.
THREAD_MIN_US = 100
HANDOFF_US = 25
CRC_RESIDUE = 0x48674BC7  # crc32c(message + crc32c(message) as 4 little-endian bytes), for every message
_PROCESS_STATE = ("_cache", "_no_cache", "_indexes", "_index_entries", "_plans", "_lock")
# One first open at a time (threads sharing a reader): a second thread waits for the first's state
# instead of rebuilding it under the first's feet. A fork child gets a fresh lock.
_OPEN_LOCK = threading.Lock()


def decode_threads(chunks: int, decode_us: float, limit: int | None = None) -> int:
    """Threads to decode `chunks` chunks estimated at `decode_us` microseconds with: torch's intra-op
    thread count (one in a `make_loader` worker, so workers never oversubscribe), capped by `limit` (the
    dataset's `read_threads`) or else `DCTDATA_READ_THREADS`, by the chunks, by one thread per THREAD_MIN_US
    and by sqrt(decode_us / HANDOFF_US), the count past which handing out more runs costs more than it saves."""
    threads = torch.get_num_threads()
    cap = os.environ.get("DCTDATA_READ_THREADS", "").strip()
    if limit is not None:
        threads = min(threads, limit)
    elif cap:
        if not cap.isdigit() or int(cap) < 1:
            raise DctDataError(f"DCTDATA_READ_THREADS: expected an int >= 1 (1: no threads). Got {cap!r}")
        threads = min(threads, int(cap))
    paying = min(decode_us // THREAD_MIN_US, math.sqrt(decode_us / HANDOFF_US))
    return max(1, min(threads, chunks, int(paying)))


def _new_open_lock() -> None:
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_open_lock)


class ZarrReader(StorageReader):
    """Stored samples of a zarr pack's fields, integrity-checked (see the module docstring)."""

    storage = "zarr"
    random_access = True
    read_threads: int | None = None  # the dataset's cap on threads decoding a batch (`decode_threads`)

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
        self._stored = tuple(f for f in self.fields if "inline" not in self.layout[f.name])  # with files
        self.source = RangeSource(root, self.storage_options)
        self._pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in _PROCESS_STATE}
        state["_pid"] = None
        return state

    def ensure_open(self) -> None:
        """Read and check each field's array metadata (zarr.json), once per process."""
        if self._pid == os.getpid():
            return
        with _OPEN_LOCK:
            if self._pid != os.getpid():
                self._open_locked()

    def _open_locked(self) -> None:
        self._pid = None
        self.source._open()  # its per-process state too, under the same lock
        metas, unlisted = self._read_metadata()
        plans = {}
        for f in self._stored:
            meta, where = metas[f.name], join(self.root, self.layout[f.name]["path"], "zarr.json")
            expect = (self.manifest.samples, *f.stored_shape)
            if meta.shape != expect or meta.dtype.newbyteorder("=") != np.dtype(f.stored_dtype):
                raise IntegrityError(
                    f"{where}: field {f.name!r}: expected zarr array {expect} {f.stored_dtype}. Got {meta.shape} "
                    f"{meta.dtype}"
                )
            plans[f.name] = _field_plan(meta, f, self.layout[f.name], where)
            plans[f.name].form = self.stamp(plans[f.name].form, f)  # its pack's identity and codec
        for name, (data, where, what) in unlisted.items():  # last: the checks above name what disagrees first
            want = self._derived_metadata(name)
            if data != want:
                raise IntegrityError(
                    f"{where}: expected the {what} the manifest implies ({len(want)} bytes, format version "
                    f"{COMPACT_VERSION}). Got different bytes ({len(data)}; modified after packing?)"
                )
        self._plans = plans
        # side partners kept in the manifest (version 4) are whole arrays from the start
        self._cache: dict[str, npt.NDArray[Any]] = {
            f.name: self.layout[f.name]["inline"] for f in self.fields if f not in self._stored
        }
        self._no_cache: set[str] = set()
        self._indexes: OrderedDict[tuple[str, int], npt.NDArray[Any]] = OrderedDict()
        self._index_entries = 0
        self._lock = threading.Lock()  # the caches, when threads share a reader
        self._pid = os.getpid()

    def _read_metadata(self) -> tuple[dict[str, ArrayMeta], dict[str, tuple[bytes, str, str]]]:
        """({field: parsed zarr.json}, {field or "": (bytes, where, what) of the files to compare with the
        manifest's}), every file (the group's too) fetched in one batch. A file the manifest lists is read at
        its recorded size and must match its sha256 (it says what the chunks mean); a version 8 manifest lists
        none, and the caller compares each with the bytes the manifest implies after the checks that name
        what disagrees."""
        rels = {"": "zarr.json", **{f.name: f"{self.layout[f.name]['path']}/zarr.json" for f in self._stored}}
        entries = self.manifest.checksums if isinstance(self.manifest.checksums, Mapping) else {}
        requests = []
        for rel in rels.values():
            entry = entries.get(rel)
            size = entry.get("bytes") if isinstance(entry, Mapping) else None
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_METADATA_BYTES:
                try:
                    size = min(self.source.size(rel), MAX_METADATA_BYTES + 1)
                except OSError:
                    size = 0  # the fetch below reports the missing file
            requests.append((rel, 0, size))
        got = self.source.fetch(requests)
        out, unlisted = {}, {}
        for (name, rel), data in zip(rels.items(), got):
            where = join(self.root, rel) + (f": field {name!r}" if name else "")
            what = "zarr v3 array metadata" if name else "zarr v3 group metadata"
            if isinstance(data, Exception):
                missing = " (missing)" if isinstance(data, FileNotFoundError) else f" ({type(data).__name__}: {data})"
                raise IntegrityError(f"{where}: expected {what}. Got none{missing}")
            if len(data) > MAX_METADATA_BYTES:
                raise IntegrityError(f"{where}: expected {what} of at most {MAX_METADATA_BYTES} bytes")
            entry = entries.get(rel)
            if isinstance(entry, Mapping) and isinstance(entry.get("sha256"), str):
                if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise IntegrityError(
                        f"{where}: expected the {what} the manifest's sha256 names. Got different bytes "
                        f"({len(data)}; modified after packing?)"
                    )
            elif self.manifest.version >= COMPACT_VERSION:
                unlisted[name] = (bytes(data), where, what)
            if name:
                out[name] = parse_array_json(data, join(self.root, rel))
            else:
                check_group_json(data, where)
        return out, unlisted

    def _derived_metadata(self, name: str) -> bytes:
        """The zarr.json a version 8 writer wrote for field `name` ("" for the group), rebuilt from the manifest:
        it lists none of them, and a file with other bytes was changed after packing."""
        rel = f"{self.layout[name]['path']}/zarr.json" if name else "zarr.json"
        return derived_files(self.manifest)[rel]

    def close(self) -> None:
        """Close this process's file descriptors (`RangeSource.close`); a later read opens them again."""
        self.source.close()

    # Reading -------------------------------------------------------------------------------------
    def read_samples(
        self, fields: Iterable[FieldSpec], indices: Sequence[int], stored: Collection[str] = ()
    ) -> dict[str, Any]:
        """{field name: stored samples `indices` (in that order)} for each field, integrity-checked.
        Every chunk of every field is fetched in one batch. A dct field named in `stored` comes back as a
        list of `StoredSample`s: each one's chunk checked (length, crc32c, declared size), not decoded."""
        self.ensure_open()
        fields = tuple(fields)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out: dict[str, npt.NDArray[Any]] = {}
        direct = []
        for f in fields:
            whole = self._whole(f)
            if whole is not None:
                out[f.name] = whole[idx]
            else:
                direct.append(f)
        if direct:
            out.update(self._read_chunks(direct, idx, frozenset(stored)))
        return {f.name: out[f.name] for f in fields}

    def _whole(self, f: FieldSpec) -> npt.NDArray[Any] | None:
        """The whole stored array of a small non-dct field, read once per process (a side partner kept in
        the manifest is there from the open on); None for others."""
        if f.name in self._cache:
            return self._cache[f.name]
        small = not f.coded and f.stored_sample_bytes * self.manifest.samples <= CACHE_BYTES
        if not small or f.name in self._no_cache:
            return None
        try:
            self._cache[f.name] = self._read_chunks((f,), np.arange(self.manifest.samples))[f.name]
        except IntegrityError:
            self._no_cache.add(f.name)  # read only what is asked, so the error names those samples
            return None
        return self._cache[f.name]

    def _read_chunks(
        self, fields: Sequence[FieldSpec], idx: npt.NDArray[Any], stored: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        # field name -> (chunk numbers, for each the output rows it fills: an int for one row)
        groups: dict[str, tuple[list[int], range | list[int | npt.NDArray[Any]]]] = {}
        increasing = len(idx) < 2 or bool(np.all(idx[1:] > idx[:-1]))
        for f in fields:
            if self.layout[f.name]["chunk"] == 1 and increasing:  # chunk k fills row k (the usual batch)
                groups[f.name] = (idx.tolist(), range(len(idx)))
                continue
            of_chunk = idx // self.layout[f.name]["chunk"]
            order = np.argsort(of_chunk, kind="stable")
            chunks, first = np.unique(of_chunk[order], return_index=True)
            groups[f.name] = (chunks.tolist(), [int(r[0]) if len(r) == 1 else r for r in np.split(order, first[1:])])
        indexes = self._load_indexes(
            [
                (f, s)
                for f in fields
                for s in sorted({c // self._plans[f.name].chunks_per_shard for c in groups[f.name][0]})
            ]
        )
        requests: list[tuple[str, int, int]] = []
        todo: list[tuple[FieldSpec, int, int | npt.NDArray[Any]]] = []
        spans: dict[
            str, tuple[int, int]
        ] = {}  # field name -> its [first, stop) in todo, where chunk k fills row k and runs decode in one call
        for f in fields:
            plan = self._plans[f.name]
            if plan.runs and isinstance(groups[f.name][1], range) and f.name not in stored:
                spans[f.name] = (len(todo), len(todo) + len(idx))
            for c, rows in zip(*groups[f.name]):
                s, k = divmod(c, plan.chunks_per_shard)
                off, nbytes = (int(v) for v in indexes[(f.name, s)][k])
                requests.append((plan.key(s), off, off + nbytes))
                todo.append((f, c, rows))
        got = self.source.fetch(requests)
        out: dict[str, Any] = {  # a field's (N, ...) array, or its list of StoredSample
            f.name: [None] * len(idx) if f.name in stored else np.empty((len(idx), *f.stored_shape), f.stored_dtype)
            for f in fields
        }

        def where(k: int) -> str:
            return self._chunk_where(todo[k][0], requests[k][0], todo[k][1])

        def decode(first: int, last: int) -> None:  # chunks [first, last) in batch order; stops at the first bad one
            k = first
            while k < last:
                (f, c, rows), (_, start, stop) = todo[k], requests[k]
                plan, span = self._plans[f.name], spans.get(f.name)
                if span is not None:  # the rest of this run's chunks of the field, in one kernel call
                    end = min(last, span[1])
                    sizes = [b - a for _, a, b in requests[k:end]]
                    plan.decode_rows(got[k:end], sizes, where, k, out[f.name][rows:])
                    k = end
                    continue
                if f.name in stored:  # checked, handed over as they are: samples of the chunk share its bytes
                    body = plan.stored(got[k], stop - start, partial(where, k))
                    for r in [rows] if isinstance(rows, int) else rows.tolist():
                        i = int(idx[r])
                        out[f.name][r] = StoredSample(body, (f.name, c), i - c * plan.shape[0], plan.form, i)
                    k += 1
                    continue
                values = plan.decode(got[k], stop - start, partial(where, k))
                out[f.name][rows] = values[idx[rows] - c * plan.shape[0]]
                k += 1

        decode_us = sum(
            self._plans[f.name].check_us if f.name in stored else self._plans[f.name].decode_us for f, _, _ in todo
        )
        run_split(decode, len(todo), decode_threads(len(todo), decode_us, self.read_threads))
        return out

    def stream_form(self, f: FieldSpec) -> StreamForm:
        """How a field's chunks decode when they cross as stored bytes (decode="device")."""
        self.ensure_open()
        return self._plans[f.name].form

    # Units (verify, peek) ------------------------------------------------------------------------
    def units(self) -> list[Unit]:
        """One unit per user field: all its chunks (its side partner's read with them)."""
        return [Unit(self.root, 0, self.manifest.samples, (f.name,), f.name) for f in user_fields(self.fields)]

    def open_unit(self, unit: Unit) -> _FieldUnit:
        """A reader of the unit's field alone, its metadata checked (a field with bad metadata does not stop
        the others)."""
        reader = ZarrReader(self.root, self.manifest, self._fields_of(unit), self.storage_options)
        reader.ensure_open()
        return _FieldUnit(reader)

    def read_unit(self, unit: Unit, batch: int) -> Iterator[tuple[int, list[Any] | DctDataError]]:
        """The field chunk by chunk (`batch` is the field's chunk): a bad chunk is yielded as its error and
        reading goes on with the next."""
        reader = self.open_unit(unit).reader
        fields, chunk = reader.fields, self.layout[unit.key]["chunk"]
        for a in range(0, self.manifest.samples if batch else 0, chunk):
            b = min(a + chunk, self.manifest.samples)
            try:
                yield a, batch_values(fields, reader.read_samples(fields, range(a, b)))
            except DctDataError as exc:
                yield a, exc

    def file_samples(self, rel: str) -> str:
        return shard_of_file(self.manifest, rel)

    # Shard indexes -------------------------------------------------------------------------------
    def _load_indexes(self, shards: list[tuple[FieldSpec, int]]) -> dict[tuple[str, int], npt.NDArray[Any]]:
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
        if any(not self._plans[f.name].sharded for f, _ in todo):  # one chunk a file: the file is its entry
            for f, s in [t for t in todo if not self._plans[t[0].name].sharded]:
                size = self._shard_size(self._plans[f.name].key(s), self._shard_where(f, s))
                held[(f.name, s)] = np.array([[0, size]], dtype="<u8")
            todo = [t for t in todo if self._plans[t[0].name].sharded]
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

    def _chunk_where(self, f: FieldSpec, rel: str, c: int) -> str:
        """A chunk's description for error messages (built only for one)."""
        chunk = self.layout[f.name]["chunk"]
        lo, hi = c * chunk, min((c + 1) * chunk, self.manifest.samples)
        return f"{join(self.root, rel)}: field {f.name!r} samples {lo}..{hi - 1} (chunk {c})"

    def _shard_where(self, f: FieldSpec, s: int) -> str:
        shard, n = self.layout[f.name]["shard"], self.manifest.samples
        lo, hi = s * shard, min((s + 1) * shard, n) - 1
        return f"{join(self.root, self._plans[f.name].key(s))}: field {f.name!r} samples {lo}..{hi}"

    def _shard_size(self, rel: str, where: str) -> int:
        """A shard's size: the file's own locally; the manifest's byte count for URLs (one request less
        per shard; a shorter file then fails the length checks as truncated)."""
        entry = self.manifest.checksums.get(rel) if isinstance(self.manifest.checksums, Mapping) else None
        if self.source.remote and isinstance(entry, Mapping) and isinstance(entry.get("bytes"), int):
            return int(entry["bytes"])
        try:
            return self.source.size(rel)
        except FileNotFoundError as exc:
            raise IntegrityError(f"{where}: expected a shard file. Got none (missing)") from exc
        except OSError as exc:
            raise IntegrityError(f"{where}: expected a readable shard file. Got {type(exc).__name__}: {exc}") from exc


class _FieldUnit(UnitReader):
    """A zarr unit (one field), sample by sample."""

    def __init__(self, reader: ZarrReader) -> None:
        self.reader, self.fields = reader, reader.fields

    def __len__(self) -> int:
        return self.reader.manifest.samples

    def sample(self, j: int, stored: Collection[str] = ()) -> list[Any]:
        arrays = self.reader.read_samples(self.reader.fields, [j])
        return [f.to_tensor(arrays[f.name])[0] for f in self.reader.fields]


class _FieldPlan:
    """How one field's chunks are stored: shard geometry, the chunk codec, the decoded sample layout."""

    def __init__(
        self,
        f: FieldSpec,
        path: str,
        chunks_per_shard: int,
        index_at_end: bool,
        chunk: int,
        little: bool,
        sharded: bool = True,
    ):
        self.path, self.ndim = path, 1 + len(f.stored_shape)
        self.chunks_per_shard, self.index_at_end = chunks_per_shard, index_at_end
        self.sharded = sharded  # False: each file is one chunk and its crc32c, no index (format 8)
        self.codec = get_stage(f.lossless)
        self.dtype = np.dtype(f.stored_dtype).newbyteorder("<" if little else ">")
        self.shape = (chunk, *f.stored_shape)
        rate = self.codec.decode_bytes_per_us
        self.decode_us = math.prod(self.shape) * self.dtype.itemsize / rate  # estimated, for `decode_threads`
        self.check_us = math.prod(self.shape) * self.dtype.itemsize / RAW.decode_bytes_per_us  # stored: checks only
        # how its chunks decode when they cross as stored bytes (decode="device")
        self.form = StreamForm(
            f.name,
            stage_key(f.lossless),
            f.stored_shape,
            f.stored_dtype,
            rows=chunk,
            decoded=math.prod(self.shape) * self.dtype.itemsize,
            little=little or self.dtype.itemsize == 1,
        )
        # A stage that decodes a run of one-sample chunks in one call (`decode_rows`; the entropy coder)
        self.runs = self.codec.decodes_runs and chunk == 1 and self.dtype == np.dtype(f.stored_dtype)

    def key(self, s: int) -> str:
        return shard_key(self.path, s, self.ndim)

    def decode(self, data: bytes | Exception, expected: int, where: Callable[[], str]) -> npt.NDArray[Any]:
        """One stored chunk: length, crc32c, the lossless stage (bounded to the chunk's size). `where()`
        describes the chunk; it is called only for an error message, so a batch formats no strings."""
        return self.codec.decode(self._checked(data, expected, where), self.shape, self.dtype, where, writeable=False)

    def decode_rows(
        self,
        data: Sequence[bytes | Exception],
        expected: list[int],
        where: Callable[[int], str],
        first: int,
        out: npt.NDArray[Any],
    ) -> None:
        """One-sample chunks into out[0], out[1], ...: the checks of `decode`, then the stage's
        `decode_many` on the run (one kernel call that releases the GIL once: threads decoding runs of a batch
        then hold it once per run, not per chunk). The first bad chunk raises `decode`'s own error for it.
        `where(first + i)` describes the run's chunk i."""
        bodies, bad = [], None
        for i, (d, n) in enumerate(zip(data, expected)):
            try:
                bodies.append(self._checked(d, n, partial(where, first + i)))
            except IntegrityError as exc:
                bad = exc
                break
        done = 0
        while done < len(bodies):
            done += self.codec.decode_many(bodies[done:], out[done : len(bodies), None])
            if done < len(bodies):  # this one did not decode: `decode` raises its error (and places it if it did)
                out[done] = self.decode(data[done], expected[done], partial(where, first + done))[0]
                done += 1
        if bad is not None:
            raise bad

    def stored(self, data: bytes | Exception, expected: int, where: Callable[[], str]) -> memoryview:
        """A stored chunk's body as it crosses with decode="device": the checks of `decode` that need no
        decoding (length, crc32c, the declared size of its stream)."""
        body = self._checked(data, expected, where)
        check_stream(self.codec, body, self.form.decoded, where)
        return body

    def _checked(self, data: bytes | Exception, expected: int, where: Callable[[], str]) -> memoryview:
        """A stored chunk's body after its length and crc32c checks."""
        if isinstance(data, Exception):
            raise IntegrityError(f"{where()}: expected a readable chunk. Got {type(data).__name__}: {data}") from data
        if len(data) != expected or expected < CRC_BYTES:
            raise IntegrityError(
                f"{where()}: expected intact stored data ({expected} bytes). Got {len(data)} bytes (truncated shard)"
            )
        # A message followed by its own little-endian crc32c always has the crc32c CRC_RESIDUE (the check
        # of the whole chunk, no copy of its body; any other last 4 bytes give another value)
        if google_crc32c.value(data) != CRC_RESIDUE:
            raise IntegrityError(f"{where()}: expected intact stored data. Got a chunk failing its crc32c (corrupted)")
        # read-only is fine: the reader copies what it keeps into the batch's arrays (a zstd frame is then
        # not copied once more)
        return memoryview(data)[:-CRC_BYTES]


def _field_plan(meta: ArrayMeta, f: FieldSpec, layout: dict[str, Any], where: str) -> _FieldPlan:
    """The field's storage plan from its array metadata, cross-checked with the manifest: the layout's
    shard and chunk lengths, a crc32c shard index, and inner chunk codecs that are exactly the manifest's
    lossless stage (`metadata.check_chunk_codecs`). Anything else is an IntegrityError."""
    if meta.shard[0] != layout["shard"] or meta.chunk[0] != layout["chunk"] or meta.shard[1:] != meta.chunk[1:]:
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected shards of {layout['shard']} and chunks of {layout['chunk']} samples "
            f"(manifest layout). Got shard shape {meta.shard} and chunk shape {meta.chunk}"
        )
    check_chunk_codecs(meta, f.lossless, f.name, where)
    per_shard = layout["shard"] // layout["chunk"]
    if not meta.sharded and per_shard != 1:
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected a sharded array ({per_shard} chunks a shard in the manifest layout). "
            "Got unsharded metadata"
        )
    return _FieldPlan(f, layout["path"], per_shard, meta.index_at_end, layout["chunk"], meta.little, meta.sharded)
