"""Format version 8: a pack's fixed bytes (manifest.json and zarr.json files; issue 46). The compact forms
round-trip, older manifests still read, malformed compact entries are named, the zarr.json files are checked
against the manifest without a checksum, a one-chunk shard has no index, and calibration counts a table's
bytes as the manifest writes them (`dctdata.encoder.tables`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest
from pack_checks import reseal, verify

import dctdata
import dctdata.entropy.ctxrans as cr
from dctdata.codec.spec import CodecSpec
from dctdata.encoder.tables import packed_bytes, table_bytes
from dctdata.errors import FormatError, IntegrityError
from dctdata.format import FORMAT_VERSION, FieldSpec, FieldStats, Manifest, parse_manifest
from dctdata.format.compact import COMPACT_VERSION
from dctdata.format.fields import pack_tables, side_field
from dctdata.format.manifest import ChannelStats, manifest_seal


def _fitted() -> dict:
    """A dctdata_ctxrans config of a small volume as `CtxCodec.fit` writes it (its starting layout)."""
    q = np.round(np.random.default_rng(1).laplace(0, 1.5, (1, 1, 2, 2, 512, 2))).astype(np.int16)
    return cr.CtxCodec.fit(q, 8, "cube", return_report=True, _first_only=True)[0].get_config()


CTX = _fitted()


def _volume_manifest(version: int = FORMAT_VERSION, lossless=None) -> Manifest:
    spec = CodecSpec(cf=8, mask="cube", depth=25, height=41, width=33, channels=1, dtype="int16", steps=[0.04],
                     recon=[[-0.04] * 512], theta=0.4, side="range_mid", pad="extend")  # fmt: skip
    image = FieldSpec("image", "dct", (1, 25, 41, 33), "int16", spec, {"id": "zstd", "level": 19})
    image = dataclasses.replace(image, lossless=lossless) if lossless is not None else image
    sha = hashlib.sha256(b"chunk").hexdigest()
    return Manifest(
        storage="zarr",
        samples=1,
        fields=(image, side_field(image)),
        stats={"image": FieldStats(40.07, 40.07, 165.4, 0, 40.07, (ChannelStats(40.07, 40.07, 40.07, 165.4),))},
        checksums={"image/c.0.0.0.0.0.0": {"sha256": sha, "bytes": 9786}},
        layout={"arrays": {"image": {"path": "image", "chunk": 1, "shard": 1}}},
        version=version,
    )


def test_version_8_writes_what_a_reader_cannot_derive_and_reads_it_back():
    m = _volume_manifest(lossless=CTX)
    d = json.loads(m.to_json())
    assert d["version"] == FORMAT_VERSION == COMPACT_VERSION
    codec, lossless = d["fields"][0]["codec"], d["fields"][0]["lossless"]
    assert not {"channels", "depth", "height", "width", "pad"} & set(codec)  # the shape [C, D, H, W] says them
    assert codec["recon"] == [-0.04]  # a constant row: one value per channel
    assert set(lossless) == {"id", "edges_in", "params", "table_crc"}  # the codec's, one group, the defaults
    assert d["stats"]["image"] == {"psnr_min": 40.07, "max_abs_error": 165.4}
    digest = bytes.fromhex(m.checksums["image/c.0.0.0.0.0.0"]["sha256"])
    assert d["checksums"]["image/c.0.0.0.0.0.0"].split(":") == [
        __import__("base64").urlsafe_b64encode(digest).decode().rstrip("="),
        "9786",
    ]
    assert len(d["seal"]) == 43 and d["seal"] == manifest_seal(d)
    back = parse_manifest(m.to_json().encode())
    assert back == m and back.field("image").lossless == CTX
    assert len(m.to_json()) < len(_volume_manifest(7, CTX).to_json()) - 400


def test_a_config_entry_left_out_stays_left_out():
    """A version 3 ctxrans config without `segment` means 16384: it is written null, not left out (which
    would read back as the default 8192)."""
    old = {k: v for k, v in CTX.items() if k not in ("segment", "segment_bytes")}
    m = _volume_manifest(lossless=old)
    d = json.loads(m.to_json())
    assert d["fields"][0]["lossless"]["segment"] is None and d["fields"][0]["lossless"]["segment_bytes"] is None
    assert parse_manifest(m.to_json().encode()).field("image").lossless == old


def test_a_previous_version_manifest_still_reads():
    m = _volume_manifest(7, CTX)
    d = json.loads(m.to_json())
    assert d["version"] == 7 and d["seal"].startswith("sha256:")
    assert set(d["checksums"]["image/c.0.0.0.0.0.0"]) == {"sha256", "bytes"} and d["fields"][0]["codec"]["depth"]
    assert parse_manifest(m.to_json().encode()) == m
    # a version 8 manifest may keep the object form of a checksum (a tool that edits one writes it)
    d8 = json.loads(_volume_manifest(lossless=CTX).to_json())
    d8["checksums"] = {k: dict(v) for k, v in m.checksums.items()}
    assert parse_manifest(json.dumps(reseal(d8)).encode()).checksums == m.checksums


@pytest.mark.parametrize(
    "entry",
    [
        "not a checksum",
        "A" * 42 + ":12",  # 42 characters: not a sha256
        "A" * 42 + "B:12",  # not the canonical encoding of any digest
        "A" * 43 + ":-1",
        "A" * 43 + ":012",
        12,
        ["A" * 43, 12],
    ],
)
def test_a_malformed_checksum_entry_is_one_error_naming_it(entry):
    d = json.loads(_volume_manifest(lossless=CTX).to_json())
    d["checksums"]["image/c.0.0.0.0.0.0"] = entry
    with pytest.raises(FormatError, match=r"checksums\['image/c\.0\.0\.0\.0\.0\.0'\]: expected \"<sha256 as 43"):
        parse_manifest(json.dumps(reseal(d)).encode())


def test_a_shape_left_out_of_the_codec_is_checked_where_written():
    d = json.loads(_volume_manifest(lossless=CTX).to_json())
    d["fields"][0]["codec"]["height"] = 40  # written apart: it must match the field's shape
    with pytest.raises(FormatError, match=r"codec sample shape: expected \(1, 25, 41, 33\).*Got \(1, 25, 40, 33\)"):
        parse_manifest(json.dumps(reseal(d)).encode())


@pytest.mark.parametrize(
    "table",
    [
        [[0.0625] * 512],  # constant: one value
        [[0.5] * 64, [0.25] * 64],  # one value per channel
        [[0.01 * k for k in range(512)]],  # per frequency: base64 of zlib of float32
        [[0.1, 0.2, 0.3, 0.4]],  # small: the numbers
        [[0.1] * 64, [0.01 * (k + 1) for k in range(64)]],  # one constant row and one not: packed whole
    ],
)
def test_calibration_counts_a_table_as_the_manifest_writes_it(table):
    channels, k = len(table), len(table[0])
    spec = CodecSpec(cf=8, height=16, width=16, channels=channels, dtype="int8", steps=table) if k == 64 else None
    written = pack_tables({"steps": table})["steps"]
    assert table_bytes(table) == len(json.dumps(written, separators=(",", ":")))
    if spec is not None:  # the codec's own JSON, as the manifest writes it
        codec = pack_tables(spec.to_dict())
        assert table_bytes(table) == len(json.dumps(codec["steps"], separators=(",", ":")))
    assert table_bytes(None) == 0 and packed_bytes(table[0]) == table_bytes([table[0]])


def _one_sample(tmp_path, storage="zarr"):
    x = np.random.default_rng(0).standard_normal((1, 1, 40, 48)).cumsum(-1).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    return dctdata.pack(str(tmp_path / "x.npy"), tmp_path / storage, target_psnr=35, quiet=True, format=storage)


def test_a_one_sample_pack_lists_no_metadata_and_stores_no_shard_index(tmp_path, capsys):
    m = _one_sample(tmp_path)
    root = tmp_path / "zarr"
    on_disk = {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    assert set(m.checksums) == {k for k in on_disk if k != "manifest.json" and not k.endswith("zarr.json")}
    assert m.stored_bytes == sum(on_disk.values()) - on_disk["manifest.json"]  # zarr.json files counted
    meta = json.loads((root / "image" / "zarr.json").read_text())
    names = [c["name"] for c in meta["codecs"]]
    assert names[-1] == "crc32c" and "sharding_indexed" not in names  # one chunk a shard: not sharded
    assert dctdata.open_dataset(root)[0] is not None and verify(capsys, root)[0] == 0
    # an edit of a zarr.json is refused by name, as the checksum it replaces did
    (root / "image" / "zarr.json").write_text(json.dumps(dict(meta, attributes={"x": 1}), separators=(",", ":")))
    with pytest.raises(IntegrityError, match=r"image/zarr\.json: field 'image': expected the zarr v3 array metadata"):
        dctdata.open_dataset(root)[0]
    rc, out = verify(capsys, root)
    assert rc == 1 and "image/zarr.json" in out
    (root / "zarr.json").write_text('{"zarr_format":3,"node_type":"group","attributes":{}}\n')
    with pytest.raises(IntegrityError, match=r"zarr\.json: expected the zarr v3 group metadata the manifest implies"):
        dctdata.open_dataset(root)[0]


def test_a_webdataset_pack_shares_the_compact_manifest(tmp_path):
    m = _one_sample(tmp_path, "webdataset")
    d = json.loads((tmp_path / "webdataset" / "manifest.json").read_text())
    assert d["version"] == COMPACT_VERSION and all(isinstance(v, str) for v in d["checksums"].values())
    assert all("sha256" not in s for s in d["layout"]["shards"])  # said by the checksums
    name = next(iter(m.checksums))
    data = (tmp_path / "webdataset" / name).read_bytes()
    assert m.checksums[name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert len(list(dctdata.open_dataset(tmp_path / "webdataset", shuffle=False))) == 1
    assert m.stored_bytes == os.path.getsize(tmp_path / "webdataset" / name)


def test_the_entropy_model_takes_coarser_parameters_where_that_makes_the_smaller_total(monkeypatch):
    rng = np.random.default_rng(0)
    q = np.round(rng.laplace(0, 1.5, (1, 1, 6, 64, 5))).astype(np.int8)  # a small set: few symbols a context
    fine_only = cr.CtxCodec.fit(q, 8, "square", return_report=True, _first_only=True)
    monkeypatch.setattr(cr, "PRECISIONS", (0,))
    fine = cr.CtxCodec.fit(q, 8, "square", return_report=True, _first_only=True)
    monkeypatch.undo()
    codec, report = fine_only
    assert report[0][1] < fine[1][0][1] and report[0][2] < fine[1][0][2]  # fewer bits in all, fewer model bytes
    assert (codec.iz % 2 == 0).all() and (codec.ir % 2 == 0).all()  # a coarser grid
    assert np.array_equal(cr.CtxCodec.from_config(codec.get_config()).decode(codec.encode(q), q.shape, q.dtype), q)


def test_the_entropy_model_is_written_in_fewer_characters_and_read_back_as_its_config():
    d = json.loads(_volume_manifest(lossless=CTX).to_json())
    written = d["fields"][0]["lossless"]["params"]
    assert written[0].isdigit() and len(written) < len(CTX["params"])
    assert parse_manifest(json.dumps(d).encode()).field("image").lossless["params"] == CTX["params"]


@pytest.mark.parametrize("params", ["9" + "0" * 20, "0not base85 ~~~~~", "0" + "0" * 10, "7" + "0" * 10])
def test_a_malformed_written_model_is_one_error_naming_the_field(params):
    d = json.loads(_volume_manifest(lossless=CTX).to_json())
    d["fields"][0]["lossless"]["params"] = params
    with pytest.raises(FormatError, match=r"field 'image': lossless: params: expected a digit 0\.\.7 and base85"):
        parse_manifest(json.dumps(reseal(d)).encode())


GOLDEN_V7 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "golden_v7_one")


def test_a_format_7_one_sample_pack_still_reads(capsys):
    """tests/data/golden_v7_one: one int16 sample packed at --target-psnr 40 by format 7 (commit 73da1c6): its
    manifest lists the zarr.json files and its one-chunk shard is sharded, with an index."""
    d = json.loads(open(os.path.join(GOLDEN_V7, "manifest.json")).read())
    meta = json.loads(open(os.path.join(GOLDEN_V7, "image", "zarr.json")).read())
    assert d["version"] == 7 and "image/zarr.json" in d["checksums"] and meta["codecs"][0]["name"] == "sharding_indexed"
    assert verify(capsys, GOLDEN_V7)[0] == 0
    ds = dctdata.open_dataset(GOLDEN_V7, as_dict=True)
    y = ds.decompressor("image")(ds[0:1]["image"]).numpy()
    x = np.load(GOLDEN_V7 + ".npy").astype(np.float32)
    assert ds.manifest.stored_bytes == sum(e["bytes"] for e in ds.manifest.checksums.values())  # all listed
    assert 10 * np.log10(float(x.max() - x.min()) ** 2 / float(np.mean((y.reshape(x.shape) - x) ** 2))) >= 40


def test_the_entropy_stage_written_with_its_former_configuration_still_matches():
    from dctdata.format.zarr.metadata import array_json, check_chunk_codecs, parse_array_json

    shape = (1, 1, 2, 512, 2)
    now = array_json(shape, "int16", shape, shape, CTX)
    before = now.replace(
        b'{"name":"dctdata_ctxrans"}', b'{"name":"dctdata_ctxrans","configuration":{"model":"manifest.json"}}'
    )
    assert before != now
    for raw in (now, before):
        check_chunk_codecs(parse_array_json(raw, "a"), CTX, "image", "a")  # no error
    other = now.replace(b'{"name":"dctdata_ctxrans"}', b'{"name":"dctdata_ctxrans","configuration":{"model":"x"}}')
    with pytest.raises(IntegrityError, match=r"field 'image': expected chunk codecs \['dctdata_ctxrans', 'crc32c'\]"):
        check_chunk_codecs(parse_array_json(other, "a"), CTX, "image", "a")
