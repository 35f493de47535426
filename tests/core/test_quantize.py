"""Quantization as the specs use it: rounding and the dead zone, reconstruction offsets, per-sample side
information, rotation, overflow counting and the per-sample PSNR floor, against the reference decoder."""

import pytest
import torch
from decode_checks import check_decompress

import dctdata
from dctdata.codec.metrics import psnr
from dctdata.encoder.calibrate import calibrate
from dctdata.encoder.quantize import coded_coefficients, dequantize, encode, item_side, quantize, rescaled


def field(n=2, c=1, h=40, w=56, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2)
    return (x / x.std() + offset).to(torch.float32)


def v1(x, step=0.5, cf=4, dtype="int8"):
    _n, c, h, w = x.shape
    k = cf * cf
    return dctdata.CodecSpec(cf=cf, height=h, width=w, channels=c, dtype=dtype, steps=[[step] * k] * c, pad="edge")


@pytest.mark.parametrize("quant", ["int8", "int16", "fp16", "bf16"])
def test_calibrated_specs_decode_through_decompress(quant):
    x = field(c=2)
    spec = calibrate(x, cf=6, mask="triangle", quant=quant)
    wire, overflow = encode(x, spec)
    assert overflow == 0
    q = wire[0] if isinstance(wire, tuple) else wire
    assert q.dtype == spec.torch_dtype
    check_decompress(spec, wire)


@pytest.mark.parametrize(
    "extra",
    [
        {"theta": 0.4, "recon": [[0.1] * 16] * 2},
        {"rotation": [[0.6, 0.8], [-0.8, 0.6]]},
        {"side": "range_mid"},
        {
            "side": "range_mid",
            "rotation": [[0.6, 0.8], [-0.8, 0.6]],
            "theta": 0.3,
            "recon": [[0.05] * 16] * 2,
            "mean": [1.0, -2.0],
            "std": [2.0, 0.5],
        },
    ],
)
def test_every_v2_feature_decodes_like_the_reference(extra):
    x = field(c=2, offset=5.0)
    step = 0.02 if "side" in extra else 0.5
    spec = v1(x, step=step).replace(**extra)
    wire, _ = encode(x, spec)
    check_decompress(spec, wire)


def test_int8_overflow_is_counted_not_silent():
    x = field()
    spec = v1(x, step=0.01)  # far too fine for int8
    q, overflow = encode(x, spec)
    assert overflow > 0 and (int(q.max()) == 127 or int(q.min()) == -128)


def test_rounding_error_is_within_half_a_step_and_the_dead_zone_within_one():
    x = field()
    spec = v1(x, cf=8, dtype="int16", step=0.05)
    coeffs = dctdata.compress(x, spec.cf, spec.mask, spec.pad)
    q, _ = quantize(coeffs, spec)
    assert bool(((dequantize(q, spec) - coeffs).abs() <= 0.05 / 2 * 1.0001 + 1e-6).all())
    dz = spec.replace(theta=0.3)
    q, _ = quantize(coeffs, dz)
    v = coeffs / 0.05
    assert bool((q.abs() <= v.abs() + 0.3 + 1e-4).all()) and bool(
        ((dequantize(q, dz) - coeffs).abs() < 0.05 * 0.71).all()
    )
    assert int((q == 0).sum()) > int((quantize(coeffs, spec)[0] == 0).sum())  # the dead zone makes more zeros


def test_side_information_keeps_a_300k_field_accurate_in_int8():
    x = field(offset=300.0)  # huge offset, range ~ a few units
    spec = calibrate(x, cf=8, quant="int8")
    (q, side), overflow = encode(x, spec)
    assert overflow == 0 and spec.offsets is None
    torch.testing.assert_close(side, item_side(x))
    assert float(side[..., 1].mean()) == pytest.approx(300.0, abs=5)
    assert float(psnr(x, dctdata.Decompress(spec)((q, side))).min()) > 35


def test_the_per_sample_floor_lifts_every_item():
    x = torch.cat([field(n=4, seed=1), field(n=4, seed=2) * 0 + torch.randn(4, 1, 40, 56)])  # smooth and noisy
    spec = v1(x, cf=8, step=0.02, dtype="int16").replace(side="range_mid", theta=0.4)
    plain, _ = encode(x, spec)
    floored, _ = encode(x, spec.replace(min_psnr=45.0))
    low = psnr(x, dctdata.Decompress(spec)(plain)).flatten()
    high = psnr(x, dctdata.Decompress(spec)(floored)).flatten()
    assert float(low.min()) < 45 <= float(high.min())
    assert bool((floored[1][..., 0] <= plain[1][..., 0]).all())  # only the stored range shrinks


@pytest.mark.parametrize("rotation", [None, [[0.6, 0.8], [-0.8, 0.6]]])
def test_rescaled_coefficients_equal_coding_with_scaled_ranges(rotation):
    """The floor re-codes a sample from its coefficients (no DCT): the same as coding it with its stored
    ranges scaled by g."""
    x = field(n=3, c=2, offset=5.0)
    spec = v1(x, step=0.02).replace(side="range_mid", rotation=rotation)
    side = item_side(x)
    g = torch.tensor([[0.5, 1.0], [0.9, 0.7], [1.0, 1.0]], dtype=torch.float64)
    coeffs, _ = coded_coefficients(x, spec, side)
    scaled = side.clone()
    scaled[..., 0] = side[..., 0] * g.float()
    direct, _ = coded_coefficients(x, spec, scaled)
    torch.testing.assert_close(rescaled(coeffs, g, spec), direct, atol=2e-4, rtol=1e-4)


def test_quantize_rejects_wrong_shape():
    x = field()
    spec = calibrate(x, cf=4, quant="int8")
    with pytest.raises(dctdata.DctDataError, match="expected shape"):
        quantize(torch.zeros(1, 1, 3, 3, 3), spec)
