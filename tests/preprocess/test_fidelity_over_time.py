"""Fidelity of a trajectory pack over time (issue 47): the pack records PSNR (min, mean) and relative L2 error
(mean, max) per field, channel and time step; the pack summary, `dctdata info --step-ranges` and `dctdata verify`
show them per step range, with values numpy computes from the source and the decode; every frame is checked
against the per-sample floor, and `dctdata verify --source` names a frame that breaks it."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

import dctdata
from dctdata.cli import main
from dctdata.codec.metrics import item_mean_square
from dctdata.datasets.well import write_well_file
from dctdata.errors import DctDataError
from dctdata.format import read_manifest
from dctdata.preprocess.sources import open_source
from dctdata.report import StepFigures, floor_problems, frame_steps, step_ranges, time_lines
from dctdata.verify import verify_dataset

N_TRAJ, N_STEPS, SIZE = 2, 12, 16
RANGES = [(0, 4), (4, 12)]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A Well file of 2 shallow-water trajectories of 12 steps (height, velocity_x, velocity_y) packed at 35 dB."""
    d = tmp_path_factory.mktemp("over-time")
    raw = d / "raw"
    raw.mkdir()
    write_well_file(raw / "a.h5", n_traj=N_TRAJ, n_steps=N_STEPS, size=SIZE, seed=3)
    dctdata.pack(str(raw), d / "z", target_psnr=35, workers=1, quiet=True)
    return d


def _source(raw) -> dict[str, np.ndarray]:
    src = open_source(str(raw))
    try:
        return next(src.batches(len(src)))[1]
    finally:
        src.close()


def _expected(source: dict[str, np.ndarray], decoded: dict[str, np.ndarray]) -> dict[tuple, tuple]:
    """{(field, channel, range): (PSNR min, PSNR mean, rel. L2 mean, rel. L2 max)} in numpy, float64."""
    steps = np.arange(N_TRAJ * N_STEPS) % N_STEPS
    out = {}
    for name, y in decoded.items():
        x = source[name].astype(np.float64).reshape(y.shape)
        err = ((y.astype(np.float64) - x) ** 2).reshape(*x.shape[:2], -1)
        ref = x.reshape(*x.shape[:2], -1)
        rng, norm = ref.max(-1) - ref.min(-1), (ref**2).sum(-1)
        # a constant frame has no PSNR, an all-zero one no relative error (step 0's velocity): left out
        with np.errstate(divide="ignore", invalid="ignore"):
            psnr = np.where(rng > 0, 10 * np.log10(rng**2 / err.mean(-1)), np.nan)
            rel = np.where(norm > 0, np.sqrt(err.sum(-1) / norm), np.nan)
        for c in range(x.shape[1]):
            for a, b in RANGES:
                p, r = psnr[(steps >= a) & (steps < b), c], rel[(steps >= a) & (steps < b), c]
                out[name, c, (a, b)] = (np.nanmin(p), np.nanmean(p), np.nanmean(r), np.nanmax(r))
    return out


def test_recorded_figures_per_step_range_match_numpy(packed):
    m = read_manifest(packed / "z")
    figures = StepFigures.from_manifest(m)
    assert figures is not None and figures.steps == N_STEPS and figures.width == 1
    ds = dctdata.open_dataset(packed / "z")
    items = [dict(zip(m.names, ds[i])) for i in range(len(ds))]
    decoded = {}
    for name in ("height", "velocity"):
        layer = ds.decompressor(name)  # the readers' decode of the stored coefficients
        decoded[name] = np.stack([layer(item[name]).numpy().reshape(m.field(name).shape) for item in items])
    want = _expected(_source(packed / "raw"), decoded)
    rows = figures.rows(RANGES, list(m.fields))
    assert len(rows) == len(want) == 3 * len(RANGES)  # height; velocity_x, velocity_y
    for r in rows:
        lo, mean, rel, rel_max = want[r["field"], r["channel"], r["steps"]]
        assert r["frames"] == N_TRAJ * (r["steps"][1] - r["steps"][0])
        assert r["psnr_min"] == pytest.approx(lo, abs=1e-3) and r["psnr_mean"] == pytest.approx(mean, abs=1e-3)
        assert r["rel_l2_mean"] == pytest.approx(rel, rel=1e-4) and r["rel_l2_max"] == pytest.approx(rel_max, rel=1e-4)
        # every frame meets the floor the target set: the error does not grow along the trajectory
        assert r["below"] == 0 and r["psnr_min"] >= r["floor"] - 1e-4
    assert {r["name"] for r in rows} == {"height", "velocity_x", "velocity_y"}
    assert floor_problems(figures, list(m.fields)) == []


