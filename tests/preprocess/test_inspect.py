"""`dctdata inspect`: the figure from arrays, and the CLI on a packed dataset (with and without originals)."""

import numpy as np
import pytest
import torch
from PIL import Image
from sample_fields import smooth_fields
from sci_fields import synthetic_fields

import dctdata
from dctdata.cli import main
from dctdata.preprocess.inspect import inspect_dataset
from dctdata.preprocess.inspect_figure import inspect_figure, radial_power_spectrum


def test_radial_spectrum_finds_a_stripe_frequency():
    _yy, xx = np.mgrid[:64, :64]
    f, p = radial_power_spectrum(np.sin(2 * np.pi * xx * 0.125))
    assert abs(f[np.nanargmax(p)] - 0.125) < 0.02
    with pytest.raises(dctdata.DctDataError, match="expected a 2-D array"):
        radial_power_spectrum(np.zeros(5))


def test_figure_layout_with_and_without_originals(tmp_path):
    x = synthetic_fields(n=2, size=40)["beam"][:, 0]
    y = x + np.random.default_rng(0).normal(0, 1, x.shape)
    w4, h4 = Image.open(inspect_figure(x, y, tmp_path / "a.png")).size
    w2, h2 = Image.open(inspect_figure(None, y, tmp_path / "b.png", titles=["a", "b"])).size
    assert h4 == h2 and w4 > w2  # four columns vs two
    with pytest.raises(dctdata.DctDataError, match="originals: expected the reconstructions' shape"):
        inspect_figure(x[:1], y, tmp_path / "c.png")
    with pytest.raises(dctdata.DctDataError, match=r"expected items of shape \(S, H, W\)"):
        inspect_figure(None, y[0], tmp_path / "c.png")
    with pytest.raises(dctdata.DctDataError, match="titles: expected 2 titles"):
        inspect_figure(None, y, tmp_path / "c.png", titles=["a"])


def test_cli_on_packed_dataset(tmp_path, capsys, monkeypatch):
    src = tmp_path / "f.npy"
    np.save(src, synthetic_fields(n=6, size=32)["clouds"][:, 0])
    dctdata.pack(str(src), str(tmp_path / "out"), target_psnr=40, quiet=True)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", str(tmp_path / "out"), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "wrote out-inspect.png" in out and "originals not available" not in out
    assert Image.open(tmp_path / "out-inspect.png").size[0] > 900  # four columns, in the current directory
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before  # the pack is not written to
    src.unlink()  # the source is gone: reconstruction and spectrum only, and say so
    png = tmp_path / "r.png"
    assert main(["inspect", str(tmp_path / "out"), "--png", str(png)]) == 0
    assert "originals not available" in capsys.readouterr().out
    assert png.exists()
    assert main(["inspect", str(tmp_path / "out"), "--field", "nope"]) == 1
    assert "field: expected one of" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "out"), "--samples", "0"]) == 1


# Originals through the pack's own source readers, for every source kind ---------------------------
def _pack_and_inspect(tmp_path, source, original=None, **pack_kw):
    out = tmp_path / "out"
    dctdata.pack(source, out, cf=6, quiet=True, **pack_kw)
    return inspect_dataset(str(out), str(tmp_path / "i.png"), samples=2, original=original)


def test_originals_from_hdf5_in_the_packs_layout(tmp_path):
    import h5py

    x = synthetic_fields(n=4, size=32)["clouds"]  # (4, 1, 32, 32)
    with h5py.File(tmp_path / "d.h5", "w") as fh:
        fh["images"] = np.moveaxis(x, 1, -1)  # (N, 32, 32, 1) as SciML-Bench stores it
    assert _pack_and_inspect(tmp_path, tmp_path / "d.h5", key="images", channels_last=True)[1]


