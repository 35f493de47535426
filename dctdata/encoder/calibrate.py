"""Pack-time calibration: choose the codec settings of one `dct` field from a calibration subset.

With a target PSNR (`calibrate_report(x, target_psnr=T)`) the chosen spec lands the dataset-level PSNR
of the calibration subset at T + 0.15 dB (within +-0.12), and no sample falls more than 0.4 dB below
T (`min_psnr`, enforced by the encoder on every sample, seen or not). What it chooses:

- per-sample side information (range, mid) per channel: every item (channel of a sample) is coded as
  (x - mid) / range, so one step serves items of any scale (mixed-scale fields, snapshots whose
  amplitude grows) and each item's error is measured against its own range, as the project's PSNR is;
- for C > 1, an orthonormal channel rotation (the KLT of the calibration set) when it stores less;
- partial blocks filled from their own pixels (pad "extend"), a dead-zone quantizer (theta 0.4) with
  per-frequency reconstruction offsets (the centroid shift, fitted on the subset), one step per channel,
  coarser per-frequency steps only where int8 would overflow ("floors"; int16 when that stores less);
- cf and mask when left free: the smallest ones whose dropped energy is a small share of the budget,
  against cf 8 (the stored size decides).

Why it is fast (one pass over the data, then 1-2 exact evaluations): the DCT is orthonormal, so the
error of a setting is measured in the coefficient domain on a random subsample of block rows (at most
SUB_VALUES coefficients) with a secant search on log(step); sizes come from the lossless stage on the
same subsample. Then the whole subset is encoded and decoded for real (`Decompress`) and the step is
refined by regula falsi until the decoded PSNR is in the window.

Without a target, cf and quant are taken as given; integer dtypes get the finest steps that cannot
overflow (a normalized item is bounded, so the bound is exact) and per-sample side information.

PSNR here is always against each item's own value range (`dctdata.codec.metrics`). "Dataset-level PSNR" is
10 log10(1 / mean_i(MSE_i / range_i^2)) over items, and the target holds for every channel separately
(the worst channel decides).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from dctdata.codec import transform3d
from dctdata.codec.metrics import ItemErrors, item_nmse
from dctdata.codec.spec import COEFF_DTYPES, INTEGER_DTYPES, CodecSpec, check_bound_dtype, parse_coeff_dtype
from dctdata.codec.transform import BLOCK, DEFAULT_PAD, basis, compress, kept_frequencies, parse_cf, parse_mask
from dctdata.decoder.layer import Decompress
from dctdata.encoder.quantize import (
    F32_SAFE_MAX,
    as_rows,
    encode,
    item_side,
    keep_floor,
    normalize,
    quantize_per_sample,
    rescaled_by,
)
from dctdata.encoder.tables import choose_recon, table_bytes
from dctdata.errors import DctDataError
from dctdata.parse import is_number, parse_int, parse_number
from dctdata.stages import AUTO, for_setting, get_stage
from dctdata.stages.auto import stored_bytes

log = logging.getLogger(__name__)

THETA = 0.4  # dead-zone rounding: q = sign(v) floor(|v| + 0.4)
MARGIN_DB = 0.1  # land every channel at target + margin on the calibration subset ...
TOL_DB = 0.09  # ... within this tolerance: in target + 0.01 .. target + 0.19 dB
FLOOR_BELOW_DB = 0.4  # default min_psnr: no sample more than this below the target
SUB_VALUES = 1 << 20  # coefficients in the subsample the search runs on
DROP_SHARE = 0.15  # a smaller cf may drop at most this share of the error budget
INT_LIMITS = {"int8": 127.0, "int16": 32767.0}


def db(nmse: float) -> float:
    return math.inf if nmse <= 0 else -10.0 * math.log10(nmse)


def nmse_of(db_value: float) -> float:
    return 10.0 ** (-db_value / 10.0)


# Reports -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Candidate:
    """One setting tried on the subsample, with what it achieved there."""

    cf: int
    mask: str
    dtype: str
    rotation: bool
    subsample_psnr: float
    subsample_bytes: int


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What `calibrate_report` chose and what it achieves on the calibration subset."""

    spec: CodecSpec
    target_psnr: float | None
    dataset_psnr: float
    psnr_min: float
    psnr_median: float
    max_error: float
    overflow: int
    raw_bytes_per_sample: int
    codec: dict  # the lossless stage chosen for the field (the fitted entropy coder's config, or zstd)
    stats: dict
    candidates: tuple[Candidate, ...] = ()
    seconds: float = 0.0
    evaluations: int = 0
    # bytes of the subset as the writer stores them, per sample: sized when first read (coding every writer
    # chunk of the subset with the chosen stage; a pack reads only the spec and the stage, so it never pays it)
    sized: Callable[[], float] | None = dataclasses.field(default=None, repr=False, compare=False)

    @functools.cached_property
    def stored_bytes_per_sample(self) -> float:
        """Stored bytes per sample of the subset after the lossless stage, side values included."""
        return math.nan if self.sized is None else float(self.sized())

    @property
    def stored_ratio(self) -> float:
        """float32 bytes / stored bytes (after the lossless stage)."""
        return self.raw_bytes_per_sample / self.stored_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary for a manifest's pack report."""
        keys = (
            "target_psnr",
            "dataset_psnr",
            "psnr_min",
            "psnr_median",
            "max_error",
            "overflow",
            "stored_bytes_per_sample",
        )
        return {
            **{k: getattr(self, k) for k in keys},
            "stored_ratio": self.stored_ratio,
            "codec": self.codec,
            "stats": self.stats,
        }


