"""Pointwise error bounds (issue 32): `max_error` / `max_rel_error` hold on every value of every sample,
through calibration, the encoder, both storages and the readers; bounds that cannot hold fail clearly."""

from __future__ import annotations

import json
import math
import re
import zlib

import numpy as np
import pytest
import torch
from pack_checks import ZSTD, quick_pack

import dctdata
from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress
from dctdata.encoder.bounds import MARGIN_REL, BoundError
from dctdata.encoder.calibrate import calibrate_report
from dctdata.encoder.quantize import encode
from dctdata.errors import DctDataError, FormatError
from dctdata.format import FieldSpec, read_manifest
from dctdata.settings import PackSettings


# Synthetic SciML-like fields ---------------------------------------------------------------------
def smooth(rng, n, c, h, w):
    return np.cumsum(np.cumsum(rng.standard_normal((n, c, h, w)), -1), -2)


def turbulent(rng, n, c, h, w):
    """Gaussian random fields with a k^-5/3 energy spectrum (2-D turbulence-like)."""
    ky, kx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    k = np.sqrt(kx**2 + ky**2)
    amp = np.where(k > 0, k, np.inf) ** (-11 / 6)
    noise = rng.standard_normal((n, c, h, w // 2 + 1)) + 1j * rng.standard_normal((n, c, h, w // 2 + 1))
    return np.fft.irfft2(noise * amp, s=(h, w))


def spiky(rng, n, c, h, w):
    """Smooth fields with isolated outliers of 50x the field's spread."""
    x = smooth(rng, n, c, h, w)
    for i in range(n):
        for _ in range(3):
            x[i, rng.integers(c), rng.integers(h), rng.integers(w)] += 50 * x[i].std() * rng.choice([-1, 1])
    return x


def integer(rng, n, c, h, w):
    """16-bit counts (detector frames): large offset, integer values."""
    return np.round(2000 + 300 * smooth(rng, n, c, h, w) / 10 + rng.poisson(30, (n, c, h, w))).astype(np.int16)


KINDS = {"smooth": smooth, "turbulent": turbulent, "spiky": spiky, "integer": integer}


def decoded(spec: CodecSpec, x: torch.Tensor, valid=None) -> torch.Tensor:
    wire, _ = encode(x, spec, valid=valid)
    return Decompress(spec, normalize=False)(wire)


def check_bound(x: torch.Tensor, y: torch.Tensor, spec: CodecSpec, valid=None) -> float:
    """Assert the bound on every (valid) value; return the largest error over the bound."""
    xd = x.double()
    err = (y.double() - xd).abs()
    lo = xd.masked_fill(~valid, math.inf) if valid is not None else xd
    hi = xd.masked_fill(~valid, -math.inf) if valid is not None else xd
    rng = (hi.amax((-1, -2)) - lo.amin((-1, -2))).clamp(min=0)
    bound = torch.full_like(rng, math.inf)
    if spec.max_error is not None:
        bound = bound.clamp(max=spec.max_error)
    if spec.max_rel_error is not None:
        bound = torch.minimum(bound, spec.max_rel_error * rng)
    if valid is not None:
        err = err.masked_fill(~valid, 0)
    worst = err.amax((-1, -2))
    assert bool((worst <= bound).all()), f"bound missed: {(worst - bound).max()}"
    return float((worst / bound.clamp(min=1e-300)).max())


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("bound", [{"max_rel_error": 1e-2}, {"max_rel_error": 1e-4}, {"max_error": "abs"}])
def test_bound_holds_on_every_value(kind, bound):
    rng = np.random.default_rng(zlib.crc32(f"{kind} {bound}".encode()))  # str hashes change per process
    x = torch.from_numpy(KINDS[kind](rng, 6, 2, 20, 28).astype(np.float32))
    if bound.get("max_error") == "abs":  # 1e-3 of the median item range, in the field's units
        bound = {"max_error": float(np.median(x.amax((2, 3)) - x.amin((2, 3)))) * 1e-3}
    spec = calibrate_report(x[:4], quant=None, codec=ZSTD, **bound).spec
    assert spec.bounded and spec.dtype in ("int8", "int16")
    ratio = check_bound(x, decoded(spec, x), spec)  # samples 4, 5 were not seen by calibration
    if spec.lattice:  # integer counts under a bound below half a count: snapped back exactly (dctdata.codec.lattice)
        assert kind == "integer" and ratio == 0
    else:
        assert ratio > 0.3  # the bound is used, not met by a needlessly fine step


def test_bound_holds_with_nan_mask_and_channels():
    rng = np.random.default_rng(1)
    x = torch.from_numpy(spiky(rng, 5, 3, 24, 24).astype(np.float32))
    valid = torch.from_numpy(rng.random(x.shape) > 0.2)
    x = x.masked_fill(~valid, 0.0)  # the masked values count nowhere
    spec = calibrate_report(x, quant=None, valid=valid, max_rel_error=1e-3, codec=ZSTD).spec
    check_bound(x, decoded(spec, x, valid), spec, valid)


def test_bound_and_target_both_hold():
    rng = np.random.default_rng(2)
    x = torch.from_numpy(spiky(rng, 6, 1, 32, 32).astype(np.float32))
    report = calibrate_report(x, quant=None, target_psnr=45, max_rel_error=5e-3, codec=ZSTD)
    check_bound(x, decoded(report.spec, x), report.spec)
    assert report.dataset_psnr >= 45 and report.spec.min_psnr is not None


@pytest.mark.slow
def test_pack_both_storages_reads_back_within_bound(tmp_path):
    rng = np.random.default_rng(3)
    x = turbulent(rng, 12, 2, 24, 40).astype(np.float32)
    for fmt in ("zarr", "webdataset"):
        out = tmp_path / f"b-{fmt}"
        dctdata.pack(x, out, format=fmt, max_error=0.01, quiet=True)
        m = read_manifest(out)
        codec = m.fields[0].codec
        assert m.version >= 5 and codec.max_error == 0.01 and m.pack["max_error"] == 0.01
        assert max(ch.max_abs_error for ch in m.stats["image"].channels) <= 0.01
        ds = dctdata.open_dataset(out, as_dict=True, **({"shuffle": False} if fmt == "webdataset" else {}))
        layer = ds.decompressor("image")
        items = [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)
        assert len(items) == len(x)
        for i, (q, side) in enumerate(item["image"] for item in items):
            y = layer((q[None], side[None]))[0]
            assert float((y - torch.from_numpy(x[i])).abs().max()) <= 0.01


def test_writer_and_cli_flags(tmp_path):
    rng = np.random.default_rng(4)
    x = smooth(rng, 8, 1, 16, 16).astype(np.float32)
    with dctdata.Writer(tmp_path / "w", max_rel_error="image=1e-3", lossless=ZSTD, quiet=True) as w:
        for s in x:
            w.write(s)
    spec = read_manifest(tmp_path / "w").fields[0].codec
    assert spec.max_rel_error == 1e-3 and spec.max_error is None
    ys = Decompress(spec, normalize=False)
    ds = dctdata.open_dataset(tmp_path / "w", as_dict=True)
    for i in range(len(ds)):
        q, side = ds[i]["image"]
        rng_i = float(x[i].max() - x[i].min())
        assert float((ys((q[None], side[None]))[0] - torch.from_numpy(x[i])).abs().max()) <= 1e-3 * rng_i
    np.save(tmp_path / "x.npy", x)
    from dctdata.cli import main

    assert (
        main(
            [
                "pack",
                str(tmp_path / "x.npy"),
                str(tmp_path / "c"),
                "--max-error",
                "0.02",
                "--lossless",
                "zstd:1",
                "--quiet",
            ]
        )
        == 0
    )
    assert read_manifest(tmp_path / "c").fields[0].codec.max_error == 0.02


def test_unmeetable_bound_errors_and_writes_nothing(tmp_path):
    x = (1e4 + smooth(np.random.default_rng(5), 4, 1, 16, 16)).astype(np.float32)
    out = tmp_path / "tight"
    with pytest.raises(DctDataError, match=r"expected \|decoded - x\| <= 1e-06 .*below float32's precision"):
        quick_pack(x, out, max_error=1e-6, quiet=True)
    assert not out.exists()


def test_unseen_sample_that_cannot_hold_is_named(tmp_path):
    rng = np.random.default_rng(6)
    x = smooth(rng, 40, 1, 16, 16).astype(np.float32)
    cal = x[:4].copy()
    x[30] *= 1e4  # far beyond what the calibration set's steps and int8 floors can reach at this bound
    with pytest.raises(
        BoundError, match=r"sample 30.*field 'image'.*--max-error 1\b.*overflow int8: use --quant int16"
    ):
        quick_pack(x, tmp_path / "o", max_error=1.0, quant="int8", calibration=cal, quiet=True)
    assert not (tmp_path / "o").exists()


def test_margin_covers_float32_decode():
    """The margin (2^-19 of an item's largest magnitude) against the float64 reference decode: the CPU
    float32 decoders stay far inside it (the measurement the margin's size rests on)."""
    from dctdata.encoder.quantize import decode_reference

    rng = np.random.default_rng(7)
    x = torch.from_numpy((300 + 50 * turbulent(rng, 6, 2, 32, 32)).astype(np.float32))
    spec = calibrate_report(x, quant=None, max_rel_error=1e-3, codec=ZSTD).spec
    wire, _ = encode(x, spec)
    exact = decode_reference(wire, spec)
    f32 = Decompress(spec, normalize=False)(wire).double()
    drift = ((f32 - exact).abs().amax((-1, -2)) / x.double().abs().amax((-1, -2))).max()
    assert float(drift) < MARGIN_REL / 4


# Bad values --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_error": -1}, r"--max-error: expected a positive number\. Got -1"),
        ({"max_error": "u=abc"}, r"--max-error: expected E or NAME=E\[,NAME=E\.\.\.\] \(e\.g\. temperature="),
        ({"max_rel_error": 2}, r"--max-rel-error: expected a number in \(0, 1\)\. Got 2"),
        ({"max_rel_error": "p=0"}, r"--max-rel-error p: expected a number in \(0, 1\)\. Got 0"),
        ({"max_error": math.inf}, r"--max-error: expected a positive number\. Got inf"),
    ],
)
def test_bad_bound_settings(kw, match):
    with pytest.raises(DctDataError, match=match):
        PackSettings(**kw)


