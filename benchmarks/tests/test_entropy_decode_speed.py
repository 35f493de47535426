"""benchmarks/entropy_decode_speed.py on a tiny configuration: one row per set and coder plus the pack
reader's, in order; the table's numbers agree with each other (MB/s of float32 output and M symbols/s
from the same seconds), the reader row stores what the pack's stage stores, and the JSON round-trips."""

import json
import math

import pytest

from benchmarks import entropy_decode_speed


def _load(monkeypatch):
    return entropy_decode_speed


def test_entropy_decode_speed_table(tmp_path, capsys, monkeypatch):
    speed = _load(monkeypatch)
    default = speed.default_lookups()
    path = tmp_path / "speed.json"
    argv = ["--sets", "em,astronaut", "--samples", "4", "--size", "64", "--repeat", "1", "--json", str(path)]
    payload = speed.main(argv)
    out = capsys.readouterr().out
    rows = payload["rows"]
    expected = [(s, c) for s in ("em", "astronaut") for c in (*speed.CODERS, "pack reader")]
    assert [(r["set"], r["coder"].split(" (")[0]) for r in rows] == expected
    table = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == 1 + len(rows) and all(len(cells) == 8 for cells in table)
    for r, cells in zip(rows, table[1:]):
        assert r["samples"] == 4 and r["sample_shape"][1:] == [64, 64] and r["seconds"] > 0
        floats = r["samples"] * math.prod(r["sample_shape"]) * 4
        assert r["mb_s"] == pytest.approx(floats / r["seconds"] / 1e6)
        assert r["msym_s"] == pytest.approx(r["samples"] * math.prod(r["coefficients"]) / r["seconds"] / 1e6)
        assert 0 < r["bytes_per_sample"] < floats / r["samples"]
        assert [c.strip() for c in cells[:3]] == [r["set"], r["dtype"], r["coder"]]
        assert float(cells[5]) == pytest.approx(r["mb_s"], abs=0.5)
        assert float(cells[7]) == pytest.approx(r["vs_gather"], abs=0.005) and r["vs_gather"] > 0
    for s in ("em", "astronaut"):
        by = {r["coder"].split(" (")[0]: r for r in rows if r["set"] == s}
        reader = by["pack reader"]
        assert reader["coder"] == f"pack reader ({reader['pack_stage']})"
        assert reader["bytes_per_sample"] == by[reader["pack_stage"]]["bytes_per_sample"]
        # the no-AVX2 rows decode the same streams; the 2-state layout never stores more
        for c in ("ctxrans", "ctxrans 2-state"):
            assert by[f"{c} no AVX2"]["bytes_per_sample"] == by[c]["bytes_per_sample"]
        assert by["ctxrans 2-state"]["bytes_per_sample"] <= by["ctxrans"]["bytes_per_sample"]
        for c in ("ctxrans, gather instruction", "ctxrans, scalar loads"):  # one stream, two kinds of lookup
            assert by[c]["bytes_per_sample"] == by["ctxrans"]["bytes_per_sample"]
        assert by["ctxrans, gather instruction"]["vs_gather"] == 1.0  # its own time over its own time
    assert {r["sample_shape"][0] for r in rows if r["set"] == "astronaut"} == {3}
    assert json.loads(path.read_text())["rows"] == rows
    # the row named "ctxrans" is the CPU's default, which the run leaves as it found it
    assert payload["default_lookups"] == default == speed.default_lookups()
    assert f"this CPU's default lookups (the ctxrans row): {default}" in out


def test_entropy_decode_speed_rejects_unknown_set(monkeypatch):
    speed = _load(monkeypatch)
    with pytest.raises(SystemExit, match="--sets: expected names"):
        speed.main(["--sets", "nope", "--samples", "2", "--size", "64", "--repeat", "1"])
