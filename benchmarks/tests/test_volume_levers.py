"""benchmarks/volume_levers.py on one real volume, two arms, one target: real packs read back, the ratios to
"auto" their own bytes', the DC entropy of the "auto" pack, and bad options refused with one message."""

import json

import numpy as np
import pytest

from benchmarks import volume_levers
from dctdata.errors import DctDataError


def test_volume_levers_on_the_anatomical_volume(tmp_path, capsys):
    pytest.importorskip("nibabel")
    out = tmp_path / "v.json"
    volume_levers.main(["--sets", "anatomical", "--targets", "40", "--arms", "int16", "--json", str(out)])
    run = json.loads(out.read_text())
    text = capsys.readouterr().out
    res = run["sets"]["anatomical"]
    assert res["shape"] == [1, 25, 41, 33] and res["dtype"] == "int16"
    assert res["coded_over_voxels"] == pytest.approx(32 * 48 * 40 / (25 * 41 * 33), abs=0.01)
    auto, forced = res["rows"]
    assert (auto["arm"], forced["arm"], forced["dtype"]) == ("auto", "int16", "int16")
    for r in res["rows"]:
        assert r["psnr"] >= 39.5 and r["bytes"] > r["fixed"] > 0
        assert r["vs_auto"] == pytest.approx(r["bytes"] / auto["bytes"], abs=1e-3)
        assert f"| anatomical | 40 | {r['arm']} | {r['psnr']:.2f} | {r['bytes']:,} |" in text
    assert 0 < auto["dc_bytes"] < auto["bytes"] and 0 < auto["dc_left_bytes"] < auto["bytes"]
    assert "dc_bytes" not in forced and "coded voxels / voxels 1.82" in text


def test_entropy_bytes():
    assert volume_levers.entropy_bytes(np.array([3, 3, 3, 3])) == 0
    assert volume_levers.entropy_bytes(np.arange(16)) == pytest.approx(16 * 4 / 8)


def test_volume_levers_refuses_bad_options():
    with pytest.raises(DctDataError, match=r"--arms: expected one of \('auto', 'int8'.*Got 'nope'"):
        volume_levers.main(["--arms", "nope"])
    with pytest.raises(DctDataError, match=r"--targets: expected positive dB values\. Got \[-1\.0\]"):
        volume_levers.main(["--targets", "-1"])
