"""webdataset writer: capped deterministic shards, manifest shard list, .npy entries, error paths."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import tarfile

import numpy as np
import pytest
from sample_fields import poisson_fields

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, read_manifest
from dctdata.format.webdataset import sample_key
from dctdata.format.webdataset.writer import WebDatasetWriter


def fields(n, h=24, w=40, seed=0):
    """Poisson fields (N, 1, H, W) and int labels."""
    return poisson_fields(n, 1, h, w, seed), np.arange(n, dtype=np.int64)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    x, y = fields(30)
    path = d / "src.npz"
    np.savez(path, image=x, label=y, mask=(x > 25).astype(np.uint8))
    return path


def pack(source, out, **writer_options):
    return dctdata.pack(
        source, out, format="webdataset", quant="int8", target_psnr=35, quiet=True, writer_options=writer_options
    )


def test_shards_are_byte_identical_across_packs(source, tmp_path):
    m1 = pack(source, tmp_path / "a", samples_per_shard=7)
    m2 = pack(source, tmp_path / "b", samples_per_shard=7)
    assert m1.layout["shards"] == m2.layout["shards"]
    for s in m1.layout["shards"]:
        assert (tmp_path / "a" / s["name"]).read_bytes() == (tmp_path / "b" / s["name"]).read_bytes()


def test_manifest_shard_list_matches_files(source, tmp_path):
    m = pack(source, tmp_path / "a", samples_per_shard=7)
    shards = m.layout["shards"]
    assert [s["samples"] for s in shards] == [7, 7, 7, 7, 2]
    assert sorted(os.listdir(tmp_path / "a")) == sorted(["manifest.json"] + [s["name"] for s in shards])
    for s in shards:
        data = (tmp_path / "a" / s["name"]).read_bytes()
        assert len(data) == s["bytes"]
        assert hashlib.sha256(data).hexdigest() == s["sha256"]
        assert m.checksums[s["name"]] == {"sha256": s["sha256"], "bytes": s["bytes"]}
    assert read_manifest(tmp_path / "a") == m


def test_size_cap_is_a_real_upper_bound(source, tmp_path):
    cap = 30 * 1024
    m = pack(source, tmp_path / "a", max_shard_size=cap)
    shards = m.layout["shards"]
    assert len(shards) > 1
    assert all(s["bytes"] <= cap for s in shards)
    assert sum(s["samples"] for s in shards) == 30
    assert m.layout["max_shard_size"] == cap


@pytest.mark.parametrize("n, expected", [(64, [4] * 16), (50, [3] * 16 + [2]), (16, [1] * 16), (5, [1] * 5)])
def test_small_sets_get_enough_shards_for_ranks_times_workers(n, expected):
    """The rule: at least 16 shards (2 ranks x 8 workers) once a set has 16 samples, however small (its
    samples per member are at most n / 16)."""
    f = FieldSpec("x", "array", (8,), "float32")
    assert [b - a for a, b in WebDatasetWriter().plan((f,), n)] == expected
    assert [b - a for a, b in WebDatasetWriter(samples_per_member=1).plan((f,), n)] == expected
    assert next(b - a for a, b in WebDatasetWriter(samples_per_shard=32).plan((f,), n)) == min(32, n)  # as given
    big = FieldSpec("x", "array", (1 << 20,), "float32")  # 4 MiB samples: the size cap still decides
    assert len(WebDatasetWriter(max_shard_size=16 << 20).plan((big,), 64)) == 22


def test_small_samples_share_members_and_shards_hold_whole_groups():
    """32-byte samples: 256 a member once the set has 16 x 256 of them; with 4 a member, 16 shards of whole
    groups."""
    f = FieldSpec("x", "array", (8,), "float32")
    assert WebDatasetWriter().group((f,)) == WebDatasetWriter().group((f,), 5000) == 256
    assert WebDatasetWriter().group((f,), 64) == 4
    assert [b - a for a, b in WebDatasetWriter(samples_per_member=4).plan((f,), 256)] == [16] * 16
    tile = FieldSpec("x", "array", (64, 64), "int16")  # 8 KiB: 32 a member (256 KiB), at most n / 16
    assert WebDatasetWriter().group((tile,)) == 32 and WebDatasetWriter().group((tile,), 396) == 24
    assert WebDatasetWriter(samples_per_shard=6).group((tile,)) == 6  # shards as asked: K divides them
    big = FieldSpec("x", "array", (256, 256), "float32")  # 256 KiB: one sample a member
    assert WebDatasetWriter().group((big,)) == 1


def test_tar_members_are_pinned_and_hold_one_array_each(source, tmp_path):
    m = pack(source, tmp_path / "a", samples_per_shard=7)
    assert m.layout["samples_per_member"] == 7  # 4.8 KB samples: as many as divide the 7 a shard asked for
    assert m.field("image").lossless["id"] == "dctdata_ctxrans"
    assert m.field("mask").kind == "array" and m.field("mask").lossless["id"] == "zstd"  # 0/1 values: kept exact
    with tarfile.open(tmp_path / "a" / "shard-000001.tar") as tf:
        members = tf.getmembers()
        names = [t.name for t in members]
        entries = ("image.ctx", "image__side.npy", "label.npy.zst", "mask.npy.zst")
        assert names == [f"{sample_key(7)}.{f}" for f in entries]
        assert {(t.mtime, t.uid, t.gid, t.uname, t.gname, t.mode) for t in members} == {
            (0, 0, 0, "dctdata", "dctdata", 0o444)
        }
        assert not any(t.pax_headers for t in members)
        codec = dctdata.stages.get_stage(m.field("label").lossless).codec
        raw = codec.decode(tf.extractfile(f"{sample_key(7)}.label.npy.zst").read())
        side = np.load(io.BytesIO(tf.extractfile(f"{sample_key(7)}.image__side.npy").read()), allow_pickle=False)
    label = np.load(io.BytesIO(raw), allow_pickle=False)
    assert label.tolist() == list(range(7, 14))
    assert side.dtype == np.float32 and side.shape == (7, 1, 2)  # (range, mid) of each sample's channel


def test_uncompressed_entries_are_plain_npy(source, tmp_path):
    m = dctdata.pack(
        source, tmp_path / "a", format="webdataset", quiet=True, codec=None, cf=4,  # no side partner member
        writer_options={"samples_per_member": 1},
    )  # fmt: skip
    with tarfile.open(tmp_path / "a" / m.layout["shards"][0]["name"]) as tf:
        names = tf.getnames()
        assert names[:3] == [f"{sample_key(0)}.image.npy", f"{sample_key(0)}.label.npy", f"{sample_key(0)}.mask.npy"]
        img = np.load(io.BytesIO(tf.extractfile(names[0]).read()), allow_pickle=False)
    f = m.field("image")
    assert img.dtype.name == f.stored_dtype and img.shape == (1, *f.stored_shape)


def test_sample_bigger_than_cap_gets_its_own_shard(tmp_path, caplog):
    f = FieldSpec("x", "array", (4000,), "float32", lossless=None)
    w = WebDatasetWriter(max_shard_size=10240, samples_per_member=1)
    w.open(str(tmp_path), (f,), 3)
    with caplog.at_level(logging.WARNING, logger="dctdata.format.webdataset.writer"):
        w.write(0, {"x": np.zeros((3, 4000), np.float32)})
    out = w.close()
    assert [s["samples"] for s in out["layout"]["shards"]] == [1, 1, 1]
    assert "samples 0..0 (16896 bytes) exceed max_shard_size 10240" in caplog.text


def test_small_samples_warn_of_tar_overhead(tmp_path, caplog):
    """One 256-byte sample a member: headers and padding are most of the shard, and the warning says what to
    do; grouped (by default 128 a member: 16 groups), the same samples pass without it."""
    src = tmp_path / "src.npz"
    np.savez(src, x=np.random.default_rng(0).normal(size=(2048, 64)).astype(np.float32))
    with caplog.at_level(logging.WARNING, logger="dctdata.format.webdataset.writer"):
        pack_plain = dctdata.pack(
            src, tmp_path / "a", format="webdataset", quiet=True, writer_options={"samples_per_member": 1}
        )
    assert pack_plain.layout["samples_per_member"] == 1
    assert re.search(
        r"tar headers and padding are \d+% of the \d+ stored bytes .* store tighter with --format zarr", caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dctdata.format.webdataset.writer"):
        grouped = dctdata.pack(src, tmp_path / "b", format="webdataset", quiet=True)
    assert grouped.layout["samples_per_member"] == 128 and "tar headers" not in caplog.text  # 16 groups of 128


def test_cli_pack_webdataset_then_verify(source, tmp_path, capsys):
    assert main(["pack", str(source), str(tmp_path / "a"), "--format", "webdataset", "--quiet"]) == 0
    assert read_manifest(tmp_path / "a").storage == "webdataset"
    assert main(["verify", str(tmp_path / "a")]) == 0
    assert "30 samples" in capsys.readouterr().out


def test_existing_out_refused(source, tmp_path):
    pack(source, tmp_path / "a")
    with pytest.raises(DctDataError, match="existing path"):
        pack(source, tmp_path / "a")
    assert read_manifest(tmp_path / "a").samples == 30


def test_overwrite_replaces(source, tmp_path):
    pack(source, tmp_path / "a")
    dctdata.pack(
        source, tmp_path / "a", format="webdataset", quiet=True, overwrite=True, writer_options={"samples_per_shard": 5}
    )
    assert len(read_manifest(tmp_path / "a").layout["shards"]) == 6
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_shard_size": 100}, "max_shard_size: expected an int >= 10240"),
        ({"samples_per_shard": 0}, "samples_per_shard: expected a positive int"),
        ({"max_shard_size": True}, "max_shard_size: expected an int"),
        ({"samples_per_member": 0}, "samples_per_member: expected an int in 1..256 or None"),
        ({"samples_per_member": 257}, "samples_per_member: expected an int in 1..256 or None"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(DctDataError, match=match):
        WebDatasetWriter(**options)


def test_write_errors(tmp_path):
    f = FieldSpec("x", "array", (3,), "float32", lossless=None)
    w = WebDatasetWriter()
    with pytest.raises(DctDataError, match="expected open"):
        w.write(0, {"x": np.zeros((1, 3), np.float32)})
    w.open(str(tmp_path), (f,), 4)
    with pytest.raises(DctDataError, match=r"expected stored float32 \(3,\). Got float64"):
        w.write(0, {"x": np.zeros((1, 3))})
    with pytest.raises(DctDataError, match=r"expected consecutive samples starting at 0. Got start=2"):
        w.write(2, {"x": np.zeros((1, 3), np.float32)})
    with pytest.raises(DctDataError, match="expected fields \\['x'\\]"):
        w.write(0, {"y": np.zeros((1, 3), np.float32)})
    with pytest.raises(TypeError, match="expected a mapping"):
        w.write(0, [np.zeros((1, 3), np.float32)])
    w.abort()


def test_open_errors(tmp_path):
    with pytest.raises(TypeError, match="FieldSpec"):
        WebDatasetWriter().open(str(tmp_path), ("x",), 1)
    with pytest.raises(DctDataError, match="expected an existing empty directory"):
        WebDatasetWriter().open(str(tmp_path / "missing"), (FieldSpec("x", "label", (), "int64"),), 1)
    long = FieldSpec("x" * 95, "label", (), "int64")
    with pytest.raises(DctDataError, match="100-character tar member"):
        WebDatasetWriter().open(str(tmp_path), (long,), 1)


def test_cli_shard_caps(source, tmp_path, capsys):
    args = [
        "pack",
        str(source),
        str(tmp_path / "a"),
        *["--format", "webdataset", "--quiet", "--samples-per-shard", "8", "--max-shard-size", "1000000"],
    ]
    assert main(args) == 0
    m = read_manifest(tmp_path / "a")
    assert [s["samples"] for s in m.layout["shards"]] == [8, 8, 8, 6] and m.layout["max_shard_size"] == 1000000
    assert main(["pack", str(source), str(tmp_path / "z"), "--samples-per-shard", "8"]) == 1
    assert "expected --format webdataset. Got --format zarr" in capsys.readouterr().err
    assert main(["pack", str(source), str(tmp_path / "b"), "--format", "webdataset", "--max-shard-size", "5"]) == 1
    assert "max_shard_size: expected an int >= 10240" in capsys.readouterr().err
    # sizes as --help writes them
    assert main(["pack", str(source), str(tmp_path / "c"), "--format", "webdataset", "--max-shard-size", "1MiB"]) == 0
    assert read_manifest(tmp_path / "c").layout["max_shard_size"] == 1 << 20
    assert "packed 30 samples" in capsys.readouterr().out
    assert main(["pack", str(source), str(tmp_path / "d"), "--format", "webdataset", "--max-shard-size", "1 MB"]) == 0
    assert read_manifest(tmp_path / "d").layout["max_shard_size"] == 1000000
    assert main(["pack", str(source), str(tmp_path / "e"), "--format", "webdataset", "--max-shard-size", "lots"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-shard-size: expected a size in bytes such as 4096, '256 MiB'" in err
