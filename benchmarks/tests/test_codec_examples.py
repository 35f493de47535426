"""The issue-12 and -17 measurement scripts (benchmarks/codec_ablation.py, benchmarks/calibration_time.py,
benchmarks/decode_kernels.py) on tiny configurations: every row and column is there, sizes are positive,
sweeps bracket the level, the JSON round-trips. The current interpreter stands in for the "before" one
(the scripts only need a python whose `import dctdata` works)."""

import importlib
import json
import math
import os
import sys

import pytest


def _load(name, monkeypatch):
    return importlib.import_module(f"benchmarks.{name}")


@pytest.mark.slow
def test_codec_ablation_rows_and_json(tmp_path, capsys, monkeypatch):
    ablation = _load("codec_ablation", monkeypatch)
    path = tmp_path / "ablation.json"
    argv = ["--items", "mri,coffee", "--modes", "tiles", "--max-tiles", "3", "--levels", "40"]
    payload = ablation.main([*argv, "--json", str(path), "--before-python", sys.executable])
    out = capsys.readouterr().out
    # one table line per row, in order, and the landing table
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and " -> " in line]
    assert [r[0].strip() for r in rows] == ["fix", *(fix for fix, _ in ablation.ROWS.values())]
    assert all(len(r) == 4 for r in rows)  # fix, before -> after, the 40 dB cell, packs
    assert "old `calibrate_report`" in out and "new `calibrate_report`" in out
    packs = {p["name"]: p for p in payload["packs"]}
    assert sorted(packs) == ["coffee/tiles", "mri/tiles"]
    always = ("1", "2", "3a", "3b", "7")
    for p in packs.values():
        final = p["curves"]["final"]
        psnrs = [q["psnr"] for q in final]
        assert min(psnrs) <= 40.0 <= max(psnrs)  # the sweep brackets the level
        for points in p["curves"].values():
            assert all(v > 0 for q in points for v in q["bytes"].values())
        assert all(p["rows"][k]["40"] > 0 for k in always)
        # metadata is the only difference in row 1: the compact v2 manifest is smaller than the v1-style one
        assert all(q["bytes"]["zstd19/v2"] < q["bytes"]["zstd19/v1"] for q in final)
        assert p["rows"]["1"]["40"] < 1.0
        # the landing point is the calibrated spec itself: its worst channel is never below the target
        assert p["new_worst_channel"] >= 40.0
        assert math.isfinite(p["old"]["psnr"]) and p["old"]["seconds"] > 0
    assert set(packs["coffee/tiles"]["rows"]) >= {"4", "4f"}  # rotation rows for C > 1 only
    assert not {"4", "4f"} & set(packs["mri/tiles"]["rows"])
    assert "8" in packs["mri/tiles"]["rows"]  # side information row where no rotation is used
    summary = payload["rows"]
    assert summary["1"]["levels"]["40"]["packs"] == 2 and summary["4"]["levels"]["40"]["of"] == 1
    assert payload["landing"]["packs"] == 2
    assert json.loads(path.read_text()) == payload


@pytest.mark.slow
def test_calibration_time_rows_and_tty(tmp_path, capsys, monkeypatch):
    timing = _load("calibration_time", monkeypatch)
    path = tmp_path / "timing.json"
    argv = ["--before-python", sys.executable, "--frames", "3", "--size", "64x80", "--repeat", "2", "--tty-check"]
    argv += ["--threads", "1"]
    payload = timing.main([*argv, "--json", str(path), "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    rows = payload["rows"]
    assert [(r["run"], r["version"]) for r in rows] == [(1, "before"), (1, "current"), (2, "current"), (2, "before")]
    for r in rows:
        assert r["exit"] == 0 and r["decode_error"] is None, (r["exit"], r["stderr_lines"][-1:], r["decode_error"])
        assert r["pack_seconds"] > 0 and r["search_seconds"] > 0 and r["stored_bytes"] > 0
        assert r["psnr"] >= 39.5  # the calibration subset is every frame: the pack lands on its target
        assert not any("calibrate image" in line for line in r["stderr_lines"])  # no terminal, no bar
    assert payload["tty"]["calibrate_bar"] and payload["tty"]["exit"] == 0  # a terminal shows the bar
    table = [line for line in out.splitlines() if line.startswith("| before") or line.startswith("| current")]
    assert len(table) == 4 and "2 CPU(s), 1 thread(s)" in out.replace(f"{os.cpu_count()} CPU", "2 CPU")
    assert payload["speedup"]["search_seconds"] > 0
    assert json.loads(path.read_text()) == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timing.json"]  # frames and packs are removed


def test_decode_kernels_rows(capsys, monkeypatch):
    kernels = _load("decode_kernels", monkeypatch)
    argv = ["--threads", "1", "--sizes", "24", "--cf", "2", "8", "--codec", "v1", "v2", "--repeat", "1"]
    rows = kernels.main([*argv, "--bytes", str(1 << 16)])
    assert [(r["codec"], r["cf"]) for r in rows] == [("v1", 2), ("v1", 8), ("v2", 2), ("v2", 8)]
    for r in rows:
        assert r["batch"] == 29 and r["copy_s"] > 0  # 29 images of 24 x 24 float32 >= 64 KiB
        assert all(r[k] > 0 for k in ("x_portable", "x_chunked", "x_out"))
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| v")]
    assert len(table) == 4 and all(line.endswith("x |") for line in table)
