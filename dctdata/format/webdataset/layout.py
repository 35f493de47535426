"""The webdataset (tar) layout of a pack, shared by its writer and reader (the specification, with
the decoder webdataset's own pipeline needs, is docs/guides/field-kinds-and-webdataset.md).

Deterministic `.tar` shards `shard-000000.tar`, ... Samples go in index order; sample keys are
`sample_key(index)` (zero-padded, so lexical order is sample order). Never pickle. Tar metadata is pinned
(mtime 0, uid/gid 0, uname/gname "dctdata", mode 0o444, USTAR), so the same input gives byte-identical
shards. Two member layouts:

- Grouped members (manifest version 5, `layout.samples_per_member` K): every member holds one standard
  array of K consecutive samples of one stored field, `<key>.<name>.<ext>` with `key` the group's first
  sample (`sample_key`): the suffix the field's lossless stage names (`entry_name`; `.npy` without one, `.npy.zst`
  for zstd, `.ctx` for the entropy coder's stream of the (K, ...) coefficients). A dct field's side values are
  their own member, `<key>.<name>__side.npy` ((K, C, 2) float32, float64 with codec precision; plain .npy).
  A pack's last group is padded with zero rows to K; the manifest's sample count says how many are real. K is
  chosen so a group holds about GROUP_SOURCE_BYTES of source (1 for samples of 256 KiB or more: one sample per
  member, the usual webdataset shape): a tar member costs a 512-byte header and pads its data to 512 bytes,
  which for 64 x 64 tiles had cost more than the coefficients themselves. A shard ends at its two zero blocks,
  without tarfile's padding to a 10 KiB record.
- Per-sample members (versions up to 4, still read): one member per user field and sample,
  `<key>.<field>.npy[.zst]` or `.ctx` (`entry_name`), a dct field's side values inside its member (after
  the coefficients' .npy, or as raw float32 before the entropy coder's stream).

Shards that fit the loader: whole shards are the unit a rank or DataLoader worker reads, so a pack
has at least `MIN_SHARDS` shards (16: 2 ranks x 8 workers, or 4 x 4, each get one) whenever it has that
many samples, however small it is; a larger set is cut by the size cap as before. An explicit
`--samples-per-shard` is taken as given.

Shard sizes are computed exactly from entry sizes (`member_bytes`, `archive_bytes`), so a size cap is
a real upper bound and the shard list is known before any data is encoded. The manifest's
`layout.shards` lists each shard with its sample count, bytes and sha256.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dctdata.errors import FormatError
from dctdata.format.fields import side_partner_names, user_fields
from dctdata.parse import is_int
from dctdata.stages import BytesStage, Stage, get_stage

if TYPE_CHECKING:
    from dctdata.format.fields import FieldSpec
    from dctdata.format.manifest import Manifest

SAMPLE_KEY_DIGITS = 9
SHARD_PATTERN = "shard-{:06d}.tar"
MIN_SHARDS = 16  # a pack of >= 16 samples gets >= 16 shards unless --samples-per-shard says otherwise
GROUP_SOURCE_BYTES = 256 << 10  # grouped members: about this much source per member ...
MAX_GROUP = 256  # ... and at most this many samples
BLOCK = 512  # tar block
RECORD = 20 * BLOCK  # tarfile.RECORDSIZE: archives are padded to a multiple of it
USTAR_NAME_MAX = 100
# A plain member name: key, field, the suffix of a stage (which the reader then checks against the manifest)
MEMBER_RE = re.compile(r"^(\d+)\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9]+)+)$")
# Pinned tar metadata (TarWriter keeps uid/gid at TarInfo's default 0). mtime must be an int: a float
# makes tarfile's default PAX format add an extended header per member. (TarWriter 1.0.2 ignores its
# `format` argument; with plain-ASCII names and ints PAX writes exactly the USTAR bytes.)
TAR_META: dict[str, Any] = dict(user="dctdata", group="dctdata", mode=0o444, mtime=0)


def sample_key(index: int) -> str:
    """`__key__` of sample `index` (zero-padded so lexical order is sample order)."""
    return f"{index:0{SAMPLE_KEY_DIGITS}d}"


def entry_name(field: str, lossless: Mapping[str, Any] | None = None) -> str:
    """Member entry holding a field: `<field>.<suffix>` with the suffix of its lossless stage (`.npy`
    without one)."""
    return f"{field}.{get_stage(lossless).member_suffix}"


def group_name(f: FieldSpec, side: bool = False) -> str:
    """Member suffix of a stored field in the grouped layout: a side partner is plain `.npy`; any other the
    suffix of its lossless stage (`entry_name`)."""
    return f"{f.name}.npy" if side else entry_name(f.name, f.lossless)


def group_members(fields: Sequence[FieldSpec]) -> list[tuple[FieldSpec, bool]]:
    """(stored field, is a side partner) for every member of a group, in field order: what the grouped
    layout's writer, reader and webdataset decoder each walk."""
    partners = side_partner_names(fields)
    return [(f, f.name in partners) for f in fields]


