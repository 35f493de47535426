"""Rounding within a pointwise bound (issue 32, `dctdata.encoder.bound_rounding`): each coefficient keeps a level
within one step of its value and the integer dtype, the blocks' excess over the bound never grows and
mostly vanishes, pixels that do not count are ignored, and bounded packs store less with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_bounds import check_bound, spiky, turbulent

from dctdata.codec.transform import basis
from dctdata.decoder.corrections import stage_sizer, stored_bytes
from dctdata.decoder.layer import Decompress
from dctdata.encoder.bound_rounding import can_round, round_coded, round_within
from dctdata.encoder.bounds import item_bounds
from dctdata.encoder.calibrate import calibrate_report
from dctdata.encoder.quantize import coded_coefficients, encode, quantize_per_sample, rescaled

B = basis(8, "square", torch.float64)  # (64, 64)


def _excess(u, q, steps, limit, counts):
    e = (steps * (q.double() - u)) @ B
    return ((e.abs() - limit[:, None]).clamp(min=0) * counts).sum(1)


def _blocks(n=400, step=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, 64, generator=g, dtype=torch.float64) * 30
    steps = torch.full((64,), step, dtype=torch.float64)
    limit = torch.full((n,), 0.7 * step, dtype=torch.float64)  # plain rounding misses in many blocks (sigma 0.29 step)
    return u, steps, limit


def test_levels_stay_within_a_step_and_the_excess_falls():
    u, steps, limit = _blocks()
    q = torch.round(u).to(torch.int64)
    counts = torch.ones(len(u), 64, dtype=torch.bool)
    out = round_within(u, q, steps, B, limit, counts, -32768, 32767)
    before, after = _excess(u, q, steps, limit, counts), _excess(u, out, steps, limit, counts)
    assert bool(((out.double() - u).abs() <= 1 + 1e-9).all())
    assert bool((after <= before + 1e-9).all())
    assert int((before > 0).sum()) > 100 and float(after.sum()) < 0.2 * float(before.sum())
    assert torch.equal(out[before == 0], q[before == 0])  # blocks within the bound keep their nearest levels


def test_pixels_that_do_not_count_are_ignored():
    u, steps, limit = _blocks(n=50)
    q = torch.round(u).to(torch.int64)
    none = torch.zeros(len(u), 64, dtype=torch.bool)
    assert torch.equal(round_within(u, q, steps, B, limit, none, -32768, 32767), q)
    some = torch.zeros(len(u), 64, dtype=torch.bool)
    some[:, :8] = True  # the first row of each block only
    out = round_within(u, q, steps, B, limit, some, -32768, 32767)
    assert float(_excess(u, out, steps, limit, some).sum()) < float(_excess(u, q, steps, limit, some).sum())


def test_levels_stay_inside_the_integer_dtype():
    u, steps, limit = _blocks(n=200)
    u = u.sign() * 127.4 + u / 100  # every coefficient near int8's limits
    q = torch.round(u).clamp(-128, 127).to(torch.int64)
    out = round_within(u, q, steps, B, limit, torch.ones(len(u), 64, dtype=torch.bool), -128, 127)
    assert int(out.min()) >= -128 and int(out.max()) <= 127 and not torch.equal(out, q)


def test_a_batch_decodes_with_fewer_values_over_the_bound():
    """On coded fields at 1.6 x the step the bound needs (pixel errors of sigma 0.46 x the bound), the float32
    decode of the rounded levels has far fewer values over the room (bound less margin) than nearest
    rounding; the pixels past the image (24 x 28 is padded to whole blocks) and the invalid ones do not
    count."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(turbulent(rng, 4, 2, 24, 28).astype(np.float32))
    valid = torch.from_numpy(rng.random(x.shape) > 0.1)
    spec = calibrate_report(x, quant=None, max_rel_error=1e-3).spec
    assert can_round(spec)
    coeffs, side = coded_coefficients(x, spec, valid=valid)
    bound, margin, rng_ = item_bounds(x, spec, valid)
    g = 1.6 * bound / (spec.steps[0][1] * rng_)  # the step of a normalized item: spec.steps x g
    c = rescaled(coeffs, g, spec)
    q, _ = quantize_per_sample(c, spec)
    side = side.clone()
    side[..., 0] = (side[..., 0].double() * g).float()
    out = round_coded(c, q, side[..., 0], bound - margin, spec, valid)
    layer = Decompress(spec.replace(corrections=None), normalize=False)
    room = (bound - margin)[..., None, None]

    def over(levels):
        err = (layer((levels, side)).double() - x.double()).abs()
        return int(((err > room) & valid).sum())

    steps = torch.as_tensor(spec.steps, dtype=torch.float64).reshape(1, 2, 1, -1, 1)
    assert bool(((out.double() - c.double() / steps).abs() <= 1 + 1e-4).all())
    assert over(q) > 50 and over(out) < over(q) / 5


@pytest.mark.parametrize("kind", [turbulent, spiky])
def test_bounded_samples_store_less_and_hold(kind, monkeypatch):
    x = torch.from_numpy(kind(np.random.default_rng(5), 4, 1, 64, 64).astype(np.float32))
    spec = calibrate_report(x, quant=None, max_rel_error=1e-3).spec
    size = stage_sizer({"id": "zstd", "level": 9}, spec)

    def stored(wire):
        q, side = wire
        return sum(size(q[j]) + stored_bytes(side[j, spec.channels :]) for j in range(len(q)))

    wire, _ = encode(x, spec, size_of=size)
    check_bound(x, Decompress(spec, normalize=False)(wire), spec)
    monkeypatch.setattr("dctdata.encoder.bound_rounding.can_round", lambda spec: False)
    plain, _ = encode(x, spec, size_of=size)
    assert stored(wire) < 0.97 * stored(plain)


def test_a_constant_channel_stays_exact_beside_a_rounded_one():
    """A constant item (range 0: no room under a relative bound) keeps its exact decode while the other
    channel of its samples is rounded within its bound."""
    x = torch.from_numpy(spiky(np.random.default_rng(16), 4, 2, 32, 32).astype(np.float32))
    x[:, 1] = 7.0
    spec = calibrate_report(x, quant=None, max_rel_error=1e-3).spec
    wire, _ = encode(x, spec)
    y = Decompress(spec, normalize=False)(wire)
    check_bound(x, y, spec)
    assert bool((y[:, 1] == 7.0).all())
