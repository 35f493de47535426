"""dctdata.format: FieldSpec/Manifest validation and round trip, version refusal, and the committed
golden dataset (tests/data/golden_v1) that every later version must keep reading bit-exactly.

Regenerate the golden fixture only on a deliberate format change (and bump FORMAT_VERSION):
    python tests/test_format.py regen
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys

import numpy as np
import pytest
import torch

import dctdata
import dctdata.codec.metrics
from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError, FormatError
from dctdata.format import FORMAT_VERSION, FieldSpec, FieldStats, Manifest, read_manifest, write_manifest
from dctdata.format.compact import full_v8
from dctdata.format.manifest import manifest_seal
from dctdata.format.webdataset import entry_name, sample_key
from dctdata.format.zarr import shard_key as zarr_shard_key

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "golden_v1")


def golden_source() -> dict[str, np.ndarray]:
    """Deterministic closed-form data (no RNG): non-square, non-multiple-of-8, two channels."""
    i, c, h, w = np.meshgrid(np.arange(6), np.arange(2), np.arange(11), np.arange(13), indexing="ij")
    x = (10 * np.sin(0.3 * (h + 1) * (i + 1)) + np.cos(0.2 * w * (c + 1)) + 0.05 * h * w).astype(np.float32)
    return {"image": x, "mask": (x[:, :1] > 0).astype(np.uint8), "label": np.arange(6, dtype=np.int64) % 3}


def regen() -> None:  # pragma: no cover - run by hand
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "golden_v1.npz")
        np.savez(src, **golden_source())
        shutil.rmtree(GOLDEN, ignore_errors=True)
        os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
        dctdata.pack(
            src,
            GOLDEN,
            cf=3,
            quant="int8",
            fields={"mask": "array"},
            quiet=True,
            writer_options={"chunk_samples": 2, "shard_samples": 4},
        )
    m = json.load(open(os.path.join(GOLDEN, "manifest.json")))
    m["pack"]["source"] = "golden_v1.npz"  # no temporary path in the fixture
    with open(os.path.join(GOLDEN, "manifest.json"), "w") as fh:
        fh.write(json.dumps(m, indent=2) + "\n")


def spec():
    return CodecSpec(cf=3, height=11, width=13, channels=2, dtype="bfloat16")


def manifest(**kw):
    fields = (
        FieldSpec("image", "dct", (2, 11, 13), "float32", spec()),
        FieldSpec("mask", "array", (1, 11, 13), np.dtype("uint8")),
        FieldSpec("label", "label", (), "int64"),
    )
    args = dict(storage="zarr", samples=6, fields=fields, stats={"image": FieldStats(30.0, 33.5, 0.25, 2)})
    args.update(kw)
    return Manifest(**args)


def test_round_trip(tmp_path):
    m = manifest(pack={"target_psnr": math.inf}, checksums={"image/c.0": {"sha256": "0" * 64, "bytes": 10}})
    write_manifest(m, tmp_path)
    back = read_manifest(tmp_path)
    assert back == m and read_manifest(tmp_path / "manifest.json") == m
    assert back.pack["target_psnr"] == "inf" and back.stats["image"].psnr_median == 33.5
    f = back.field("image")
    assert f.stored_shape == (2, 2, 9, 2) and f.stored_dtype == "uint16" and f.tensor_dtype == torch.bfloat16
    t = torch.randn(3, *f.stored_shape).to(torch.bfloat16)
    assert torch.equal(f.to_tensor(f.to_stored(t)), t)
    assert back.field(kind="dct").name == "image" and back.names == ("image", "mask", "label")
    assert not list(tmp_path.glob("*.tmp"))


def test_conventions():
    assert sample_key(12) == "000000012" and entry_name("image") == "image.npy"
    assert zarr_shard_key("image", 3, 5) == "image/c.3.0.0.0.0"


def test_newer_version_refused(tmp_path):
    d = manifest().to_dict()
    d["version"] = FORMAT_VERSION + 1
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    newer = rf"version: expected <= {FORMAT_VERSION} .*Got {FORMAT_VERSION + 1}: .*upgrade dctdata"
    with pytest.raises(FormatError, match=newer):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.update(format="zarr"), r"format: expected 'dctdata'\. Got 'zarr'"),
        (lambda d: d.update(version="1"), rf"version: expected an int in 1\.\.{FORMAT_VERSION}\. Got '1'"),
        (lambda d: d.update(extra=1), r"expected keys .*Got unknown keys \['extra'\]"),
        (lambda d: d.pop("samples"), r"Got missing keys \['samples'\]"),
        (lambda d: d.update(samples=-1), r"samples: expected an int >= 0\. Got -1"),
        (lambda d: d.update(storage="tar"), r"storage: expected one of \('zarr', 'webdataset'\)\. Got 'tar'"),
        (lambda d: d["fields"][0].update(kind="jpeg"), r"field 'image': kind: expected one of"),
        (  # version 8 leaves out the codec's shape where the field's says it: one written apart must match
            lambda d: d["fields"][0]["codec"].update(width=12),
            r"codec sample shape: expected \(2, 11, 13\).*Got \(2, 11, 12\)",
        ),
        (lambda d: d["fields"][0]["codec"].update(cf=9), r"field 'image': codec: cf: expected an int in 1\.\.8"),
        (lambda d: d["fields"][1].update(dtype="object"), r"field 'mask': dtype: expected one of"),
        (lambda d: d["fields"][2].update(shape=[3]), r"field 'label': shape: expected \(\) for a label field"),
        (lambda d: d["fields"][1].update(name="a/b"), r"field name: expected a plain identifier"),
        (lambda d: d["fields"].append(dict(d["fields"][2])), r"fields: expected unique names"),
        (
            lambda d: d["stats"].update(ghost=d["stats"]["image"]),
            r"stats: expected entries for fields .*Got unknown \['ghost'\]",
        ),
        (lambda d: d["checksums"].update({"x": {"sha256": "zz", "bytes": 1}}), r"sha256: expected 64 lowercase hex"),
        (
            lambda d: d["fields"][2].update(lossless={"id": "nope"}),
            r"field 'label': lossless: expected one of .*Got 'nope'",
        ),
    ],
)
def test_strict_validation(tmp_path, edit, match):
    d = manifest().to_dict()
    edit(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=match):
        read_manifest(tmp_path)


def test_unreadable_and_missing(tmp_path):
    with pytest.raises(FormatError, match=r"expected a dctdata manifest \(manifest\.json\)\. Got no such file"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe")
    with pytest.raises(FormatError, match=r"expected a JSON manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(FormatError, match=r"expected a JSON object"):
        read_manifest(tmp_path)
    with pytest.raises(TypeError, match=r"path_or_url: expected a path"):
        read_manifest(3)
    with pytest.raises(TypeError, match=r"manifest: expected a dctdata.format.Manifest"):
        write_manifest({}, tmp_path)


def test_fieldspec_construction_errors():
    with pytest.raises(DctDataError, match=r"codec: expected a CodecSpec for a dct field"):
        FieldSpec("image", "dct", (1, 8, 8), "float32")
    with pytest.raises(DctDataError, match=r"codec: expected None for a array field"):
        FieldSpec("m", "array", (1, 8, 8), "uint8", CodecSpec(cf=2, height=8, width=8))
    with pytest.raises(DctDataError, match=r"shape: expected a tuple of positive ints"):
        FieldSpec("m", "array", (0, 8), "uint8")
    with pytest.raises(DctDataError, match=r"expected a numeric dtype for a dct field"):
        FieldSpec("image", "dct", (1, 8, 8), "bool", CodecSpec(cf=2, height=8, width=8))
    with pytest.raises(DctDataError, match=r"field: expected a field name; this dataset has 3 fields"):
        manifest().field()
    with pytest.raises(DctDataError, match=r"this dataset has 0 nope fields \[\]"):
        manifest().field(kind="nope")


def test_golden_v1_reads_bit_exactly():
    """The committed v1 dataset: stored values equal what the generator encodes to, bit for bit."""
    src = golden_source()
    ds = dctdata.open_dataset(GOLDEN, as_dict=True)
    m = ds.manifest
    assert m.version == 1 and m.samples == 6 and m.names == ("image", "mask", "label")
    f = m.field("image")
    assert f.codec.dtype == "int8" and f.codec.cf == 3 and f.stored_shape == (2, 2, 9, 2)
    expected_q, overflow = dctdata.encode(torch.from_numpy(src["image"]), f.codec)
    assert overflow == m.stats["image"].overflow
    got = ds.__getitems__(range(6))
    assert torch.equal(torch.stack([s["image"] for s in got]), expected_q)
    assert np.array_equal(torch.stack([s["mask"] for s in got]).numpy(), src["mask"])
    assert [int(s["label"]) for s in got] == src["label"].tolist()
    x_hat = ds.decompressor()(expected_q)
    scores = dctdata.codec.metrics.psnr(torch.from_numpy(src["image"]), x_hat, dims=3)
    assert float(scores.min()) == pytest.approx(m.stats["image"].psnr_min, abs=1e-6)
    from dctdata.verify import verify_dataset

    problems, summary = verify_dataset(GOLDEN)
    assert problems == [] and summary["decoded"] == 6


if __name__ == "__main__" and sys.argv[1:] == ["regen"]:  # pragma: no cover
    regen()


def test_to_tensor_keeps_scalar_labels_zero_dimensional():
    from dctdata.format import FieldSpec

    label = FieldSpec(name="label", kind="label", shape=(), dtype="int64")
    t = label.to_tensor(np.int64(7))
    assert t.shape == () and int(t) == 7
    batch = label.to_tensor(np.arange(4, dtype=np.int64))
    assert batch.shape == (4,)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12, dtype=np.int8).reshape(3, 4),
        np.zeros((1, 2, 3, 4), np.float16),
        np.array(7, np.int64),
        np.arange(5, dtype=">u2"),
        np.ones((2, 3), np.float32, order="F"),
        np.array([True, False]),
    ],
)
def test_decode_npy_reads_what_numpy_writes(arr):
    import io

    from dctdata.format.npy import decode_npy

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    out = decode_npy(buf.getvalue(), "x")
    # values as numpy wrote them, in native byte order (issue 16 D5: torch refuses big-endian arrays)
    assert out.dtype == arr.dtype.newbyteorder("=") and out.dtype.isnative
    assert out.shape == arr.shape and out.flags.writeable
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda b: b"PK" + b[2:], r"x: expected \.npy bytes\. Got no \.npy magic"),
        (lambda b: b[:-1], r"x: expected 24 data bytes for int32 \(2, 3\)\. Got 23"),
        (lambda b: b[:6] + bytes([9]) + b[7:], r"x: expected \.npy format version 1, 2 or 3\. Got 9"),
        (
            lambda b: b.replace(b"'shape': (2, 3)", b"'shape': ((((2))))"),
            r"x: expected a numeric \.npy header as numpy writes it",
        ),
        (lambda b: b.replace(b"<i4", b"<U4"), r"x: expected a numeric \.npy header"),
    ],
)
def test_decode_npy_is_strict_and_never_uses_ast(monkeypatch, mutate, msg):
    """Untrusted headers never reach ast.literal_eval (CPython 3.11's AST recursion bug, gh-106905)."""
    import ast
    import io

    from dctdata.errors import IntegrityError
    from dctdata.format.npy import decode_npy

    def no_ast(*args, **kwargs):
        raise AssertionError("ast.literal_eval must not be used on untrusted .npy headers")

    monkeypatch.setattr(ast, "literal_eval", no_ast)
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype="<i4").reshape(2, 3), allow_pickle=False)
    np.testing.assert_array_equal(decode_npy(buf.getvalue(), "x"), np.arange(6).reshape(2, 3))
    with pytest.raises(IntegrityError, match=msg):
        decode_npy(mutate(buf.getvalue()), "x")


