"""The Well's HDF5 layout as a pack source (`dctdata.preprocess.sources.well`): every frame once, vector
components as named channels, constants, grids, time values, boundary conditions and statistics kept
in the manifest."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import dctdata
from dctdata.datasets.well import write_well_file
from dctdata.errors import DctDataError
from dctdata.preprocess.sources import open_source
from dctdata.preprocess.sources.well import WellSource, decode_array


@pytest.fixture(scope="module")
def well_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("well")
    write_well_file(d / "b.h5", n_traj=2, n_steps=12, size=32, seed=1)
    write_well_file(d / "a.h5", n_traj=3, n_steps=10, size=32, seed=0)
    return d


def test_frames_in_well_order_with_vector_channels(well_dir):
    src = open_source(str(well_dir))
    assert isinstance(src, WellSource)
    assert [p.rsplit("/", 1)[-1] for p in src.files] == ["a.h5", "b.h5"]  # sorted, as WellDataset globs
    assert len(src) == 3 * 10 + 2 * 12
    assert src.probe() == {"height": ((1, 32, 32), np.float32), "velocity": ((2, 32, 32), np.float32)}
    with h5py.File(well_dir / "b.h5") as fh:
        height, velocity = fh["t0_fields/height"][1], fh["t1_fields/velocity"][1]
    frame = 30 + 12 + 5  # file b, trajectory 1, step 5
    got = src.read_batch(frame, frame + 3)
    np.testing.assert_array_equal(got["height"][:, 0], height[5:8])
    np.testing.assert_array_equal(got["velocity"], np.moveaxis(velocity[5:8], -1, 1))
    # a batch across trajectories and files reads each from its own trajectory
    across = src.read_batch(28, 33)
    with h5py.File(well_dir / "a.h5") as fh:
        np.testing.assert_array_equal(across["height"][:2, 0], fh["t0_fields/height"][2, 8:10])
    assert src.where(frame).endswith("b.h5 trajectory 1 step 5 (frame 47)")
    assert src.field_attrs["velocity"]["channels"] == ["velocity_x", "velocity_y"]
    src.close()


def test_pack_keeps_constants_grids_and_statistics(well_dir, tmp_path):
    m = dctdata.pack(str(well_dir / "a.h5"), tmp_path / "p.zarr", quiet=True)
    assert m.samples == 30
    info = m.pack["source_info"]["trajectories"]
    with h5py.File(well_dir / "a.h5") as fh:
        bathy = fh["t0_fields/bathymetry"][()]
        time = fh["dimensions/time"][()]
        x = fh["dimensions/x"][()]
        height = fh["t0_fields/height"][()].astype(np.float64)
        velocity = fh["t1_fields/velocity"][()].astype(np.float64)
    entry = info["files"][0]
    for j in range(3):  # sample-varying constant field: once per trajectory, exactly
        np.testing.assert_array_equal(decode_array(entry["constant_fields"]["bathymetry"][j])[0], bathy[j])
    np.testing.assert_allclose(entry["time"], time, rtol=1e-7)
    np.testing.assert_allclose(info["grid"]["x"], x, rtol=1e-7)
    assert entry["constant_scalars"] == {"g": 1.0} and entry["parameters"] == {"g": 1.0}
    assert entry["boundary_conditions"]["padding"] == [[2.0, 2.0], [2.0, 2.0]]  # periodic, WellDataset's code
    assert info["offsets"] == [0, 10, 20, 30]
    assert info["fields"][1]["channels"] == ["velocity_x", "velocity_y"]
    stats = info["stats"]
    np.testing.assert_allclose(stats["height"]["mean"], [height.mean()], rtol=1e-6)
    np.testing.assert_allclose(stats["height"]["std"], [height.std()], rtol=1e-5)
    np.testing.assert_allclose(stats["velocity"]["rms"], np.sqrt((velocity**2).mean(axis=(0, 1, 2, 3))), rtol=1e-6)
    delta = np.diff(velocity, axis=1)  # within trajectories only
    np.testing.assert_allclose(stats["velocity"]["std_delta"], delta.std(axis=(0, 1, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(stats["height"]["rms_delta"], [np.sqrt((np.diff(height, axis=1) ** 2).mean())])


def _rewrite(src, dst, edit):
    with h5py.File(src) as a, h5py.File(dst, "w") as b:
        for k in a:
            a.copy(k, b)
        for k, v in a.attrs.items():
            b.attrs[k] = v
        edit(b)


def test_errors_name_the_file(well_dir, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_well_file(mixed / "a.h5", n_traj=1, n_steps=6, size=32)
    write_well_file(mixed / "b.h5", n_traj=1, n_steps=6, size=16)
    with pytest.raises(DctDataError, match=r"b\.h5: expected the same fields, scalars and grid as .*a\.h5"):
        open_source(str(mixed))

    def no_time_varying(f):
        f["t0_fields/height"].attrs["time_varying"] = False
        f["t1_fields/velocity"].attrs["time_varying"] = False

    _rewrite(well_dir / "a.h5", tmp_path / "static.h5", no_time_varying)
    with pytest.raises(DctDataError, match=r"static\.h5: expected at least one time-varying field"):
        open_source(str(tmp_path / "static.h5"))

    def clash(f):
        f["scalars"].attrs["field_names"] = ["g", "height"]
        d = f["scalars"].create_dataset("height", data=np.zeros(6, np.float32))
        d.attrs["time_varying"] = True
        d.attrs["sample_varying"] = False

    _rewrite(well_dir / "a.h5", tmp_path / "clash.h5", clash)
    with pytest.raises(DctDataError, match=r"clash\.h5: expected distinct field and scalar names. Got 'height'"):
        open_source(str(tmp_path / "clash.h5"))
    # --key still reads a Well file as plain HDF5 datasets
    plain = open_source(str(well_dir / "a.h5"), key="t0_fields/height")
    assert not isinstance(plain, WellSource) and len(plain) == 3
    plain.close()


def test_time_varying_scalars_and_tiled_axes(well_dir, tmp_path):
    """A time-varying scalar becomes one number per frame; a field stored without a spatial axis
    (dim_varying False) is tiled along it, as WellDataset does."""

    def edit(f):
        f["scalars"].attrs["field_names"] = ["g", "energy"]
        d = f["scalars"].create_dataset("energy", data=np.arange(30, dtype=np.float32).reshape(3, 10))
        d.attrs["time_varying"] = True
        d.attrs["sample_varying"] = True
        ramp = np.arange(32, dtype=np.float32)[None, None, :, None] * np.ones((3, 10, 1, 1), np.float32)
        d = f["t0_fields"].create_dataset("ramp", data=ramp)
        d.attrs["dim_varying"] = [True, False]
        d.attrs["sample_varying"] = True
        d.attrs["time_varying"] = True
        f["t0_fields"].attrs["field_names"] = ["height", "bathymetry", "ramp"]

    _rewrite(well_dir / "a.h5", tmp_path / "s.h5", edit)
    src = open_source(str(tmp_path / "s.h5"))
    got = src.read_batch(12, 14)  # trajectory 1, steps 2 and 3
    np.testing.assert_array_equal(got["energy"], [12.0, 13.0])
    assert got["ramp"].shape == (2, 1, 32, 32)
    np.testing.assert_array_equal(got["ramp"][0, 0, :, 7], np.arange(32))
    assert src.info["trajectories"]["scalars"] == [{"name": "energy", "stored": "energy"}]
    src.close()
