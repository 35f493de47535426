"""Masked data: a fill that costs few bits, the validity mask stored exactly and returned with each sample,
and every reported PSNR over valid pixels against the valid range, per channel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from sample_fields import smooth_fields

import dctdata
import dctdata.codec.metrics
from dctdata.cli import main
from dctdata.datasets.slstr import cloud_field
from dctdata.errors import DctDataError
from dctdata.preprocess.inspect import inspect_dataset
from dctdata.preprocess.inspect_figure import INVALID_RGB, inspect_figure
from dctdata.preprocess.masking import fill_invalid
from dctdata.stages import DEFAULT_CODEC, get_stage


def six_channels(n: int, size: int = 64, seed: int = 1) -> np.ndarray:
    """The issue's set: 3 reflectances in 0..1 and 3 brightness temperatures around 290 K, NaN beyond a
    slanted swath edge in every channel."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        image, _ = cloud_field(rng, size)
        out.append(np.concatenate([image[:3], image[6:9]]))
    return np.stack(out)


def independent_psnr(x: np.ndarray, x_hat: np.ndarray) -> np.ndarray:
    """Dataset-level PSNR per channel over finite pixels of x, against each item's valid range, in plain
    numpy (not dctdata.codec.metrics): 10 log10(1 / mean_items(MSE / range^2))."""
    n, c = x.shape[:2]
    nmse = np.zeros((n, c))
    for i in range(n):
        for ch in range(c):
            ok = np.isfinite(x[i, ch])
            ref, est = x[i, ch][ok].astype(np.float64), x_hat[i, ch][ok].astype(np.float64)
            nmse[i, ch] = np.mean((ref - est) ** 2) / (ref.max() - ref.min()) ** 2
    return -10 * np.log10(nmse.mean(0))


@pytest.fixture(scope="module")
def masked_pack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("masked")
    x = six_channels(12)
    np.save(tmp / "s6.npy", x)
    assert (
        main(["pack", str(tmp / "s6.npy"), str(tmp / "mask"), "--nan", "mask", "--target-psnr", "40", "--quiet"]) == 0
    )
    return tmp, x


def test_six_channel_masked_set_reports_valid_pixel_psnr_and_meets_the_target(masked_pack):
    tmp, x = masked_pack
    assert (~np.isfinite(x)).mean() > 0.03  # the swath edges are there
    ds = dctdata.open_dataset(tmp / "mask", as_dict=True)
    m = ds.manifest
    f = m.field("image")
    assert f.valid == "image_valid" and ds.valid_field() == "image_valid"
    got = [ds[i] for i in range(len(x))]
    for i, s in enumerate(got):  # the mask comes back with every sample, exactly
        assert s["image_valid"].dtype == torch.bool and torch.equal(
            s["image_valid"], torch.from_numpy(np.isfinite(x[i]))
        )
    x_hat = ds.decompressor()(torch.utils.data.default_collate([s["image"] for s in got])).numpy()
    mine = independent_psnr(x, x_hat)
    reported = np.array([c.psnr_dataset for c in m.stats["image"].channels])
    assert np.all(np.abs(reported - mine) < 0.2), (reported, mine)
    assert np.all(reported >= 40) and m.stats["image"].psnr_dataset >= 40  # every channel meets the target
    assert m.stats["image"].valid_fraction == pytest.approx(np.isfinite(x).mean())
    from dctdata.verify import verify_dataset

    assert verify_dataset(tmp / "mask") == ([], {"samples": 12, "fields": 2, "decoded": 12, "files": len(m.checksums)})
    # the per-item figures too: min over channels of samples, over valid pixels
    items = dctdata.codec.metrics.psnr(
        torch.from_numpy(np.nan_to_num(x)), torch.from_numpy(x_hat), valid=torch.from_numpy(np.isfinite(x))
    )
    assert float(items.min()) == pytest.approx(m.stats["image"].psnr_min, abs=1e-3)


