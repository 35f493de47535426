"""Sparse corrections of bounded fields (issue 32, `dctdata.decoder.corrections`): coarser steps per sample plus a
correction list keep the bound on every value, store less than re-coding alone, decode the same through
torch, torch.export, ONNX Runtime and CUDA, and hostile correction rows fail clearly, never writing
outside the sample."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from pack_checks import ZSTD
from test_bounds import (
    KINDS,
    check_bound,
    cuda_decode_meets_the_bound,
    onnx_decode_meets_the_bound,
    smooth,
    spiky,
)

import dctdata
from dctdata.codec.spec import CodecSpec
from dctdata.decoder import corrections
from dctdata.decoder.corrections import EXACT, apply, check, stage_sizer, stored_bytes
from dctdata.decoder.layer import Decompress
from dctdata.encoder.bounds import MARGIN_REL, BoundError
from dctdata.encoder.calibrate import calibrate_report
from dctdata.encoder.quantize import coded_coefficients, decode_reference, encode
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import FieldSpec, read_manifest
from dctdata.format.fields import side_field
from dctdata.format.webdataset.layout import packed_side, unpacked_side


def _spec(x, valid=None, **bounds) -> CodecSpec:
    """A bounded spec for `x`, its stored size weighed after zstd (pack_checks.ZSTD): the default stage "auto"
    fits the context coder at every step tried, most of a calibration's time, and the corrections hold the
    bound whatever the lossless stage."""
    spec = calibrate_report(x, quant=None, valid=valid, codec=ZSTD, **bounds).spec
    assert spec.corrections == corrections.capacity(x[0].numel())  # bounded packs store corrections
    return spec


@pytest.fixture
def plain_rounding(monkeypatch):
    """Nearest-level rounding only (`dctdata.encoder.bound_rounding` off): rounding within the bound holds most values
    the corrections would, so tests of how corrections are stored and decoded turn it off to get some."""
    monkeypatch.setattr("dctdata.encoder.bound_rounding.can_round", lambda spec: False)


def _counts(spec: CodecSpec, side: torch.Tensor) -> torch.Tensor:
    return side[:, spec.channels, 1]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bound_holds_on_every_value_after_corrections(kind, seed):
    """Property: random fields of every kind, some NaN-masked, one or three channels, relative or absolute
    bounds: every valid decoded value is within the bound, in the layer and the reference decoder."""
    rng = np.random.default_rng(100 + seed)
    c = 1 + 2 * (seed % 2)
    x = torch.from_numpy(KINDS[kind](rng, 5, c, 24, 32).astype(np.float32))
    valid = torch.from_numpy(rng.random(x.shape) > 0.15) if seed == 2 else None
    if valid is not None:
        x = x.masked_fill(~valid, 0.0)
    bound = {"max_rel_error": [1e-2, 1e-3, 1e-4][seed]} if kind != "integer" else {"max_error": 0.5}
    spec = _spec(x, valid, **bound)
    wire, _ = encode(x, spec, valid=valid)
    y = Decompress(spec, normalize=False)(wire)
    check_bound(x, y, spec, valid)
    check_bound(x, decode_reference(wire, spec).float(), spec, valid)
    scale = x.double().abs().amax((-1, -2))
    drift = (decode_reference(wire, spec) - y.double()).abs().amax((-1, -2)) / scale
    assert float(drift.max()) < MARGIN_REL


def test_bound_holds_with_corrections_and_a_channel_rotation():
    rng = np.random.default_rng(7)
    base = smooth(rng, 4, 1, 24, 24)
    x = torch.from_numpy(np.concatenate([base, base * 0.9 + smooth(rng, 4, 1, 24, 24) * 0.1], 1).astype(np.float32))
    x[1, 0, 5, 7] += 400.0  # an outlier the corrections take
    r = 2**-0.5
    spec = _spec(x, max_rel_error=1e-3).replace(rotation=[[r, r], [r, -r]])
    (q, side), _ = encode(x, spec)
    check_bound(x, Decompress(spec, normalize=False)((q, side)), spec)


def test_spiky_samples_use_corrections_and_store_less():
    """A spike forces its whole item to a fine step when re-coding alone keeps the bound; the encoder keeps a
    coarse step (larger stored ranges) and holds the values around the spike by its rounding choices and
    corrections: fewer bytes, same guarantee."""
    x = torch.from_numpy(spiky(np.random.default_rng(11), 6, 1, 32, 32).astype(np.float32))
    spec = _spec(x, max_rel_error=1e-3)
    size = stage_sizer({"id": "zstd", "level": 9}, spec)
    (q, side), _ = encode(x, spec, size_of=size)
    (q0, side0), _ = encode(x, spec.replace(corrections=None), size_of=size)
    assert side.shape == (6, 1 + 1 + spec.corrections, 2) and side0.shape == (6, 1, 2)
    assert int((side[:, 0, 0] > 1.2 * side0[:, 0, 0]).sum()) >= 3
    with_fix = sum(size(q[j]) + stored_bytes(side[j, 1:]) for j in range(6))
    assert with_fix < sum(size(q0[j]) for j in range(6))
    check_bound(x, Decompress(spec, normalize=False)((q, side)), spec)


@pytest.mark.usefixtures("plain_rounding")
def test_a_constant_channel_does_not_stop_the_others_corrections():
    """A constant item (range 0, so a relative bound of 0) decodes exactly; the step of the sample's
    corrections comes from the items that have room."""
    x = torch.from_numpy(spiky(np.random.default_rng(16), 4, 2, 32, 32).astype(np.float32))
    x[:, 1] = 7.0
    x[:, 0, 9, 9] += 300.0
    spec = _spec(x, max_rel_error=1e-3)
    (q, side), _ = encode(x, spec)
    assert int((_counts(spec, side) > 0).sum()) > 0
    y = Decompress(spec, normalize=False)((q, side))
    check_bound(x, y, spec)
    assert bool((y[:, 1] == 7.0).all())


@pytest.mark.usefixtures("plain_rounding")
def test_corrections_apply_after_normalization():
    """With the spec's mean/std, a correction is scaled like the value it corrects."""
    _, spec, wire = _wire()
    spec = spec.replace(mean=[1.0, -2.0], std=[3.0, 0.5])  # the encoder does not use them: the same wire
    plain = Decompress(spec, normalize=False)(wire).double()
    normed = Decompress(spec)(wire).double()
    mean = torch.tensor([1.0, -2.0], dtype=torch.float64).reshape(2, 1, 1)
    std = torch.tensor([3.0, 0.5], dtype=torch.float64).reshape(2, 1, 1)
    top = float(normed.abs().max())
    assert float((normed - (plain - mean) / std).abs().max()) < 1e-5 * top
    assert float((decode_reference(wire, spec) - normed).abs().max()) < 1e-5 * top


