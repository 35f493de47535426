"""Calibration's cost is a fixed budget: a subset of fixed size and a bounded number of trials, whatever the
set's size (counted calls, not time)."""

from __future__ import annotations

import sys

import numpy as np

import dctdata.encoder.calibrate as calibrate_mod
import dctdata.preprocess.plan as plan
from dctdata.preprocess.sources import open_source
from dctdata.settings import PackSettings


def _set(n: int) -> np.ndarray:
    """n copies of one smooth noisy 32x32 field, scaled by powers of two: each item normalized by its own range
    is the same field exactly, so any subset of it calibrates alike."""
    rng = np.random.default_rng(0)
    y = np.linspace(0, 5, 32, dtype=np.float32)
    base = np.sin(y)[:, None] * np.cos(y)[None, :] + 0.05 * rng.standard_normal((32, 32), dtype=np.float32)
    return np.stack([base[None] * np.float32(2.0 ** (i % 3)) for i in range(n)]).astype(np.float32)


def _calibration_calls(tmp_path, monkeypatch, n: int) -> dict:
    monkeypatch.setattr(plan, "CALIBRATION_SAMPLES", 8)
    monkeypatch.setattr(plan, "CALIBRATION_VALUES", 8)  # a subset of 8 samples, whatever n
    calls = {"subset": [], "evaluations": [], "quantized": 0, "rows": 0}
    quantize_mod = sys.modules["dctdata.encoder.quantize"]
    real_report, real_q = calibrate_mod.calibrate_report, quantize_mod.quantize_per_sample

    def report(x, **kw):
        calls["subset"].append(int(x.shape[0]))
        r = real_report(x, **kw)
        calls["evaluations"].append(r.evaluations)
        return r

    def quantize(coeffs, spec, checked=False):
        calls["quantized"] += 1
        calls["rows"] += int(coeffs.shape[0]) if coeffs.dim() > 4 else 1
        return real_q(coeffs, spec, checked)

    with monkeypatch.context() as m:  # undone before the next set is counted
        m.setattr(calibrate_mod, "calibrate_report", report)
        m.setattr(calibrate_mod, "quantize_per_sample", quantize)  # the landing's and the floor's trials
        m.setattr(quantize_mod, "quantize_per_sample", quantize)
        plan.plan(open_source(_set(n)), PackSettings(target_psnr=40, quiet=True))  # calibration alone
    return calls


def test_calibration_trials_do_not_grow_with_the_set(tmp_path, monkeypatch):
    small = _calibration_calls(tmp_path, monkeypatch, 24)
    large = _calibration_calls(tmp_path, monkeypatch, 240)
    assert small["subset"] == large["subset"] == [8]  # the subset: fixed size
    assert small["evaluations"] == large["evaluations"]
    assert 1 <= small["evaluations"][0] <= calibrate_mod.MAX_EVALUATIONS + 1
    assert small["quantized"] == large["quantized"] > 0  # the same trials, on the same number of rows
    assert small["rows"] == large["rows"]


def test_the_calibration_subset_has_a_fixed_size():
    sizes = {n: len(plan.calibration_indices(n, 512 * 512)) for n in (100, 1_000, 100_000)}
    assert sizes == {n: plan.CALIBRATION_SAMPLES for n in sizes}  # large samples: the minimum count
    small = {n: len(plan.calibration_indices(n, 64)) for n in (70_000, 10**6)}
    assert small == {n: plan.CALIBRATION_VALUES // 64 for n in small}  # small samples: the value budget
    assert len(plan.calibration_indices(10, 64)) == 10  # a set smaller than the budget: all of it
