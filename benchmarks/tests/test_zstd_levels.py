"""benchmarks/zstd_levels.py on a tiny configuration: one row per set and level, in order; the table says what
the JSON says, zstd-9's own ratios are exactly 1, each level's bytes are what numcodecs' Zstd stores for the
pack's coefficients, and a bad --levels is refused with one message."""

import math

import numcodecs
import numpy as np
import pytest

from benchmarks import entropy_decode_speed, zstd_levels


def test_zstd_levels_table(tmp_path, capsys, monkeypatch):
    levels = zstd_levels
    argv = ["--sets", "em,camera", "--levels", "19,9,1,9", "--samples", "3", "--size", "64", "--repeat", "2"]
    payload = levels.main([*argv, "--json", str(tmp_path / "z.json")])
    rows = payload["rows"]
    assert [(r["set"], r["level"]) for r in rows] == [(s, v) for s in ("em", "camera") for v in (19, 9, 1)]
    table = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    table = [cells for cells in table if "---" not in cells[0]]
    assert len(table) == 1 + len(rows) and all(len(cells) == 8 for cells in table)
    for r, cells in zip(rows, table[1:]):
        floats = r["samples"] * math.prod(r["sample_shape"]) * 4
        assert r["decode_mb_s"] == pytest.approx(floats / r["decode_seconds"] / 1e6)
        assert r["encode_mb_s"] == pytest.approx(floats / r["encode_seconds"] / 1e6)
        assert [c.strip() for c in cells[:3]] == [r["set"], r["dtype"], f"zstd-{r['level']}"]
        assert float(cells[3]) == pytest.approx(r["bytes_per_sample"], abs=0.5)
        assert float(cells[7]) == pytest.approx(r["decode_vs_base"], abs=0.005) and r["decode_vs_base"] > 0
    for r in rows:
        if r["level"] == 9:
            assert r["bytes_vs_base"] == 1.0 and r["decode_vs_base"] == 1.0
    assert (tmp_path / "z.json").read_text().startswith("{")


def test_zstd_levels_bytes_are_the_codecs(tmp_path, monkeypatch):
    import dctdata

    levels = zstd_levels
    x = entropy_decode_speed.load_set("em", 2, 64)
    rows = levels.measure_set("em", x, (3, 9), 40.0, 1, str(tmp_path))
    ds = dctdata.open_dataset(tmp_path / "em")  # the pack the example measured
    field = next(f for f in ds.manifest.fields if f.codec is not None)
    q = ds.reader.read(field, 0, ds.manifest.samples)
    for r in rows:  # one numcodecs Zstd stream per sample, as a pack stores them
        codec = numcodecs.Zstd(level=r["level"])
        stored = [len(codec.encode(np.ascontiguousarray(q[i : i + 1]))) for i in range(len(q))]
        assert r["bytes_per_sample"] == sum(stored) / len(stored)


@pytest.mark.parametrize("bad", ["0", "23", "9,x", ","])
def test_zstd_levels_refuses_bad_levels(bad, monkeypatch):
    levels = zstd_levels
    with pytest.raises(SystemExit, match=r"--levels: expected zstd levels in 1\.\.22\. Got"):
        levels.main(["--levels", bad])
