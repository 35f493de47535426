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