def test_bad_bound_fields_and_quant(tmp_path):
    x = smooth(np.random.default_rng(8), 4, 1, 16, 16).astype(np.float32)
    src = {"image": x, "label": np.arange(4)}
    with pytest.raises(DctDataError, match=r"--max-error nope: expected one of the source's fields"):
        dctdata.pack(src, tmp_path / "a", max_error="nope=1", quiet=True)
    with pytest.raises(DctDataError, match=r"--max-rel-error label: expected a dct field\. Got kind"):
        dctdata.pack(src, tmp_path / "b", max_rel_error="label=0.1", quiet=True)
    assert not any((tmp_path / n).exists() for n in "ab")


BOUND_QUANT = r"max_error/max_rel_error: expected quant int8, int16 or unset \(the bound is kept by re-coding"


def test_a_bound_with_float_coefficients_is_one_error_from_every_entry(tmp_path, capsys):
    """The rule (integer coefficients under a bound) is checked in one place (`check_bound_dtype`): the CLI,
    `pack`, `Writer`, `PackSettings`, calibration and a CodecSpec all refuse with its one message, naming the
    setting as the caller spelled it."""
    from dctdata.cli import main

    x = smooth(np.random.default_rng(8), 4, 1, 16, 16).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "cli"), "--max-error", "0.1", "--quant", "fp16"]) == 1
    assert re.search(BOUND_QUANT + r".*Got quant 'fp16'", capsys.readouterr().err)
    with pytest.raises(DctDataError, match=BOUND_QUANT + r".*Got quant 'none'"):
        dctdata.pack(x, tmp_path / "py", max_rel_error="image=1e-3", quant="none", quiet=True)
    with pytest.raises(DctDataError, match=BOUND_QUANT + r".*Got quant 'bf16'"):
        dctdata.Writer(tmp_path / "w", max_error=0.1, quant="bf16")
    with pytest.raises(DctDataError, match=BOUND_QUANT + r".*Got quant 'fp16'"):
        PackSettings(max_error={"image": 0.1}, quant="fp16")
    with pytest.raises(DctDataError, match=BOUND_QUANT + r".*Got quant 'float16'"):
        calibrate_report(torch.from_numpy(x), quant="fp16", max_error=0.1)
    with pytest.raises(DctDataError, match=BOUND_QUANT + r".*Got quant 'float32'"):
        CodecSpec(cf=8, height=16, width=16, max_error=0.5)
    assert not any((tmp_path / n).exists() for n in ("cli", "py", "w"))
    assert PackSettings(max_error=0.1, quant="int16").quant == "int16"  # integer coefficients hold a bound


