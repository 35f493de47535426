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
