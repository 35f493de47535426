"""Codec core: exactness, layout, masks, the paper's dense formulation, properties, errors."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dctdata
from dctdata.codec import transform
from dctdata.codec.metrics import psnr
from dctdata.codec.transform import dct_matrix, grid_shape, kept_frequencies, num_kept

ODD_SHAPES = [(1, 1), (7, 13), (61, 77), (492, 656), (3, 2, 9, 17), (2, 1, 8, 8)]


def smooth_field(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    # a cumulative sum gives a correlated, image-like field with real low-frequency content
    return x.cumsum(-1).cumsum(-2).to(torch.float32)


def test_dct_matrix_is_orthonormal_dct_ii():
    t = dct_matrix(torch.float64)
    torch.testing.assert_close(t @ t.T, torch.eye(8, dtype=torch.float64))
    assert torch.allclose(t[0], torch.full((8,), 1 / math.sqrt(8), dtype=torch.float64))
    i, j = 3, 5
    assert t[i, j].item() == pytest.approx(math.sqrt(2 / 8) * math.cos(math.pi * (2 * j + 1) * i / 16))


@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_cf8_round_trip_is_exact_for_any_size(shape):
    x = smooth_field(shape, seed=sum(shape))
    y = dctdata.compress(x, cf=8)
    hb, wb = grid_shape(*shape[-2:])
    assert y.shape == (*shape[:-2], hb, 64, wb)
    assert y.dtype == torch.float32
    x_hat = dctdata.decompress(y, cf=8, size=shape[-2:])
    assert x_hat.shape == x.shape
    torch.testing.assert_close(x_hat, x, atol=2e-6 * float(x.abs().max()) + 1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_compute_in_float32(dtype):
    x = torch.rand(2, 16, 24).to(dtype)
    y = dctdata.compress(x, cf=8)
    assert y.dtype == torch.float32
    torch.testing.assert_close(dctdata.decompress(y, 8, (16, 24)), x.to(torch.float32), atol=1e-5, rtol=0)


def paper_compress(x: torch.Tensor, cf: int) -> torch.Tensor:
    """The paper's dense formulation: A = LHS . X . RHS with block-diagonal chopped DCT operators."""
    h, w = x.shape
    t = dct_matrix(torch.float64)[:cf]
    lhs = torch.block_diag(*([t] * (h // 8)))  # (cf*Hb, H)
    rhs = torch.block_diag(*([t] * (w // 8))).T  # (W, cf*Wb)
    return lhs @ x.to(torch.float64) @ rhs


@pytest.mark.parametrize("cf", [1, 3, 5, 8])
@pytest.mark.parametrize("hw", [(16, 16), (40, 24)])
def test_square_mask_matches_paper_dense_formulation(cf, hw):
    x = smooth_field(hw, seed=cf)
    a = paper_compress(x, cf)  # block-interleaved (cf*Hb, cf*Wb)
    hb, wb = hw[0] // 8, hw[1] // 8
    ours = dctdata.compress(x, cf=cf, mask="square").to(torch.float64)  # (Hb, cf*cf, Wb)
    as_paper = ours.reshape(hb, cf, cf, wb).permute(0, 1, 3, 2).reshape(hb * cf, wb * cf)
    torch.testing.assert_close(as_paper, a, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("cf", range(1, 9))
def test_masks_keep_exactly_the_documented_frequencies(cf):
    sq = kept_frequencies(cf, "square")
    tri = kept_frequencies(cf, "triangle")
    assert set(sq) == {(u, v) for u in range(cf) for v in range(cf)}
    assert set(tri) == {(u, v) for u in range(8) for v in range(8) if u + v < cf}
    assert num_kept(cf, "square") == cf * cf and num_kept(cf, "triangle") == cf * (cf + 1) // 2
    assert list(sq) == sorted(sq) and list(tri) == sorted(tri)  # row-major order


@pytest.mark.parametrize("cf", [2, 4, 7])
def test_triangle_decode_equals_full_decode_with_dropped_frequencies_zeroed(cf):
    x = smooth_field((24, 32), seed=cf)
    full = dctdata.compress(x, cf=8)  # (Hb, 64, Wb)
    keep = torch.tensor([u + v < cf for u in range(8) for v in range(8)])
    zeroed = full * keep.reshape(1, 64, 1)
    expected = dctdata.decompress(zeroed, 8, (24, 32))
    tri = dctdata.compress(x, cf=cf, mask="triangle")
    assert tri.shape[-2] == cf * (cf + 1) // 2
    torch.testing.assert_close(dctdata.decompress(tri, cf, (24, 32), "triangle"), expected, atol=1e-4, rtol=0)


def test_cost_is_per_block_batched_equals_unbatched():
    x = smooth_field((4, 3, 20, 28), seed=3)
    y = dctdata.compress(x, cf=5, mask="triangle")
    for b in range(4):
        torch.testing.assert_close(y[b], dctdata.compress(x[b], cf=5, mask="triangle"))
    torch.testing.assert_close(
        dctdata.decompress(y, 5, (20, 28), "triangle")[2, 1], dctdata.decompress(y[2, 1], 5, (20, 28), "triangle")
    )


def test_edge_padding_replicates_the_last_row_and_column():
    x = smooth_field((11, 13), seed=5)
    by_hand = torch.cat([x, x[:, -1:].expand(11, 3)], dim=1)
    by_hand = torch.cat([by_hand, by_hand[-1:].expand(5, 16)], dim=0)  # 16 x 16, last row/col repeated
    torch.testing.assert_close(dctdata.compress(x, cf=3, pad="edge"), dctdata.compress(by_hand, cf=3))


def test_symmetric_padding_mirrors_half_sample():
    x = smooth_field((11, 13), seed=5)
    by_hand = torch.cat([x, x[:, [12, 11, 10]]], dim=1)  # x[n + j] = x[n - 1 - j]
    by_hand = torch.cat([by_hand, by_hand[[10, 9, 8, 7, 6]]], dim=0)
    torch.testing.assert_close(dctdata.compress(x, cf=3, pad="symmetric"), dctdata.compress(by_hand, cf=3))
    tiny = torch.tensor([[1.0, 2.0]])  # shorter than a block: the mirror repeats with period 2n
    want = torch.tensor([1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 1.0]).expand(8, 8)
    torch.testing.assert_close(dctdata.compress(tiny, pad="symmetric"), dctdata.compress(want))
    with pytest.raises(
        dctdata.DctDataError, match=r"pad: expected one of \('edge', 'symmetric', 'extend'\)\. Got 'zero'"
    ):
        dctdata.compress(x, pad="zero")


def _weighted_ac(block_rows: torch.Tensor) -> torch.Tensor:
    """sum_u u c_u^2 of each row's 8-point DCT (the energy the "extend" fill minimises)."""
    c = block_rows.double() @ transform.dct_matrix(torch.float64).T
    return (c.pow(2) * torch.arange(8.0, dtype=torch.float64)).sum(-1)


def test_extend_padding_is_the_default_and_fills_a_block_from_its_own_pixels():
    x = smooth_field((13, 20), seed=5)  # H: r = 5 known rows in the last block, W: r = 4
    by_hand = torch.cat([x, x[:, [19, 18, 17, 16]]], dim=1)  # r >= 4: mirrored inside the block
    by_hand = torch.cat([by_hand, by_hand[[12, 11, 10]]], dim=0)
    torch.testing.assert_close(transform.pad_to_blocks(x[None])[0], by_hand, rtol=0, atol=0)
    torch.testing.assert_close(dctdata.compress(x, cf=3), dctdata.compress(by_hand, cf=3, pad="extend"))
    g = torch.Generator().manual_seed(0)
    for r in (1, 2, 3):  # fewer: the smooth fill, from the block's own r values only
        row = torch.randn(3, 8 + r, generator=g, dtype=torch.float64).cumsum(-1).float()
        padded = transform.extend_axis(row, -1, 8 + r)
        assert padded.shape == (3, 16) and torch.equal(padded[:, : 8 + r], row)
        tail = padded[:, 8:]
        # the least-squares optimum: no small move of the padded values lowers the weighted AC energy ...
        for j in range(r, 8):
            for eps in (1e-2, -1e-2):
                moved = tail.clone()
                moved[:, j] += eps
                assert bool((_weighted_ac(moved) > _weighted_ac(tail)).all())
        # ... which is below the half-sample mirror's, that reaches into the previous block
        mirrored = transform.pad_to_blocks(row.reshape(3, 1, 8 + r), "symmetric")[:, 0, 8:]
        assert bool((_weighted_ac(tail) <= _weighted_ac(mirrored) + 1e-9).all())
        # a constant stays a constant
        const = transform.extend_axis(torch.full((1, 8 + r), 7.5), -1, 8 + r)
        torch.testing.assert_close(const, torch.full((1, 16), 7.5))
    tiny = torch.tensor([[1.0, 2.0]])  # shorter than a block: H r = 1 repeats the row, W r = 2 the fill
    assert transform.pad_to_blocks(tiny[None]).shape == (1, 8, 8)


# ---- properties --------------------------------------------------------------------------------
shapes = st.tuples(st.integers(1, 40), st.integers(1, 40))


@settings(max_examples=40, deadline=None)
@given(
    hw=shapes,
    cf=st.integers(1, 8),
    mask=st.sampled_from(["square", "triangle"]),
    seed=st.integers(0, 10_000),
    a=st.floats(-3, 3),
    b=st.floats(-3, 3),
)
def test_compress_and_decompress_are_linear(hw, cf, mask, seed, a, b):
    x1 = smooth_field(hw, seed)
    x2 = smooth_field(hw, seed + 1)
    y = dctdata.compress(a * x1 + b * x2, cf, mask)
    y_lin = a * dctdata.compress(x1, cf, mask) + b * dctdata.compress(x2, cf, mask)
    scale = 1 + float(y.abs().max())
    torch.testing.assert_close(y, y_lin, atol=1e-4 * scale, rtol=0)
    d = dctdata.decompress(y, cf, hw, mask)
    d_lin = a * dctdata.decompress(dctdata.compress(x1, cf, mask), cf, hw, mask) + b * dctdata.decompress(
        dctdata.compress(x2, cf, mask), cf, hw, mask
    )
    torch.testing.assert_close(d, d_lin, atol=1e-4 * scale, rtol=0)


@settings(max_examples=40, deadline=None)
@given(hb=st.integers(1, 5), wb=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_parseval_energy_is_preserved_at_cf8(hb, wb, seed):
    x = torch.randn(hb * 8, wb * 8, generator=torch.Generator().manual_seed(seed))
    y = dctdata.compress(x, cf=8)
    assert float(y.pow(2).sum()) == pytest.approx(float(x.pow(2).sum()), rel=1e-4)


@settings(max_examples=25, deadline=None)
@given(
    hw=st.tuples(st.integers(8, 48), st.integers(8, 48)),
    seed=st.integers(0, 10_000),
    mask=st.sampled_from(["square", "triangle"]),
)
def test_psnr_is_non_decreasing_in_cf(hw, seed, mask):
    x = smooth_field(hw, seed) + 0.3 * torch.randn(*hw, generator=torch.Generator().manual_seed(seed))
    scores = [float(psnr(x, dctdata.decompress(dctdata.compress(x, cf, mask), cf, hw, mask))) for cf in range(1, 9)]
    assert all(b >= a - 1e-6 for a, b in itertools.pairwise(scores)), scores


# ---- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cf", [0, 9, -1])
def test_cf_out_of_range_is_a_clear_error(cf):
    with pytest.raises(dctdata.DctDataError, match=rf"cf: expected an int in 1\.\.8\. Got {cf}"):
        dctdata.compress(torch.zeros(8, 8), cf=cf)


def test_cf_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"cf: expected an int in 1\.\.8\. Got 2\.5"):
        dctdata.compress(torch.zeros(8, 8), cf=2.5)


def test_unknown_mask_is_a_clear_error():
    with pytest.raises(dctdata.DctDataError, match=r"mask: expected one of \('square', 'triangle'\)\. Got 'circle'"):
        dctdata.compress(torch.zeros(8, 8), cf=2, mask="circle")


def test_rank_below_two_is_a_clear_error():
    with pytest.raises(dctdata.DctDataError, match=r"expected rank >= 2 .* Got shape \(5,\)"):
        dctdata.compress(torch.zeros(5), cf=2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_non_floating_input_is_a_type_error(dtype):
    with pytest.raises(TypeError, match=rf"expected a floating tensor .* Got {dtype}"):
        dctdata.compress(torch.zeros(8, 8, dtype=dtype), cf=2)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match=r"expected a torch.Tensor of shape"):
        dctdata.compress([[1.0]], cf=2)


def test_size_smaller_than_coefficient_grid_is_a_clear_error():
    y = dctdata.compress(torch.zeros(24, 24), cf=2)  # grid 3 x 3
    with pytest.raises(
        dctdata.DctDataError,
        match=r"expected shape \(\.\.\., Hb, K, Wb\) = \(\.\.\., 2, 4, 3\) .* size \(16, 24\)\. Got \(3, 4, 3\)",
    ):
        dctdata.decompress(y, 2, (16, 24))


def test_wrong_kept_count_is_a_clear_error():
    y = dctdata.compress(torch.zeros(16, 16), cf=3)
    with pytest.raises(dctdata.DctDataError, match=r"K=4 kept frequencies"):
        dctdata.decompress(y, 2, (16, 16))


@pytest.mark.parametrize(
    "size, err, msg",
    [((0, 4), dctdata.DctDataError, "H >= 1"), ((4,), TypeError, "pair"), ((4.0, 4), TypeError, "integer H")],
)
def test_bad_size_is_a_clear_error(size, err, msg):
    with pytest.raises(err, match=msg):
        dctdata.decompress(torch.zeros(1, 4, 1), 2, size)


def test_empty_image_is_a_clear_error():
    with pytest.raises(dctdata.DctDataError, match=r"expected H, W >= 1"):
        dctdata.compress(torch.zeros(3, 0, 5), cf=2)
