"""Pack-time calibration: choose CF, mask, wire dtype, steps and offsets from a calibration subset.

Why it works: the 8x8 DCT is orthonormal, so the squared error of a decoded block equals the summed
squared error of its 64 coefficients. A dropped frequency costs its energy; a kept one, quantized
with step s, costs about s^2/12. So a PSNR target (an MSE budget) maps directly to steps, and the
error of any candidate setting can be measured exactly in the coefficient domain without decoding.

PSNR here is always against each item's own value range (item = one channel of one sample, as in
`dctdata.metrics.psnr`). "Dataset-level PSNR" is 10 log10(1 / mean_i(MSE_i / range_i^2)): the PSNR
of the mean range-normalised MSE. It is never above the mean of the per-item PSNRs and is what
`target_psnr` promises for *every channel* separately (the worst channel decides, so a 1e-6-scale
channel next to a 300 K one keeps the target too), plus `margin_db` for items the calibration subset
did not see.

Step model, per channel c and kept frequency k:
    step[c, k] = max(scale * base[c], floor[c, k])
`base[c]` makes channels with different value ranges (mixed-scale channels, a 300 K temperature
next to a 0..1 mask) get the same range-normalised error: base[c] = 1 / sqrt(mean_n 1 / range[n, c]^2),
the rate-optimal split of one MSE budget over channels. `floor[c, k]` is what an integer dtype needs
so the calibration coefficients (with `headroom`) fit without clipping; where a floor binds (the DC
term at int8, strong edges) that frequency gets a coarser step and `scale` shrinks for the others:
per-frequency steps exactly where they win. The DC term gets an offset (the middle of its range),
so an int8 covers it symmetrically. `scale` is found by bisection for the target; with no target,
integer dtypes use the finest step that fits (the floors).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from typing import Any, Mapping

import torch

from dctdata.errors import DctDataError
from dctdata.layer import Decompress
from dctdata.lossless import DEFAULT_CODEC, get_codec
from dctdata.metrics import item_range, psnr
from dctdata.parse import is_number, parse_number
from dctdata.quantize import F32_SAFE_MAX, quantize
from dctdata.spec import COEFF_DTYPES, INTEGER_DTYPES, CodecSpec, parse_coeff_dtype
from dctdata.transform import BLOCK, MASKS, compress, kept_frequencies, parse_cf, parse_mask

log = logging.getLogger(__name__)

SEARCH_DTYPES = ("int8", "int16", "float16", "bfloat16")
DEFAULT_MARGIN_DB = 0.5
DEFAULT_HEADROOM = 1.1
_BISECT_STEPS = 18
_Z = 2.0  # one-sided ~97.5% bound for dataset estimates from the calibration subset


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One setting tried by the search, with what it achieved on the calibration subset."""

    cf: int
    mask: str
    dtype: str
    dataset_psnr: float
    stored_bytes: int
    feasible: bool


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What `calibrate_report` chose and what it predicts (measured on the calibration subset)."""

    spec: CodecSpec
    target_psnr: float | None
    dataset_psnr: float
    psnr_min: float
    psnr_median: float
    max_error: float
    overflow: int
    stored_bytes_per_sample: float
    raw_bytes_per_sample: int
    codec: dict
    stats: dict
    candidates: tuple[Candidate, ...] = ()

    @property
    def stored_ratio(self) -> float:
        """float32 bytes / stored bytes (after the lossless stage)."""
        return self.raw_bytes_per_sample / self.stored_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary for a manifest's pack report."""
        return {
            "target_psnr": self.target_psnr,
            "dataset_psnr": self.dataset_psnr,
            "psnr_min": self.psnr_min,
            "psnr_median": self.psnr_median,
            "max_error": self.max_error,
            "overflow": self.overflow,
            "stored_bytes_per_sample": self.stored_bytes_per_sample,
            "stored_ratio": self.stored_ratio,
            "transfer_ratio": self.spec.transfer_ratio,
            "codec": self.codec,
            "stats": self.stats,
        }