@pytest.mark.slow
def test_a_constant_fill_is_measured_on_valid_pixels_and_costs_bits(masked_pack, tmp_path):
    """The issue's command (`--nan fill=0`): figures and the target are over valid pixels now, not against
    the 0..300 K range the fill made, so the temperatures get their 40 dB, and the 300 K step at every
    swath edge makes the pack larger than with `--nan mask`."""
    src, x = masked_pack
    m = dctdata.pack(src / "s6.npy", tmp_path / "fill0", nan="fill=0", target_psnr=40, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "fill0")
    x_hat = ds.decompressor()(ds[0 : len(x)][0]).numpy()
    reported = np.array([c.psnr_dataset for c in m.stats["image"].channels])
    assert np.all(np.abs(reported - independent_psnr(x, x_hat)) < 0.2) and np.all(reported >= 40)
    assert m.field("image").valid is None and m.pack["nan_filled"] == int((~np.isfinite(x)).sum())
    masked = dctdata.format.read_manifest(src / "mask")
    assert m.stored_bytes > masked.stored_bytes


def test_fill_keeps_valid_pixels_stays_in_range_and_is_smooth():
    yy, xx = np.mgrid[:32, :48].astype(np.float32)
    ramp = (100 + 0.5 * xx + 0.25 * yy)[None, None]
    valid = np.ones_like(ramp, bool)
    valid[..., :, 30:] = False  # a swath edge
    valid[..., 5:9, 3:11] = False  # a hole
    x = np.where(valid, ramp, np.nan).astype(np.float32)
    filled = fill_invalid(x, valid)
    assert np.array_equal(filled[valid], x[valid])  # bit-exact
    assert filled.min() >= ramp[valid].min() and filled.max() <= ramp[valid].max()  # a convex fill
    hole = filled[0, 0, 5:9, 3:11]
    assert np.abs(hole - ramp[0, 0, 5:9, 3:11]).max() < 2.0  # continues its neighbours
    assert np.abs(np.diff(filled[0, 0], axis=1)).max() < 3.0  # no edge at the swath border
    assert np.array_equal(fill_invalid(ramp, np.ones_like(valid)), ramp)


def test_the_fill_costs_fewer_bits_than_a_constant(masked_pack):
    """Same codec, same data: the pull-push fill stores smaller than the item mean, which stores
    smaller than a constant outside the range (that one also overflows int8 next to 290 K). Encoded as the
    pack encodes a masked field: the per-sample ranges and the per-sample floor see the valid pixels only
    (without the mask the 0 K fill widened every range to 0..300 K: coarser steps, fewer bytes)."""
    tmp, x = masked_pack
    spec = dctdata.format.read_manifest(tmp / "mask").field("image").codec
    valid = np.isfinite(x)
    mean = np.where(valid, x, 0).sum((2, 3), keepdims=True) / valid.sum((2, 3), keepdims=True)
    codec = get_stage(DEFAULT_CODEC)

    def stored(xf):
        wire, over = dctdata.encode(
            torch.from_numpy(np.ascontiguousarray(xf, np.float32)), spec, valid=torch.from_numpy(valid)
        )
        q = wire[0] if isinstance(wire, tuple) else wire  # the coefficients (the side values cost the same)
        return sum(len(codec.encode(q[i].numpy().tobytes())) for i in range(len(q))), over

    pull_push, _ = stored(fill_invalid(x, valid))
    item_mean, _ = stored(np.where(valid, x, mean))
    zero, overflow = stored(np.where(valid, x, 0))
    assert pull_push < item_mean < zero and overflow > 0


