"""`dctdata pack` through the CLI: round trip for every source kind and every bad-input error path."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch
from sample_fields import files
from sample_fields import poisson_fields as fields

import dctdata
import dctdata.codec.metrics
from dctdata.cli import main


def run(args, capsys):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def leftovers(parent):
    return [p for p in os.listdir(parent) if p.startswith(".")]


def decoded(ds, field):
    layer = ds.decompressor(field)
    coeffs = ds[0 : len(ds)][ds.manifest.names.index(field)]
    return layer(coeffs).numpy()


def check_close(x, y, tol=1e-3):
    assert x.shape == y.shape
    np.testing.assert_allclose(x, y, atol=tol * (np.abs(x).max() + 1))


# Round trips ---------------------------------------------------------------------------------------
def test_npy_non_square_non_multiple_of_8(tmp_path, capsys):
    x = fields(7, 1, 13, 21)[:, 0]  # (N, H, W): 2-D samples
    np.save(tmp_path / "x.npy", x)
    rc, _out, err = run(["pack", tmp_path / "x.npy", tmp_path / "out", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    ds = dctdata.open_dataset(tmp_path / "out")
    assert len(ds) == 7 and ds.manifest.field("image").shape == (1, 13, 21)
    check_close(decoded(ds, "image")[:, 0], x)


def test_npz_multichannel_with_lossless_mask_and_labels(tmp_path, capsys):
    x = fields(11, 3, 20, 9, seed=1)
    mask = (x[:, :1] > 20).astype(np.uint8)
    target = x[:, 0] * 0.5  # float array target stored exactly
    labels = np.arange(11) % 4
    np.savez(tmp_path / "d.npz", image=x, mask=mask, target=target, label=labels)
    rc, _, err = run(
        ["pack", tmp_path / "d.npz", tmp_path / "out", "--cf", "4", "--field", "target=array", "--quiet"], capsys
    )
    assert rc == 0, err  # with a lossy setting (--cf) an integer mask of two values stays exact (FEW_VALUES)
    ds = dctdata.open_dataset(tmp_path / "out", as_dict=True)
    kinds = {f.name: f.kind for f in ds.manifest.fields}
    assert kinds == {"image": "dct", "mask": "array", "target": "array", "label": "label"}
    for i in range(11):
        s = ds[i]
        assert s["mask"].dtype == torch.uint8 and np.array_equal(s["mask"].numpy(), mask[i])  # bit-exact
        assert np.array_equal(s["target"].numpy(), target[i])
        assert int(s["label"]) == labels[i]
    img = ds.decompressor()(ds[0:11]["image"])
    assert img.shape == (11, 3, 20, 9)
    scores = dctdata.codec.metrics.psnr(torch.from_numpy(x), img, dims=2)  # an item: one channel of one sample
    assert float(scores.min()) == pytest.approx(ds.manifest.stats["image"].psnr_min, abs=1e-3)


def test_dir_of_npy_and_npz(tmp_path, capsys):
    x = fields(5, 2, 10, 17, seed=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for i in range(5):
        np.save(tmp_path / "a" / f"{i:03d}.npy", x[i])
        np.savez(tmp_path / "b" / f"{i:03d}.npz", field=x[i], cls=np.int64(i % 2))
    assert run(["pack", tmp_path / "a", tmp_path / "oa", "--cf", "8", "--quiet"], capsys)[0] == 0
    assert run(["pack", tmp_path / "b", tmp_path / "ob", "--cf", "8", "--quiet"], capsys)[0] == 0
    da, db = dctdata.open_dataset(tmp_path / "oa"), dctdata.open_dataset(tmp_path / "ob")
    check_close(decoded(da, "image"), x)
    check_close(decoded(db, "field"), x)
    assert [int(db[i][1]) for i in range(5)] == [i % 2 for i in range(5)]


def test_hdf5_channels_last_and_key(tmp_path, capsys):
    import h5py

    x = fields(6, 1, 24, 16, seed=3)
    with h5py.File(tmp_path / "d.h5", "w") as fh:
        fh["images"] = np.moveaxis(x, 1, -1)  # (N, H, W, 1) like em_graphene_sim
        fh["grp/other"] = np.arange(6, dtype=np.int32)
        fh["ignored"] = np.zeros((3,))  # different length, not picked
    rc, _, err = run(
        [
            "pack",
            tmp_path / "d.h5",
            tmp_path / "out",
            *["--key", "images,grp/other", "--channels-last", "--cf", "8", "--quiet"],
        ],
        capsys,
    )
    assert rc == 0, err
    ds = dctdata.open_dataset(tmp_path / "out")
    assert ds.manifest.names == ("images", "grp_other")
    check_close(decoded(ds, "images"), x)
    assert [int(ds[i][1]) for i in range(6)] == list(range(6))


def test_image_folder_8_and_16_bit_with_classes(tmp_path, capsys):
    from PIL import Image

    x = fields(6, 1, 19, 23, seed=4)[:, 0]
    for cls in ("cat", "dog"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
    files = []
    for i in range(6):
        cls = "cat" if i < 3 else "dog"
        arr16 = (x[i] * 1000).astype(np.uint16)
        path = tmp_path / "imgs" / cls / f"{i}.png"
        Image.fromarray(arr16).save(path)
        files.append(arr16)
    rc, _, err = run(["pack", tmp_path / "imgs", tmp_path / "out", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    ds = dctdata.open_dataset(tmp_path / "out")
    assert ds.manifest.field("image").dtype == "uint16"
    assert ds.manifest.pack["source_info"] == {"classes": ["cat", "dog"]}
    check_close(decoded(ds, "image")[:, 0], np.stack(files).astype(np.float32))
    assert [int(ds[i][1]) for i in range(6)] == [0, 0, 0, 1, 1, 1]

    # 8-bit RGB JPEG + TIFF, no class folders; lossless option: --field image=array keeps bytes exact
    (tmp_path / "rgb").mkdir()
    rgb = (np.moveaxis(fields(2, 3, 16, 12, seed=5), 1, -1) * 4).clip(0, 255).astype(np.uint8)
    Image.fromarray(rgb[0]).save(tmp_path / "rgb" / "0.tif")
    Image.fromarray(rgb[1]).save(tmp_path / "rgb" / "1.tiff")
    rc, _, err = run(["pack", tmp_path / "rgb", tmp_path / "o2", "--field", "image=array", "--quiet"], capsys)
    assert rc == 0, err
    d2 = dctdata.open_dataset(tmp_path / "o2")
    assert np.array_equal(d2[1][0].numpy(), np.moveaxis(rgb[1], -1, 0))
    (tmp_path / "jpg").mkdir()
    Image.fromarray(rgb[0]).save(tmp_path / "jpg" / "0.jpg", quality=95)
    rc, _, err = run(["pack", tmp_path / "jpg", tmp_path / "o3", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    jpeg = np.moveaxis(np.asarray(Image.open(tmp_path / "jpg" / "0.jpg")), -1, 0).astype(np.float32)
    check_close(decoded(dctdata.open_dataset(tmp_path / "o3"), "image")[0], jpeg)


def test_module_callable_and_torchvision(tmp_path, capsys, monkeypatch):
    (tmp_path / "mydata.py").write_text(
        "import numpy as np, torch\n"
        "from torchvision.datasets import FakeData\n"
        "class DS:\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i):\n"
        "        g = torch.Generator().manual_seed(i)\n"
        "        return {'u': torch.rand(2, 9, 14, generator=g), 'y': i * 10}\n"
        "def make(): return DS()\n"
        "def fake(): return FakeData(size=5, image_size=(3, 12, 20), num_classes=3)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, _, err = run(["pack", "mydata:make", tmp_path / "out", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    ds = dctdata.open_dataset(tmp_path / "out", as_dict=True)
    import mydata

    ref = np.stack([mydata.DS()[i]["u"].numpy() for i in range(4)])
    layer = ds.decompressor("u")
    check_close(layer(ds[0:4]["u"]).numpy(), ref)
    assert [int(ds[i]["y"]) for i in range(4)] == [0, 10, 20, 30]

    rc, _, err = run(["pack", "mydata:fake", tmp_path / "tv", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    tv = dctdata.open_dataset(tmp_path / "tv")
    fake = mydata.fake()
    assert tv.manifest.field("image").kind == "dct" and tv.manifest.field("image").shape == (3, 12, 20)
    assert [int(tv[i][1]) for i in range(5)] == [int(fake[i][1]) for i in range(5)]
    img0 = np.moveaxis(np.asarray(fake[0][0]), -1, 0).astype(np.float32)
    check_close(decoded(tv, "image")[0], img0)


def test_info_and_summary(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(4, 1, 16, 16))
    rc, out, _ = run(["pack", tmp_path / "x.npy", tmp_path / "out", "--cf", "3"], capsys)
    assert rc == 0 and "PSNR min" in out
    m = dctdata.format.read_manifest(tmp_path / "out")
    stored, f32 = disk_bytes(tmp_path / "out"), 4 * 4 * 16 * 16
    assert (
        f"({m.storage}, {len(m.checksums)} files): stored {stored / 1e6:.3f} MB (every file, the manifest included), "
        f"ratio {f32 / stored:.2f}x vs " in out
    )
    assert f"transfer ratio {64 / 9:.2f}x" in out
    rc, out, _ = run(["info", tmp_path / "out"], capsys)
    assert rc == 0
    assert "| image | dct | [1, 16, 16] | float32 |" in out and "cf=3 square float32" in out
    assert f"{m.stats['image'].psnr_min:.2f}" in out


def disk_bytes(root) -> int:
    return sum(len(b) for b in files(root).values())


def printed_ratios(text: str) -> tuple[float, float]:
    import re

    got = re.search(r"ratio ([0-9.]+)x vs float32 and ([0-9.]+)x vs the source", text)
    assert got, text
    return float(got[1]), float(got[2])


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
def test_summary_and_info_ratios_count_every_byte_on_disk(tmp_path, capsys, fmt, masked):
    """Pack's summary and info print the same ratios: the source's bytes over every byte on disk (manifest and
    zarr.json included); a validity mask the pack made is not source data (it counted as float32 data: 69.0x
    printed where the source over the pack was 33.4x)."""
    x = fields(12, 1, 32, 32)
    if masked:
        x[:, :, :6, :10] = np.nan
    np.save(tmp_path / "x.npy", x)
    args = ["--format", fmt, "--quant", "int8"] + (["--nan", "mask"] if masked else [])
    rc, out, err = run(["pack", tmp_path / "x.npy", tmp_path / "out", *args], capsys)
    assert rc == 0, err
    want = x.nbytes / disk_bytes(tmp_path / "out")  # float32 source: the two ratios are one
    assert printed_ratios(out) == (round(want, 2), round(want, 2))
    rc, info, _ = run(["info", tmp_path / "out"], capsys)
    assert rc == 0 and printed_ratios(info) == printed_ratios(out)
    assert f"stored: {disk_bytes(tmp_path / 'out') / 1e6:.3f} MB" in info and f"({x.nbytes / 1e6:.3f} MB)" in info
    if masked:
        mask_row = next(line for line in info.splitlines() if line.startswith("| image_valid |"))
        assert [c.strip() for c in mask_row.strip("|").split("|")][8:10] == ["-", "-"]  # no ratio: not source data


def test_pack_summary_names_the_shards_and_info_gives_labels_no_ratios(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", image=fields(32, 1, 16, 16), label=np.arange(32))
    rc, out, _ = run(["pack", tmp_path / "d.npz", tmp_path / "w", "--format", "webdataset", "--quant", "int8"], capsys)
    assert rc == 0
    assert "packed 32 samples into" in out and "(webdataset, 16 shards): stored " in out and "x vs the source" in out
    rc, out, _ = run(["pack", tmp_path / "d.npz", tmp_path / "z", "--quant", "int8"], capsys)
    rc, out, _ = run(["info", tmp_path / "z"], capsys)
    label_row = next(line for line in out.splitlines() if line.startswith("| label |"))
    cells = [c.strip() for c in label_row.strip("|").split("|")]
    assert cells[8:11] == ["-", "-", "-"]  # ratios vs float32 and source, transfer ratio: meaningless for labels
    assert cells[6] == "zstd-9"  # info names each field's lossless stage (issue 31)
    image_row = next(line for line in out.splitlines() if line.startswith("| image |"))
    assert float(image_row.split("|")[9]) > 1  # the dct field keeps its ratios
    assert image_row.split("|")[7].strip() in ("dctdata_ctxrans", "zstd-19")


def test_debug_does_not_flood_with_pil_tiff_tags(tmp_path, capsys, caplog):
    from PIL import Image

    (tmp_path / "tif").mkdir()
    for i in range(2):
        Image.fromarray((fields(1, 1, 16, 16, seed=i)[0, 0] * 100).astype(np.uint16)).save(
            tmp_path / "tif" / f"{i}.tif"
        )
    with caplog.at_level("DEBUG"):
        rc, _, err = run(
            # one process: caplog sees this process's records (forked workers log to the same stderr, not to it)
            [
                "--debug",
                "pack",
                tmp_path / "tif",
                tmp_path / "out",
                "--cf",
                "8",
                "--format",
                "webdataset",
                "--quiet",
                "--workers",
                "1",
            ],
            capsys,
        )
    assert rc == 0, err
    assert not [r for r in caplog.records if r.name.startswith("PIL")]
    assert any(r.name.startswith("dctdata") and r.levelname == "DEBUG" for r in caplog.records)  # ours still show


def test_nan_fill_is_explicit(tmp_path, capsys):
    x = fields(3, 1, 8, 8)
    x[1, 0, 2, 3] = np.nan
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(["pack", tmp_path / "x.npy", tmp_path / "out", "--nan", "fill=20", "--cf", "8", "--quiet"], capsys)
    assert rc == 0, err
    m = dctdata.format.read_manifest(tmp_path / "out")
    assert m.pack["nan_filled"] == 1 and m.pack["nan"] == "fill=20.0"


def test_overwrite_replaces_only_when_complete(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(3, 1, 8, 8))
    assert run(["pack", tmp_path / "x.npy", tmp_path / "out", "--quiet"], capsys)[0] == 0
    np.save(tmp_path / "y.npy", fields(5, 1, 8, 8))
    assert run(["pack", tmp_path / "y.npy", tmp_path / "out", "--overwrite", "--quiet"], capsys)[0] == 0
    assert len(dctdata.open_dataset(tmp_path / "out")) == 5
    assert leftovers(tmp_path) == []


# Bad input -----------------------------------------------------------------------------------------
def _bad(tmp_path, capsys, args, match):
    out = tmp_path / "out"
    rc, _stdout, err = run(
        ["pack", *args, out] if "OUT_GIVEN" not in args else ["pack", *[a for a in args if a != "OUT_GIVEN"]], capsys
    )
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    import re

    assert re.search(match, lines[0]), lines[0]
    return out


def test_missing_source(tmp_path, capsys):
    out = _bad(tmp_path, capsys, [tmp_path / "nope.npy"], r"nope\.npy: expected an existing file")
    assert not out.exists() and leftovers(tmp_path) == []


def test_truncated_npy(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(4, 1, 8, 8))
    raw = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(raw[:-100])
    out = _bad(tmp_path, capsys, [tmp_path / "x.npy"], r"x\.npy: expected \d+ bytes .* \(truncated file\)")
    assert not out.exists() and leftovers(tmp_path) == []


def test_truncated_npz_and_unreadable_image(tmp_path, capsys):
    np.savez(tmp_path / "d.npz", image=fields(4, 1, 8, 8))
    raw = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(raw[: len(raw) // 2])
    _bad(tmp_path, capsys, [tmp_path / "d.npz"], r"d\.npz: expected a readable \.npz")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    _bad(tmp_path, capsys, [tmp_path / "imgs"], r"0\.png: expected a readable PNG/JPEG/TIFF image")
    assert leftovers(tmp_path) == []


def test_object_pickle_arrays_are_refused(tmp_path, capsys):
    np.save(tmp_path / "o.npy", np.array([np.zeros(3), np.zeros(4)], dtype=object), allow_pickle=True)
    _bad(tmp_path, capsys, [tmp_path / "o.npy"], r"o\.npy: expected a numeric array\. Got dtype object")
    np.savez(tmp_path / "o.npz", image=np.array([{"a": 1}], dtype=object))
    _bad(tmp_path, capsys, [tmp_path / "o.npz"], r"o\.npz\[image\]: expected a numeric array")
    assert leftovers(tmp_path) == []


def test_ragged_samples_name_the_file(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    for i, shape in enumerate([(8, 8), (8, 8), (8, 9)]):
        np.save(tmp_path / "d" / f"{i}.npy", np.ones(shape, np.float32))
    _bad(tmp_path, capsys, [tmp_path / "d"], r"2\.npy: field 'image': expected shape \(8, 8\).*Got \(8, 9\) \(ragged")
    assert leftovers(tmp_path) == []


def test_ragged_across_batches(tmp_path, capsys, monkeypatch):
    import dctdata.preprocess.parts as p

    monkeypatch.setattr(p, "BATCH_BYTES", 1)  # one sample per batch
    (tmp_path / "d").mkdir()
    for i, shape in enumerate([(8, 8), (8, 8), (9, 8)]):
        np.save(tmp_path / "d" / f"{i}.npy", np.ones(shape, np.float32))
    assert main(["pack", str(tmp_path / "d"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"2\.npy: field 'image': expected (per-sample )?shape \(8, 8\)", err), err
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_inf_in_dct_field(tmp_path, capsys, bad):
    x = fields(5, 1, 8, 8)
    x[3, 0, 1, 1] = bad
    np.save(tmp_path / "x.npy", x)
    _bad(tmp_path, capsys, [tmp_path / "x.npy"], r"x\.npy sample 3: field 'image': expected finite values.*Got NaN/Inf")
    assert leftovers(tmp_path) == []


def test_cf_out_of_range(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--cf", "9"], r"cf: expected an int in 1\.\.8\. Got 9")
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--cf", "0"], r"cf: expected an int in 1\.\.8\. Got 0")


def test_unknown_format_and_source_kind(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    match = r"--format: expected one of \('zarr', 'webdataset'\)\. Got 'parquet'"
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--format", "parquet"], match)
    (tmp_path / "x.csv").write_text("1,2\n")
    _bad(tmp_path, capsys, [tmp_path / "x.csv"], r"x\.csv: expected a \.npy, \.npz.*unknown source kind")
    assert leftovers(tmp_path) == []


def test_existing_out_is_refused(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    _bad(tmp_path, capsys, [tmp_path / "x.npy"], r"out: expected an OUT path that does not exist.*--overwrite")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "make, got",
    [
        (lambda out: (out.mkdir(), (out / "keep.txt").write_text("mine")), r"Got a folder of 1 entry without a "),
        (lambda out: out.write_text("mine"), r"Got a file "),
        (
            lambda out: (out.mkdir(), (out / "manifest.json").write_text('{"format": "other"}')),
            r"Got a folder whose manifest\.json is not a dctdata manifest",
        ),
    ],
    ids=["results folder", "file", "other manifest"],
)
def test_overwrite_refuses_what_is_not_a_pack(tmp_path, capsys, make, got):
    """--overwrite replaces a dctdata pack or an empty folder only: a mistyped OUT is refused, nothing deleted."""
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    out = tmp_path / "out"
    make(out)
    before = files(out) if out.is_dir() else out.read_text()
    match = r"out: --overwrite: expected a dctdata pack \(a folder holding a dctdata manifest\.json\) or an empty "
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--overwrite"], match + r"folder to replace\. " + got + r".*nothing")
    with pytest.raises(dctdata.DctDataError, match=got):
        dctdata.Writer(out, cf=4, overwrite=True)
    assert (files(out) if out.is_dir() else out.read_text()) == before
    assert leftovers(tmp_path) == []


def test_overwrite_replaces_an_empty_folder_and_a_pack(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    (tmp_path / "out").mkdir()
    for _ in range(2):  # the empty folder, then the pack it became
        assert run(["pack", tmp_path / "x.npy", tmp_path / "out", "--overwrite", "--quiet"], capsys)[0] == 0
        assert len(dctdata.open_dataset(tmp_path / "out")) == 2


def test_overwrite_of_a_url_refuses_another_manifest(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/trust-cli-out/manifest.json", b'{"format": "something else"}')
    with pytest.raises(dctdata.DctDataError, match=r"--overwrite: expected a dctdata pack to replace\. Got a manifest"):
        dctdata.pack(fields(2, 1, 8, 8), "memory://trust-cli-out", cf=4, quiet=True, overwrite=True)
    assert fs.cat("/trust-cli-out/manifest.json") == b'{"format": "something else"}'
    fs.rm("/trust-cli-out", recursive=True)


def test_missing_parents_of_out_are_made(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    out = tmp_path / "runs" / "a" / "out"
    assert run(["pack", tmp_path / "x.npy", out, "--quiet"], capsys)[0] == 0
    assert len(dctdata.open_dataset(out)) == 2


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc (root writes any chmod-ed folder)")
def test_unwritable_out_is_named(tmp_path, capsys):
    """A virtual file system refuses the lock file a pack makes first: the error names OUT and its folder."""
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    match = r"/proc/dctdata-out: expected an OUT whose folder /proc can be written\. Got .* \(choose another OUT\)"
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "/proc/dctdata-out", "OUT_GIVEN"], match)
    with pytest.raises(dctdata.DctDataError, match=match):
        dctdata.pack(fields(2, 1, 8, 8), "/proc/dctdata-out", cf=4, quiet=True)


def test_bad_settings(tmp_path, capsys):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    match = r"--field nope: expected one of the source's fields \['image'\]"
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--field", "nope=array"], match)
    match = r"--field image: expected kind dct, array or label"
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--field", "image=jpeg"], match)
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--nan", "zero"], r"nan: expected 'error', 'mask' or 'fill=VALUE'")
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--workers", "0"], r"--workers: expected a positive int. Got 0")
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--key", "a"], r"--key: expected an HDF5 source")
    _bad(tmp_path, capsys, ["nomodule_xyz:make"], r"nomodule_xyz:make: expected an importable module:callable")
    assert leftovers(tmp_path) == []


def test_hdf5_missing_key(tmp_path, capsys):
    import h5py

    with h5py.File(tmp_path / "d.h5", "w") as fh:
        fh["a"] = np.zeros((2, 8, 8), np.float32)
    _bad(tmp_path, capsys, [tmp_path / "d.h5", "--key", "b"], r"d\.h5: --key 'b': expected one of \['a'\]")


def test_strict_overflow(tmp_path, capsys):
    x = fields(4, 1, 8, 8)
    x[3] *= 1e5  # far outside the fp16 range after the DCT
    np.save(tmp_path / "x.npy", x)
    match = r"field 'image': expected no float16 overflow \(--strict\)"
    _bad(tmp_path, capsys, [tmp_path / "x.npy", "--quant", "fp16", "--cf", "2", "--strict"], match)
    assert leftovers(tmp_path) == []
    rc, _, _ = run(["pack", tmp_path / "x.npy", tmp_path / "out", "--quant", "fp16", "--cf", "2", "--quiet"], capsys)
    assert rc == 0 and dctdata.format.read_manifest(tmp_path / "out").stats["image"].overflow > 0


def test_calibrated_int8(tmp_path, capsys):
    x = fields(12, 2, 16, 24, seed=7)
    np.save(tmp_path / "x.npy", x)
    rc, _, err = run(
        ["pack", tmp_path / "x.npy", tmp_path / "out", "--quant", "int8", "--target-psnr", "35", "--quiet"], capsys
    )
    assert rc == 0, err
    ds = dctdata.open_dataset(tmp_path / "out")
    f = ds.manifest.field("image")
    q, side = ds[0][0]
    assert f.codec.dtype == "int8" and q.dtype == torch.int8 and side.shape == (2, 2)
    got = ds.decompressor()(ds[0:12][0])
    scores = dctdata.codec.metrics.psnr(torch.from_numpy(x), got, dims=2)
    assert float(scores.min()) == pytest.approx(ds.manifest.stats["image"].psnr_min, abs=1e-3)


def test_python_api_errors_are_typed(tmp_path):
    np.save(tmp_path / "x.npy", fields(2, 1, 8, 8))
    with pytest.raises(dctdata.DctDataError, match=r"--quant: expected one of"):
        dctdata.pack(tmp_path / "x.npy", tmp_path / "o", quant="int4")
    with pytest.raises(TypeError, match=r"cf: expected an int"):
        dctdata.pack(tmp_path / "x.npy", tmp_path / "o", cf=2.5)
    with pytest.raises(dctdata.DctDataError, match=r"--target-psnr: expected a positive number"):
        dctdata.pack(tmp_path / "x.npy", tmp_path / "o", target_psnr=-3)
    assert not (tmp_path / "o").exists()


def test_small_8bit_images_calibrate_on_enough_samples_to_keep_int8_in_range(tmp_path):
    """Tiny samples: a fixed 64-sample subset missed the tails, so int8 'reached' 40 dB on the subset and
    then clamped hundreds of coefficients of unseen samples. Now the subset is sized by values, and every
    sample is coded against its own range, so int8 holds 40 dB without clamping."""
    from dctdata.datasets import cifar_like
    from dctdata.preprocess import plan as pack_mod

    ds = cifar_like(n=400, seed=3)
    src = tmp_path / "cifar.npz"
    np.savez(src, image=np.stack([ds[i]["image"] for i in range(400)]), label=np.arange(400) % 10)
    assert len(pack_mod.calibration_indices(400, 3 * 32 * 32)) == 400  # all of them fit the value budget
    assert len(pack_mod.calibration_indices(10_000, 256 * 256)) == pack_mod.CALIBRATION_SAMPLES
    for out, quant, target in (("a", "int8", 40.0), ("b", None, 40.0), ("c", "int8", 35.0)):
        manifest = dctdata.pack(
            str(src),
            str(tmp_path / out),
            fields={"image": "dct"},
            quant=quant,
            target_psnr=target,
            quiet=True,
            lossless={"id": "zstd", "level": 1},  # the subset and the clamping do not depend on the stage
        )
        stats = manifest.stats["image"]
        assert stats.overflow == 0
        assert stats.psnr_min >= target - 0.4 - 1e-3  # the per-sample floor
        # the promise (per channel, dataset-level, items = channels of samples) is kept on every channel
        assert stats.psnr_dataset >= target and all(c.psnr_dataset >= target for c in stats.channels)


# --lossless ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("option", "expected"),
    [("auto", None), ("zstd", {"id": "zstd", "level": 19}), ("zstd:3", {"id": "zstd", "level": 3})],
)
def test_lossless_option_picks_the_stage_and_reads_back(tmp_path, capsys, option, expected):
    x = fields(6, 1, 32, 40)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    rc, _, err = run(["pack", tmp_path / "x.npy", out, "--quant", "int8", "--target-psnr", "35", "--lossless", option,
                      "--quiet"], capsys)  # fmt: skip
    assert rc == 0, err
    ds = dctdata.open_dataset(out)
    stage = ds.manifest.field("image").lossless
    if expected is None:  # the default: what dctdata.pack chooses without a codec
        default = dctdata.pack(tmp_path / "x.npy", tmp_path / "py", quant="int8", target_psnr=35, quiet=True)
        assert stage == default.field("image").lossless
    else:
        assert stage == expected
    rec = decoded(ds, "image")
    psnr = dctdata.codec.metrics.psnr(torch.from_numpy(x), torch.from_numpy(rec))
    assert float(psnr.min()) > 34.0


def test_lossless_option_same_pack_as_python_codec(tmp_path, capsys):
    x = fields(4, 1, 24, 24)
    np.save(tmp_path / "x.npy", x)
    run(["pack", tmp_path / "x.npy", tmp_path / "cli", "--quant", "int8", "--cf", "4", "--lossless", "zstd:9",
         "--quiet"], capsys)  # fmt: skip
    dctdata.pack(
        tmp_path / "x.npy", tmp_path / "py", quant="int8", cf=4, lossless={"id": "zstd", "level": 9}, quiet=True
    )
    assert dctdata.open_dataset(tmp_path / "cli").manifest.field("image").lossless == {"id": "zstd", "level": 9}
    assert files(tmp_path / "cli") == files(tmp_path / "py")


def test_parse_lossless_option_types():
    from dctdata.stages import AUTO, parse_option

    assert parse_option(" auto ") == AUTO
    with pytest.raises(TypeError, match="--lossless: expected a string"):
        parse_option(9)
    for bad in ("zstd:", "zstd:0", "auto:1", "brotli", "zstd:1.5", "dctdata_ctxrans", "blosc"):
        with pytest.raises(
            dctdata.DctDataError, match=r"--lossless: expected one of: auto, zstd, zstd:LEVEL \(LEVEL in 1\.\.22\)"
        ):
            parse_option(bad)


def test_pack_summary_says_why_each_field_got_its_kind(tmp_path, capsys):
    """Issue 31: with a target an int16 field is dct and a 0/1 mask stays exact, and the summary says why."""
    rng = np.random.default_rng(0)
    dem = (rng.standard_normal((16, 32, 32)).cumsum(-1) * 50).astype(np.int16)
    np.savez(tmp_path / "d.npz", image=dem, mask=(dem > 0).astype(np.uint8), label=np.arange(16))
    rc, out, err = run(["pack", tmp_path / "d.npz", tmp_path / "out", "--target-psnr", "40"], capsys)
    assert rc == 0, err
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert lines["image"].startswith(
        "  image: dct [1, 32, 32] int16 (int16 samples of 2-D with a lossy setting (--field image=array keeps them "
        "exact)) cf="
    )
    assert lines["mask"] == (
        "  mask: array [32, 32] uint8 (uint8 samples holding 2 distinct values on the calibration subset (a mask or "
        "label map), stored exactly (--field mask=dct codes them))"
    )
    assert lines["label"] == "  label: label [] int64 (one integer per sample)"


# Defaults that keep a promise (issue 45) ---------------------------------------------------------------------------
def test_no_fidelity_flag_float_gets_the_default_target_and_says_so(tmp_path, capsys):
    """`dctdata pack x.npy out` with no flag: float fields are calibrated to the documented default target (it
    stored cf=4 float32: 33 dB on smooth fields, 25 dB on the worst sample, no promise), and the summary says so."""
    from dctdata.preprocess.plan import DEFAULT_TARGET_PSNR

    np.save(tmp_path / "x.npy", fields(24, 1, 32, 32))
    rc, out, err = run(["pack", tmp_path / "x.npy", tmp_path / "out"], capsys)
    assert rc == 0, err
    m = dctdata.format.read_manifest(tmp_path / "out")
    floor = m.field("image").codec.min_psnr
    assert m.pack["default_target_psnr"] == DEFAULT_TARGET_PSNR == 40
    assert m.stats["image"].psnr_dataset >= DEFAULT_TARGET_PSNR and m.stats["image"].psnr_min >= floor
    assert f"  no fidelity flag: default target 40 dB for image (per-sample floor image {floor:.2f} dB)" in out
    rc, info, _ = run(["info", tmp_path / "out"], capsys)
    assert "default_target_psnr=40.0" in info
    rc, out, _ = run(["pack", tmp_path / "x.npy", tmp_path / "cf4", "--cf", "4"], capsys)
    assert "no fidelity flag" not in out and dctdata.format.read_manifest(tmp_path / "cf4").field("image").codec.cf == 4


def test_no_fidelity_flag_constant_floats_are_kept_near_exact(tmp_path, capsys):
    """The default never fails where no flag asked for anything: constant samples (PSNR undefined) keep every
    frequency as float32."""
    np.save(tmp_path / "x.npy", np.full((4, 1, 16, 16), 3.5, np.float32))
    rc, out, err = run(["pack", tmp_path / "x.npy", tmp_path / "out"], capsys)
    assert rc == 0, err
    assert "no fidelity flag: image kept near-exact (every frequency as float32: the default target 40 dB" in out
    ds = dctdata.open_dataset(tmp_path / "out")
    np.testing.assert_allclose(decoded(ds, "image"), 3.5, rtol=1e-6)


def test_integer_kinds_are_the_same_from_every_source_format(tmp_path, capsys):
    """The same int16 slices: exact from HDF5, .npy and a TIFF folder without a flag (TIFFs were coded lossy), dct
    from all three with a target."""
    import h5py
    from PIL import Image

    x = (fields(4, 1, 16, 16) * 100).astype(np.uint16)[:, 0]
    np.save(tmp_path / "x.npy", x)
    with h5py.File(tmp_path / "x.h5", "w") as fh:
        fh["image"] = x
    (tmp_path / "tif").mkdir()
    for i, a in enumerate(x):
        Image.fromarray(a).save(tmp_path / "tif" / f"{i}.tif")
    for src in ("x.npy", "x.h5", "tif"):
        for flags, kind in (([], "array"), (["--target-psnr", "40"], "dct")):
            out = tmp_path / f"{src}-{kind}"
            rc, text, err = run(["pack", tmp_path / src, out, *flags], capsys)
            assert rc == 0, err
            f = dctdata.format.read_manifest(out).field("image")
            assert (f.kind, f.dtype) == (kind, "uint16"), (src, flags)
            if kind == "array":
                assert "no fidelity flag: image stored exactly" in text
                got = dctdata.open_dataset(out)[0 : len(x)][0].numpy()
                np.testing.assert_array_equal(got.reshape(x.shape), x)


def test_integer_source_with_only_a_bound_is_coded_as_dct(tmp_path, capsys):
    """A pointwise bound asks for lossy coding as a target does (int16 with --max-error alone was stored exactly,
    CR 6.9 where the bounded dct reaches 16.5); the summary says why and --field NAME=array keeps it exact."""
    x = (fields(16, 1, 32, 32) * 50).astype(np.int16)
    np.save(tmp_path / "x.npy", x)
    for flag in ("--max-error", "--max-rel-error"):
        value = "4" if flag == "--max-error" else "1e-2"
        out = tmp_path / flag.strip("-")
        rc, text, err = run(["pack", tmp_path / "x.npy", out, flag, value, "--lossless", "zstd:1"], capsys)
        assert rc == 0, err
        assert "image: dct [1, 32, 32] int16 (int16 samples of 3-D with a pointwise bound, a request for lossy " in text
        assert "(--field image=array keeps them exact)" in text
        m = dctdata.format.read_manifest(out)
        assert m.field("image").kind == "dct" and m.field("image").codec.bounded
    err_bound = np.abs(decoded(dctdata.open_dataset(tmp_path / "max-error"), "image") - x).max()
    assert err_bound <= 4
    args = ["pack", tmp_path / "x.npy", tmp_path / "exact", "--max-error", "4", "--field", "image=array"]
    rc, text, err = run(args, capsys)
    assert rc == 0, err
    assert "image: array [16, 1, 32, 32]"[:13] in text and "(--field image=array)" in text
    np.testing.assert_array_equal(dctdata.open_dataset(tmp_path / "exact")[0:16][0].numpy(), x)


def test_integers_made_dct_without_a_flag_get_the_default_target(tmp_path, capsys):
    x = (fields(16, 1, 32, 32) * 50).astype(np.int16)
    np.save(tmp_path / "x.npy", x)
    rc, text, err = run(["pack", tmp_path / "x.npy", tmp_path / "out", "--field", "image=dct"], capsys)
    assert rc == 0, err
    m = dctdata.format.read_manifest(tmp_path / "out")
    assert "no fidelity flag: default target 40 dB for image (per-sample floor" in text
    assert m.field("image").codec.min_psnr is not None and m.stats["image"].psnr_dataset >= 40


def test_a_mask_the_source_holds_is_source_data_in_the_ratios(tmp_path, capsys):
    """Only a mask the pack made (--nan mask) is left out of the ratios; a source's own mask (--valid) is data."""
    x = fields(12, 1, 32, 32)
    mask = np.ones((12, 1, 32, 32), np.uint8)
    mask[:, :, :4] = 0
    np.savez(tmp_path / "d.npz", image=x, mask=mask)
    rc, out, err = run(["pack", tmp_path / "d.npz", tmp_path / "out", "--valid", "image=mask", "--cf", "4"], capsys)
    assert rc == 0, err
    disk = disk_bytes(tmp_path / "out")
    assert printed_ratios(out) == (round(2 * x.nbytes / disk, 2), round((x.nbytes + mask.nbytes) / disk, 2))
