"""The encode's C loops (dctdata/encoder/_encode.c) give the torch path's values bit for bit."""

import importlib

import numpy as np
import pytest
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.encoder import encode_kernels
from dctdata.errors import DctDataError

Q = importlib.import_module("dctdata.encoder.quantize")

pytestmark = pytest.mark.skipif(not encode_kernels.available(), reason="dctdata.encoder._encode not built")


@pytest.fixture
def torch_path(monkeypatch):
    """Run a function with the kernels off (the torch reference)."""

    def run(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(encode_kernels, "ENABLED", False)
            return fn(*args, **kwargs)

    return run


@pytest.mark.parametrize("shape", [(3, 1, 13, 21), (2, 4, 8, 8), (1, 2, 1, 5), (5, 3, 17, 9)])
def test_normalize_matches_torch(shape, torch_path):
    x = (torch.randn(shape) * 0.01 + 300.0).float()  # detail far below the offset: float64 matters
    x[0, 0, 0, 0] = 300.5
    side = Q.item_side(x)
    ref = torch_path(Q.normalize, x, side)
    got = Q.normalize(x, side)
    assert got.dtype == torch.float32 and torch.equal(got, ref)


def test_normalize_volume_and_constant_items(torch_path):
    x = torch.randn(2, 3, 9, 10, 11)
    x[1, 2] = 7.0  # a constant item: range 1
    side = Q.item_side(x, dims=3)
    assert float(side[1, 2, 0]) == 1.0
    assert torch.equal(Q.normalize(x, side, dims=3), torch_path(Q.normalize, x, side, dims=3))


def test_item_side_matches_float64_extremes():
    x = torch.randn(4, 2, 11, 13) * 1e3
    flat = x.double().flatten(-2)
    lo, hi = flat.amin(-1), flat.amax(-1)
    want = torch.stack([torch.where(hi > lo, hi - lo, torch.ones_like(lo)), (hi + lo) / 2], -1).float()
    assert torch.equal(Q.item_side(x), want)


def _spec(h, w, c, dtype, theta, rng):
    k = 9
    return CodecSpec(
        cf=3, height=h, width=w, channels=c, dtype=dtype, theta=theta,
        steps=(rng.uniform(0.05, 2.0, (c, k))).tolist(), offsets=(rng.normal(0, 1, (c, k))).tolist(),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("theta", [None, 0.3])
@pytest.mark.parametrize("hw,c", [((13, 21), 1), ((8, 8), 3), ((30, 7), 2)])
def test_quantize_matches_torch(dtype, theta, hw, c, torch_path):
    rng = np.random.default_rng(0)
    spec = _spec(*hw, c, dtype, theta, rng)
    coeffs = torch.randn(5, *spec.coeff_shape) * (300.0 if dtype == "int8" else 3e4)
    coeffs[0, 0, 0, 0, 0] = 0.0
    coeffs[1, 0, 0, 0, 0] = -0.0
    coeffs.view(-1)[7] = 2.5  # ties: to even
    ref_q, ref_over = torch_path(Q.quantize_per_sample, coeffs, spec)
    q, over = Q.quantize_per_sample(coeffs, spec)
    assert q.dtype == spec.torch_dtype and torch.equal(q, ref_q)
    assert torch.equal(over, ref_over) and int(over.sum()) > 0  # some values clamped and counted
    one_q, one_over = Q.quantize(coeffs[2], spec)  # one sample: no leading dims
    assert torch.equal(one_q, ref_q[2]) and one_over == int(ref_over[2])


def test_quantize_without_offsets(torch_path):
    spec = CodecSpec(cf=2, height=9, width=9, channels=1, dtype="int8", steps=[[1.0] * 4])
    coeffs = torch.randn(3, *spec.coeff_shape) * 200
    assert all(torch.equal(a, b) for a, b in zip(Q.quantize_per_sample(coeffs, spec), torch_path(
        Q.quantize_per_sample, coeffs, spec)))  # fmt: skip


def test_quantize_refuses_non_finite():
    spec = CodecSpec(cf=2, height=8, width=8, channels=1, dtype="int8", steps=[[1.0] * 4])
    coeffs = torch.zeros(2, *spec.coeff_shape)
    coeffs[1, 0, 0, 0, 0] = float("nan")
    with pytest.raises(DctDataError, match=r"expected finite values. Got 1 NaN/Inf"):
        Q.quantize_per_sample(coeffs, spec)


def test_kernel_refuses_bad_buffers():
    from dctdata.encoder import _encode

    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="whole items"):
        _encode.normalize(x, np.ones(3, np.float32), np.ones(3, np.float32), np.zeros(10, np.float32), 3)
    with pytest.raises(ValueError, match="qkind"):
        _encode.quantize(x, 5, np.zeros(10, np.int8), np.zeros(1, np.int64), (1, 1, 1, 1, 10), None, None, -1.0)
    with pytest.raises(ValueError, match="out does not match"):
        _encode.quantize(x, 1, np.zeros(10, np.int8), np.zeros(1, np.int64), (1, 1, 1, 1, 10), None, None, -1.0)


def test_item_range_of_float32_matches_float64():
    from dctdata.codec.metrics import item_range

    x = torch.randn(3, 2, 9, 7) * 1e4 + 1e5
    assert torch.equal(item_range(x), item_range(x.double()))
    assert item_range(x).dtype == torch.float64


@pytest.mark.parametrize("shape, dims", [((3, 2, 17, 23), 2), ((2, 1, 5, 8, 9), 3), ((4, 1, 1, 3), 2)])
def test_figures_match_item_figures(shape, dims):
    """The pack's figures in one C pass: the squares' maximum and the reference's extremes are torch's values
    exactly; the float64 sum of the squares agrees to its last bits (another summation order)."""
    from dctdata.codec.metrics import item_figures

    g = torch.Generator().manual_seed(sum(shape))
    ref = torch.randn(shape, generator=g) * 50 + 1e3
    est = ref + torch.randn(shape, generator=g) * 0.3
    est[0, 0].fill_(float(ref[0, 0].flatten()[0]))  # an error that varies across the item
    ref[-1, -1] = 7.0  # a constant item: range 0
    got = encode_kernels.figures(ref, est, dims)
    want = item_figures(ref, est, dims)
    assert got is not None
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == torch.float64 and a.shape == b.shape
    torch.testing.assert_close(got[0], want[0], rtol=1e-13, atol=0)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert float(got[1][-1, -1]) == 0.0 and bool((got[0] > 0).all())


def test_figures_leave_what_they_do_not_take_to_torch():
    ref = torch.randn(2, 1, 8, 8)
    est = ref.clone()
    est[1, 0, 3, 3] = float("nan")  # torch's path propagates it
    assert encode_kernels.figures(ref, est, 2) is None
    assert encode_kernels.figures(ref.double(), ref.double(), 2) is None  # a float64 source's values
    assert encode_kernels.figures(ref, ref[:1], 2) is None
    mse, rng, peak = encode_kernels.figures(ref, ref, 2)
    assert bool((mse == 0).all()) and bool((peak == 0).all()) and bool((rng > 0).all())


def test_figures_kernel_refuses_bad_buffers():
    from dctdata.encoder import _encode

    x, d, f = np.zeros(10, np.float32), np.zeros(2, np.float64), np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="whole items"):
        _encode.figures(x, x, 3, d, f, f, d)
    with pytest.raises(ValueError, match="est holds 16 bytes"):
        _encode.figures(x, np.zeros(4, np.float32), 5, d, f, f, d)
    with pytest.raises(ValueError, match="sse holds 8 bytes"):
        _encode.figures(x, x, 5, np.zeros(1, np.float64), f, f, d)


