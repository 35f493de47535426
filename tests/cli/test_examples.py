"""The how-tos of examples/ on tiny settings. The four paper examples: every run's loss decreases, the
table, JSON and PNG plot exist with one row for raw and one per pack setting. The quick start, packing
from Python, and DDP + resume (every sample once per epoch across a stop and a resume). The GPU pipeline's
test is tests/loaders/test_device.py's."""

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
    "em_denoise": [
        "--n",
        "8",
        "--test",
        "2",
        "--size",
        "64",
        "--crop",
        "32",
        "--epochs",
        "3",
        "--batch-size",
        "4",
        "--width",
        "4",
    ],
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


# The how-tos -------------------------------------------------------------------------------------
def test_quick_start_packs_trains_and_learns(monkeypatch, capsys):
    module = _load("quick_start", monkeypatch)
    result = module.main(["--n", "64", "--size", "32", "--workers", "0", "--epochs", "3", "--device", "cpu"])
    assert result["batches"] == 2 and len(result["losses"]) == 6
    assert result["losses"][-1] < result["losses"][0] and result["psnr_min"] >= 40 - 0.5
    out = capsys.readouterr().out
    assert out.startswith("packed 64 samples: ") and out.count("epoch ") == 3


@pytest.mark.slow
def test_from_python_packs_every_kind_of_source(monkeypatch, capsys, tmp_path):
    module = _load("from_python", monkeypatch)
    result = module.main(["--n", "20", "--size", "32", "--out", str(tmp_path)])
    packs = result["packs"]
    assert {k: m.samples for k, m in packs.items()} == dict.fromkeys(packs, 20)
    assert [m.storage for m in packs.values()] == ["zarr", "zarr", "webdataset", "zarr", "webdataset"]
    assert packs["dict"].names == ("u", "t") and packs["generator"].names == ("u", "step")
    assert [s["samples"] for s in packs["writer"].layout["shards"]] == [16, 4]  # samples_per_shard=16
    assert sorted(result["times"]) == pytest.approx([i * 0.1 for i in range(20)])  # every sample once, shuffled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict.dct", "em.dct", "fields.dct", "gen.dct", "sim.dct"]
    assert capsys.readouterr().out.count(" samples, ") == 5


def test_ddp_resume_stops_and_resumes_with_every_sample_once(monkeypatch, capsys, tmp_path):
    module = _load("ddp_resume", monkeypatch)
    argv = ["--out", str(tmp_path), "--samples", "48", "--batch-size", "8", "--workers", "1", "--epochs", "2"]
    stopped = module.main([*argv, "--stop-after", "4"])
    assert stopped["stopped"] and stopped["epoch"] == 0 and len(stopped["seen"]) == 32
    assert (tmp_path / "ckpt" / "rank0.pt").exists()
    finished = module.main(argv)  # the same command again: it resumes
    assert finished == {"stopped": False, "checked": [0, 1]}  # each epoch: all 48 ids, each once
    out = capsys.readouterr().out
    assert "rank 0: resuming epoch 0 after 32 samples" in out
    assert "epoch 1: loss" in out and "all 48 samples seen once across 1 rank(s)" in out


@pytest.mark.slow
def test_ddp_resume_on_two_ranks_with_torchrun(tmp_path):
    import subprocess

    from torchrun_checks import TORCHRUN

    cmd = [*TORCHRUN, str(EXAMPLES / "ddp_resume.py")]
    argv = ["--out", str(tmp_path), "--samples", "64", "--workers", "1", "--epochs", "2"]
    first = subprocess.run([*cmd, *argv, "--stop-after", "3"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "rank 1: stopped after 3 steps" in first.stdout and "epoch 0: loss" in first.stdout
    second = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "rank 1: resuming epoch 1 after 16 samples" in second.stdout
    assert "epoch 1: loss" in second.stdout and "all 64 samples seen once across 2 rank(s)" in second.stdout
