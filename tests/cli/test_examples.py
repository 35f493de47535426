"""The four paper examples end to end on tiny settings: every run's loss decreases, the table, JSON and
PNG plot exist with one row for raw and one per pack setting."""

import importlib
import json
import math
from pathlib import Path

import pytest
from example_loading import load_example
from PIL import Image

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


_load = load_example


CASES = {
    "classify": ["--n", "64", "--test", "40", "--epochs", "3", "--batch-size", "16", "--width", "4"],
    "em_denoise": "--n 8 --test 2 --size 64 --crop 32 --epochs 3 --batch-size 4 --width 4".split(),
    "optical_damage": ["--n", "6", "--test", "2", "--crop", "64", "--epochs", "3", "--batch-size", "3", "--width", "4"],
    "slstr_cloud": ["--n", "8", "--test", "2", "--size", "32", "--epochs", "3", "--batch-size", "4", "--width", "4"],
}
SETTINGS = ["cf=4", "psnr=30"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs_and_learns(name, tmp_path, monkeypatch, capsys):
    module = _load(name, monkeypatch)
    out = tmp_path / name
    rows = module.main([*CASES[name], "--settings", *SETTINGS, "--out", str(out), "--threads", "1"])
    assert [r["setting"] for r in rows] == ["raw", *SETTINGS]
    for r in rows:
        assert len(r["losses"]) == 3 and r["losses"][-1] < r["losses"][0], (r["setting"], r["losses"])
        assert math.isfinite(r["metric_raw"]) and math.isfinite(r["metric_coded"])
    assert rows[0]["ratio_src"] == 1.0 and math.isinf(rows[0]["psnr_min"])
    assert all(r["ratio_f32"] > 1.0 and r["transfer"] > 1.0 for r in rows[1:])
    assert "int8" in rows[2]["codec"] and "float32" in rows[1]["codec"]  # psnr=... -> int8; cf=... -> float32 (paper)
    # outputs: markdown table (stdout and file), JSON, PNG
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["raw", *SETTINGS]
    md_rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| ")]
    assert md_rows == table
    payload = json.loads((out / "results.json").read_text())
    assert payload["task"] == name and [r["setting"] for r in payload["rows"]] == ["raw", *SETTINGS]
    with Image.open(out / "results.png") as img:
        assert img.size == (720, 460) and img.format == "PNG"
    assert sorted(p.name for p in (out / "packs").iterdir()) == ["cf4.zarr", "psnr30.zarr"]


def test_bad_setting_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    common = importlib.import_module("_common")
    with pytest.raises(
        common.dctdata.DctDataError, match=r"--settings 'cf=4\+speed=9': expected tokens cf\|mask\|quant\|psnr=VALUE"
    ):
        common.parse_setting("cf=4+speed=9")
    with pytest.raises(common.dctdata.DctDataError, match=r"expected a number for cf. Got 'x'"):
        common.parse_setting("cf=x")
    with pytest.raises(common.dctdata.DctDataError, match=r"expected cf=N or psnr=DB. Got neither"):
        common.parse_setting("quant=int8")
    assert common.parse_setting("psnr=35") == {"target_psnr": 35.0, "quant": "int8"}
    assert common.parse_setting("cf=5+quant=int16+mask=triangle") == {"cf": 5, "quant": "int16", "mask": "triangle"}


def test_batch_larger_than_the_set_is_refused(tmp_path, monkeypatch):
    module = _load("classify", monkeypatch)
    with pytest.raises(
        module._common.dctdata.DctDataError, match=r"--batch-size: expected at most --n \(8\) samples per batch. Got 16"
    ):
        module.main(
            ["--n", "8", "--test", "4", "--batch-size", "16", "--settings", "cf=4", "--out", str(tmp_path / "x")]
        )