def test_a_version_5_spec_without_corrections_still_reads():
    """Corrections are optional within version 5: a bounded spec without them keeps (C, 2) side values."""
    spec = CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid", max_error=0.5)
    d = FieldSpec("image", "dct", (1, 16, 16), "float32", spec, {"id": "zstd", "level": 9}).to_dict()
    f = FieldSpec.from_dict(d, version=5)
    assert f.codec.corrections is None and side_field(f).shape == (1, 2)
    x = torch.from_numpy(smooth(np.random.default_rng(13), 2, 1, 16, 16).astype(np.float32))
    wire, _ = encode(x, spec)
    assert wire[1].shape == (2, 1, 2)
    check_bound(x, Decompress(spec, normalize=False)(wire), spec)
    withfix = spec.replace(corrections=16).to_dict()
    assert withfix["corrections"] == 16 and CodecSpec.from_dict(withfix).side_rows == 1 + 1 + 16


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"corrections": 0}, r"corrections: expected a positive int"),
        ({"corrections": 1 << 23}, r"corrections: expected a positive int \(at most 4194304 rows\)"),
        ({"corrections": 4, "max_error": None}, r"corrections: expected max_error or max_rel_error with them"),
    ],
)
def test_bad_corrections_setting(kw, match):
    base = dict(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid", max_error=0.5)
    with pytest.raises(DctDataError, match=match):
        CodecSpec(**{**base, **kw})


def test_side_values_of_the_wrong_row_count_are_refused():
    spec = CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid", max_error=0.5,
                     corrections=4)  # fmt: skip
    q = torch.zeros(1, *spec.coeff_shape, dtype=torch.int16)
    with pytest.raises(DctDataError, match=r"side: expected shape \(\.\.\., 6, 2\) \(C=1 \+ 1 \+ 4 correction rows\)"):
        Decompress(spec)((q, torch.zeros(1, 1, 2)))


def test_checking_rows_against_a_spec_without_corrections_is_refused():
    spec = CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid", max_error=0.5)
    with pytest.raises(DctDataError, match=r"coeffs: corrections: expected a spec with a correction capacity"):
        check(torch.zeros(1, 5, 2), spec, where="coeffs")