def test_floor_encode_hands_back_the_readers_decode():
    """`encode(decoded=...)` with a per-sample floor: the decode it appends is the readers' default decode of
    the wire value it returns, bit for bit (a pack's figures measure it instead of decoding again), also after
    the floor re-coded items; nothing is appended for a spec without the floor."""
    from dctdata.decoder.layer import Decompress

    g = torch.Generator().manual_seed(3)
    x = torch.cumsum(torch.cumsum(torch.randn(6, 2, 32, 40, generator=g), -1), -2)
    x[2, 1] += torch.randn(32, 40, generator=g) * 40  # a rough item: 21 dB at the step that gives the others 31-34
    spec = CodecSpec(cf=6, height=32, width=40, channels=2, dtype="int8", steps=[[0.02] * 36] * 2, theta=0.3,
                     side="range_mid", min_psnr=30.0)  # fmt: skip
    decoded: list = []
    wire, _ = Q.encode(x, spec, decoded=decoded)
    plain_wire, _ = Q.encode(x, spec.replace(min_psnr=None))
    assert not torch.equal(wire[1], plain_wire[1])  # the floor re-coded some items
    assert len(decoded) == 1 and torch.equal(decoded[0], Decompress(spec, normalize=False)(wire))
    none: list = []
    Q.encode(x, spec.replace(min_psnr=None), decoded=none)
    assert none == []
