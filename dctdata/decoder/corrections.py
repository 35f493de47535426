"""Sparse corrections of a bounded field (`CodecSpec.corrections`): steps coarser than the pointwise bound
alone needs, and the few values whose decode still misses the bound corrected one by one.

A bound is set by the worst pixel of an item: one outlier (a spike, an edge) forces the whole item to a
fine step. With corrections the encoder codes the item at a coarser step and stores, for each value that
misses, an integer multiple of a small correction step; the decoder adds them after the inverse DCT. The
encoder picks, per sample, the step multiplier whose coefficients plus corrections store least
(`dctdata.encoder.quantize.encode`), and checks the corrected float32 decode against the bound like any other.

Stored form: the rows after a sample's C (range, mid) rows of its side values, in their dtype (float32; float64
for a field that decodes in float64, `dctdata.codec.spec.CodecSpec.precision`) (so both storages,
the stored-bytes path and every reader keep the side partner as it is; only its row count grows):

- header row: (step, count): the correction step of the sample, in the field's units (> 0; 0 when count
  is 0), and the number of corrections (an integer in [0, cap]);
- `cap` rows (gap, k): the flat index into the sample's (C, *size) values of each correction is the
  running sum of the gaps (integers >= 0, each < 2^24 so float32 holds them exactly), and the value added
  there is k * step (k an integer, |k| <= 2^24). Rows past count are (0, 0).

The decoder (`apply`) is torch index ops only (cumsum, gather, scatter_add), so `Decompress` stays
portable: torch.export, ONNX (ScatterElements with add) and CUDA run the same graph. Indices are clamped
into the sample before the scatter, so no input writes outside it; `check` validates stored rows and
names the sample (readers of stored bytes and `Decompress` in eager mode call it).

Hand-written: the correction list is this codec's own part (its decoder runs inside `Decompress`); no
library stores one for a DCT decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError, IntegrityError

EXACT = float(1 << 24)  # float32 holds every integer up to here exactly: the largest gap and |k|
# step multipliers tried per sample, coarser than the bound alone needs (1: the bound's own step with
# corrections for its outliers instead of re-coding the item); rounding within the bound
# (`dctdata.encoder.bound_rounding`) keeps most values of 2 to 2.8 x within it
MULTIPLIERS = (1.0, 1.25, 1.6, 2.0, 2.25, 2.5, 2.8)


def capacity(values: int) -> int:
    """Correction rows per sample of `values` values: 1/64 of them (at least 16). Past a few percent of
    the values corrections cost more than the finer step they replace; unused rows are zeros, which the
    side partner's zstd stores in a few bytes."""
    return max(16, values // 64)


def split(side: torch.Tensor, spec: CodecSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(range/mid rows (..., C, 2), correction rows (..., 1 + cap, 2) or None) of a side tensor (lattice rows,
    `dctdata.codec.lattice`, left out)."""
    c = spec.channels
    if spec.corrections is None:
        return side[..., :c, :], None
    return side[..., :c, :], side[..., c : c + 1 + spec.corrections, :]


def check(fix: torch.Tensor, spec: CodecSpec, indices: Sequence[int] | None = None, where: str = "field") -> None:
    """Raise `IntegrityError` naming the sample unless every row of `fix` (N, 1 + cap, 2) is well formed:
    finite, a count in [0, cap], integer gaps >= 0 below 2^24, indices inside the sample, integer |k| <=
    2^24, a positive finite step when count > 0, and zero rows past count."""
    check_deferred(fix, spec, indices, where)()


def check_deferred(
    fix: torch.Tensor, spec: CodecSpec, indices: Sequence[int] | None = None, where: str = "field"
) -> Callable[[], None]:
    """`check` in two halves: the tests are queued on fix's device now (nothing is read back; a CUDA batch
    does not wait), the returned function reads their verdict and raises (`DecodeAhead` calls it when it
    waits for the batch anyway). The row shape is checked at once."""
    cap = spec.corrections
    if cap is None:
        raise DctDataError(f"{where}: corrections: expected a spec with a correction capacity. Got a spec without")
    if fix.dim() != 3 or tuple(fix.shape[1:]) != (1 + cap, 2):
        raise IntegrityError(f"{where}: corrections: expected (N, {1 + cap}, 2) rows. Got {tuple(fix.shape)}")
    on = fix.device if fix.device.type in ("cpu", "cuda") else "cpu"  # float64 where the device has it
    f = fix.detach().to(on, torch.float64)
    n = math.prod(spec.sample_shape)
    step, count = f[:, 0, 0], f[:, 0, 1]
    gap, k = f[:, 1:, 0], f[:, 1:, 1]
    live = torch.arange(cap, dtype=torch.float64, device=f.device)[None, :] < count[:, None]
    total = torch.where(live, gap, torch.zeros_like(gap)).sum(1)
    tests = torch.stack(
        [
            ~torch.isfinite(f).flatten(1).all(1),
            (count < 0) | (count > cap) | (count != count.round()),
            (count > 0) & ~(step > 0),
            ((gap < 0) | (gap >= EXACT) | (gap != gap.round())).any(1),
            ((k.abs() > EXACT) | (k != k.round())).any(1),
            (~live & ((gap != 0) | (k != 0))).any(1),
            (count > 0) & (total >= n),
        ]
    )  # (tests, N): queued, not read
    why = (
        "non-finite values",
        "count outside [0, cap] or fractional",
        "a correction step that is not positive",
        "a gap that is negative, huge or fractional",
        "a correction that is huge or fractional",
        "rows past the count that are not zero",
        f"an index past the sample's {n} values",
    )

    def verdict() -> None:
        found = tests.cpu()
        bad = found.any(0)
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            name = f"sample {j} of the batch" if indices is None else f"sample {indices[j]}"
            text = why[int(found[:, j].nonzero()[0])]  # the first test it fails, non-finite values first
            raise IntegrityError(f"{where}: {name}: corrections: expected well-formed rows. Got {text}")

    return verdict


def apply(img: torch.Tensor, fix: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """img (B, C, *size) with each sample's corrections added in place (and returned): value k * step *
    scale[c] at flat index sum(gaps) (scale: the layer's per-channel normalization 1/std, or None).
    Indices are clamped into the sample, so malformed rows never write outside it (`check` names them)."""
    b = img.shape[0]
    flat = img.reshape(b, -1)
    n = flat.shape[1]
    step = fix[:, 0:1, 0].to(img.dtype)  # (B, 1)
    rows = fix[:, 1:, :]
    idx = torch.cumsum(rows[..., 0].to(torch.int64), 1).clamp(0, n - 1)  # (B, cap)
    delta = rows[..., 1].to(img.dtype) * step
    if scale is not None:
        per = n // img.shape[1]
        delta = delta * scale.to(img.dtype).reshape(-1)[torch.div(idx, per, rounding_mode="floor")]
    if img.is_contiguous():  # `flat` is a view of img: added in place, no second pass over the output
        flat.scatter_add_(1, idx, delta)
        return img
    return flat.scatter_add(1, idx, delta).reshape(img.shape)


def build(
    x: torch.Tensor,
    x_hat: torch.Tensor,
    room: torch.Tensor,
    cap: int,
    valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correction rows (B, 1 + cap, 2) in `dtype`, the side values' (float64 for a field that decodes in
    float64, `dctdata.codec.spec.CodecSpec.precision`), count per sample (B,)) that bring every valid value of
    x_hat (B, C, *size) within `room` (B, C: the bound less the float32 margin) of x. A sample needing
    more than `cap` corrections, or one of more than 2^24 steps, gets count > cap and no rows (the caller
    does not use it). The step is the smallest room of the sample's items that have values to correct: the
    corrected value is within step / 2 of x before float32 rounding."""
    b = x.shape[0]
    d = x.detach().to(torch.float64) - x_hat.detach().to(torch.float64)
    at = (...,) + (None,) * (x.dim() - 2)
    miss = (d.abs() > room[at]) & (d != 0)  # an exact value always holds (`dctdata.encoder.bounds.missing`)
    if valid is not None:
        miss &= torch.broadcast_to(valid, x.shape)
    miss = miss.reshape(b, -1)
    d = d.reshape(b, -1)
    counts = miss.sum(1)
    # the smallest room of the items with a value to correct (one step serves the sample; a channel without
    # misses does not make it finer: channels whose ranges differ by 1e8 would need corrections past 2^24
    # steps), in the rows' dtype: what the decoder multiplies by. A constant item decodes exactly: its room of 0
    # takes none
    per_item = miss.reshape(x.shape).flatten(2).any(-1)  # (B, C)
    step = room.masked_fill(~((room > 0) & per_item), math.inf).amin(1).to(dtype).to(torch.float64)
    stuck = (per_item & ~(room > 0)).any(1)  # a miss where nothing may move
    counts[stuck] = cap + 1
    fix = torch.zeros(b, 1 + cap, 2, dtype=dtype)
    for j in (counts <= cap).nonzero().flatten().tolist():
        where = miss[j].nonzero().flatten()
        if not len(where):
            continue
        s = float(step[j])
        if not (s > 0 and math.isfinite(s)):  # no room at all: nothing can correct this sample
            counts[j] = cap + 1
            continue
        gaps = torch.diff(where, prepend=where.new_zeros(1))
        if bool((gaps >= EXACT).any()):  # a gap float32 cannot hold: a zero correction in between
            counts[j] = cap + 1  # rare (2^24 values between two misses): the sample goes without
            continue
        k = torch.round(d[j, where] / s)
        if bool((k.abs() > EXACT).any()):  # a correction float32 cannot hold (what `check` refuses): go without
            counts[j] = cap + 1
            continue
        fix[j, 0, 0], fix[j, 0, 1] = s, len(where)
        fix[j, 1 : 1 + len(where), 0] = gaps.to(dtype)
        fix[j, 1 : 1 + len(where), 1] = k.to(dtype)
    return fix, counts


def stored_bytes(fix: torch.Tensor) -> int:
    """Bytes the used rows of one sample's corrections take after zstd (the side partner's stage): what
    the per-sample search weighs against the coefficients' bytes."""
    from dctdata.stages import DEFAULT_CODEC, get_stage

    count = int(fix[0, 1])
    if not count:
        return 0
    return len(get_stage(DEFAULT_CODEC).encode(fix[: 1 + count].numpy().tobytes()))


def stage_sizer(lossless: Mapping[str, Any] | None, spec: CodecSpec) -> Callable[[torch.Tensor], int]:
    """A sample's coefficients (C, ...) -> its bytes after the lossless stage `lossless` (a stage config;
    the stage's own estimate where it has one, `Stage.estimate_size`)."""
    from dctdata.stages import get_stage

    stage = get_stage(lossless)
    integer = spec.dtype in ("int8", "int16")

    def size(q: torch.Tensor) -> int:
        rows = q.reshape(spec.rows_shape).permute(1, 0, 2, 3).contiguous()  # (R, C, K, Wb)
        return int(stage.estimate_size(rows.unsqueeze(2).numpy(), spec.cf, spec.mask, integer))

    return size


def zstd_size(q: torch.Tensor) -> int:
    """A sample's coefficients -> their bytes through zstd (the default sizer of the per-sample search when
    the caller knows no lossless stage)."""
    from dctdata.stages import DEFAULT_CODEC, get_stage

    return len(get_stage(DEFAULT_CODEC).encode(q.contiguous().numpy().tobytes()))
