"""benchmarks/docs_table.py: a benchmark's JSON becomes a docs table headed by its command, machine and date."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main as benchmarks_main
from benchmarks.docs_table import cell, find_rows, markdown_table, render
from dctdata.errors import DctDataError

DEVICE_DECODE = {  # the shape python -m benchmarks device-decode --json writes
    "settings": {"device": "cpu", "samples": 256},
    "rows": [
        {"storage": "zarr", "stage": "default", "stored_per_sample": 25475.4, "speed_ratio": 0.9123, "ok": True},
        {"storage": "webdataset", "stage": "zstd", "stored_per_sample": 27538.0, "speed_ratio": 1.1, "ok": False},
    ],
}
GPU_LAYER = {  # gpu-layer --out: two row lists and the device
    "device": "NVIDIA H100 80GB HBM3",
    "decode": [{"size": 256, "cf": 8, "gbps": 123.456, "first_call_s": 1.5}],
    "nvcomp": [{"frames": 32, "ms_per_call": 0.51}],
}


def test_render_heads_the_table_with_command_machine_and_date():
    page = render(
        DEVICE_DECODE, command="python -m benchmarks device-decode", date="2026-11-26", machine="2-core dev box"
    )
    assert page.splitlines() == [
        "- **Command:** `python -m benchmarks device-decode`.",
        "- **Machine:** 2-core dev box.",
        "- **Recorded:** 2026-11-26.",
        "",
        "| storage | stage | stored_per_sample | speed_ratio | ok |",
        "|---|---|---:|---:|---|",
        "| zarr | default | 25,475 | 0.912 | yes |",
        "| webdataset | zstd | 27,538 | 1.1 | no |",
    ]


def test_the_machine_comes_from_the_json_device_and_rows_by_key():
    page = render(
        GPU_LAYER,
        command="python -m benchmarks gpu-layer",
        date="2026-11-26",
        machine=None,
        rows_key="decode",
        commit="abc1234",
    )
    assert "- **Machine:** NVIDIA H100 80GB HBM3." in page
    assert "- **Recorded:** 2026-11-26 (commit `abc1234`)." in page
    assert page.rstrip().splitlines()[-1] == "| 256 | 8 | 123 | 1.5 |"


def test_columns_pick_and_order():
    assert markdown_table(DEVICE_DECODE["rows"], ["speed_ratio", "storage"])[2] == "| 0.912 | zarr |"


def test_cells():
    assert [cell(v) for v in (None, 3, 1234567, 2.0, 0.000123456, 99.94, 1234.5, "a|b")] == [
        "-", "3", "1,234,567", "2", "0.000123", "99.9", "1,234", "a\\|b"
    ]  # fmt: skip


def test_errors_name_what_is_missing():
    with pytest.raises(DctDataError, match=r"r.json: the JSON names no device: pass --machine"):
        render(DEVICE_DECODE, command="c", date="2026-11-26", machine=None, where="r.json")
    with pytest.raises(DctDataError, match=r"--date: expected YYYY-MM-DD. Got 'yesterday'"):
        render(DEVICE_DECODE, command="c", date="yesterday", machine="m")
    with pytest.raises(
        DctDataError, match=r"expected one list of row objects, or --rows KEY to pick one. Got \['decode', 'nvcomp'\]"
    ):
        find_rows(GPU_LAYER, None, "g.json")
    with pytest.raises(
        DctDataError, match=r"g.json: expected a key 'rows' holding the rows. Got keys \['decode', 'device', 'nvcomp'\]"
    ):
        find_rows(GPU_LAYER, "rows", "g.json")
    with pytest.raises(DctDataError, match=r"expected a non-empty list of row objects. Got list"):
        find_rows([], None, "e.json")
    with pytest.raises(DctDataError, match=r"--columns: no row has \['gbps'\]"):
        markdown_table(DEVICE_DECODE["rows"], ["storage", "gbps"])


def test_the_command_prints_the_page_and_names_a_bad_file(tmp_path, capsys):
    path = tmp_path / "dd.json"
    path.write_text(json.dumps(DEVICE_DECODE))
    argv = ["docs-table", str(path), "--command", "x", "--date", "2026-11-26", "--machine", "m", "--columns", "stage"]
    assert benchmarks_main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["| default |", "| zstd |"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert benchmarks_main(["docs-table", str(bad), "--command", "x", "--date", "2026-11-26", "--machine", "m"]) == 1
    assert "bad.json: expected a benchmark's JSON" in capsys.readouterr().err