# Format version 2: validity masks, source metadata, per-channel figures --------------------------
def manifest_v2(**kw):
    from dctdata.format import ChannelStats
    from dctdata.format.coords import encode_coord

    fields = (
        FieldSpec(
            "image",
            "dct",
            (2, 11, 13),
            "float32",
            spec(),
            valid="image_valid",
            attrs={"units": "K", "dims": ["lat", "lon"]},
        ),
        FieldSpec("image_valid", "array", (2, 11, 13), "bool"),
    )
    times = np.datetime64("2020-01-01T00", "ns") + np.arange(6) * np.timedelta64(6, "h")
    ch = ChannelStats(30.0, 31.0, 30.5, 0.25)
    args = dict(
        storage="zarr",
        samples=6,
        fields=fields,
        stats={"image": FieldStats(30.0, 31.0, 0.25, 0, 30.5, (ch, ch), 0.75)},
        coords={
            "time": encode_coord(times, "time", True, {"calendar": "proleptic_gregorian"}),
            "lat": encode_coord(np.array([1.5, np.nan, np.inf], np.float32), "lat", False),
            "lead": encode_coord(np.arange(3).astype("timedelta64[h]"), "lead", False),
            "name": encode_coord(np.array(["a", "b"]), "name", False),
        },
    )
    args.update(kw)
    return Manifest(**args)


