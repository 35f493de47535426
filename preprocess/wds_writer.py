"""WebDataset writer: encoded samples -> deterministic `.tar` shards + the manifest's shard list.

Why deterministic: the same input must give byte-identical shards (reproducible packs, content
addressing, caches keyed by sha256). webdataset's own `TarWriter` does the tar work; we pin what it
lets vary (mtime 0, uid/gid 0, uname/gname "dctdata", mode 0o444, USTAR format) and it writes the
members of a sample in sorted name order. Samples go in index order, keys are `format.sample_key`.

Each field is one member `<key>.<field>.npy` (`np.save`, allow_pickle=False), or `<key>.<field>.npy.zst`
after the field's lossless stage (`dctdata.lossless`; the entry name follows `format.entry_name`).

Shard cap: every shard holds the same number of samples (the last one fewer), as many as fit
`max_shard_size` even if the lossless stage saved nothing (the exact tar size including headers,
end-of-archive blocks and record padding is computed from each entry's worst-case size), so the cap is
a real upper bound and the shard list is known before encoding: shards are independent parts that
Dask workers write in parallel and `--resume` redoes one by one. Typical shards are the cap divided
by the compression ratio. `samples_per_shard` lowers the count. A sample larger than the cap gets a
shard of its own (a sample is never split) and a warning is logged.

Atomic: this is a Writer for the pack orchestrator (`dctdata.preprocess.pack`, see its docstring for
the interface): the orchestrator hands it an empty temporary sibling of OUT, writes the manifest last
and renames; an existing OUT is refused there unless overwrite. Options (`make_writer`):
`max_shard_size` (bytes) and `samples_per_shard`.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
from typing import Any, Mapping

import numpy as np
import torch
from webdataset import TarWriter

from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, entry_name, is_url, join, sample_key
from dctdata.lossless import get_codec

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 256 * 2**20
# A shard is also a unit of parallel work: at most this much *source* data per shard.
SHARD_SOURCE_BYTES = 128 << 20
SHARD_PATTERN = "shard-{:06d}.tar"
_BLOCK = 512
_RECORD = 20 * _BLOCK  # tarfile.RECORDSIZE: archives are padded to a multiple of it
_USTAR_NAME_MAX = 100
# Pinned tar metadata (TarWriter keeps uid/gid at TarInfo's default 0). mtime must be an int: a float
# makes tarfile's default PAX format add an extended header per member. (TarWriter 1.0.2 ignores its
# `format` argument; with plain-ASCII names and ints PAX writes exactly the USTAR bytes.)
_TAR_META = dict(user="dctdata", group="dctdata", mode=0o444, mtime=0)


def _member_bytes(size: int) -> int:
    """Bytes one tar member takes: a header block plus data padded to whole blocks."""
    return _BLOCK + _BLOCK * math.ceil(size / _BLOCK)


def _archive_bytes(members: int) -> int:
    """Total tar size for `members` bytes of members: two zero end blocks, padded to a record."""
    return _RECORD * math.ceil((members + 2 * _BLOCK) / _RECORD)


class _HashingFile:
    """Write-only file wrapper that hashes and counts what passes through (one pass, no re-read)."""

    def __init__(self, fh) -> None:
        self.fh, self.sha, self.bytes = fh, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.bytes += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _bound(raw: int, codec: Any) -> int:
    """Largest size `raw` bytes can take after the lossless stage (zstd's ZSTD_COMPRESSBOUND; a
    generous generic bound for other codecs)."""
    if codec is None:
        return raw
    if getattr(codec, "codec_id", None) == "zstd":
        return raw + (raw >> 8) + ((128 * 1024 - raw) >> 11 if raw < 128 * 1024 else 0) + 64
    return raw + raw // 16 + 1024


def samples_per_shard_for(fields: tuple[FieldSpec, ...], max_shard_size: int, samples_per_shard: int | None = None) -> int:
    """Fixed samples per shard: as many as fit the cap even if nothing compresses (so the cap is a
    real upper bound), at most `samples_per_shard`; at least 1."""
    per = 0
    for f in fields:
        buf = io.BytesIO()
        np.save(buf, np.zeros(f.stored_shape, f.stored_dtype), allow_pickle=False)
        per += _member_bytes(_bound(len(buf.getvalue()), get_codec(f.lossless or None)))
    k = max(1, (max_shard_size - 2 * _BLOCK) // per)
    while k > 1 and _archive_bytes(k * per) > max_shard_size:
        k -= 1
    k = min(k, max(1, SHARD_SOURCE_BYTES // max(1, sum(f.source_sample_bytes for f in fields))))
    return k if samples_per_shard is None else min(k, samples_per_shard)


class WebDatasetWriter:
    """Writer (see dctdata.preprocess.pack) for webdataset tar shards.

    Shards hold a fixed number of samples (`samples_per_shard_for`; also <= 128 MiB of source data), so the shard list is known before
    any data is encoded: shard k is one independent *part* (the pack orchestrator writes parts in any
    order, on Dask workers, and resumes them). Part API: `plan`, `open`, `write_part`, `finish`.
    Streaming API (one process): `open(directory, fields, n)`, `write(start, batch)` with consecutive
    starts, `close()` -> {"layout", "checksums"}, `abort()` after an error.
    """

    storage = "webdataset"

    def __init__(self, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, samples_per_shard: int | None = None, storage_options: dict | None = None) -> None:
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < _RECORD:
            raise DctDataError(f"max_shard_size: expected an int >= {_RECORD} bytes. Got {max_shard_size!r}")
        if samples_per_shard is not None and (
            isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or samples_per_shard < 1
        ):
            raise DctDataError(f"samples_per_shard: expected a positive int or None. Got {samples_per_shard!r}")
        self.max_shard_size = max_shard_size
        self.samples_per_shard = samples_per_shard
        self.storage_options = dict(storage_options or {})
        self.directory: str | None = None
        self.fields: tuple[FieldSpec, ...] = ()
        self._parts: list[dict] = []
        self._pending: list[dict[str, Any]] = []
        self.count = 0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k in ("max_shard_size", "samples_per_shard", "storage_options")}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # Part API ------------------------------------------------------------------------------------
    def plan(self, fields: tuple[FieldSpec, ...], n: int) -> list[tuple[int, int]]:
        k = samples_per_shard_for(tuple(fields), self.max_shard_size, self.samples_per_shard)
        return [(a, min(a + k, n)) for a in range(0, n, k)]

    def open(self, directory: str, fields: tuple[FieldSpec, ...], n_samples: int) -> None:
        fields = tuple(fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise TypeError(f"fields: expected a non-empty sequence of dctdata.format.FieldSpec. Got {fields!r}")
        if not is_url(directory) and not os.path.isdir(directory):
            raise DctDataError(f"{directory}: expected an existing empty directory. Got none")
        for f in fields:
            longest = f"{sample_key(max(n_samples - 1, 0))}.{entry_name(f.name, bool(f.lossless))}"
            if len(longest) > _USTAR_NAME_MAX:
                raise DctDataError(
                    f"field {f.name!r}: expected a name short enough for a {_USTAR_NAME_MAX}-character tar member. Got {longest!r}"
                )
        self.directory, self.fields, self.n_samples = os.fspath(directory), fields, n_samples
        self._plan = self.plan(fields, n_samples)

    def write_part(self, root: str, fields: tuple[FieldSpec, ...], n: int, index: int, start: int, stop: int, batches) -> dict:
        """Write shard `index` (samples [start, stop)) from stored batches; returns its entry."""
        codecs = {f.name: get_codec(f.lossless or None) for f in fields}
        name = SHARD_PATTERN.format(index)
        path = join(root, name)
        if is_url(path):
            import fsspec

            opener = fsspec.open(path, "wb", **self.storage_options)
        else:
            opener = open(path, "wb")
        members_total, count = 0, start
        with opener as fh:
            hfile = _HashingFile(fh)
            tar = TarWriter(hfile, encoder=False, **_TAR_META)
            for batch in batches:
                b = len(next(iter(batch.values())))
                for i in range(b):
                    members = {entry_name(f.name, bool(f.lossless)): self._encode(f, batch[f.name][i], count, codecs) for f in fields}
                    size = sum(_member_bytes(len(v)) for v in members.values())
                    if _archive_bytes(size) > self.max_shard_size:
                        log.warning("sample %d (%d bytes) exceeds max_shard_size %d: written alone in %s", count, size, self.max_shard_size, name)
                    tar.write({"__key__": sample_key(count), **members})
                    members_total += size
                    count += 1
            tar.close()
            fh.flush()
            if not is_url(path):
                os.fsync(fh.fileno())
        if count != stop:
            raise DctDataError(f"{name}: expected samples {start}..{stop - 1}. Got {count - start} samples")
        expected = _archive_bytes(members_total)
        if hfile.bytes != expected:  # the cap relies on this prediction: never let it drift silently
            raise DctDataError(f"{name}: expected a {expected}-byte tar. Got {hfile.bytes} bytes (tar layout changed?)")
        log.debug("wrote %s: %d samples, %d bytes", name, stop - start, hfile.bytes)
        entry = {"name": name, "samples": stop - start, "bytes": hfile.bytes, "sha256": hfile.sha.hexdigest()}
        return {"files": {name: {"sha256": entry["sha256"], "bytes": entry["bytes"]}}, "shard": entry}

    def finish(self, root: str, fields: tuple[FieldSpec, ...], n: int, parts: list[dict]) -> dict[str, Any]:
        layout = {
            "shards": [dict(p["shard"]) for p in parts],
            "max_shard_size": self.max_shard_size,
            "samples_per_shard": self.samples_per_shard,
        }
        checksums = {s["name"]: {"sha256": s["sha256"], "bytes": s["bytes"]} for s in layout["shards"]}
        return {"layout": layout, "checksums": checksums}

    # Streaming API -------------------------------------------------------------------------------
    def abort(self) -> None:
        """Drop buffered samples after an error (the orchestrator removes the directory)."""
        self._pending = []

    def _encode(self, f: FieldSpec, value: Any, index: int, codecs: dict) -> bytes:
        arr = f.to_stored(value) if isinstance(value, torch.Tensor) else np.asarray(value)
        if arr.dtype.name != f.stored_dtype or tuple(arr.shape) != f.stored_shape:
            raise DctDataError(
                f"sample {index} field {f.name!r}: expected stored {f.stored_dtype} {f.stored_shape}. "
                f"Got {arr.dtype.name} {tuple(arr.shape)}"
            )
        buf = io.BytesIO()
        # Always C order, so the bytes depend on the values only (np.ascontiguousarray would make 0-d 1-d).
        np.save(buf, arr if arr.flags.c_contiguous else arr.copy(order="C"), allow_pickle=False)
        raw = buf.getvalue()
        codec = codecs[f.name]
        return raw if codec is None else bytes(codec.encode(raw))

    def write(self, start: int, batch: Mapping[str, Any]) -> None:
        """Append samples [start, start + B) given as field -> (B, *stored_shape) arrays."""
        if self.directory is None:
            raise DctDataError("writer: expected open() before write(). Got a writer that is not open")
        if start != self.count:
            raise DctDataError(f"write: expected consecutive samples starting at {self.count}. Got start={start}")
        names = [f.name for f in self.fields]
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch: expected a mapping field name -> (B, ...) array. Got {type(batch).__name__}")
        if set(batch) != set(names):
            raise DctDataError(f"samples {start}..: expected fields {names}. Got {sorted(batch)}")
        sizes = {k: len(v) for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise DctDataError(f"samples {start}..: expected the same number of samples in every field. Got {sizes}")
        b = sizes[names[0]]
        batch = {f.name: f.to_stored(batch[f.name]) if isinstance(batch[f.name], torch.Tensor) else np.asarray(batch[f.name]) for f in self.fields}
        for f in self.fields:
            arr = batch[f.name]
            if arr.dtype.name != f.stored_dtype or tuple(arr.shape[1:]) != f.stored_shape:
                raise DctDataError(
                    f"samples {start}..{start + b - 1} field {f.name!r}: expected stored {f.stored_dtype} {f.stored_shape}. "
                    f"Got {arr.dtype.name} {tuple(arr.shape[1:])}"
                )
        for i in range(b):
            self._pending.append({f.name: batch[f.name][i] for f in self.fields})
            self.count += 1
            index = len(self._parts)
            a, z = self._plan[index]
            if self.count == z:
                samples = self._pending
                self._pending = []
                stacked = {f.name: [s[f.name] for s in samples] for f in self.fields}
                self._parts.append(self.write_part(self.directory, self.fields, self.n_samples, index, a, z, [stacked]))

    def close(self) -> dict[str, Any]:
        """Check every sample arrived; returns {"layout": ..., "checksums": ...} for the manifest."""
        if self.count != self.n_samples:
            raise DctDataError(f"webdataset writer: expected {self.n_samples} samples. Got {self.count}")
        return self.finish(self.directory, self.fields, self.n_samples, self._parts)


def make_writer(**options: Any) -> WebDatasetWriter:
    """The pack orchestrator's entry point for --format webdataset (options: max_shard_size, samples_per_shard)."""
    return WebDatasetWriter(**options)
