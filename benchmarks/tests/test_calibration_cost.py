"""benchmarks/calibration_cost.py on a tiny case: both packs timed, the chosen setting passed to the fixed
pack as flags, the bytes and PSNR of both reported, the two interpreters' target packs compared (the
current interpreter stands in for the "before" one, so they must store the same bytes)."""

import json
import sys

import pytest

from benchmarks import calibration_cost


@pytest.mark.slow
def test_calibration_cost_rows(tmp_path, capsys):
    path = tmp_path / "cost.json"
    argv = ["--frames", "3", "--size", "48x56", "--repeat", "1", "--threads", "1", "--workers", "1"]
    payload = calibration_cost.main(
        [*argv, "--before-python", sys.executable, "--json", str(path), "--workdir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    rows = {r["version"]: r for r in payload["rows"]}
    assert sorted(rows) == ["before", "current"]
    for r in rows.values():
        s = r["setting"]
        assert r["fixed_flags"] == ["--cf", str(s["cf"]), "--mask", s["mask"], "--quant", s["quant"], "--workers", "1"]
        assert len(r["target_seconds"]) == len(r["fixed_seconds"]) == 1
        assert r["ratio"] == pytest.approx(r["target_seconds"][0] / r["fixed_seconds"][0])
        assert r["target_bytes"] > 0 and r["fixed_bytes"] > 0
        assert r["target_psnr_min"] >= 40.0 - 0.4 - 0.01  # the per-sample floor of the target
        assert r["target_psnr_dataset"] >= 40.0 and r["deterministic"]
    assert payload["same_target_bytes"] is True
    assert sum(line.startswith("| before") or line.startswith("| current") for line in out.splitlines()) == 2
    assert "stored the same bytes" in out
    assert json.loads(path.read_text()) == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.json"]  # no frames or packs left behind
