"""Packing from Python: every object kind through `dctdata.pack` and `dctdata.Writer` gives the pack the
CLI writes from a file of the same data (byte for byte), and reads back."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from sample_fields import OPTS, files, smooth_fields

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.format import read_manifest

N = 40
X = smooth_fields(N, 2, 24, 40, noise="normal")
LABELS = np.arange(N, dtype=np.int64) % 5


class MapStyle:
    """A map-style dataset of (image, label) tuples, as a torch Dataset would return."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.from_numpy(X[i]), int(LABELS[i])


def _objects():
    """(name, object factory, wants labels) for every Python object kind (generators are used up once)."""
    return [
        ("array", lambda: X, False),
        ("tensor", lambda: torch.from_numpy(X), False),
        ("dict", lambda: {"image": X, "label": LABELS}, True),
        ("map-style", MapStyle, True),
        ("list of dicts", lambda: [{"image": X[i], "label": LABELS[i]} for i in range(N)], True),
        ("generator of tuples", lambda: ((X[i], LABELS[i]) for i in range(N)), True),
        ("generator of arrays", lambda: (x for x in X), False),
    ]


def _data_files(root) -> dict[str, bytes]:
    got = files(root)
    got.pop("manifest.json")
    return got


def _manifest_without_source(root) -> dict:
    d = json.loads(open(os.path.join(root, "manifest.json")).read())
    d["pack"].pop("source")
    d["pack"].pop("source_info", None)  # left out when at its default ({})
    return d


@pytest.fixture(scope="module")
def cli_packs(tmp_path_factory):
    """The CLI's packs of the same data: .npy (image only) and .npz (image + label), zarr and webdataset,
    fixed settings and a calibrated target."""
    tmp = tmp_path_factory.mktemp("cli")
    np.save(tmp / "x.npy", X)
    np.savez(tmp / "xl.npz", image=X, label=LABELS)
    out = {}
    for fmt in ("zarr", "webdataset"):
        for settings in (("--cf", "4"), ("--target-psnr", "40", "--cf", "6", "--quant", "int8")):
            settings = (*settings, "--lossless", "zstd:1")
            for src, labels in (("x.npy", False), ("xl.npz", True)):
                dest = tmp / f"{fmt}-{settings[0][2:]}-{labels}"
                extra = ["--samples-per-shard", "8"] if fmt == "webdataset" else []
                assert main(["pack", str(tmp / src), str(dest), "--format", fmt, *settings, *extra, "--quiet"]) == 0
                out[fmt, settings[0][2:], labels] = str(dest)
    return out


def _settings(kind):
    """Fixed settings, or calibrated steps (cf and dtype fixed: the search itself is calibrate's to test); zstd
    as the lossless stage (auto's context-coder fit was most of each pack's time, and the stage's choice is
    not what these tests compare)."""
    lossless = {"lossless": {"id": "zstd", "level": 1}}
    return {"cf": 4, **lossless} if kind == "cf" else {"target_psnr": 40, "cf": 6, "quant": "int8", **lossless}


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("kind", ["cf", "target-psnr"])
@pytest.mark.parametrize("name, obj, labels", _objects(), ids=[o[0] for o in _objects()])
def test_pack_of_each_object_kind_equals_the_cli_pack(tmp_path, cli_packs, fmt, kind, name, obj, labels):
    opts = OPTS[fmt] if fmt == "webdataset" else {}
    if fmt == "zarr" and kind == "cf":
        opts = {}  # zarr's default layout for 40 samples: one shard, laid out when the count is known
    out = tmp_path / "out"
    m = dctdata.pack(obj(), out, format=fmt, writer_options=opts, quiet=True, **_settings(kind))
    ref = cli_packs[fmt, kind, labels]
    assert _data_files(out) == _data_files(ref)
    assert _manifest_without_source(out) == _manifest_without_source(ref)
    assert m.samples == N and m.pack["source"].startswith("<")
    ds = dctdata.open_dataset(out, as_dict=True, **({"shuffle": False} if fmt == "webdataset" else {}))
    got = list(ds) if fmt == "webdataset" else [ds[i] for i in range(N)]
    x_hat = ds.decompressor()(torch.utils.data.default_collate([s["image"] for s in got]))
    assert float(dctdata.codec.metrics.psnr(torch.from_numpy(X), x_hat).min()) > 30
    if labels:
        assert [int(s["label"]) for s in got] == LABELS.tolist()


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("kind", ["cf", "target-psnr"])
@pytest.mark.parametrize("known", [False, True], ids=["count unknown", "samples=N"])
def test_writer_equals_the_cli_pack(tmp_path, fmt, kind, known):
    opts = {"shard_samples": 8} if fmt == "zarr" else OPTS[fmt]
    ref = tmp_path / "ref"
    np.savez(tmp_path / "xl.npz", image=X, label=LABELS)
    dctdata.pack(tmp_path / "xl.npz", ref, format=fmt, writer_options=opts, quiet=True, **_settings(kind))
    out = tmp_path / "out"
    with dctdata.Writer(out, format=fmt, writer_options=opts, samples=N if known else None, **_settings(kind)) as w:
        for i in range(N):
            w.write({"image": X[i], "label": LABELS[i]})
            assert not out.exists()  # nothing at OUT before the commit
    assert w.manifest.samples == N and read_manifest(out) == w.manifest
    assert _data_files(out) == _data_files(ref)  # 5 parts: written as they filled, the count settled at close
    assert _manifest_without_source(out) == _manifest_without_source(ref)