def test_originals_from_an_image_folder(tmp_path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray((rng.random((20, 28, 3)) * 255).astype(np.uint8)).save(tmp_path / "imgs" / "a" / f"{i}.png")
    assert _pack_and_inspect(tmp_path, tmp_path / "imgs")[1]


def test_originals_from_python_objects_only_when_passed(tmp_path):
    x = synthetic_fields(n=4, size=32)["clouds"]
    _path, shown = _pack_and_inspect(tmp_path, x)
    assert not shown  # the manifest records "<ndarray ...>": nothing to follow
    assert inspect_dataset(str(tmp_path / "out"), str(tmp_path / "j.png"), original=x)[1]


def test_a_recorded_module_callable_is_never_run(tmp_path, monkeypatch):
    """A manifest (maybe downloaded) names a module:callable as its source: inspect does not import it;
    the user may pass it explicitly."""
    (tmp_path / "evilmod.py").write_text(
        "import numpy as np, pathlib\n"
        "pathlib.Path(__file__).with_name('ran').write_text('imported')\n"
        "class D:\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): return np.full((16, 16), float(i), np.float32) + np.eye(16, dtype=np.float32)\n"
        "def make(): return D()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    dctdata.pack("evilmod:make", tmp_path / "out", cf=4, quiet=True)
    (tmp_path / "ran").unlink()
    import sys

    sys.modules.pop("evilmod", None)
    assert main(["inspect", str(tmp_path / "out"), "--png", str(tmp_path / "a.png")]) == 0
    assert not (tmp_path / "ran").exists()  # not imported, not run
    assert inspect_dataset(str(tmp_path / "out"), str(tmp_path / "b.png"), original="evilmod:make")[1]
    assert (tmp_path / "ran").exists()  # run because the user asked


# Issue 31: the worst samples, a colour bar, every channel or one, and --field named ---------------
def _rows_titles(monkeypatch):
    """Capture the titles `inspect_figure` draws (one per row)."""
    import dctdata.preprocess.inspect as mod

    seen = {}
    real = mod.inspect_figure

    def spy(org, rec, png, titles, valid=None):
        seen["titles"] = titles
        return real(org, rec, png, titles, valid=valid)

    monkeypatch.setattr(mod, "inspect_figure", spy)
    return seen


def test_shows_the_worst_samples_every_channel_and_a_colour_bar(tmp_path, monkeypatch):
    from dctdata.codec.metrics import psnr

    rng = np.random.default_rng(0)
    x = smooth_fields(12, 2, 32, 32, noise="gaussian")  # (12, 2, 32, 32), 20 +- 10
    x[7] += rng.normal(0, 2, x[7].shape).astype(np.float32)  # fine noise the chop loses
    x[3, 1] += rng.normal(0, 2, x[3, 1].shape).astype(np.float32)  # in channel 1 only
    np.save(tmp_path / "x.npy", x)
    dctdata.pack(str(tmp_path / "x.npy"), tmp_path / "out", cf=3, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "out")
    scores = psnr(torch.from_numpy(x).double(), ds.decompressor()(ds[0:12][0]).double())  # (12, 2)

    def worst(s):
        return sorted(torch.argsort(s)[:2].tolist())

    seen = _rows_titles(monkeypatch)
    png, shown = inspect_dataset(str(tmp_path / "out"), str(tmp_path / "w.png"), samples=2)
    assert 7 in worst(scores.amin(1))  # the noisy sample is among the worst: the test data does what it should
    expected = [f"image sample {i} channel {c}" for i in worst(scores.amin(1)) for c in (0, 1)]
    assert shown and seen["titles"] == expected  # the worst two samples, every channel
    inspect_dataset(str(tmp_path / "out"), str(tmp_path / "c.png"), samples=2, channel=0)
    assert seen["titles"] == [f"image sample {i} channel 0" for i in worst(scores[:, 0])]
    with Image.open(png) as img:  # the colour bar: a heat ramp under the error map, black to white
        rgb = np.asarray(img.convert("RGB"))
    from dctdata.preprocess.inspect_figure import BAR, PAD, TILE

    bar_row = rgb[PAD + PAD + TILE + 2 + 3, PAD + 2 * (TILE + PAD) : PAD + 2 * (TILE + PAD) + TILE]
    assert bar_row[0].tolist() == [0, 0, 0] and bar_row[-1].tolist() == [255, 255, 255] and BAR > 8
    assert (np.diff(bar_row.astype(int).sum(1)) >= 0).all()  # brighter from 0 to the row's max error
    with pytest.raises(dctdata.DctDataError, match=r"--channel: expected a channel of field 'image', 0\.\.1. Got 2"):
        inspect_dataset(str(tmp_path / "out"), str(tmp_path / "e.png"), channel=2)


def test_two_dct_fields_name_the_field_flag(tmp_path, capsys):
    x = synthetic_fields(n=4, size=32)["clouds"]
    dctdata.pack({"noisy": x, "clean": x}, tmp_path / "out", cf=4, quiet=True)
    assert main(["inspect", str(tmp_path / "out"), "--png", str(tmp_path / "a.png")]) == 1
    err = capsys.readouterr().err
    assert "--field: expected one of the dct fields ['noisy', 'clean'] (this pack has 2). Got none" in err
    assert main(["inspect", str(tmp_path / "out"), "--field", "clean", "--png", str(tmp_path / "a.png")]) == 0


def test_inspect_shows_the_middle_slice_of_a_volume(tmp_path, capsys, monkeypatch):
    """`dctdata inspect` on a --dims 3 pack (it failed: "expected items of shape (S, H, W)"): the middle slice
    along D of the worst volumes, originals found from the (D, H, W) source samples."""
    import dctdata.preprocess.inspect as inspect_mod

    vol = smooth_fields(4, 12, 16, 24, seed=3, noise="normal")  # 4 volumes of (D=12, H=16, W=24)
    np.save(tmp_path / "v.npy", vol)
    out = tmp_path / "v.dct"
    assert main(["pack", str(tmp_path / "v.npy"), str(out), "--dims", "3", "--cf", "4", "--quiet"]) == 0
    seen = {}
    real = inspect_mod.inspect_figure

    def spy(org, rec, png, titles, valid=None):
        seen.update(org=org, rec=rec, titles=titles)
        return real(org, rec, png, titles, valid=valid)

    monkeypatch.setattr(inspect_mod, "inspect_figure", spy)
    assert main(["inspect", str(out), "--png", str(tmp_path / "v.png"), "--samples", "2"]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "v.png").exists()
    assert seen["rec"].shape == (2, 16, 24) and seen["titles"][0].endswith("slice 6 of 12")
    i = int(seen["titles"][0].split("sample ")[1].split()[0])
    np.testing.assert_array_equal(seen["org"][0], vol[i, 6])  # the original's middle slice, beside its decode
    ds = dctdata.open_dataset(out)
    whole = ds.decompressor("image")(ds[i][0][None]).numpy()  # (1, C=1, D, H, W)
    np.testing.assert_array_equal(seen["rec"][0], whole[0, 0, 6])  # its decode's middle slice
