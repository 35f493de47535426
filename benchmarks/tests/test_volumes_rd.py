"""benchmarks/volumes_rd.py on its --quick configuration: every item has a curve per codec, the JSON's compression
ratios are the curves' own, the table prints them, dctdata's points are real packs read back (PSNR per volume),
and bad options are refused with one message."""

import json
import math

import numpy as np
import pytest

from benchmarks import volumes_rd
from benchmarks.curves import Point, cr_at, pack_psnr
from dctdata.errors import DctDataError


def test_pack_psnr_takes_each_volume_as_one_item():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 4, 5, 6)).astype(np.float32)
    y = x + rng.normal(scale=0.01, size=x.shape).astype(np.float32)
    flat = x.reshape(6, -1)
    nmse = np.mean((x - y).reshape(6, -1) ** 2, 1) / (flat.max(1) - flat.min(1)) ** 2
    assert pack_psnr(x, y) == pytest.approx(-10 * np.log10(nmse.mean()), abs=1e-4)


@pytest.mark.slow
def test_volumes_rd_quick_run(tmp_path, capsys):
    out = tmp_path / "v.json"
    volumes_rd.main(["--quick", "--repeat", "1", "--json", str(out)])
    run = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert set(run["items"]) == set(volumes_rd.ITEMS) and run["targets"] == list(volumes_rd.QUICK_TARGETS)
    for name, item in run["items"].items():
        assert item["shape"] == [2, 1, 16, 16, 16] and item["raw_bytes"] == 2 * 16**3 * 4
        assert set(item["points"]) == {"dctdata 3-D", "dctdata 2-D", "zfp", "sz3", "sperr"}
        ours = [p for p in item["points"]["dctdata 3-D"] if p["bytes"]]
        assert ours and all(20 < p["psnr"] < 80 and p["bytes"] > 0 for p in ours)
        for codec, points in item["points"].items():
            cr = [cr_at([Point(**p) for p in points], item["raw_bytes"], v) for v in volumes_rd.LEVELS]
            for a, b in zip(cr, item["cr"][codec]):  # NaN where the sweep does not reach the level
                assert math.isnan(a) == math.isnan(b) and (math.isnan(a) or a == pytest.approx(b))
        assert f"| {name} (2, 1, 16, 16, 16) |" in text
    assert "| zfp |" in text and "| sz3 |" in text and "| sperr |" in text and "3-D / 2-D" in text


def test_volumes_rd_refuses_bad_options():
    with pytest.raises(DctDataError, match=r"--size: expected a positive int\. Got 0"):
        volumes_rd.main(["--size", "0"])
    with pytest.raises(DctDataError, match=r"--targets: expected dB values separated by commas\. Got '40,x'"):
        volumes_rd.main(["--targets", "40,x"])


def test_the_real_set_is_nibabels_volumes_in_their_own_dtype():
    pytest.importorskip("nibabel")
    real = volumes_rd.items(0, 0, "real")
    assert {k: (v.shape, v.dtype.name) for k, v in real.items()} == {
        "example4d": ((2, 1, 24, 96, 128), "int16"),
        "anatomical": ((1, 1, 25, 41, 33), "int16"),
        "functional": ((20, 1, 3, 21, 17), "float32"),
    }