def test_writer_calibrates_on_a_first_window_or_an_explicit_set(tmp_path, monkeypatch):
    """A stream longer than the calibration window: the window (and nothing more) is buffered, and the
    codec is the one calibrated on those first samples; `calibration=` replaces the window."""
    from dctdata.preprocess import plan

    monkeypatch.setattr(plan, "CALIBRATION_VALUES", 1)  # window = CALIBRATION_SAMPLES (64) samples
    x = smooth_fields(100, 1, 16, 16, seed=4, noise="normal")
    with dctdata.Writer(tmp_path / "w", target_psnr=35) as w:
        for i, s in enumerate(x):
            w.write(s)
            assert (w.specs is None) == (i < plan.CALIBRATION_SAMPLES - 1)
            assert len(w._window) <= plan.CALIBRATION_SAMPLES
    first = dctdata.pack(x[: plan.CALIBRATION_SAMPLES], tmp_path / "first", target_psnr=35, quiet=True)
    assert w.manifest.field("image").codec == first.field("image").codec
    with dctdata.Writer(tmp_path / "c", target_psnr=35, calibration=x[:10]) as w:
        w.write(x[0])
        assert w.specs is not None  # planned at once: nothing buffered
        for s in x[1:]:
            w.write(s)
    ten = dctdata.pack(x[:10], tmp_path / "ten", target_psnr=35, quiet=True)
    assert w.manifest.field("image").codec == ten.field("image").codec
    # the same explicit set through dctdata.pack of a path
    np.save(tmp_path / "x.npy", x)
    m = dctdata.pack(tmp_path / "x.npy", tmp_path / "p", target_psnr=35, calibration=x[:10], quiet=True)
    assert m.field("image").codec == ten.field("image").codec


def test_without_fidelity_settings_the_writer_calibrates_the_default_target_as_pack_does(tmp_path):
    """No fidelity setting: float fields get the default target, calibrated on the same window as `pack`'s
    subset (the Writer used to plan after the first sample and calibrate on it alone)."""
    x = (
        smooth_fields(12, 1, 16, 16, seed=5, noise="normal")
        * np.linspace(1, 4, 12, dtype=np.float32)[:, None, None, None]
    )
    ref = dctdata.pack(x, tmp_path / "ref", quiet=True, workers=1)
    with dctdata.Writer(tmp_path / "w", quiet=True) as w:
        for s in x:
            w.write(s)
            assert w.specs is None  # the whole stream fits the window: nothing planned before close
    assert w.manifest.fields == ref.fields and w.manifest.stats == ref.stats


def test_writer_takes_tuples_arrays_tensors_and_pil_images(tmp_path):
    from PIL import Image

    rgb = (np.random.default_rng(0).random((4, 12, 20, 3)) * 255).astype(np.uint8)
    with dctdata.Writer(tmp_path / "o", cf=8, attrs={"image": {"units": "counts"}}, coords={"t": np.arange(4.0)}) as w:
        for i in range(4):
            w.write((Image.fromarray(rgb[i]), i))
    ds = dctdata.open_dataset(tmp_path / "o")
    assert ds.manifest.field("image").shape == (3, 12, 20) and ds.manifest.field("image").kind == "dct"
    assert [int(ds[i][1]) for i in range(4)] == [0, 1, 2, 3]
    assert ds.attrs("image") == {"units": "counts"} and ds.coords["t"].tolist() == [0.0, 1.0, 2.0, 3.0]
    rec = ds.decompressor()(ds[0:4][0])
    assert torch.allclose(rec, torch.from_numpy(np.moveaxis(rgb, -1, 1)).float(), atol=0.5)


