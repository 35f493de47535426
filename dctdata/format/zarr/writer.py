"""Zarr v3 writer of a pack (the layout is in `dctdata.format.zarr.layout`).

Whole shards are written at once, so zarr never read-modify-writes a shard, and the bytes of a shard
depend only on its samples: serial and parallel packs are byte-identical. Empty chunks are written
(never elided into fill values). Checksums: sha256 of every file (shards and zarr.json), keyed by path
relative to the dataset root. Targets: a local directory or an fsspec URL (s3://, gs://, memory://,
...; `storage_options`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterable

import numpy as np

from dctdata.errors import DctDataError
from dctdata.format.base import Batch, Fields, PartWriter
from dctdata.format.checksum import sha256_file
from dctdata.format.location import is_url, join
from dctdata.format.zarr.layout import chunking, layout_entry, shard_key
from dctdata.parse import parse_optional_int


class ZarrWriter(PartWriter):
    """Part writer (see `dctdata.format.base`) for zarr v3 storage. Options: chunk_samples,
    shard_samples (defaults from `layout.chunking`), storage_options for URLs."""

    storage = "zarr"
    options = ("chunk_samples", "shard_samples", "storage_options")

    def __init__(
        self, chunk_samples: int | None = None, shard_samples: int | None = None, storage_options: dict | None = None
    ) -> None:
        self.chunk_samples = parse_optional_int(
            chunk_samples, "chunk_samples", minimum=1, expected="a positive int", type_error=DctDataError
        )
        self.shard_samples = parse_optional_int(
            shard_samples, "shard_samples", minimum=1, expected="a positive int", type_error=DctDataError
        )
        self.storage_options = dict(storage_options or {})

    def _group(self, root: str, mode: str):
        import zarr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if is_url(root):
                return zarr.open_group(root, mode=mode, zarr_format=3, storage_options=self.storage_options or None)
            return zarr.open_group(root, mode=mode, zarr_format=3)

    # Client side ---------------------------------------------------------------------------------
    def plan(self, fields: Fields, n: int) -> list[tuple[int, int]]:
        """Part ranges: one shard of every field each."""
        shard, _ = chunking(fields, n, self.chunk_samples, self.shard_samples)
        return [(a, min(a + shard, n)) for a in range(0, n, shard)]

    def part_samples(self, fields: Fields) -> int:
        return chunking(fields, 1 << 62, self.chunk_samples, self.shard_samples)[0]

    def create(self, root: str, fields: Fields, n: int) -> None:
        """Create the group and array metadata (zarr.json files); rerunning gives the same bytes."""
        import zarr.codecs as zc

        from dctdata.lossless import zarr_compressors

        shard, chunks = chunking(fields, n, self.chunk_samples, self.shard_samples)
        group = self._group(root, "w")
        for f in fields:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "numcodecs codecs are not in the zarr v3 spec"
                group.create_array(
                    f.name,
                    shape=(n, *f.stored_shape),
                    chunks=(chunks[f.name], *f.stored_shape),
                    shards=(shard, *f.stored_shape),
                    dtype=f.stored_dtype,
                    compressors=(*zarr_compressors(f.lossless), zc.Crc32cCodec()),
                    fill_value=0,
                    chunk_key_encoding={"name": "default", "separator": "."},
                    config={"write_empty_chunks": True},
                    attributes={"dctdata_field": f.kind.value},
                    overwrite=True,
                )

    def resize(self, root: str, fields: Fields, n: int) -> None:
        """Set every field array's sample count (metadata only; the shards already written stay)."""
        import zarr

        options = {"storage_options": self.storage_options or None} if is_url(root) else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f in fields:
                zarr.open_array(join(root, f.name), mode="r+", **options).resize((n, *f.stored_shape))

    def finish(self, root: str, fields: Fields, n: int, parts: list[dict]) -> dict[str, Any]:
        """{"layout", "checksums"} from the finished parts plus the metadata files."""
        checksums = {}
        for rel in ["zarr.json", *(f"{f.name}/zarr.json" for f in fields)]:
            sha, size = sha256_file(join(root, *rel.split("/")), self.storage_options)
            checksums[rel] = {"sha256": sha, "bytes": size}
        for p in parts:
            checksums.update(p["files"])
        return {
            "layout": layout_entry(fields, n, self.chunk_samples, self.shard_samples),
            "checksums": dict(sorted(checksums.items())),
        }

    # Worker side ---------------------------------------------------------------------------------
    def write_part(
        self, root: str, fields: Fields, n: int, index: int, start: int, stop: int, batches: Iterable[Batch]
    ) -> dict:
        """Write shard `index` of every field from the stored batches of samples [start, stop)."""
        import zarr

        # One preallocated buffer per field, filled batch by batch (not a list then a concatenated copy:
        # a shard's worth of memory once, not twice).
        buffers = {f.name: np.empty((stop - start, *f.stored_shape), f.stored_dtype) for f in fields}
        filled = 0
        for batch in batches:
            b = len(next(iter(batch.values())))
            for f in fields:
                x = batch[f.name]
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
        files = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f in fields:
                data = buffers.pop(f.name)
                if filled != stop - start:
                    raise DctDataError(
                        f"zarr writer: field {f.name!r} part {index}: expected {stop - start} samples. Got {filled}"
                    )
                where = join(root, f.name)
                options = {"storage_options": self.storage_options or None} if is_url(root) else {}
                arr = zarr.open_array(where, mode="r+", **options)
                arr = arr.with_config(
                    {"write_empty_chunks": True}
                )  # runtime config is not stored: all-zero chunks must still be written
                rel = shard_key(f.name, index, 1 + len(f.stored_shape))
                self._remove(join(root, *rel.split("/")))  # a redone part: zarr would merge into the old file
                arr[start:stop] = data
                del data
                sha, size = sha256_file(join(root, *rel.split("/")), self.storage_options)
                files[rel] = {"sha256": sha, "bytes": size}
        return {"files": files}

    def _remove(self, path: str) -> None:
        if is_url(path):
            import fsspec

            fs, p = fsspec.core.url_to_fs(path, **self.storage_options)
            if fs.exists(p):
                fs.rm(p)
        elif os.path.exists(path):
            os.remove(path)
