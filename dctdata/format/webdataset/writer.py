"""WebDataset writer of a pack (the tar layout is in `dctdata.format.webdataset.layout`).

webdataset's own `TarWriter` does the tar work; we pin what it lets vary (`layout.TAR_META`) and it
writes the members of a sample in sorted name order. Each field is `.npy` bytes after the field's
lossless stage.

Shard cap: every shard holds the same number of samples (the last one fewer), as many as fit
`max_shard_size` even if the lossless stage saved nothing (the exact tar size including headers,
end-of-archive blocks and record padding is computed from each entry's worst-case size), so the cap is
a real upper bound and the shard list is known before encoding: shards are independent parts that
Dask workers write in parallel and `--resume` redoes one by one. Typical shards are the cap divided
by the compression ratio. `samples_per_shard` lowers the count. A sample larger than the cap gets a
shard of its own (a sample is never split) and a warning is logged. Without `samples_per_shard`, a
set of at least `layout.MIN_SHARDS` samples gets at least that many shards, so `make_loader` gives
every rank and worker whole shards of its own (docs/guides/loading.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format.base import Batch, Fields, PartWriter
from dctdata.format.checksum import HashingWriter, with_path
from dctdata.format.fields import FieldSpec, has_side, side_field, user_fields
from dctdata.format.location import is_url, join, open_file
from dctdata.format.npy import encode_npy
from dctdata.format.webdataset.layout import (
    BLOCK,
    MIN_SHARDS,
    RECORD,
    SHARD_PATTERN,
    TAR_META,
    USTAR_NAME_MAX,
    archive_bytes,
    entry_name,
    member_bytes,
    packed_side,
    sample_key,
)
from dctdata.parse import parse_int, parse_optional_int
from dctdata.stages import get_stage

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 256 * 2**20
# A shard is also a unit of parallel work: at most this much *source* data per shard.
SHARD_SOURCE_BYTES = 128 << 20


def samples_per_shard_for(fields: Fields, max_shard_size: int, samples_per_shard: int | None = None) -> int:
    """Fixed samples per shard: as many as fit the cap even if nothing compresses (so the cap is a
    real upper bound), at most `samples_per_shard`; at least 1."""
    per = 0
    for f in user_fields(fields):
        parts = [f, side_field(f)] if has_side(f) else [f]
        raw = sum(len(encode_npy(np.zeros(g.stored_shape, g.stored_dtype))) for g in parts)
        per += member_bytes(get_stage(f.lossless).max_encoded_size(raw))
    k = max(1, (max_shard_size - 2 * BLOCK) // per)
    while k > 1 and archive_bytes(k * per) > max_shard_size:
        k -= 1
    k = min(k, max(1, SHARD_SOURCE_BYTES // max(1, sum(f.source_sample_bytes for f in fields))))
    return k if samples_per_shard is None else min(k, samples_per_shard)


class WebDatasetWriter(PartWriter):
    """Part writer (see `dctdata.format.base`) for webdataset tar shards. Options: max_shard_size
    (bytes), samples_per_shard, storage_options for URLs."""

    storage = "webdataset"
    options = ("max_shard_size", "samples_per_shard", "storage_options")

    def __init__(
        self,
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        samples_per_shard: int | None = None,
        storage_options: dict | None = None,
    ) -> None:
        self.max_shard_size = parse_int(
            max_shard_size,
            "max_shard_size",
            minimum=RECORD,
            expected=f"an int >= {RECORD} bytes",
            type_error=DctDataError,
        )
        self.samples_per_shard = parse_optional_int(
            samples_per_shard,
            "samples_per_shard",
            minimum=1,
            expected="a positive int or None",
            type_error=DctDataError,
        )
        self.storage_options = dict(storage_options or {})

    # Part API ------------------------------------------------------------------------------------
    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]:
        k = samples_per_shard_for(tuple(fields), self.max_shard_size, self.samples_per_shard)
        if self.samples_per_shard is None:
            k = min(k, max(1, n // MIN_SHARDS))  # >= MIN_SHARDS shards when n >= MIN_SHARDS (layout.MIN_SHARDS)
        return [(a, min(a + k, n)) for a in range(0, n, k)]

    def part_samples(self, fields: Fields) -> int:
        return samples_per_shard_for(tuple(fields), self.max_shard_size, self.samples_per_shard)

    def resize(self, root: str, fields: Fields, n: int) -> None:
        self.create(root, fields, n)  # tar needs no metadata: only the member-name check depends on n

    def create(self, root: str, fields: Fields, n: int) -> None:
        """Check the fields fit tar member names and the directory exists (tar needs no metadata file)."""
        fields = tuple(fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise TypeError(f"fields: expected a non-empty sequence of dctdata.format.FieldSpec. Got {fields!r}")
        if not is_url(root) and not os.path.isdir(root):
            raise DctDataError(f"{root}: expected an existing empty directory. Got none")
        for f in user_fields(fields):
            longest = f"{sample_key(max(n - 1, 0))}.{entry_name(f.name, f.lossless)}"
            if len(longest) > USTAR_NAME_MAX:
                raise DctDataError(
                    f"field {f.name!r}: expected a name short enough for a {USTAR_NAME_MAX}-character tar member. Got "
                    f"{longest!r}"
                )

    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict:
        """Write shard `index` (samples [start, stop)) from stored batches; returns its entry."""
        from webdataset import TarWriter

        codecs = {f.name: get_stage(f.lossless) for f in fields}
        name = SHARD_PATTERN.format(index)
        path = join(root, name)
        members_total, count = 0, start
        with _shard_file(path, self.storage_options) as hfile:
            fh = hfile.fh
            tar = TarWriter(hfile, encoder=False, **TAR_META)
            for batch in batches:
                b = len(next(iter(batch.values())))
                for i in range(b):
                    members = {
                        entry_name(f.name, f.lossless): self._encode(f, batch, i, count, codecs)
                        for f in user_fields(fields)
                    }
                    size = sum(member_bytes(len(v)) for v in members.values())
                    if archive_bytes(size) > self.max_shard_size:
                        log.warning(
                            "sample %d (%d bytes) exceeds max_shard_size %d: written alone in %s",
                            count,
                            size,
                            self.max_shard_size,
                            name,
                        )
                    tar.write({"__key__": sample_key(count), **members})
                    members_total += size
                    count += 1
            tar.close()
            fh.flush()
            if not is_url(path):
                os.fsync(fh.fileno())
        if count != stop:
            raise DctDataError(f"{name}: expected samples {start}..{stop - 1}. Got {count - start} samples")
        expected = archive_bytes(members_total)
        if hfile.bytes != expected:  # the cap relies on this prediction: never let it drift silently
            raise DctDataError(f"{name}: expected a {expected}-byte tar. Got {hfile.bytes} bytes (tar layout changed?)")
        log.debug("wrote %s: %d samples, %d bytes", name, stop - start, hfile.bytes)
        entry = {"name": name, "samples": stop - start, **hfile.entry()}
        return {"files": {name: hfile.entry()}, "shard": entry}

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict]) -> dict[str, Any]:
        layout = {
            "shards": [dict(p["shard"]) for p in parts],
            "max_shard_size": self.max_shard_size,
            "samples_per_shard": self.samples_per_shard,
        }
        checksums = {s["name"]: {"sha256": s["sha256"], "bytes": s["bytes"]} for s in layout["shards"]}
        return {"layout": layout, "checksums": checksums}

    def _encode(self, f: FieldSpec, batch: Batch, i: int, index: int, codecs: dict) -> bytes:
        """One member. With a bytes stage: the field's .npy bytes through it (a dct field with side
        information: its coefficients' .npy then its side's, in one member, so tiny samples do not pay a
        tar header per part). With an array stage (`needs_shape`, the entropy coder): the side's raw
        float32 bytes (if any), then the coefficients' stream (`member_arrays` reads it back)."""
        parts = [f, side_field(f)] if has_side(f) else [f]
        arrays = []
        for g in parts:
            value = batch[g.name][i]
            arr = g.to_stored(value) if isinstance(value, torch.Tensor) else np.asarray(value)
            if arr.dtype.name != g.stored_dtype or tuple(arr.shape) != g.stored_shape:
                raise DctDataError(
                    f"sample {index} field {g.name!r}: expected stored {g.stored_dtype} {g.stored_shape}. Got "
                    f"{arr.dtype.name} {tuple(arr.shape)}"
                )
            arrays.append(arr)
        stage = codecs[f.name]
        if stage.needs_shape:
            side = b"".join(a.astype("<f4").tobytes() for a in arrays[1:])
            if side and f.codec.corrections is not None:
                side = packed_side(side)
            return side + stage.encode(np.ascontiguousarray(arrays[0][None]))
        return stage.encode(b"".join(encode_npy(a) for a in arrays))


@contextlib.contextmanager
def _shard_file(path: str, storage_options: dict) -> Iterator[HashingWriter]:
    """A shard being written, hashed as it goes. A failed write (a full disk) names the file, and nothing
    more reaches the file: tarfile's stream, collected later, would flush its buffer into the closed file
    and print a second traceback after the real error."""
    try:
        fh = open_file(path, "wb", storage_options)
    except OSError as exc:
        raise with_path(exc, path) from exc
    with fh:
        hfile = HashingWriter(fh)
        try:
            yield hfile
        except OSError as exc:
            hfile.abandon()
            raise with_path(exc, path) from exc
        except BaseException:
            hfile.abandon()
            raise
