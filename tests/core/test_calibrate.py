"""Calibration: a target PSNR is met at dataset level on unseen samples, explicit settings are kept,
steps follow the value scale of each channel, and bad input fails with a clear message."""

import math

import numpy as np
import pytest
import torch

import dctdata
from dctdata.calibrate import calibrate, calibrate_report, dataset_psnr
from dctdata.datasets.fields import synthetic_fields
from dctdata.datasets.images import sample_images, to_chw_float
from dctdata.lossless import DEFAULT_CODEC, get_codec
from dctdata.metrics import psnr


def roundtrip(x, spec):
    """The real path: encode -> lossless stage -> bytes -> decode -> Decompress."""
    codec = get_codec(DEFAULT_CODEC)
    q, overflow = dctdata.encode(x, spec)
    q = q.contiguous()
    blobs = [codec.encode(s.numpy()) for s in q]
    back = torch.stack(
        [
            torch.from_numpy(np.frombuffer(codec.decode(b), dtype=q.numpy().dtype).reshape(spec.coeff_shape).copy())
            for b in blobs
        ]
    )
    return dctdata.Decompress(spec)(back), sum(map(len, blobs)), overflow


@pytest.mark.parametrize("kind", ["atoms", "beam", "clouds"])
def test_target_40_is_met_at_dataset_level_on_unseen_fields(kind):
    x = torch.from_numpy(synthetic_fields(n=16, size=64, seed=3)[kind])
    spec = calibrate(x[::4], quant=None, target_psnr=40)  # calibrate on 4, judge on all 16
    y, nbytes, overflow = roundtrip(x, spec)
    assert dataset_psnr(x, y) >= 40
    assert nbytes < x.numel() * 4  # it compresses
    # calibrated on 4 samples, unseen extremes may clip a coefficient: rare, and counted
    assert overflow <= 1e-4 * x.numel()


def test_target_40_on_photos_meets_target():
    img = sample_images(("camera",), include_sklearn=False)["camera"]
    x = torch.from_numpy(to_chw_float(img))[None, :, :256, :256]
    rep = calibrate_report(x, quant=None, target_psnr=40, value_range=(0.0, 1.0))
    y, nbytes, _ = roundtrip(x, rep.spec)
    assert dataset_psnr(x, y) >= 40
    assert rep.dataset_psnr >= 40 and rep.psnr_min <= rep.psnr_median
    assert rep.stored_bytes_per_sample == pytest.approx(nbytes, rel=0.05)
    assert rep.stored_ratio > 8  # > 2x the uint8 source


def test_higher_target_costs_more_bytes():
    x = torch.from_numpy(synthetic_fields(n=4, size=64)["clouds"])
    sizes = [calibrate_report(x, quant=None, target_psnr=t).stored_bytes_per_sample for t in (30, 40, 50)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_explicit_settings_are_kept():
    x = torch.from_numpy(synthetic_fields(n=4, size=64)["beam"])
    spec = calibrate(x, cf=3, mask="triangle", quant="int16", target_psnr=20)
    assert (spec.cf, spec.mask, spec.dtype) == (3, "triangle", "int16")
    spec = calibrate(x, cf=5, quant="int8")
    assert (spec.cf, spec.mask, spec.dtype) == (5, "square", "int8")
    assert spec.steps is not None and spec.offsets is not None


def test_mixed_scale_channels_each_get_the_target():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 3, 48, 48, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2)
    base = base / base.flatten(2).std(-1)[..., None, None]
    scale = torch.tensor([1e-3, 1.0, 1e3], dtype=torch.float64).reshape(1, 3, 1, 1)
    x = (base * scale + torch.tensor([0.0, 300.0, -5e4], dtype=torch.float64).reshape(1, 3, 1, 1)).float()
    spec = calibrate(x, quant=None, target_psnr=40)
    y, _, _ = roundtrip(x, spec)
    per_channel = [dataset_psnr(x[:, c], y[:, c]) for c in range(3)]
    assert min(per_channel) > 38, per_channel  # no channel is sacrificed to another's scale
    steps = torch.tensor(spec.steps)
    assert float(steps[2].min() / steps[0].min()) > 1e4  # steps follow the value scale


def test_report_is_json_ready_and_consistent():
    import json

    x = torch.from_numpy(synthetic_fields(n=4, size=32)["clouds"])
    rep = calibrate_report(x, quant=None, target_psnr=35)
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["target_psnr"] == 35 and d["overflow"] == 0
    assert d["transfer_ratio"] == pytest.approx(rep.spec.transfer_ratio)
    assert any(c.feasible for c in rep.candidates)
    q, _ = dctdata.encode(x, rep.spec)
    assert float(psnr(x, dctdata.Decompress(rep.spec)(q)).min()) == pytest.approx(rep.psnr_min)


def test_normalize_stores_statistics():
    x = torch.from_numpy(synthetic_fields(n=4, size=32)["clouds"])
    spec = calibrate(x, cf=4, quant="int8", normalize=True)
    assert spec.mean[0] == pytest.approx(float(x.mean()), rel=1e-4)
    q, _ = dctdata.encode(x, spec)
    z = dctdata.Decompress(spec)(q)
    assert abs(float(z.mean())) < 0.1 and 0.5 < float(z.std()) < 1.5


def test_dataset_psnr_is_at_most_mean_item_psnr():
    x = torch.from_numpy(synthetic_fields(n=4, size=32)["atoms"])
    y = x + torch.randn_like(x) * torch.linspace(0.1, 3, 4).reshape(4, 1, 1, 1)
    assert dataset_psnr(x, y) <= float(psnr(x, y).mean()) + 1e-9
    assert dataset_psnr(x, x) == math.inf


def test_unreachable_target_says_what_is_reachable():
    x = torch.from_numpy(synthetic_fields(n=2, size=32)["atoms"])
    with pytest.raises(dctdata.DctDataError, match="target_psnr: expected a target these settings"):
        calibrate(x, cf=1, quant="int8", target_psnr=60)


def test_errors():
    x = torch.from_numpy(synthetic_fields(n=2, size=32)["clouds"])
    with pytest.raises(dctdata.DctDataError, match="expected cf or target_psnr"):
        calibrate(x, quant="int8")
    with pytest.raises(TypeError, match="samples: expected a torch.Tensor"):
        calibrate(x.numpy(), cf=4)
    with pytest.raises(dctdata.DctDataError, match=r"expected shape \(N, C, H, W\)"):
        calibrate(x[0], cf=4)
    with pytest.raises(TypeError, match="expected a floating tensor"):
        calibrate(x.to(torch.int32), cf=4)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(dctdata.DctDataError, match="expected finite values"):
        calibrate(bad, cf=4)
    with pytest.raises(dctdata.DctDataError, match="only constant items"):
        calibrate(torch.ones(2, 1, 16, 16), cf=4)
    with pytest.raises(dctdata.DctDataError, match="target_psnr: expected a PSNR"):
        calibrate(x, target_psnr=-3)
    with pytest.raises(TypeError, match="target_psnr: expected a number"):
        calibrate(x, target_psnr="40")
    with pytest.raises(dctdata.DctDataError, match="cf: expected"):
        calibrate(x, cf=9)
    with pytest.raises(dctdata.DctDataError, match="value_range: expected finite lo < hi"):
        calibrate(x, cf=4, value_range=(1, 0))
    with pytest.raises(dctdata.DctDataError, match="headroom: expected"):
        calibrate(x, cf=4, headroom=0.5)