def samples_per_member(layout: Mapping[str, Any] | None, where: str) -> int | None:
    """K of a grouped-member pack (its `layout.samples_per_member`), None for per-sample members."""
    k = layout.get("samples_per_member") if isinstance(layout, Mapping) else None
    if k is None:
        return None
    if not is_int(k) or not 1 <= k <= MAX_GROUP:
        raise FormatError(f"{where}: layout.samples_per_member: expected an int in 1..{MAX_GROUP}. Got {k!r}")
    return int(k)


def member_bytes(size: int) -> int:
    """Bytes one tar member takes: a header block plus data padded to whole blocks."""
    return BLOCK + BLOCK * math.ceil(size / BLOCK)


def archive_bytes(members: int, padded: bool = True) -> int:
    """Total tar size for `members` bytes of members: two zero end blocks, padded to a 10 KiB record
    (tarfile's habit, kept by per-sample packs) or not (grouped packs: tar readers stop at the zero blocks,
    and on small shards the record padding had been most of the file)."""
    end = members + 2 * BLOCK
    return RECORD * math.ceil(end / RECORD) if padded else end


def shard_list(m: Manifest, where: str) -> list[dict[str, Any]]:
    """The manifest's validated shard entries with their first sample index added (`start`)."""
    shards = m.layout.get("shards") if isinstance(m.layout, Mapping) else None
    if not isinstance(shards, list):
        raise FormatError(
            f"{where}: layout.shards: expected a list of {{name, samples, bytes, sha256}}. Got {shards!r}"
        )
    out, start = [], 0
    group = samples_per_member(m.layout, where)
    members = len(user_fields(m.fields)) if group is None else len(m.fields)  # per sample, or per group
    for i, s in enumerate(shards):
        if not isinstance(s, Mapping) or "name" not in s:
            raise FormatError(f"{where}: layout.shards[{i}]: expected {{name, samples, bytes, sha256}}. Got {s!r}")
        name = s["name"]
        if (
            not isinstance(name, str)
            or "/" in name
            or "\\" in name
            or "\x00" in name
            or name in ("", ".", "..")
            or not name.endswith(".tar")
        ):
            raise FormatError(f"{where}: layout.shards[{i}].name: expected a plain '.tar' file name. Got {name!r}")
        if not {"samples", "bytes", "sha256"} <= set(s):
            raise FormatError(
                f"{where}: layout.shards[{i}]: expected {{name, samples, bytes, sha256}} (version 3 takes sha256 and "
                f"bytes from the checksums of {name!r}). Got {s!r}"
            )
        n = s["samples"]
        if not is_int(n) or n < 0 or not is_int(s["bytes"]):
            raise FormatError(f"{where}: layout.shards[{i}]: expected int samples and bytes. Got {s!r}")
        units = n if group is None else -(-n // group)  # samples, or groups of samples
        least = archive_bytes(units * members * 2 * BLOCK, padded=group is None)  # a header block and a data block
        if s["bytes"] < least:
            raise FormatError(
                f"{where}: layout.shards[{i}]: expected at least {least} bytes for {n} samples of {members} tar "
                f"members each{'' if group is None else f' per {group} samples'}. Got {s['bytes']} bytes"
            )
        out.append({"index": i, "name": name, "samples": n, "bytes": s["bytes"], "sha256": s["sha256"], "start": start})
        start += n
    if start != m.samples:
        raise FormatError(f"{where}: layout.shards: expected sample counts summing to {m.samples}. Got {start}")
    return out


def select_shards(shards: list[dict[str, Any]], names: tuple[str, ...] | None, where: str) -> list[dict[str, Any]]:
    """The entries of `shards` (from `shard_list`) that `names` lists, in manifest order; every listed
    name must be one of the pack's shards (a brace expression matching none is an error, not an empty
    epoch)."""
    if names is None:
        return shards
    known = {s["name"]: s for s in shards}
    missing = [n for n in names if n not in known]
    if missing:
        span = f"{shards[0]['name']}..{shards[-1]['name']}" if shards else "none"
        got = "none of them" if len(missing) == len(names) else f"{len(missing)} that are not: {missing[:3]}"
        raise FormatError(
            f"{where}: expected shard names of this pack ({len(shards)} shards, {span}). Got {len(names)} listed, {got}"
        )
    chosen = set(names)
    return [s for s in shards if s["name"] in chosen]


def samples_of_file(m: Manifest, rel: str) -> str:
    """' (samples a..b)' for a shard file name, '' when `rel` is not one (for messages)."""
    start = 0
    shards = m.layout.get("shards", []) if isinstance(m.layout, Mapping) else []
    for s in shards if isinstance(shards, list) else []:
        n = s.get("samples", 0) if isinstance(s, Mapping) else 0
        n = n if is_int(n) else 0
        if isinstance(s, Mapping) and s.get("name") == rel:
            return f" (samples {start}..{start + n - 1})"
        start += n
    return ""


# A dct field with corrections (`dctdata.decoder.corrections`) under the entropy coder: its side values lead the
# member as a zstd frame behind its u32 little-endian length (the correction rows are mostly zero padding,
# which raw float32 would store in full); without corrections they lead as raw float32.
def packed_side(side: bytes) -> bytes:
    """The member's leading side bytes of a field with corrections: u32 length, then the zstd frame."""
    from dctdata.stages import DEFAULT_CODEC

    frame = get_stage(DEFAULT_CODEC).encode(side)
    return len(frame).to_bytes(4, "little") + frame


def bounded(stage: Stage, raw: memoryview, limit: int, where: str) -> memoryview:
    """`BytesStage.decode_bounded` of a member's bytes: the stages of `.npy` members and of the side values are bytes
    stages (an array stage codes its own stream, never a .npy)."""
    if not isinstance(stage, BytesStage):
        raise TypeError(f"{where}: expected a bytes stage for a .npy member. Got {stage!r}")
    return stage.decode_bounded(raw, limit, where)


def unpacked_side(raw: bytes | bytearray | memoryview, size: int, where: str) -> tuple[bytes, memoryview]:
    """(the `size` side bytes, the rest of the member) of a member that starts with `packed_side`'s bytes;
    a length or frame that does not hold exactly `size` bytes is an IntegrityError naming `where`."""
    from dctdata.errors import IntegrityError
    from dctdata.stages import DEFAULT_CODEC

    raw = memoryview(raw).cast("B")
    if len(raw) < 4:
        raise IntegrityError(f"{where}: expected a 4-byte length of the side values. Got {len(raw)} bytes")
    n = int.from_bytes(raw[:4], "little")
    if n > len(raw) - 4:
        raise IntegrityError(f"{where}: expected {n} bytes of packed side values. Got {len(raw) - 4}")
    side = bytes(bounded(get_stage(DEFAULT_CODEC), raw[4 : 4 + n], size, where))
    if len(side) != size:
        raise IntegrityError(f"{where}: expected {size} bytes of side values. Got {len(side)}")
    return side, raw[4 + n :]
