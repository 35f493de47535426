"""`dctdata inspect`: the figure from arrays, and the CLI on a packed dataset (with and without originals)."""

import numpy as np
import pytest
from PIL import Image

import dctdata
from benchmarks.fields import synthetic_fields
from dctdata.cli import main
from dctdata.preprocess.inspect import inspect_dataset
from dctdata.preprocess.inspect_figure import inspect_figure, radial_power_spectrum


def test_radial_spectrum_finds_a_stripe_frequency():
    yy, xx = np.mgrid[:64, :64]
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
    path, shown = _pack_and_inspect(tmp_path, x)
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
