"""WebDataset writer: encoded samples -> deterministic `.tar` shards + the manifest's shard list.

Why deterministic: the same input must give byte-identical shards (reproducible packs, content
addressing, caches keyed by sha256). webdataset's own `TarWriter` does the tar work; we pin what it
lets vary (mtime 0, uid/gid 0, uname/gname "dctdata", mode 0o444, USTAR format) and it writes the
members of a sample in sorted name order. Samples go in index order, keys are `format.sample_key`.

Each field is one member `<key>.<field>.npy` (`np.save`, allow_pickle=False), or `<key>.<field>.npy.zst`
after the field's lossless stage (`dctdata.lossless`; the entry name follows `format.entry_name`).

Shard cap: a shard is closed *before* a sample would push it past `max_shard_size` (the exact tar size
including headers, end-of-archive blocks and record padding is computed up front, so the cap is a
real upper bound) or past `samples_per_shard`. A single sample larger than the cap gets a shard of its
own (a sample is never split) and a warning is logged.

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
from dctdata.format import FieldSpec, entry_name, sample_key
from dctdata.lossless import get_codec

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 256 * 2**20
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


class WebDatasetWriter:
    """Writer (see dctdata.preprocess.pack) for webdataset tar shards.

    `open(directory, fields, n)`, then `write(start, batch)` with consecutive starts (batch: field ->
    (B, *stored_shape) arrays in the stored dtype; torch tensors are converted with
    `FieldSpec.to_stored`), `close()` -> {"layout", "checksums"}, `abort()` after an error.
    """

    storage = "webdataset"

    def __init__(self, max_shard_size: int = DEFAULT_MAX_SHARD_SIZE, samples_per_shard: int | None = None) -> None:
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < _RECORD:
            raise DctDataError(f"max_shard_size: expected an int >= {_RECORD} bytes. Got {max_shard_size!r}")
        if samples_per_shard is not None and (
            isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or samples_per_shard < 1
        ):
            raise DctDataError(f"samples_per_shard: expected a positive int or None. Got {samples_per_shard!r}")
        self.max_shard_size = max_shard_size
        self.samples_per_shard = samples_per_shard
        self.directory: str | None = None
        self.fields: tuple[FieldSpec, ...] = ()
        self.shards: list[dict[str, Any]] = []
        self.count = 0
        self._tar = self._fh = self._hfile = None
        self._shard_samples = 0
        self._shard_members = 0

    # Lifecycle ----------------------------------------------------------------------------------
    def open(self, directory: str, fields: tuple[FieldSpec, ...], n_samples: int) -> None:
        fields = tuple(fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise TypeError(f"fields: expected a non-empty sequence of dctdata.format.FieldSpec. Got {fields!r}")
        if not os.path.isdir(directory):
            raise DctDataError(f"{directory}: expected an existing empty directory. Got none")
        for f in fields:
            longest = f"{sample_key(max(n_samples - 1, 0))}.{entry_name(f.name, bool(f.lossless))}"
            if len(longest) > _USTAR_NAME_MAX:
                raise DctDataError(
                    f"field {f.name!r}: expected a name short enough for a {_USTAR_NAME_MAX}-character tar member. Got {longest!r}"
                )
        self.directory, self.fields, self.n_samples = os.fspath(directory), fields, n_samples
        self._codecs = {f.name: get_codec(f.lossless) for f in fields}

    def abort(self) -> None:
        """Close open files after an error (the orchestrator removes the directory)."""
        if self._tar is not None:
            try:
                self._tar.close()
            finally:
                self._fh.close()
                self._tar = None

    # Writing -------------------------------------------------------------------------------------
    def _encode(self, f: FieldSpec, value: Any, index: int) -> bytes:
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
        codec = self._codecs[f.name]
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
        for i in range(sizes[names[0]]):
            self._write_one({f.name: batch[f.name][i] for f in self.fields})

    def _write_one(self, sample: Mapping[str, Any]) -> None:
        index = self.count
        members = {entry_name(f.name, bool(f.lossless)): self._encode(f, sample[f.name], index) for f in self.fields}
        size = sum(_member_bytes(len(v)) for v in members.values())
        full_count = self.samples_per_shard is not None and self._shard_samples >= self.samples_per_shard
        too_big = _archive_bytes(self._shard_members + size) > self.max_shard_size
        if self._tar is not None and (full_count or too_big):
            self._finish_shard()
        if self._tar is None:
            self._start_shard()
        if _archive_bytes(size) > self.max_shard_size:
            log.warning("sample %d (%d bytes) exceeds max_shard_size %d: written alone in %s", index, size, self.max_shard_size, self._name)
        self._tar.write({"__key__": sample_key(index), **members})
        self._shard_members += size
        self._shard_samples += 1
        self.count += 1

    def _start_shard(self) -> None:
        self._name = SHARD_PATTERN.format(len(self.shards))
        self._fh = open(os.path.join(self.directory, self._name), "wb")
        self._hfile = _HashingFile(self._fh)
        self._tar = TarWriter(self._hfile, encoder=False, **_TAR_META)
        self._shard_samples = 0
        self._shard_members = 0

    def _close_tar(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._tar = None

    def _finish_shard(self) -> None:
        self._close_tar()
        expected = _archive_bytes(self._shard_members)
        if self._hfile.bytes != expected:  # the cap relies on this prediction: never let it drift silently
            raise DctDataError(f"{self._name}: expected a {expected}-byte tar. Got {self._hfile.bytes} bytes (tar layout changed?)")
        self.shards.append(
            {"name": self._name, "samples": self._shard_samples, "bytes": self._hfile.bytes, "sha256": self._hfile.sha.hexdigest()}
        )
        log.debug("wrote %s: %d samples, %d bytes", self._name, self._shard_samples, self._hfile.bytes)

    def close(self) -> dict[str, Any]:
        """Finish the last shard; returns {"layout": ..., "checksums": ...} for the manifest."""
        if self._tar is not None:
            self._finish_shard()
        layout = {
            "shards": [dict(s) for s in self.shards],
            "max_shard_size": self.max_shard_size,
            "samples_per_shard": self.samples_per_shard,
        }
        checksums = {s["name"]: {"sha256": s["sha256"], "bytes": s["bytes"]} for s in self.shards}
        return {"layout": layout, "checksums": checksums}


def make_writer(**options: Any) -> WebDatasetWriter:
    """The pack orchestrator's entry point for --format webdataset (options: max_shard_size, samples_per_shard)."""
    return WebDatasetWriter(**options)
