"""Rounding within a pointwise bound: each coefficient of a bounded block may take the level on the other
side of its value instead of the nearest one, where that brings the block's decode within the bound.

Plain rounding makes a pixel's error the sum of 64 independent rounding errors: its tail (the largest of
thousands of pixels is about 4 of their standard deviations) sets the step, or costs a correction per
pixel that misses (`dctdata.decoder.corrections`). A level one step away changes a coefficient's bits little at the
rates a tight bound needs, and moves the block's pixels by that step times one basis image, so a few such
choices per block pull its outlying pixels inside the bound. The decoder is unchanged: the choice is the
encoder's alone, and the encoder checks the float32 decode against the bound afterwards as it always does.

Greedy, per block, vectorized over blocks: take the pixel furthest over the bound, try moving each
coefficient one level in the direction that pulls that pixel in (never more than one step from its value,
never outside the integer dtype), keep the move that most lowers the block's total excess over the bound,
and repeat while some move lowers it. Hand-written: no library rounds transform coefficients under a
pointwise bound of the synthesized signal.
"""

from __future__ import annotations

import torch

CHUNK_BLOCKS = 2048  # blocks per pass: the candidate errors are (blocks, K, 64) float64
ROUNDS = 24  # moves per block at most


def round_within(
    u: torch.Tensor,
    q: torch.Tensor,
    steps: torch.Tensor,
    basis: torch.Tensor,
    limit: torch.Tensor,
    counts: torch.Tensor,
    qmin: int,
    qmax: int,
    rounds: int = ROUNDS,
) -> torch.Tensor:
    """Levels q' (N, K) of N blocks, each within one step of u (coefficients over their steps, N x K
    float64) and in [qmin, qmax], starting from q (their nearest levels, clamped), such that the block's
    error (steps * (q' - u)) @ basis on the pixels where `counts` (N, 64 bool) is true exceeds `limit`
    (N, float64: the pixel bound in coefficient units) less than q's did, pixel by pixel summed. `steps`
    (N, K) or (K,); basis (K, 64) float64 (`dctdata.codec.transform.basis`)."""
    q = q.clone()
    steps = torch.broadcast_to(steps.to(torch.float64), u.shape)
    for lo in range(0, len(u), CHUNK_BLOCKS):
        part = slice(lo, lo + CHUNK_BLOCKS)
        q[part] = _round_chunk(u[part], q[part], steps[part], basis, limit[part], counts[part], qmin, qmax, rounds)
    return q


def _excess(e: torch.Tensor, limit: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Summed excess of |e| over `limit` on the pixels that count (last axis); `e` is consumed."""
    return e.abs_().sub_(limit.unsqueeze(-1)).clamp_(min=0).mul_(counts).sum(-1)


def _round_chunk(u, q, steps, basis, limit, counts, qmin, qmax, rounds):
    # float32 inside: the errors are a few steps at most, and the encoder checks the float32 decode afterwards
    counts, limit, basis = counts.to(torch.float32), limit.to(torch.float32), basis.to(torch.float32)
    e = ((steps * (q.to(torch.float64) - u)).to(torch.float32)) @ basis  # (n, 64) pixel errors
    over = _excess(e.clone(), limit, counts)
    active = (over > 0).nonzero().flatten()
    for _ in range(rounds):
        if not len(active):
            break
        ea, la, ca = e[active], limit[active], counts[active]
        worst = ((ea.abs() - la.unsqueeze(-1)) * ca - (1 - ca)).argmax(1)  # the pixel furthest over (one that counts)
        pull = -torch.sign(ea.gather(1, worst[:, None]))  # (a, 1): the direction that pulls it in
        direction = pull * torch.sign(basis[:, worst].T)  # (a, K): the level move of each coefficient
        moved = q[active].to(torch.float64) + direction
        allowed = (direction != 0) & ((moved - u[active]).abs() <= 1) & (moved >= qmin) & (moved <= qmax)
        shift = (steps[active] * direction).to(torch.float32)
        trial = ea.unsqueeze(1) + shift.unsqueeze(-1) * basis.unsqueeze(0)  # (a, K, 64)
        score = _excess(trial, la.unsqueeze(1), ca.unsqueeze(1)).masked_fill_(~allowed, torch.inf)  # consumes trial
        best, k = score.min(1)
        better = best < over[active] * (1 - 1e-6)
        if not bool(better.any()):
            break
        rows, k = active[better], k[better]
        q[rows, k] += direction[better].gather(1, k[:, None]).squeeze(1).to(q.dtype)
        e[rows] = ea[better] + shift[better].gather(1, k[:, None]) * basis[k]  # the kept move's errors, as in trial
        over[rows] = best[better]
        active = rows[over[rows] > 0]
    return q


def can_round(spec) -> bool:
    """Whether `round_coded` applies to a spec: 2-D integer coefficients, each channel coded alone with
    plain steps (no rotation, channel weights, offsets, reconstruction shifts or dead zone)."""
    from dctdata.codec.spec import INTEGER_DTYPES

    return (
        spec.dtype in INTEGER_DTYPES
        and spec.depth is None
        and spec.rotation is None
        and spec.weights is None
        and spec.offsets is None
        and spec.recon is None
        and spec.theta is None
        and spec.steps is not None
    )


def round_coded(coeffs, q, ranges, room, spec, valid=None, aim: float = 0.97) -> torch.Tensor:
    """`round_within` on a batch: coded coefficients (B, C, Hb, K, Wb) float, their nearest levels q (same
    shape, the spec's integer dtype), the stored range of every item (B, C), its room (bound less margin,
    field units, (B, C)) and the valid pixels (broadcast to (B, C, H, W), or None). Each block aims at
    `aim` x the room (float32 decoding rounds a little differently from this float64 arithmetic)."""
    from dctdata.codec.transform import basis as synthesis_basis

    b, c, hb, k, wb = q.shape
    h, w = spec.size
    table = torch.as_tensor(spec.steps, dtype=torch.float64)
    table = table.reshape(c, 1).expand(c, k) if table.numel() == c else table.reshape(c, k)
    blocks = lambda t: t.permute(0, 1, 2, 4, 3).reshape(-1, k)  # noqa: E731  (B, C, Hb, K, Wb) -> (N, K)
    u = blocks(coeffs.to(torch.float64) / table.reshape(1, c, 1, k, 1))
    steps = table.reshape(1, c, 1, 1, k).expand(b, c, hb, wb, k).reshape(-1, k)
    limit = (aim * room.to(torch.float64) / ranges.to(torch.float64)).reshape(b, c, 1, 1).expand(b, c, hb, wb)
    inside = torch.zeros(b, c, hb * 8, wb * 8, dtype=torch.bool)
    inside[..., :h, :w] = True if valid is None else torch.broadcast_to(valid, (b, c, h, w))
    inside &= (room > 0).reshape(b, c, 1, 1)  # an item without room (constant: a relative bound of 0) is exact
    counts = inside.reshape(b, c, hb, 8, wb, 8).permute(0, 1, 2, 4, 3, 5).reshape(-1, 64)
    info = torch.iinfo(q.dtype)
    out = round_within(
        u, blocks(q).to(torch.int64), steps, synthesis_basis(spec.cf, spec.mask, torch.float64),
        limit.reshape(-1), counts, info.min, info.max,
    )  # fmt: skip
    return out.reshape(b, c, hb, wb, k).permute(0, 1, 2, 4, 3).to(q.dtype).contiguous()
