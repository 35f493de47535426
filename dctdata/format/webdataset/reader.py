"""Read access to webdataset shards of a pack: the storage reader (`dctdata.format.reader`) under the
iterable dataset, verify and inspect. Its units are the shards, read one after the other (no random
access).

A shard is read whole into memory (shards are capped at --max-shard-size), its byte count and sha256
are checked against the manifest while it is read, and its tar member names, keys and fields are
checked, all before its first sample is decoded: a corrupted or truncated shard never yields garbage
and never yields part of itself. Tar members that are not plain files, have absolute paths, `..` or
any directory part are rejected. Data that passes the hash but fails to decode (only possible with a
buggy writer) raises naming the shard and sample.

Files come from a local directory, an fsspec URL prefix (http(s)://, s3://, ...), or a shell `pipe:`
command the caller opted into (`{}` is replaced by the file name relative to the dataset).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tarfile
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dctdata.decoder.stored import check_stream
from dctdata.decoder.wire import StoredSample, StreamForm, stage_key
from dctdata.errors import FormatError, IntegrityError
from dctdata.format.cache import ShardCache
from dctdata.format.checksum import read_expected
from dctdata.format.fields import FieldSpec, has_side, side_field, user_fields
from dctdata.format.location import MANIFEST_NAME, is_url, join, open_file
from dctdata.format.manifest import Manifest, parse_manifest, read_manifest_bytes
from dctdata.format.npy import decode_npy, npy_header, npy_size, split_npy
from dctdata.format.reader import StorageReader, Unit, UnitReader
from dctdata.format.webdataset.layout import (
    MEMBER_RE,
    TAR_META,
    bounded,
    entry_name,
    group_members,
    group_name,
    sample_key,
    samples_of_file,
    samples_per_member,
    select_shards,
    shard_list,
    unpacked_side,
)
from dctdata.stages import Stage, get_stage


class Files:
    """Opens files of one dataset by relative name: local, fsspec URL, or an opted-in pipe: command;
    whole shard reads go through an optional local `ShardCache`."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None, cache: ShardCache | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        self.cache = cache

    def location(self, rel: str) -> str:
        if self.root.startswith("pipe:"):
            return self.root.replace("{}", rel)
        return join(self.root, rel)

    def open(self, rel: str) -> Any:  # a binary file object
        loc = self.location(rel)
        if self.root.startswith("pipe:"):
            import webdataset as wds

            return wds.gopen(loc, "rb")
        return open_file(loc, "rb", self.storage_options, streaming=True, root=None if is_url(loc) else self.root)

    def read(self, rel: str, expected_bytes: int, sha256: str) -> tuple[bytes, str]:
        """(bytes, sha256 hex) of a whole file whose size and hash the manifest gives: from the cache
        when it holds a good copy, else from the source (and then into the cache if it checks out)."""
        if self.cache is not None:
            data = self.cache.get(sha256, expected_bytes)
            if data is not None:
                return data, sha256
        with self.open(rel) as fh:
            data, digest = read_expected(fh, expected_bytes)
        if self.cache is not None and digest == sha256 and len(data) == expected_bytes:
            self.cache.put(sha256, data)
        return data, digest

    def manifest(self) -> Manifest:
        loc = self.location(MANIFEST_NAME)
        try:
            with self.open(MANIFEST_NAME) as fh:
                raw = read_manifest_bytes(fh, loc)
        except FileNotFoundError as exc:
            raise FormatError(f"{loc}: expected a dctdata manifest ({MANIFEST_NAME}). Got no such file") from exc
        except OSError as exc:
            raise FormatError(f"{loc}: expected a readable dctdata manifest. Got {type(exc).__name__}: {exc}") from exc
        return parse_manifest(raw, loc)


def codecs_for(fields: tuple[FieldSpec, ...]) -> dict[str, Stage]:
    """The lossless stage of each field (built once per process, see `dctdata.stages.get_stage`)."""
    return {f.name: get_stage(f.lossless) for f in fields}


