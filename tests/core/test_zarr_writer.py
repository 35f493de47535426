"""dctdata.format.zarr: the layout's chunking rules, the writer's parts and checksums, and the reader
that gives back exactly what was written (both writers share the part interface)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, Manifest, Writer, make_writer
from dctdata.format.checksum import sha256_file
from dctdata.format.zarr import ZarrReader, ZarrWriter, chunking
from dctdata.format.zarr.layout import SHARD_BYTES

FIELDS = (
    FieldSpec("x", "array", (3, 5), "float32", lossless={"id": "zstd", "level": 3}),
    FieldSpec("y", "label", (), "int64"),
)


def data(n):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((n, 3, 5)).astype(np.float32), "y": np.arange(n, dtype=np.int64)}


def write(root, n, writer):
    writer.open(str(root), FIELDS, n)
    d = data(n)
    parts = [
        writer.write_part(str(root), FIELDS, n, i, a, b, [{k: v[a:b] for k, v in d.items()}])
        for i, (a, b) in enumerate(writer.plan(FIELDS, n))
    ]
    return d, writer.finish(str(root), FIELDS, n, parts)


def test_both_writers_implement_the_interface():
    assert isinstance(make_writer("zarr"), Writer) and isinstance(make_writer("webdataset"), Writer)
    with pytest.raises(DctDataError, match=r"--format: expected one of \('zarr', 'webdataset'\)\. Got 'tar'"):
        make_writer("tar")


def test_chunking_shares_a_power_of_two_shard_and_chunks_divide_it():
    big = (FieldSpec("big", "array", (1024, 1024), "float32", lossless=None), *FIELDS)
    shard, chunks = chunking(big, 10_000)
    assert shard & (shard - 1) == 0 and shard * 4 * 1024 * 1024 <= SHARD_BYTES
    assert all(shard % c == 0 and c & (c - 1) == 0 for c in chunks.values())
    assert chunking(FIELDS, 5)[0] == 8  # never more than the next power of two of the sample count
    with pytest.raises(DctDataError, match=r"shard: expected a multiple of chunk=4 samples. Got 6"):
        chunking(FIELDS, 100, chunk=4, shard=6)


def test_parts_checksums_and_read_back(tmp_path):
    d, result = write(tmp_path, 21, ZarrWriter(shard_samples=8, chunk_samples=4))
    assert set(result["checksums"]) == {  # no zarr.json (format 8): a reader rebuilds them from the manifest
        f"{k}/c.{i}{tail}" for k, tail in (("x", ".0.0"), ("y", "")) for i in range(3)
    }
    for rel, entry in result["checksums"].items():
        assert sha256_file(os.path.join(tmp_path, rel)) == (entry["sha256"], entry["bytes"])
    m = Manifest(storage="zarr", samples=21, fields=FIELDS, checksums=result["checksums"], layout=result["layout"])
    reader = ZarrReader(str(tmp_path), m)
    for f in FIELDS:
        np.testing.assert_array_equal(reader.read(f, 3, 19), d[f.name][3:19])


def test_a_redone_part_replaces_its_shard(tmp_path):
    w = ZarrWriter(shard_samples=8)
    d, first = write(tmp_path, 16, w)
    again = w.write_part(str(tmp_path), FIELDS, 16, 1, 8, 16, [{"x": np.zeros((8, 3, 5), np.float32), "y": d["y"][8:]}])
    assert again["files"]["x/c.1.0.0"] != first["checksums"]["x/c.1.0.0"]
    m = Manifest(storage="zarr", samples=16, fields=FIELDS, layout=first["layout"])
    assert not ZarrReader(str(tmp_path), m).read(FIELDS[0], 8, 16).any()


def test_streaming_use_writes_the_same_parts(tmp_path):
    _, parts = write(tmp_path / "a", 10, ZarrWriter(shard_samples=4))
    w = ZarrWriter(shard_samples=4)
    w.open(str(tmp_path / "b"), FIELDS, 10)
    d = data(10)
    for a in range(0, 10, 3):
        w.write(a, {k: v[a : a + 3] for k, v in d.items()})
    assert w.close()["checksums"] == parts["checksums"]


def test_bad_batches_are_named(tmp_path):
    w = ZarrWriter()
    w.open(str(tmp_path), FIELDS, 4)
    with pytest.raises(
        DctDataError, match=r"zarr writer: field 'x': expected \(B, \(3, 5\)\) float32\. Got \(4, 3, 5\) float64"
    ):
        w.write_part(str(tmp_path), FIELDS, 4, 0, 0, 4, [{"x": np.zeros((4, 3, 5)), "y": np.zeros(4, np.int64)}])
    with pytest.raises(DctDataError, match=r"chunk_samples: expected a positive int. Got 0"):
        ZarrWriter(chunk_samples=0)


def test_a_chunk_checks_against_the_crc32c_residue_exactly_when_its_crc_is_right():
    """The reader checks a whole stored chunk (body + its little-endian crc32c) against CRC_RESIDUE, so it
    does not copy the body to check it: right for every body, wrong for any other last 4 bytes."""
    import google_crc32c

    from dctdata.format.zarr.reader import CRC_RESIDUE

    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 4096):
        body = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        chunk = bytearray(body + google_crc32c.value(body).to_bytes(4, "little"))
        assert google_crc32c.value(bytes(chunk)) == CRC_RESIDUE
        for at in {0, len(chunk) // 2, len(chunk) - 4, len(chunk) - 1}:
            bad = bytearray(chunk)
            bad[at] ^= 1 << int(rng.integers(0, 8))
            assert google_crc32c.value(bytes(bad)) != CRC_RESIDUE