def test_v2_round_trip_and_coordinates(tmp_path):
    from dctdata.format.coords import decode_coord

    m = manifest_v2()
    write_manifest(m, tmp_path)
    back = read_manifest(tmp_path)
    assert back == m and back.version == FORMAT_VERSION
    assert back.field("image").valid == "image_valid" and back.field("image").attrs["units"] == "K"
    assert back.stats["image"].channels[1].psnr_dataset == 30.5 and back.stats["image"].valid_fraction == 0.75
    t = decode_coord(back.coords["time"])
    assert t.dtype == np.dtype("datetime64[ns]") and t[1] == np.datetime64("2020-01-01T06", "ns")
    lat = decode_coord(back.coords["lat"])
    assert lat.dtype == np.float32 and lat[0] == 1.5 and np.isnan(lat[1]) and lat[2] == np.inf
    assert decode_coord(back.coords["lead"]).tolist() == np.arange(3).astype("timedelta64[h]").tolist()
    assert decode_coord(back.coords["name"]).tolist() == ["a", "b"]


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["fields"][0].update(valid="nope"), r"field 'image': valid: expected one of the fields"),
        (
            lambda d: d["fields"][1].update(dtype="float32"),
            r"valid field 'image_valid': expected an array field of bool",
        ),
        (lambda d: d["fields"][1].update(shape=[3, 11, 13]), r"valid field 'image_valid': expected a per-sample shape"),
        (lambda d: d["fields"][1].update(valid="image"), r"field 'image_valid': valid: expected None for a array"),
        (lambda d: d["fields"][0].update(attrs={"units": float("nan")}), r"attrs\.units: expected finite numbers|JSON"),
        (lambda d: d["coords"]["time"]["values"].pop(), r"coords\['time'\]: values: expected one per sample \(6\)"),
        (lambda d: d["coords"]["time"].update(dtype="object"), r"coords\['time'\]: dtype: expected a numeric"),
        (
            lambda d: d["coords"]["lat"]["values"].__setitem__(0, "x"),
            r"coords\['lat'\]: values\[0\]: expected a float32",
        ),
        (lambda d: d["coords"]["time"]["values"].__setitem__(0, "yesterday"), r"coords\['time'\]: values: expected"),
        (lambda d: d["coords"].update(x=[]), r"coords\['x'\]: expected a JSON object"),
        (lambda d: d["stats"]["image"].update(valid_fraction=2), r"valid_fraction: expected a number in 0\.\.1"),
        (lambda d: d["stats"]["image"]["channels"][0].pop("psnr_dataset"), r"channels\[0\]: expected keys"),
        # a version 1 manifest has none of the version 2 keys
        (lambda d: (d.pop("seal"), d.update(version=1)), r"expected keys .*Got unknown keys \['coords'\]"),
        (
            lambda d: (d.pop("seal"), d.pop("coords"), d.update(version=1)),
            r"fields\[0\]: expected keys .*Got unknown keys \['attrs', 'valid'\]",
        ),
        (
            lambda d: (
                d.pop("seal"),
                d.pop("coords"),
                d["fields"][0].pop("valid"),
                d["fields"][0].pop("attrs"),
                d.update(full_v8(d, "manifest"), version=1),  # version 8's compact entries filled back
            ),
            r"stats\['image'\]: expected keys .*Got unknown keys \['channels', 'psnr_dataset', 'valid_fraction'\]",
        ),
    ],
)
def test_v2_strict_validation(tmp_path, edit, match):
    d = manifest_v2().to_dict()
    edit(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=match):
        read_manifest(tmp_path)


