"""Version 4: a zarr pack keeps a small side partner in the manifest (`layout.arrays[...]["inline"]`)
instead of an array with its own files, and reads exactly what an array would have given."""

from __future__ import annotations

import base64
import json

import fsspec
import numpy as np
import pytest
import torch
from pack_checks import as_version, reseal
from sample_fields import files, smooth_fields

import dctdata
import dctdata.format.zarr.writer as zarr_writer
from dctdata.errors import FormatError
from dctdata.format import FORMAT_VERSION, read_manifest
from dctdata.format.zarr.layout import INLINE_BYTES
from dctdata.format.zarr.writer import _inline_values
from dctdata.verify import verify_dataset

KW = dict(cf=4, quant="int8", quiet=True)


def _decoded(path):
    ds = dctdata.open_dataset(path)
    layer = ds.decompressor()
    return np.stack([layer(ds[i][0]).numpy() for i in range(len(ds))])


def _source(tmp_path, n, c=1, name="x.npy"):
    x = smooth_fields(n, c, 24, 40, seed=n)
    np.save(tmp_path / name, x)
    return tmp_path / name, x


@pytest.mark.parametrize("n", [1, 5])
def test_small_pack_keeps_its_side_values_in_the_manifest(tmp_path, monkeypatch, n):
    src, _x = _source(tmp_path, n, c=2)
    m = dctdata.pack(src, tmp_path / "inline", **KW)
    monkeypatch.setattr(zarr_writer, "INLINE_BYTES", 0)  # the same pack with the side array stored
    dctdata.pack(src, tmp_path / "array", **KW)
    inline, array = files(tmp_path / "inline"), files(tmp_path / "array")
    assert not any(k.startswith("image__side") for k in inline)
    assert {k for k in array if k.startswith("image__side")} == {"image__side/zarr.json", "image__side/c.0.0.0"}
    assert all(inline[k] == array[k] for k in inline if k != "manifest.json")  # the coefficients are the same
    assert not (tmp_path / "inline" / "image__side").exists()
    d = json.loads(inline["manifest.json"])
    side = base64.b64decode(d["layout"]["arrays"]["image__side"]["inline"])
    assert d["version"] == FORMAT_VERSION and len(side) == n * 2 * 2 * 4  # (n, C, 2) float32
    assert sum(map(len, inline.values())) < sum(map(len, array.values())) - 300
    # every file but the manifest and the zarr.json files a reader rebuilds from it (format 8)
    assert m.checksums.keys() == {k for k in inline if k != "manifest.json" and not k.endswith("zarr.json")}
    np.testing.assert_array_equal(_decoded(tmp_path / "inline"), _decoded(tmp_path / "array"))
    problems, summary = verify_dataset(tmp_path / "inline")
    assert problems == [] and summary["decoded"] == n


def test_inline_pack_stores_fewer_bytes_and_decodes_on_target(tmp_path, monkeypatch):
    src, x = _source(tmp_path, 1)
    dctdata.pack(src, tmp_path / "inline", target_psnr=35, quiet=True)
    monkeypatch.setattr(zarr_writer, "INLINE_BYTES", 0)
    dctdata.pack(src, tmp_path / "array", target_psnr=35, quiet=True)
    saved = sum(map(len, files(tmp_path / "array").values())) - sum(map(len, files(tmp_path / "inline").values()))
    # a zarr.json (not listed, format 8), a one-chunk file, a checksum and a layout entry, less 12 base64 characters
    assert 300 < saved < 800
    y = _decoded(tmp_path / "inline")[0]
    rng = float(x.max() - x.min())
    assert 10 * np.log10(rng**2 / float(np.mean((y - x[0]) ** 2))) >= 35 - 0.05


def test_a_pack_over_the_limit_keeps_its_side_array(tmp_path, monkeypatch):
    src, _x = _source(tmp_path, 3)
    dctdata.pack(src, tmp_path / "inline", **KW)
    monkeypatch.setattr(zarr_writer, "INLINE_BYTES", 2 * 8)  # 3 samples x 1 channel x 8 bytes is over
    m = dctdata.pack(src, tmp_path / "p", **KW)
    assert "path" in m.layout["arrays"]["image__side"] and (tmp_path / "p" / "image__side" / "zarr.json").exists()
    np.testing.assert_array_equal(_decoded(tmp_path / "p"), _decoded(tmp_path / "inline"))