def dataset_psnr(reference: torch.Tensor, estimate: torch.Tensor) -> float:
    """10 log10(1 / mean_i(MSE_i / range_i^2)) over items (last two dims); constant items are skipped."""
    ref = reference.detach().to(torch.float64)
    est = estimate.detach().to(torch.float64)
    mse = (ref - est).pow(2).flatten(start_dim=ref.dim() - 2).mean(-1).flatten()
    rng = item_range(ref).flatten()
    ok = rng > 0
    if not bool(ok.any()):
        raise DctDataError("dataset_psnr: expected at least one item with max > min. Got only constant items")
    nmse = float((mse[ok] / rng[ok].pow(2)).mean())
    return math.inf if nmse == 0 else -10.0 * math.log10(nmse)


def _check_samples(samples: object) -> torch.Tensor:
    if not isinstance(samples, torch.Tensor):
        raise TypeError(f"samples: expected a torch.Tensor of shape (N, C, H, W). Got {type(samples).__name__}")
    if samples.dim() != 4 or samples.shape[0] < 1 or samples.numel() == 0:
        raise DctDataError(f"samples: expected shape (N, C, H, W) with N >= 1. Got {tuple(samples.shape)}")
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
    return samples.detach().to(torch.float32).cpu()


class _Problem:
    """The calibration subset in the coefficient domain, with everything the search reuses.

    Distortion estimates are upper confidence bounds for the whole dataset, not just the subset:
    mean_i(nmse_i) + Z * std_i(nmse_i) / sqrt(items), because the subset is a sample of items.
    Integer ranges get the same treatment: per-sample extremes are extrapolated by Z standard
    deviations and `headroom`, so unseen samples rarely overflow.
    """

    def __init__(self, samples: torch.Tensor, headroom: float, value_range: tuple[float, float] | None) -> None:
        n, c, h, w = samples.shape
        self.samples = samples
        self.n, self.c, self.h, self.w = n, c, h, w
        coeffs = compress(samples, 8, "square")  # (N, C, Hb, 64, Wb)
        hb, wb = coeffs.shape[2], coeffs.shape[4]
        self.pixels = hb * wb * BLOCK * BLOCK  # padded pixel count: coefficient-domain SSE / pixels = MSE
        rng = item_range(samples).to(torch.float64)  # (N, C)
        self.valid = rng > 0
        if not bool(self.valid.any()):
            raise DctDataError(
                "calibration samples: expected at least one item (sample channel) with max > min. Got only constant "
                "items, for which PSNR against the item's range is undefined; pack them with --quant none|fp16|bf16 "
                "and --cf (no --target-psnr), or as --field NAME=array"
            )
        safe = torch.where(self.valid, rng, torch.ones_like(rng))
        # per-item factor turning an SSE into MSE / range^2 (the quantity dataset PSNR averages)
        self.item_scale = (1.0 / (safe.pow(2) * self.pixels))[self.valid]  # (M,)
        self.item_channel = torch.arange(c).expand(n, c)[self.valid]  # (M,) channel of each item
        inv_r2 = torch.where(self.valid, 1.0 / safe.pow(2), torch.zeros_like(rng))
        per_c = inv_r2.sum(0) / self.valid.sum(0).clamp(min=1)
        self.base = torch.where(per_c > 0, 1.0 / per_c.clamp(min=1e-300).sqrt(), safe.max(0).values)  # (C,)
        energy = coeffs.to(torch.float64).pow(2).sum(dim=(2, 4))  # (N, C, 64)
        self.energy = energy[self.valid] * self.item_scale.unsqueeze(-1)  # (M, 64) item nmse if dropped
        dc = coeffs[:, :, :, 0, :].to(torch.float64)
        if value_range is not None:  # DC = 8 x block mean, so it lies in 8 x the value range
            lo = torch.full((c,), BLOCK * float(value_range[0]), dtype=torch.float64)
            hi = torch.full((c,), BLOCK * float(value_range[1]), dtype=torch.float64)
            dc_half = (hi - lo) / 2
        else:
            lo = _extreme(dc.amin(dim=(2, 3)), -1)
            hi = _extreme(dc.amax(dim=(2, 3)), 1)
            dc_half = (hi - lo) / 2 * headroom
        self.dc_offset = (lo + hi) / 2  # (C,)
        coeffs[:, :, :, 0, :] -= self.dc_offset.to(torch.float32).reshape(1, c, 1, 1)
        self.centered = coeffs
        self.amax = _extreme(coeffs.abs().amax(dim=(2, 4)).to(torch.float64), 1) * headroom  # (C, 64)
        self.amax[:, 0] = dc_half
        self._planes: dict[tuple[int, ...], torch.Tensor] = {}
        flat = samples.to(torch.float64).transpose(0, 1).reshape(c, -1)
        self.stats = {
            "min": flat.amin(1).tolist(),
            "max": flat.amax(1).tolist(),
            "mean": flat.mean(1).tolist(),
            "std": flat.std(1, correction=0).tolist(),
            "range_rms_harmonic": self.base.tolist(),
        }

    def index(self, cf: int, mask: str) -> list[int]:
        return [u * BLOCK + v for u, v in kept_frequencies(cf, mask)]

    def planes(self, idx: list[int]) -> torch.Tensor:
        key = tuple(idx)
        if key not in self._planes:
            self._planes = {key: self.centered[:, :, :, idx, :].contiguous()}  # keep one: memory stays 1x
        return self._planes[key]

    def _ucb(self, per_item: torch.Tensor) -> float:
        """Upper bound of the worst channel's mean item nmse: the target holds for every channel, so a
        small-range channel next to a large one (mixed scales) is not averaged away."""
        worst = 0.0
        for ch in self.item_channel.unique().tolist():
            v = per_item[self.item_channel == ch]
            m = v.numel()
            spread = float(v.std()) / math.sqrt(m) if m > 1 else 0.0
            bound = float(v.mean()) + _Z * spread
            if not math.isfinite(bound):  # inf/NaN (a float16 overflow): infeasible, never max()-ed away
                return math.inf
            worst = max(worst, bound)
        return worst

    def dropped_items(self, idx: list[int]) -> torch.Tensor:
        keep = torch.zeros(64, dtype=torch.bool)
        keep[idx] = True
        return self.energy[:, ~keep].sum(-1)

    def dropped(self, idx: list[int]) -> float:
        return self._ucb(self.dropped_items(idx))

    def floors(self, idx: list[int], dtype: str) -> torch.Tensor:
        """(C, K) smallest steps that keep the (extrapolated) coefficients inside the integer range."""
        if dtype not in INTEGER_DTYPES:
            return torch.zeros(self.c, len(idx), dtype=torch.float64)
        qmax = torch.iinfo(COEFF_DTYPES[dtype][0]).max - 0.5
        return (self.amax[:, idx] / qmax).clamp(min=1e-30)

    def steps(self, idx: list[int], dtype: str, scale: float) -> torch.Tensor:
        return torch.maximum(scale * self.base.unsqueeze(1).expand(self.c, len(idx)), self.floors(idx, dtype))

    def offsets(self, idx: list[int], dtype: str) -> torch.Tensor | None:
        if dtype == "float32":
            return None
        o = torch.zeros(self.c, len(idx), dtype=torch.float64)
        if 0 in idx:
            o[:, idx.index(0)] = self.dc_offset
        return o

    def quantized_error(self, idx: list[int], dtype: str, steps: torch.Tensor | None) -> float:
        """Upper bound of the dataset-level mean MSE / range^2: kept planes quantized + dropped energy."""
        x = self.planes(idx)  # (N, C, Hb, K, Wb), DC already centred
        if dtype == "float32":
            sse = torch.zeros(self.n, self.c, dtype=torch.float64)
        else:
            if steps is None:
                err = x.to(COEFF_DTYPES[dtype][0]).to(torch.float32) - x
            else:
                s = steps.to(torch.float32).reshape(1, self.c, 1, len(idx), 1)
                y = torch.round(x / s)
                if dtype in INTEGER_DTYPES:
                    info = torch.iinfo(COEFF_DTYPES[dtype][0])
                    y = y.clamp_(info.min, info.max)
                err = y.mul_(s).sub_(x)
            sse = err.pow_(2).sum(dim=(2, 3, 4), dtype=torch.float64)  # (N, C)
        per_item = sse[self.valid] * self.item_scale + self.dropped_items(idx)
        return self._ucb(per_item)

    def spec(
        self, cf: int, mask: str, dtype: str, steps: torch.Tensor | None, offsets: torch.Tensor | None
    ) -> CodecSpec:
        return CodecSpec(
            cf=cf,
            mask=mask,
            channels=self.c,
            height=self.h,
            width=self.w,
            dtype=dtype,
            steps=None if steps is None else steps.tolist(),
            offsets=None if offsets is None else offsets.tolist(),
        )


