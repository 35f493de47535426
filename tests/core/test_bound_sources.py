"""Pointwise bounds against the source as given, on every decode path (issue 45, 01-04, 06, 07): float64 and
other source dtypes, every documented output dtype, constant items under a relative bound, channels of far
apart ranges, a target with a bound, near-constant and grid data; both storages, decode="cpu" and "device"."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pack_checks import quick_pack as pack

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


def decodes(path, fmt: str, dtype: torch.dtype | None, decode: str = "cpu") -> torch.Tensor:
    """Every sample of the pack decoded by its layer in `dtype` (None: the layer's default), through `decode`
    ("device": the stored bytes, collated and decoded by the layer, on the CPU here)."""
    ds = dctdata.open_dataset(path, decode=decode, **({"shuffle": False} if fmt == "webdataset" else {}))
    layer = ds.decompressor() if dtype is None else ds.decompressor(dtype=dtype)
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
def float64_sources() -> list[tuple[str, np.ndarray, dict]]:
    """float64 sets whose bound float32 cannot hold (name, samples (N, 2, 16, 16), bound keywords): integers +
    0.001 (a lattice float32 rounds by 7e-6), constants 0.1 and 0.3 at 1e-12 (a two-point lattice), small
    smooth noise on a large offset (no lattice: float32's ulp at 1000 is 6e-5), and a random walk under a
    relative bound with a constant 0.1 item (stored exactly: a one-point lattice of a float64 value)."""
    rng = np.random.default_rng(0)
    ints = np.round(rng.uniform(0, 200, size=(3, 2, 16, 16))) + 0.001
    two = np.where(np.arange(16)[:, None] < 8, 0.3, 0.1) * np.ones((3, 2, 16, 16))
    offset = 1000.0 + 0.01 * np.sin(
        np.arange(16)[:, None] / 3.0 + np.arange(16) / 5.0 + np.arange(6).reshape(3, 2, 1, 1)
    )
    walk = rng.normal(size=(3, 2, 16, 16)).cumsum(-1)
    walk[2, 1] = 0.1
    return [
        ("ints+0.001", ints, {"max_error": 1e-6}),
        ("0.1/0.3", two, {"max_error": 1e-12}),
        ("offset", offset, {"max_error": 1e-6}),
        ("walk", walk, {"max_rel_error": 1e-3}),
    ]


@pytest.mark.parametrize("fmt", ["zarr", pytest.param("webdataset", marks=pytest.mark.slow)])
def test_a_float64_source_decodes_in_float64_within_its_bound(tmp_path, fmt):
    """A float64 source under a bound float32 cannot hold packs, records its float64 decode (codec precision,
    float64 side values), and every reader's default decode (the layer on decode="cpu" coefficients and on
    decode="device" stored bytes) is float64 and holds the bound against the float64 source; the figures the
    pack records are that decode's, and `verify` passes."""
    for name, x, kw in float64_sources():
        out = tmp_path / name.replace("/", "-")
        pack(x, out, format=fmt, quiet=True, **kw)
        f = read_manifest(out).field("image")
        assert f.codec.precision == "float64" and f.codec.side_dtype == "float64", name
        assert dctdata.open_dataset(out).decompressor().dtype == torch.float64
        bound = bounds_of(x, **kw)
        for decode in ("cpu", "device"):
            y = decodes(out, fmt, None, decode)
            assert excess(y, x, bound) <= 0, (name, decode)
        assert items(out, fmt)[0][0][1].dtype == torch.float64  # the side values as the readers yield them
        if name == "walk":  # the constant item is stored exactly
            assert torch.equal(y[2, 1], torch.full((16, 16), 0.1, dtype=torch.float64))
        recorded = [ch.max_abs_error for ch in read_manifest(out).stats["image"].channels]
        measured = (y - torch.from_numpy(x)).abs().amax(dim=(0, 2, 3))
        assert recorded == pytest.approx(measured.tolist(), rel=1e-5, abs=1e-300)
        problems, _ = verify_dataset(out)
        assert problems == [], name


def test_a_float64_field_decoded_in_another_dtype_computes_in_float64_then_rounds(tmp_path):
    """An output dtype other than float64 is the float64 decode rounded once (its bound then holds to that
    dtype's rounding), in the 2-D layer and the volume layer."""
    _, x, kw = float64_sources()[0]
    pack(x, tmp_path / "p", quiet=True, **kw)
    ds = dctdata.open_dataset(tmp_path / "p")
    wire = collate([ds[i] for i in range(len(ds))])[0]
    exact = ds.decompressor()(wire)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert torch.equal(ds.decompressor(dtype=dtype)(wire), exact.to(dtype)), dtype
    vol = np.round(np.random.default_rng(5).uniform(0, 50, size=(2, 1, 8, 8, 8))) + 0.001
    pack(vol, tmp_path / "v", dims=3, max_error=1e-6, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "v")
    wire = collate([ds[i] for i in range(len(ds))])[0]
    exact = ds.decompressor()(wire)
    assert float((exact - torch.from_numpy(vol)).abs().max()) <= 1e-6
    for dtype in (torch.float32, torch.float16):
        assert torch.equal(ds.decompressor(dtype=dtype)(wire), exact.to(dtype)), dtype


def test_a_float64_source_with_a_target_and_a_bound_holds_both(tmp_path):
    """--target-psnr with --max-error on a float64 source: the target is searched on its float32 values, the
    bound calibrated and kept on its float64 values (a lattice float32 cannot see, noise on an offset)."""
    rng = np.random.default_rng(9)
    x = np.round(rng.uniform(0, 200, size=(6, 1, 16, 16))) + 0.001
    x[3:] = 100 + 1e-3 * rng.normal(size=(3, 1, 16, 16)).cumsum(-1)
    pack(x, tmp_path / "p", target_psnr=40, max_error=1e-6, quiet=True)
    m = read_manifest(tmp_path / "p")
    codec = m.field("image").codec
    assert codec.precision == "float64" and codec.lattice is True
    y = decodes(tmp_path / "p", "zarr", None)
    assert excess(y, x, torch.tensor(1e-6, dtype=torch.float64)) <= 0
    assert m.stats["image"].psnr_dataset >= 40


@pytest.mark.parametrize("fmt", ["zarr", pytest.param("webdataset", marks=pytest.mark.slow)])
def test_a_float64_volume_holds_its_bound(tmp_path, fmt):
    """--dims 3: a float64 volume on a large offset (no lattice) and one on a float64 lattice hold an
    absolute bound float32 cannot, on decode="cpu" and "device"."""
    rng = np.random.default_rng(6)
    d = np.arange(8)
    smooth = 1000.0 + 0.01 * np.sin(d[:, None, None] / 3.0 + d[:, None] / 4.0 + d / 5.0)
    x = np.stack([smooth + 1e-3 * rng.normal(size=(8, 8, 8)).cumsum(-1) for _ in range(2)])[:, None]
    x = np.concatenate([x, np.round(rng.uniform(0, 50, size=(2, 1, 8, 8, 8))) + 0.001], 1)
    out = tmp_path / "v"
    pack(x, out, dims=3, format=fmt, max_error=1e-6, quiet=True)
    assert read_manifest(out).field("image").codec.precision == "float64"
    bound = torch.full((2, 2, 1, 1, 1), 1e-6, dtype=torch.float64)
    for decode in ("cpu", "device"):
        assert excess(decodes(out, fmt, None, decode), x, bound) <= 0, decode


def test_a_float64_bound_no_encoding_holds_is_named(tmp_path):
    """Noise on a range of 1 at 1e-12: no int16 step reaches it and corrections would cover every value: the
    pack fails naming sample, field and channel, before anything is written."""
    x = np.random.default_rng(7).uniform(size=(2, 1, 16, 16))
    out = tmp_path / "p"
    with pytest.raises(BoundError, match=r"sample \d+: field 'image': expected \|decoded - x\| <= 1e-12 .* channel 0"):
        pack(x, out, max_error=1e-12, quiet=True)
    assert not out.exists()


def test_float32_sources_and_unbounded_float64_sources_keep_their_float32_decode(tmp_path):
    """Only a float64 source with a bound decodes in float64: a float32 source with one, and a float64 source
    without one, keep float32 side values and a float32 default decode."""
    x = float64_sources()[3][1]
    for name, data, bound in (("f32", x.astype(np.float32), {"max_error": 1e-2}), ("f64", x, {})):
        pack(data, tmp_path / name, quiet=True, **bound)
        codec = read_manifest(tmp_path / name).field("image").codec
        assert codec.precision is None and dctdata.open_dataset(tmp_path / name).decompressor().dtype == torch.float32


def test_a_float64_decode_in_an_older_manifest_is_refused(tmp_path):
    """The codec key `precision` is a version 6 feature: a manifest of an older version naming it is refused."""
    import dataclasses

    from dctdata.errors import FormatError

    _, x, kw = float64_sources()[0]
    pack(x[:1], tmp_path / "p", quiet=True, **kw)
    m = read_manifest(tmp_path / "p")
    with pytest.raises(
        FormatError, match=r"field 'image': a float64 decode .* expected manifest version >= 6\. Got version 5"
    ):
        dataclasses.replace(m, version=5)


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
        pack(x, out, format=fmt, quiet=True, **kw)
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
        y = decodes(out, fmt, None)  # the readers' default decode: float64 for a float64 source's field
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
            pack(x, out, fields={"image": "dct"}, max_rel_error=1e-4, quiet=True)
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
        pack(x, out, format=fmt, max_rel_error=r, quiet=True)
        for decode in ("cpu", "device"):
            for dtype in (torch.float32, torch.float64):
                y = decodes(out, fmt, dtype, decode)
                assert torch.equal(y[1, 1], torch.full((16, 16), value, dtype=torch.float64))
                assert excess(y, x, bounds_of(x, max_rel_error=r)) <= 0


def test_a_constant_item_unseen_by_calibration_is_named_with_advice_that_helps(tmp_path):
    x = np.random.default_rng(0).normal(size=(6, 1, 16, 16)).cumsum(-1).astype(np.float32)
    x[5] = 2.5  # not in the calibration subset: the codec has no lattice
    with pytest.raises(BoundError, match=r"sample 5: field 'image': .* channel 0 \(a constant item: .* calibration"):
        pack(x, tmp_path / "p", max_rel_error=1e-3, calibration=x[:4], quiet=True)
    pack(x, tmp_path / "q", max_rel_error=1e-3, calibration=x[2:], quiet=True)  # seen: stored exactly
    assert torch.equal(decodes(tmp_path / "q", "zarr", torch.float32)[5], torch.full((1, 16, 16), 2.5).double())


@pytest.mark.parametrize(
    "kw", [{"max_error": 1e-3}, {"max_rel_error": 1e-3}, {"max_error": 1e-3, "max_rel_error": 1e-2}]
)
def test_an_all_constant_set_packs_under_a_bound(tmp_path, kw):
    """No PSNR is asked: a set of constant items packs (no message about PSNR), each within its bound."""
    x = np.full((3, 2, 16, 16), 5.0, np.float32)
    x[1] = -3.5
    pack(x, tmp_path / "p", quiet=True, **kw)
    for dtype in (torch.float32, torch.float64):
        assert excess(decodes(tmp_path / "p", "zarr", dtype), x, bounds_of(x, **kw)) <= 0


# 03: channels whose ranges differ by 1e8 ----------------------------------------------------------
@pytest.mark.parametrize("scales", [(1e4, 1e-4), (1e-4, 1.0, 1e4)])
def test_channels_of_far_apart_ranges_pack_with_corrections(tmp_path, scales):
    rng = np.random.default_rng(1)
    smooth = rng.normal(size=(4, 1, 24, 24)).cumsum(-1).cumsum(-2)
    x = np.concatenate([smooth * s for s in scales], 1).astype(np.float32)
    pack(x, tmp_path / "p", max_rel_error=1e-4, quiet=True)
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
    pack(x, tmp_path / "p", max_rel_error=0.0098, target_psnr=50.4, quiet=True)
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
        pack(x, tmp_path / "p", max_rel_error=r, quiet=True)
    except BoundError as exc:
        assert not str(exc).startswith("steps:") and "field 'image'" in str(exc) and " sample " in str(exc)
        assert "channel" in str(exc) and len(str(exc)) < 600
        return
    steps = np.asarray(read_manifest(tmp_path / "p").fields[0].codec.steps)
    assert (steps > 0).all()
    for dtype in (torch.float32, torch.float64):
        assert excess(decodes(tmp_path / "p", "zarr", dtype), x, bounds_of(x, max_rel_error=r)) <= 0


def test_the_volume_layer_snaps_before_rounding_to_half_precision(tmp_path):
    """A float32 volume on a grid finer than float16's spacing at its values (0.25 near 1000, where float16's
    ulp is 0.5), under a bound with a lattice: float16 and bfloat16 outputs of the volume layer are its float32
    decode (corrected and snapped) rounded once, so the bound holds to their own rounding."""
    rng = np.random.default_rng(8)
    x = (1000.0 + 0.25 * np.round(rng.uniform(0, 40, size=(2, 1, 8, 8, 8)))).astype(np.float32)
    pack(x, tmp_path / "v", dims=3, max_error=1e-3, quiet=True)
    assert read_manifest(tmp_path / "v").field("image").codec.lattice is True
    ds = dctdata.open_dataset(tmp_path / "v")
    wire = collate([ds[i] for i in range(len(ds))])[0]
    full = ds.decompressor()(wire)
    assert float((full.double() - torch.from_numpy(x.astype(np.float64))).abs().max()) <= 1e-3
    for dtype, ulp in ((torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)):
        half = ds.decompressor(dtype=dtype)(wire)
        assert torch.equal(half, full.to(dtype)), dtype
        assert excess(half.double(), x, torch.tensor(1e-3, dtype=torch.float64), slack=ulp) <= 0, dtype
