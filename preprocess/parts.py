"""One pack *part*: read samples [start, stop) from the source, encode them, hand them to the writer.

A part is the unit of parallel work (a Dask task), of progress (a `--resume` journal line) and of
output files (a zarr shard of every field, or one webdataset tar): parts never share a file, and a
part's bytes depend only on its samples and the shared CodecSpecs, so any execution order gives the
same dataset. `PartJob` is what every task gets: the source *name* and its options (each process
opens the source itself; data never travels through the scheduler), the field specs chosen once by
the client (calibration included), and the writer (options only).

`Encoder` is the one place samples become stored arrays and error figures: it checks shapes and
dtypes, applies the NaN/mask policy (`dctdata.preprocess.masking`), encodes `dct` fields, decodes them
again to measure PSNR per channel of each sample over its valid pixels, counts overflows, and makes
the automatic `<field>_valid` masks. Pack parts and the incremental `Writer` both use it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from dctdata.codec.metrics import item_figures, item_mean_square, psnr_from_mse
from dctdata.decoder.corrections import stage_sizer
from dctdata.decoder.layer import Decompress
from dctdata.decoder.wire import split_wire
from dctdata.encoder import encode_kernels
from dctdata.encoder.bounds import BoundError
from dctdata.encoder.quantize import F32_SAFE_MAX, encode
from dctdata.errors import DctDataError, OverflowCountError
from dctdata.format import FieldSpec
from dctdata.format.fields import SIDE_SUFFIX, user_fields
from dctdata.preprocess.masking import NanPolicy, check_items_have_valid, fill_invalid
from dctdata.preprocess.sources import Source, open_source
from dctdata.report import FLOOR_SLACK_DB, StepFigures, frame_steps, trajectory_offsets

BATCH_BYTES = 16 << 20  # source bytes per encoding batch
BELOW_KEEP = 20  # items below the per-sample floor named per field and part (all are counted)
# Decoding again for the figures runs in float64 with a few full-size temporaries: done in slices of
# this many float64 bytes so a batch's temporaries stay a fraction of the batch, not a multiple of it.
FIGURE_BYTES = 4 << 20
_SOURCES: dict[tuple, Source] = {}  # per-process cache: a worker opens each source once


@dataclasses.dataclass(frozen=True)
class PartJob:
    source: Any  # a path/URL/module:callable (reopened in each process) or an in-memory object (serial packs)
    source_options: dict  # keywords of open_source: key, channels_last, sample_dim, time_dim, variables, stack
    specs: tuple[FieldSpec, ...]
    nan: NanPolicy
    strict: bool
    writer: Any
    root: str
    samples: int
    derived: tuple[str, ...] = ()  # mask fields the encoder makes (nan="mask"), not read from the source
    # torch intra-op threads while encoding: 1. The per-batch ops are small and memory-bound, and
    # torch's thread pool fighting zarr's/zstd's threads slowed a serial pack down (measured:
    # docs/benchmarks/design.md); parallelism comes from Dask workers instead.
    threads: int | None = 1


def batch_size(specs: tuple[FieldSpec, ...]) -> int:
    per = sum(max(f.source_sample_bytes, 4 * math.prod(f.shape)) for f in specs)
    return max(1, min(4096, BATCH_BYTES // max(per, 1)))


def _source(job: PartJob) -> Source:
    k = (repr(job.source), repr(sorted(job.source_options.items())), os.getpid())
    if k not in _SOURCES:
        _SOURCES[k] = open_source(job.source, **job.source_options)
    return _SOURCES[k]


def check_finite(x: np.ndarray, name: str, nan_fill: float | None, where) -> np.ndarray:
    """Non-finite values are an error (nan_fill None) or become `nan_fill`; then the float32 DCT bound."""
    bad = ~np.isfinite(x)
    if bad.any():
        j = int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
        if nan_fill is None:
            raise DctDataError(
                f"{where(j)}: field {name!r}: expected finite values in a dct field. Got NaN/Inf "
                "(use --nan mask to store a validity mask, or --valid FIELD=MASKFIELD)"
            )
        x = np.where(bad, np.float32(nan_fill), x)
    check_magnitude(x, name, where)
    return x


def check_magnitude(x: np.ndarray, name: str, where, peak: np.ndarray | None = None) -> None:
    """Refuse values past F32_SAFE_MAX; `peak`: max |x| per sample if the caller has it."""
    if peak is None:
        peak = np.abs(x).reshape(len(x), -1).max(axis=1) if x.size else np.zeros(len(x))
    if (peak > F32_SAFE_MAX).any():  # the 8x8 DCT would overflow float32 to inf
        j = int(np.argmax(peak > F32_SAFE_MAX))
        raise DctDataError(
            f"{where(j)}: field {name!r}: expected |x| <= {F32_SAFE_MAX:.3g} in a dct field (float32 max / 8: the 8x8 "
            "DCT "
            f"multiplies by up to 8). Got max |x| = {float(peak[j]):.3g} (rescale the data, or use --field "
            f"{name}=array)"
        )


# The codec computes in float32. A source value float32 cannot carry (float64, or integers past 2^24) is
# refused when float32's rounding alone errs by more than this share of its item's range: an offset of a
# billion times the range (1e15 + N(0, 1), Julian dates in days) would otherwise pack "fine" with errors
# far larger than the data's range.
FLOAT32_ROUNDING = 1e-3


def check_float32(x: np.ndarray, name: str, where) -> None:
    """Refuse values of a dct batch (B, C, H, W) that float32 cannot carry: finite values past the DCT's
    float32 bound (`check_magnitude`'s message, not "NaN/Inf"), and items whose float32 rounding is more than
    FLOAT32_ROUNDING of their (finite) range. Nothing to check for float32, float16 and small integers."""
    if (x.dtype.kind == "f" and x.dtype.itemsize <= 4) or (x.dtype.kind in "iub" and x.dtype.itemsize <= 2):
        return
    x64 = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x64)
    check_magnitude(np.where(finite, x64, 0.0), name, where)
    ok = finite.reshape(*x64.shape[:2], -1)
    items = np.where(ok, x64.reshape(ok.shape), 0.0)
    err = np.abs(items - items.astype(np.float32)).max(axis=2, initial=0.0)
    hi = np.where(ok, items, -np.inf).max(axis=2, initial=-np.inf)
    lo = np.where(ok, items, np.inf).min(axis=2, initial=np.inf)
    span = np.where(hi > lo, hi - lo, 0.0)
    bad = (span > 0) & (err > FLOAT32_ROUNDING * span)
    if bad.any():
        j, c = (int(v) for v in np.argwhere(bad)[0])
        raise DctDataError(
            f"{where(j)}: field {name!r} channel {c}: expected values float32 can carry (the codec computes in "
            f"float32). Got {x.dtype} values near {(hi[j, c] + lo[j, c]) / 2:.6g} that vary by {span[j, c]:.3g}: "
            f"float32 rounds them by up to {err[j, c]:.3g}, {100 * err[j, c] / span[j, c]:.2g}% of their range "
            f"(subtract the offset first, or keep the field exact: --field {name}=array)"
        )


def _as_given(x: np.ndarray, xf: np.ndarray, valid: np.ndarray | None, f: FieldSpec) -> torch.Tensor:
    """The batch the encoder checks its bound (and the figures measure errors) against: the float32 values
    it codes, or, where float32 does not hold some of the source's values (float64, integers past 2^24),
    the source's own values in float64 (invalid pixels as filled). A bound is a promise about the data as
    given: float32's rounding of it counts against the bound like any other error."""
    coded = torch.from_numpy(np.ascontiguousarray(xf))
    if np.can_cast(x.dtype, np.float32):
        return coded
    given = np.asarray(x, dtype=np.float64).reshape(xf.shape)
    if valid is not None:
        given = np.where(valid, given, xf)
    if np.array_equal(given, xf):  # every value a float32 number: nothing float32 rounds
        return coded
    return torch.from_numpy(np.ascontiguousarray(given))


def mask_batch(m: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A batch of explicit masks (B, *mask_shape) -> bool (B, C, H, W) ((B, C, D, H, W) for a volume field
    of shape (C, D, H, W); nonzero = valid)."""
    b = len(m)
    per = tuple(m.shape[1:])
    m = np.asarray(m).reshape(b, *([1] * (len(shape) - len(per))), *per) != 0
    return np.broadcast_to(m, (b, *shape))


def prepare_dct(
    x: np.ndarray,
    name: str,
    shape: tuple[int, int, int],
    nan: NanPolicy,
    mask: np.ndarray | None,
    mask_name: str | None,
    where,
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """A dct batch (B, C, H, W) float32 ready to encode: (filled values, validity or None when every
    pixel is valid, how many pixels were filled). `mask`: the explicit mask batch (field `mask_name`)."""
    if mask is None and x.size:  # the common case in two reductions, no full-size temporaries
        flat = x.reshape(len(x), -1)
        lo, hi = flat.min(axis=1), flat.max(axis=1)  # NaN propagates: not finite
        if np.isfinite(lo).all() and np.isfinite(hi).all():
            check_magnitude(x, name, where, peak=np.maximum(np.abs(lo), np.abs(hi)))
            return x, None, 0
    finite = np.isfinite(x)
    if mask is not None:
        valid = mask_batch(mask, shape)
        bad = ~finite & valid
        if bad.any():
            j = int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
            raise DctDataError(
                f"{where(j)}: field {name!r}: expected finite values where the mask {mask_name!r} says valid. Got "
                "NaN/Inf (fix the mask, or use --nan mask without --valid)"
            )
    elif finite.all():
        check_magnitude(x, name, where)
        return x, None, 0
    elif nan.mode == "error":
        check_finite(x, name, None, where)
        raise AssertionError("unreachable")  # pragma: no cover
    else:
        valid = finite
    if valid.all():
        check_magnitude(x, name, where)
        return x, None, 0
    check_items_have_valid(valid, name, where)
    holes = int((~valid).sum())
    x = np.where(valid, x, np.float32(nan.value)) if nan.mode == "fill" and mask is None else fill_invalid(x, valid)
    check_magnitude(x, name, where)
    return x, np.ascontiguousarray(valid), holes


def new_stats(specs: tuple[FieldSpec, ...]) -> dict:
    """Per-part error figures (JSON, journaled): per dct field and channel, the PSNR of every item
    that has one and the max error; overflow; filled pixels; valid pixel counts of masked fields."""
    dct = [f for f in specs if f.coded]
    return {
        "psnr": {f.name: [[] for _ in range(f.shape[0])] for f in dct},
        "max_error": {f.name: [0.0] * f.shape[0] for f in dct},
        "overflow": {f.name: 0 for f in dct},
        "nan_filled": 0,
        "valid": {f.name: [0, 0] for f in dct if f.valid is not None},
        # items below the per-sample floor their codec records: [sample, channel, dB], the first BELOW_KEEP,
        # and how many in all (the floor lifts every item it can; one it cannot, because the finer step
        # would overflow the integers, is reported, not hidden)
        "below_floor": {f.name: [[], 0] for f in dct if f.codec.min_psnr is not None},
    }


class Encoder:
    """Samples -> stored arrays + error figures, for one part or one incremental Writer."""

    figure_bytes = FIGURE_BYTES  # float64 bytes a slice of the figures' decode (a device encoder takes more)

    def __init__(
        self, specs: tuple[FieldSpec, ...], nan: NanPolicy, strict: bool, derived: tuple[str, ...] = ()
    ) -> None:
        self.specs = tuple(specs)
        self.by_name = {f.name: f for f in user_fields(self.specs)}  # side partners are made here, not read
        self.nan, self.strict, self.derived = nan, bool(strict), tuple(derived)
        # the figures come from the decode the readers run (`Decompress`'s default: float32, or float64 for a
        # float64 source's bounded field), so what the pack records (and `verify` checks) is what a reader gets
        self.layers = {f.name: Decompress(f.codec, normalize=False) for f in specs if f.coded}
        self.stats = new_stats(self.specs)
        # fields with corrections weigh each sample's candidates by their bytes after the field's stage
        self.sizers = {
            f.name: stage_sizer(f.lossless, f.codec) for f in specs if f.coded and f.codec.corrections is not None
        }
        # a trajectory pack's figures per time step (`track_steps`): its trajectories' frame offsets, and the bins
        self.offsets: np.ndarray | None = None
        self.step_figures: StepFigures | None = None

    def track_steps(self, source_info) -> None:
        """Also record the figures per field, channel and time step (`dctdata.report.StepFigures`) when the
        source is trajectories (its info has their frame offsets); every part bins the steps alike."""
        offsets = trajectory_offsets(source_info)
        if offsets is not None and offsets[-1] > 0:
            self.offsets = offsets
            channels = {f.name: f.shape[0] for f in self.specs if f.codec is not None}  # the dct fields
            self.step_figures = StepFigures.for_trajectories(channels, offsets)

    def result_stats(self) -> dict:
        """The part's figures as its result carries them: `stats`, and the ones per time step if recorded."""
        if self.step_figures is None:
            return self.stats
        return {**self.stats, "over_time": self.step_figures.to_json()}

    def encode(self, batch: dict[str, np.ndarray], first: int, where) -> dict[str, np.ndarray]:
        """Stored arrays of a batch of samples (first index `first`; where(i) names sample i)."""
        missing = sorted(set(self.by_name) - set(batch) - set(self.derived))
        if missing:
            raise DctDataError(f"{where(first)}: expected fields {list(self.by_name)}. Got no field {missing[0]!r}")
        b = len(next(iter(batch.values())))
        at = lambda j: where(first + j)  # noqa: E731
        stored: dict[str, np.ndarray] = {}
        for name, f in self.by_name.items():
            if name in self.derived:
                continue
            x = batch[name]
            expect = f.kind_type.batch_shape(f, x.ndim)  # a dct field's (C, H, W) may come as (H, W) or (L,)
            if tuple(x.shape[1:]) != tuple(expect):
                raise DctDataError(
                    f"{at(0)}: field {name!r}: expected per-sample shape {tuple(expect)}. Got {tuple(x.shape[1:])} "
                    "(ragged samples)"
                )
            if not f.coded:  # stored as given (native byte order), the kind's `store`
                stored[name] = f.kind_type.store(f, x, at(0))
                continue
            explicit = batch[f.valid] if f.valid is not None and f.valid not in self.derived else None
            if f.codec.precision is None:  # a float64 decode (`CodecSpec.precision`) carries what float32 does not
                check_float32(np.asarray(x).reshape(b, *f.shape), name, at)
            xf = np.array(x, dtype=np.float32).reshape(b, *f.shape)
            xf, valid, holes = prepare_dct(xf, name, f.shape, self.nan, explicit, f.valid, at)
            self.stats["nan_filled"] += holes
            xt = _as_given(x, xf, valid, f)
            self.encode_field(f, xt, valid, first, b, at, stored)
            if f.valid is not None:
                counts = self.stats["valid"][name]
                counts[0] += int(valid.sum()) if valid is not None else xf.size
                counts[1] += xf.size
                if f.valid in self.derived:
                    stored[f.valid] = valid if valid is not None else np.ones(xf.shape, bool)
        return stored

    def encode_field(self, f: FieldSpec, xt: torch.Tensor, valid, first: int, b: int, at, stored: dict) -> None:
        """One dct field's batch `xt` (on the CPU, or on the device of `dctdata.preprocess.device_pack`) into
        `stored`: its coefficients and side values as stored, its overflow count and its error figures."""
        name = f.name
        decoded: list[torch.Tensor] = []  # the encode's own decode of what it stores, where it made one
        try:
            wire, over = encode(
                xt, f.codec, valid=None if valid is None else torch.from_numpy(valid), size_of=self.sizers.get(name),
                decoded=decoded,
            )  # fmt: skip
        except BoundError as exc:  # nothing of the batch is written: the pack stops here, named
            raise BoundError(f"{at(exc.sample)}: field {name!r}: {exc}", first + exc.sample, exc.channel) from None
        if over:
            self.stats["overflow"][name] += over
            if self.strict:
                raise OverflowCountError(
                    f"{at(0)}..{first + b - 1}: field {name!r}: expected no {f.codec.dtype} overflow (--strict). "
                    f"Got {over} clamped coefficients"
                )
        self._figures(f, xt, wire, valid, first, decoded[0] if decoded else None)
        q, side = split_wire(wire, f.codec)
        stored[name] = f.to_stored(q)
        if side is not None:
            stored[name + SIDE_SUFFIX] = side.cpu().numpy()

    def _figures(
        self, f: FieldSpec, x: torch.Tensor, wire, valid: np.ndarray | None, first: int = 0, x_hat=None
    ) -> None:
        """PSNR per channel of each sample against its (valid) range, and the max abs error per channel,
        from the readers' default decode of the stored coefficients against the source's values as given (a
        float64 source's own), in float64 (in slices, see FIGURE_BYTES). `x_hat`: that decode of the whole
        batch when the encode made it (`encode(decoded=...)`: the per-sample floor decodes what it stores with
        the readers' decoder), else each slice is decoded here."""
        step = max(1, self.figure_bytes // (8 * math.prod(f.shape)))
        for a in range(0, len(x), step):
            v = None if valid is None else torch.from_numpy(valid[a : a + step])
            if x_hat is not None:
                y = x_hat[a : a + step]
            else:
                part = tuple(w[a : a + step] for w in wire) if isinstance(wire, tuple) else wire[a : a + step]
                y = self.layers[f.name](part)
            fused = None if v is not None else encode_kernels.figures(x[a : a + step], y, f.codec.dims)
            mse, rng, peak = fused if fused is not None else item_figures(x[a : a + step], y, f.codec.dims, v)
            scores = psnr_from_mse(mse, rng)
            per_channel = peak.amax(0).tolist()
            if f.codec.min_psnr is not None:
                self._below_floor(f, scores, rng, first + a)
            if self.step_figures is not None:
                self._over_time(f, x[a : a + step], v, mse, rng, scores, first + a)
            for c in range(f.shape[0]):
                # A constant item (zero range) has no PSNR against its range: left out, not reported as -inf/NaN.
                self.stats["psnr"][f.name][c].extend(scores[:, c][rng[:, c] > 0].tolist())
                self.stats["max_error"][f.name][c] = max(self.stats["max_error"][f.name][c], per_channel[c])

    def _over_time(self, f: FieldSpec, x, valid, mse, rng, scores, first: int) -> None:
        """Add a slice's frames (per channel: PSNR, relative L2 error, below the floor) to the step figures."""
        ms = item_mean_square(x, f.codec.dims, valid)
        rel = torch.where(ms > 0, (mse / torch.where(ms > 0, ms, torch.ones_like(ms))).sqrt(), torch.nan)
        psnr = torch.where(rng > 0, scores, torch.nan)
        below = None if f.codec.min_psnr is None else (psnr < f.codec.min_psnr - FLOOR_SLACK_DB).cpu().numpy()
        steps = frame_steps(self.offsets, first, len(x))
        self.step_figures.add(f.name, steps, psnr.cpu().numpy(), rel.cpu().numpy(), below)

    def _below_floor(self, f: FieldSpec, scores: torch.Tensor, rng: torch.Tensor, first: int) -> None:
        low = (scores < f.codec.min_psnr - FLOOR_SLACK_DB) & (rng > 0)
        if not bool(low.any()):
            return
        kept, count = self.stats["below_floor"][f.name]
        hits = low.nonzero().tolist()
        kept.extend([first + i, c, float(scores[i, c])] for i, c in hits[: max(0, BELOW_KEEP - len(kept))])
        self.stats["below_floor"][f.name][1] = count + len(hits)


def run_part(job: PartJob, index: int, start: int, stop: int, src: Source | None = None, progress=None) -> dict:
    """Encode and write part `index` (samples [start, stop)); returns its files and error figures.
    `progress(samples)`: called after each batch is encoded (a progress bar)."""
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    src = src if src is not None else _source(job)
    encoder = Encoder(job.specs, job.nan, job.strict, job.derived)
    encoder.track_steps(src.info)

    def batches(digest: dict[str, int]) -> Iterator[dict[str, np.ndarray]]:
        with torch.inference_mode():
            for a, batch in _read(src, job, start, stop):
                _digest(digest, batch)
                stored = encoder.encode(batch, a, src.where)
                if progress is not None:
                    progress(len(next(iter(batch.values()))))
                yield stored

    digest: dict[str, int] = {}
    out = job.writer.write_part(job.root, job.specs, job.samples, index, start, stop, batches(digest))
    return {"index": index, "start": start, "stop": stop, "stats": encoder.result_stats(), "source": digest, **out}


def source_digest(job: PartJob, start: int, stop: int, src: Source | None = None) -> dict[str, int]:
    """{field: crc32 of its values} of what part [start, stop) reads from the source (`--resume` checks that
    a journaled part's source samples are still the same before keeping the part)."""
    src = src if src is not None else _source(job)
    digest: dict[str, int] = {}
    for _, batch in _read(src, job, start, stop):
        _digest(digest, batch)
    return digest


def _digest(digest: dict[str, int], batch: dict[str, np.ndarray]) -> None:
    """Extend {field: crc32} by a batch (the same for any batching: each field's values are one stream)."""
    for k, v in batch.items():
        digest[k] = zlib.crc32(np.ascontiguousarray(v), digest.get(k, 0))


def _read(src: Source, job: PartJob, start: int, stop: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    seen = start
    for a, batch in src.batches(batch_size(job.specs), start, stop):
        yield a, batch
        seen += len(next(iter(batch.values())))
    if seen != stop:
        raise DctDataError(
            f"{src.description}: expected samples {start}..{stop - 1}. Got {seen - start} (the source ended early)"
        )
