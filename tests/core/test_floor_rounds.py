"""The per-sample floor's rounds (`keep_floor`) and the calibration subsample (`_Coded`, `_Setting`) spend
only the work that changes something: a trial that left an item as it was is not run again, and the
subsample is taken without copying the subset, with the same encodings and figures as repeating the
trials and copying gave. Calibration runs on one torch thread and gives the caller's back."""

import itertools

import pytest
import torch

import dctdata.encoder.quantize as quantize_mod
from dctdata.codec.metrics import ItemErrors
from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress
from dctdata.encoder.calibrate import THETA, _Coded, _Setting, calibrate_report, fit_recon
from dctdata.encoder.quantize import coded_coefficients, item_side, keep_floor, quantize_per_sample
from dctdata.encoder.tables import choose_recon
from dctdata.errors import DctDataError

ROTATION = [[0.6, 0.8], [-0.8, 0.6]]


def mixed(n=8, c=1, h=40, w=56, seed=0):
    """Smooth fields turning into noise over the batch: items the floor lifts by very different amounts."""
    g = torch.Generator().manual_seed(seed)
    smooth = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2)
    noise = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    share = torch.linspace(0, 1, n, dtype=torch.float64).reshape(n, 1, 1, 1)
    return (smooth / smooth.std() * (1 - share) + 3 * noise * share).to(torch.float32)


def floored(x, step, floor, rotation, settle, monkeypatch):
    """keep_floor on x coded at `step` (int8, dead zone): its outputs and how often it quantized a sample
    with coefficients it had quantized before (a repeated trial)."""
    c, h, w = x.shape[1:]
    spec = CodecSpec(
        cf=8, height=h, width=w, channels=c, dtype="int8", steps=[[step] * 64] * c, pad="symmetric",
        side="range_mid", theta=0.4, min_psnr=floor, rotation=rotation,
    )  # fmt: skip
    coeffs, side = coded_coefficients(x, spec)
    q, over = quantize_per_sample(coeffs, spec)
    seen, repeats = set(), []

    def recording(c, s, checked=False):
        for row in c:
            key = row.numpy().tobytes()
            repeats.append(key in seen)
            seen.add(key)
        return quantize_per_sample(c, s, checked)

    monkeypatch.setattr(quantize_mod, "quantize_per_sample", recording)
    errors = ItemErrors(x)
    before = errors.nmse(Decompress(spec, normalize=False)((q, side)))
    out = keep_floor(coeffs, spec, q.clone(), side.clone(), over.clone(), errors, settle=settle)
    monkeypatch.undo()
    return out, sum(repeats), len(repeats), errors, before


@pytest.mark.parametrize(
    ("channels", "rotation", "step", "floor"),
    [
        (1, None, 0.8, 35.0),  # coarse steps: items lifted past the cap, their give-backs undone
        (2, None, 0.8, 35.0),
        (2, ROTATION, 0.8, 40.0),
        (2, None, 0.02, 50.0),  # fine int8 steps: lifts refused because they would overflow
        (2, ROTATION, 0.02, 50.0),
    ],
)
def test_the_floor_never_repeats_a_trial_and_codes_as_repeating_did(channels, rotation, step, floor, monkeypatch):
    x = mixed(c=channels)
    again, repeated, tried_again, _, _ = floored(x, step, floor, rotation, False, monkeypatch)
    out, repeats, tried, errors, before = floored(x, step, floor, rotation, True, monkeypatch)
    assert repeated > 0  # the case has trials that change nothing when run again ...
    assert repeats == 0 and tried < tried_again  # ... and they are no longer run
    for a, b in zip(out, again):  # q, side, overflow, decode, nmse: bit for bit
        assert torch.equal(a, b)
    _q, side, _over, x_hat, nm = out
    cap = 10.0 ** (-floor / 10.0)
    low, was = errors.ok & (nm > cap), errors.ok & (before > cap)
    assert int(low.sum()) < int(was.sum())  # the floor lifted items ...
    assert not bool((low & ~was).any())  # ... and left none below it that was not
    assert bool((side[..., 0] <= item_side(x)[..., 0]).all())  # only the stored ranges shrink
    assert torch.equal(nm, errors.nmse(x_hat))


def reference_subsample(coded, idx, steps, theta=THETA, lim=127.0):
    """The subsample's quantization and error as a copy of its kept planes and a scatter into every plane (with
    the table-bytes choice of the reconstruction offsets, `choose_recon`, as calibration makes it)."""
    sub = coded.sub
    st = steps.to(torch.float32).reshape(1, -1, len(idx), 1)
    kept = sub[:, :, idx, :]
    v = kept / st
    q = (torch.sign(v) * torch.floor(v.abs() + theta)).clamp(-lim, lim)
    delta = fit_recon(v, q, dims=(0, 3))
    rec = (q - delta.reshape(1, -1, len(idx), 1) * torch.sign(q)) * st
    err = -sub.double()
    err[:, :, idx, :] = (rec - kept).double()
    per_channel = q.shape[0] * q.shape[2] * q.shape[3] * coded.scale
    chosen = choose_recon(v, q, delta, steps, err.pow(2).sum(dim=(0, 2, 3)), per_channel)
    if not torch.equal(chosen, delta):
        delta = chosen
        rec = (q - delta.reshape(1, -1, len(idx), 1).float() * torch.sign(q)) * st
        err[:, :, idx, :] = (rec - kept).double()
    return err.pow(2).sum(dim=(2, 3)).mean(0) / coded.pixels, q, delta


@pytest.mark.parametrize(("cf", "mask"), itertools.product([8, 5], ["square", "triangle"]))
def test_the_subsample_is_the_picked_block_rows_and_its_trials_the_same(cf, mask):
    x = mixed(n=6, c=2, h=256, w=512, seed=3) * torch.tensor([1.0, 40.0]).reshape(1, 2, 1, 1)
    coded = _Coded(x, item_side(x), None)
    by_rows = coded.coef.reshape(*coded.coef.shape[:2], -1, *coded.coef.shape[-2:])
    n, c, per, f, wb = by_rows.shape
    rows = torch.randperm(n * per, generator=torch.Generator().manual_seed(0))
    pick = rows[: (1 << 20) // (c * f * wb)].sort().values  # fewer block rows than the subset has
    assert torch.equal(coded.sub, by_rows.permute(0, 2, 1, 3, 4).reshape(n * per, c, f, wb)[pick])
    assert torch.equal(coded.amax, by_rows.abs().amax(dim=(0, 2, 4)).double())
    setting = _Setting(coded, cf, mask, "int8")
    for s in (0.01, 0.05):
        steps = setting.steps(s)
        out, _, q, delta = setting._subsample(steps)
        want, q0, delta0 = reference_subsample(coded, setting.idx, steps)
        assert torch.equal(out, want) and torch.equal(q, q0) and torch.equal(delta, delta0)


def test_calibration_runs_on_one_thread_and_restores_the_callers():
    x = mixed(n=4, h=32, w=40)
    before = torch.get_num_threads()
    seen = []
    try:
        torch.set_num_threads(2)
        count = lambda *_: seen.append(torch.get_num_threads())  # noqa: E731
        report = calibrate_report(x, quant=None, target_psnr=35.0, progress=count)
        assert seen and set(seen) == {1}  # every exact evaluation ran on one thread
        assert torch.get_num_threads() == 2 and report.dataset_psnr >= 35.0
        with pytest.raises(DctDataError, match="expected cf or target_psnr"):
            calibrate_report(x)
        assert torch.get_num_threads() == 2  # given back after an error too
    finally:
        torch.set_num_threads(before)