def test_explicit_mask_field(tmp_path):
    x = smooth_fields(6, 2, 16, 24, noise="normal")
    ok = np.ones((6, 16, 24), np.uint8)
    ok[:, :, :5] = 0
    x[:, :, :, :5] = -999.0  # a sentinel outside the range where the mask says invalid
    x[1, 0, 0, 0] = np.nan
    np.savez(tmp_path / "m.npz", image=x, ok=ok)
    assert (
        main(["pack", str(tmp_path / "m.npz"), str(tmp_path / "o"), "--valid", "image=ok", "--cf", "8", "--quiet"]) == 0
    )
    ds = dctdata.open_dataset(tmp_path / "o", as_dict=True)
    assert ds.manifest.field("image").valid == "ok" and ds.manifest.field("ok").kind == "array"
    assert torch.equal(ds[3]["ok"], torch.from_numpy(ok[3]))  # stored as it is
    s = ds.manifest.stats["image"]
    assert s.psnr_min > 60 and s.max_abs_error < 1e-2  # cf=8 float32: only valid pixels count, so near exact
    assert s.valid_fraction == pytest.approx(ok.mean())


def test_every_channel_needs_a_valid_pixel(tmp_path):
    x = smooth_fields(3, 2, 8, 8)
    x[1, 1] = np.nan
    with pytest.raises(DctDataError, match=r"sample 1: field 'image' channel 1: expected at least one valid"):
        dctdata.pack(x, tmp_path / "o", nan="mask", cf=4)
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.partial").exists()


def test_metrics_with_a_valid_mask():
    ref = torch.tensor([[[0.0, 10.0], [5.0, 1000.0]]])
    est = ref + torch.tensor([[[1.0, -1.0], [0.0, 500.0]]])
    valid = torch.tensor([[[True, True], [True, False]]])
    mse, rng, err = dctdata.codec.metrics.item_errors(ref, est, valid=valid)
    assert float(mse) == pytest.approx(2 / 3) and float(rng) == 10.0 and err == 1.0
    assert float(dctdata.codec.metrics.psnr(ref, est, valid=valid)) == pytest.approx(10 * math.log10(100 / (2 / 3)))
    assert math.isnan(float(dctdata.codec.metrics.psnr(ref, est, valid=torch.zeros_like(valid))))
    assert dctdata.codec.metrics.pooled_psnr([40.0, 40.0]) == pytest.approx(40.0)
    assert dctdata.codec.metrics.pooled_psnr([30.0, 50.0]) == pytest.approx(-10 * math.log10((1e-3 + 1e-5) / 2))
    assert dctdata.codec.metrics.pooled_psnr([]) is None and dctdata.codec.metrics.pooled_psnr([math.inf]) == math.inf
    assert dctdata.codec.metrics.max_abs_error(ref, est, valid=valid) == 1.0


def test_inspect_a_masked_pack(masked_pack, tmp_path):
    tmp, x = masked_pack
    png, shown = inspect_dataset(str(tmp / "mask"), str(tmp_path / "i.png"), samples=2, channels=6)
    assert shown
    im = np.asarray(Image.open(png).convert("RGB"))
    assert (im == INVALID_RGB).all(-1).sum() > 1000  # the swath edges drawn flat, not black or NaN
    # the figure's own check: a valid mask of the wrong shape
    with pytest.raises(DctDataError, match=r"valid: expected the reconstructions' shape"):
        inspect_figure(x[0], np.nan_to_num(x[0]), tmp_path / "j.png", valid=np.ones((1, 2, 2), bool))


def test_target_met_on_valid_pixels_when_most_pixels_are_missing(tmp_path):
    """An ocean field over a mostly-land grid (77% NaN): the smooth fill must not dilute the error the
    target is judged on (calibration counts valid pixels; see plan._calibrate)."""
    x = smooth_fields(16, 1, 32, 48, seed=5, offset=290, amp=4, noise="normal")
    yy, xx = np.mgrid[:32, :48]
    x[:, :, (np.sin(xx / 5.0) + np.cos(yy / 4.0)) > -0.35] = np.nan
    assert 0.6 < np.isnan(x).mean() < 0.8
    m = dctdata.pack(x, tmp_path / "o", nan="mask", target_psnr=40, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "o")
    x_hat = ds.decompressor()(ds[0:16][0]).numpy()
    mine = independent_psnr(x, x_hat)
    assert abs(m.stats["image"].psnr_dataset - mine[0]) < 0.2 and mine[0] >= 40
