"""What a pack decides before it writes anything, shared by `pack` (random-access sources) and the
incremental `Writer` (streams): the validated settings, each field's kind and CodecSpec (calibration
included), and, at the end, the manifest's error figures.

Field kinds (`kind_and_reason`, in `dctdata.format.kinds` beside the kinds it names; each kind's checks there
too, so this module asks a kind instead of comparing names): numeric arrays with >= 2 dims per sample -> `dct`
(integers only with a lossy setting for them: a target PSNR, --quant, --cf or a pointwise bound, and only when
their calibration subset holds more than `FEW_VALUES` distinct values: fewer is a mask or label map, kept
exact), integer scalars -> `label`, everything else -> `array`; a source may default decoded images to `dct`
(under a lossy setting only: integer images without one are exact, as the same integers from any other
source); `fields={"mask": "array"}` overrides. Each field carries the reason for its kind, which the pack
summary prints. A `dct` field's CodecSpec comes from cf/mask/quant directly, or from `dctdata.encoder.calibrate` on a
calibration subset when quant is int8/int16 or the field has a target PSNR or a bound: either way from its
`FieldPlan`, the settings that concern the field resolved once (`field_plan`) and taken whole.

Targets: `target_psnr=40` (every dct field), `{"noisy": 40, "clean": 45}` or the CLI's
`noisy=40,clean=45` (per field; a bare number is the default of the fields not named). A dct field
without a target gets the explicit settings, or the defaults (cf=4, square, float32); a pack without any
fidelity setting gets `DEFAULT_TARGET_PSNR` for its float fields instead (`no_fidelity_flag`).

Calibration subset: for a random-access source, evenly spaced samples (at least 64, more when they are
small: up to 4M values; `calibration_indices`); for a stream, its first samples, as many (the
`Writer`); or an explicit `calibration=` set (any object `pack` takes). Masked fields are calibrated on
the filled values (`dctdata.preprocess.masking`).

Layout guard: a 3-D per-sample array whose last axis is small next to a large first one ((256, 256, 1),
(32, 32, 3)) is almost surely (H, W, C) read as (C, H, W): an error naming `--channels-last`, unless
the caller said `channels_last=False` (`--no-channels-last`) on purpose.

Volumes (`dims=3`, `--dims 3`): a dct field's samples are (D, H, W) or (C, D, H, W), coded as 8x8x8 blocks
(`dctdata.codec.transform3d`). Without it a (D, H, W) sample is D channels of 2-D blocks (the default, and what
older packs did); the pack summary offers `--dims 3` when a field looks like a volume
(`dctdata.report.volume_hint`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dctdata.codec.metrics import pooled_psnr
from dctdata.codec.spec import INTEGER_DTYPES, CodecSpec
from dctdata.errors import DctDataError
from dctdata.format import ChannelStats, FieldSpec, FieldStats, Manifest, kinds
from dctdata.format.fields import has_side, side_field, user_fields
from dctdata.format.kinds import FEW_VALUES, kind_and_reason
from dctdata.format.manifest import figure
from dctdata.kinds import FieldKind
from dctdata.preprocess.masking import NanPolicy, valid_name
from dctdata.preprocess.parts import check_float32, prepare_dct
from dctdata.preprocess.sources import Source
from dctdata.report import FIDELITY_OVER_TIME, StepFigures
from dctdata.settings import PackSettings, Targets, parse_field_overrides, parse_nan, parse_targets, parse_valid
from dctdata.stages import AUTO, DEFAULT_CODEC

log = logging.getLogger(__name__)

DEFAULT_CF = 4
CALIBRATION_SAMPLES = 64
CALIBRATION_VALUES = 1 << 22


# The target a float dct field gets when the pack names no fidelity at all (no --cf, --mask, --quant,
# --target-psnr, --max-error or --max-rel-error): calibration reaches it on the dataset and records the
# per-sample floor it found. The old default (cf=4 float32) promised nothing: its PSNR depended on the data.
# Integer fields without a flag are stored exactly, from every source.
DEFAULT_TARGET_PSNR = 40.0
# What such a field gets where the target cannot be calibrated (constant samples, a few pixels): every
# frequency as float32, near-exact.
FALLBACK_CF = 8


def no_fidelity_flag(settings: PackSettings) -> bool:
    """Whether a pack names no fidelity setting at all (then `DEFAULT_TARGET_PSNR` holds for float fields)."""
    s, targets = settings, settings.targets
    return (
        s.cf is None and s.mask is None and s.quant is None and targets.default is None and not targets.fields
        and not s.bounds
    )  # fmt: skip


def may_calibrate(settings: PackSettings) -> bool:
    """Whether a dct field may be calibrated under the settings (`FieldPlan.calibrates` for a field of
    them): a target, a bound, integer coefficients, or no fidelity setting at all (the default target). The
    `Writer` holds a calibration window first when it is."""
    targets = settings.targets
    asked = targets.default is not None or bool(targets.fields) or bool(settings.bounds)
    return asked or settings.dtype in INTEGER_DTYPES or no_fidelity_flag(settings)


# Fields ------------------------------------------------------------------------------------------
def default_kind(shape: tuple[int, ...], dtype: np.dtype, lossy: bool = False) -> FieldKind:
    """The kind a field gets when nothing names it (`kind_and_reason` says why)."""
    return kind_and_reason("field", shape, dtype, lossy=lossy)[0]


def looks_channels_last(shape: tuple[int, ...], dims: int = 2) -> bool:
    """(H, W, C) read as (C, H, W) ((D, H, W, C) as (C, D, H, W) for a volume): a last axis of at most 4 after
    a first axis of 16 or more."""
    return len(shape) == dims + 1 and shape[-1] <= 4 and shape[0] >= 16 and shape[0] > 4 * shape[-1]


def dct_shape(
    name: str, shape: tuple[int, ...], where: str, channels_last: bool | None = None, dims: int = 2
) -> tuple[int, ...]:
    """Per-sample shape of a dct field as (C, H, W) (a 1-D sample is one row, (1, 1, L)), or (C, D, H, W)
    with dims=3; refuses the likely channels-last mistake."""
    if dims == 3:
        return _volume_shape(name, shape, where, channels_last)
    if len(shape) == 1:
        return (1, 1, *shape)
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 3:
        if channels_last is None and looks_channels_last(shape):
            raise DctDataError(
                f"{where}: field {name!r}: expected (C, H, W) per sample for kind dct. Got {shape}, which reads as "
                f"{shape[0]} channels of {shape[1]} x {shape[2]}: channels-last data? (use --channels-last; "
                "--no-channels-last / channels_last=False keeps the layout as it is)"
            )
        return shape
    hint = " (a volume? --dims 3 packs (D, H, W) and (C, D, H, W) samples as 8x8x8 blocks)" if len(shape) == 4 else ""
    raise DctDataError(
        f"{where}: field {name!r}: expected 1, 2 or 3 dims per sample for kind dct ((L,), (H, W) or (C, H, W)). Got "
        f"{shape}" + hint
    )


def _volume_shape(name: str, shape: tuple[int, ...], where: str, channels_last: bool | None) -> tuple[int, ...]:
    if len(shape) == 3:
        return (1, *shape)
    if len(shape) == 4:
        if channels_last is None and looks_channels_last(shape, 3):
            raise DctDataError(
                f"{where}: field {name!r}: expected (C, D, H, W) per sample for --dims 3. Got {shape}, which reads as "
                f"{shape[0]} channels of {shape[1]} x {shape[2]} x {shape[3]}: channels-last data? (use "
                "--channels-last; --no-channels-last / channels_last=False keeps the layout as it is)"
            )
        return shape
    raise DctDataError(
        f"{where}: field {name!r}: expected 3 or 4 dims per sample for kind dct with --dims 3 ((D, H, W) or "
        f"(C, D, H, W)). Got {shape}"
    )


def distinct_values(cal: Source, name: str, sample_values: int) -> int | None:
    """How many distinct values field `name` holds on its calibration subset (the samples a dct field would
    be calibrated on); None when the calibration set lacks the field (the dct path then says so)."""
    if name not in cal.probe():
        return None
    return len(np.unique(np.asarray(cal.take(calibration_indices(len(cal), sample_values))[name])))


def calibration_count(sample_values: int) -> int:
    """How many samples a calibration subset holds (before capping at the dataset size)."""
    return max(CALIBRATION_SAMPLES, CALIBRATION_VALUES // max(1, sample_values))


def calibration_indices(n: int, sample_values: int) -> list[int]:
    """Evenly spaced samples to calibrate on: at least CALIBRATION_SAMPLES, more when samples are
    small (up to CALIBRATION_VALUES values), since the integer ranges come from the tails."""
    k = min(n, calibration_count(sample_values))
    return sorted({int(i) for i in np.linspace(0, n - 1, k)})


# The per-field plan ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FieldPlan:
    """What the settings ask of one dct field, resolved once (`field_plan`) from the `PackSettings` and the
    source's field: `_codec` and the calibration take it whole.

    shape: per-sample (C, H, W) or (C, D, H, W). cf, mask: None where calibration chooses them (a target or a
    bound); otherwise the settings' values or their defaults. dtype: the coefficient dtype of --quant (None:
    calibration chooses; float32 without calibration). target: the PSNR to reach (None: none). bound: the
    CodecSpec's max_error/max_rel_error keywords (empty: none). lossless: the lossless stage, "auto" or its
    config. nan: the NaN policy. mask_field: the field holding its validity mask; mask_made: the pack makes
    it (--nan mask), so a calibration set does not hold it. fallback: the target is the default one (no
    fidelity setting was named): where calibration cannot reach it, every frequency is kept (`FALLBACK_CF`).
    """

    name: str
    shape: tuple[int, ...]
    cf: int | None
    mask: str | None
    dtype: str | None
    target: float | None
    bound: Mapping[str, float]
    lossless: Mapping[str, Any] | str
    nan: NanPolicy
    mask_field: str | None = None
    mask_made: bool = False
    fallback: bool = False

    @property
    def calibrates(self) -> bool:
        """Whether the CodecSpec comes from the calibration subset: a target, a bound, or integer
        coefficients (whose steps come from the subset's ranges)."""
        return self.target is not None or bool(self.bound) or self.dtype in INTEGER_DTYPES

    @property
    def stage(self) -> dict[str, Any]:
        """The lossless stage of the field when it is not calibrated ("auto" is zstd-9 then)."""
        return fixed_stage(self.lossless)

    def fixed_spec(self, cf: int | None = None, mask: str | None = None, dtype: str | None = None) -> CodecSpec:
        """The CodecSpec of the settings as given (cf, mask, dtype: instead of the plan's)."""
        c, *size = self.shape
        return CodecSpec(
            cf=cf or self.cf, channels=c, mask=mask or self.mask, dtype=dtype or self.dtype or "float32",
            **dict(zip(("depth", "height", "width")[3 - len(size) :], size)),
        )  # fmt: skip


def fixed_stage(lossless: Mapping[str, Any] | str) -> dict[str, Any]:
    """The lossless stage of a field that is not calibrated: the setting's, zstd-9 for "auto"."""
    return dict(DEFAULT_CODEC) if lossless == AUTO else dict(lossless)


def field_plan(
    settings: PackSettings, name: str, shape: tuple[int, ...], mask_field: str | None = None, mask_made: bool = False
) -> FieldPlan:
    """The plan of dct field `name` of per-sample `shape` ((C, H, W) or (C, D, H, W)) under the settings."""
    target, bound = settings.targets.get(name), settings.bounds.get(name)
    fallback = no_fidelity_flag(settings)
    if fallback:  # float fields, and integers made dct by --field NAME=dct
        target = DEFAULT_TARGET_PSNR
    searches = target is not None or bool(bound)  # cf and mask left free are chosen by calibration
    return FieldPlan(
        name, tuple(shape),
        cf=settings.cf if settings.cf is not None or searches else DEFAULT_CF,
        mask=settings.mask or (None if searches else "square"),
        dtype=settings.dtype, target=target, bound=bound, lossless=settings.lossless_stage, nan=settings.nan_policy,
        mask_field=mask_field, mask_made=mask_made, fallback=fallback,
    )  # fmt: skip


def _calibrate(
    x: torch.Tensor,
    valid: np.ndarray | None,
    plan: FieldPlan,
    where,
    quiet: bool,
    dataset_samples: int | None = None,
) -> tuple[CodecSpec, dict]:
    """(spec, lossless stage) of one dct field from its calibration subset `x` (invalid pixels do not count),
    with a progress bar on a terminal while the search runs; `where(i)` names subset sample i."""
    from tqdm.auto import tqdm

    from dctdata.encoder.bounds import BoundError
    from dctdata.encoder.calibrate import calibrate_report

    v = None if valid is None else torch.from_numpy(np.ascontiguousarray(valid))
    bar = tqdm(desc=f"calibrate {plan.name}", unit="eval", disable=quiet or not sys.stderr.isatty(), leave=False)

    def progress(evaluation: int, psnr_db: float) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{psnr_db:.2f} dB")

    try:
        report = calibrate_report(
            x, cf=plan.cf, mask=plan.mask, quant=plan.dtype, target_psnr=plan.target, valid=v, codec=plan.lossless,
            progress=progress, where=where, dataset_samples=dataset_samples, **plan.bound,
        )  # fmt: skip
    except BoundError as exc:  # the item the bound cannot hold, named with its field as the encoder's are
        item = getattr(exc, "item", f"calibration sample {exc.sample}")
        detail = getattr(exc, "detail", exc)
        raise BoundError(f"{item}: field {plan.name!r}: {detail}", exc.sample, exc.channel) from None
    finally:
        bar.close()
    return report.spec, report.codec


def _check_names(settings: PackSettings, probe: Mapping[str, Any]) -> None:
    """Every field a setting names is a field of the source."""
    bounds = settings.bounds
    checks = [("--field", settings.overrides), ("--target-psnr", settings.targets.fields)]
    checks += [("--valid", settings.valid_masks)]
    checks += [(flag, [n for n, f in bounds.named.items() if f == flag]) for flag in ("--max-error", "--max-rel-error")]
    for what, names in checks:
        unknown = sorted(set(names) - set(probe))
        if unknown:
            raise DctDataError(
                f"{what} {unknown[0]}: expected one of the source's fields {list(probe)}. Got no such field"
            )
    for name, m in settings.valid_masks.items():
        if m not in probe:
            raise DctDataError(
                f"--valid {name}={m}: expected a mask field among the source's fields {list(probe)}. Got no such field"
            )


def _lossy(settings: PackSettings, name: str, *, bound: bool = True) -> bool:
    """Whether the settings ask for lossy coding of field `name`: --cf, an integer or half --quant, its target
    or (`bound`) its pointwise bound (a bound asks as a target does: issue 46, int16 with --max-error was exact)."""
    asked = settings.cf is not None or settings.dtype not in (None, "float32") or settings.targets.get(name) is not None
    return asked or (bound and bool(settings.bounds.get(name)))


def _kind(source: Source, cal: Source, settings: PackSettings, name: str, shape, dtype) -> tuple[FieldKind, str]:
    """(kind, why) of source field `name` under the settings (`kind_and_reason`), the pack's rules applied."""
    lossy, overrides = _lossy(settings, name), settings.overrides
    source_default = source.default_kinds.get(name)
    coded_default = source_default is not None and kinds.get(source_default).coded
    if coded_default and dtype.kind in "iu" and not lossy and name not in overrides:
        source_default = None  # integer images follow the rule of every other source: exact without a flag
    mask_of = next((k for k, m in settings.valid_masks.items() if m == name), None)
    distinct = None
    if lossy and dtype.kind in "iu" and len(shape) >= 2 and name not in overrides and mask_of is None:
        if name not in source.default_kinds:
            distinct = distinct_values(cal, name, math.prod(shape))
    by_bound = bool(settings.bounds.get(name)) and not _lossy(settings, name, bound=False)
    kind, reason = kind_and_reason(
        name, shape, dtype, lossy=lossy, override=overrides.get(name),
        source_default=source_default, mask_of=mask_of, distinct=distinct, by_bound=by_bound,
    )  # fmt: skip
    if dtype.kind not in "biuf":
        raise DctDataError(f"{source.description}: field {name!r}: expected a numeric dtype. Got {dtype}")
    kinds.get(kind).check_source(name, shape, dtype, source.description)
    if not kinds.get(kind).coded:  # a target, a bound or a mask asks for a coded field
        named = settings.bounds.named | {n: "--target-psnr" for n in settings.targets.fields}
        named |= {n: "--valid" for n in settings.valid_masks}  # the flag that names it, --valid first
        if name in named:
            raise DctDataError(f"{named[name]} {name}: expected a {kinds.CODED} field. Got kind {kind!r}")
    return kind, reason


def _mask_field(settings: PackSettings, name: str, probe: Mapping[str, Any], where: str) -> tuple[str | None, bool]:
    """(the field holding dct field `name`'s validity mask or None, whether the pack makes it: --nan mask)."""
    mask_field = settings.valid_masks.get(name)
    if mask_field is not None or not settings.nan_policy.stores_mask:
        return mask_field, False
    mask_field = valid_name(name)
    if mask_field in probe:
        raise DctDataError(
            f"{where}: field {mask_field!r}: expected no source field of that name with --nan mask (it holds "
            f"the validity mask of {name!r}). Got one (rename it, or name it as the mask: --valid "
            f"{name}={mask_field})"
        )
    return mask_field, True


def plan_fields(
    source: Source, settings: PackSettings, calibration: Source | None = None, quiet: bool = True
) -> tuple[tuple[FieldSpec, ...], tuple[str, ...]]:
    """(field specs in sample order, names of the mask fields the pack makes) of a source under the settings.
    `calibration` replaces the source's own samples for calibration (a stream's window or an explicit set).
    The lossless stage "auto" is, for each calibrated dct field, the smaller of the entropy coder and zstd-19 on
    its calibration subset, zstd-9 for everything else. A dct field whose codec has per-sample side information
    is followed by its stored partner `<name>__side`."""
    probe = source.probe()
    _check_names(settings, probe)
    specs: list[FieldSpec] = []
    derived: list[str] = []
    cal = calibration if calibration is not None else source
    cal_probe = cal.probe() if calibration is not None else probe
    default_stage = fixed_stage(settings.lossless_stage)
    for name, (shape, dtype) in probe.items():
        kind, reason = _kind(source, cal, settings, name, shape, dtype)
        attrs = source.field_attrs.get(name)
        if not kinds.get(kind).coded:
            specs.append(FieldSpec(name, kind, shape, dtype.name, None, default_stage, attrs=attrs, reason=reason))
            continue
        shape = dct_shape(name, shape, source.description, settings.channels_last, settings.dims or 2)
        mask_field, made = _mask_field(settings, name, probe, source.description)
        if made:
            derived.append(mask_field)
        spec, stage = _codec(field_plan(settings, name, shape, mask_field, made), cal, cal_probe, quiet)
        specs.append(
            FieldSpec(name, kind, shape, dtype.name, spec, stage, valid=mask_field, attrs=attrs, reason=reason)
        )
        if has_side(specs[-1]):
            specs.append(side_field(specs[-1]))
        if made:
            why = f"validity mask of {name!r} (--nan mask), stored exactly"
            specs.append(FieldSpec(mask_field, kinds.EXACT, shape, "bool", None, default_stage, reason=why))
    by_name = {f.name: f for f in specs}
    for f in specs:
        if f.valid is not None and f.valid not in derived:
            f.check_valid_field(by_name[f.valid])
    return tuple(specs), tuple(derived)


def _codec(plan: FieldPlan, cal: Source, cal_probe: Mapping[str, Any], quiet: bool = True) -> tuple[CodecSpec, dict]:
    """(CodecSpec, lossless stage) of one dct field: from the settings, or calibrated on the calibration set
    `cal` (its fields: `cal_probe`; always with a pointwise bound). With `plan.fallback` (the default target,
    no setting named), where calibration cannot reach the target (constant samples, too few pixels), every
    frequency is kept as float32 (`FALLBACK_CF`): near-exact, never an error the user did not ask for."""
    if not plan.calibrates:
        return plan.fixed_spec(), plan.stage
    name, shape = plan.name, plan.shape
    if name not in cal_probe:
        raise DctDataError(f"calibration: expected field {name!r} in the calibration set. Got fields {list(cal_probe)}")
    idx = calibration_indices(len(cal), math.prod(shape))
    batch = cal.take(idx)
    x = np.asarray(batch[name]).reshape(len(idx), *shape)
    # a float64 source with a bound decodes in float64 (`CodecSpec.precision`): its bound holds against its own
    # values, which its bound is calibrated on too (a target's search runs on the float32 values)
    precise = bool(plan.bound) and x.dtype == np.float64
    if not precise:
        check_float32(x, name, lambda j: cal.where(idx[j]))  # the true reason, before float32 hides it
    given = x
    x = x.astype(np.float32, copy=False)  # `take` made the subset: a float32 one is used as it is
    explicit = None if plan.mask_field is None or plan.mask_made else np.asarray(batch[plan.mask_field])
    x, valid, _ = prepare_dct(x, name, shape, plan.nan, explicit, plan.mask_field, lambda j: cal.where(idx[j]))
    if precise:  # the source's own values (invalid pixels as filled)
        x = given.astype(np.float64) if valid is None else np.where(valid, given, x)
    x = torch.from_numpy(np.ascontiguousarray(x))
    try:
        spec, stage = _calibrate(x, valid, plan, lambda j: cal.where(idx[j]), quiet, len(cal))
    except DctDataError as exc:
        if not plan.fallback:
            raise
        log.warning(
            "field %r: the default target %g dB could not be calibrated (%s); keeping every frequency as float32 "
            "(cf=%d), near-exact",
            name, plan.target, exc, FALLBACK_CF,
        )  # fmt: skip
        return plan.fixed_spec(cf=FALLBACK_CF, mask="square", dtype="float32"), plan.stage
    if not isinstance(spec, CodecSpec) or spec.sample_shape != shape:
        raise DctDataError(f"field {name!r}: calibration: expected a CodecSpec for shape {shape}. Got {spec!r}")
    if precise and spec.bounded and spec.precision is None:
        spec = spec.replace(precision="float64")
    return spec, stage


# Figures -----------------------------------------------------------------------------------------
def combine_stats(specs: tuple[FieldSpec, ...], parts: list[dict]) -> tuple[dict[str, FieldStats], int]:
    """({field: FieldStats}, filled pixels) from the parts' figures (`dctdata.preprocess.parts.new_stats`),
    each kept to `figure`'s significant digits (PSNRs rounded down, errors up)."""
    stats: dict[str, FieldStats] = {}
    for f in user_fields(specs):  # a side partner is part of its dct field
        if not f.coded:  # stored exactly
            stats[f.name] = FieldStats(math.inf, math.inf, 0.0, 0)
            continue
        channels = []
        for c in range(f.shape[0]):
            scores = [v for p in parts for v in p["stats"]["psnr"][f.name][c]]
            err = max(p["stats"]["max_error"][f.name][c] for p in parts)
            channels.append(
                ChannelStats(
                    figure(min(scores), "down") if scores else None,
                    figure(statistics.median(scores), "down") if scores else None,
                    figure(pooled_psnr(scores), "down"),
                    figure(err, "up"),
                )
            )
        every = [v for p in parts for ch in p["stats"]["psnr"][f.name] for v in ch]
        pooled = [ch.psnr_dataset for ch in channels if ch.psnr_dataset is not None]
        fraction = None
        if f.valid is not None:
            good = sum(p["stats"]["valid"][f.name][0] for p in parts)
            total = sum(p["stats"]["valid"][f.name][1] for p in parts)
            fraction = good / total if total else None
        # no scores: every item was constant (PSNR undefined); max error still says how close
        stats[f.name] = FieldStats(
            figure(min(every), "down") if every else None,
            figure(statistics.median(every), "down") if every else None,
            max(ch.max_abs_error for ch in channels),
            sum(p["stats"]["overflow"][f.name] for p in parts),
            min(pooled) if pooled else None,
            tuple(channels),
            figure(fraction),
        )
    return stats, sum(p["stats"]["nan_filled"] for p in parts)


def below_floor(specs: tuple[FieldSpec, ...], parts: list[dict], where=None) -> list[str]:
    """One line per dct field with items below the per-sample floor its codec records (samples outside
    the calibration subset, where the floor could not lift them without overflowing the integers), naming
    the lowest ones; `where(i)` names sample i."""
    lines = []
    for f in user_fields(specs):
        if f.codec is None or f.codec.min_psnr is None:
            continue
        hits = [tuple(h) for p in parts for h in p["stats"].get("below_floor", {}).get(f.name, [[], 0])[0]]
        count = sum(p["stats"].get("below_floor", {}).get(f.name, [[], 0])[1] for p in parts)
        if not count:
            continue
        name = where or (lambda i: f"sample {i}")
        worst = sorted(hits, key=lambda h: h[2])[:5]
        named = ", ".join(f"{name(int(i))} channel {int(c)} at {db:.2f} dB" for i, c, db in worst)
        lines.append(
            f"field {f.name!r}: {count} item(s) below the per-sample floor {f.codec.min_psnr:.2f} dB the manifest "
            f"records (samples outside the calibration subset the floor could not lift without overflowing "
            f"{f.codec.dtype}): {named}{' ...' if count > len(worst) else ''} (quant int16, or a calibration set "
            "that holds such samples, keeps the floor)"
        )
    return lines


def plan(src: Source, settings: PackSettings, calibration: Source | None = None, quiet: bool = True):
    """(field specs, derived mask fields) of a source under the settings (`plan_fields`)."""
    return plan_fields(src, settings, calibration, quiet)


def build_manifest(
    settings: PackSettings,
    record: dict,
    specs: tuple[FieldSpec, ...],
    parts: list[dict],
    written: dict,
    n: int,
    *,
    coords: Mapping[str, Any] | None = None,
    info: Mapping[str, Any] | None = None,
    where=None,
) -> Manifest:
    """The manifest of a finished pack: settings, fields, figures, the writer's checksums and layout,
    and the source's coordinates and info."""
    stats, filled = combine_stats(specs, parts)
    for line in below_floor(specs, parts, where):
        log.warning(line)
    pack_entry = {
        **{k: v for k, v in record.items() if k not in ("codec", "writer_options", "fields", "format", "samples")},
        "nan_filled": filled,
        "source_info": dict(info or {}),
    }
    if no_fidelity_flag(settings) and any(f.coded for f in specs):
        pack_entry["default_target_psnr"] = DEFAULT_TARGET_PSNR  # what the summary and info state as the promise
    over_time = StepFigures.merged([p["stats"].get("over_time") for p in parts])  # trajectory packs
    if over_time is not None:
        pack_entry[FIDELITY_OVER_TIME] = over_time.record()
    return Manifest(
        storage=settings.format,
        samples=n,
        fields=specs,
        pack=pack_entry,
        stats=stats,
        checksums=written.get("checksums", {}),
        layout=written.get("layout", {}),
        coords=dict(coords or {}),
    )


__all__ = [
    "CALIBRATION_SAMPLES",
    "CALIBRATION_VALUES",
    "DEFAULT_CF",
    "DEFAULT_TARGET_PSNR",
    "FEW_VALUES",
    "FieldPlan",
    "Targets",
    "below_floor",
    "build_manifest",
    "calibration_count",
    "calibration_indices",
    "combine_stats",
    "dct_shape",
    "default_kind",
    "distinct_values",
    "field_plan",
    "fixed_stage",
    "kind_and_reason",
    "looks_channels_last",
    "may_calibrate",
    "no_fidelity_flag",
    "parse_field_overrides",
    "parse_nan",
    "parse_targets",
    "parse_valid",
    "plan",
    "plan_fields",
]
