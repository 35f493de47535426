"""benchmarks/trajectories.py on a tiny configuration: bytes of each storage, every window delivered by
each reader, the table's rates from the rows, and its argument errors."""

import json

import pytest

from benchmarks import trajectories


def test_trajectories_bench(capsys, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--files", "1", "--traj", "2", "--steps", "8", "--size", "16", "--n-in", "2", "--epochs", "1"]
    result = trajectories.main([*argv, "--workers", "0", "--json", str(out)])
    assert json.loads(out.read_text())["bytes"] == result["bytes"]
    sizes = result["bytes"]
    assert sizes["HDF5 as written"] > sizes["dctdata zarr at 40 dB"] > 0
    assert sizes["HDF5 as written"] > sizes["dctdata webdataset at 40 dB"] > 0
    windows = 2 * (8 - 2)  # 2 trajectories, 6 windows of 3 frames each
    readers = {r["reader"] for r in result["windows"]}
    assert {"dctdata", "dctdata webdataset"} <= readers
    for r in result["windows"]:
        assert r["windows"] == windows and r["seconds"] > 0 and r["workers"] == 0
    assert set(result["relative_l2"]) == {"height", "velocity_x", "velocity_y"}
    for e in result["relative_l2"].values():
        assert 0 < e["mean"] <= e["max"] < 0.5
    lines = capsys.readouterr().out.splitlines()
    rates = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and line.count("|") == 4]
    rates = [cells for cells in rates if cells[0].strip() in readers]
    assert len(rates) == len(result["windows"])
    for r, cells in zip(result["windows"], rates):
        assert float(cells[2]) == pytest.approx(r["windows"] / r["seconds"], abs=0.5)


@pytest.mark.parametrize("argv", [["--files", "0"], ["--steps", "3"], ["--workers", "-1"], ["--epochs", "0"]])
def test_trajectories_rejects_bad_arguments(argv):
    with pytest.raises(SystemExit, match="expected"):
        trajectories.main(argv)


def test_trajectories_bench_pdebench_layout(capsys):
    argv = ["--layout", "pdebench", "--files", "1", "--traj", "2", "--steps", "8", "--size", "16", "--n-in", "2"]
    result = trajectories.main([*argv, "--epochs", "1", "--workers", "0"])
    assert "bytes" not in result  # the Well rows were not run
    r = result["pdebench"]
    sizes = r["bytes"]
    raw = sizes["HDF5 as written"]
    assert 2 * 8 * 4 * 16 * 16 * 4 < raw < 2 * (2 * 8 * 4 * 16 * 16 * 4)  # 4 float32 variables + coordinates
    assert 0 < sizes["HDF5 gzip-4 + shuffle"] < raw
    assert 0 < sizes["dctdata zarr at 40 dB"] < raw and 0 < sizes["dctdata webdataset at 40 dB"] < raw
    assert {w["reader"] for w in r["windows"]} == {"dctdata", "dctdata webdataset", "h5py windows (HDF5)"}
    for w in r["windows"]:
        assert w["windows"] == 2 * (8 - 2) and w["seconds"] > 0 and w["workers"] == 0
    assert set(r["relative_l2"]) == {"Vx", "Vy", "density", "pressure"}
    for e in r["relative_l2"].values():
        assert 0 < e["mean"] <= e["max"] < 0.5
    assert "PDEBench layout" in capsys.readouterr().out


def test_h5py_window_reader_matches_the_file(tmp_path):
    """The peer reads the windows dctdata serves: the same frames, channels in the fields' order."""
    import h5py
    import numpy as np

    from dctdata.datasets.well import write_pdebench_file

    path = write_pdebench_file(tmp_path / "cfd.hdf5", 2, 6, 8)
    ds = trajectories.H5Windows(path, n_steps_input=2, n_steps_output=2)
    assert len(ds) == 2 * 3
    item = ds[4]  # trajectory 1, start step 1
    with h5py.File(path) as f:
        np.testing.assert_array_equal(item["input_fields"][..., 3].numpy(), f["pressure"][1, 1:3])
        np.testing.assert_array_equal(item["output_fields"][..., 0].numpy(), f["Vx"][1, 3:5])