def _extreme(per_sample: torch.Tensor, sign: int) -> torch.Tensor:
    """(N, C[, K]) per-sample extremes -> (C[, K]) dataset extreme, extrapolated by _Z std devs."""
    if sign > 0:
        ext = per_sample.amax(0)
    else:
        ext = per_sample.amin(0)
    if per_sample.shape[0] > 1:
        ext = ext + sign * _Z * per_sample.std(0)
    return ext


def _parse_range(value_range) -> tuple[float, float] | None:
    if value_range is None:
        return None
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"value_range: expected a pair (lo, hi) of numbers. Got {value_range!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise DctDataError(f"value_range: expected finite lo < hi. Got {value_range!r}")
    return lo, hi


def _nmse(db: float) -> float:
    return 10.0 ** (-db / 10.0)


def _db(nmse: float) -> float:
    return math.inf if nmse <= 0 else -10.0 * math.log10(nmse)


def _fit(problem: _Problem, cf: int, mask: str, dtype: str, budget: float | None):
    """(steps, offsets, distortion) for one setting; budget None = finest steps the dtype allows.
    Returns None when the setting cannot reach the budget."""
    idx = problem.index(cf, mask)
    offsets = problem.offsets(idx, dtype)
    if dtype not in INTEGER_DTYPES:
        d = problem.quantized_error(idx, dtype, None)
        return (None, offsets, d) if budget is None or d <= budget else None
    if budget is None:
        steps = problem.floors(idx, dtype)
        return steps, offsets, problem.quantized_error(idx, dtype, steps)
    if problem.dropped(idx) >= budget:
        return None
    finest = problem.floors(idx, dtype)
    d_min = problem.quantized_error(idx, dtype, finest)
    if d_min > budget:
        return None
    # bisection on log(scale): distortion grows with scale; find the largest scale within budget
    s0 = math.sqrt(12.0 * budget)  # uniform-quantizer estimate, relative to base[c]
    lo, hi = math.log(s0) - 8.0, math.log(s0) + 3.0
    best = (finest, d_min)
    if problem.quantized_error(idx, dtype, problem.steps(idx, dtype, math.exp(lo))) > budget:
        return finest, offsets, d_min
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        steps = problem.steps(idx, dtype, math.exp(mid))
        d = problem.quantized_error(idx, dtype, steps)
        if d <= budget:
            lo, best = mid, (steps, d)
        else:
            hi = mid
    return best[0], offsets, best[1]