def test_datasets_return_coords_attrs_and_masks(tmp_path):
    x = np.random.default_rng(0).random((5, 2, 8, 8)).astype(np.float32)
    x[1, :, :2] = np.nan
    for fmt in ("zarr", "webdataset"):
        with dctdata.Writer(tmp_path / fmt, format=fmt, nan="mask", cf=8, attrs={"image": {"units": "K"}},
                            coords={"time": np.arange(5).astype("datetime64[D]")}) as w:  # fmt: skip
            for s in x:
                w.write(s)
        ds = dctdata.open_dataset(tmp_path / fmt, as_dict=True)
        assert ds.attrs() == {"units": "K"} and ds.attrs("image_valid") == {} and ds.valid_field() == "image_valid"
        assert ds.coords["time"].tolist() == np.arange(5).astype("datetime64[D]").tolist()
        got = {int(s["image_valid"].sum()) for s in ds}
        assert got == {2 * 64, 2 * 48}
    assert read_manifest(GOLDEN).coords == {} and dctdata.open_dataset(GOLDEN).coords == {}  # version 1 reads


# Compact manifests: figures to 6 significant digits, one-channel `channels` and default `pack` entries left out
def manifest_one_channel(**kw):
    from dctdata.format import ChannelStats

    one = CodecSpec(cf=3, height=11, width=13, channels=1, dtype="bfloat16")
    fields = (FieldSpec("image", "dct", (1, 11, 13), "float32", one), FieldSpec("label", "label", (), "int64"))
    stats = {"image": FieldStats(35.1468, 36.0, 0.25, 0, 35.5, (ChannelStats(35.1468, 36.0, 35.5, 0.25),))}
    args = dict(storage="zarr", samples=6, fields=fields, stats=stats, pack={"source": "x.npy", "target_psnr": 35.0})
    args.update(kw)
    return Manifest(**args)


