"""The benchmarks' data: arrays and photos shipped inside packages (read from the installed package,
never fetched) and the synthetic test fields."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dctdata import DctDataError


# Arrays shipped inside packages ------------------------------------------------------------------
def test_package_shipped_scientific_arrays():
    import shipped_images as images

    mri = images.mri_slice()
    assert mri.shape == (256, 256) and mri.dtype == np.uint16 and 0 < mri.max() < 4096
    dem = images.elevation_model()
    assert dem.shape == (344, 403) and dem.dtype == np.int16 and 200 < dem.min() < dem.max() < 1200  # metres
    disp = images.motorcycle_disparity()
    assert disp.shape == (500, 741) and disp.dtype == np.float32 and np.isfinite(disp).all()
    import skimage

    raw = np.load(f"{skimage.__path__[0]}/data/motorcycle_disp.npz", allow_pickle=False)["arr_0"]
    unknown = ~np.isfinite(raw)
    assert unknown.any() and (disp[unknown] == raw[~unknown].min()).all()  # unknown -> background disparity
    np.testing.assert_array_equal(disp[~unknown], raw[~unknown])
    assert images.shipped_image("moon.png").shape == (512, 512)
    assert set(images.sklearn_images()) == {"china", "flower"}


def test_nibabel_volumes_are_the_files_as_nibabel_reads_them():
    nibabel = pytest.importorskip("nibabel")
    import shipped_images as images

    def raw(name):
        return nibabel.load(images.package_file("nibabel", "tests", "data", name))

    run = images.fmri_volumes()
    assert run.shape == (2, 24, 96, 128) and run.dtype == np.int16 and run.dtype.isnative
    assert (run == 0).mean() > 0.5 and run.max() > 1000  # a dark background
    stored = np.asanyarray(raw("example4d.nii.gz").dataobj)  # (x, y, z, t)
    np.testing.assert_array_equal(run[1, 5], stored[:, :, 5, 1].T)
    slices = images.fmri_slices()
    assert slices.shape == (48, 96, 128)
    np.testing.assert_array_equal(slices[24 + 5], run[1, 5])
    mosaic = images.fmri_mosaic()
    assert mosaic.shape == (384, 768) and mosaic.dtype == np.int16
    np.testing.assert_array_equal(mosaic[96:192, 128:256], run[0, 7])  # row 1, column 1 of 6
    anat = images.anatomical_volume()
    assert anat.shape == (25, 41, 33) and anat.dtype == np.int16 and anat.dtype.isnative and anat.min() < 0
    np.testing.assert_array_equal(anat, np.asanyarray(raw("anatomical.nii").dataobj).T)  # big-endian on disk
    func = images.functional_volumes()
    assert func.shape == (20, 3, 21, 17) and func.dtype == np.float32
    np.testing.assert_allclose(func[3], raw("functional.nii").get_fdata()[..., 3].T, rtol=1e-6)
    assert {k: v.shape for k, v in images.real_volumes().items()} == {
        "example4d": run.shape,
        "anatomical": (1, *anat.shape),
        "functional": func.shape,
    }


def test_without_nibabel_the_real_volumes_are_skipped(monkeypatch):
    import shipped_images as images

    from benchmarks.items import load_items

    monkeypatch.setitem(sys.modules, "nibabel", None)
    with pytest.raises(ModuleNotFoundError):
        images.real_volumes()
    loaded, skipped = load_items(["fmri", "em"])
    assert [i.name for i in loaded] == ["em"]
    assert skipped == ["item fmri skipped: nibabel is not installed (pip install 'dctdata[bench]')"]


def test_package_files_are_never_fetched(monkeypatch):
    import shipped_images as images

    with pytest.raises(DctDataError, match=r"nope\.png: expected a data file shipped with skimage. Got no such file"):
        images.shipped_image("nope.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError):
        images.mri_slice()


def test_synthetic_fields_are_deterministic_and_scaled():
    from sci_fields import KINDS, synthetic_fields

    a = synthetic_fields(n=2, size=48, seed=5)
    b = synthetic_fields(n=2, size=48, seed=5)
    assert set(a) == set(KINDS)
    for k in KINDS:
        assert a[k].shape == (2, 1, 48, 48) and a[k].dtype == np.float32
        np.testing.assert_array_equal(a[k], b[k])
    assert 220 < float(a["clouds"].mean()) < 320  # brightness temperatures in K: a huge offset
    assert float(a["atoms"].min()) >= 0  # counts
    with pytest.raises(DctDataError, match="kind: expected one of"):
        synthetic_fields(kinds=("nope",))
