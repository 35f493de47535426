"""examples/well_surrogate.py on tiny settings: a raw and a packed run, each learning (loss down), both
validated on the raw files with finite errors, and the pack smaller on disk than the HDF5 files."""

import math

import pytest
from example_loading import load_example


@pytest.mark.slow
def test_well_surrogate_example_runs_and_learns(tmp_path, monkeypatch, capsys):
    module = load_example("well_surrogate", monkeypatch)
    argv = ["--traj", "2", "--steps", "12", "--size", "16", "--epochs", "3", "--width", "4", "--rollout", "3"]
    rows = module.main([*argv, "--threads", "1", "--out", str(tmp_path)])
    assert [r["data"] for r in rows] == ["raw HDF5", "dctdata 40 dB"]
    for r in rows:
        assert len(r["losses"]) == 3 and r["losses"][-1] < r["losses"][0], r
        assert math.isfinite(r["one_step_rel_l2"]) and math.isfinite(r["rollout_rel_l2"]) and r["seconds"] > 0
    assert rows[1]["bytes"] < rows[0]["bytes"]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["raw HDF5", "dctdata 40 dB"]