def test_compact_manifest_round_trips_and_fills_defaults(tmp_path):
    from dctdata.format.manifest import PACK_DEFAULTS

    m = manifest_one_channel()
    d = json.loads(m.to_json())
    assert d["pack"] == {"source": "x.npy", "target_psnr": 35.0}  # defaults left out
    assert "channels" not in d["stats"]["image"]  # it only repeats the field's figures
    write_manifest(m, tmp_path)
    back = read_manifest(tmp_path)
    assert back == m
    assert back.pack == {**PACK_DEFAULTS, "source": "x.npy", "target_psnr": 35.0}
    assert back.pack["nan"] == "error" and back.pack["channels_last"] is False and back.pack["valid"] == {}
    (ch,) = back.stats["image"].channels
    assert (ch.psnr_min, ch.psnr_median, ch.psnr_dataset, ch.max_abs_error) == (35.1468, 36.0, 35.5, 0.25)
    # a setting away from its default is written
    d = json.loads(manifest_one_channel(pack={"source": "x.npy", "nan": "zero", "cf": 4}).to_json())
    assert d["pack"] == {"source": "x.npy", "nan": "zero", "cf": 4}


def test_older_form_manifest_still_reads(tmp_path):
    """A version 2 manifest as packs before the compact form wrote it (every pack entry, the one-channel
    `channels` list, full-precision figures) reads to the same manifest."""
    from dctdata.format.manifest import PACK_DEFAULTS

    m = manifest_one_channel()
    d = json.loads(m.to_json())
    d["pack"] = {**PACK_DEFAULTS, **d["pack"]}
    d["stats"]["image"]["channels"] = [
        {"psnr_min": 35.1468, "psnr_median": 36.0, "psnr_dataset": 35.5, "max_abs_error": 0.25}
    ]
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    assert read_manifest(tmp_path) == m
    d["stats"]["image"]["psnr_min"] = 35.146764592772236  # full precision is kept as written
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    assert read_manifest(tmp_path).stats["image"].psnr_min == 35.146764592772236


