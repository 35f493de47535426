"""PDEBench's HDF5 layouts as trajectory sources (`dctdata.preprocess.sources.pdebench`): per-variable
arrays (n, n_t, x, y) and per-sample groups (n_t, x, y, c), each frame once, windows served as for The
Well's files."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import dctdata
from dctdata.datasets.well import shallow_water
from dctdata.errors import DctDataError
from dctdata.preprocess.sources import open_source
from dctdata.preprocess.sources.pdebench import PDEBenchSource


def _variables_file(path, n=3, steps=10, size=32):
    height, velocity, _, time = shallow_water(n, steps, size, seed=2)
    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    with h5py.File(path, "w") as f:
        f.create_dataset("density", data=height + 1.0)
        f.create_dataset("Vx", data=velocity[..., 0])
        f.create_dataset("Vy", data=velocity[..., 1])
        f.create_dataset("t-coordinate", data=np.append(time, time[-1] * 2))  # PDEBench CFD: n_t + 1 values
        f.create_dataset("x-coordinate", data=c)
        f.create_dataset("y-coordinate", data=c)
        f.attrs["M"] = 0.1
    return height + 1.0, velocity, time


def _samples_file(path, n=2, steps=8, size=32):
    height, velocity, _, time = shallow_water(n, steps, size, seed=3)
    data = np.concatenate([height[..., None], velocity], -1)
    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    with h5py.File(path, "w") as f:
        for j in range(n):
            g = f.create_group(f"{j:04d}")
            g.create_dataset("data", data=data[j])
            g.create_dataset("grid/t", data=time + j)
            g.create_dataset("grid/x", data=c)
            g.create_dataset("grid/y", data=c)
    return data, time


def test_per_variable_layout(tmp_path):
    density, velocity, time = _variables_file(tmp_path / "2D_CFD_Train.hdf5")
    src = open_source(str(tmp_path / "2D_CFD_Train.hdf5"))
    assert isinstance(src, PDEBenchSource) and len(src) == 30
    assert src.probe() == {k: ((1, 32, 32), np.float32) for k in ("Vx", "Vy", "density")}
    got = src.read_batch(12, 15)  # trajectory 1, steps 2..4
    np.testing.assert_array_equal(got["Vy"][:, 0], velocity[1, 2:5, ..., 1])
    src.close()
    m = dctdata.pack(str(tmp_path / "2D_CFD_Train.hdf5"), tmp_path / "cfd.zarr", target_psnr=40, quiet=True)
    info = m.pack["source_info"]["trajectories"]
    assert info["source_layout"] == "pdebench-variables"
    assert info["files"][0]["parameters"] == {"M": pytest.approx(0.1)}
    np.testing.assert_allclose(info["files"][0]["time"], time, rtol=1e-6)  # the n_t values of the frames
    ds = dctdata.open_dataset(tmp_path / "cfd.zarr", n_steps_input=2, n_steps_output=1)
    assert len(ds) == 3 * 8 and ds.field_names == ["Vx", "Vy", "density"]
    item = ds[8 + 3]  # trajectory 1, start step 3
    assert item["input_fields"].shape == (2, 32, 32, 3)
    ref = density[1, 3:5]
    err = np.abs(item["input_fields"][..., 2].numpy() - ref).max()
    assert err < 0.05 * (ref.max() - ref.min())
    assert item["boundary_conditions"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert "constant_fields" not in item and "constant_scalars" not in item


def test_per_sample_layout(tmp_path):
    data, time = _samples_file(tmp_path / "2D_rdb_NA_NA.h5")
    src = open_source(str(tmp_path / "2D_rdb_NA_NA.h5"))
    assert isinstance(src, PDEBenchSource) and len(src) == 16
    assert src.field_attrs["data"]["channels"] == ["data_0", "data_1", "data_2"]
    np.testing.assert_array_equal(src.read_batch(9, 10)["data"][0], np.moveaxis(data[1, 1], -1, 0))
    src.close()
    dctdata.pack(str(tmp_path / "2D_rdb_NA_NA.h5"), tmp_path / "rdb.zarr", quiet=True)
    ds = dctdata.open_dataset(tmp_path / "rdb.zarr", n_steps_input=1, n_steps_output=1, normalize_time_grid=False)
    item = ds[len(ds) - 1]  # trajectory 1's last window: its own time values
    assert item["output_time_grid"].tolist() == pytest.approx([time[-1] + 1])
    assert item["output_fields"].shape == (1, 32, 32, 3)


def test_pdebench_errors(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("density", data=np.zeros((2, 4, 8, 8), np.float32))
        f.create_dataset("Vx", data=np.zeros((2, 5, 8, 8), np.float32))
        f.create_dataset("t-coordinate", data=np.arange(5, dtype=np.float32))
        f.create_dataset("x-coordinate", data=np.arange(8, dtype=np.float32))
    with pytest.raises(DctDataError, match=r"bad\.h5: expected every variable shaped \(n_samples, n_t, x, y"):
        open_source(str(path))
    _variables_file(tmp_path / "ok.h5", n=1, steps=4, size=16)
    with pytest.raises(DctDataError, match=r"ok\.h5: --dims 3: expected the data's spatial dims. Got 2-D frames"):
        dctdata.pack(str(tmp_path / "ok.h5"), tmp_path / "x.zarr", dims=3, quiet=True)
    plain = open_source(str(tmp_path / "ok.h5"), key="density")  # --key: plain HDF5 datasets
    assert not isinstance(plain, PDEBenchSource) and len(plain) == 1
    plain.close()
