"""`dctdata.Writer`: pack samples as they come, like MosaicML Streaming's `MDSWriter` or webdataset's
`ShardWriter`, into the same dataset `dctdata pack` writes, with the same atomic commit.

    with dctdata.Writer("out.dct", target_psnr=40) as w:
        for sample in stream:          # a dict of arrays, a tuple/list, or one array (field `image`)
            w.write(sample)
    w.manifest                         # the committed manifest

Settings are `dctdata.pack`'s (snake_case CLI flags), plus `samples=` (the expected count, when known)
and `calibration=` (an explicit calibration set: anything `dctdata.pack` takes).

How it works:
- Calibration. A target PSNR or an integer wire dtype needs samples before the first one can be
  encoded. Without `calibration=`, the writer keeps a *first window* in memory: as many samples as
  `dctdata pack` calibrates on (at least 64, more when they are small: up to 4M values of the largest
  dct field; fewer if `samples=` says the stream is shorter), calibrates on it, then encodes the
  window and streams the rest. When the whole dataset fits the window (the pack would calibrate on
  every sample), the result equals `dctdata pack` of the same data byte for byte; otherwise the first
  samples stand for the stream: shuffle it, or pass `calibration=` with a representative set (then
  nothing is buffered). Without calibration (fixed cf/quant none|fp16|bf16), the first sample plans
  the fields and the pack always equals the CLI's.
- Memory bound: the calibration window (raw samples), one encoding batch (16 MiB of source values),
  and the samples of one unfinished part, stored (a zarr shard: at most 32 MiB of coefficients per
  field and 128 MiB of source; a webdataset shard: at most `max_shard_size`, 128 MiB of source).
- Writing: `dctdata.preprocess.parts.Encoder` (the pack's own encoder: fill, encode, figures) feeds
  the format writer's streaming part API (`dctdata.format.base.PartWriter`), which writes each part
  as it fills, also when the count is unknown.
- Commit: into the temporary sibling `.OUT.partial`, manifest last, renamed to OUT by `close()` (the
  end of the `with` block). An error inside the block, or in `close()`, removes everything: nothing
  is left at OUT. An existing OUT is refused unless `overwrite=True`, which replaces it only at the
  commit.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format import Manifest, is_url, make_writer
from dctdata.format.coords import encode_coord
from dctdata.format.kinds import CODED, get_kind
from dctdata.parse import parse_optional_int
from dctdata.preprocess.commit import check_out, commit, lock_out, partial_dir, remove_manifest
from dctdata.preprocess.parts import BATCH_BYTES, Encoder
from dctdata.preprocess.plan import build_manifest, calibration_count, may_calibrate, plan
from dctdata.preprocess.sources import (
    ChannelsLast,
    IterableSource,
    SampleListSource,
    describe,
    open_source,
    sample_dict,
)
from dctdata.settings import UNSET, PackSettings
from dctdata.stages import AUTO

log = logging.getLogger(__name__)


class Writer:
    """Incremental pack to OUT (see the module docstring).

    Args:
        out: The dataset to write: a directory or fsspec URL.
        format: zarr (random access, default) or webdataset (streaming shards).
        cf: chop factor 1..8 (default 4 with other settings but no --target-psnr).
        mask: kept-frequency mask (default square; volumes: cube = square, tetra = triangle: u + v + w < CF).
        dims: spatial dims of a dct sample: 2 ((H, W) or (C, H, W), default) or 3 (volumes: (D, H, W) or (C, D, H, W) as
            8x8x8 blocks).
        quant: coefficient dtype (default none = fp32).
        target_psnr: calibrate steps (and free knobs) to reach this PSNR (per channel, over valid pixels); per field:
            noisy=40,clean=45 (a bare DB sets the fields not named). With no fidelity flag at all (--cf, --mask,
            --quant, --target-psnr, --max-error, --max-rel-error) float fields get 40 and integer fields stay exact.
        max_error: pointwise bound: every decoded value within E of the source, in the field's units, checked on every
            sample at pack time (SZ3/ZFP's absolute mode); per field: u=0.01,p=2 (a bare E sets the fields not named).
        max_rel_error: pointwise bound relative to each sample channel's value range (1e-3: within 0.1% of the range);
            with --max-error the smaller bound holds.
        fields: override a field's kind (dct|array|label).
        channels_last: per-sample arrays are (H, W, C): move C first (--no-channels-last: keep a layout that looks
            channels-last as it is).
        nan: NaN/Inf in dct fields: error (default); mask: fill smoothly and store the validity mask as FIELD_valid;
            fill=VALUE: a constant, no mask.
        valid: the source field MASKFIELD (nonzero = valid) is FIELD's validity mask (repeat for more fields).
        lossless: lossless stage: auto (default: per dct field the smaller of the entropy coder and zstd-19), zstd
            (zstd-19, the read-speed choice: more bytes than the entropy coder, decoded faster in the loader workers),
            zstd:LEVEL (1..22), lz4 (numcodecs' LZ4: the fastest decode, the most bytes).
        strict: fail on any quantization overflow.
        overwrite: replace an existing OUT (only once the new one is complete).
        quiet: no progress bar or summary.
        max_shard_size: webdataset: cap on each .tar shard, in bytes or with a unit: 64MiB, '1.5 GB' (default 256 MiB).
        samples_per_shard: webdataset: samples per shard (default: as many as fit the cap, and at least 16 shards for a
            set of 16 samples or more, so ranks x DataLoader workers each get whole shards).
        samples_per_member: webdataset: samples per tar member, 1..256 (default: about 256 KiB of source per member, 1
            for larger samples, at most 1/16 of the set; each member costs a 512-byte tar header and padding).
        calibration: an explicit calibration set (anything `pack` takes) instead of the source's samples.
        writer_options: the storage writer's options: zarr chunk_samples, shard_samples; webdataset max_shard_size,
            samples_per_shard, samples_per_member.
        storage_options: fsspec options for a URL OUT (s3://..., credentials, endpoint).
        samples: The expected sample count, when known.
        attrs: {field: {name: value}} stored with each field.
        coords: {name: one value per sample} stored with the pack.
        settings: A `PackSettings` with every setting at once, instead of the keywords above.
        description: How error messages name the stream.
        codec: Deprecated: the old name of `lossless` (taken with a DeprecationWarning).

    Raises:
        DctDataError: A setting is invalid or does not apply to a stream, or OUT exists without `overwrite=True`.
    """

    def __init__(
        self,
        out: str | os.PathLike,
        *,
        samples: int | None = None,
        calibration: Any = None,
        format: str = "zarr",
        cf: int | None = None,
        mask: str | None = None,
        dims: int | None = None,
        quant: str | None = None,
        target_psnr: float | str | Mapping[str, float] | None = None,
        max_error: float | str | Mapping[str, float] | None = None,
        max_rel_error: float | str | Mapping[str, float] | None = None,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        channels_last: bool | None = None,
        nan: str | float = "error",
        valid: Mapping[str, str] | Sequence[str] | None = None,
        lossless: Mapping[str, Any] | str | None = AUTO,
        strict: bool = False,
        overwrite: bool = False,
        quiet: bool = False,
        max_shard_size: int | str | None = None,
        samples_per_shard: int | None = None,
        samples_per_member: int | None = None,
        writer_options: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Mapping[str, Any]] | None = None,
        coords: Mapping[str, Any] | None = None,
        settings: PackSettings | None = None,
        description: str = "<Writer>",
        codec: Any = UNSET,
    ) -> None:
        """OUT: the dataset to write (a directory or fsspec URL). samples: the expected count, when known.
        The settings are `PackSettings`' fields that apply to a stream (`PackSettings.names(writer=True)`),
        as keywords or as `settings=`. attrs: {field: {name: value}} stored with each field; coords: {name:
        one value per sample}. description: how errors name the stream."""
        given = dict(
            format=format, cf=cf, mask=mask, dims=dims, quant=quant, target_psnr=target_psnr, max_error=max_error,
            max_rel_error=max_rel_error, fields=fields, channels_last=channels_last, nan=nan, valid=valid,
            lossless=lossless, strict=strict, overwrite=overwrite, quiet=quiet, max_shard_size=max_shard_size,
            samples_per_shard=samples_per_shard, samples_per_member=samples_per_member, calibration=calibration,
            writer_options=writer_options, storage_options=storage_options, codec=codec,
        )  # fmt: skip
        settings = PackSettings.resolve(settings, given, "Writer")
        stray = settings.stream_only()
        if stray:
            raise DctDataError(
                f"Writer: {stray[0]}: expected a setting that applies to a stream of samples. Got "
                f"{stray[0]}={getattr(settings, stray[0])!r} (dctdata.pack takes it)"
            )
        self.settings = settings
        self.samples = parse_optional_int(
            samples, "samples", minimum=1, expected="a positive int or None", type_error=DctDataError
        )
        if attrs is not None and not isinstance(attrs, Mapping):
            raise TypeError(f"attrs: expected a mapping field -> {{name: value}}. Got {type(attrs).__name__}")
        if coords is not None and not isinstance(coords, Mapping):
            raise TypeError(f"coords: expected a mapping name -> 1-D array (one value per sample). Got {coords!r}")
        self._attrs, self._coords = dict(attrs or {}), dict(coords or {})
        self.description = description
        self.storage_options = dict(settings.storage_options or {})
        self.out = check_out(out, settings.overwrite, self.storage_options)
        self.url = is_url(self.out)
        self.root = self.out if self.url else partial_dir(self.out)
        self._writer_options = settings.writer_config
        options = dict(self._writer_options)
        if self.url:
            options["storage_options"] = self.storage_options
        self.storage = make_writer(settings.format, options)
        self._calibration = settings.calibration
        self._window: list[dict[str, np.ndarray]] = []
        self._pending: list[dict[str, np.ndarray]] = []
        self._ref: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        self._images: set[str] = set()
        self._target = 1
        self.specs = None
        self.encoder: Encoder | None = None
        self.count = 0  # samples accepted
        self._written = 0  # samples encoded and handed to the storage writer
        self._owned = False
        self._done = False
        self.manifest: Manifest | None = None
        self._lock = lock_out(self.out, settings.overwrite, self.storage_options)  # one pack per local OUT, until close

    # Samples -------------------------------------------------------------------------------------
    def write(self, sample: Any) -> None:
        """Add one sample: a dict of arrays/tensors/numbers, a tuple/list (image, label, ...) or one array."""
        self._check_open()
        d, images = sample_dict(sample, self._where(self.count))
        self._add(d, images)

    def _add(self, d: dict[str, np.ndarray], images: list[str]) -> None:
        try:
            self._images.update(images)  # decoded images are dct fields: known before sizing the window
            self._check_sample(d)
            if self.samples is not None and self.count >= self.samples:
                raise DctDataError(f"{self._where(self.count)}: expected {self.samples} samples (samples=). Got more")
            self.count += 1
            if self.specs is None:
                self._window.append(d)
                if len(self._window) >= self._target:
                    self._plan()
                return
            self._pending.append(d)
            if len(self._pending) >= self._batch:
                self._flush()
        except BaseException:
            self.abort()
            raise

    def _where(self, index: int) -> str:
        return f"{self.description} sample {index}"

    def _check_sample(self, d: dict[str, np.ndarray]) -> None:
        """Every sample has the first sample's fields and per-sample shapes (caught before any stacking)."""
        if not d:
            raise DctDataError(f"{self._where(self.count)}: expected at least one field. Got an empty sample")
        if self._ref is None:
            self._ref = {k: (tuple(v.shape), v.dtype) for k, v in d.items()}
            self._target = self._window_size()
            return
        if set(d) != set(self._ref):
            raise DctDataError(
                f"{self._where(self.count)}: expected fields {sorted(self._ref)} like sample 0. Got {sorted(d)}"
            )
        for k, v in d.items():
            if tuple(v.shape) != self._ref[k][0]:
                raise DctDataError(
                    f"{self._where(self.count)}: field {k!r}: expected shape {self._ref[k][0]} like sample 0. Got "
                    f"{tuple(v.shape)} (every sample of a field needs one shape)"
                )

    def _window_size(self) -> int:
        """Samples to hold before planning: the calibration subset's size when calibration needs them."""
        s = self.settings
        if self._calibration is not None:
            return 1
        explicit = {k for k, v in s.overrides.items() if get_kind(v).coded} | self._images
        candidates = [
            math.prod(shape)
            for k, (shape, dtype) in self._ref.items()
            if k in explicit or (dtype.kind == "f" and len(shape) >= 2 and s.overrides.get(k) is None)
        ]
        if not may_calibrate(s) or not candidates:
            return 1
        k = max(calibration_count(v) for v in candidates)
        return min(k, self.samples) if self.samples is not None else k

    # Planning, encoding, commit ------------------------------------------------------------------
    def _plan(self) -> None:
        window = SampleListSource(self._window, self.description)
        window.default_kinds = {k: CODED.value for k in self._images}
        src = ChannelsLast(window, self.settings.dims or 2) if self.settings.channels_last else window
        cal = None
        if self._calibration is not None:
            cal = open_source(
                self._calibration, channels_last=bool(self.settings.channels_last), dims=self.settings.dims or 2
            )
        try:
            specs, derived = plan(src, self.settings, cal, quiet=self.settings.quiet)
        finally:
            if cal is not None:
                cal.close()
        if self._attrs:
            unknown = sorted(set(self._attrs) - {f.name for f in specs})
            if unknown:
                raise DctDataError(f"attrs: expected field names {[f.name for f in specs]}. Got {unknown[0]!r}")
            specs = tuple(
                dataclasses.replace(f, attrs={**f.attrs, **self._attrs[f.name]}) if f.name in self._attrs else f
                for f in specs
            )
        if self.url:
            remove_manifest(self.out, self.storage_options)
        else:
            if os.path.isdir(self.root):
                log.warning("%s: discarding an unfinished pack", self.root)
                shutil.rmtree(self.root)
            os.makedirs(self.root)
        self._owned = True
        self.specs, self.derived = specs, derived
        self.storage.open(self.root, specs, self.samples)
        self.encoder = Encoder(specs, self.settings.nan_policy, self.settings.strict, derived)
        per = sum(max(f.source_sample_bytes, 4 * math.prod(f.shape)) for f in specs)
        self._batch = max(1, min(4096, BATCH_BYTES // max(per, 1)))
        self._pending, self._window = self._window, []
        while len(self._pending) >= self._batch:
            self._flush(self._batch)

    def _flush(self, count: int | None = None) -> None:
        take = self._pending if count is None else self._pending[:count]
        self._pending = [] if count is None else self._pending[count:]
        if not take:
            return
        batch = {k: np.stack([s[k] for s in take]) for k in take[0]}
        if self.settings.channels_last:
            batch = ChannelsLast._fix(batch, (self.settings.dims or 2) + 1)
        with torch.inference_mode():
            stored = self.encoder.encode(batch, self._written, self._where)
        self.storage.write(self._written, stored)
        self._written += len(take)

    def close(self) -> Manifest:
        """Encode what is buffered, settle the count, write the manifest last and commit OUT."""
        if self._done:
            if self.manifest is None:
                raise DctDataError(f"{self.out}: expected an open writer. Got one that was aborted")
            return self.manifest
        try:
            if self.count == 0:
                raise DctDataError(f"{self.out}: expected at least one sample. Got 0 (nothing written)")
            if self.samples is not None and self.count != self.samples:
                raise DctDataError(f"{self.out}: expected {self.samples} samples (samples=). Got {self.count}")
            if self.specs is None:
                self._plan()
            self._flush()
            written = self.storage.close()
            record = {"source": self.description, **self.settings.record(), "writer_options": self._writer_options}
            coords = {k: encode_coord(np.asarray(v), k, sample=True) for k, v in self._coords.items()}
            manifest = build_manifest(
                self.settings, record, self.specs, [{"stats": self.encoder.stats}], written, self.count, coords=coords
            )
            commit(manifest, self.root, self.out, self.storage_options)
        except BaseException:
            self.abort()
            raise
        self._done, self.manifest = True, manifest
        self._unlock()
        return manifest

    def abort(self) -> None:
        """Drop everything written so far (nothing is left at OUT)."""
        if self._done:
            return
        self._done = True
        if self.specs is not None:
            self.storage.abort()
        self._window, self._pending = [], []
        if self._owned and not self.url and os.path.isdir(self.root):
            shutil.rmtree(self.root, ignore_errors=True)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _check_open(self) -> None:
        if self._done:
            raise DctDataError(f"{self.out}: expected an open writer. Got one that is closed or aborted")

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.abort()
            return False
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self._done else f"{self.count} samples"
        return f"Writer({self.out!r}, format={self.settings.format!r}, {state})"


def pack_iterable(source: Iterable[Any], out: str | os.PathLike, settings: PackSettings) -> Manifest:
    """`dctdata.pack` of an iterable/generator of samples, through the Writer (read once, in order)."""
    from tqdm.auto import tqdm

    if settings.key is not None or settings.sample_dim or settings.time_dim or settings.variables or settings.stack:
        raise DctDataError(
            f"--key/--sample-dim/--variables/--stack: expected an HDF5/NetCDF/zarr source. Got an iterable "
            f"{describe(source)}"
        )
    it = IterableSource(source, settings.length, describe(source))
    stream = settings.for_stream()  # the Writer counts with samples=; the source options were checked above
    w = Writer(out, samples=it.length, settings=stream, description=it.description)
    bar = tqdm(
        total=it.length, unit="sample", desc="pack", disable=settings.quiet or not sys.stderr.isatty(), leave=False
    )
    with bar, w:
        for _, sample, images in it:
            w._check_open()
            w._add(sample, images)
            bar.update(1)
    return w.manifest