def _stored_bytes(problem: _Problem, spec: CodecSpec, codec: Mapping[str, Any] | None) -> tuple[int, int]:
    """(bytes after the lossless stage for the whole subset, overflow count)."""
    q, overflow = quantize(compress(problem.samples, spec.cf, spec.mask), spec)
    raw = q.contiguous().numpy().tobytes() if q.dtype != torch.bfloat16 else q.view(torch.int16).numpy().tobytes()
    c = get_codec(codec)
    return (len(c.encode(raw)) if c is not None else len(raw)), overflow


def _choices(cf, mask, quant, target_psnr):
    cfs = range(1, BLOCK + 1) if cf is None else (parse_cf(cf),)
    if mask is not None:
        masks = (parse_mask(mask),)
    else:
        masks = MASKS if target_psnr is not None else ("square",)
    dtypes = SEARCH_DTYPES if quant is None else (parse_coeff_dtype(quant),)
    out = []
    for c in cfs:
        for m in masks:
            if m == "triangle" and c == 1:
                continue  # same single DC coefficient as square
            for d in dtypes:
                out.append((c, m, d))
    return out


def calibrate_report(
    samples: torch.Tensor,
    *,
    cf: int | None = None,
    mask: str | None = None,
    quant: str | None = "int8",
    target_psnr: float | None = None,
    margin_db: float = DEFAULT_MARGIN_DB,
    headroom: float = DEFAULT_HEADROOM,
    codec: Mapping[str, Any] | None = DEFAULT_CODEC,
    normalize: bool = False,
    value_range: tuple[float, float] | None = None,
) -> Calibration:
    """Choose a CodecSpec for one `dct` field from a calibration subset (N, C, H, W) and say what it
    achieves there. See the module docstring for the model; `calibrate` returns only the spec.

    target_psnr: dataset-level PSNR (dB) to reach with `margin_db` to spare; free knobs (cf, mask,
    quant left None) are searched for the smallest stored size after the `codec` lossless stage.
    Without a target, cf is required and integer dtypes get the finest steps that fit their range.
    normalize: also store per-channel mean/std so `Decompress` outputs standardised values.
    value_range: (lo, hi) every value of the field lies in, when the source dtype says so (uint8
    photos scaled to [0, 1]); it bounds the DC term exactly instead of extrapolating it.
    """
    x = _check_samples(samples)
    if target_psnr is not None:
        if not is_number(target_psnr):
            raise TypeError(f"target_psnr: expected a number of dB. Got {target_psnr!r}")
        parse_number(target_psnr, "target_psnr", above=0, below=200, expected="a PSNR in dB between 0 and 200")
    elif cf is None:
        raise DctDataError(
            "calibrate: expected cf or target_psnr. Got neither (nothing to choose the chop factor from)"
        )
    if not isinstance(margin_db, (int, float)) or margin_db < 0:
        raise DctDataError(f"margin_db: expected a number >= 0. Got {margin_db!r}")
    if not isinstance(headroom, (int, float)) or headroom < 1:
        raise DctDataError(f"headroom: expected a number >= 1. Got {headroom!r}")
    problem = _Problem(x, float(headroom), _parse_range(value_range))
    budget = None if target_psnr is None else _nmse(target_psnr + margin_db)
    candidates, best = [], None
    for c, m, d in _choices(cf, mask, quant, target_psnr):
        fit = _fit(problem, c, m, d, budget)
        if fit is None:
            candidates.append(Candidate(c, m, d, math.nan, 0, False))
            continue
        steps, offsets, dist = fit
        spec = problem.spec(c, m, d, steps, offsets)
        nbytes, _ = _stored_bytes(problem, spec, codec)
        candidates.append(Candidate(c, m, d, _db(dist), nbytes, True))
        if best is None or nbytes < best[1]:
            best = (spec, nbytes)
    if best is None:
        reach = max((cand.dataset_psnr for cand in candidates if cand.feasible), default=None)
        settings = f"cf={cf}, mask={mask}, quant={quant}"
        raise DctDataError(
            f"target_psnr: expected a target these settings ({settings}) can reach on the calibration subset "
            f"with a {margin_db} dB margin. Got {target_psnr} dB"
            + ("" if reach is None else f" (best reachable {reach:.1f} dB)")
            + "; lower the target or free cf/quant"
        )
    spec, nbytes = _verify(problem, best[0], target_psnr, margin_db)
    if normalize:
        spec = spec.replace(mean=problem.stats["mean"], std=[max(s, 1e-12) for s in problem.stats["std"]])
    return _summarize(problem, spec, target_psnr, codec, candidates)


