"""Quantization as calibrate's specs use it: overflow counting, dequantize, Decompress folding."""

import pytest
import torch
from decode_checks import check_decompress

import dctdata
from dctdata.calibrate import calibrate
from dctdata.metrics import psnr
from dctdata.quantize import dequantize, encode, quantize


def field(n=2, c=1, h=40, w=56, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2)
    return (x / x.std() + offset).to(torch.float32)


@pytest.mark.parametrize("quant", ["int8", "int16", "fp16", "bf16"])
def test_calibrated_specs_decode_through_decompress(quant):
    x = field(c=2)
    spec = calibrate(x, cf=6, mask="triangle", quant=quant)
    q, overflow = encode(x, spec)
    assert overflow == 0
    assert q.dtype == spec.torch_dtype
    check_decompress(spec, q)


def test_int8_overflow_is_counted_not_silent():
    x = field()
    spec = calibrate(x, cf=4, quant="int8")
    q, overflow = encode(x, spec)
    assert overflow == 0
    q2, overflow2 = encode(x * 10, spec)  # 10x the calibrated range must clip, and say so
    assert overflow2 > 0
    assert int(q2.max()) == 127 or int(q2.min()) == -128


def test_dequantize_error_is_within_half_a_step():
    x = field()
    spec = calibrate(x, cf=8, quant="int16")
    coeffs = dctdata.compress(x, spec.cf, spec.mask)
    q, _ = quantize(coeffs, spec)
    err = (dequantize(q, spec) - coeffs).abs()
    steps = torch.tensor(spec.steps, dtype=torch.float32).reshape(1, spec.channels, 1, spec.kept, 1)
    assert bool((err <= steps / 2 * 1.0001 + 1e-5).all())


def test_dc_offset_keeps_a_300k_field_accurate_in_int8():
    x = field(offset=300.0)  # huge offset, range ~ a few units
    spec = calibrate(x, cf=8, quant="int8")
    q, overflow = encode(x, spec)
    assert overflow == 0
    assert spec.offsets[0][0] == pytest.approx(8 * float(x.mean()), rel=0.01)
    assert float(psnr(x, dctdata.Decompress(spec)(q)).min()) > 35


def test_quantize_rejects_wrong_shape():
    x = field()
    spec = calibrate(x, cf=4, quant="int8")
    with pytest.raises(dctdata.DctDataError, match="expected shape"):
        quantize(torch.zeros(1, 1, 3, 3, 3), spec)
