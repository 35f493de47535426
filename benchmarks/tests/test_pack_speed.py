"""`python -m benchmarks pack-speed`: its rows, JSON and GPU checks, on a tiny set (timings are the bench's,
not the tests')."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import pack_speed
from dctdata.errors import DctDataError


def test_power_law_fields_are_smooth_and_repeatable():
    a, b = pack_speed.power_law_fields(3, 128, seed=1), pack_speed.power_law_fields(3, 128, seed=1)
    assert a.shape == (3, 1, 128, 128) and a.dtype == np.float32 and np.array_equal(a, b)
    step = np.abs(np.diff(a, axis=-1)).mean()
    assert step < 0.25 * a.std()  # neighbours close: most of the power at low frequencies


@pytest.mark.slow
def test_the_bench_writes_a_row_per_measure_and_its_json(tmp_path, capsys):
    out = tmp_path / "ps.json"
    args = ["--size-mb", "1", "--sets", "fields", "--rows", "fixed", "cli", "peers", "--json", str(out)]
    assert pack_speed.main(args) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {"command", "date", "device"} <= set(result) and result["command"].startswith("python -m benchmarks pack")
    assert [r["row"] for r in rows[:2]] == ["fixed", "cli"] and rows[0]["set"] == "fields"
    assert rows[1]["psnr_min"] is not None and rows[1]["CR"] > rows[0]["CR"] / 4  # the cold CLI's own pack (40 dB)
    for r in rows:
        assert r["MB/s"] > 0 and r["CR"] > 1 and r["seconds"] > 0
    peers = {r["row"] for r in rows[2:]}
    assert peers <= set(pack_speed.PEERS) and peers  # those installed
    printed = capsys.readouterr().out
    assert "fields  fixed" in printed and "--cf 4 --quant int8" in printed


def test_gpu_checks_read_the_gpu_row():
    rows = [
        {"set": "fields", "row": "gpu", "MB/s": 3000.0, "bytes_vs_cpu": 0.001, "differing_share": 1e-5},
        {"set": "fields", "row": "default", "MB/s": 50.0},
    ]
    c = pack_speed.checks(rows, 1024)
    assert c["gpu_GBps"]["met"] and c["gpu_GBps"]["value"] == 3.0 and c["gpu_bytes_vs_cpu"]["met"]
    rows[0]["bytes_vs_cpu"] = -0.006
    assert not pack_speed.checks(rows, 1024)["gpu_bytes_vs_cpu"]["met"]
    assert pack_speed.checks(rows[1:], 1024) == {}


def test_the_scaling_check_reads_one_core_against_every_core():
    rows = [
        {"set": "fields", "row": "default", "seconds": 5.0, "MB/s": 200.0},
        {"set": "fields", "row": "one", "seconds": 9.5, "MB/s": 105.0},
        {"set": "real", "row": "one", "seconds": 99.0, "MB/s": 1.0},
    ]
    c = pack_speed.checks(rows, 1024)
    assert c["cores_vs_one"]["value"] == 1.9 and c["cores_vs_one"]["met"] and "gpu_GBps" not in c
    rows[1]["seconds"] = 8.0
    assert not pack_speed.checks(rows, 1024)["cores_vs_one"]["met"]
    assert pack_speed.checks(rows[:1] + rows[2:], 1024) == {}  # no `one` row of the fields set


def test_a_bad_size_is_one_error():
    with pytest.raises(DctDataError, match=r"--size-mb: expected a positive number of MB\. Got 0"):
        pack_speed.main(["--size-mb", "0"])


def test_difference_counts_the_coefficients_that_differ(tmp_path):
    import dctdata

    x = pack_speed.power_law_fields(6, 32, seed=2)
    y = x.copy()
    y[4] += 0.5 * x[4].std() * np.sin(np.arange(32) / 3.0)  # one sample changed
    for name, data in (("a", x), ("b", x), ("c", y)):
        dctdata.pack(data, tmp_path / f"{name}.dct", cf=4, quant="int8", quiet=True)
    same = pack_speed.difference(tmp_path / "a.dct", tmp_path / "b.dct")
    assert same["differing"] == 0 and same["coefficients"] == 6 * 16 * 4 * 4 and same["bytes"][0] == same["bytes"][1]
    other = pack_speed.difference(tmp_path / "a.dct", tmp_path / "c.dct")
    assert 0 < other["differing"] <= 16 * 4 * 4 and other["largest"] >= 1  # only sample 4's coefficients