def _verify(problem: _Problem, spec: CodecSpec, target_psnr, margin_db):
    """Decode the subset for real; if padding made the pixel-domain PSNR miss the target, refine steps."""
    if target_psnr is None:
        return spec, None
    for attempt in range(5):
        q, _ = quantize(compress(problem.samples, spec.cf, spec.mask), spec)
        x_hat = Decompress(spec)(q)
        got = min(  # per channel, as the budget is (see _Problem._ucb)
            dataset_psnr(problem.samples[:, ch : ch + 1], x_hat[:, ch : ch + 1])
            for ch in range(problem.c)
            if bool(problem.valid[:, ch].any())
        )
        deficit = target_psnr + margin_db - got
        if deficit <= 0 or spec.steps is None or attempt == 4:
            break
        idx = problem.index(spec.cf, spec.mask)
        floors = problem.floors(idx, spec.dtype)
        steps = torch.tensor(spec.steps, dtype=torch.float64) * 10 ** (-(deficit + 0.05) / 20)
        steps = torch.maximum(steps, floors)
        spec = spec.replace(steps=steps.tolist())
    if got < target_psnr:  # the model's promise failed for real (float32 precision, subnormal data): say so
        raise DctDataError(
            f"target_psnr: expected {target_psnr} dB on the calibration subset. Got {got:.1f} dB after decoding with "
            f"cf={spec.cf} {spec.mask} {spec.dtype} (values too small or their range too narrow for float32 "
            "arithmetic? "
            f"value range {min(problem.stats['min']):.3g}..{max(problem.stats['max']):.3g}: subtract an offset or "
            "rescale)"
        )
    return spec, None


