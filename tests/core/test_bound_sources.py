"""Pointwise bounds against the source as given, on every decode path (issue 45, 01-04, 06, 07): float64 and
other source dtypes, every documented output dtype, constant items under a relative bound, channels of far
apart ranges, a target with a bound, near-constant and grid data; both storages, decode="cpu" and "device"."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dctdata
from dctdata.codec.lattice import snap
from dctdata.decoder.corrections import EXACT, build
from dctdata.decoder.wire import collate
from dctdata.encoder.bounds import BoundError
from dctdata.format import read_manifest
from dctdata.verify import verify_dataset


def items(path, fmt: str) -> list:
    """The pack's samples in order, as its readers yield them."""
    ds = dctdata.open_dataset(path, **({"shuffle": False} if fmt == "webdataset" else {}))
    return [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)


def decodes(path, fmt: str, dtype: torch.dtype, decode: str = "cpu") -> torch.Tensor:
    """Every sample of the pack decoded by its layer in `dtype`, through `decode` ("device": the stored bytes,
    collated and decoded by the layer, on the CPU here)."""
    ds = dctdata.open_dataset(path, decode=decode, **({"shuffle": False} if fmt == "webdataset" else {}))
    layer = ds.decompressor(dtype=dtype)
    got = [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)
    if decode == "device":
        return layer(collate(got)[0]).double()
    return torch.stack([layer(s[0]) for s in got]).double()


def bounds_of(x: np.ndarray, max_error=None, max_rel_error=None) -> torch.Tensor:
    """(N, C, 1, 1) the bound of every item of the source (as given, float64)."""
    s = torch.from_numpy(np.asarray(x, np.float64))
    b = torch.full(s.shape[:2], np.inf, dtype=torch.float64)
    if max_error is not None:
        b = b.clamp(max=max_error)
    if max_rel_error is not None:
        flat = s.flatten(2)
        b = torch.minimum(b, max_rel_error * (flat.amax(-1) - flat.amin(-1)))
    return b[..., None, None]


def excess(y: torch.Tensor, x: np.ndarray, bound: torch.Tensor, slack: float = 0.0) -> float:
    """The largest amount by which a decoded value misses its bound (<= 0: every value holds)."""
    s = torch.from_numpy(np.asarray(x, np.float64))
    return float(((y - s).abs() - bound - slack * s.abs()).max())


# 01: float64 sources -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_a_bound_float32_cannot_hold_on_a_float64_source_is_named(tmp_path, fmt):
    """Integers + 0.001 (float32 rounds them by 7e-6) at 1e-6, and a constant 0.1 item at 1e-12: the pack
    fails naming sample, field and channel, before anything is written."""
    rng = np.random.default_rng(0)
    ints = np.round(rng.uniform(0, 200, size=(3, 2, 16, 16))) + 0.001
    flat = np.full((3, 2, 16, 16), 0.3)
    flat[1, 1] = 0.1
    for x, bound, name in ((ints, 1e-6, r"sample \d+: field 'image'"), (flat, 1e-12, r"sample \d+: field 'image'")):
        out = tmp_path / f"{fmt}-{bound:g}"
        with pytest.raises(BoundError, match=rf"{name}: .* channel 0 that float32, what the codec stores, rounds by"):
            dctdata.pack(x, out, format=fmt, max_error=bound, quiet=True)
        assert not out.exists()
    rel = np.random.default_rng(1).normal(size=(3, 2, 16, 16)).cumsum(-1)
    rel[2, 1] = 0.1  # constant: its relative bound is 0, and float32 does not hold 0.1
    with pytest.raises(BoundError, match=r"sample 2: field 'image': .* channel 1 that float32, what the codec"):
        dctdata.pack(rel, tmp_path / f"{fmt}-rel", format=fmt, max_rel_error=1e-3, quiet=True)


