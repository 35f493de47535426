"""The batched zarr read path: every batch is one set of byte-range reads that the reader decodes
itself. It must give exactly what zarr-python reads, fetch only the chunks a batch needs (counted on
a loopback HTTP server), and keep every integrity check over URLs as well as locally."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
import zarr
from pack_checks import reseal
from sample_fields import smooth_fields
from servers import LoopbackServer

import dctdata
from dctdata.errors import IntegrityError
from dctdata.format.ranges import RangeSource


def pack(tmp_path, name="ds", n=37, size=(20, 28), channels=2, **kw):
    x = smooth_fields(n, channels, *size, seed=1)
    rng = np.random.default_rng(1)
    src = tmp_path / f"{name}.npz"
    np.savez(src, image=x, mask=rng.integers(0, 5, (n, 3, 4)).astype(np.int16), label=np.arange(n) * 7)
    dctdata.pack(src, tmp_path / name, quiet=True, **kw)
    return tmp_path / name


@pytest.mark.parametrize(
    "settings",
    [
        {"quant": "int8", "target_psnr": 35},  # chunks sized by the writer (8 samples of this size)
        {"quant": "int8", "target_psnr": 35, "writer_options": {"chunk_samples": 1, "shard_samples": 16}},
        {"quant": "bf16", "cf": 5, "writer_options": {"chunk_samples": 4, "shard_samples": 8}},  # partial last chunk
        {"quant": "int16", "cf": 3, "mask": "triangle", "writer_options": {"chunk_samples": 2, "shard_samples": 16}},
    ],
)
def test_batched_reads_equal_zarr_python_bit_for_bit(tmp_path, settings):
    root = pack(tmp_path, lossless={"id": "zstd", "level": 9}, **settings)  # zarr-python knows zstd, not our coder
    ds = dctdata.open_dataset(root)
    arrays = json.loads((root / "manifest.json").read_text())["layout"]["arrays"]
    reference = {
        f.name: np.frombuffer(base64.b64decode(arrays[f.name]["inline"]), "<f4").reshape(len(ds), *f.stored_shape)
        if "inline" in arrays[f.name]  # a small side partner kept in the manifest (version 4)
        else zarr.open_array(root / f.name, mode="r")[:]
        for f in ds.fields
    }
    assert "inline" in arrays.get("image__side", {"inline": "no side partner"})  # 37 samples x 2 channels x 8 bytes
    rng = np.random.default_rng(0)
    by_name = dctdata.open_dataset(root, as_dict=True)
    for size in (1, 5, 32, len(ds)):
        shuffled = rng.choice(len(ds), size, replace=False).tolist()
        for idx in (shuffled, sorted(shuffled)):  # increasing batches of one-sample chunks take a shorter path
            got = ds.reader.read_samples(ds.fields, idx)
            for f in ds.fields:  # the side partner of a dct field included
                assert got[f.name].dtype == reference[f.name].dtype
                assert got[f.name].tobytes() == reference[f.name][idx].tobytes(), (f.name, idx)
            samples, dicts = ds.__getitems__(idx), by_name.__getitems__(idx)
            label = [f.name for f in ds.fields].index("label")
            assert [int(s[-1]) for s in samples] == got["label"].tolist() and label == len(ds.fields) - 1
            for k, (s, d) in enumerate(zip(samples, dicts)):  # a batch's samples, as one sample reads them
                image, mask, lab = s
                assert list(d) == ["image", "mask", "label"] and int(d["label"]) == int(lab) == 7 * idx[k]
                stored = list(image) if "image__side" in reference else [image]  # int quant: (coefficients, side)
                names = ["image", "image__side"][: len(stored)]
                for t, name in zip(stored, names):
                    bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
                    assert bits.numpy().tobytes() == reference[name][idx[k]].tobytes(), (name, idx[k])
                assert torch.equal(mask, torch.from_numpy(reference["mask"][idx[k]]))
                assert torch.equal(lab, d["label"]) and torch.equal(mask, d["mask"])
                one, dict_image = ds[idx[k]], d["image"] if len(stored) > 1 else [d["image"]]
                assert all(torch.equal(a, b) for a, b in zip(stored, dict_image)) and len(dict_image) == len(stored)
                assert all(torch.equal(a, b) for a, b in zip(stored, one[0] if len(stored) > 1 else [one[0]]))
    arrays = ds.reader.read_samples(ds.fields, [9, 3, 9, 36])  # any order, repeats allowed
    assert arrays["label"].tolist() == [63, 21, 63, 252]


def test_a_batch_fetches_only_its_chunks_over_http(tmp_path):
    root = pack(tmp_path, n=40, size=(64, 64), channels=1, cf=8, writer_options={"shard_samples": 16})
    ds_local = dctdata.open_dataset(root)
    assert ds_local.reader.layout["image"]["chunk"] == 1  # 16 KiB of float32 coefficients per sample
    with LoopbackServer(tmp_path) as srv:
        ds = dctdata.open_dataset(f"{srv.url}/ds", fields=["image"])
        ds.__getitems__([0, 16, 32])  # opens the metadata and reads the three shards' indexes
        srv.reset()
        batch = [3, 4, 5, 20, 7, 38]
        got = ds.__getitems__(batch)
        # consecutive samples of a shard are one request: 3..5, 7, 20, 38
        assert len(srv.requests) == 4 and all(r[0] == "GET" and r[2] for r in srv.requests)
        plan = ds_local.reader
        plan.ensure_open()
        index = plan._load_indexes([(ds.fields[0], s) for s in range(3)])
        want = sum(int(index[("image", i // 16)][i % 16][1]) for i in batch)
        assert srv.bytes_sent == want  # exactly the stored chunks, nothing around them
        assert all(torch.equal(a[0], b[0]) for a, b in zip(got, ds_local.__getitems__(batch)))


def test_http_bytes_per_sample_stay_near_the_stored_bytes(tmp_path):
    root = pack(tmp_path, n=64, size=(64, 64), channels=1, cf=8, writer_options={"shard_samples": 32})
    m = dctdata.open_dataset(root).manifest
    stored = sum(e["bytes"] for rel, e in m.checksums.items() if rel.startswith("image/c.")) / m.samples
    with LoopbackServer(tmp_path) as srv:
        ds = dctdata.open_dataset(f"{srv.url}/ds", fields=["image"])
        order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0)).tolist()
        seen = [len(ds.__getitems__(order[a : a + 8])) for a in range(0, len(order), 8)]
        moved = srv.bytes_sent / sum(seen)  # everything: metadata, shard indexes, chunks
    assert sum(seen) == 64 and moved <= 1.2 * stored, (moved, stored)


def test_remote_integrity_checks(tmp_path):
    root = pack(tmp_path, n=24, cf=4, writer_options={"chunk_samples": 2, "shard_samples": 8})
    shard = root / "image" / "c.1.0.0.0.0"
    data = shard.read_bytes()
    with LoopbackServer(tmp_path) as srv:
        url = f"{srv.url}/ds"
        assert dctdata.open_dataset(url)[9][0].shape == dctdata.open_dataset(root)[9][0].shape
        shard.write_bytes(data[: len(data) // 2])
        with pytest.raises(IntegrityError, match=r"ds/image/c\.1\.0\.0\.0\.0: field 'image' samples 8\.\.15: .*trunc"):
            dctdata.open_dataset(url)[9]
        shard.unlink()
        with pytest.raises(
            IntegrityError, match=r"image/c\.1\.0\.0\.0\.0: field 'image' samples 8\.\.15: expected a shard"
        ):
            dctdata.open_dataset(url)[9]
        shard.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
        skip = dctdata.open_dataset(url, on_error="skip")
        got = skip.__getitems__(list(range(24)))
        assert skip.skipped == 2 and [int(s[2]) // 7 for s in got] == [i for i in range(24) if i not in (8, 9)]


def test_chunk_codecs_must_match_the_manifest(tmp_path):
    import json

    root = pack(tmp_path, n=8, cf=4)  # the zstd-9 stage of a pack with a setting but no target
    m = json.loads((root / "manifest.json").read_text())
    m["fields"][0]["lossless"] = {"id": "zstd", "level": 3}
    (root / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(
        IntegrityError,
        match=r"image/zarr\.json: field 'image': expected chunk codecs \['bytes', 'zstd', 'crc32c'\] \(the manifest's "
        r"lossless stage \{'id': 'zstd', 'level': 3\}\)\. Got \[.*'level': 9",
    ):
        dctdata.open_dataset(root)[0]


def test_array_metadata_must_be_the_packed_bytes(tmp_path):
    root = pack(tmp_path, n=8, lossless={"id": "zstd", "level": 9})
    meta = root / "image" / "zarr.json"
    # still valid zarr, the same array, other bytes: version 8 lists no sha256, the bytes must be the implied ones
    meta.write_bytes(meta.read_bytes().replace(b'"zarr_format":3,', b'"zarr_format":3,"attributes":{},'))
    with pytest.raises(
        IntegrityError,
        match=r"image/zarr\.json: field 'image': expected the zarr v3 array metadata the manifest implies",
    ):
        dctdata.open_dataset(root)[0]
    meta.unlink()
    with pytest.raises(
        IntegrityError, match=r"image/zarr\.json: field 'image': expected zarr v3 array metadata\. Got none"
    ):
        dctdata.open_dataset(root)[0]


def test_range_source_merges_touching_ranges_and_keeps_order(tmp_path):
    (tmp_path / "a").write_bytes(bytes(range(100)))
    src = RangeSource(str(tmp_path))
    got = src.fetch([("a", 50, 60), ("a", 0, 10), ("a", 10, 20), ("a", 55, 58), ("b", 0, 1)])
    assert got[:4] == [bytes(range(50, 60)), bytes(range(10)), bytes(range(10, 20)), bytes(range(55, 58))]
    assert isinstance(got[4], FileNotFoundError)
    assert src.requests == 3 and src.bytes == 30  # 0..20 and 50..60 are one request each; b failed
    assert src.fetch([("a", 95, 105)]) == [bytes(range(95, 100))]  # a short read is the caller's to judge


def test_a_corrupted_one_sample_chunk_is_named_in_an_increasing_batch(tmp_path):
    one = {"chunk_samples": 1, "shard_samples": 16}  # one sample per chunk: an increasing batch's shorter path
    root = pack(tmp_path, quant="int8", target_psnr=35, writer_options=one)
    ds = dctdata.open_dataset(root)
    assert ds.reader.layout["image"]["chunk"] == 1
    shard = root / "image" / "c.0.0.0.0.0"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0xFF  # inside the first chunk (the index is at the shard's end): sample 0
    shard.write_bytes(bytes(raw))
    for reader in (dctdata.open_dataset(root).reader, ds.reader):  # a fresh reader, and one that read before
        with pytest.raises(
            IntegrityError,
            match=r"image/c\.0\.0\.0\.0\.0: field 'image' samples 0\.\.0 \(chunk 0\): expected intact stored data\. "
            r"Got a chunk failing its crc32c \(corrupted\)",
        ):
            reader.read_samples(ds.fields, [0, 3, 4])
    skip = dctdata.open_dataset(root, on_error="skip")
    assert [int(s[-1]) for s in skip.__getitems__([0, 3, 4])] == [21, 28] and skip.skipped == 1