def test_channels_kept_when_they_say_more():
    from dctdata.format import ChannelStats

    # two channels (manifest_v2), or one channel whose figures differ from the field's: written out
    assert len(manifest_v2().to_dict()["stats"]["image"]["channels"]) == 2
    odd = {"image": FieldStats(35.0, 36.0, 0.25, 0, 35.5, (ChannelStats(34.0, 36.0, 35.5, 0.25),))}
    d = manifest_one_channel(stats=odd).to_dict()
    assert d["stats"]["image"]["channels"] == [
        {"psnr_min": 34.0, "psnr_median": 36.0, "psnr_dataset": 35.5, "max_abs_error": 0.25}
    ]
    # a field without figures per channel (a label, or a version 1 manifest) gets none filled in
    back = Manifest.from_dict(manifest_one_channel(stats={"label": FieldStats(math.inf, math.inf, 0.0, 0)}).to_dict())
    assert back.stats["label"].channels is None


def test_pack_entry_must_be_an_object(tmp_path):
    d = manifest_one_channel().to_dict()
    d["pack"] = ["cf", 4]
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"pack: expected a mapping\. Got list"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    "v, nearest, down, up",
    [
        (35.146764592772236, 35.1468, 35.1467, 35.1468),
        (45.48032595287127, 45.4803, 45.4803, 45.4804),
        (1.234567e-9, 1.23457e-9, 1.23456e-9, 1.23457e-9),
        (1e300, 1e300, 1e300, 1.00001e300),  # the float 1e300 is a little above 10**300
        (35.0, 35.0, 35.0, 35.0),
    ],
)
def test_figures_keep_six_significant_digits(v, nearest, down, up):
    """PSNRs are kept rounded down and errors up: a figure never claims more than the pack achieved."""
    from dctdata.format.manifest import figure

    assert (figure(v), figure(v, "down"), figure(v, "up")) == (nearest, down, up)
    assert figure(v, "down") <= v <= figure(v, "up")
    assert figure(None) is None and figure(math.inf) == math.inf and math.isnan(figure(math.nan))


