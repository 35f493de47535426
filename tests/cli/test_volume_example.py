"""examples/volume_denoise.py on tiny settings: a row for raw and one per target, every run's training loss
falls, the packs are smaller than float32 and land on their targets, and a bad option is one error."""

import json
import math

import pytest
from example_loading import load_example

import dctdata


def test_volume_denoise_trains_from_packs_and_raw(tmp_path, monkeypatch, capsys):
    module = load_example("volume_denoise", monkeypatch)
    argv = [
        "--n",
        "8",
        "--test",
        "2",
        "--size",
        "16",
        "--epochs",
        "3",
        "--batch-size",
        "4",
        "--width",
        "4",
        "--target-psnr",
        "35",
        "45",
        "--threads",
        "1",
    ]
    rows = module.main([*argv, "--out", str(tmp_path)])
    assert [r["setting"] for r in rows] == ["raw", "psnr=35", "psnr=45"]
    for r in rows:
        assert len(r["losses"]) == 3 and r["losses"][-1] < r["losses"][0], r
        assert math.isfinite(r["test_mse"]) and r["test_mse"] > 0
    assert rows[1]["ratio_f32"] > rows[2]["ratio_f32"] > 1.0
    assert rows[1]["psnr_dataset"] >= 34.5 and rows[2]["psnr_dataset"] >= 44.5
    ds = dctdata.open_dataset(tmp_path / "psnr35.zarr")
    assert ds.manifest.field("clean").codec.depth == 16  # packed as volumes
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["raw", "psnr=35", "psnr=45"]
    assert [r["setting"] for r in json.loads((tmp_path / "results.json").read_text())["rows"]] == [
        "raw",
        "psnr=35",
        "psnr=45",
    ]


def test_volume_denoise_refuses_a_bad_option(monkeypatch):
    module = load_example("volume_denoise", monkeypatch)
    with pytest.raises(dctdata.DctDataError, match=r"--batch-size: expected a positive int\. Got 0"):
        module.main(["--batch-size", "0"])