def test_writer_refuses_use_after_close_and_an_existing_out(tmp_path):
    with dctdata.Writer(tmp_path / "o", cf=4) as w:
        w.write(X[0])
    with pytest.raises(DctDataError, match=r"o: expected an open writer\. Got one that is closed or aborted"):
        w.write(X[1])
    assert w.close() is w.manifest  # closing twice returns the manifest
    with pytest.raises(DctDataError, match=r"o: expected an OUT path that does not exist"):
        dctdata.Writer(tmp_path / "o")
    with dctdata.Writer(tmp_path / "o", cf=2, overwrite=True) as w:
        w.write(X[0])
    assert read_manifest(tmp_path / "o").field("image").codec.cf == 2


def test_a_masked_array_becomes_nan_and_a_stored_mask(tmp_path):
    x = np.ma.masked_array(X[:6], mask=np.zeros(X[:6].shape, bool))
    x.mask[2, :, :4, :] = True
    m = dctdata.pack(x, tmp_path / "o", cf=8, nan="mask", quiet=True)
    assert m.field("image").valid == "image_valid"
    ds = dctdata.open_dataset(tmp_path / "o", as_dict=True)
    assert torch.equal(ds[2]["image_valid"], torch.from_numpy(~x.mask[2]))


def test_per_field_targets_for_a_noisy_clean_pair(tmp_path):
    """One pack, two fields, two targets: each field's worst channel meets its own."""
    clean = smooth_fields(12, 1, 24, 24, seed=2, noise="normal")
    noisy = clean + np.random.default_rng(0).normal(0, 0.5, clean.shape).astype(np.float32)
    pair = {"noisy": noisy, "clean": clean}
    m = dctdata.pack(pair, tmp_path / "py", target_psnr={"noisy": 35, "clean": 45}, quant="int16", quiet=True)
    assert m.stats["noisy"].psnr_dataset >= 35 and m.stats["clean"].psnr_dataset >= 45
    assert m.stats["clean"].psnr_dataset > m.stats["noisy"].psnr_dataset + 5
    assert m.pack["target_psnr"] == {"noisy": 35.0, "clean": 45.0}
    np.savez(tmp_path / "pair.npz", noisy=noisy, clean=clean)
    assert main(["pack", str(tmp_path / "pair.npz"), str(tmp_path / "cli"), "--target-psnr", "noisy=35,clean=45",
                 "--quant", "int16", "--quiet"]) == 0  # fmt: skip
    assert _data_files(tmp_path / "cli") == _data_files(tmp_path / "py")
    # a bare number is the default of the fields not named
    m = dctdata.pack(pair, tmp_path / "d", target_psnr="35,clean=45", quant="int16", quiet=True)
    assert m.pack["target_psnr"] == {"*": 35.0, "clean": 45.0} and m.stats["clean"].psnr_dataset >= 45
    # a field without a target gets the defaults (or the explicit settings)
    m = dctdata.pack(pair, tmp_path / "e", target_psnr={"clean": 45}, quiet=True)
    assert m.field("noisy").codec.cf == 4 and m.field("noisy").codec.dtype == "float32"


def test_two_zarr_packs_pair_by_index(tmp_path):
    """What the packing guide recommends for a pair in two packs: map-style zarr datasets share indices."""
    clean = smooth_fields(6, 1, 16, 16, seed=2, noise="normal")
    dctdata.pack(clean, tmp_path / "clean", cf=8, quiet=True)
    dctdata.pack(clean + 1, tmp_path / "noisy", cf=8, quiet=True)
    pair = torch.utils.data.StackDataset(
        dctdata.open_dataset(tmp_path / "noisy"), dctdata.open_dataset(tmp_path / "clean")
    )
    (n,), (c,) = pair[3]
    dec = dctdata.open_dataset(tmp_path / "clean").decompressor()
    assert torch.allclose(dec(n[None]) - dec(c[None]), torch.ones(1, 1, 16, 16), atol=1e-3)


def test_the_writer_calibrates_decoded_images_on_a_window(tmp_path, monkeypatch):
    """PIL images are dct fields, so a target makes the Writer buffer a calibration window for them."""
    from PIL import Image

    from dctdata.preprocess import plan

    monkeypatch.setattr(plan, "CALIBRATION_VALUES", 1)
    rgb = (np.random.default_rng(0).random((70, 16, 16, 3)) * 255).astype(np.uint8)
    with dctdata.Writer(tmp_path / "o", target_psnr=30, quant="int8", cf=8) as w:
        for i, a in enumerate(rgb):
            w.write(Image.fromarray(a))
            assert (w.specs is None) == (i < plan.CALIBRATION_SAMPLES - 1)


def test_a_list_of_ragged_arrays_names_the_sample(tmp_path):
    a, b = np.zeros((64, 64), np.float32), np.zeros((32, 64), np.float32)
    with pytest.raises(
        DctDataError, match=r"sample 1: field 'image': expected shape \(64, 64\) like sample 0\. Got \(32, 64\)"
    ):
        dctdata.pack([a, b], tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()
