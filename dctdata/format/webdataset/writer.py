"""WebDataset writer of a pack (the tar layout is in `dctdata.format.webdataset.layout`, the
specification in docs/guides/field-kinds-and-webdataset.md).

webdataset's own `TarWriter` does the tar work; we pin what it lets vary (`layout.TAR_META`) and it
writes the members of a group in sorted name order. Members are grouped: each holds one standard array of
`samples_per_member` (K) consecutive samples of one stored field, a dct field's side values their own
member (`layout.group_name`).

Shard cap: every shard holds the same number of samples, a multiple of K (the last one fewer), as many
as fit `max_shard_size` even if the lossless stage saved nothing (the exact tar size including headers,
end-of-archive blocks and record padding is computed from each member's worst-case size), so the cap is
a real upper bound and the shard list is known before encoding: shards are independent parts that
Dask workers write in parallel and `--resume` redoes one by one. Typical shards are the cap divided by
the compression ratio. `samples_per_shard` lowers the count. A group larger than the cap gets a shard of
its own (a sample is never split) and a warning is logged. Without `samples_per_shard`, a set of at
least `layout.MIN_SHARDS` groups gets at least that many shards, so `make_loader` gives every rank and
worker whole shards of its own (docs/guides/loading.md).

K (`samples_per_member`, default: about `layout.GROUP_SOURCE_BYTES` of source per group, at most
n / MIN_SHARDS when the count n is known) is settled before the first part is written: a pack streamed
without a count keeps the K its fields give, so parts written before the count is known agree. Tar headers
and padding that still pass 25% of the stored bytes are reported with a warning that points to zarr.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError
from dctdata.format.base import Batch, Fields, PartWriter
from dctdata.format.checksum import HashingWriter, with_path
from dctdata.format.fields import FieldSpec
from dctdata.format.location import is_url, join, open_file
from dctdata.format.npy import encode_npy, npy_size
from dctdata.format.webdataset.layout import (
    BLOCK,
    GROUP_SOURCE_BYTES,
    MAX_GROUP,
    MIN_SHARDS,
    RECORD,
    SHARD_PATTERN,
    TAR_META,
    USTAR_NAME_MAX,
    archive_bytes,
    group_members,
    group_name,
    member_bytes,
    sample_key,
)
from dctdata.parse import parse_int, parse_optional_int
from dctdata.stages import Stage, get_stage

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_SIZE = 256 * 2**20
# A shard is also a unit of parallel work: at most this much *source* data per shard.
SHARD_SOURCE_BYTES = 128 << 20


OVERHEAD_WARN = 0.25  # tar headers and padding above this share of the stored bytes are reported


def group_size(
    fields: Fields, samples_per_member: int | None = None, samples_per_shard: int | None = None, n: int | None = None
) -> int:
    """K: samples per member, given, or about GROUP_SOURCE_BYTES of source per group (1..MAX_GROUP), at most
    n / MIN_SHARDS when the sample count n is known (so a small set still has MIN_SHARDS groups, one a
    shard), and then the largest that divides an explicit `samples_per_shard` (so its shards are as asked)."""
    if samples_per_member is not None:
        return samples_per_member
    per = max(1, sum(f.source_sample_bytes for f in fields))
    k = max(1, min(MAX_GROUP, -(-GROUP_SOURCE_BYTES // per)))
    if n is not None and samples_per_shard is None:
        k = max(1, min(k, n // MIN_SHARDS))
    if samples_per_shard is not None:
        k = max(d for d in range(1, min(k, samples_per_shard) + 1) if samples_per_shard % d == 0)
    return k


def _rows(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """A group's rows of one field from the slices of its batches: the one slice itself when it is the only
    one (a sample as big as a group, or a group within one batch), else their concatenation."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def group_bound(fields: Fields, k: int) -> int:
    """The most bytes the members of one group of k samples can take, tar headers and padding included."""
    total = 0
    for f, side in group_members(fields):
        raw = npy_size((k, *f.stored_shape), f.stored_dtype)
        total += member_bytes(raw if side else get_stage(f.lossless).max_encoded_size(raw))
    return total


