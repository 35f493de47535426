"""Zarr v3 writer: one group, one array per field, chunked along samples and sharded.

Layout (recorded in the manifest's `layout`): array `<field>` of shape (N, *stored_shape); inner
chunks of `chunk` samples (the unit a random read decompresses), grouped into shards of `shard`
samples (the unit that is one file; <= 32 MiB stored and <= 128 MiB of source data), so a million-sample dataset is N / shard files per field.
Each inner chunk goes through the lossless codec then crc32c, so a corrupted chunk fails to read
instead of decoding to garbage; the shard index is crc32c-protected too. Empty chunks are written
(never elided into fill values), and shard keys use '.' separators (`<field>/c.<i>.0.0...`): flat.

Parts (why every field shares one shard size): the pack orchestrator writes a dataset as independent
*parts* (sample ranges), possibly in parallel on Dask workers, and a part must own whole files. So all
fields use the same number of samples per shard, a power of two (~32 MiB for the largest field), and
each field's chunk is a power of two dividing it: part k = samples [k*shard, (k+1)*shard) = shard file
k of every field. Whole shards are written at once, so zarr never read-modify-writes a shard, and
the bytes of a shard depend only on its samples: serial and parallel packs are byte-identical.
Checksums: sha256 of every file (shards and zarr.json), keyed by path relative to the dataset root.

Targets: a local directory or an fsspec URL (s3://, gs://, memory://, ...; `storage_options`).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from typing import Any, Iterable

import numpy as np

from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, is_url, join, zarr_shard_key

CHUNK_BYTES = 128 << 10
SHARD_BYTES = 32 << 20
# A shard is also a unit of parallel work: at most this much *source* data per shard, so a pack
# spreads over workers (and a task's memory stays small) even when compression is strong.
SHARD_SOURCE_BYTES = 128 << 20


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, int(x)).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << (max(1, int(x)) - 1).bit_length()


def chunking(fields: tuple[FieldSpec, ...], n: int, chunk: int | None = None, shard: int | None = None) -> tuple[int, dict[str, int]]:
    """(samples per shard shared by all fields, {field: samples per inner chunk}); chunks divide the shard."""
    biggest = max(max(1, f.stored_sample_bytes) for f in fields)
    source = sum(max(1, f.source_sample_bytes) for f in fields)
    if shard is None:
        shard = min(_pow2_floor(SHARD_BYTES // biggest), _pow2_floor(SHARD_SOURCE_BYTES // source), _pow2_ceil(n))
        if chunk is not None:
            shard = max(1, shard // chunk) * chunk
    chunks = {}
    for f in fields:
        c = chunk or math.gcd(_pow2_floor(CHUNK_BYTES // max(1, f.stored_sample_bytes)), shard)
        if shard % c:
            raise DctDataError(f"shard: expected a multiple of chunk={c} samples. Got {shard}")
        chunks[f.name] = c
    return shard, chunks


def sha256_file(path: str, block: int = 1 << 20, storage_options: dict | None = None) -> tuple[str, int]:
    """(sha256 hex, bytes) of a local file or fsspec URL."""
    h, n = hashlib.sha256(), 0
    if is_url(path):
        import fsspec

        opener = fsspec.open(path, "rb", **(storage_options or {}))
    else:
        opener = open(path, "rb")
    with opener as fh:
        while chunk := fh.read(block):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


shard_key = zarr_shard_key


class ZarrWriter:
    """Part-based writer (see dctdata.preprocess.pack) for the zarr v3 storage. Picklable: it holds
    only options, so the same object is shipped to Dask workers."""

    storage = "zarr"

    def __init__(self, chunk_samples: int | None = None, shard_samples: int | None = None, storage_options: dict | None = None) -> None:
        for name, v in (("chunk_samples", chunk_samples), ("shard_samples", shard_samples)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DctDataError(f"{name}: expected a positive int. Got {v!r}")
        self.chunk_samples = chunk_samples
        self.shard_samples = shard_samples
        self.storage_options = dict(storage_options or {})

    def _group(self, root: str, mode: str):
        import zarr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if is_url(root):
                return zarr.open_group(root, mode=mode, zarr_format=3, storage_options=self.storage_options or None)
            return zarr.open_group(root, mode=mode, zarr_format=3)

    # Client side ---------------------------------------------------------------------------------
    def plan(self, fields: tuple[FieldSpec, ...], n: int) -> list[tuple[int, int]]:
        """Part ranges: one shard of every field each."""
        shard, _ = chunking(fields, n, self.chunk_samples, self.shard_samples)
        return [(a, min(a + shard, n)) for a in range(0, n, shard)]

    def open(self, root: str, fields: tuple[FieldSpec, ...], n: int) -> None:
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
                    attributes={"dctdata_field": f.kind},
                    overwrite=True,
                )

    def finish(self, root: str, fields: tuple[FieldSpec, ...], n: int, parts: list[dict]) -> dict:
        """{"layout", "checksums"} from the finished parts plus the metadata files."""
        shard, chunks = chunking(fields, n, self.chunk_samples, self.shard_samples)
        checksums = {}
        for rel in ["zarr.json", *(f"{f.name}/zarr.json" for f in fields)]:
            sha, size = sha256_file(join(root, *rel.split("/")), storage_options=self.storage_options)
            checksums[rel] = {"sha256": sha, "bytes": size}
        for p in parts:
            checksums.update(p["files"])
        layout = {"arrays": {f.name: {"path": f.name, "chunk": chunks[f.name], "shard": shard} for f in fields}}
        return {"layout": layout, "checksums": dict(sorted(checksums.items()))}

    # Worker side ---------------------------------------------------------------------------------
    def write_part(self, root: str, fields: tuple[FieldSpec, ...], n: int, index: int, start: int, stop: int,
                   batches: Iterable[dict[str, np.ndarray]]) -> dict:  # fmt: skip
        """Write shard `index` of every field from the stored batches of samples [start, stop)."""
        import zarr

        buffers: dict[str, list[np.ndarray]] = {f.name: [] for f in fields}
        for batch in batches:
            for f in fields:
                x = batch[f.name]
                if tuple(x.shape[1:]) != f.stored_shape or x.dtype != np.dtype(f.stored_dtype):
                    raise DctDataError(
                        f"zarr writer: field {f.name!r}: expected (B, {f.stored_shape}) {f.stored_dtype}. Got {x.shape} {x.dtype}"
                    )
                buffers[f.name].append(x)
        files = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f in fields:
                data = np.concatenate(buffers.pop(f.name))
                if len(data) != stop - start:
                    raise DctDataError(f"zarr writer: field {f.name!r} part {index}: expected {stop - start} samples. Got {len(data)}")
                where = join(root, f.name)
                arr = zarr.open_array(where, mode="r+", storage_options=self.storage_options or None) if is_url(root) else zarr.open_array(where, mode="r+")
                arr = arr.with_config({"write_empty_chunks": True})  # runtime config is not stored: all-zero shards/chunks must still be written
                rel = shard_key(f.name, index, 1 + len(f.stored_shape))
                self._remove(join(root, *rel.split("/")))  # a redone part: zarr would merge into the old file
                arr[start:stop] = data
                del data
                sha, size = sha256_file(join(root, *rel.split("/")), storage_options=self.storage_options)
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


def make_writer(**options) -> ZarrWriter:
    return ZarrWriter(**options)
