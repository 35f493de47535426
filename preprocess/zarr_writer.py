"""Zarr v3 writer: one group, one array per field, chunked along samples and sharded.

Layout (recorded in the manifest's `layout`): array `<field>` of shape (N, *stored_shape); inner
chunks of `chunk` samples (the unit a random read decompresses), grouped into shards of `shard`
samples (the unit that is one file), so a million-sample dataset is N / shard files per field.
Each inner chunk goes through the lossless codec then crc32c, so a corrupted chunk fails to read
instead of decoding to garbage; the shard index is crc32c-protected too. Empty chunks are written
(never elided into fill values), and shard keys use '.' separators (`<field>/c.<i>.0.0...`): flat.

Defaults: chunk ~128 KiB of stored data (>= 1 sample), shard ~32 MiB. Whole shards are buffered
and written at once, so zarr never read-modify-writes a partial shard. Checksums: sha256 of every
file (shards and zarr.json), keyed by path relative to the dataset root.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, zarr_shard_key
from dctdata.lossless import zarr_compressors

CHUNK_BYTES = 128 << 10
SHARD_BYTES = 32 << 20


def chunking(field: FieldSpec, n: int, chunk: int | None = None, shard: int | None = None) -> tuple[int, int]:
    """(samples per inner chunk, samples per shard); shard is a multiple of chunk."""
    per = max(1, field.stored_sample_bytes)
    c = chunk or max(1, min(n, CHUNK_BYTES // per))
    s = shard or max(1, SHARD_BYTES // (per * c)) * c
    s = min(s, math.ceil(max(n, 1) / c) * c)
    if s % c:
        raise DctDataError(f"shard: expected a multiple of chunk={c} samples. Got {s}")
    return c, s


def sha256_file(path: str, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


shard_key = zarr_shard_key


class ZarrWriter:
    """Writer (see dctdata.preprocess.pack) for the zarr v3 storage."""

    def __init__(self, chunk_samples: int | None = None, shard_samples: int | None = None) -> None:
        for name, v in (("chunk_samples", chunk_samples), ("shard_samples", shard_samples)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DctDataError(f"{name}: expected a positive int. Got {v!r}")
        self.chunk_samples = chunk_samples
        self.shard_samples = shard_samples

    def open(self, directory: str, fields: tuple[FieldSpec, ...], n_samples: int) -> None:
        import zarr
        import zarr.codecs as zc

        self.directory = directory
        self.fields = fields
        self.n = n_samples
        self.group = zarr.open_group(directory, mode="w", zarr_format=3)
        self.arrays: dict[str, Any] = {}
        self.layout: dict[str, Any] = {"arrays": {}}
        self.buffers: dict[str, list[np.ndarray]] = {}
        self.written: dict[str, int] = {}
        for f in fields:
            c, s = chunking(f, n_samples, self.chunk_samples, self.shard_samples)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "numcodecs codecs are not in the zarr v3 spec"
                self.arrays[f.name] = self.group.create_array(
                    f.name,
                    shape=(n_samples, *f.stored_shape),
                    chunks=(c, *f.stored_shape),
                    shards=(s, *f.stored_shape),
                    dtype=f.stored_dtype,
                    compressors=(*zarr_compressors(f.lossless), zc.Crc32cCodec()),
                    fill_value=0,
                    chunk_key_encoding={"name": "default", "separator": "."},
                    config={"write_empty_chunks": True},
                    attributes={"dctdata_field": f.kind},
                )
            self.layout["arrays"][f.name] = {"path": f.name, "chunk": c, "shard": s}
            self.buffers[f.name] = []
            self.written[f.name] = 0

    def write(self, start: int, batch: dict[str, np.ndarray]) -> None:
        for f in self.fields:
            x = batch[f.name]
            if tuple(x.shape[1:]) != f.stored_shape or x.dtype != np.dtype(f.stored_dtype):
                raise DctDataError(
                    f"zarr writer: field {f.name!r}: expected (B, {f.stored_shape}) {f.stored_dtype}. Got {x.shape} {x.dtype}"
                )
            self.buffers[f.name].append(x)
            self._flush(f, final=False)

    def _flush(self, f: FieldSpec, final: bool) -> None:
        shard = self.layout["arrays"][f.name]["shard"]
        buffered = sum(len(b) for b in self.buffers[f.name])
        if buffered < shard and not final:
            return
        data = np.concatenate(self.buffers[f.name]) if self.buffers[f.name] else None
        self.buffers[f.name] = []
        pos = 0
        while data is not None and (len(data) - pos >= shard or (final and pos < len(data))):
            part = data[pos : pos + shard]
            a = self.written[f.name]
            self.arrays[f.name][a : a + len(part)] = part
            self.written[f.name] += len(part)
            pos += len(part)
        if data is not None and pos < len(data):
            self.buffers[f.name] = [data[pos:]]

    def close(self) -> dict:
        for f in self.fields:
            self._flush(f, final=True)
            if self.written[f.name] != self.n:
                raise DctDataError(f"zarr writer: field {f.name!r}: expected {self.n} samples. Got {self.written[f.name]}")
        checksums = {}
        for root, dirs, files in os.walk(self.directory):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.directory).replace(os.sep, "/")
                checksums[rel] = {"sha256": sha256_file(path), "bytes": os.path.getsize(path)}
        return {"layout": self.layout, "checksums": checksums}

    def abort(self) -> None:
        self.buffers = {}


def make_writer(**options) -> ZarrWriter:
    return ZarrWriter(**options)
