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

Atomic: everything is written into a temporary sibling directory of OUT, the manifest last, and the
directory is renamed to OUT at the end; an existing OUT is refused unless overwrite=True.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import shutil
import tempfile
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from webdataset import TarWriter

from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, Manifest, entry_name, sample_key, write_manifest
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


def prepare_output(out: str | os.PathLike, overwrite: bool = False) -> tuple[str, str]:
    """(final path, fresh temporary sibling directory); refuses an existing OUT unless overwrite."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a directory path. Got {type(out).__name__}")
    out = os.path.abspath(os.fspath(out))
    if os.path.lexists(out) and not overwrite:
        raise DctDataError(f"{out}: expected a path that does not exist yet. Got an existing path (use overwrite=True / --overwrite to replace it)")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise DctDataError(f"{out}: expected an existing parent directory. Got missing {parent!r}")
    return out, tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)


def commit_output(tmp: str, out: str) -> None:
    """Rename the finished temporary directory to OUT (replacing an old OUT only at this point)."""
    old = None
    if os.path.lexists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rmdir(old)
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old) if os.path.isdir(old) and not os.path.islink(old) else os.remove(old)


class WebDatasetWriter:
    """Writes samples (dict field -> stored array) into capped, deterministic tar shards.

    Protocol: `open()`, `write(sample)` / `write_batch(batch)` in sample order, `close()` (finishes the
    shards and returns {"layout", "checksums"} for the manifest), `commit(manifest)` (manifest last,
    then the rename). `abort()` removes the temporary directory. Also a context manager (aborts on error).

    Samples hold each field as stored on disk (`FieldSpec.stored_shape` / `stored_dtype`); torch tensors
    are accepted and converted with `FieldSpec.to_stored` (bfloat16 -> uint16 bits).
    """

    storage = "webdataset"

    def __init__(
        self,
        out: str | os.PathLike,
        fields: Sequence[FieldSpec],
        *,
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        samples_per_shard: int | None = None,
        overwrite: bool = False,
    ) -> None:
        fields = tuple(fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise TypeError(f"fields: expected a non-empty sequence of dctdata.format.FieldSpec. Got {fields!r}")
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < _RECORD:
            raise DctDataError(f"max_shard_size: expected an int >= {_RECORD} bytes. Got {max_shard_size!r}")
        if samples_per_shard is not None and (
            isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or samples_per_shard < 1
        ):
            raise DctDataError(f"samples_per_shard: expected a positive int or None. Got {samples_per_shard!r}")
        for f in fields:
            longest = f"{sample_key(0)}.{entry_name(f.name, bool(f.lossless))}"
            if len(longest) > _USTAR_NAME_MAX:
                raise DctDataError(
                    f"field {f.name!r}: expected a name short enough for a {_USTAR_NAME_MAX}-character tar member. Got {longest!r}"
                )
        self.fields = fields
        self.out = out
        self.overwrite = bool(overwrite)
        self.max_shard_size = max_shard_size
        self.samples_per_shard = samples_per_shard
        self._codecs = {f.name: get_codec(f.lossless or None) for f in fields}
        self._tmp: str | None = None
        self._final: str | None = None
        self.shards: list[dict[str, Any]] = []
        self.count = 0
        self._tar = self._fh = self._hfile = None
        self._shard_samples = 0
        self._shard_members = 0
        self._closed = False

    # Lifecycle ----------------------------------------------------------------------------------
    def open(self) -> "WebDatasetWriter":
        self._final, self._tmp = prepare_output(self.out, self.overwrite)
        return self

    def __enter__(self) -> "WebDatasetWriter":
        return self.open() if self._tmp is None else self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    @property
    def tmp_dir(self) -> str:
        if self._tmp is None:
            raise DctDataError("writer: expected open() before writing. Got a writer that is not open")
        return self._tmp

    def abort(self) -> None:
        """Drop everything written so far (OUT is untouched)."""
        self._close_tar()
        if self._tmp is not None and os.path.isdir(self._tmp):
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    # Writing -------------------------------------------------------------------------------------
    def _encode(self, f: FieldSpec, value: Any, index: int) -> bytes:
        arr = f.to_stored(value) if isinstance(value, torch.Tensor) else np.asarray(value)
        if arr.dtype.name != f.stored_dtype or tuple(arr.shape) != f.stored_shape:
            raise DctDataError(
                f"sample {index} field {f.name!r}: expected stored {f.stored_dtype} {f.stored_shape}. "
                f"Got {arr.dtype.name} {tuple(arr.shape)}"
            )
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
        raw = buf.getvalue()
        codec = self._codecs[f.name]
        return raw if codec is None else bytes(codec.encode(raw))

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample (mapping field name -> stored array); its index is the running count."""
        if self._closed:
            raise DctDataError("writer: expected writes before close(). Got a write after close()")
        index = self.count
        if not isinstance(sample, Mapping):
            raise TypeError(f"sample {index}: expected a mapping field name -> array. Got {type(sample).__name__}")
        names = [f.name for f in self.fields]
        if set(sample) != set(names):
            raise DctDataError(f"sample {index}: expected fields {names}. Got {sorted(sample)}")
        key = sample_key(index)
        members = {entry_name(f.name, bool(f.lossless)): self._encode(f, sample[f.name], index) for f in self.fields}
        size = sum(_member_bytes(len(v)) for v in members.values())
        full_count = self.samples_per_shard is not None and self._shard_samples >= self.samples_per_shard
        too_big = _archive_bytes(self._shard_members + size) > self.max_shard_size
        if self._tar is not None and self._shard_samples and (full_count or too_big):
            self._finish_shard()
        if self._tar is None:
            self._start_shard()
        if _archive_bytes(size) > self.max_shard_size:
            log.warning("sample %d (%d bytes) exceeds max_shard_size %d: written alone in %s", index, size, self.max_shard_size, self._name)
        self._tar.write({"__key__": key, **members})
        self._shard_members += size
        self._shard_samples += 1
        self.count += 1

    def write_batch(self, batch: Mapping[str, Any]) -> None:
        """Append consecutive samples given as field -> (B, *stored_shape) arrays."""
        if not isinstance(batch, Mapping) or not batch:
            raise TypeError(f"batch: expected a mapping field name -> (B, ...) array. Got {type(batch).__name__}")
        sizes = {k: len(v) for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise DctDataError(f"batch: expected the same number of samples in every field. Got {sizes}")
        for i in range(next(iter(sizes.values()))):
            self.write({k: v[i] for k, v in batch.items()})

    def _start_shard(self) -> None:
        self._name = SHARD_PATTERN.format(len(self.shards))
        self._fh = open(os.path.join(self.tmp_dir, self._name), "wb")
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
        if not self._closed:
            self.tmp_dir  # noqa: B018 -- raises when never opened
            if self._tar is not None:
                self._finish_shard()
            self._closed = True
        return {"layout": self.layout(), "checksums": self.checksums()}

    def layout(self) -> dict[str, Any]:
        return {
            "shards": [dict(s) for s in self.shards],
            "max_shard_size": self.max_shard_size,
            "samples_per_shard": self.samples_per_shard,
        }

    def checksums(self) -> dict[str, dict[str, Any]]:
        return {s["name"]: {"sha256": s["sha256"], "bytes": s["bytes"]} for s in self.shards}

    def manifest(self, **kw: Any) -> Manifest:
        """The manifest for what was written (extra Manifest fields such as pack/stats via kw)."""
        return Manifest(
            storage="webdataset", samples=self.count, fields=self.fields, layout=self.layout(), checksums=self.checksums(), **kw
        )

    def commit(self, manifest: Manifest | None = None) -> str:
        """Write the manifest (last) into the temporary directory and rename it to OUT."""
        self.close()
        manifest = self.manifest() if manifest is None else manifest
        if manifest.storage != "webdataset" or manifest.samples != self.count:
            raise DctDataError(
                f"manifest: expected storage 'webdataset' with {self.count} samples. Got {manifest.storage!r} with {manifest.samples}"
            )
        write_manifest(manifest, self.tmp_dir)
        commit_output(self.tmp_dir, self._final)
        self._tmp = None
        return self._final


# The pack orchestrator looks a writer up by module; this is the one for --format webdataset.
Writer = WebDatasetWriter


def write_webdataset(
    out: str | os.PathLike,
    fields: Sequence[FieldSpec],
    samples: Iterable[Mapping[str, Any]],
    *,
    pack: Mapping[str, Any] | None = None,
    stats: Mapping[str, Any] | None = None,
    **writer_kw: Any,
) -> Manifest:
    """Write already-encoded samples to shards at OUT in one call; returns the manifest written."""
    writer = WebDatasetWriter(out, fields, **writer_kw)
    with writer:
        for sample in samples:
            writer.write(sample)
        writer.close()
        manifest = writer.manifest(pack=dict(pack or {}), stats=dict(stats or {}))
        writer.commit(manifest)
    return manifest
