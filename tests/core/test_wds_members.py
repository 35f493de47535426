"""Webdataset members (issue 31): one standard array per member, read by webdataset's own pipeline with
`WdsDecoder`; version-4 packs (per-sample members, side values inside the dct member) still read bit for
bit (tests/data/golden_wds_v4: written by the version-4 writer, never regenerated; `*-expected.npz` holds
their stored coefficients, side values and labels)."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds

import dctdata
from dctdata.api import open_dataset
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import read_manifest
from dctdata.format.manifest import FORMAT_VERSION
from dctdata.format.webdataset import WebDatasetReader
from dctdata.loaders import WdsDecoder

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "golden_wds_v4")
N = 21


def smooth(n, c=1, h=32, w=40, seed=0):
    rng = np.random.default_rng(seed)
    return np.cumsum(np.cumsum(rng.normal(size=(n, c, h, w)), 2), 3).astype(np.float32)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """21 samples, 4 a member: shards of whole groups and a last group of one real sample."""
    out = tmp_path_factory.mktemp("wds") / "p"
    src = {"image": smooth(N), "label": np.arange(N, dtype=np.int64), "counts": np.arange(N * 6).reshape(N, 6)}
    dctdata.pack(src, out, format="webdataset", target_psnr=35, quiet=True, writer_options={"samples_per_member": 4})
    return out


def pipeline(dec, **kw):
    return wds.WebDataset(dec.urls, shardshuffle=False, **kw).decode(dec.handler).compose(dec.samples)


@pytest.mark.parametrize("stage", ["ctx", "zstd"])
def test_golden_v4_pack_reads_bit_for_bit(stage):
    root = os.path.join(GOLDEN, stage)
    m = read_manifest(root)
    assert m.version == 4 and "samples_per_member" not in m.layout
    reader = WebDatasetReader(root, m)
    rows = []
    for unit in reader.units():
        opened = reader.open_unit(unit)
        rows += [opened.sample(j) for j in range(len(opened))]
    expected = np.load(os.path.join(GOLDEN, f"{stage}-expected.npz"))
    for k, name in enumerate(("q", "side", "label")):
        got = np.stack([r[k].numpy() for r in rows])
        assert got.dtype == expected[name].dtype and np.array_equal(got, expected[name]), name
    with pytest.raises(DctDataError, match=r"expected a pack with one array per member .* Got version 4"):
        WdsDecoder(root)


def test_members_are_standard_arrays_tarfile_and_numpy_open(pack):
    m = read_manifest(pack)
    assert m.version == FORMAT_VERSION and m.layout["samples_per_member"] == 4
    with tarfile.open(pack / "shard-000000.tar") as tf:
        names = tf.getnames()
        side = np.load(io.BytesIO(tf.extractfile("000000000.image__side.npy").read()), allow_pickle=False)
    assert names[:4] == [
        "000000000.counts.npy.zst",
        "000000000.image.ctx",
        "000000000.image__side.npy",
        "000000000.label.npy.zst",
    ]
    assert side.shape == (4, 1, 2) and side.dtype == np.float32
    # a standard tar: the shard ends at its zero blocks, and tar readers need nothing more
    data = (pack / "shard-000000.tar").read_bytes()
    assert len(data) % 512 == 0 and data[-1024:] == bytes(1024)


def test_webdataset_pipeline_reproduces_the_pack(pack):
    m = read_manifest(pack)
    assert m.field("counts").kind.name.lower() == "array"  # 1-D integer samples stay exact arrays
    got = list(pipeline(WdsDecoder(pack)))
    assert [s["__key__"] for s in got] == [f"{i:09d}" for i in range(N)]  # the last group's padding row dropped
    ds = open_dataset(pack, shuffle=False, as_dict=True)
    layer = ds.decompressor("image")
    ref = list(ds)
    assert len(ref) == N
    for g, r in zip(got, ref):
        with torch.no_grad():
            want = layer(r["image"])
        assert torch.equal(g["image"], want)
        assert torch.equal(g["label"], r["label"]) and torch.equal(g["counts"], r["counts"])
    stored = list(pipeline(WdsDecoder(pack, decode=False)))
    q, side = stored[5]["image"]
    assert torch.equal(q, ref[5]["image"][0]) and torch.equal(side, ref[5]["image"][1])


def test_handler_leaves_other_suffixes_to_webdataset(pack):
    dec = WdsDecoder(pack)
    assert dec.handler(".txt", b"hello") is None
    with pytest.raises(IntegrityError, match=r"webdataset member 'label.npy.zst'"):
        dec.handler(".label.npy.zst", b"not zstd")


def test_pipeline_without_the_handler_is_explained(pack):
    dec = WdsDecoder(pack)
    with pytest.raises(DctDataError, match=r"expected an array from WdsDecoder.handler. Got bytes \(pass dec.handler"):
        list(wds.WebDataset(dec.urls, shardshuffle=False).compose(dec.samples))


def test_decoder_refuses_other_packs(tmp_path):
    dctdata.pack({"image": smooth(4)}, tmp_path / "z", quiet=True)
    with pytest.raises(DctDataError, match=r"expected a webdataset pack. Got storage 'zarr'"):
        WdsDecoder(tmp_path / "z")
    with pytest.raises(TypeError, match="path: expected a pack's directory or URL"):
        WdsDecoder(3)