def test_codec_spec_bound_validation_and_round_trip():
    base = dict(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid")
    spec = CodecSpec(**base, max_error=0.5, max_rel_error=1e-3, bound_ref=1e-3)
    assert CodecSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec and spec.version == 2
    with pytest.raises(DctDataError, match=r"max_error/max_rel_error: expected side information \(side='range_mid'\)"):
        CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], max_error=0.5)
    with pytest.raises(DctDataError, match=r"bound_ref: expected max_error or max_rel_error with it"):
        CodecSpec(**base, bound_ref=1e-3)
    with pytest.raises(DctDataError, match=r"max_error: expected a finite number > 0"):
        CodecSpec(**base, max_error=0)


def test_manifest_version_gate(tmp_path):
    spec = CodecSpec(cf=8, height=16, width=16, dtype="int16", steps=[1e-3], side="range_mid", max_error=0.5)
    d = FieldSpec("image", "dct", (1, 16, 16), "float32", spec, {"id": "zstd", "level": 9}).to_dict()
    assert FieldSpec.from_dict(d, version=5).codec == spec
    with pytest.raises(FormatError, match=r"expected no max_error/max_rel_error in a version 4 manifest"):
        FieldSpec.from_dict(d, version=4)


def test_info_and_verify_report_the_bound(tmp_path, capsys):
    from dctdata.cli import main

    x = smooth(np.random.default_rng(9), 6, 2, 16, 16).astype(np.float32)
    quick_pack(x, tmp_path / "p", max_error=0.05, quiet=True)
    assert main(["info", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "--max-error 0.05" in out and "| image[1] |" in out
    assert f"up to {read_manifest(tmp_path / 'p').fields[0].codec.corrections} corrections/sample" in out
    assert main(["verify", str(tmp_path / "p")]) == 0
    d = json.loads((tmp_path / "p" / "manifest.json").read_text())
    d["stats"]["image"]["channels"][1]["max_abs_error"] = 0.07  # a pack whose record breaks its bound
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(d))
    assert main(["verify", str(tmp_path / "p")]) != 0
    assert "field 'image' channel 1: expected a largest error <= 0.05 (--max-error). Got 0.07 recorded" in (
        capsys.readouterr().out
    )


def _bounded_wire(seed: int = 10):
    x = torch.from_numpy(spiky(np.random.default_rng(seed), 4, 2, 24, 32).astype(np.float32))
    spec = calibrate_report(x, quant=None, max_rel_error=1e-3, codec=ZSTD).spec
    wire, _ = encode(x, spec)
    return x, spec, wire


def onnx_decode_meets_the_bound(x, spec, q, side, path) -> set[str]:
    """The layer exported to ONNX at `path` and run in ONNX Runtime (CPU): its decode holds the bound and equals
    the eager CPU decode within the float32 margin. Returns the exported graph's op types."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnx

    layer = Decompress(spec, normalize=False).eval()
    torch.onnx.export(layer, ((q, side),), str(path), input_names=["coeffs", "side"], dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"coeffs": q.numpy(), "side": side.numpy()})
    y = torch.from_numpy(out)
    check_bound(x, y, spec)
    scale = x.double().abs().amax((-1, -2))
    assert float(((y.double() - layer((q, side)).double()).abs().amax((-1, -2)) / scale).max()) < MARGIN_REL
    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.slow
def test_onnx_runtime_decode_meets_the_bound(tmp_path):
    """The exported first layer (ONNX Runtime, CPU) decodes a bounded pack within its bound: the bound
    needs no decoder op of its own, and the float32 margin covers ORT's arithmetic."""
    x, spec, (q, side) = _bounded_wire()
    onnx_decode_meets_the_bound(x, spec, q, side, tmp_path / "bounded.onnx")


@pytest.mark.cuda
def test_cuda_decode_meets_the_bound():
    """On CUDA (the fused Triton kernel in eager mode) the decode differs from the CPU's by less than the
    margin, so the bound checked on the CPU at pack time holds there too."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x, spec, (q, side) = _bounded_wire()
    cuda_decode_meets_the_bound(x, spec, q, side)


def cuda_decode_meets_the_bound(x, spec, q, side) -> Decompress:
    """The layer on CUDA decodes (q, side) within the bound and within the float32 margin of its CPU decode;
    returns the layer, on CUDA."""
    layer = Decompress(spec, normalize=False)
    cpu = layer((q, side)).double()
    gpu = layer.to("cuda")((q.cuda(), side.cuda())).double().cpu()
    check_bound(x, gpu.float(), spec)
    scale = x.double().abs().amax((-1, -2))
    drift = float(((gpu - cpu).abs().amax((-1, -2)) / scale).max())
    assert drift < MARGIN_REL, drift
    return layer


def test_bound_holds_with_a_channel_rotation():
    """A landed spec with a channel rotation (correlated channels at a PSNR target), bounded afterwards:
    re-coding an item rescales it through the rotation and the bound holds on every channel."""
    torch.manual_seed(0)
    base = torch.cumsum(torch.cumsum(torch.randn(8, 1, 32, 32), -1), -2)
    x = torch.cat([base, 0.9 * base + 0.1 * torch.randn_like(base), 0.05 * torch.randn_like(base) - base], 1)
    spec = calibrate_report(x, quant="int16", target_psnr=40).spec.replace(max_rel_error=5e-3)
    assert spec.rotation is not None
    check_bound(x, decoded(spec, x), spec)