class WebDatasetReader(StorageReader):
    """The shards of a webdataset pack (all, or those `shards` names), read whole and verified one at a
    time (`open_unit` -> `ShardReader`). `root` may be a shell `pipe:` command (see
    `dctdata.format.location.check_location`); `cache` keeps fetched shards in a local `ShardCache`."""

    storage = "webdataset"
    units_hash_files = True

    def __init__(
        self,
        root: str,
        manifest: Manifest,
        fields: tuple[FieldSpec, ...] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shards: tuple[str, ...] | None = None,
        cache: ShardCache | None = None,
    ) -> None:
        self.root, self.manifest = root, manifest
        self.fields = tuple(manifest.fields if fields is None else fields)
        self.storage_options = dict(storage_options or {})
        self.files = Files(root, storage_options, cache)
        where = self.files.location(MANIFEST_NAME)
        self.all_shards = shard_list(manifest, where)
        self.shards = select_shards(self.all_shards, shards, where)
        self.codecs = codecs_for(manifest.fields)
        self.group = samples_per_member(manifest.layout, where)  # None: per-sample members (versions <= 4)

    @classmethod
    def stream_manifest(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Manifest:
        """The manifest of a pack read as a shell `pipe:` stream (`check_location`: `{}` in the command names
        the file), for callers that take such a stream (`dctdata verify`) through the registry."""
        return Files(url, storage_options).manifest()

    def units(self) -> list[Unit]:
        names = tuple(f.name for f in user_fields(self.fields))
        return [
            Unit(self.files.location(e["name"]), e["start"], e["start"] + e["samples"], names, e) for e in self.shards
        ]

    def open_unit(self, unit: Unit) -> ShardReader:
        """The shard, read whole and verified; its samples hold every field of the pack (a shard's members
        are checked against all of them)."""
        if self.group is not None:
            return GroupShardReader(
                self.files, unit.key, self.manifest.fields, self.codecs, self.group, stamp=self.stamp
            )
        return ShardReader(self.files, unit.key, self.manifest.fields, self.codecs, stamp=self.stamp)

    def file_samples(self, rel: str) -> str:
        return samples_of_file(self.manifest, rel)


class ShardReader(UnitReader):
    """A shard read whole and verified (size, sha256, member names, keys, fields) before use."""

    def __init__(
        self,
        files: Files,
        entry: Mapping[str, Any],
        fields: tuple[FieldSpec, ...],
        codecs: dict[str, Stage] | None = None,
        stamp: Callable[[StreamForm, FieldSpec], StreamForm] | None = None,
    ) -> None:
        self.entry, self.fields = entry, fields
        # decode="device": a stream form with the pack's identity and codec (`StorageReader.stamp`)
        self._stamp = stamp if stamp is not None else (lambda form, f: form)
        self.codecs = codecs_for(fields) if codecs is None else codecs
        self.where = files.location(entry["name"])
        first, last = entry["start"], entry["start"] + entry["samples"] - 1
        self.span = f"samples {first}..{last}"
        self.first = first
        self._members, self._order = member_plan(fields, self.codecs)
        self._forms: dict[str, StreamForm] = {}  # decode="device": each dct field's stream form, once a shard
        self.data = self._read(files)
        self.samples = self._index()

    def __len__(self) -> int:
        return int(self.entry["samples"])

    def _read(self, files: Files) -> memoryview:
        expected = self.entry["bytes"]
        try:
            data, digest = files.read(self.entry["name"], expected, self.entry["sha256"])
        except FileNotFoundError as exc:
            raise IntegrityError(f"{self.where}: expected a shard ({self.span}). Got no such file") from exc
        except OSError as exc:
            raise IntegrityError(
                f"{self.where}: expected a readable shard ({self.span}). Got {type(exc).__name__}: {exc}"
            ) from exc
        n = len(data)
        if n != expected:
            what = "truncated" if n < expected else "too long"
            raise IntegrityError(
                f"{self.where}: expected {expected} bytes ({self.span}). Got {n}{'+' if n > expected else ''} bytes "
                f"({what})"
            )
        if digest != self.entry["sha256"]:
            raise IntegrityError(
                f"{self.where}: expected sha256 {self.entry['sha256']} ({self.span}). Got {digest} (corrupted)"
            )
        return memoryview(data)

    def _wanted(self) -> set[str]:
        """The member suffixes every key holds."""
        return {entry_name(f.name, f.lossless) for f in user_fields(self.fields)}

    def _keys(self) -> list[str]:
        """The member keys the shard holds, in order."""
        return [sample_key(self.entry["start"] + j) for j in range(self.entry["samples"])]

    def _index(self) -> list[dict[str, tuple[int, int]]]:
        """[{entry suffix: (offset, size)}] per key (sample, or group of samples), after checking every
        member header."""
        want = self._wanted()
        samples: list[dict[str, tuple[int, int]]] = []
        keys: list[str] = []
        try:
            for name, regular, kind, offset, size in self._members_of_tar():
                match = MEMBER_RE.match(name)  # a match is a plain file name: digits, a dot, a field entry
                if not match and (
                    name.startswith("/")
                    or os.path.isabs(name)
                    or ".." in re.split(r"[/\\]", name)
                    or "/" in name
                    or "\\" in name
                ):
                    raise IntegrityError(
                        f"{self.where}: tar member {name!r}: expected a plain file name. Got an absolute path, "
                        "'..' or a directory part"
                    )
                if not regular:
                    raise IntegrityError(
                        f"{self.where}: tar member {name!r}: expected a regular file. Got tar type {kind!r}"
                    )
                if not match or match.group(2) not in want:
                    raise IntegrityError(
                        f"{self.where}: tar member {name!r}: expected '<key>.<field entry>' with entries {sorted(want)}"
                    )
                key, suffix = match.groups()
                if not keys or keys[-1] != key:
                    keys.append(key)
                    samples.append({})
                if suffix in samples[-1]:
                    raise IntegrityError(f"{self.where}: sample key {key}: expected one {suffix!r}. Got a duplicate")
                samples[-1][suffix] = (offset, size)
        except tarfile.TarError as exc:
            raise IntegrityError(
                f"{self.where}: expected a readable tar ({self.span}). Got {type(exc).__name__}: {exc}"
            ) from exc
        expected = self._keys()
        if keys != expected:
            raise IntegrityError(
                f"{self.where}: expected sample keys {expected[:1]}..{expected[-1:]} in order ({self.span}). "
                f"Got {keys[:1]}..{keys[-1:]} ({len(keys)} keys)"
            )
        for key, s in zip(keys, samples):
            if set(s) != want:
                raise IntegrityError(
                    f"{self.where}: sample key {key}: expected entries {sorted(want)}. Got {sorted(s)}"
                )
        return samples

    def _members_of_tar(self) -> Iterator[tuple[str, bool, bytes, int, int]]:
        """(name, regular file?, tar type, data offset, size) of each member, in order: read by
        `writer_tar_members` when the shard is exactly as our writer makes it, else by tarfile (any
        other tar, and every damaged one, with tarfile's own errors)."""
        fast = writer_tar_members(self.data)
        if fast is not None:
            yield from fast
            return
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:") as tf:
            for m in tf:
                yield m.name, m.isreg(), m.type, m.offset_data, m.size

    def sample(self, j: int, stored: Collection[str] = ()) -> list[Any]:
        """Tensors of sample j of this shard, in field order (a side partner comes out of its dct
        field's member). A dct field named in `stored` is its member's checked stream (`StoredSample`),
        and its side partner the side values when they lie outside the stream (else None)."""
        members, values = self.samples[j], []
        for suffix, parts, codec in self._members:
            off, size = members[suffix]
            where = f"{self.where}: sample {self.entry['start'] + j} field {parts[0].name!r}"
            raw = self.data[off : off + size]
            if parts[0].name in stored:
                form = self._forms.get(parts[0].name)
                if form is None:
                    form = self._forms[parts[0].name] = self._stamp(stream_form(parts[0]), parts[0])
                values += member_stored(parts, codec, raw, where, form, self.entry["start"] + j)
                continue
            for g, arr in zip(parts, member_arrays(parts, codec, raw, where)):
                values.append(g.to_tensor(arr))
        return values if self._order is None else [values[k] for k in self._order]


class GroupShardReader(ShardReader):
    """A shard of grouped members (manifest version 5, `layout.samples_per_member` = K): member key g holds
    samples [start + g K, start + (g + 1) K) of every stored field, one standard array each; sample j is
    row j mod K of group j // K. A group's members are decoded once and kept while its samples are read."""

    def __init__(
        self,
        files: Files,
        entry: Mapping[str, Any],
        fields: tuple[FieldSpec, ...],
        codecs: dict[str, Stage],
        group: int,
        stamp: Callable[[StreamForm, FieldSpec], StreamForm] | None = None,
    ) -> None:
        self.group = group
        self._parts = group_members(fields)  # (stored field, a side partner?)
        self._decoded: dict[str, npt.NDArray[Any]] = {}
        self._streams: dict[str, bytes] = {}
        self._at = -1  # the group whose members `_decoded` and `_streams` hold
        super().__init__(files, entry, fields, codecs, stamp)

    def _wanted(self) -> set[str]:
        return {group_name(f, side) for f, side in self._parts}

    def _keys(self) -> list[str]:
        start, n = self.entry["start"], self.entry["samples"]
        return [sample_key(start + a) for a in range(0, n, self.group)]

    def _span(self, g: int) -> str:
        """The samples of group g, as messages name them."""
        a = self.entry["start"] + g * self.group
        return f"sample {a}" if self.group == 1 else f"samples {a}..{a + self.group - 1}"

    def _member(self, g: int, f: FieldSpec, side: bool) -> memoryview:
        off, size = self.samples[g][group_name(f, side)]
        return self.data[off : off + size]

    def _arrays(self, g: int, f: FieldSpec, side: bool) -> npt.NDArray[Any]:
        if f.name not in self._decoded:
            where = f"{self.where}: {self._span(g)} field {f.name!r}"
            codec = None if side else self.codecs[f.name]
            self._decoded[f.name] = group_member(f, codec, self._member(g, f, side), self.group, where)
        return self._decoded[f.name]

    def sample(self, j: int, stored: Collection[str] = ()) -> list[Any]:
        """Tensors of sample j of this shard, in field order. A dct field named in `stored` is its group
        member's checked stream (`StoredSample`, its row j mod K), its side partner the side values (read
        from their own member)."""
        g, r = divmod(j, self.group)
        if self._at != g:  # a new group: the last one's members are no longer needed
            self._decoded, self._streams, self._at = {}, {}, g
        values: list[Any] = []  # StoredSample or tensor, per part
        for f, side in self._parts:
            if f.name in stored:
                form = self._forms.get(f.name)
                if form is None:
                    form = self._forms[f.name] = self._stamp(group_form(f, self.group), f)
                if f.name not in self._streams:
                    raw = self._member(g, f, side)
                    where = f"{self.where}: {self._span(g)} field {f.name!r}"
                    check_stream(self.codecs[f.name], raw, form.decoded, where)
                    self._streams[f.name] = bytes(raw)  # shared by the group's samples, not a view of the shard
                index = self.entry["start"] + j
                values.append(StoredSample(self._streams[f.name], (self.entry["name"], g, f.name), r, form, index))
                continue
            values.append(f.to_tensor(np.array(self._arrays(g, f, side)[r])))
        return values


def group_member(f: FieldSpec, codec: Stage | None, raw: memoryview, k: int, where: str) -> npt.NDArray[Any]:
    """A grouped member's (k, *stored_shape) array, checked against its spec: plain `.npy` (`codec` None: a
    side partner), `.npy` through a bytes stage (bounded: the .npy of a known shape has a known length), or an
    array stage's (`needs_shape`, the entropy coder) stream."""
    if codec is not None and codec.needs_shape:
        return codec.decode(raw, (k, *f.stored_shape), f.stored_dtype, where)
    if codec is not None:
        raw = bounded(codec, raw, npy_size((k, *f.stored_shape), f.stored_dtype), where)
    arr = decode_npy(raw, where)
    if arr.dtype.name != f.stored_dtype or tuple(arr.shape) != (k, *f.stored_shape):
        raise IntegrityError(
            f"{where}: expected {f.stored_dtype} {(k, *f.stored_shape)}. Got {arr.dtype.name} {tuple(arr.shape)}"
        )
    return arr


def group_form(f: FieldSpec, k: int) -> StreamForm:
    """How a grouped dct member decodes when it crosses as stored bytes: the entropy coder's stream is the
    (k, ...) coefficients; a `.npy` member holds its header, then them. Side values travel beside."""
    stage = stage_key(f.lossless)
    if get_stage(f.lossless).needs_shape:
        return StreamForm(f.name, stage, f.stored_shape, f.stored_dtype, rows=k, decoded=k * f.stored_sample_bytes)
    head = npy_header((k, *f.stored_shape), f.stored_dtype)
    return StreamForm(
        f.name, stage, f.stored_shape, f.stored_dtype, rows=k, decoded=len(head) + k * f.stored_sample_bytes,
        at=len(head), expect=((0, head),),
    )  # fmt: skip


def stream_form(f: FieldSpec) -> StreamForm:
    """How a dct field's member decodes when it crosses as stored bytes (see `WebDatasetWriter._encode`):
    the entropy coder's stream (after the side values, which the worker reads) is the coefficients; a
    `.npy` member (through a bytes codec or not) holds the coefficients' .npy, then the side's."""
    key = (f.name, json.dumps(dict(f.lossless), sort_keys=True), f.stored_shape, f.stored_dtype, has_side(f))
    form = _FORMS.get(key)
    if form is not None:
        return form
    stage = stage_key(f.lossless)
    if get_stage(f.lossless).needs_shape:
        form = StreamForm(f.name, stage, f.stored_shape, f.stored_dtype, decoded=f.stored_sample_bytes)
    else:
        head = npy_header(f.stored_shape, f.stored_dtype)
        expect, side_at, decoded = [(0, head)], None, npy_size(f.stored_shape, f.stored_dtype)
        if has_side(f):
            g = side_field(f)
            expect.append((decoded, npy_header(g.stored_shape, g.stored_dtype)))
            side_at = decoded + len(expect[-1][1])
            decoded += npy_size(g.stored_shape, g.stored_dtype)
        form = StreamForm(
            f.name, stage, f.stored_shape, f.stored_dtype, decoded=decoded, at=len(head), side_at=side_at,
            expect=tuple(expect),
        )  # fmt: skip
    if len(_FORMS) >= 64:
        _FORMS.clear()
    _FORMS[key] = form
    return form


_FORMS: dict[tuple[Any, ...], StreamForm] = {}


def member_stored(
    parts: tuple[FieldSpec, ...], codec: Stage, raw: memoryview, where: str, form: StreamForm, index: int
) -> list[Any]:
    """A dct field's member as it crosses with decode="device": its `StoredSample` (the stream checked,
    not decoded), then its side partner's value: the side values the entropy coder's member starts with,
    or None when they are inside the stream."""
    side: torch.Tensor | None = None
    if codec.needs_shape:
        side_bytes = sum(math.prod(g.stored_shape) * np.dtype(g.stored_dtype).itemsize for g in parts[1:])
        if parts[1:] and parts[0].dct_codec.corrections is not None:
            head, rest = unpacked_side(raw, side_bytes, where)
            raw = memoryview(head + bytes(rest))
        if len(raw) < side_bytes:
            raise IntegrityError(f"{where}: expected at least {side_bytes} bytes of side information. Got {len(raw)}")
        if parts[1:]:
            little = np.dtype(parts[1].stored_dtype).newbyteorder("<")
            side = torch.from_numpy(np.frombuffer(raw[:side_bytes], little).reshape(parts[1].stored_shape).copy())
        raw = raw[side_bytes:]
    check_stream(codec, raw, form.decoded, where)
    # a copy: a sample waiting in a shuffle buffer must not keep its whole shard alive
    values: list[Any] = [StoredSample(bytes(raw), index, 0, form, index)]
    return [*values, side] if len(parts) > 1 else values


def member_plan(
    fields: tuple[FieldSpec, ...], codecs: dict[str, Stage]
) -> tuple[list[tuple[str, tuple[FieldSpec, ...], Stage]], list[int] | None]:
    """What decoding a sample needs, worked out once per shard instead of once per sample: per member
    (user field), its entry suffix, its stored parts (the field, then its side partner if any) and
    codec; and the positions that put the parts in `fields` order (None when they already are)."""
    members: list[tuple[str, tuple[FieldSpec, ...], Stage]] = []
    names: list[str] = []
    for f in user_fields(fields):
        parts = (f, side_field(f)) if has_side(f) else (f,)
        members.append((entry_name(f.name, f.lossless), parts, codecs[f.name]))
        names += [g.name for g in parts]
    order = [names.index(f.name) for f in fields]
    return members, None if order == list(range(len(order))) else order


# Tar headers as the writer makes them (layout.TAR_META: mode, uid/gid 0, mtime, uname/gname; USTAR
# magic, no device numbers, no name prefix): the bytes that never vary, by offset.
_FIXED_HEADER = (
    (100, f"{TAR_META['mode']:07o}\x000000000\x000000000\x00".encode()),  # mode, uid, gid
    (136, f"{TAR_META['mtime']:011o}\x00".encode()),
    (
        257,
        b"ustar\x0000"
        + TAR_META["user"].encode().ljust(32, b"\x00")
        + TAR_META["group"].encode().ljust(32, b"\x00")
        + bytes(16 + 155),
    ),  # magic, version, uname, gname, device numbers, prefix
)
_SIZE_FIELD = re.compile(rb"[0-7]{11}\x00")
_CHKSUM_FIELD = re.compile(rb"[0-7]{6}\x00 ")
_BLOCK = 512


def writer_tar_members(data: memoryview) -> list[tuple[str, bool, bytes, int, int]] | None:
    """The members of a tar whose every header is exactly as our writer makes it (regular files,
    ASCII names, the fixed fields above, a valid checksum, data inside the buffer) and that ends with a
    zero block; None for anything else, which the caller reads with tarfile.

    Why by hand: tarfile parses every field of every header in Python, a visible share of a small
    sample's decode (docs/benchmarks/design.md). For headers of
    this exact form tarfile gives the same names, offsets and sizes and stops at the same zero block,
    so only the speed differs; the checksums are checked for all headers at once with numpy."""
    n, at = len(data), 0
    heads: list[int] = []
    sums: list[int] = []
    out: list[tuple[str, bool, bytes, int, int]] = []
    while at + _BLOCK <= n:
        head = bytes(data[at : at + _BLOCK])
        if head[0] == 0 and head.count(0) == _BLOCK:  # the end: tarfile stops at the first zero block
            return out if out and _checksums_match(data, heads, sums) else None
        if head[156:157] != b"0" or any(head[o : o + len(b)] != b for o, b in _FIXED_HEADER):
            return None
        size_field, chk_field = head[124:136], head[148:156]
        if not _SIZE_FIELD.fullmatch(size_field) or not _CHKSUM_FIELD.fullmatch(chk_field):
            return None
        end = head.find(0, 0, 100)
        raw_name = head[: 100 if end < 0 else end]
        size = int(size_field[:11], 8)
        if not raw_name.isascii() or at + _BLOCK + size > n:
            return None
        heads.append(at)
        sums.append(int(chk_field[:6], 8))
        out.append((raw_name.decode("ascii"), True, b"0", at + _BLOCK, size))
        at += _BLOCK + -(-size // _BLOCK) * _BLOCK
    return None


def _checksums_match(data: memoryview, heads: list[int], sums: list[int]) -> bool:
    """Whether the headers at `heads` have the unsigned checksums `sums` (the checksum field summed as
    spaces, as tarfile checks it), 4096 headers (2 MiB) at a time."""
    flat = np.frombuffer(data, np.uint8)
    for a in range(0, len(heads), 4096):
        blocks = flat[np.asarray(heads[a : a + 4096])[:, None] + np.arange(_BLOCK)]
        got = blocks.sum(1, dtype=np.int64) - blocks[:, 148:156].sum(1, dtype=np.int64) + 8 * 32
        if not np.array_equal(got, np.asarray(sums[a : a + 4096])):
            return False
    return True


def member_arrays(
    parts: tuple[FieldSpec, ...] | list[FieldSpec], codec: Stage, raw: memoryview, where: str
) -> list[npt.NDArray[Any]]:
    """The stored arrays of one member (a field, then its side partner if any), checked against their
    specs (see `WebDatasetWriter._encode` for the two layouts)."""
    f = parts[0]
    if codec.needs_shape:
        sizes = [math.prod(g.stored_shape) * np.dtype(g.stored_dtype).itemsize for g in parts[1:]]
        side_bytes = sum(sizes)
        if parts[1:] and f.dct_codec.corrections is not None:
            head, rest = unpacked_side(raw, side_bytes, where)
            raw, side_bytes = memoryview(head + bytes(rest)), len(head)
        if len(raw) < side_bytes:
            raise IntegrityError(f"{where}: expected at least {side_bytes} bytes of side information. Got {len(raw)}")
        out = [codec.decode(raw[side_bytes:], (1, *f.stored_shape), f.stored_dtype, where)[0]]
        at = 0
        for g, n in zip(parts[1:], sizes):
            little = np.dtype(g.stored_dtype).newbyteorder("<")
            out.append(np.frombuffer(raw[at : at + n], little).reshape(g.stored_shape).astype(g.stored_dtype))
            at += n
        return out
    # bounded: the .npy bytes of known shapes have a known length; the headers say the rest
    raw = bounded(codec, raw, sum(npy_size(g.stored_shape, g.stored_dtype) for g in parts), where)
    out = []
    for k, g in enumerate(parts):
        if k == len(parts) - 1:
            arr, raw = decode_npy(raw, where), memoryview(b"")
        else:
            arr, raw = split_npy(raw, where)
        if arr.dtype.name != g.stored_dtype or tuple(arr.shape) != g.stored_shape:
            raise IntegrityError(
                f"{where}: expected {g.stored_dtype} {g.stored_shape}. Got {arr.dtype.name} {tuple(arr.shape)}"
            )
        out.append(arr)
    return out