# Hostile correction rows ------------------------------------------------------------------------------
SPEC = CodecSpec(cf=8, height=8, width=8, channels=2, dtype="int16", steps=[1e-3, 1e-3], side="range_mid",
                 max_error=0.5, corrections=4)  # fmt: skip


def _rows(count=2, step=0.25, gaps=(3, 5), ks=(1, -2)) -> torch.Tensor:
    fix = torch.zeros(1 + SPEC.corrections, 2)
    fix[0] = torch.tensor([step, count])
    fix[1 : 1 + len(gaps), 0] = torch.tensor(gaps, dtype=torch.float32)
    fix[1 : 1 + len(ks), 1] = torch.tensor(ks, dtype=torch.float32)
    return fix


HOSTILE = {
    "count past the cap": (_rows(count=5), r"count outside \[0, cap\]"),
    "negative count": (_rows(count=-1), r"count outside \[0, cap\]"),
    "fractional count": (_rows(count=1.5), r"count outside \[0, cap\] or fractional"),
    "zero step": (_rows(step=0.0), r"a correction step that is not positive"),
    "negative gap": (_rows(gaps=(3, -1)), r"a gap that is negative, huge or fractional"),
    "huge gap": (_rows(gaps=(EXACT, 0)), r"a gap that is negative, huge or fractional"),
    "fractional k": (_rows(ks=(0.5, 1)), r"a correction that is huge or fractional"),
    "huge k": (_rows(ks=(2 * EXACT, 1)), r"a correction that is huge or fractional"),
    "index past the sample": (_rows(gaps=(100, 28)), r"an index past the sample's 128 values"),
    "padding not zero": (_rows(count=1), r"rows past the count that are not zero"),
    "NaN": (_rows(step=float("nan")), r"non-finite values"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_rows_are_named(name):
    bad, match = HOSTILE[name]
    fix = torch.stack([_rows(), bad])
    check(fix[:1], SPEC)  # the good sample passes
    with pytest.raises(
        IntegrityError, match=r"field 'x': sample 41: corrections: expected well-formed rows. Got " + match
    ):
        check(fix, SPEC, indices=[40, 41], where="field 'x'")
    q = torch.zeros(2, *SPEC.coeff_shape, dtype=torch.int16)
    side = torch.cat([torch.tensor([[1.0, 0.0], [1.0, 0.0]]).expand(2, 2, 2), fix], 1)
    with pytest.raises(IntegrityError, match=r"coeffs: sample 1 of the batch: corrections: .*" + match):
        Decompress(SPEC)((q, side))


def test_fuzzed_rows_either_raise_or_stay_inside_the_sample():
    """Random rows (many invalid): `check` raises IntegrityError or passes; `apply` (what an exported graph
    runs unchecked) never writes outside the sample, whatever the rows."""
    gen = torch.Generator().manual_seed(0)
    n = 2 * 8 * 8
    for _ in range(300):
        fix = torch.randint(-3, 70, (3, 1 + SPEC.corrections, 2), generator=gen).float()
        fix[:, 0, 1] = torch.randint(-1, 6, (3,), generator=gen).float()
        if bool(torch.rand(1, generator=gen) < 0.2):
            fix.view(-1)[torch.randint(0, fix.numel(), (1,), generator=gen)] = float("inf")
        try:
            check(fix, SPEC)
        except IntegrityError as exc:
            assert "corrections: expected well-formed rows" in str(exc)
        guard = torch.zeros(3, n + 16)  # the sample, then 16 values no correction may reach
        img = guard[:, :n].view(3, 2, 8, 8)
        apply(img, torch.nan_to_num(fix, posinf=1.0))
        assert bool((guard[:, n:] == 0).all())


def test_apply_adds_k_times_step_at_the_running_index():
    img = torch.zeros(1, 2, 8, 8)
    apply(img, _rows()[None], scale=torch.tensor([1.0, 4.0]))
    flat = img.flatten()
    assert float(flat[3]) == 0.25 and float(flat[8]) == -0.5 and int((flat != 0).sum()) == 2
    img = torch.zeros(1, 2, 8, 8)
    apply(img, _rows(gaps=(70, 1))[None], scale=torch.tensor([1.0, 4.0]))  # channel 1: scaled by 4
    assert float(img[0, 1, 0, 6]) == 1.0 and float(img[0, 1, 0, 7]) == -2.0


# The entropy coder's members keep side values with corrections packed ---------------------------------
def test_packed_side_round_trip_and_hostile_lengths():
    side = np.arange(12, dtype="<f4").tobytes()
    raw = packed_side(side) + b"stream"
    got, rest = unpacked_side(raw, len(side), "shard s: sample 3")
    assert got == side and bytes(rest) == b"stream"
    with pytest.raises(IntegrityError, match=r"shard s: sample 3: expected a 4-byte length"):
        unpacked_side(b"\x01", len(side), "shard s: sample 3")
    with pytest.raises(IntegrityError, match=r"sample 3: expected 4000000000 bytes of packed side values"):
        unpacked_side((4_000_000_000).to_bytes(4, "little") + raw[4:], len(side), "shard s: sample 3")
    with pytest.raises(IntegrityError, match=r"sample 3: expected a stream of at most 8 decoded bytes"):
        unpacked_side(raw, 8, "shard s: sample 3")


@pytest.mark.parametrize(
    "fmt, lossless", [("zarr", "auto"), ("webdataset", "auto"), ("webdataset", {"id": "zstd", "level": 3})]
)
@pytest.mark.usefixtures("plain_rounding")
def test_pack_with_corrections_reads_back_within_bound(tmp_path, fmt, lossless):
    x = spiky(np.random.default_rng(14), 8, 2, 24, 32).astype(np.float32)
    out = tmp_path / "p"
    dctdata.pack(x, out, format=fmt, max_rel_error=1e-3, lossless=lossless, quiet=True)
    m = read_manifest(out)
    spec = m.fields[0].codec
    assert m.version >= 5 and spec.corrections is not None
    ds = dctdata.open_dataset(out, as_dict=True, **({"shuffle": False} if fmt == "webdataset" else {}))
    items = [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)
    q = torch.stack([it["image"][0] for it in items])
    side = torch.stack([it["image"][1] for it in items])
    assert side.shape == (8, spec.side_rows, 2) and int((_counts(spec, side) > 0).sum()) > 0
    check_bound(torch.from_numpy(x), ds.decompressor("image", normalize=False)((q, side)), spec)
    # decode="device": the stored bytes cross, the layer decodes them, corrections included, to the same values
    dev = dctdata.open_dataset(
        out, as_dict=True, decode="device", **({"shuffle": False} if fmt == "webdataset" else {})
    )
    from dctdata.decoder.wire import collate

    stored = collate([dev[i]["image"] for i in range(len(dev))] if fmt == "zarr" else [it["image"] for it in dev])
    layer = dev.decompressor("image", normalize=False)
    assert torch.equal(layer(stored), layer((q, side)))
    if stored.side is not None:  # side values read by the worker: a bad row is named by its sample in the pack
        bad = stored.side.clone()
        bad[3, spec.channels, 1] = spec.corrections + 1
        with pytest.raises(IntegrityError, match=rf"sample {stored.indices[3]}: corrections: .* count outside"):
            layer(stored.with_side(bad))
    from dctdata.cli import main

    assert main(["verify", str(out)]) == 0


# Portable decode: torch.export, ONNX Runtime, CUDA ------------------------------------------------------
def _wire():
    """Spiky samples, their spec and wire (calibrated once for the module, under plain_rounding as every caller
    is), fresh tensors for each test."""
    x, spec, (q, side) = _calibrated_wire()
    return x.clone(), spec, (q.clone(), side.clone())


@functools.cache
def _calibrated_wire():
    x = torch.from_numpy(spiky(np.random.default_rng(15), 4, 2, 24, 32).astype(np.float32))
    spec = _spec(x, max_rel_error=1e-3)
    wire, _ = encode(x, spec)
    assert int((_counts(spec, wire[1]) > 0).sum()) > 0
    return x, spec, wire


@pytest.mark.usefixtures("plain_rounding")
def test_torch_export_applies_the_corrections():
    x, spec, (q, side) = _wire()
    layer = Decompress(spec, normalize=False).eval()
    program = torch.export.export(layer, ((q, side),))
    y = program.module()((q, side))
    check_bound(x, y, spec)
    scale = x.double().abs().amax((-1, -2))
    assert float(((y.double() - layer((q, side)).double()).abs().amax((-1, -2)) / scale).max()) < MARGIN_REL


@pytest.mark.usefixtures("plain_rounding")
def test_onnx_runtime_applies_the_corrections(tmp_path):
    """Exported to ONNX (the correction scatter becomes a ScatterElements/ScatterND with add) and run in ONNX
    Runtime on the CPU, the decode equals the eager CPU decode within the float32 margin and holds the bound."""
    x, spec, (q, side) = _wire()
    ops = onnx_decode_meets_the_bound(x, spec, q, side, tmp_path / "corrected.onnx")
    assert ops & {"ScatterElements", "ScatterND"}, ops


@pytest.mark.cuda
@pytest.mark.usefixtures("plain_rounding")
def test_cuda_applies_the_corrections_like_the_cpu():
    """On CUDA (fused Triton kernel, then the scatter) the corrected decode differs from the CPU's by less than
    the float32 margin and holds the bound; hostile rows are refused there too."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, spec, (q, side) = _wire()
    layer = cuda_decode_meets_the_bound(x, spec, q, side)
    bad = side.clone()
    bad[0, spec.channels + 1, 0] = 1e6  # an index far past the sample
    bad[0, spec.channels, 1] = max(1.0, float(bad[0, spec.channels, 1]))
    with pytest.raises(IntegrityError, match=r"sample 0 of the batch: corrections"):
        layer((q.cuda(), bad.cuda()))


def _at_the_int16_limit(rel_per_step: float) -> tuple[torch.Tensor, CodecSpec]:
    """Two smooth samples and a spec whose step puts their largest coefficient at int16's limit (no finer
    step can code them), bounded at rel_per_step x that step."""
    x = torch.from_numpy(smooth(np.random.default_rng(7), 2, 1, 64, 64).astype(np.float32))
    probe = CodecSpec(cf=8, mask="square", dtype="int16", steps=[1.0], side="range_mid", height=64, width=64)
    coeffs, _ = coded_coefficients(x, probe)
    step = float(coeffs.abs().max()) / 32700
    r = rel_per_step * step
    return x, probe.replace(steps=[step], max_rel_error=r, bound_ref=r)


@pytest.mark.parametrize("rounding", [True, False])
def test_corrections_hold_items_that_re_coding_cannot(rounding, request):
    """An item whose finer re-code would overflow int16 (seen on 256^2 clouds at 1e-4): re-coding alone
    raises, corrections (and rounding within the bound, when on) hold it."""
    if not rounding:
        request.getfixturevalue("plain_rounding")
    x, spec = _at_the_int16_limit(0.75)
    with pytest.raises(BoundError, match="finer steps overflow the integer dtype"):
        encode(x, spec)
    spec = spec.replace(corrections=corrections.capacity(x[0].numel()))
    wire, over = encode(x, spec)
    assert over == 0 and (rounding or bool((_counts(spec, wire[1]) > 0).all()))
    check_bound(x, Decompress(spec, normalize=False)(wire), spec)
    check_bound(x, decode_reference(wire, spec).float(), spec)


def test_an_item_neither_re_coding_nor_corrections_hold_is_named():
    x, spec = _at_the_int16_limit(0.3)  # more misses than the correction rows hold
    with pytest.raises(BoundError, match=r"Got [0-9.]+ in channel 0 \(finer steps overflow the integer dtype"):
        encode(x, spec.replace(corrections=corrections.capacity(x[0].numel())))


@pytest.mark.usefixtures("plain_rounding")
def test_forward_deferred_checks_the_rows_when_asked():
    """`forward_deferred` queues the rows' check instead of reading it back (a CUDA batch does not wait);
    the check names the sample by its index in the pack, and well-formed rows decode like `forward`."""
    _, spec, (q, side) = _wire()
    layer = Decompress(spec, normalize=False)
    y, checks = layer.forward_deferred((q, side), indices=(7, 8, 9, 10))
    assert len(checks) == 1 and checks[0]() is None and torch.equal(y, layer((q, side)))
    bad = side.clone()
    bad[1, spec.channels :] = 0.0
    bad[1, spec.channels, :] = torch.tensor([0.5, 1.0])  # one correction ...
    bad[1, spec.channels + 1, :] = torch.tensor([1e6, 3.0])  # ... at an index far past the sample
    y, checks = layer.forward_deferred((q, bad), indices=(7, 8, 9, 10))  # clamped into the sample meanwhile
    assert y.shape == (4, *spec.sample_shape) and bool(torch.isfinite(y).all())
    with pytest.raises(IntegrityError, match=r"coeffs: sample 8: corrections: .* an index past the sample"):
        checks[0]()
    with pytest.raises(IntegrityError, match=r"coeffs: sample 1 of the batch: corrections: .* an index past"):
        layer((q, bad))