def test_a_streamed_pack_over_several_parts_joins_its_side_values_in_order(tmp_path, monkeypatch):
    x = smooth_fields(5, 1, 24, 40, seed=3)
    with dctdata.Writer(tmp_path / "s", writer_options={"shard_samples": 2}, cf=4, quant="int8") as w:
        for s in x:
            w.write({"image": s})
    assert w.manifest.layout["arrays"]["image__side"].keys() == {"inline"}
    monkeypatch.setattr(zarr_writer, "INLINE_BYTES", 0)
    with dctdata.Writer(tmp_path / "a", writer_options={"shard_samples": 2}, cf=4, quant="int8") as w:
        for s in x:
            w.write({"image": s})
    assert len([k for k in files(tmp_path / "a") if k.startswith("image__side/c.")]) == 3
    np.testing.assert_array_equal(_decoded(tmp_path / "s"), _decoded(tmp_path / "a"))


def test_an_object_store_pack_removes_the_partner_objects(tmp_path):
    src, _x = _source(tmp_path, 2)
    fs = fsspec.filesystem("memory")
    try:
        dctdata.pack(src, "memory://dctdata_inline/p", **KW)
        dctdata.pack(src, tmp_path / "local", **KW)
        assert not fs.exists("/dctdata_inline/p/image__side/c.0.0.0") and fs.exists("/dctdata_inline/p/image/zarr.json")
        np.testing.assert_array_equal(_decoded("memory://dctdata_inline/p"), _decoded(tmp_path / "local"))
    finally:
        fs.rm("/dctdata_inline", recursive=True)


def test_parts_without_inline_values_keep_the_array(tmp_path):
    """A part journaled by a dctdata before version 4 returns no values: its partner stays an array."""
    from dctdata.codec.spec import CodecSpec
    from dctdata.format import FieldSpec
    from dctdata.format.fields import side_field

    image = FieldSpec("image", "dct", (1, 8, 8), "float32", CodecSpec(cf=2, height=8, width=8, side="range_mid"))
    fields = (image, side_field(image))
    part = {"inline": {"image__side": base64.b64encode(np.arange(4, dtype="<f4").tobytes()).decode()}}
    got = _inline_values(fields, 2, [part, {"files": {}}])
    assert got == {}
    got = _inline_values(fields, 2, [part])
    np.testing.assert_array_equal(got["image__side"], np.arange(4, dtype=np.float32).reshape(2, 1, 2))
    assert _inline_values(fields, INLINE_BYTES, [part]) == {}


def _edit(tmp_path, change):
    d = json.loads((tmp_path / "p" / "manifest.json").read_text())
    change(d)
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(reseal(d)))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: (d.pop("seal"), as_version(d, 3)),
            r"layout\.arrays\['image__side'\]: expected \{path, chunk, shard\} \(inline arrays need version 4\)",
        ),
        (
            lambda d: d["layout"]["arrays"]["image__side"].update(inline="AAB!"),
            r"\.inline: expected a base64 string\. Got",
        ),
        (
            lambda d: d["layout"]["arrays"]["image__side"].update(inline=7),
            r"\.inline: expected a base64 string\. Got int",
        ),
        (
            lambda d: d["layout"]["arrays"]["image__side"].update(inline="AAAAAA=="),
            r"\.inline: expected 16 bytes \(2 samples of \(1, 2\) float32\)\. Got 4",
        ),
        (
            lambda d: d["layout"]["arrays"]["image__side"].update(inline="A" * 2000),
            r"\.inline: expected an array of at most 1024 bytes\. Got 2000 base64 characters",
        ),
        (
            lambda d: d["layout"]["arrays"]["image__side"].update(chunk=1),
            r"\(only a side partner may be inline, alone\)\. Got keys \['chunk', 'inline'\]",
        ),
        (
            lambda d: d["layout"]["arrays"].update(image={"inline": ""}),
            r"layout\.arrays\['image'\]: expected \{path, chunk, shard\} \(only a side partner may be inline",
        ),
    ],
)
def test_a_bad_inline_entry_is_named(tmp_path, change, message):
    src, _ = _source(tmp_path, 2)
    dctdata.pack(src, tmp_path / "p", **KW)
    _edit(tmp_path, change)
    with pytest.raises(FormatError, match=message):
        dctdata.open_dataset(tmp_path / "p")[0]


def test_a_changed_inline_value_changes_the_decode_and_verify_still_reads_it(tmp_path):
    """The manifest is the pack's root of trust (pinned by its sha256): its values are what is read."""
    src, _ = _source(tmp_path, 1)
    dctdata.pack(src, tmp_path / "p", **KW)
    before = _decoded(tmp_path / "p")
    _edit(
        tmp_path,
        lambda d: d["layout"]["arrays"]["image__side"].update(
            inline=base64.b64encode(np.array([2.0, 0.0], "<f4").tobytes()).decode()
        ),
    )
    after = _decoded(tmp_path / "p")
    assert not np.allclose(before, after) and torch.isfinite(torch.from_numpy(after)).all()
    assert read_manifest(tmp_path / "p").version == FORMAT_VERSION
