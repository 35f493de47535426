"""Calibration weighs a codec table's manifest bytes against what it saves on the coefficients (issue 46):
`dctdata.encoder.tables`."""

import math

import pytest
import torch

from dctdata.encoder.calibrate import calibrate_report, fit_recon
from dctdata.encoder.tables import choose_recon, packed_bytes
from dctdata.errors import DctDataError


def _quantized(channels=2, k=64, rows=40, wb=6, seed=0):
    """(v, q, delta, steps): Laplacian coefficients over their steps, dead-zone quantized (theta 0.4), and the
    per-frequency offsets fitted to them."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(3.0, 0.3, k).reshape(1, 1, k, 1)
    v = torch.distributions.Laplace(0.0, 1.0).sample((rows, channels, k, wb)) * scale
    v = v + 0.01 * torch.randn(rows, channels, k, wb, generator=g)
    q = torch.sign(v) * torch.floor(v.abs() + 0.4)
    return v, q, fit_recon(v, q, dims=(0, 3)), torch.full((channels, k), 0.05, dtype=torch.float64)


def _sse(v, q, delta, steps):
    rec = q - delta.reshape(1, *delta.shape, 1).float() * torch.sign(q)
    return ((rec - v) * steps.reshape(1, *steps.shape, 1).float()).double().pow(2).sum(dim=(0, 2, 3))


def test_a_table_pays_on_a_large_set_and_becomes_one_value_on_a_tiny_one():
    torch.manual_seed(0)
    v, q, delta, steps = _quantized()
    sse = _sse(v, q, delta, steps)
    per_channel = q.shape[0] * q.shape[2] * q.shape[3]
    assert not bool((delta == delta[:, :1]).all())  # the fitted offsets differ by frequency
    big = choose_recon(v, q, delta, steps, sse, per_channel * 1e6)
    assert torch.equal(big, delta)  # a million times the coefficients: the table saves far more than it costs
    tiny = choose_recon(v, q, delta, steps, sse, per_channel / 100)
    assert bool((tiny == tiny[:, :1]).all()) and not torch.equal(tiny, delta)
    for c in range(2):  # one value per channel: the mean shift of its nonzero values, rounded as stored
        nz = q[:, c] != 0
        want = float((q[:, c].abs() - v[:, c].abs())[nz].double().mean())
        assert math.isclose(float(tiny[c, 0]), round(want, 2), abs_tol=0.0051)
    # what the constant row costs in error is what the choice weighed: more than the table's, never less
    assert bool((_sse(v, q, tiny, steps) >= sse - 1e-9).all())
    assert packed_bytes([float(tiny[0, 0])] * 64) < packed_bytes(delta[0].tolist()) / 4


def _volume():
    """A head-like int16 volume of an odd size: a textured ellipsoid on a zero background (25 x 41 x 33)."""
    d, h, w = torch.meshgrid(torch.arange(25.0), torch.arange(41.0), torch.arange(33.0), indexing="ij")
    r2 = ((d - 12) / 11) ** 2 + ((h - 20) / 18) ** 2 + ((w - 16) / 14) ** 2
    inside = 1000 * (1.2 - r2) + 40 * torch.sin(h / 3) * torch.cos(w / 4) + 30 * torch.sin(d / 2)
    return torch.where(r2 < 1, inside, torch.zeros(())).round().reshape(1, 1, 25, 41, 33)


@pytest.mark.slow
def test_a_single_small_volume_stores_one_offset_and_a_large_set_a_table():
    x = _volume()
    alone = calibrate_report(x, target_psnr=40, quant="int8").spec
    recon = torch.tensor(alone.recon)
    assert bool((recon == recon[:, :1]).all())  # one volume: the 512-entry table would outweigh its gain
    many = calibrate_report(x, target_psnr=40, quant="int8", dataset_samples=100_000).spec
    assert len(set(many.recon[0])) > 1  # the same subset standing for 100,000 volumes: per frequency


def test_dataset_samples_is_checked():
    x = torch.randn(2, 1, 16, 16).cumsum(-1)
    with pytest.raises(DctDataError, match=r"dataset_samples: expected an int >= 1\. Got 0"):
        calibrate_report(x, target_psnr=30, dataset_samples=0)
    with pytest.raises(TypeError, match=r"dataset_samples: expected an int >= 1\. Got 'many'"):
        calibrate_report(x, target_psnr=30, dataset_samples="many")
