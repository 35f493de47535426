"""`python -m benchmarks fit-speed` on its tiny set: rows for this checkout and a `--before` tree (the same one
here, so both rows must store the same bytes), and its argument error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import fit_speed


@pytest.mark.slow  # two fresh interpreters, each importing torch and packing twice
def test_rows_beside_a_before_tree(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rows = fit_speed.main(["--sets", "tiny", "--before", str(Path(fit_speed.ROOT)), "--json", str(out)])
    assert [(r["set"], r["version"]) for r in rows] == [("tiny", "this"), ("tiny", "before")]
    for r in rows:
        assert r["calls"] >= 1 and 0 < r["fit_s"] <= r["pack_s"] and r["stored"] > 0
        assert r["shape"] == [4, 2, 16, 16] and r["raw"] == 4 * 2 * 16 * 16 * 4
    assert rows[0]["chunks"] == rows[1]["chunks"] and rows[0]["stored"] == rows[1]["stored"]
    assert json.loads(out.read_text()) == rows
    assert capsys.readouterr().out.count("tiny ") == 2


def test_unknown_set_is_an_error(capsys):
    with pytest.raises(SystemExit):
        fit_speed.main(["--sets", "tiny,huge"])
    err = capsys.readouterr().err
    assert "--sets: expected names of" in err and "Got ['huge']" in err