@pytest.mark.parametrize(
    ("dtype", "fmt"),
    [("float64", "zarr")] + [pytest.param(*p, marks=pytest.mark.slow) for p in
                             (("float64", "webdataset"), ("float32", "webdataset"), ("float16", "zarr"))],
)  # fmt: skip
def test_every_source_dtype_holds_its_bound_on_every_output_dtype(tmp_path, dtype, fmt):
    """Smooth data, values on a grid (lattice items) and a constant item, in the source's dtype, under an
    absolute and a relative bound: float32 and float64 decodes hold the bound against the source as given
    (decode "cpu" and "device"), float16 and bfloat16 within it plus half an ulp of their own; the figures
    the pack records are the readers' and `verify` passes the fresh pack."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 3, 16, 24)).cumsum(-1) + 5.0
    x[:, 1] = np.round(rng.uniform(0, 60, size=(4, 16, 24))) * 0.25 + 1.001  # a grid float64 does not share
    x[2, 2] = 3.25  # a constant item
    x = x.astype(dtype)
    for kw in ({"max_error": 2e-3}, {"max_rel_error": 1e-3}):
        out = tmp_path / f"{next(iter(kw))}"
        dctdata.pack(x, out, format=fmt, quiet=True, **kw)
        bound = bounds_of(x, **kw)
        for decode in ("cpu", "device"):
            for out_dtype in (torch.float32, torch.float64):
                assert excess(decodes(out, fmt, out_dtype, decode), x, bound) <= 0, (decode, out_dtype)
        half = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
        for out_dtype, ulp in half.items():
            assert excess(decodes(out, fmt, out_dtype), x, bound, slack=ulp) <= 0, out_dtype
        if "max_rel_error" in kw:  # the constant item is stored exactly on every path
            for out_dtype in (torch.float32, torch.float64):
                assert torch.equal(decodes(out, fmt, out_dtype)[2, 2], torch.full((16, 24), 3.25, dtype=torch.float64))
        recorded = [ch.max_abs_error for ch in read_manifest(out).stats["image"].channels]
        y = decodes(out, fmt, torch.float32)
        measured = (y - torch.from_numpy(x.astype(np.float64))).abs().amax(dim=(0, 2, 3))
        assert recorded == pytest.approx(measured.tolist(), rel=1e-5)  # the manifest keeps 6 digits
        problems, _ = verify_dataset(out)
        assert problems == []


def test_integer_sources_packed_as_dct_hold_their_bound(tmp_path):
    rng = np.random.default_rng(4)
    for dtype in ("int16", "uint16", "int32"):
        x = (rng.normal(size=(3, 1, 16, 16)).cumsum(-1) * 300 + 2000).astype(dtype)
        if dtype == "int32":
            x[1] += 1 << 25  # past 2^24: float32 does not hold every value
        out = tmp_path / dtype
        try:
            dctdata.pack(x, out, fields={"image": "dct"}, max_rel_error=1e-4, quiet=True)
        except BoundError as exc:  # only where float32 cannot carry the values
            assert dtype == "int32" and "sample 1: field 'image'" in str(exc) and "float32" in str(exc)
            continue
        for out_dtype in (torch.float32, torch.float64):
            assert excess(decodes(out, "zarr", out_dtype), x, bounds_of(x, max_rel_error=1e-4)) <= 0


# 02: the snap in every output dtype ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_the_snap_lands_on_float32_grid_points_in_every_dtype(dtype):
    """float32(k + 0.001) on the grid (step 1, origin 1.001f): a float64 snap lands on k + 1.001f exactly as
    float32 computes it, not beside it; an item without a grid is left exactly as decoded."""
    k = torch.arange(0, 200, dtype=torch.float64)
    values = (k + 0.001).to(torch.float32)
    img = torch.stack([values.double() + 1e-4, values.double() * 1.0000001]).reshape(1, 2, 10, 20)
    rows = torch.tensor([[[1.0, float(values[0])], [0.0, 0.0]]], dtype=torch.float32)
    got = snap(img.to(dtype), rows)
    assert got.dtype == dtype
    assert torch.equal(got[0, 0].double(), values.to(dtype).double().reshape(10, 20))
    assert torch.equal(got[0, 1], img[0, 1].to(dtype))  # step 0: untouched (a float64 value keeps its digits)


# 07: constant items under a relative bound -------------------------------------------------------
@pytest.mark.parametrize("fmt", ["zarr", pytest.param("webdataset", marks=pytest.mark.slow)])
@pytest.mark.parametrize("value", [1.0, 3.25, -7e5, 0.0])
def test_a_constant_item_under_a_relative_bound_is_stored_exactly(tmp_path, fmt, value):
    x = np.random.default_rng(0).normal(size=(4, 2, 16, 16)).cumsum(-1).astype(np.float32)
    x[1, 1] = value
    for r in (1e-3, 1e-1):
        out = tmp_path / f"r{r:g}"
        dctdata.pack(x, out, format=fmt, max_rel_error=r, quiet=True)
        for decode in ("cpu", "device"):
            for dtype in (torch.float32, torch.float64):
                y = decodes(out, fmt, dtype, decode)
                assert torch.equal(y[1, 1], torch.full((16, 16), value, dtype=torch.float64))
                assert excess(y, x, bounds_of(x, max_rel_error=r)) <= 0


def test_a_constant_item_unseen_by_calibration_is_named_with_advice_that_helps(tmp_path):
    x = np.random.default_rng(0).normal(size=(6, 1, 16, 16)).cumsum(-1).astype(np.float32)
    x[5] = 2.5  # not in the calibration subset: the codec has no lattice
    with pytest.raises(BoundError, match=r"sample 5: field 'image': .* channel 0 \(a constant item: .* calibration"):
        dctdata.pack(x, tmp_path / "p", max_rel_error=1e-3, calibration=x[:4], quiet=True)
    dctdata.pack(x, tmp_path / "q", max_rel_error=1e-3, calibration=x[2:], quiet=True)  # seen: stored exactly
    assert torch.equal(decodes(tmp_path / "q", "zarr", torch.float32)[5], torch.full((1, 16, 16), 2.5).double())


@pytest.mark.parametrize(
    "kw", [{"max_error": 1e-3}, {"max_rel_error": 1e-3}, {"max_error": 1e-3, "max_rel_error": 1e-2}]
)
def test_an_all_constant_set_packs_under_a_bound(tmp_path, kw):
    """No PSNR is asked: a set of constant items packs (no message about PSNR), each within its bound."""
    x = np.full((3, 2, 16, 16), 5.0, np.float32)
    x[1] = -3.5
    dctdata.pack(x, tmp_path / "p", quiet=True, **kw)
    for dtype in (torch.float32, torch.float64):
        assert excess(decodes(tmp_path / "p", "zarr", dtype), x, bounds_of(x, **kw)) <= 0


# 03: channels whose ranges differ by 1e8 ----------------------------------------------------------
@pytest.mark.parametrize("scales", [(1e4, 1e-4), (1e-4, 1.0, 1e4)])
def test_channels_of_far_apart_ranges_pack_with_corrections(tmp_path, scales):
    rng = np.random.default_rng(1)
    smooth = rng.normal(size=(4, 1, 24, 24)).cumsum(-1).cumsum(-2)
    x = np.concatenate([smooth * s for s in scales], 1).astype(np.float32)
    dctdata.pack(x, tmp_path / "p", max_rel_error=1e-4, quiet=True)
    for dtype in (torch.float32, torch.float64):
        assert excess(decodes(tmp_path / "p", "zarr", dtype), x, bounds_of(x, max_rel_error=1e-4)) <= 0


def test_corrections_are_only_built_where_float32_holds_their_multiples():
    """A sample whose misses need more than 2^24 correction steps goes without (count > cap), and a channel
    without misses does not make the step finer."""
    x = torch.zeros(2, 2, 8, 8, dtype=torch.float64)
    x_hat = x.clone()
    x_hat[0, 0, 0, 0] = 1.0  # channel 0 misses by 1 in both samples
    x_hat[1, 0, 0, 0] = 1.0
    x_hat[1, 1, 0, 1] = 1e-9  # sample 1's channel 1 misses by a hair, with a tiny room
    room = torch.tensor([[1e-3, 1e-12], [1e-3, 1e-12]], dtype=torch.float64)
    fix, counts = build(x, x_hat, room, cap=16)
    assert int(counts[0]) == 1 and float(fix[0, 0, 0]) == pytest.approx(1e-3)  # channel 1's room not used
    assert float(fix[0, 1, 1]).is_integer() and abs(float(fix[0, 1, 1])) <= EXACT
    assert int(counts[1]) > 16  # 1 / 1e-12 steps: not stored


# 04: a target with a bound ----------------------------------------------------------------------
def test_a_target_with_a_bound_packs_when_int8_cannot_hold_the_bound(tmp_path):
    x = (np.random.default_rng(0).normal(size=(2, 2, 17, 36)) + 8060.0).astype(np.float32)
    x[0, 0, 0, 0] = 0.0  # one outlier: int8's landing cannot hold the bound
    dctdata.pack(x, tmp_path / "p", max_rel_error=0.0098, target_psnr=50.4, quiet=True)
    assert excess(decodes(tmp_path / "p", "zarr", torch.float32), x, bounds_of(x, max_rel_error=0.0098)) <= 0
    assert read_manifest(tmp_path / "p").stats["image"].psnr_dataset >= 50.4 - 0.3


# 06: tight relative bounds on near-constant, checkerboard and grid data ---------------------------
def _one_ulp_column():
    x = np.full((2, 3, 25, 21), 217315.8125, np.float32)
    x[:, :, :, 0] = np.nextafter(np.float32(217315.8125), np.float32(1e9))
    return x


def _checkerboard():
    x = np.full((2, 2, 16, 16), 1000.0, np.float32)
    x[:, :, ::2, ::2] += np.float32(2.0**-14)
    return x


def _grid():
    return (np.random.default_rng(5).integers(0, 3, size=(2, 2, 16, 16)) * 0.001 + 40.0).astype(np.float32)


@pytest.mark.parametrize("make", [_one_ulp_column, _checkerboard, _grid])
@pytest.mark.parametrize("r", [3.9e-6, 1e-3])
def test_tight_relative_bounds_give_valid_steps_or_a_named_error(tmp_path, make, r):
    x = make()
    try:
        dctdata.pack(x, tmp_path / "p", max_rel_error=r, quiet=True)
    except BoundError as exc:
        assert not str(exc).startswith("steps:") and "field 'image'" in str(exc) and " sample " in str(exc)
        assert "channel" in str(exc) and len(str(exc)) < 600
        return
    steps = np.asarray(read_manifest(tmp_path / "p").fields[0].codec.steps)
    assert (steps > 0).all()
    for dtype in (torch.float32, torch.float64):
        assert excess(decodes(tmp_path / "p", "zarr", dtype), x, bounds_of(x, max_rel_error=r)) <= 0
