"""Value lattices of bounded fields (issue 32, `dctdata.codec.lattice`): items whose values lie on an evenly spaced
grid are coded to half its spacing and snapped back onto it, the bound still holds on every value (through
the encoder, the reference decoder, both storages, torch.export and ONNX Runtime), such packs store less than
coding to the bound, and hostile lattice rows fail clearly."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from pack_checks import ZSTD, quick_pack
from test_bounds import check_bound, cuda_decode_meets_the_bound, onnx_decode_meets_the_bound, smooth

import dctdata
from dctdata.codec import lattice
from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress
from dctdata.encoder.bounds import item_bounds
from dctdata.encoder.calibrate import calibrate_report
from dctdata.encoder.quantize import decode_reference, encode
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import read_manifest


def counts(rng, n, c, h, w):
    """Shot-noise frames: Poisson counts of a smooth intensity over a random dose per item, dead pixels 0."""
    lam = 20 + 10 * np.abs(smooth(rng, n, c, h, w)) / np.sqrt(h * w)
    dose = rng.uniform(5.0, 50.0, (n, c, 1, 1))
    x = (rng.poisson(lam) / dose).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = 0.0
    return x


def adc(rng, n, c, h, w):
    """Digitized readings: an offset plus whole multiples of a scale factor (like a scaled 12-bit ADC)."""
    level = np.round(40 * smooth(rng, n, c, h, w) / np.sqrt(h * w) + rng.integers(0, 30, (n, c, h, w)))
    return (3.15 + 0.05 * level).astype(np.float32)


def mixed(rng, n, c, h, w):
    """Channel 0 on a lattice, channel 1 continuous: one sample holds both kinds of item."""
    return np.concatenate([counts(rng, n, 1, h, w), smooth(rng, n, 1, h, w).astype(np.float32)], 1)


KINDS = {"counts": counts, "adc": adc, "mixed": mixed}


def _bounds(x: torch.Tensor, r: float):
    spec = CodecSpec(cf=8, height=x.shape[-2], width=x.shape[-1], channels=x.shape[1], dtype="int16",
                     steps=[1.0] * x.shape[1], side="range_mid", max_rel_error=r)  # fmt: skip
    return item_bounds(x, spec)


def test_detect_finds_the_grid_of_counts_over_a_dose():
    x = torch.from_numpy(counts(np.random.default_rng(0), 3, 2, 16, 24))
    bound, margin, _rng = _bounds(x, 1e-4)
    rows, eff = lattice.detect(x, None, bound, margin)
    for i in range(3):
        for c in range(2):
            v = np.unique(x[i, c].numpy().astype(np.float64))
            spacing = np.diff(v).min()
            assert rows[i, c, 0] == pytest.approx(spacing, rel=1e-5) and rows[i, c, 1] == 0  # 1/dose, from 0
    assert bool((eff > 1.25 * bound).all()) and bool((eff < rows[..., 0] / 2).all())


def test_detect_leaves_continuous_items_and_loose_bounds_alone():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(np.concatenate([smooth(rng, 2, 1, 16, 16), counts(rng, 2, 1, 16, 16)], 1).astype(np.float32))
    bound, margin, _ = _bounds(x, 1e-4)
    rows, eff = lattice.detect(x, None, bound, margin)
    assert bool((rows[:, 0] == 0).all()) and torch.equal(eff[:, 0], bound[:, 0])  # no grid in smooth values
    assert bool((rows[:, 1, 0] > 0).all())
    loose, margin, _ = _bounds(x, 0.3)  # wider than half the spacing: snapping gains nothing
    rows, eff = lattice.detect(x, None, loose, margin)
    assert bool((rows == 0).all()) and torch.equal(eff, loose)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(
    "bound",
    [
        {"max_rel_error": 1e-3},
        pytest.param({"max_rel_error": 1e-4}, marks=pytest.mark.slow),
        pytest.param({"max_error": 3e-3}, marks=pytest.mark.slow),
    ],
    ids=["bound0", "bound1", "bound2"],
)
def test_bound_holds_on_every_value_of_lattice_fields(kind, seed, bound):
    """Property: random lattice fields (counts over random doses, offset ADC readings, lattice and continuous
    channels side by side), some NaN-masked: every valid value decodes within the bound, in the layer and the
    reference decoder, and the on-grid items come back on their grid points."""
    rng = np.random.default_rng([7, seed, len(kind)])
    x = torch.from_numpy(KINDS[kind](rng, 5, 2, 24, 32))
    valid = torch.from_numpy(rng.random(x.shape) > 0.15) if seed == 1 else None
    if valid is not None:
        x = x.masked_fill(~valid, 0.0)
    v3 = None if valid is None else valid[:3]
    spec = calibrate_report(x[:3], quant=None, valid=v3, codec=ZSTD, **bound).spec  # samples 3, 4 unseen
    assert spec.lattice is True and spec.side_rows == 2 + 1 + spec.corrections + 2
    wire, _ = encode(x, spec, valid=valid)
    y = Decompress(spec, normalize=False)(wire)
    check_bound(x, y, spec, valid)
    check_bound(x, decode_reference(wire, spec).float(), spec, valid)
    grid = lattice.split(wire[1], 2)[1]
    on = grid[..., 0] > 0
    assert bool(on[:, 0].all()) and (kind != "mixed" or not bool(on[:, 1].any()))
    err = (y.double() - x.double()).abs()
    if valid is not None:
        err = err.masked_fill(~valid, 0)
    scale = x.double().abs().amax((-1, -2))
    assert float((err.amax((-1, -2)) / scale)[on].max()) < 1e-6  # the grid point itself, to float32 rounding


@pytest.mark.slow
def test_a_lattice_pack_stores_less_than_coding_to_the_bound(tmp_path, monkeypatch):
    x = counts(np.random.default_rng(3), 8, 1, 64, 64)

    def size(out):
        dctdata.pack(x, out, max_rel_error=1e-4, quiet=True)
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), read_manifest(out).fields[0].codec

    with_grid, spec = size(tmp_path / "grid")
    monkeypatch.setattr(lattice, "WORTH", float("inf"))  # no grid is ever worth it: the bound alone
    without, plain = size(tmp_path / "plain")
    assert spec.lattice is True and plain.lattice is None
    assert with_grid < 0.7 * without, (with_grid, without)


@pytest.mark.parametrize("fmt", [pytest.param("zarr", marks=pytest.mark.slow), "webdataset"])
def test_pack_with_a_lattice_reads_back_within_bound(tmp_path, fmt, capsys):
    x = counts(np.random.default_rng(4), 6, 2, 24, 32)
    out = tmp_path / "p"
    quick_pack(x, out, format=fmt, max_rel_error=1e-4, quiet=True)
    m = read_manifest(out)
    spec = m.fields[0].codec
    assert m.version >= 5 and spec.lattice is True
    assert CodecSpec.from_dict(spec.to_dict()) == spec and spec.to_dict()["lattice"] is True
    kw = {"shuffle": False} if fmt == "webdataset" else {}
    ds = dctdata.open_dataset(out, as_dict=True, **kw)
    items = [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)
    q = torch.stack([it["image"][0] for it in items])
    side = torch.stack([it["image"][1] for it in items])
    assert side.shape == (6, spec.side_rows, 2)
    layer = ds.decompressor("image", normalize=False)
    check_bound(torch.from_numpy(x), layer((q, side)), spec)
    dev = dctdata.open_dataset(out, as_dict=True, decode="device", **kw)
    from dctdata.decoder.wire import collate

    stored = collate([dev[i]["image"] for i in range(len(dev))] if fmt == "zarr" else [it["image"] for it in dev])
    device_layer = dev.decompressor("image", normalize=False)
    assert torch.equal(device_layer(stored), layer((q, side)))
    from dctdata.cli import main

    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert "corrections/sample, value lattices" in capsys.readouterr().out


@functools.cache
def _calibrated_wire():
    x = torch.from_numpy(counts(np.random.default_rng(5), 4, 2, 24, 32))
    spec = calibrate_report(x, quant=None, max_rel_error=1e-4, codec=ZSTD).spec
    assert spec.lattice is True
    wire, _ = encode(x, spec)
    return x, spec, wire


def _wire():
    """Counts on a lattice, its spec and wire: calibrated once for the module (the calibration is what takes
    time; none of the tests below checks it), fresh tensors for each test."""
    x, spec, (q, side) = _calibrated_wire()
    return x.clone(), spec, (q.clone(), side.clone())


@pytest.mark.parametrize(
    "row, value, match",
    [(0, float("nan"), "nan"), (0, -0.5, "-0.5"), (1, float("inf"), "inf")],
)
def test_hostile_lattice_rows_are_named(row, value, match):
    _, spec, (q, side) = _wire()
    bad = side.clone()
    bad[2, -1, row] = value
    expected = r"coeffs: sample 2 of the batch: lattice: expected finite rows with a step >= 0\. Got .*"
    with pytest.raises(IntegrityError, match=expected + match):
        Decompress(spec, normalize=False)((q, bad))


def test_snap_follows_the_normalization():
    """With the spec's mean/std the grid is mapped like the values: the normalized decode is the plain one,
    normalized."""
    _x, spec, wire = _wire()
    norm = spec.replace(mean=[2.0, -1.0], std=[0.5, 3.0])
    plain = Decompress(norm, normalize=False)(wire).double()
    y = Decompress(norm)(wire).double()
    want = (plain - torch.tensor([2.0, -1.0]).reshape(2, 1, 1)) / torch.tensor([0.5, 3.0]).reshape(2, 1, 1)
    assert float((y - want).abs().max()) < 1e-5
    assert torch.allclose(decode_reference(wire, norm), want, atol=1e-5)


def test_torch_export_snaps_like_eager():
    x, spec, (q, side) = _wire()
    layer = Decompress(spec, normalize=False).eval()
    y = torch.export.export(layer, ((q, side),)).module()((q, side))
    check_bound(x, y, spec)
    assert torch.equal(y, layer((q, side)))


@pytest.mark.slow
def test_onnx_runtime_snaps_onto_the_lattice(tmp_path):
    x, spec, (q, side) = _wire()
    ops = onnx_decode_meets_the_bound(x, spec, q, side, tmp_path / "lattice.onnx")
    assert "Round" in ops, ops


@pytest.mark.cuda
def test_cuda_snaps_like_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, spec, (q, side) = _wire()
    cuda_decode_meets_the_bound(x, spec, q, side)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lattice": True}, "lattice: expected max_error or max_rel_error with it"),
        ({"lattice": 1, "max_error": 0.1}, "lattice: expected True or None. Got 1"),
        ({"lattice": "yes", "max_error": 0.1}, "lattice: expected True or None. Got 'yes'"),
    ],
)
def test_bad_lattice_setting(kw, match):
    with pytest.raises(DctDataError, match=match):
        CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1.0], side="range_mid", **kw)


def test_side_values_without_the_lattice_rows_are_refused():
    _, spec, (q, side) = _wire()
    with pytest.raises(DctDataError, match=r"side: expected shape \(\.\.\., \d+, 2\) \(C=2 \+ 1 \+ \d+ correction rows "
                       r"\+ C lattice rows\)"):  # fmt: skip
        Decompress(spec, normalize=False)((q, side[:, :-2]))


def test_forward_deferred_queues_the_lattice_check():
    """`forward_deferred` queues the lattice rows' check beside the corrections' (nothing read back); it names
    the sample by its index in the pack, and well-formed rows decode like `forward`."""
    _, spec, (q, side) = _wire()
    layer = Decompress(spec, normalize=False)
    y, checks = layer.forward_deferred((q, side), indices=(7, 8, 9, 10))
    assert len(checks) == 2 and all(check() is None for check in checks) and torch.equal(y, layer((q, side)))
    bad = side.clone()
    bad[1, -2, 0] = -1.0
    _, checks = layer.forward_deferred((q, bad), indices=(7, 8, 9, 10))
    assert checks[0]() is None  # the corrections are well formed
    with pytest.raises(IntegrityError, match=r"coeffs: sample 8: lattice: expected finite rows with a step >= 0"):
        checks[1]()


def test_snap_writes_into_out():
    """`forward(..., out=buf)` returns buf holding the snapped values (a reused output buffer gets them too)."""
    _, spec, wire = _wire()
    layer = Decompress(spec, normalize=False)
    buf = torch.empty(4, *spec.sample_shape)
    assert layer(wire, out=buf) is buf and torch.equal(buf, layer(wire))
    assert not torch.equal(buf, Decompress(spec.replace(lattice=None), normalize=False)((wire[0], wire[1][:, :-2])))


def test_volumes_on_a_lattice_snap_too():
    """A volume field (C, D, H, W) of counts over a dose gets a lattice from calibration and decodes within its
    bound, on its grid points, in the layer and the reference decoder."""
    rng = np.random.default_rng(11)
    x = torch.from_numpy((rng.poisson(30, (3, 1, 16, 16, 16)) / rng.uniform(5, 50, (3, 1, 1, 1, 1))).astype(np.float32))
    spec = calibrate_report(x, quant=None, max_rel_error=1e-4, codec=ZSTD).spec
    assert spec.depth == 16 and spec.lattice is True
    wire, _ = encode(x, spec)
    bound = 1e-4 * (x.amax((2, 3, 4)) - x.amin((2, 3, 4))).double()
    for y in (Decompress(spec, normalize=False)(wire), decode_reference(wire, spec)):
        err = (y.double() - x.double()).abs().amax((2, 3, 4))
        assert bool((err <= bound).all()) and float((err / x.double().abs().amax((2, 3, 4))).max()) < 1e-6


@pytest.mark.slow
def test_a_psnr_target_with_a_bound_costs_nothing_more_on_a_lattice(tmp_path):
    """A target beside the bound: the snapped decode is the grid points, far above any floor, so the pack is
    no larger than the bound's alone (the floor is checked on the snapped decode, not kept by re-coding the
    unsnapped one finer), and both hold."""
    x = counts(np.random.default_rng(9), 6, 2, 32, 32)
    sizes = {}
    for name, kw in {"bound": {}, "both": {"target_psnr": 70}}.items():
        out = tmp_path / name
        dctdata.pack(x, out, max_rel_error=1e-3, quiet=True, **kw)
        spec = read_manifest(out).fields[0].codec
        assert spec.lattice is True and (spec.min_psnr is not None) == (name == "both")
        ds = dctdata.open_dataset(out, as_dict=True)
        layer = ds.decompressor("image", normalize=False)
        y = torch.stack([layer(tuple(t[None] for t in ds[i]["image"]))[0] for i in range(len(ds))])
        check_bound(torch.from_numpy(x), y, spec)
        mse = (y.double() - torch.from_numpy(x).double()).square().mean((-1, -2))
        rng = torch.from_numpy(x).double().amax((-1, -2)) - torch.from_numpy(x).double().amin((-1, -2))
        assert bool((10 * torch.log10(rng.square() / mse.clamp(min=1e-300)) >= 70).all())
        sizes[name] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert sizes["both"] < 1.05 * sizes["bound"], sizes


def test_integers_below_the_float32_margin_decode_exactly(tmp_path):
    """A near-flat 8-bit channel (values 251..255) at 1e-4 of its range: the bound (0.0004) is below the
    float32 margin of values near 255 (0.000486), which no decode can keep, but the grid points are the
    values themselves, so the snapped decode is exact and the pack holds the bound. The same channel off
    the grid still fails with the float32 message, and writes nothing."""
    rng = np.random.default_rng(3)
    flat = rng.integers(251, 256, (3, 1, 24, 24)).astype(np.float32)
    photo = rng.integers(0, 256, (3, 1, 24, 24)).astype(np.float32)
    x = np.concatenate([photo, flat], 1)
    bound, margin, _ = _bounds(torch.from_numpy(x), 1e-4)
    assert bool((bound[:, 1] < margin[:, 1]).all())  # the case: no decode can keep bound less margin
    rows, _ = lattice.detect(torch.from_numpy(x), None, bound, margin)
    assert rows[:, 1, 0].tolist() == [1.0] * 3 and rows[:, 1, 1].tolist() == flat.reshape(3, -1).min(1).tolist()
    quick_pack(x, tmp_path / "p", max_rel_error=1e-4, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "p", as_dict=True)
    layer = ds.decompressor("image")
    y = np.stack([layer(tuple(t[None] for t in ds[i]["image"]))[0].numpy() for i in range(len(ds))])
    np.testing.assert_array_equal(y, x)
    off = x.copy()
    off[:, 1] += rng.uniform(-1e-3, 1e-3, off[:, 1].shape).astype(np.float32)  # no longer on a grid
    with pytest.raises(DctDataError, match=r"less a float32 margin .*below float32's precision"):
        quick_pack(off, tmp_path / "off", max_rel_error=1e-4, quiet=True)
    assert not (tmp_path / "off").exists()


def test_grid_points_are_checked_as_a_fused_multiply_add_too():
    """Values that the snap's float32 multiply-then-add reproduces exactly, but that one fused multiply-add
    (what a compiler may emit for it) misses by a float32 step on about a third of the grid points: with a
    bound tighter than that step, the grid is refused, so no device's snap can miss the bound."""
    step, origin = np.float32(0.1), np.float32(0.3)
    k = np.arange(0, 1000, dtype=np.float64)
    v = torch.from_numpy((k.astype(np.float32) * step + origin).astype(np.float32))
    s, o = torch.tensor(step), torch.tensor(origin)
    assert torch.equal(torch.round((v - o) / s) * s + o, v)  # multiply then add: exact
    fused = (k * np.float64(step) + np.float64(origin)).astype(np.float32)
    assert (fused != v.numpy()).mean() > 0.2  # fused: off the values on many points
    ulp = float(np.spacing(np.float32(100.0)))
    assert lattice._grid(v, bound=ulp / 4, margin=0.0) is None
    found = lattice._grid(v, bound=0.01, margin=0.0)
    assert found is not None and found[:2] == (float(step), float(origin))