def test_a_pack_writes_the_compact_form(tmp_path):
    x = np.random.default_rng(0).random((3, 1, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    m = dctdata.pack(str(tmp_path / "x.npy"), str(tmp_path / "p"), target_psnr=35, quiet=True)
    d = json.loads((tmp_path / "p" / "manifest.json").read_text())
    s = d["stats"][m.names[0]]
    assert "channels" not in s and len(m.stats[m.names[0]].channels) == 1
    assert all(len(repr(s[k]).replace(".", "").lstrip("0")) <= 6 for k in ("psnr_min", "psnr_median", "psnr_dataset"))
    assert set(d["pack"]) == {"source", "target_psnr"}
    assert read_manifest(tmp_path / "p") == m
    # the zarr.json files carry only what zarr v3 requires or what differs from its defaults
    group = json.loads((tmp_path / "p" / "zarr.json").read_text())
    array = json.loads((tmp_path / "p" / m.names[0] / "zarr.json").read_text())
    assert group == {"zarr_format": 3, "node_type": "group"}
    assert "attributes" not in array and all(
        "index_location" not in c.get("configuration", {}) for c in array["codecs"]
    )


# Version 3: what the manifest can derive (side partners, zarr paths, webdataset shard checksums) is left out
def manifest_v3(storage="zarr", **kw):
    from dctdata.format.fields import side_field

    one = CodecSpec(cf=3, height=11, width=13, channels=1, dtype="bfloat16", side="range_mid")
    image = FieldSpec("image", "dct", (1, 11, 13), "float32", one)
    fields = (image, side_field(image), FieldSpec("label", "label", (), "int64"))
    digest = {"sha256": "a" * 64, "bytes": 10240}
    if storage == "zarr":
        layout = {"arrays": {f.name: {"path": f.name, "chunk": 2, "shard": 6} for f in fields}}
        checksums = {f"{f.name}/c.0{'.0' * len(f.stored_shape)}": digest for f in fields}
    else:
        layout = {"shards": [{"name": "shard-000000.tar", "samples": 6, **digest}], "max_shard_size": 1 << 28}
        checksums = {"shard-000000.tar": digest}
    args = dict(storage=storage, samples=6, fields=fields, layout=layout, checksums=checksums)
    args.update(kw)
    return Manifest(**args)


@pytest.mark.parametrize("storage", ["zarr", "webdataset"])
def test_v3_leaves_out_what_it_derives_and_reads_it_back(tmp_path, storage):
    m = manifest_v3(storage)
    assert m.version == FORMAT_VERSION >= 3 and [f.name for f in m.fields] == ["image", "image__side", "label"]
    d = json.loads(m.to_json())
    assert [f["name"] for f in d["fields"]] == ["image", "label"]  # the side partner is derived
    if storage == "zarr":
        assert d["layout"]["arrays"]["image"] == {"chunk": 2, "shard": 6}
    else:
        assert d["layout"]["shards"] == [{"name": "shard-000000.tar", "samples": 6}]
    write_manifest(m, tmp_path)
    back = read_manifest(tmp_path)
    assert back == m and back.to_dict() == d
    assert back.field("image__side").shape == (1, 2) and back.names == ("image", "label")


@pytest.mark.parametrize("storage", ["zarr", "webdataset"])
def test_older_and_explicit_forms_still_read(tmp_path, storage):
    """A version 2 manifest (full form, as packs before version 3 wrote it), and a version 3 one that lists
    what it could leave out, read to the same manifest."""
    m = manifest_v3(storage)
    full = manifest_v3(storage, version=2).to_dict()
    assert [f["name"] for f in full["fields"]] == ["image", "image__side", "label"]
    for d, version in ((full, 2), (dict(full, version=3), 3)):
        (tmp_path / "manifest.json").write_text(json.dumps(d))
        assert read_manifest(tmp_path) == dataclasses.replace(m, version=version)


def test_v3_keeps_what_differs_and_refuses_a_wrong_partner(tmp_path):
    d = manifest_v3("webdataset").to_dict()
    d["layout"]["shards"][0]["sha256"] = "b" * 64  # not what the checksums say: written, and kept
    d["seal"] = manifest_seal(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    back = read_manifest(tmp_path)
    assert back.layout["shards"][0] == {"name": "shard-000000.tar", "samples": 6, "sha256": "b" * 64, "bytes": 10240}
    assert json.loads(back.to_json())["layout"]["shards"][0] == {
        "name": "shard-000000.tar",
        "samples": 6,
        "sha256": "b" * 64,
    }
    d = manifest_v3().to_dict()
    d["fields"].insert(1, {**d["fields"][1], "name": "image__side", "shape": [3, 2], "kind": "array", "codec": None})
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"expected the side partner 'image__side' .*Got none or another shape"):
        read_manifest(tmp_path)


def test_v3_shard_without_a_checksum_is_named(tmp_path):
    from dctdata.format.webdataset.layout import shard_list

    d = manifest_v3("webdataset").to_dict()
    d["layout"]["shards"][0]["name"] = "other.tar"  # no checksum entry to take its sha256 and bytes from
    d["seal"] = manifest_seal(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(FormatError, match=r"layout\.shards\[0\]: expected .*checksums of 'other\.tar'\)\. Got"):
        shard_list(read_manifest(tmp_path), "m")
