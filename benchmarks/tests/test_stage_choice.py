"""benchmarks/stage_choice.py on its --quick configuration: real packs of both sets at each target, their rows
in the JSON and the table, SPERR's ratio at the PSNR reached, and stored bytes that rise with the target."""

import json

import numpy as np
import pytest
from shipped_images import fmri_series, mri_volume

from benchmarks import stage_choice


def test_the_sets_are_int16_with_a_dark_background():
    slices, volume = fmri_series(slices=4), mri_volume()
    assert slices.shape == (8, 96, 128) and volume.shape == (25, 41, 33)
    for x in (slices, volume):
        assert x.dtype == "int16" and x.min() >= 0 and (x < 0.05 * x.max()).mean() > 0.3 and x.max() > 1000
    assert (slices[4:] != slices[:4]).any()  # the second volume is not a copy


def test_the_real_sets_are_nibabels_images():
    pytest.importorskip("nibabel")
    (slices, d2), (volume, d3) = stage_choice.sets(quick=False, which="real").values()
    assert (slices.shape, d2, volume.shape, d3) == ((48, 96, 128), 2, (1, 25, 41, 33), 3)
    assert slices.dtype == volume.dtype == np.int16 and (slices == 0).mean() > 0.5
    quick = stage_choice.sets(quick=True, which="real")
    np.testing.assert_array_equal(next(iter(quick.values()))[0], slices[:8])


@pytest.mark.parametrize("which", ["real", pytest.param("stand-in", marks=pytest.mark.slow)])
def test_stage_choice_quick_run(tmp_path, capsys, which):
    if which == "real":
        pytest.importorskip("nibabel")
    out = tmp_path / "s.json"
    stage_choice.main(["--quick", "--sets", which, "--json", str(out)])
    run = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert run["targets"] == list(stage_choice.QUICK_TARGETS) and len(run["sets"]) == 2 and run["data"] == which
    for name, res in run["sets"].items():
        assert [r["target"] for r in res["rows"]] == run["targets"]
        for r in res["rows"]:
            assert r["psnr"] >= r["target"] - 0.5 and r["stored_bytes"] > r["fixed_bytes"] > r["manifest_bytes"] > 0
            assert r["payload_cr"] > r["cr"] == pytest.approx(np.prod(res["shape"]) * 4 / r["stored_bytes"], rel=1e-2)
            assert r["vs_sperr"] == pytest.approx(r["cr"] / r["sperr_cr"], rel=2e-2) and r["sperr_cr"] > 1
            assert f"| {name} | {r['target']:g} | {r['psnr']:.2f} |" in text
        assert res["monotone"] and f"{name}: stored bytes rise with the target" in text