def test_info_and_pack_summary_show_the_ranges(packed, capsys, tmp_path):
    assert main(["info", str(packed / "z"), "--step-ranges", "0:4,4:"]) == 0
    out = capsys.readouterr().out
    m = read_manifest(packed / "z")
    table = time_lines(m, "0:4,4:")
    assert len(table) == 2 + 3 * len(RANGES) and all(line in out for line in table)
    assert "| velocity | 1 velocity_y | 4..11 | 16 |" in out
    assert "fidelity_over_time" not in out  # not in the pack settings line
    assert main(["info", str(packed / "z"), "--step-ranges", "20:"]) == 1
    captured = capsys.readouterr()
    assert "--step-ranges: expected ranges that start before step 12" in captured.err and captured.out == ""
    assert main(["pack", str(packed / "raw"), str(tmp_path / "z"), "--target-psnr", "35", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "fidelity over time" in out and "| height | 0 height | 0..2 | 6 |" in out  # 4 default ranges of 3 steps
    assert sum(line.strip().startswith("| velocity |") for line in out.splitlines()) == 2 * 4


def test_verify_against_the_source_and_a_perturbed_frame(packed, tmp_path, capsys):
    problems, summary = verify_dataset(packed / "z")  # the recorded figures
    assert problems == [] and len(summary["over_time"]) == 2 + 3 * 4
    src = open_source(str(packed / "raw"))
    problems, summary = verify_dataset(
        packed / "z", reference=lambda a, b: next(src.batches(b - a, a, b))[1], describe=src.where, ranges=RANGES
    )
    src.close()
    assert problems == []
    recorded = StepFigures.from_manifest(read_manifest(packed / "z")).rows(RANGES)
    for got, rec in zip(summary["over_time_rows"], recorded):
        assert got["steps"] == rec["steps"] and got["psnr_min"] == pytest.approx(rec["psnr_min"], abs=1e-3)
        assert got["rel_l2_max"] == pytest.approx(rec["rel_l2_max"], rel=1e-4)
    assert main(["verify", str(packed / "z"), "--source", str(packed / "raw"), "--no-decode"]) == 1
    assert "--source: expected a decode to measure (without --no-decode)" in capsys.readouterr().err
    # the same pack against a source whose frame (trajectory 1, step 7) of height changed: that frame breaks the floor
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(packed / "raw" / "a.h5", bad / "a.h5")
    with h5py.File(bad / "a.h5", "r+") as f:
        h = f["t0_fields/height"]
        frame = h[1, 7]
        h[1, 7] = frame + 0.05 * (frame.max() - frame.min()) * np.random.default_rng(0).standard_normal(frame.shape)
    assert main(["verify", str(packed / "z"), "--source", str(bad), "--step-ranges", "0:4,4:"]) == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1, out
    assert (
        "trajectory 1 step 7 (frame 19) field 'height' channel 0: expected a PSNR >= the per-sample floor" in fails[0]
    )
    assert "| height | 0 height | 4..11 | 16 |" in out and "| 1 (floor " in out  # the range counts the frame


def test_floor_problems_name_the_step_bin():
    """Frames flagged below the floor are counted per step bin and named per bin; parts' figures merge."""
    field = SimpleNamespace(name="u", attrs={"channels": ["speed"]}, codec=SimpleNamespace(min_psnr=39.5))
    fig = StepFigures({"u": 1}, bins=3)
    psnr = np.array([[40.0], [39.0], [41.0], [38.5]])
    fig.add("u", np.array([0, 1, 2, 2]), psnr, np.full((4, 1), 0.01), psnr < 39.5)
    rows = fig.rows([(0, 2), (2, 3)], [field])
    assert [r["frames"] for r in rows] == [2, 2] and [r["below"] for r in rows] == [1, 1]
    assert rows[0]["psnr_mean"] == pytest.approx(39.5) and rows[1]["psnr_min"] == 38.5 and rows[0]["name"] == "speed"
    lines = floor_problems(fig, [field])
    assert len(lines) == 2
    assert lines[0].startswith("field 'u' channel 0 (speed) steps 1..1: expected every frame's PSNR >= the floor 39.50")
    assert "Got 1 frame(s) below, the lowest 38.50 dB" in lines[1]
    merged = StepFigures.merged([fig.to_json(), fig.to_json()])
    assert merged.rows([(0, 3)], [field])[0]["below"] == 4 and merged.rows([(0, 3)])[0]["frames"] == 8
    assert StepFigures.merged([fig.to_json(), None]) is None  # a resumed part without figures: none recorded


def test_step_ranges():
    assert step_ranges(None, 12) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert step_ranges("2", 5) == [(0, 2), (2, 5)] or step_ranges("2", 5) == [(0, 3), (3, 5)]
    assert step_ranges(10, 3) == [(0, 1), (1, 2), (2, 3)]
    assert step_ranges("0:4,4:", 12) == [(0, 4), (4, 12)]
    assert step_ranges([(2, 20)], 12) == [(2, 12)]
    with pytest.raises(DctDataError, match=r"--step-ranges: expected a count or ranges of steps A:B,C:D"):
        step_ranges("0-4", 12)
    with pytest.raises(DctDataError, match=r"--step-ranges: expected 0 <= A < B in each range A:B\. Got 4:2"):
        step_ranges("4:2", 12)
    with pytest.raises(DctDataError, match=r"start before step 12 .* Got a range from step 50 in '0:4,50:'"):
        step_ranges("0:4,50:", 12)
    with pytest.raises(DctDataError, match=r"--step-ranges: expected a count >= 1"):
        step_ranges(0, 12)


def test_source_refused_for_a_pack_of_samples(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((4, 16, 16)).astype(np.float32))
    dctdata.pack(str(tmp_path / "x.npy"), tmp_path / "p", cf=4, workers=1, quiet=True)
    _, summary = verify_dataset(tmp_path / "p")
    assert "over_time" not in summary
    with pytest.raises(DctDataError, match=r"--source: expected a pack of trajectories .* Got a pack of independent"):
        verify_dataset(tmp_path / "p", reference=lambda a, b: {})


def test_a_recorded_frame_below_the_floor_fails_verify(packed, tmp_path):
    """A pack whose record counts a frame below the floor (as a pack that could not lift one records it) fails
    `dctdata verify`, naming the field, channel and step."""
    bad = tmp_path / "z"
    shutil.copytree(packed / "z", bad)
    doc = json.loads((bad / "manifest.json").read_text())
    row = doc["pack"]["fidelity_over_time"]["fields"]["velocity"][7][1]  # step 7, velocity_y
    row[2], row[-1] = 30.5, 1
    (bad / "manifest.json").write_text(json.dumps(doc))
    problems, summary = verify_dataset(bad)
    assert problems == [
        "field 'velocity' channel 1 (velocity_y) steps 7..7: expected every frame's PSNR >= the floor "
        f"{read_manifest(bad).field('velocity').codec.min_psnr:.2f} dB. Got 1 frame(s) below, the lowest 30.50 dB "
        "(recorded at pack time)"
    ]
    assert any("| velocity | 1 velocity_y | 6..8 | 6 | 30.50 |" in line for line in summary["over_time"])


def test_time_dim_webdataset_pack_verified_against_its_source(tmp_path, capsys):
    """A NetCDF store packed along time as webdataset (shards crossing trajectories): the pack records the figures
    per step, and `verify --source` (the source opened with the recorded --time-dim) measures the same."""
    xr = pytest.importorskip("xarray")
    a = np.cumsum(np.random.default_rng(0).standard_normal((3, 10, 16, 16)), axis=1).astype(np.float32)
    dims = ("member", "time", "y", "x")
    xr.Dataset({"t2m": (dims, a), "u": (dims, 2 * a + 1)}, coords={"time": np.arange(10)}).to_netcdf(tmp_path / "e.nc")
    out = tmp_path / "e.wds"
    dctdata.pack(
        str(tmp_path / "e.nc"), out, time_dim="time", format="webdataset", cf=4, quant="int8", workers=1, quiet=True,
        writer_options={"samples_per_shard": 7},
    )  # fmt: skip
    recorded = StepFigures.from_manifest(read_manifest(out))
    assert recorded.steps == 10 and sorted(recorded.table) == ["t2m", "u"]
    assert main(["verify", str(out), "--source", str(tmp_path / "e.nc"), "--step-ranges", "3"]) == 0
    printed = capsys.readouterr().out
    assert "against the source" in printed and printed.count("| t2m | 0 |") == 3
    for r in recorded.rows(step_ranges(3, 10)):
        assert f"| {r['field']} | 0 | {r['steps'][0]}..{r['steps'][1] - 1} | {r['frames']} |" in printed
    src = open_source(str(tmp_path / "e.nc"), time_dim="time")
    _, summary = verify_dataset(out, reference=lambda a, b: next(src.batches(b - a, a, b))[1], ranges=3)
    src.close()
    for got, rec in zip(summary["over_time_rows"], recorded.rows(step_ranges(3, 10))):
        assert (got["field"], got["steps"], got["frames"]) == (rec["field"], rec["steps"], rec["frames"])
        assert got["psnr_mean"] == pytest.approx(rec["psnr_mean"], abs=1e-3)
        assert got["rel_l2_mean"] == pytest.approx(rec["rel_l2_mean"], rel=1e-4)


def test_long_trajectories_are_binned():
    """Past STEP_BINS steps the record keeps bins of several steps (the manifest stays small); ranges widen to
    whole bins, and frames of trajectories of different lengths land on their own steps."""
    offsets = np.array([0, 300, 310])  # trajectories of 300 and 10 steps
    fig = StepFigures.for_trajectories({"u": 1}, offsets)
    assert (fig.width, fig.bins, fig.steps) == (3, 100, 300)
    steps = frame_steps(offsets, 295, 10)
    assert steps.tolist() == [295, 296, 297, 298, 299, 0, 1, 2, 3, 4]
    fig.add("u", steps, np.full((10, 1), 40.0), np.full((10, 1), 0.01), None)
    rows = fig.rows([(0, 4), (4, 300)])
    assert [r["steps"] for r in rows] == [(0, 6), (3, 300)] and [r["frames"] for r in rows] == [5, 7]  # bin 1 in both
    assert len(fig.record()["fields"]["u"]) == 100  # a record a bin, not a step


@pytest.mark.parametrize("scale", [1.0, 1e-25, 1e25])
def test_mean_square_of_float32_items_matches_float64(scale):
    """The relative L2 error's norm: a float32 norm where it loses nothing, float64 where squares would underflow
    or overflow float32; all-zero items have mean square 0 (no relative error)."""
    x = (np.random.default_rng(1).standard_normal((5, 2, 8, 8)) * scale).astype(np.float32)
    x[1, 0] = 0.0
    want = (x.astype(np.float64) ** 2).reshape(5, 2, -1).mean(-1)
    got = item_mean_square(torch.from_numpy(x)).numpy()
    assert got.dtype == np.float64 and got[1, 0] == 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5)
    valid = torch.from_numpy(np.arange(64).reshape(8, 8) % 2 == 0).expand(5, 2, 8, 8)
    masked = item_mean_square(torch.from_numpy(x), valid=valid).numpy()
    np.testing.assert_allclose(masked, (x.astype(np.float64) ** 2).reshape(5, 2, -1)[..., ::2].mean(-1), rtol=1e-12)