def _summarize(problem: _Problem, spec: CodecSpec, target_psnr, codec, candidates) -> Calibration:
    q, overflow = quantize(compress(problem.samples, spec.cf, spec.mask), spec)
    x_hat = Decompress(spec, normalize=False)(q)
    per_item = psnr(problem.samples, x_hat).flatten()[problem.valid.flatten()].tolist()
    nbytes, _ = _stored_bytes(problem, spec, codec)
    if overflow:
        log.warning("calibration: %d coefficients overflow %s on the calibration subset", overflow, spec.dtype)
    return Calibration(
        spec=spec,
        target_psnr=target_psnr,
        dataset_psnr=dataset_psnr(problem.samples, x_hat),
        psnr_min=min(per_item),
        psnr_median=statistics.median(per_item),
        max_error=float((problem.samples.to(torch.float64) - x_hat.to(torch.float64)).abs().max()),
        overflow=overflow,
        stored_bytes_per_sample=nbytes / problem.n,
        raw_bytes_per_sample=problem.c * problem.h * problem.w * 4,
        codec=dict(codec or {}),
        stats=problem.stats,
        candidates=tuple(candidates),
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
    """CodecSpec for one `dct` field from a calibration subset (N, C, H, W) float32.

    Explicit cf/quant are kept; with `target_psnr` the free ones (None) are searched for the smallest
    stored size that reaches the target (dataset-level PSNR, see `dataset_psnr`). Options go to
    `calibrate_report` (margin_db, headroom, codec, normalize).
    """
    return calibrate_report(samples, cf=cf, mask=mask, quant=quant, target_psnr=target_psnr, **options).spec
