"""`python -m benchmarks rd-compare`: after/before bytes at equal PSNR from two rd runs."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import rd_compare
from dctdata.errors import DctDataError


def run(name: str, scale: float) -> dict:
    points = [{"setting": f"t{p}", "psnr": p, "bytes": scale * 100 * 2 ** (p / 10)} for p in (33.0, 38.0, 43.0)]
    return {"name": name, "curves": {"dctdata": points}}


def test_the_ratio_is_after_over_before_at_each_level_and_nan_outside_the_sweep(tmp_path, capsys):
    before, after = [run("a", 1.0), run("b", 2.0)], [run("a", 0.9), run("b", 2.0)]
    rows = rd_compare.ratios(before, after)
    assert [n for n, _ in rows] == ["a", "b"]
    assert rows[0][1][:2] == pytest.approx([0.9, 0.9]) and rows[1][1][:2] == pytest.approx([1.0, 1.0])
    assert math.isnan(rows[0][1][2])  # 45 dB: past the sweep, never extrapolated
    for path, packs in (("b.json", before), ("a.json", after)):
        (tmp_path / path).write_text(json.dumps({"packs": packs}))
    assert rd_compare.main([str(tmp_path / "b.json"), str(tmp_path / "a.json")]) == 0
    assert "| a | 0.900 | 0.900 | - |" in capsys.readouterr().out


def test_runs_of_other_packs_are_refused():
    with pytest.raises(DctDataError, match="expected the same packs in both runs"):
        rd_compare.ratios([run("a", 1.0)], [run("b", 1.0)])
