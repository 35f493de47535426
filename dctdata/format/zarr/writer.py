"""Zarr v3 writer of a pack (the layout is in `dctdata.format.zarr.layout`, the metadata in
`metadata.py`, the shard layout in `shards.py`).

dctdata writes the files itself (see metadata.py for why not zarr-python): whole shards at once, so the
bytes of a shard depend only on its samples and serial and parallel packs are byte-identical. Every
chunk that holds samples is written (never elided into fill values). Checksums: sha256 of every file
(shards and zarr.json), keyed by path relative to the dataset root. Targets: a local directory or an
fsspec URL (s3://, gs://, memory://, ...; `storage_options`).

Small side partners (`layout.INLINE_BYTES`): every part writes its side shard as usual and also returns
its values; `finish`, which knows the final count, moves a small enough partner into the manifest's
layout and removes its files. Deciding there keeps parallel, resumed and streamed packs (whose count
settles at the end) on one path.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError
from dctdata.format.base import Batch, Fields, PartWriter
from dctdata.format.checksum import with_path
from dctdata.format.fields import side_partner_names
from dctdata.format.location import is_url, join, open_file, remove_file
from dctdata.format.zarr.layout import INLINE_BYTES, chunking, inline_array, inline_entry, layout_entry, shard_key
from dctdata.format.zarr.metadata import array_json, group_json
from dctdata.format.zarr.shards import crc32c, shard_bytes
from dctdata.parse import parse_optional_int
from dctdata.stages import get_stage


class ZarrWriter(PartWriter):
    """Part writer (see `dctdata.format.base`) for zarr v3 storage. Options: chunk_samples,
    shard_samples (defaults from `layout.chunking`), storage_options for URLs."""

    storage = "zarr"
    options = ("chunk_samples", "shard_samples", "storage_options")

    def __init__(
        self,
        chunk_samples: int | None = None,
        shard_samples: int | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.chunk_samples = parse_optional_int(
            chunk_samples, "chunk_samples", minimum=1, expected="a positive int", type_error=DctDataError
        )
        self.shard_samples = parse_optional_int(
            shard_samples, "shard_samples", minimum=1, expected="a positive int", type_error=DctDataError
        )
        self.storage_options = dict(storage_options or {})

    def _put(self, path: str, data: bytes) -> dict[str, Any]:
        """Write one file (replacing a redone part's) and return its checksum entry."""
        try:
            with open_file(path, "wb", self.storage_options) as fh:
                fh.write(data)
                fh.flush()
                if not is_url(path):
                    os.fsync(fh.fileno())
        except OSError as exc:  # a full disk: say which file ("[Errno 28]" alone does not)
            raise with_path(exc, path) from exc
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    # Client side ---------------------------------------------------------------------------------
    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]:
        """Part ranges: one shard of every field each."""
        shard, _ = chunking(fields, n, self.chunk_samples, self.shard_samples)
        return [(a, min(a + shard, n)) for a in range(0, n, shard)]

    def _metadata(self, fields: Fields, n: int) -> dict[str, bytes]:
        shard, chunks = chunking(fields, n, self.chunk_samples, self.shard_samples)
        out = {"zarr.json": group_json()}
        for f in fields:
            out[f"{f.name}/zarr.json"] = array_json(
                (n, *f.stored_shape),
                f.stored_dtype,
                (shard, *f.stored_shape),
                (chunks[f.name], *f.stored_shape),
                f.lossless,
            )
        return out

    def part_samples(self, fields: Fields) -> int:
        return chunking(fields, 1 << 62, self.chunk_samples, self.shard_samples)[0]

    def create(self, root: str, fields: Fields, n: int) -> None:
        """Write the group and array metadata (zarr.json files); rerunning gives the same bytes."""
        for rel, data in self._metadata(fields, n).items():
            if not is_url(root):
                os.makedirs(os.path.dirname(os.path.join(root, *rel.split("/"))), exist_ok=True)
            self._put(join(root, *rel.split("/")), data)

    def resize(self, root: str, fields: Fields, n: int) -> None:
        """Rewrite the metadata for `n` samples (the shards already written stay)."""
        self.create(root, fields, n)

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """{"layout", "checksums"} from the finished parts; small side partners go into the layout and their
        files away. The metadata files are not listed (format 8): a reader rebuilds them from the manifest
        and requires those bytes (`dctdata.format.zarr.reader`)."""
        checksums: dict[str, Any] = {}
        for p in parts:
            checksums.update(p["files"])
        layout = layout_entry(fields, n, self.chunk_samples, self.shard_samples)
        for name, values in _inline_values(fields, n, parts).items():
            layout["arrays"][name] = inline_entry(values)
            for rel in [r for r in checksums if r.startswith(name + "/")] + [f"{name}/zarr.json"]:
                remove_file(join(root, *rel.split("/")), self.storage_options)
                checksums.pop(rel, None)
            if not is_url(root):
                try:
                    os.rmdir(os.path.join(root, name))
                except OSError:
                    pass  # not empty (a file that is not ours) or gone: left as it is
        return {"layout": layout, "checksums": dict(sorted(checksums.items()))}

    # Worker side ---------------------------------------------------------------------------------
    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict[str, Any]:
        """Write shard `index` of every field from the stored batches of samples [start, stop)."""
        shard, chunks = chunking(fields, n, self.chunk_samples, self.shard_samples)
        # One preallocated buffer per field, filled batch by batch (not a list then a concatenated copy:
        # a shard's worth of memory once, not twice).
        buffers = {f.name: np.empty((stop - start, *f.stored_shape), f.stored_dtype) for f in fields}
        filled = 0
        for batch in batches:
            b = len(next(iter(batch.values())))
            for f in fields:
                x = np.asarray(batch[f.name])
                if tuple(x.shape[1:]) != f.stored_shape or x.dtype != np.dtype(f.stored_dtype):
                    raise DctDataError(
                        f"zarr writer: field {f.name!r}: expected (B, {f.stored_shape}) {f.stored_dtype}. Got "
                        f"{x.shape} {x.dtype}"
                    )
                if filled + b > stop - start or len(x) != b:
                    raise DctDataError(
                        f"zarr writer: field {f.name!r} part {index}: expected {stop - start} samples. Got more"
                    )
                buffers[f.name][filled : filled + b] = x
            filled += b
        files, inline, partners = {}, {}, side_partner_names(fields)
        for f in fields:
            data = buffers.pop(f.name)
            if filled != stop - start:
                raise DctDataError(
                    f"zarr writer: field {f.name!r} part {index}: expected {stop - start} samples. Got {filled}"
                )
            stage = get_stage(f.lossless)
            c = chunks[f.name]
            coded = []
            for a in range(0, len(data), c):
                block = data[a : a + c]
                if len(block) < c:  # the array's last chunk is stored whole, its tail at the fill value
                    block = np.concatenate([block, np.zeros((c - len(block), *f.stored_shape), block.dtype)])
                coded.append(stage.encode(block.astype(block.dtype.newbyteorder("<"), copy=False)))
            rel = shard_key(f.name, index, 1 + len(f.stored_shape))
            body = shard_bytes(coded, shard // c) if shard > c else coded[0] + crc32c(coded[0])  # one chunk: no index
            files[rel] = self._put(join(root, *rel.split("/")), body)
            if f.name in partners and data.nbytes <= INLINE_BYTES:
                inline[f.name] = inline_entry(data)["inline"]
        return {"files": files, "inline": inline}


def _inline_values(fields: Fields, n: int, parts: list[dict[str, Any]]) -> dict[str, npt.NDArray[Any]]:
    """{side partner: its (n, ...) values} for the partners of at most INLINE_BYTES that every part returned
    (a part journaled by an older dctdata returns none: its partner stays an array)."""
    out, partners = {}, side_partner_names(fields)
    for f in fields:
        if f.name not in partners or n * f.stored_sample_bytes > INLINE_BYTES:
            continue
        pieces = [(p.get("inline") or {}).get(f.name) for p in parts]
        texts = [x for x in pieces if isinstance(x, str)]
        if len(texts) != len(pieces):
            continue
        raw = b"".join(base64.b64decode(x) for x in texts)
        if len(raw) == n * f.stored_sample_bytes:
            out[f.name] = inline_array(raw, f, n)
    return out