def samples_per_shard_for(fields: Fields, max_shard_size: int, samples_per_shard: int | None = None, k: int = 1) -> int:
    """Fixed samples per shard, a multiple of the group size k: as many as fit the cap even if nothing
    compresses (so the cap is a real upper bound), at most `samples_per_shard` (rounded down to whole
    groups); at least one group."""
    per = group_bound(fields, k)
    groups = max(1, (max_shard_size - 2 * BLOCK) // per)
    while groups > 1 and archive_bytes(groups * per, padded=False) > max_shard_size:
        groups -= 1
    n = groups * k
    n = min(n, max(k, SHARD_SOURCE_BYTES // max(1, sum(f.source_sample_bytes for f in fields)) // k * k))
    return n if samples_per_shard is None else max(k, min(n, samples_per_shard // k * k))


class Unpadded:
    """The file tarfile writes to, passing on everything up to `limit` bytes (set before the tar is closed:
    its members and two zero end blocks) and dropping the zeros tarfile pads a record with after them."""

    def __init__(self, fh: HashingWriter) -> None:
        self.fh, self.at = fh, 0
        self.limit: int | None = None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        keep = n if self.limit is None else max(0, min(n, self.limit - self.at))
        if keep < n and any(memoryview(data)[keep:]):
            raise DctDataError(f"tar: expected only zero padding after byte {self.limit}. Got data")
        if keep:
            self.fh.write(data[:keep] if keep < n else data)
        self.at += n
        return n

    def tell(self) -> int:
        return self.at

    def flush(self) -> None:
        self.fh.flush()


class WebDatasetWriter(PartWriter):
    """Part writer (see `dctdata.format.base`) for webdataset tar shards. Options: max_shard_size
    (bytes), samples_per_shard, storage_options for URLs."""

    storage = "webdataset"
    options = ("max_shard_size", "samples_per_shard", "samples_per_member", "storage_options")

    def __init__(
        self,
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        samples_per_shard: int | None = None,
        storage_options: dict[str, Any] | None = None,
        samples_per_member: int | None = None,
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
        self.samples_per_member = parse_optional_int(
            samples_per_member,
            "samples_per_member",
            minimum=1,
            maximum=MAX_GROUP,
            expected=f"an int in 1..{MAX_GROUP} or None",
            type_error=DctDataError,
        )

    def group(self, fields: Fields, n: int | None = None) -> int:
        """K for a pack of n samples (None: not known yet). A pack streamed without a count keeps the K it
        started with (`_begin`), so every part agrees whatever count it is written under."""
        fixed: int | None = getattr(self, "_stream_group", None)
        if fixed is not None:
            return fixed
        return group_size(tuple(fields), self.samples_per_member, self.samples_per_shard, n)

    def _begin(self, root: str, fields: Fields, n: int | None) -> None:
        self._stream_group = None if n is not None else self.group(fields)
        super()._begin(root, fields, n)

    # Part API ------------------------------------------------------------------------------------
    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]:
        g = self.group(fields, n)
        k = samples_per_shard_for(tuple(fields), self.max_shard_size, self.samples_per_shard, g)
        if self.samples_per_shard is None:  # >= MIN_SHARDS shards when n >= MIN_SHARDS groups (layout.MIN_SHARDS)
            k = min(k, max(g, n // MIN_SHARDS // g * g))
        return [(a, min(a + k, n)) for a in range(0, n, k)]

    def part_samples(self, fields: Fields) -> int:
        return samples_per_shard_for(tuple(fields), self.max_shard_size, self.samples_per_shard, self.group(fields))

    def resize(self, root: str, fields: Fields, n: int) -> None:
        self.create(root, fields, n)  # tar needs no metadata: only the member-name check depends on n

    def create(self, root: str, fields: Fields, n: int) -> None:
        """Check the fields fit tar member names and the directory exists (tar needs no metadata file)."""
        fields = tuple(fields)
        if not fields or not all(isinstance(f, FieldSpec) for f in fields):
            raise TypeError(f"fields: expected a non-empty sequence of dctdata.format.FieldSpec. Got {fields!r}")
        if not is_url(root) and not os.path.isdir(root):
            raise DctDataError(f"{root}: expected an existing empty directory. Got none")
        for f, side in group_members(fields):
            longest = f"{sample_key(max(n - 1, 0))}.{group_name(f, side)}"
            if len(longest) > USTAR_NAME_MAX:
                raise DctDataError(
                    f"field {f.name!r}: expected a name short enough for a {USTAR_NAME_MAX}-character tar member. Got "
                    f"{longest!r}"
                )

    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict[str, Any]:
        """Write shard `index` (samples [start, stop), start a multiple of the group size) from stored
        batches; returns its entry."""
        from webdataset import TarWriter

        fields = tuple(fields)
        g = self.group(fields, n)
        codecs = {f.name: get_stage(f.lossless) for f in fields}
        members = group_members(fields)
        name = SHARD_PATTERN.format(index)
        path = join(root, name)
        members_total = payload = 0
        count = start
        pending: list[Batch] = []
        with _shard_file(path, self.storage_options) as hfile:
            fh = hfile.fh
            unpadded = Unpadded(hfile)
            tar = TarWriter(unpadded, encoder=False, **TAR_META)

            def flush(first: int, rows: int) -> None:
                nonlocal members_total, payload
                group = {f.name: _rows([b[f.name] for b in pending]) for f in fields}  # `pending` holds the rows
                data = {
                    group_name(f, side): self._encode(f, side, group[f.name], g, first, codecs) for f, side in members
                }
                size = sum(member_bytes(len(v)) for v in data.values())
                if archive_bytes(size, padded=False) > self.max_shard_size:
                    log.warning(
                        "samples %d..%d (%d bytes) exceed max_shard_size %d: written alone in %s",
                        first, first + rows - 1, size, self.max_shard_size, name,
                    )  # fmt: skip
                tar.write({"__key__": sample_key(first), **data})
                members_total += size
                payload += sum(len(v) for v in data.values())

            held = 0
            for batch in batches:
                b = len(next(iter(batch.values())))
                at = 0
                while at < b:
                    take = min(b - at, g - held)
                    pending.append({f.name: np.asarray(batch[f.name][at : at + take]) for f in fields})
                    held, at, count = held + take, at + take, count + take
                    if held == g:
                        flush(count - g, g)
                        pending, held = [], 0
            if held:
                flush(count - held, held)
            unpadded.limit = archive_bytes(members_total, padded=False)  # the end blocks, not the record padding
            tar.close()
            fh.flush()
            if not is_url(path):
                os.fsync(fh.fileno())
        if count != stop:
            raise DctDataError(f"{name}: expected samples {start}..{stop - 1}. Got {count - start} samples")
        expected = archive_bytes(members_total, padded=False)
        if hfile.bytes != expected:  # the cap relies on this prediction: never let it drift silently
            raise DctDataError(f"{name}: expected a {expected}-byte tar. Got {hfile.bytes} bytes (tar layout changed?)")
        log.debug("wrote %s: %d samples, %d bytes", name, stop - start, hfile.bytes)
        entry = {"name": name, "samples": stop - start, **hfile.entry()}
        return {"files": {name: hfile.entry()}, "shard": entry, "payload": payload}

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
        shards = [dict(p["shard"]) for p in parts]
        layout = {
            "shards": shards,
            "max_shard_size": self.max_shard_size,
            "samples_per_shard": self.samples_per_shard,
            "samples_per_member": self.group(fields, n),
        }
        checksums = {s["name"]: {"sha256": s["sha256"], "bytes": s["bytes"]} for s in shards}
        total = sum(s["bytes"] for s in shards)
        payload = sum(p.get("payload", 0) for p in parts)
        if total and payload and (total - payload) / total > OVERHEAD_WARN:
            log.warning(
                "webdataset: tar headers and padding are %.0f%% of the %d stored bytes (%.0f bytes per sample, %d "
                "sample(s) per member): samples this small store tighter with --format zarr, or with more "
                "samples per member (--samples-per-member)",
                100 * (total - payload) / total, total, (total - payload) / max(1, n), self.group(fields, n),
            )  # fmt: skip
        return {"layout": layout, "checksums": checksums}

    def _encode(
        self, f: FieldSpec, side: bool, arr: npt.NDArray[Any], k: int, first: int, codecs: dict[str, Stage]
    ) -> bytes:
        """One member: the (k, *stored_shape) array of a group's samples (padded with zero rows to k), as
        `.npy` bytes (a side partner's always plain), through the field's bytes stage, or an array stage's
        (`needs_shape`, the entropy coder) stream of it."""
        if arr.dtype.name != f.stored_dtype or tuple(arr.shape[1:]) != f.stored_shape:
            raise DctDataError(
                f"samples {first}..{first + len(arr) - 1} field {f.name!r}: expected stored {f.stored_dtype} "
                f"{f.stored_shape}. Got {arr.dtype.name} {tuple(arr.shape[1:])}"
            )
        if len(arr) < k:
            arr = np.concatenate([arr, np.zeros((k - len(arr), *f.stored_shape), arr.dtype)])
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        if side:
            return encode_npy(arr)
        stage = codecs[f.name]
        return stage.encode(arr) if stage.needs_shape else stage.encode(encode_npy(arr))


@contextlib.contextmanager
def _shard_file(path: str, storage_options: dict[str, Any]) -> Iterator[HashingWriter]:
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