def dataset_psnr(reference: torch.Tensor, estimate: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """10 log10(1 / mean_i(MSE_i / range_i^2)) over items (last two dims); constant items are skipped."""
    nm, ok = item_nmse(reference, estimate, valid)
    if not bool(ok.any()):
        raise DctDataError("dataset_psnr: expected at least one item with max > min. Got only constant items")
    return db(float(nm[ok].mean()))


# Inputs ------------------------------------------------------------------------------------------
def _check_samples(
    samples: object, valid: object, bounded: bool = False, keep64: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, ItemErrors]:
    if not isinstance(samples, torch.Tensor):
        raise TypeError(f"samples: expected a torch.Tensor of shape (N, C, H, W). Got {type(samples).__name__}")
    if samples.dim() not in (4, 5) or samples.shape[0] < 1 or samples.numel() == 0:
        raise DctDataError(
            "samples: expected shape (N, C, H, W) (or (N, C, D, H, W), volumes) with N >= 1. Got "
            f"{tuple(samples.shape)}"
        )
    if not samples.is_floating_point():
        raise TypeError(f"samples: expected a floating tensor. Got {samples.dtype}")
    if not bool(torch.isfinite(samples).all()):
        raise DctDataError("samples: expected finite values. Got NaN or inf in the calibration subset")
    peak = float(samples.detach().abs().max())
    if peak > F32_SAFE_MAX:
        raise DctDataError(
            f"samples: expected |x| <= {F32_SAFE_MAX:.3g} (float32 max / 8: the 8x8 DCT multiplies by up to 8). "
            f"Got max |x| = {peak:.3g}; rescale the data"
        )
    # a float64 subset under a bound stays float64: its field decodes in float64 (`CodecSpec.precision`)
    keep64 = keep64 and samples.dtype == torch.float64
    x = samples.detach().to(torch.float64 if keep64 else torch.float32).cpu()
    if valid is not None:
        if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool:
            raise TypeError(f"valid: expected a bool torch.Tensor. Got {type(valid).__name__}")
        try:
            valid = torch.broadcast_to(valid.cpu(), x.shape)
        except RuntimeError as exc:
            raise DctDataError(
                f"valid: expected a mask broadcastable to {tuple(x.shape)}. Got {tuple(valid.shape)}"
            ) from exc
    errors = ItemErrors(x, valid, dims=x.dim() - 2)
    if not bool(errors.ok.any()) and not bounded:  # a bound alone needs no PSNR: constant items are stored exactly
        raise DctDataError(
            "calibration samples: expected at least one item (sample channel) with max > min. Got only constant "
            "items, for which PSNR against the item's range is undefined; pack them with --quant none|fp16|bf16 "
            "and --cf (no --target-psnr), or as --field NAME=array"
        )
    return x, valid, errors


def _klt(xn: torch.Tensor) -> torch.Tensor:
    """Orthonormal C x C rotation: rows are the eigenvectors of the channel covariance, largest variance
    first, each with its largest component positive (so the result is deterministic)."""
    c = xn.shape[1]
    v = xn.to(torch.float64).transpose(0, 1).reshape(c, -1)
    cov = torch.cov(v)
    evals, evecs = torch.linalg.eigh(cov)
    r = evecs[:, torch.argsort(evals, descending=True)].T.contiguous()
    return r * torch.sign(r.gather(1, r.abs().argmax(1, keepdim=True)))


def worst_case_amax(cf: int, mask: str, rotation: torch.Tensor | None, channels: int) -> torch.Tensor:
    """(C, K) the largest |coefficient| an item normalized to [-0.5, 0.5] can have: 0.5 ||b_k||_1 ||R_c||_1."""
    b = transform3d.basis(cf, mask) if mask in transform3d.MASKS3 else basis(cf, mask, dtype=torch.float64)
    per_k = 0.5 * b.abs().sum(1)
    rows = torch.ones(channels, dtype=torch.float64) if rotation is None else rotation.abs().sum(1)
    return rows[:, None] * per_k[None, :]


class _Coded:
    """The calibration subset in the coded domain (normalized, weighted, rotated, all 64 frequencies; 512 of a
    volume's 8x8x8 blocks) and a random subsample of its block rows, for one rotation choice and channel
    weights (codec v3). `coef` has the spec's coefficient layout; `sub` and the statistics see a volume's
    (Db, Hb) as one axis of block rows. `reweighted(w)` gives the same subset with other weights without a
    DCT (channel mixing commutes with the spatial transform)."""

    def __init__(
        self,
        x: torch.Tensor | None,
        side: torch.Tensor | None,
        rotation: torch.Tensor | None,
        weights: torch.Tensor | None = None,
        base: torch.Tensor | None = None,
        dataset_scale: float = 1.0,
    ) -> None:
        self.rotation, self.weights, self.dataset_scale = rotation, weights, dataset_scale
        if base is None:
            dims = x.dim() - 2
            xn = normalize(x, side, dims)
            if dims == 3:  # (N, C, Db, Hb, 512, Wb), unrotated
                base = transform3d.compress(xn, 8, "cube", DEFAULT_PAD)
            else:  # (N, C, Hb, 64, Wb), unrotated
                base = compress(xn, 8, "square", DEFAULT_PAD)
        self.base = base if rotation is not None else None
        self.coef = base if rotation is None else torch.einsum("oc,nc...->no...", self.mixer.float(), base)
        n, c = self.coef.shape[:2]
        f, wb = self.coef.shape[-2:]
        by_rows = self.coef.reshape(n, c, -1, f, wb)
        per = by_rows.shape[2]
        rows = n * per
        take = min(rows, max(1, SUB_VALUES // (c * f * wb)))
        pick = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[:take].sort().values
        # block row r of all n * per (sample-major) is by_rows[r // per, :, r % per]: picked without a permuted
        # copy of the whole subset (the advanced indices come first: (R, C, F, Wb))
        self.sub = by_rows[pick // per, :, pick % per]
        amax = by_rows.amax(dim=(0, 2, 4))  # (C, F) largest |coefficient|, without an |x| copy of the subset
        self.amax = torch.maximum(amax, -by_rows.amin(dim=(0, 2, 4))).double()
        self.pixels = f * wb  # coefficients per block row and channel: SSE / pixels = MSE of the row
        self.scale = dataset_scale * rows / take  # the dataset's block rows per block row of `sub`

    @property
    def mixer(self) -> torch.Tensor | None:
        """R diag(w): what the encoder applies over the channels (None without a rotation)."""
        if self.rotation is None:
            return None
        r = self.rotation.double()
        return r if self.weights is None else r * self.weights.double()[None, :]

    def reweighted(self, weights: torch.Tensor) -> _Coded:
        return _Coded(None, None, self.rotation, weights, self.base, self.dataset_scale)

    def to_output(self, e: torch.Tensor) -> torch.Tensor:
        """(C, ...) mean squared errors per coded channel -> per output channel: (R^2)^T e / w^2."""
        if self.rotation is None:
            return e
        out = torch.einsum("oc,o...->c...", self.rotation.double().pow(2), e.double())
        if self.weights is not None:
            out = out / self.weights.double().pow(2).reshape(-1, *([1] * (out.dim() - 1)))
        return out

    def energy(self) -> torch.Tensor:
        """(C, 64) mean squared coefficient per output channel: the nmse of dropping each frequency."""
        e = self.sub.double().pow(2).sum(dim=(0, 3)) / (self.pixels * self.sub.shape[0])
        return self.to_output(e)  # dropped energy spreads over output channels through the rotation


# Volumes: the same search over 8x8x8 blocks (a 5-D calibration subset) --------------------------
def _masks(dims: int) -> tuple[str, str]:
    """(reduced, full) mask names: ("triangle", "square"), or a volume's ("tetra", "cube")."""
    return ("triangle", "square") if dims == 2 else transform3d.MASKS3[::-1]


def _frequency_index(cf: int, mask: str) -> list[int]:
    """Each kept frequency's plane among a full block's (64, or 512 for a volume mask)."""
    if mask in transform3d.MASKS3:
        return transform3d.frequency_index(cf, mask)
    return [u * BLOCK + v for u, v in kept_frequencies(cf, mask)]


def _shape_kw(shape) -> dict[str, int]:
    """CodecSpec's shape keywords of a calibration subset (N, C, H, W) or (N, C, D, H, W)."""
    *_, h, w = shape
    return dict(channels=shape[1], height=h, width=w, **({"depth": shape[2]} if len(shape) == 5 else {}))


# The search --------------------------------------------------------------------------------------
KAPPA = 2.0  # d log(nmse) / d log(step) of a fine uniform quantizer: every channel's first slope guess
MAX_EVALUATIONS = 10  # exact evaluations of the whole subset per landing ...
WEIGHT_MOVES = 4  # ... plus at most this many that only move a rotated setting's channel weights
FLOOR_ROUNDS = 3  # times the int8 floors may be raised so the per-sample floor can lift every item


def _vector(s: object, channels: int) -> torch.Tensor:
    """A (C,) float64 tensor of per-channel steps from a number or a sequence."""
    t = torch.as_tensor(s, dtype=torch.float64).flatten()
    return t.expand(channels).clone() if t.numel() == 1 else t.clone()


def _db(nm: torch.Tensor) -> torch.Tensor:
    """dB of a tensor of nmse values (+inf for 0)."""
    return -10.0 * torch.log10(nm.to(torch.float64))


class _Setting:
    """One (rotation, cf, mask, dtype) being fitted: its floors and subsample error model.

    Steps are per coded channel (a (C,) vector of base steps; a number means the same for every channel),
    so every channel is landed at the target on its own: with one step for all channels, the worst
    channel decided and the others were stored above their target (1.2-1.4 dB on multi-channel sets)."""

    def __init__(self, coded: _Coded, cf: int, mask: str, dtype: str, raised: torch.Tensor | None = None) -> None:
        self.coded, self.cf, self.mask, self.dtype = coded, cf, mask, dtype
        self.idx = _frequency_index(cf, mask)
        c = coded.coef.shape[1]
        if dtype in INTEGER_DTYPES:
            bound = worst_case_amax(cf, mask, coded.mixer, c)
            data = coded.amax[:, self.idx] * 1.1
            self.floors = (torch.minimum(data, bound) / (INT_LIMITS[dtype] - 0.5)).clamp(min=1e-12)
        else:
            self.floors = torch.zeros(c, len(self.idx), dtype=torch.float64)
        self.raised = torch.zeros_like(self.floors) if raised is None else raised  # what raise_floors added
        self.floors = torch.maximum(self.floors, self.raised)
        self._trial: tuple | None = None  # (coded, steps, result) of the last subsample trial (`subsample`)
        self._kept: tuple | None = None  # (coded, its subsample's kept planes): the same for every trial

    def set_weights(self, weights: torch.Tensor) -> None:
        """The same setting with other channel weights (its raised floors kept)."""
        other = _Setting(self.coded.reweighted(weights), self.cf, self.mask, self.dtype, self.raised)
        self.coded, self.floors = other.coded, other.floors

    @property
    def channels(self) -> int:
        return self.floors.shape[0]

    def steps(self, s: object) -> torch.Tensor:
        """(C, K) steps: each channel's base step, or the frequency's floor where that is coarser."""
        return torch.maximum(_vector(s, self.channels)[:, None].expand_as(self.floors), self.floors)

    def subsample(self, s: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(mean nmse per output channel, per coded channel, quantized planes, recon offsets) on the
        subsample. The last trial is kept: the search asks again for the steps a landing ended on (its
        size, then the recon offsets of the first exact evaluation), and gets them without quantizing
        again (the result depends only on the coded subset and the (C, K) steps)."""
        steps = self.steps(s)
        last = self._trial
        if last is not None and last[0] is self.coded and torch.equal(last[1], steps):
            return last[2]
        result = self._subsample(steps)
        self._trial = (self.coded, steps, result)
        return result

    def _subsample(self, steps: torch.Tensor) -> tuple:
        sub = self.coded.sub
        st = steps.to(torch.float32).reshape(1, -1, len(self.idx), 1)
        if self._kept is None or self._kept[0] is not self.coded:
            self._kept = (self.coded, sub if len(self.idx) == sub.shape[2] else sub[:, :, self.idx, :])
        kept = self._kept[1]  # every plane in order (_frequency_index is sorted) where all are kept
        if self.dtype in INTEGER_DTYPES:
            v = kept / st
            q = v.abs().add_(THETA).floor_().mul_(torch.sign(v))  # sign(v) floor(|v| + theta), one temporary
            lim = INT_LIMITS[self.dtype]
            q = q.clamp_(-lim, lim)
            delta = fit_recon(v, q, dims=(0, 3))
            rec = (q - delta.reshape(1, -1, len(self.idx), 1) * torch.sign(q)) * st
        else:
            q = kept.to(COEFF_DTYPES[self.dtype][0])
            rec, delta = q.to(torch.float32), None
        if kept is sub:  # no plane dropped: the error is the kept planes' alone
            err = (rec - kept).double()
        else:
            err = -sub.double()
            err[:, :, self.idx, :] = (rec - kept).double()
        if delta is not None:  # a table row that costs the pack more than it saves becomes one value
            per_channel = q.shape[0] * q.shape[2] * q.shape[3] * self.coded.scale
            chosen = choose_recon(v, q, delta, steps, err.pow(2).sum(dim=(0, 2, 3)), per_channel)
            if not torch.equal(chosen, delta):
                delta = chosen
                rec = (q - delta.reshape(1, -1, len(self.idx), 1).float() * torch.sign(q)) * st
                if kept is sub:
                    err = (rec - kept).double()
                else:
                    err[:, :, self.idx, :] = (rec - kept).double()
        coded = err.pow(2).sum(dim=(2, 3)).mean(0) / self.coded.pixels  # (C,) normalized MSE per coded channel
        if self.coded.rotation is not None:
            err = torch.einsum("oc,rokw->rckw", self.coded.rotation.double(), err)
            if self.coded.weights is not None:
                err = err / self.coded.weights.double()[None, :, None, None]
            out = err.pow(2).sum(dim=(2, 3)).mean(0) / self.coded.pixels
        else:
            out = coded
        return out, coded, q, delta

    def land(self, goal_db: float, s: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel secant on log(step) until every output channel of the subsample is at goal_db:
        (steps (C,), quantized planes)."""
        u = torch.log(_vector(s, self.channels))
        steer = _Steer(nmse_of(goal_db), self.coded.rotation is not None)
        q = None
        for _ in range(10):
            out, coded, q, _ = self.subsample(torch.exp(u))
            if float((_db(out) - goal_db).abs().max()) < 0.05:
                break
            u = steer.next(u, out, coded)
        return torch.exp(u), q

    def raise_floors(self, coef: torch.Tensor, g: torch.Tensor, steps: torch.Tensor) -> bool:
        """Coarser per-frequency floors wherever the samples of `coef` (B, C, Hb, K, Wb; a volume's
        (B, C, Db, Hb, K, Wb)), coded with their
        stored ranges scaled by g (B, C) (what the per-sample floor does), would overflow the integers at
        `steps` (C, K). Whether any floor moved."""
        y = rescaled_by(coef, g, self.coded.rotation)
        per_kept = y.abs().amax(dim=(0, *range(2, y.dim() - 2), y.dim() - 1)).double()  # (C, K)
        need = per_kept * 1.02 / (INT_LIMITS[self.dtype] - 0.5)
        moved = bool((need > torch.maximum(self.floors, steps) * 1.0001).any())
        self.floors = torch.maximum(self.floors, need)
        self.raised = torch.maximum(self.raised, need)
        return moved


def _middle_db(nm: torch.Tensor) -> float:
    """The middle of the channels' dB range, over the channels with an error (+inf when none has one)."""
    d = _db(nm)
    d = d[torch.isfinite(d)]
    return float(d.max() + d.min()) / 2 if d.numel() else math.inf


class _Steer:
    """The next per-channel log-steps of a landing: a damped Newton step on log(error) per output channel.

    The model: each coded channel's error moves as step^kappa (kappa measured per coded channel between
    the last two points where its step moved, KAPPA before), and only the `free` share of an output
    channel's error moves at all: the items the per-sample floor lifts are pinned just inside its cap
    whatever the step (without that share the landing took every channel's error as movable, moved too
    little and kept channels 0.4 dB above the target). Without rotation the channels are independent and
    the step is that channel's own Newton step, at most a factor e. With one (`rotated`), a KLT mixes every
    coded channel into every output channel: the steps move together (`_common`), and the channel weights
    even the channels out (`_land`)."""

    def __init__(self, goal_nm: float, rotated: bool) -> None:
        self.goal, self.rotated = goal_nm, rotated
        self.points: list[tuple[torch.Tensor, torch.Tensor]] = []  # (log-steps, coded errors)
        self.below: tuple[float, float] | None = None  # the bracket on the mean log-step (see `_common`)
        self.above: tuple[float, float | None] | None = None
        self.last: tuple[float, float] | None = None
        self.kappa = torch.full((1,), KAPPA, dtype=torch.float64)

    def slopes(self) -> torch.Tensor:
        """d log(coded error) / d log(step) per coded channel, measured between the last two points where
        that channel's step moved by at least 5% (smaller moves measure quantization noise), kept in 0.3..3."""
        u1, e1 = self.points[-1]
        if len(self.points) >= 2:
            u0, e0 = self.points[-2]
            du = u1 - u0
            dl = torch.log(e1.clamp(min=1e-300)) - torch.log(e0.clamp(min=1e-300))
            moved = du.abs() > 0.05
            k = (dl / torch.where(moved, du, torch.ones_like(du))).clamp(0.3, 3.0)
            self.kappa = torch.where(moved, k, self.kappa)
        return self.kappa.expand_as(u1)

    def next(self, u: torch.Tensor, out: torch.Tensor, coded: torch.Tensor, free=None) -> torch.Tensor:
        """The next log-steps after measuring the output and coded channel errors at log-steps u. free: the
        share of each output channel's error that moves with the steps (default all of it)."""
        self.points.append((u, coded))
        kappa = self.slopes()
        goal = torch.full_like(out, self.goal)
        free = torch.ones_like(out) if free is None else torch.as_tensor(free, dtype=out.dtype).clamp(min=0.05)
        r = torch.log(goal.clamp(min=1e-300)) - torch.log(out.clamp(min=1e-300))  # > 0: room to spare
        # where the floor pins most of the error the model is only good near here (a coarser step leaves
        # more items below the floor, a finer one frees them): smaller moves there
        reach = 1.0 if float(free.min()) >= 0.5 else 0.4
        if not self.rotated:
            return u + (r / (free * kappa)).clamp(-reach, reach)
        # with a rotation the steps move together; the channel weights even the channels out (`_land`)
        return u + self._common(u, r, float((free * kappa).mean()), reach)

    def _common(self, u: torch.Tensor, r: torch.Tensor, gain: float, reach: float) -> float:
        """The move of every channel's log-step together that puts the middle of the output channels' range
        at the goal: regula falsi once the evaluations bracket it (bisection where a side is only known to
        be too coarse), a Newton step before. The error is not smooth in the steps (a coarser step leaves
        items the floor cannot lift without overflowing the integers, or lifts whole rotated samples for
        their neediest channel) and a Newton step alone cycled between the two sides or ran away: a
        coarser move that made the channels better marks that point too coarse."""
        m, mid = float(u.mean()), float(r.max() + r.min()) / 2
        last, self.last = self.last, (m, mid)
        if last is not None and m > last[0] + 0.01 and mid > last[1] + 0.02:
            self.above = (m, None) if self.above is None or m < self.above[0] else self.above
        elif mid > 0:
            self.below = (m, mid) if self.below is None or m > self.below[0] else self.below
        else:
            self.above = (m, mid) if self.above is None or m < self.above[0] else self.above
        if self.below is not None and self.above is not None and self.below[0] < self.above[0]:
            (m0, r0), (m1, r1) = self.below, self.above
            at = (m0 + m1) / 2 if r1 is None else m0 + r0 * (m1 - m0) / (r0 - r1)
            return min(max(at, m0 + 0.1 * (m1 - m0)), m1 - 0.1 * (m1 - m0)) - m
        step = max(-reach, min(reach, mid / max(gain, 0.05)))
        return min(step, (self.above[0] - m) / 2) if self.above is not None and step > 0 else step


def fit_recon(v: torch.Tensor, q: torch.Tensor, dims) -> torch.Tensor:
    """Per (channel, frequency) reconstruction offset in steps: delta = mean(|q| - |v|) over q != 0 (the
    least-squares centroid shift of the dead zone), rounded to 0.01 step, in (-0.99, 0.99)."""
    nz = q != 0
    num = torch.where(nz, q.abs() - v.abs(), torch.zeros_like(v)).sum(dims, dtype=torch.float64)
    delta = num / nz.sum(dims).clamp(min=1)
    return (torch.round(delta * 100) / 100).clamp(-0.99, 0.99)


def _sizer(codec: Mapping[str, Any] | str | None) -> Callable[[torch.Tensor, str, int, str], int]:
    """Bytes of quantized planes (R, C, K, Wb) after the lossless stage: the search compares settings by
    this. The stage (or "auto") says how it sizes them (`Stage.estimate_size`: the entropy coder has a
    one-pass estimate, a bytes codec encodes)."""
    stage = for_setting(codec)

    def size(q: torch.Tensor, dtype: str, cf: int, mask: str) -> int:
        raw = q.to(COEFF_DTYPES[dtype][0]).contiguous()
        raw = raw.view(torch.int16) if raw.dtype == torch.bfloat16 else raw
        return stage.estimate_size(raw.unsqueeze(2).numpy(), cf, mask, dtype in INTEGER_DTYPES)

    return size


def choose_stage(q: np.ndarray, spec: CodecSpec, codec: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The lossless stage config of a dct field from its quantized calibration coefficients: with "auto",
    the policy's choice (`dctdata.stages.auto`: the smaller of the fitted entropy coder and zstd-19 for
    integers); else `codec` as given."""
    return for_setting(codec).choose(q, spec.cf, spec.mask, spec.dtype in INTEGER_DTYPES, SUB_VALUES)


# Entry points ------------------------------------------------------------------------------------
def _one_thread(search: Callable[..., Calibration]) -> Callable[..., Calibration]:
    """`search` with torch's intra-op threads at one while it runs (restored after). The search is hundreds
    of passes over the subset or its subsample, each too short for a second thread to pay for waking it:
    on a busy machine every pass waited for a thread the scheduler had not run yet. One thread also makes
    the chosen spec independent of how many cores the machine has (no reduction split differently)."""

    @functools.wraps(search)
    def run(*args: Any, **kwargs: Any) -> Calibration:
        threads = torch.get_num_threads()
        if threads == 1:
            return search(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return search(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


@_one_thread
def calibrate_report(
    samples: torch.Tensor,
    *,
    cf: int | None = None,
    mask: str | None = None,
    quant: str | None = "int8",
    target_psnr: float | None = None,
    min_psnr: float | None = None,
    valid: torch.Tensor | None = None,
    codec: Mapping[str, Any] | str | None = AUTO,
    normalize: bool = False,
    rotation: bool | None = None,
    progress: Callable[[int, float], None] | None = None,
    where: Callable[[int], str] | None = None,
    max_error: float | None = None,
    max_rel_error: float | None = None,
    dataset_samples: int | None = None,
) -> Calibration:
    """Choose a CodecSpec for one `dct` field from a calibration subset (N, C, H, W) and say what it
    achieves there (see the module docstring). `calibrate` returns only the spec.

    target_psnr: dataset-level PSNR in dB; free knobs (cf, mask, quant left None) are searched for the
    smallest stored size after the `codec` lossless stage. min_psnr: the lowest PSNR any sample may
    have (default target - 0.4 dB). valid: bool mask broadcastable to the samples; pixels where it is
    False count nowhere (masked data). normalize: also store per-channel mean/std so `Decompress`
    outputs standardised values. rotation: for C > 1, True/False forces the channel rotation on/off (None:
    the smaller pack decides). progress(evaluation, dB) is called after each exact evaluation (dB: the
    worst channel). where(i) names sample i of the subset in errors (a pack passes the source's names).
    max_error / max_rel_error: a pointwise bound on every decoded value (absolute, or relative to each
    item's range; `dctdata.encoder.bounds`), with or without a target (both hold); without one, the step and
    the integer dtype left free are chosen by the stored size at the bound (`_bounded`). dataset_samples: how
    many samples the dataset holds (None: the subset is the dataset); a table stored once per pack is weighed
    against what it saves over that many samples (`dctdata.encoder.tables`).
    """
    t0 = time.perf_counter()
    bounded = max_error is not None or max_rel_error is not None
    x, valid, errors = _check_samples(samples, valid, bounded and target_psnr is None, keep64=bounded)
    given = x  # a float64 subset under a bound: its bound is calibrated on its float64 values
    if x.dtype == torch.float64 and target_psnr is not None:
        x = x.to(torch.float32)  # the target's search runs on the float32 values
    if dataset_samples is not None:
        dataset_samples = parse_int(dataset_samples, "dataset_samples", minimum=1)
    dataset_scale = 1.0 if dataset_samples is None else max(1.0, dataset_samples / x.shape[0])
    if target_psnr is not None:
        if not is_number(target_psnr):
            raise TypeError(f"target_psnr: expected a number of dB. Got {target_psnr!r}")
        parse_number(target_psnr, "target_psnr", above=0, below=200, expected="a PSNR in dB between 0 and 200")
        target_psnr = float(target_psnr)
        if min_psnr is None:
            min_psnr = target_psnr - FLOOR_BELOW_DB
    elif cf is None and max_error is None and max_rel_error is None:
        raise DctDataError(
            "calibrate: expected cf or target_psnr. Got neither (nothing to choose the chop factor from)"
        )
    if min_psnr is not None:
        min_psnr = parse_number(min_psnr, "min_psnr", above=0, below=200, expected="a PSNR in dB between 0 and 200")
    cfs = None if cf is None else parse_cf(cf)
    masks = None if mask is None else (transform3d.parse_mask3(mask) if x.dim() == 5 else parse_mask(mask))
    dtype = None if quant is None else parse_coeff_dtype(quant)
    side = item_side(x, valid, x.dim() - 2)
    stats = _stats(x, valid)
    result = None
    bounds = _parse_bounds(max_error, max_rel_error, dtype)
    if target_psnr is None and bounds:
        with _naming(where):
            spec, candidates = _bounded(x, valid, cfs or 8, masks or _masks(x.dim() - 2)[1], dtype, bounds, codec)
        evaluations = len(candidates)
    elif target_psnr is None:
        spec = _untargeted(x, side, cfs, masks or _masks(x.dim() - 2)[1], dtype or "float32", min_psnr)
        evaluations, candidates = 0, ()
    else:
        spec, evaluations, candidates, result = _search(
            x,
            side,
            target_psnr,
            min_psnr,
            cfs,
            masks,
            dtype,
            codec,
            rotation,
            progress,
            errors,
            where or (lambda i: f"calibration sample {i}"),
            dataset_scale,
        )
        if bounds:
            with _naming(where):
                spec, result = _both(
                    given, valid, side, spec, bounds, target_psnr, min_psnr, cfs, masks, dtype, codec, errors,
                    where or (lambda i: f"calibration sample {i}"), dataset_scale,
                )  # fmt: skip
    if normalize:
        spec = spec.replace(mean=stats["mean"], std=[max(s, 1e-12) for s in stats["std"]])
    return _summarize(given, valid, spec, target_psnr, codec, stats, candidates, t0, evaluations, errors, result)


@contextlib.contextmanager
def _naming(where: Callable[[int], str] | None):
    """A `BoundError` of the bounded search raised again with its sample named (`where`, or its index in the
    calibration subset): the encoder knows only its position in the batch."""
    from dctdata.encoder.bounds import BoundError

    try:
        yield
    except BoundError as exc:
        name = where(exc.sample) if where is not None else f"calibration sample {exc.sample}"
        named = BoundError(f"{name}: {exc}", exc.sample, exc.channel)
        named.item, named.detail = name, str(exc)  # for a caller that adds the field's name between them
        raise named from None


def _parse_bounds(max_error, max_rel_error, dtype: str | None) -> dict[str, float]:
    """The bound keywords of a CodecSpec (empty: no bound)."""
    bounds = {}
    for name, value in (("max_error", max_error), ("max_rel_error", max_rel_error)):
        if value is not None:
            bounds[name] = parse_number(value, name, above=0, expected="a positive number")
    if bounds:
        check_bound_dtype(dtype)
    return bounds


# Steps tried at a bound, in units of the normalized bound: pixel errors of a uniform quantizer of step s
# over 64 orthonormal coefficients spread like N(0, s^2/12), so the largest of a few thousand pixels is
# about 1.2 s; the search takes the one that stores least once items that miss are re-coded.
BOUND_STEPS = (0.7, 0.85, 1.0, 1.2, 1.45)
FINER_STEPS = (0.5, 0.35, 0.25, 0.0)  # when every one of them misses: finer, down to the floors alone


def _bounded(x, valid, cf, mask, dtype, bounds, codec) -> tuple[CodecSpec, tuple[Candidate, ...]]:
    """No target, a pointwise bound: plain rounding (the largest error of a coefficient is half a step), one
    step per channel relative to the finest normalized bound of the subset (`bound_ref`; every item's stored
    range scales to its own bound), the integer dtype and step that store least after re-coding the items
    that miss (int8's steps are floored where it would overflow, so it only wins at loose bounds)."""
    from dctdata.codec.lattice import detect as detect_lattice
    from dctdata.decoder.corrections import capacity
    from dctdata.encoder.bounds import BoundError, item_bounds

    _n, c, *size = x.shape
    dims = len(size)
    precision = "float64" if x.dtype == torch.float64 else None  # a float64 source's field decodes in float64
    probe = CodecSpec(cf=cf, mask=mask, dtype="int16", steps=[1.0] * c, side="range_mid", **_shape_kw(x.shape),
                      precision=precision, **bounds)  # fmt: skip
    bound, margin, rng = item_bounds(x, probe, valid)
    # items on an evenly spaced grid (`dctdata.codec.lattice`)
    rows, eff = detect_lattice(x, valid, bound, margin, probe.decode_dtype)
    if bool((rows[..., 0] > 0).any()):  # coded to half its spacing, then snapped
        probe, bound = probe.replace(lattice=True), eff
    rel = bound / rng.clamp(min=1e-300)
    ok = (rng > 0) & torch.isfinite(rel)
    ref = float(rel[ok].min()) if bool(ok.any()) else 1.0
    size_of = _sizer(codec)
    # the search compares re-coded encodings; the spec it keeps also stores corrections, which the encoder
    # weighs per sample against the re-coded one at coarser steps (`dctdata.encoder.quantize.choose_corrections`)
    cap = capacity(c * math.prod(size))
    # the largest |coefficient| of each (channel, frequency) on the subset, twice over for unseen samples,
    # at most what any item can reach: floors no coarser than overflow needs (coarse floors miss the bound)
    xn = normalize(x, item_side(x, valid, dims), dims)
    if dims == 3:  # (N, C, Db, Hb, K, Wb)
        seen = transform3d.compress(xn, cf, mask, DEFAULT_PAD).abs().amax(dim=(0, 2, 3, 5)).double()
    else:
        seen = compress(xn, cf, mask, DEFAULT_PAD).abs().amax(dim=(0, 2, 4)).double()
    reach = torch.minimum(2 * seen, worst_case_amax(cf, mask, None, c))
    candidates, best = [], None
    for dt in [dtype] if dtype is not None else ["int8", "int16"]:
        floors = reach / (INT_LIMITS[dt] - 0.5)
        for m in BOUND_STEPS:
            steps = torch.maximum(torch.full_like(floors, m * ref), floors)
            spec = probe.replace(dtype=dt, steps=steps.tolist(), bound_ref=ref)
            try:
                (q, _sd), _ = encode(x, spec, valid=valid)
            except BoundError:
                if best is None or best[0].dtype != dt:
                    break  # floors or overflow keep some item from its bound at this dtype, at any coarser step
                continue
            rows = as_rows(q, spec).permute(0, 2, 1, 3, 4).reshape(-1, c, spec.kept, spec.grid[-1])
            size = size_of(rows, dt, cf, mask)
            candidates.append(Candidate(cf, mask, dt, False, math.nan, size))
            if best is None or size < best[1]:
                best = (spec, size)
            elif best[0].dtype == dt:
                break  # sizes fall to one step and rise after it
    if best is None:  # finer steps than the search's (their re-codes overflowed), down to the floors alone
        dt = dtype or "int16"
        floors = reach / (INT_LIMITS[dt] - 0.5)
        for m in FINER_STEPS:
            steps = torch.maximum(floors, m * ref * torch.ones_like(floors))
            # "the floors alone" where a frequency has one; one the subset never reached (floor 0: near-constant
            # or grid data) keeps the finest step tried before, never a step of 0
            steps = torch.where(steps > 0, steps, torch.full_like(steps, FINER_STEPS[-2] * ref))
            spec = probe.replace(dtype=dt, bound_ref=ref, steps=steps.tolist())
            try:
                encode(x, spec, valid=valid)
            except BoundError as exc:
                failed = exc
                continue
            return spec.replace(corrections=cap), tuple(candidates)
        # re-coding alone holds no step (an item's finer re-code overflows the dtype): the corrections the
        # kept spec stores may hold it, at the search's steps (the first that holds)
        for m in BOUND_STEPS:
            spec = probe.replace(
                dtype=dt, bound_ref=ref, steps=torch.maximum(floors, m * ref * torch.ones_like(floors)).tolist()
            ).replace(corrections=cap)
            try:
                encode(x, spec, valid=valid)
            except BoundError:
                continue
            return spec, tuple(candidates)
        raise failed  # names the item that cannot hold its bound
    return best[0].replace(corrections=cap), tuple(candidates)


def _both(x, valid, side, landed, bounds, target, min_psnr, cf, mask, dtype, codec, errors, where, dataset_scale=1.0):
    """A target and a bound (both hold): the bound's own spec when it already reaches the target on the
    subset (a tight bound usually does), with the target's per-sample floor; else the landed spec with the
    items that miss the bound re-coded (int16 landed again when int8 cannot hold the bound)."""
    from dctdata.encoder.bounds import BoundError

    spec, _ = _bounded(x, valid, landed.cf, landed.mask, dtype, bounds, codec)
    (q, sd), _ = encode(x, spec, valid=valid)
    with torch.inference_mode():
        x_hat = Decompress(spec, normalize=False)((q, sd))
    if db(float(errors.channel_nmse(errors.nmse(x_hat)).max())) >= target:
        return spec.replace(min_psnr=min_psnr), None
    precision = "float64" if x.dtype == torch.float64 else None  # a float64 subset's field decodes in float64
    spec = landed.replace(**bounds, precision=precision)
    try:
        encode(x, spec, valid=valid)
    except BoundError:
        if dtype is not None or spec.dtype != "int8":
            raise
        x32 = x.to(torch.float32)
        found = _search(x32, side, target, min_psnr, cf, mask, "int16", codec, None, None, errors, where, dataset_scale)
        spec = found[0].replace(**bounds, precision=precision)
        encode(x, spec, valid=valid)  # a BoundError here names the item int16 cannot hold either
    return spec, None


def _stats(x: torch.Tensor, valid: torch.Tensor | None) -> dict[str, list[float]]:
    c = x.shape[1]
    flat = x.to(torch.float64).transpose(0, 1).reshape(c, -1)
    if valid is not None:
        ok = valid.transpose(0, 1).reshape(c, -1)
        rows = [flat[i][ok[i]] for i in range(c)]
        rows = [r if r.numel() else torch.zeros(1, dtype=torch.float64) for r in rows]
    else:
        rows = list(flat)
    return {
        "min": [float(r.min()) for r in rows],
        "max": [float(r.max()) for r in rows],
        "mean": [float(r.mean()) for r in rows],
        "std": [float(r.std(correction=0)) for r in rows],
    }


def _untargeted(x, side, cf, mask, dtype, min_psnr) -> CodecSpec:
    """No target: the given cf and dtype; integer dtypes get the finest steps no item can overflow."""
    c = x.shape[1]
    common = dict(cf=cf, mask=mask, **_shape_kw(x.shape), dtype=dtype, pad=DEFAULT_PAD)
    if dtype not in INTEGER_DTYPES:
        return CodecSpec(**common)
    steps = worst_case_amax(cf, mask, None, c) / (INT_LIMITS[dtype] - 0.5)
    return CodecSpec(**common, steps=steps.tolist(), side="range_mid")


def _search(x, side, target, min_psnr, cf, mask, dtype, codec, rotation, progress, errors, where, dataset_scale=1.0):
    _n, c = x.shape[:2]
    goal = target + MARGIN_DB
    budget = nmse_of(goal)
    size_of = _sizer(codec)
    rotations: list[torch.Tensor | None] = [] if rotation else [None]
    if c > 1 and rotation in (None, True):
        rotations.insert(0, _klt(normalize(x, side, x.dim() - 2)).to(torch.float32))  # volumes: (N, C, D, H, W)
    dtypes = [dtype] if dtype is not None else ["int8", "int16"]
    candidates, best = [], None
    base = None  # the subset's unrotated transform: made once, every rotation choice starts from it
    for rot in rotations:
        coded = _Coded(x, side, rot, base=base, dataset_scale=dataset_scale)
        base = coded.coef if rot is None else coded.base
        for cc, mm in _cf_candidates(coded, cf, mask, budget):
            for dt in dtypes:
                setting = _Setting(coded, cc, mm, dt)
                if dt not in INTEGER_DTYPES:
                    s = torch.ones(c, dtype=torch.float64)
                    out, _, q, _ = setting.subsample(s)
                else:
                    if (
                        dt == "int16"
                        and dtype is None
                        and best is not None
                        and best["dtype"] == "int8"
                        and not best["floors_bind"]
                    ):
                        continue  # int16 only pays where an int8 floor binds
                    s, _ = setting.land(goal, math.sqrt(12 * budget) * 1.4)
                    out, _, q, _ = setting.subsample(s)
                # a rotated setting's subsample landing moves its steps together and puts the middle of its
                # channels' range at the goal; `_land`'s channel weights then even the channels out around
                # it (their mean dB stays): that middle is what the setting reaches (over the channels with an
                # error: a constant channel has none)
                d = db(float(out.max())) if rot is None else _middle_db(out)
                size = size_of(q, dt, cc, mm)
                candidates.append(Candidate(cc, mm, dt, rot is not None, d, size))
                if d < goal - 0.3:
                    continue  # this setting cannot reach the target (its floors or precision cap the PSNR)
                floors_bind = bool((setting.floors > s[:, None]).any())
                total = _pack_bytes(setting, s, size)
                if best is None or total < best["size"]:
                    best = dict(setting=setting, s=s, size=total, dtype=dt, floors_bind=floors_bind)
    if best is None:
        reach = max((cand.subsample_psnr for cand in candidates), default=None)
        settings = f"cf={cf}, mask={mask}, quant={dtype}"
        raise DctDataError(
            f"target_psnr: expected a target these settings ({settings}) can reach on the calibration subset. "
            f"Got {target} dB"
            + ("" if reach is None else f" (best reachable {reach:.1f} dB)")
            + "; lower the target or free cf/quant"
        )
    used = 0

    def settle(setting: _Setting, s) -> tuple:
        """Land `setting`; where int8 cannot hold the target or the per-sample floor on some items (and
        quant is free), land int16 instead."""
        nonlocal used
        try:
            landed = _land_with_floor(x, side, setting, s, target, min_psnr, progress, errors, used)
        except (_Missed, _FloorMissed) as missed:
            if not (setting.dtype == "int8" and dtype is None):
                raise _missed_error(target, missed, where) from None
            setting = _Setting(setting.coded, setting.cf, setting.mask, "int16")
            s, _ = setting.land(goal, math.sqrt(12 * budget) * 1.4)
            try:
                landed = _land_with_floor(x, side, setting, s, target, min_psnr, progress, errors, used)
            except (_Missed, _FloorMissed) as missed16:
                raise _missed_error(target, missed16, where) from None
        used = landed[1]
        return landed

    spec, _, result, inside = settle(best["setting"], best["s"])
    if not inside and best["setting"].coded.rotation is not None and rotation is None:
        # A rotated sample's per-sample floor scales all its channels alike, lifting the channels that did not
        # need it too; where many items sit below the floor the landing then cannot put every channel in the
        # window. The same setting without the rotation lands per channel: it keeps the promise.
        unrotated = _Coded(x, side, None, base=base, dataset_scale=dataset_scale)
        plain = _Setting(unrotated, best["setting"].cf, best["setting"].mask, best["dtype"])
        try:
            alt = settle(plain, plain.land(goal, best["s"].mean())[0])
        except DctDataError:
            alt = None
        if alt is not None and alt[3]:
            spec, _, result, inside = alt
    return spec, used, tuple(candidates), result


def _missed_error(target: float, missed: Exception, where: Callable[[int], str]) -> DctDataError:
    spec = missed.spec
    hint = (
        "some items need finer steps than int8 holds: use quant int16, or leave quant unset"
        if spec.dtype == "int8"
        else "values too small or their range too narrow for float32 arithmetic? subtract an offset or rescale"
    )
    if isinstance(missed, _FloorMissed):
        low = missed.items
        names = "; ".join(f"{where(i)} channel {ch} at {p:.2f} dB" for i, ch, p in low[:5])
        more = f" and {len(low) - 5} more" if len(low) > 5 else ""
        return DctDataError(
            f"min_psnr: expected every item of the calibration subset at or above the per-sample floor "
            f"{spec.min_psnr:.2f} dB the manifest would record. Got {len(low)} below it after decoding with "
            f"cf={spec.cf} {spec.mask} {spec.dtype}: {names}{more} ({hint}; or set a lower min_psnr)"
        )
    return DctDataError(
        f"target_psnr: expected {target} dB on the calibration subset. Got {missed.psnr:.1f} dB after decoding with "
        f"cf={spec.cf} {spec.mask} {spec.dtype} ({hint})"
    )


def _cf_candidates(coded: _Coded, cf: int | None, mask: str | None, budget: float) -> list[tuple[int, str]]:
    """(cf, mask) pairs to try: the given ones, else the smallest whose dropped energy is at most
    DROP_SHARE of the budget, and cf 8."""
    reduced, full = _masks(coded.coef.dim() - 3)
    if cf is not None:
        return [(cf, mask or full)]
    masks = (mask,) if mask is not None else (reduced, full)
    e = coded.energy()
    out = [(8, full)] if mask in (None, full) else [(8, reduced)]
    for cc in range(1, 8):
        for mm in masks:
            keep = set(_frequency_index(cc, mm))
            dropped = float(e[:, [k for k in range(e.shape[1]) if k not in keep]].sum(1).max())
            if dropped <= DROP_SHARE * budget:
                return [(cc, mm), *out]
    return out


def _pack_bytes(setting: _Setting, s, size: int) -> float:
    """What a setting stores over the whole dataset: its subsample's coefficient bytes scaled up, and the step
    and reconstruction tables the manifest keeps once (`dctdata.encoder.tables`)."""
    if setting.dtype not in INTEGER_DTYPES:
        return size * setting.coded.scale
    recon = setting.subsample(s)[3]  # the last trial's: no new quantization
    return size * setting.coded.scale + table_bytes(setting.steps(s).tolist()) + table_bytes(recon.tolist())


def _spec_for(setting: _Setting, s, x_shape, recon: torch.Tensor | None, min_psnr) -> CodecSpec:
    rot = setting.coded.rotation
    integer = setting.dtype in INTEGER_DTYPES
    return CodecSpec(
        cf=setting.cf, mask=setting.mask, **_shape_kw(x_shape), dtype=setting.dtype, pad=DEFAULT_PAD,
        steps=setting.steps(s).tolist() if integer else None, theta=THETA if integer else None,
        recon=None if recon is None else recon.tolist(), rotation=None if rot is None else rot.tolist(),
        side="range_mid", min_psnr=min_psnr if integer else None,
        weights=None if setting.coded.weights is None else setting.coded.weights.tolist(),
    )  # fmt: skip


def _land_with_floor(x, side, setting: _Setting, s, target, min_psnr, progress, errors: ItemErrors, done: int = 0):
    """`_land`, then the per-sample floor checked on every item of the subset: where the floor could not
    lift an item because its finer effective step would overflow the integers, the frequencies that
    overflow get coarser floors (`_Setting.raise_floors`; usually the DC of items whose range one flat
    block sets) and the landing is redone, at most FLOOR_ROUNDS times. `_FloorMissed` names the items
    still below it."""
    evaluations = done
    for attempt in range(FLOOR_ROUNDS + 1):
        spec, used, result, inside = _land(x, side, setting, s, target, min_psnr, progress, errors, evaluations)
        evaluations += used
        nm = result[3]
        if spec.min_psnr is None:
            return spec, evaluations, result, inside
        cap = nmse_of(spec.min_psnr)
        low = errors.ok & (nm > cap)
        if not bool(low.any()):
            return spec, evaluations, result, inside
        steps = torch.as_tensor(spec.steps, dtype=torch.float64)
        needs = _lift_needs(setting, spec, low, nm, result[0][1], side)
        if attempt == FLOOR_ROUNDS or not setting.raise_floors(*needs):
            break
        s = steps.min(1).values  # the landed base steps are where the next landing starts
    items = [(int(i), int(ch), db(float(nm[i, ch]))) for i, ch in low.nonzero().tolist()]
    raise _FloorMissed(spec, sorted(items, key=lambda t: t[2]))


def _lift_needs(setting: _Setting, spec: CodecSpec, low, nm, floored_side, side):
    """(coefficients, range scales, steps) for `_Setting.raise_floors`: the coded coefficients of the
    samples with items below the floor (`low`), and the scale of their stored ranges that would lift those
    items (the scale the floor already applied, times what a power-1.4 model says is still missing)."""
    cap = nmse_of(spec.min_psnr)
    rows = low.any(1).nonzero().flatten()
    applied = (floored_side[rows, :, 0] / side[rows, :, 0]).double()
    more = torch.where(low[rows], (cap / nm[rows].clamp(min=1e-300)).pow(1 / 1.4) * 0.95, torch.ones_like(nm[rows]))
    if spec.rotation is not None:  # the floor scales a rotated sample's channels alike
        more = more.amin(1, keepdim=True).expand_as(more)
    coef = setting.coded.coef[rows][..., setting.idx, :]
    return coef, (applied * more).clamp(max=1.0), torch.as_tensor(spec.steps, dtype=torch.float64)


def _coded_nmse(x: torch.Tensor, x_hat: torch.Tensor, side: torch.Tensor, errors: ItemErrors, mixer) -> torch.Tensor:
    """(C,) mean squared error per coded channel (weighted and rotated by `mixer`) of the normalized samples
    (x - mid) / range."""
    pixels = (1,) * (x.dim() - 2)  # (H, W), or a volume's (D, H, W)
    d = (x_hat.to(torch.float32) - x) / side[..., 0].reshape(*side.shape[:2], *pixels)
    if errors.valid is not None:
        d = d.masked_fill(~errors.valid, 0.0)
    d = d * errors.ok.reshape(*errors.ok.shape, *pixels)
    e = torch.einsum("oc,nc...->no...", mixer.to(torch.float32), d)
    return e.double().pow(2).mean(dim=(0, *range(2, e.dim())))


def _land(x, side, setting: _Setting, s, target, min_psnr, progress, errors: ItemErrors, done: int = 0):
    """Exact evaluations of the whole subset, per-channel secant on log(step) until every channel's
    dataset PSNR is in the window: (spec, evaluations, (wire, overflow, x_hat, nmse) of the spec returned,
    whether it is in the window).

    Each evaluation is what encode + Decompress give (the per-sample floor included), from the subset's
    coefficients computed once (`_Coded`): quantize, decode, one float32 error pass (`ItemErrors`)."""
    goal = target + MARGIN_DB
    lo_ok, hi_ok = goal - TOL_DB, goal + TOL_DB
    integer = setting.dtype in INTEGER_DTYPES
    coef = setting.coded.coef[..., setting.idx, :].contiguous()  # the coded coefficients of (cf, mask)
    rotation = setting.coded.rotation
    u = torch.log(_vector(s, setting.channels))
    w = setting.coded.weights
    logw = torch.zeros(setting.channels, dtype=torch.float64) if w is None else torch.log(w.double())
    steer = _Steer(nmse_of(goal), setting.coded.rotation is not None)
    accepted = None
    spec, d = None, None
    raised = reweighed = 0
    for evaluation in range(1, MAX_EVALUATIONS + (WEIGHT_MOVES if rotation is not None else 0) + 1):
        steps = torch.exp(u)
        recon = setting.subsample(steps)[3] if integer else None  # offsets: a statistic of the subsample
        spec = _spec_for(setting, steps, x.shape, recon, min_psnr)
        q, over = quantize_per_sample(coef, spec, checked=True)
        with torch.inference_mode():
            x_hat = Decompress(spec, normalize=False)((q, side))
        nm = errors.nmse(x_hat)
        out = errors.channel_nmse(nm)
        coded = out if rotation is None else _coded_nmse(x, x_hat, side, errors, setting.coded.mixer)  # before lifts
        sd, free = side, None
        if spec.min_psnr is not None:
            # the per-sample floor re-codes the items below it, as the encoder will: what it lifts is pinned
            # just inside its cap and no longer moves with the steps (the `free` share does)
            q, sd, over, x_hat, nm = keep_floor(coef, spec, q, side.clone(), over, errors, x_hat=x_hat)
            lifted = errors.ok & (sd[..., 0] < side[..., 0])
            out = errors.channel_nmse(nm)
            low = errors.ok & (nm > nmse_of(spec.min_psnr))
            if bool(low.any()) and float((_db(out) - goal).abs().max()) < 0.3 and raised < FLOOR_ROUNDS:
                # items the floor cannot lift without overflowing the integers, near the landing: coarser
                # floors where they would overflow, and the same steps evaluated again with them
                if setting.raise_floors(*_lift_needs(setting, spec, low, nm, sd, side)):
                    raised += 1
                    continue
            free = 1.0 - errors.channel_nmse(torch.where(lifted, nm, torch.zeros_like(nm))) / out.clamp(min=1e-300)
        d = _db(out)
        if progress is not None:
            progress(done + evaluation, float(d.min()))
        result = ((q, sd), int(over.sum()), x_hat, nm)
        if not integer:
            return spec, evaluation, result, True
        if bool((d >= lo_ok).all()) and (accepted is None or float(u.sum()) > accepted[0]):
            accepted = (float(u.sum()), spec, result)  # the coarsest steps that keep every channel up
        if bool(((d >= lo_ok) & (d <= hi_ok)).all()):
            return spec, evaluation, result, True
        fin = torch.isfinite(d)  # a constant channel has no error to even out
        spread = float(d[fin].max() - d[fin].min()) if bool(fin.any()) else 0.0
        if rotation is not None and spread > 0.8 * (hi_ok - lo_ok) and reweighed < WEIGHT_MOVES:
            # a rotation mixes every channel into every coded channel: each channel's weight (codec v3) moves
            # its own error (as 1/w^2 at the same steps, 20 log10 w dB): 0.6 of that move, as the floor's
            # per-sample lifts follow each sample's neediest channel and take part of it back. The steps stay
            # put meanwhile, and what bracketed them is forgotten (it was for other weights).
            gap = torch.where(fin, d - d[fin].mean(), torch.zeros_like(d))
            logw = logw - (0.6 * gap * (math.log(10) / 20)).clamp(-0.3, 0.3)
            logw = logw - logw.mean()
            setting.set_weights(torch.exp(logw).to(torch.float32))
            steer.below = steer.above = steer.last = None
            coef = setting.coded.coef[..., setting.idx, :].contiguous()
            reweighed += 1
            continue
        u = steer.next(u, out, coded, free=free)
    if accepted is not None:  # never return a spec that misses the target on the calibration set
        return accepted[1], MAX_EVALUATIONS, accepted[2], False
    if spec.min_psnr is not None and spec.min_psnr < goal:
        # the integer floors cap every item below the target: a per-sample floor at the goal lifts each
        # item with its own finer effective step (a smaller stored range), as the encoder will on every sample
        spec = dataclasses.replace(spec, min_psnr=round(goal, 2))
        q, over = quantize_per_sample(coef, spec, checked=True)
        q, sd, over, x_hat, nm = keep_floor(coef, spec, q, side.clone(), over, errors)
        d = _db(errors.channel_nmse(nm))
        if bool((d >= lo_ok).all()):
            return spec, MAX_EVALUATIONS + 1, ((q, sd), int(over.sum()), x_hat, nm), False
    raise _Missed(spec, float(d.min()))


class _Missed(Exception):
    """The landing found no spec of its setting that reaches the target (the search tries int16 next)."""

    def __init__(self, spec: CodecSpec, psnr: float) -> None:
        super().__init__(spec, psnr)
        self.spec, self.psnr = spec, psnr


class _FloorMissed(Exception):
    """The landing reached the target but left items of the subset below the per-sample floor:
    `items` is [(sample, channel, dB)], lowest first."""

    def __init__(self, spec: CodecSpec, items: list[tuple[int, int, float]]) -> None:
        super().__init__(spec, items)
        self.spec, self.items = spec, items


def _summarize(x, valid, spec, target, codec, stats, candidates, t0, evaluations, errors, result=None) -> Calibration:
    """What the spec achieves on the subset (from the landing's last evaluation when there was one)."""
    if result is None:
        wire, overflow = encode(x, spec, valid=valid)
        with torch.inference_mode():
            x_hat = Decompress(spec, normalize=False)(wire)
        nm = errors.nmse(x_hat)
    else:
        wire, overflow, x_hat, nm = result
    per_item = [db(v) for v in nm[errors.ok].tolist()] or [math.inf]  # only constant items (a bound): no error
    q = wire[0] if isinstance(wire, tuple) else wire
    qn = (q.view(torch.int16) if q.dtype == torch.bfloat16 else q).contiguous().numpy()
    stage = choose_stage(qn, spec, codec)
    side_bytes = 0 if spec.side is None else 8 * spec.channels * x.shape[0]

    def sized() -> float:  # as the writer chunks them
        return (stored_bytes(get_stage(stage), qn, SUB_VALUES) + side_bytes) / x.shape[0]

    diff = (x_hat.to(torch.float32) - x).abs()
    if valid is not None:
        diff = diff.masked_fill(~valid, 0)
    if overflow:
        log.warning("calibration: %d coefficients overflow %s on the calibration subset", overflow, spec.dtype)
    return Calibration(
        spec=spec,
        target_psnr=target,
        dataset_psnr=db(float(nm[errors.ok].mean())) if bool(errors.ok.any()) else math.inf,
        psnr_min=min(per_item),
        psnr_median=statistics.median(per_item),
        max_error=float(diff.max()),
        overflow=overflow,
        sized=sized,
        raw_bytes_per_sample=int(np.prod(x.shape[1:])) * 4,
        codec=stage,
        stats=stats,
        candidates=tuple(candidates),
        seconds=time.perf_counter() - t0,
        evaluations=evaluations,
    )


def calibrate(
    samples: torch.Tensor,
    *,
    cf: int | None = None,
    mask: str | None = None,
    quant: str | None = "int8",
    target_psnr: float | None = None,
    **options: Any,
) -> CodecSpec:
    """CodecSpec for one `dct` field from a calibration subset (N, C, H, W) float32 (see
    `calibrate_report` for the options: min_psnr, valid, codec, normalize, progress)."""
    return calibrate_report(samples, cf=cf, mask=mask, quant=quant, target_psnr=target_psnr, **options).spec
