"""`python -m benchmarks gpu` and `gpu-doc-table` run small with `--device cpu` (the same code as on CUDA:
the packs, the loader rows, decode="cpu" beside decode="device", the JSON and its must-show ratios)."""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import re

import numpy as np
import pytest
import torch

from benchmarks import gpu
from benchmarks.__main__ import main
from dctdata.errors import DctDataError

ARGS = ["--device", "cpu", "--sizes", "16", "--cf", "2", "8", "--dtypes", "float32", "--repeat", "1", "--samples", "12",
        "--size", "128", "--batch", "4", "8", "--workers", "0", "2", "--epochs", "1", "--epoch-samples", "16",
        "--target-psnr", "35"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small run (two processes make the data, as on a GPU host), its JSON and what it printed."""
    out = tmp_path_factory.mktemp("gpu") / "bench_gpu.json"
    argv = ["gpu", *ARGS, "--jobs", "2", "--json", str(out)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return argv, json.loads(out.read_text()), printed.getvalue(), out


@pytest.mark.slow
def test_gpu_json_records_the_device_date_command_and_every_row(run):
    argv, got, printed, _ = run
    assert got["device"] == "CPU" and got["timer"] == "wall clock" and got["complete"] is True
    assert got["argv"] == argv and got["command"] == "python -m benchmarks " + " ".join(argv)
    when = datetime.datetime.fromisoformat(got["date"])
    assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 3600
    assert got["settings"]["workers"] == [0, 2] and got["settings"]["batch"] == [4, 8]
    assert [(r["size"], r["cf"], r["codec"]) for r in got["decode_rows"]] == [
        (16, 2, "v1"), (16, 2, "v2"), (16, 8, "v1"), (16, 8, "v2")
    ]  # fmt: skip
    rows = got["pipeline_rows"]
    want = [(k, w, b) for b in (4, 8) for w in (0, 2) for k in gpu.PIPELINES]
    assert [(r["pipeline"], r["workers"], r["batch"]) for r in rows] == want
    for r in rows:
        assert r["samples_per_s"] > 0 and r["epochs"] == 1
        assert r["epoch_samples"] == gpu.epoch_samples(r["workers"], r["batch"], 16)  # 4 batches a worker at least
        assert (r["decode_ms"] is None) == (r["pipeline"] == "raw")
        assert r["decode_ms"] is None or 0 < r["decode_ms_min"] <= r["decode_ms"]
        kind = r["pipeline"].rsplit("-", 1)[-1]
        assert r["decode"] == {"cpu": "cpu", "device": "device", "ahead": "device"}.get(kind)
        # where the lossless stage ran: the workers with decode="cpu", the (CPU) device with decode="device"
        assert r["stage_decodes_on"] == {"cpu": "workers", "device": "cpu", None: None}[r["decode"]]
        assert "error" not in r
    starts = ("| default pack (", "| `--lossless zstd` pack (", "| raw float32 ", "| JPEG q=")
    table = [line for line in printed.splitlines() if line.startswith(starts)]
    assert len(table) == len(rows) and all(line.count("|") == 11 for line in table)
    assert all(s >= 0 for s in got["seconds"].values()) and set(got["seconds"]) >= {"setup", "pipeline", "total"}


@pytest.mark.slow
def test_gpu_rows_count_the_bytes_that_cross(run):
    rows = run[1]["pipeline_rows"]
    for w in (0, 2):
        for b in (4, 8):
            by = {r["pipeline"]: r for r in rows if (r["workers"], r["batch"]) == (w, b)}
            raw, cpu, dev = by["raw"], by["default-cpu"], by["default-device"]
            assert raw["stored_per_sample"] == raw["crossed_per_sample"] == 128 * 128 * 4
            # decode="cpu": the int8 coefficients and a side value pair cross, whatever the lossless stage
            assert cpu["crossed_per_sample"] == by["zstd-cpu"]["crossed_per_sample"] < raw["crossed_per_sample"] / 3
            # decode="device": the stored streams cross (plus offsets, side), fewer bytes than the coefficients
            for stage in ("default", "zstd"):
                for d in (by[f"{stage}-device"], by[f"{stage}-ahead"]):  # one decode a batch, or a group's
                    assert d["crossed_per_sample"] < by[f"{stage}-cpu"]["crossed_per_sample"]
                    assert d["crossed_per_sample"] == pytest.approx(d["stored_per_sample"], rel=0.1)
            assert dev["name"].startswith('default pack (entropy coder), decode="device"')
            assert by["jpeg"]["crossed_per_sample"] == pytest.approx(by["jpeg"]["stored_per_sample"], rel=0.01)
            assert by["jpeg"]["psnr"] >= cpu["psnr"] or "q=100" in by["jpeg"]["name"]
            assert raw["psnr"] is None and cpu["psnr"] == dev["psnr"]


@pytest.mark.slow
def test_gpu_must_show_ratios_come_from_the_rows(run):
    got = run[1]
    rows, checks = got["pipeline_rows"], got["must_show"]
    row = {(r["pipeline"], r["workers"], r["batch"]): r for r in rows}
    single, ahead = row["default-device", 2, 4], row["default-ahead", 2, 4]
    dev = max(single, ahead, key=lambda r: r["samples_per_s"])  # the faster decode="device" pipeline
    cpu, zcpu = row["default-cpu", 2, 4], row["zstd-cpu", 2, 4]
    assert checks["device_vs_cpu_8w"]["value"] == pytest.approx(dev["samples_per_s"] / cpu["samples_per_s"])
    assert dev["pipeline"] in checks["device_vs_cpu_8w"]["what"]
    for key in ("default-device", "default-ahead"):
        assert checks["device_vs_cpu_8w"]["by_batch"][f"{key}/8"] == pytest.approx(
            row[key, 2, 8]["samples_per_s"] / row["default-cpu", 2, 8]["samples_per_s"]
        )
    assert checks["device_vs_zstd_cpu"]["value"] == pytest.approx(dev["samples_per_s"] / zcpu["samples_per_s"])
    assert checks["crossing_over_stored"]["value"] == pytest.approx(
        dev["crossed_per_sample"] / dev["stored_per_sample"]
    )
    assert checks["batch32_decode_ms"]["value"] == single["decode_ms"]
    assert checks["batch32_decode_ms_grouped"]["value"] == ahead["decode_ms"] > 0
    assert checks["batch256"]["decode_ms"] == row["default-device", 2, 8]["decode_ms"]
    for key in ("device_vs_cpu_8w", "device_vs_zstd_cpu", "crossing_over_stored", "batch32_decode_ms"):
        assert (checks[key]["workers"], checks[key]["batch"]) == (2, 4)  # the most workers, the smallest batch
    decode = {(r["size"], r["cf"], r["dtype"], r["codec"]): r["GBps"] for r in got["decode_rows"]}
    low = min(decode[16, cf, "float32", "v2"] / decode[16, cf, "float32", "v1"] for cf in (2, 8))
    assert checks["v2_over_v1_min"]["value"] == pytest.approx(low) and checks["v2_over_v1_min"]["met"] == (low >= 0.9)


def test_must_show_thresholds_on_given_rows():
    def row(key, w, b, sps, crossed=100.0, stored=100.0, ms=0.5):
        return {"pipeline": key, "workers": w, "batch": b, "samples_per_s": sps, "crossed_per_sample": crossed,
                "stored_per_sample": stored, "decode_ms": ms}  # fmt: skip

    rows = [row("default-cpu", 8, 32, 1000), row("default-device", 8, 32, 1600, crossed=101.5, ms=0.8),
            row("zstd-cpu", 8, 32, 1700), row("default-cpu", 4, 32, 10), row("default-device", 4, 32, 10),
            row("default-cpu", 8, 256, 1000), row("default-device", 8, 256, 1200, ms=2.0)]  # fmt: skip
    checks = gpu.must_show(rows, [])
    assert checks["device_vs_cpu_8w"]["value"] == 1.6 and checks["device_vs_cpu_8w"]["met"] is True
    assert checks["device_vs_cpu_8w"]["by_batch"] == {"default-device/32": 1.6, "default-device/256": 1.2}
    assert "batch32_decode_ms_grouped" not in checks  # no DecodeAhead rows
    assert (
        checks["device_vs_zstd_cpu"]["value"] == pytest.approx(1600 / 1700) and not checks["device_vs_zstd_cpu"]["met"]
    )
    assert checks["crossing_over_stored"]["value"] == pytest.approx(1.015) and checks["crossing_over_stored"]["met"]
    assert checks["batch32_decode_ms"]["met"] is True and checks["batch32_decode_ms"]["threshold"] == "< 1.0"
    assert checks["batch256"]["decode_samples_per_s"] == pytest.approx(256 / 2e-3)
    assert "v2_over_v1_min" not in checks
    table = gpu.format_must_show(checks)
    assert "| device_vs_zstd_cpu | 0.941 | >= 1.0 | **no** |" in table and "(workers=8, batch=32)" in table


def test_cycled_batches_hold_distinct_samples():
    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i

    data = gpu._Cycled(Data(), 12)
    assert len(data) == 12 and data[7] == 2
    assert data.__getitems__([0, 5, 10, 3]) == [0, 1, 2, 3]  # 5 and 10 are sample 0 again: the next ones unread
    assert sorted(data.__getitems__([4, 9, 14, 2, 7])) == [0, 1, 2, 3, 4]
    with pytest.raises(DctDataError, match=r"batch: expected at most the 5 packed samples \(--samples\)\. Got 6"):
        data.__getitems__(list(range(6)))


def test_synthetic_parts_make_the_whole_set():
    from benchmarks.loader import synthetic

    whole = synthetic(5, 32)
    parts = np.concatenate([gpu.synthetic_part(5, 32, 0, 2), gpu.synthetic_part(5, 32, 2, 5)])
    assert np.array_equal(parts, whole) and parts.dtype == np.float32


@pytest.mark.slow
def test_gpu_doc_table_renders_one_run(run, tmp_path, capsys):
    _, got, _, path = run
    out = tmp_path / "section.md"
    main(["gpu-doc-table", str(path), "--out", str(out)])
    text = out.read_text()
    assert text.startswith('## decode="device" on CPU\n')
    assert f"- **Command:** `{got['command']}`" in text and f"- **Recorded:** {got['date']}" in text
    assert "- **Machine:** CPU, " in text and "wall clock" in text
    rows = [line for line in text.splitlines() if line.startswith("| default pack (entropy coder)")]
    per_setting = sum(k.startswith("default-") for k in gpu.PIPELINES)  # cpu, device, ahead
    assert len(rows) == 4 * per_setting and all(line.count("|") == 11 for line in rows)
    assert re.search(r"^\| device_vs_cpu_8w \| \d+\.\d{3} \| >= 1\.5 \| (yes|\*\*no\*\*) \|", text, re.M)
    assert "| size | CF | float32 v1 | float32 v2 | float32 v2/v1 |" in text and "| 16² | 8 |" in text
    main(["gpu-doc-table", str(path), "--no-decode"])
    assert "| size | CF |" not in capsys.readouterr().out


def test_gpu_doc_table_refuses_what_gpu_did_not_write(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["gpu-doc-table", str(bad)]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"python -m benchmarks gpu-doc-table: error: .*bad\.json: expected JSON from `python -m "
                        r"benchmarks gpu --json`\. Got Expecting property name.*\n", err)  # fmt: skip
    bad.write_text(json.dumps({"device": "x", "date": "y"}))
    assert main(["gpu-doc-table", str(bad)]) == 1
    assert (
        "Got one without command, settings, decode_rows, pipeline_rows, must_show, complete" in capsys.readouterr().err
    )
    assert main(["gpu-doc-table", str(tmp_path / "missing.json")]) == 1
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--batch", "13"], r"--batch/--workers: expected batches of 1\.\.12 samples \(--samples\) and workers >= 0"),
        (["--workers", "-1"], r"--batch/--workers: expected .* Got batches \[4, 8\], workers \[-1\]"),
        (["--epochs", "0"], r"--epochs: expected a positive int\. Got 0"),
    ],
)
def test_gpu_refuses_settings_it_cannot_run(extra, message, capsys):
    assert main(["gpu", *ARGS, *extra]) == 1
    assert re.search(message, capsys.readouterr().err)


def test_gpu_json_keeps_the_rows_of_a_run_cut_short(tmp_path, monkeypatch, capsys, caplog):
    calls = []

    def measure(case, device, workers, batch, epochs, length):
        calls.append(case["name"])
        if len(calls) == 2:
            raise DctDataError("boom")  # one pipeline failing: the others still run
        if len(calls) == 4:
            raise KeyboardInterrupt  # what a timeout's signal does to the run, as far as the rows go
        return {"samples_per_s": 10.0 * len(calls), "crossed_per_sample": 1.0, "decode_ms": 1.0,
                "decode_ms_min": 1.0, "epoch_samples": length}  # fmt: skip

    monkeypatch.setattr(gpu, "measure", measure)
    out = tmp_path / "cut.json"
    args = ["gpu", "--device", "cpu", "--sizes", "--samples", "8", "--size", "32", "--batch", "4", "--workers", "0",
            "--jobs", "1", "--target-psnr", "35", "--json", str(out)]  # fmt: skip
    assert main(args) == 130
    got = json.loads(out.read_text())
    assert got["complete"] is False and got["decode_rows"] == []
    rows = got["pipeline_rows"]
    assert [r["samples_per_s"] for r in rows] == [10.0, None, 30.0]
    assert [r["pipeline"] for r in rows] == list(gpu.PIPELINES[:3])
    assert rows[1]["error"] == "DctDataError: boom" and rows[1]["decode_ms"] is None
    checks = got["must_show"]  # from the rows it has
    # the failed one-decode-a-batch row is left out: the DecodeAhead row stands for decode="device"
    assert checks["device_vs_cpu_8w"]["value"] == 3.0 and "default-ahead" in checks["device_vs_cpu_8w"]["what"]
    assert "device_vs_zstd_cpu" not in checks and "batch32_decode_ms" in checks  # no zstd-cpu row yet
    printed = capsys.readouterr()
    assert re.search(r"^ +\d+ s  workers=0 batch=4 default-device: failed: DctDataError: boom$", printed.out, re.M)
    assert re.search(r"^ +\d+ s  workers=0 batch=4 default-ahead: 30 samples/s$", printed.out, re.M)
    assert "default-device, workers=0, batch=4: boom" in caplog.text
    table = gpu.format_pipeline_rows(rows).splitlines()
    assert "| failed: DctDataError: boom | — |" in table[3] and table[3].count("|") == 11


def test_setup_packs_in_this_process_where_processes_cannot_start(tmp_path, monkeypatch, caplog):
    from concurrent.futures.process import BrokenProcessPool

    def broken(self, zstd):
        raise BrokenProcessPool("no spawn here")

    monkeypatch.setattr(gpu.Setup, "_make_in_processes", broken)
    setup = gpu.Setup(str(tmp_path), 6, 32, 35.0, jobs=3).start().wait()
    assert setup.jobs == 1 and "packing in 3 processes failed (no spawn here): packing in this one" in caplog.text
    assert np.load(setup.x).shape == (6, 1, 32, 32) and setup.seconds > 0
    _q, files, _ = setup.jpeg
    assert len(files) == 6 and all((tmp_path / name / "manifest.json").exists() for name in ("default", "zstd"))


def test_gpu_decode_only_writes_the_decode_table_and_its_ratio(tmp_path, capsys):
    out = tmp_path / "decode.json"
    argv = ["gpu", "--device", "cpu", "--sizes", "16", "--cf", "2", "--dtypes", "float32", "--repeat", "2",
            "--decode-only", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    got = json.loads(out.read_text())
    assert got["complete"] and got["pipeline_rows"] == []
    rows = {r["codec"]: r for r in got["decode_rows"]}
    assert set(rows) == {"v1", "v2"} and all(r["GBps"] > 0 and r["latency_ms"] > 0 for r in rows.values())
    assert got["must_show"]["v2_over_v1_min"]["value"] == pytest.approx(rows["v2"]["GBps"] / rows["v1"]["GBps"])
    assert "v2_over_v1_min" in capsys.readouterr().out


def test_gpu_decode_only_needs_sizes(capsys):
    assert main(["gpu", "--device", "cpu", "--sizes", "--decode-only"]) == 1
    assert "--decode-only: expected --sizes (the decode table's sizes). Got none" in capsys.readouterr().err
