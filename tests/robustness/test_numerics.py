"""Numerical robustness: data with huge offsets (temperatures ~300 K with 0.01 K detail,
elevations ~1e3 m), tiny ranges (1e-6) and mixed-scale channels keep the requested PSNR, per channel,
through the real path: pack --target-psnr -> open_dataset -> Decompress -> PSNR against each item's
(sample channel's) value range. What float32 cannot represent is refused, never silently missed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pack_checks import ZSTD

import dctdata
from dctdata.cli import main
from dctdata.codec.metrics import psnr
from dctdata.encoder.calibrate import dataset_psnr

N, H, W = 80, 32, 40  # more samples than the 64 calibration ones: some are unseen by calibration


def smooth(n, h, w, seed, detail=0.0):
    """Smooth random fields in about [-1, 1], plus `detail` x unit-variance fine structure."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    out = np.empty((n, h, w))
    for i in range(n):
        a, b, p, q = rng.uniform(1, 5, 4)
        out[i] = 0.6 * np.sin(a * np.pi * xx + p) * np.cos(b * np.pi * yy + q) + 0.4 * np.sin(
            (a + b) * np.pi * (xx + yy)
        )
        out[i] += detail * rng.standard_normal((h, w))
    return out


def channels(kind: str) -> np.ndarray:
    if kind == "temperature":  # 300 K, 2 K of weather, 0.01 K detail
        return (300 + 2 * smooth(N, H, W, 1) + smooth(N, H, W, 2, detail=0.01) * 0.0)[:, None]
    if kind == "elevation":  # ~1 km terrain with 50 m relief and 1 m detail
        return (1000 + 50 * smooth(N, H, W, 3, detail=0.02))[:, None]
    if kind == "tiny":  # values ~1e-6 in magnitude and range
        return (1e-6 * smooth(N, H, W, 4, detail=0.05))[:, None]
    if kind == "mixed":  # one sample = temperature, a 0..1 fraction, a 1e-6-scale field
        return np.stack(
            [
                300 + 2 * smooth(N, H, W, 5, detail=0.005),
                0.5 + 0.5 * smooth(N, H, W, 6, detail=0.02),
                1e-6 * smooth(N, H, W, 7, detail=0.05),
            ],
            axis=1,
        )
    raise AssertionError(kind)


def decoded(root):
    ds = dctdata.open_dataset(root)
    coeffs = torch.utils.data.default_collate([s[0] for s in ds.__getitems__(list(range(len(ds))))])
    return ds, ds.decompressor()(coeffs)


@pytest.mark.parametrize("kind", ["temperature", "elevation", "tiny", "mixed"])
@pytest.mark.parametrize("quant, target", [("int8", 40.0), ("int16", 60.0), (None, 45.0)])
def test_target_psnr_holds_per_channel(tmp_path, kind, quant, target):
    x = channels(kind).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    args = ["pack", str(tmp_path / "x.npy"), str(tmp_path / "out"), "--target-psnr", str(target), "--quiet"]
    args += ["--lossless", "zstd:1"]  # the PSNR of the decode does not depend on the bit-exact stage; auto fits one
    assert main(args + (["--quant", quant] if quant else [])) == 0
    ds, x_hat = decoded(tmp_path / "out")
    ref = torch.from_numpy(x)
    assert torch.isfinite(x_hat).all()
    for ch in range(x.shape[1]):  # the promise: dataset-level PSNR of every channel, range = the item's
        got = dataset_psnr(ref[:, ch : ch + 1], x_hat[:, ch : ch + 1])
        assert got >= target, (kind, ch, got)
    per_item = psnr(ref, x_hat)  # (N, C): no item far below, no NaN/inf from the offsets
    assert torch.isfinite(per_item).all() and float(per_item.min()) >= target - 6
    stats = ds.manifest.stats["image"]
    assert stats.overflow == 0 and stats.psnr_min is not None and np.isfinite(stats.psnr_min)


def test_unrepresentable_detail_is_refused_not_missed(tmp_path, capsys):
    """1e-6 of detail on an offset of 1: below float32 resolution (~1.2e-7 at 1.0), so 40 dB against
    a 1e-6 range cannot be met in float32. Pack must say so instead of reporting a lower PSNR."""
    x = (1.0 + 1e-6 * smooth(8, H, W, 9, detail=0.05)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert (
        main(
            [
                "pack",
                str(tmp_path / "x.npy"),
                str(tmp_path / "out"),
                *["--quant", "int16", "--target-psnr", "40", "--quiet"],
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "target_psnr: expected 40.0 dB on the calibration subset. Got" in err and "subtract an offset or rescale" in err
    )
    assert not (tmp_path / "out").exists()
    # after subtracting the offset the same data packs and keeps the target
    np.save(tmp_path / "y.npy", (x.astype(np.float64) - 1.0).astype(np.float32))
    assert (
        main(
            [
                "pack",
                str(tmp_path / "y.npy"),
                str(tmp_path / "out"),
                *["--quant", "int16", "--target-psnr", "40", "--quiet"],
            ]
        )
        == 0
    )


def test_constant_channel_next_to_a_varying_one(tmp_path):
    """A zero-range channel must not produce NaN steps or a -inf/NaN PSNR, and must decode to itself."""
    x = channels("temperature").repeat(2, axis=1).astype(np.float32)
    x[:, 1] = 273.15
    np.save(tmp_path / "x.npy", x)
    dctdata.pack(tmp_path / "x.npy", tmp_path / "out", quant="int8", target_psnr=40, quiet=True, lossless=ZSTD)
    ds, x_hat = decoded(tmp_path / "out")
    spec = ds.manifest.field("image").codec
    assert np.isfinite(np.asarray(spec.steps)).all() and (
        spec.offsets is None or np.isfinite(np.asarray(spec.offsets)).all()
    )
    assert dataset_psnr(torch.from_numpy(x[:, :1]), x_hat[:, :1]) >= 40
    assert float((x_hat[:, 1] - 273.15).abs().max()) < 0.05  # within the temperature channel's error scale
    s = ds.manifest.stats["image"]
    assert np.isfinite(s.psnr_min) and np.isfinite(s.max_abs_error)


def test_steps_tables_must_fit_float32():
    """Regression: a step below float32's smallest normal (or above its max) flushed to 0/inf when the
    table was applied in float32; CodecSpec now refuses it."""
    with pytest.raises(dctdata.DctDataError, match=r"steps: expected values representable in float32"):
        dctdata.CodecSpec(cf=1, height=8, width=8, dtype="int8", steps=[[1e-39]])
    with pytest.raises(dctdata.DctDataError, match=r"mean: expected values representable in float32"):
        dctdata.CodecSpec(cf=1, height=8, width=8, mean=[1e39], std=[1.0])


def test_non_finite_coefficients_never_quantize_silently():
    """Regression: NaN coefficients cast to an arbitrary int8 before; now an error."""
    spec = dctdata.CodecSpec(cf=1, height=8, width=8, dtype="int8", steps=[[1.0]])
    x = torch.ones(1, 8, 8)
    x[0, 0, 0] = float("nan")
    with pytest.raises(dctdata.DctDataError, match=r"coefficients: expected finite values\. Got 1 NaN/Inf"):
        dctdata.encode(x, spec)
