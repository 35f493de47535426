"""The format-independent pack orchestrator: source -> per-field encoding -> a Writer -> manifest last.

    pack(source, out, format="zarr", cf=None, mask="square", quant="none", target_psnr=None, ...)

Steps: open the source (`dctdata.preprocess.sources`), decide each field's kind (floating arrays with
>= 2 dims per sample -> `dct`, integer scalars -> `label`, everything else -> `array`; a source may
default decoded images to `dct`; `fields={"mask": "array"}` overrides), build a CodecSpec per `dct`
field once, on the client (from cf/mask/quant directly, or from `dctdata.calibrate` on up to 64 evenly
spaced samples when quant is int8/int16 or a target PSNR is set), then write the dataset as *parts*
(`dctdata.preprocess.parts`): sample ranges that each own whole output files (a zarr shard of every
field; one webdataset tar). A part validates shapes/dtypes/NaN, encodes `dct` fields with
`dctdata.encode`, decodes them again to measure PSNR (per sample, against its value range) and max
error, counts overflows and hands the stored arrays to the writer. Parts run in order in this process
(default), or as Dask tasks (`workers=N` starts a LocalCluster, `scheduler=ADDRESS` uses an existing
cluster; `dctdata.preprocess.parallel`); the bytes are the same either way. The manifest is written
last, by the client.

Atomic commit: a local OUT is written into the temporary sibling `.OUT.partial`, renamed to OUT only
when everything worked; a data error removes it. An interruption (kill -9, Ctrl-C, a lost worker)
leaves it with a progress journal (`dctdata.preprocess.journal`), and `resume=True` (`--resume`)
redoes only the parts whose files are missing or fail their journaled sha256. OUT may also be an
fsspec URL (s3://bucket/prefix, ...; `storage_options`): there is no rename on an object store, so
data files are written in place and the manifest, written last, is the commit (readers refuse a
prefix without one; `--overwrite` deletes the old manifest first).

Defaults without a target PSNR: cf=4, mask square, quant none (fp32): 16 of 64 frequencies kept, a
4x smaller tensor on the device. With `target_psnr`, calibration chooses whatever of cf/mask/quant is
left None (smallest stored size that reaches the target).

Writers (one per storage format, `dctdata.format.make_writer`) implement the part interface of
`dctdata.format.base`; they never compute error figures and never write the manifest: the orchestrator
does both.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any, Mapping

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format import (
    MANIFEST_NAME,
    STORAGES,
    FieldSpec,
    FieldStats,
    Manifest,
    is_url,
    make_writer,
    write_manifest,
    write_manifest_url,
)
from dctdata.format.fields import has_side, side_field, user_fields
from dctdata.kinds import FIELD_KINDS, FieldKind
from dctdata.lossless import AUTO, DEFAULT_CODEC, parse_codec_config
from dctdata.parse import parse_number, parse_optional_int
from dctdata.preprocess import parallel as parallel_mod
from dctdata.preprocess.journal import Journal
from dctdata.preprocess.parts import PartJob, run_part
from dctdata.preprocess.parts import check_finite as _check_finite
from dctdata.preprocess.sources import Source, open_source
from dctdata.spec import QUANT_TO_DTYPE, CodecSpec
from dctdata.transform import parse_cf, parse_mask

log = logging.getLogger(__name__)

DEFAULT_CF = 4
CALIBRATION_SAMPLES = 64
CALIBRATION_VALUES = 1 << 22


def parse_nan(nan: object) -> float | None:
    """'error' -> None (non-finite values are an error); 'fill=V' or a number -> fill value V."""
    if nan is None or nan == "error":
        return None
    if isinstance(nan, (int, float)) and not isinstance(nan, bool):
        value = float(nan)
    elif isinstance(nan, str) and nan.startswith("fill="):
        try:
            value = float(nan[5:])
        except ValueError:
            value = math.nan
    else:
        raise DctDataError(f"nan: expected 'error' or 'fill=VALUE'. Got {nan!r}")
    if not math.isfinite(value):
        raise DctDataError(f"nan: expected a finite fill value ('fill=0'). Got {nan!r}")
    return value


def parse_field_overrides(fields: object) -> dict[str, str]:
    """{'name': 'kind'} or ['name=kind', ...] -> {'name': 'kind'}."""
    if fields is None:
        return {}
    if isinstance(fields, Mapping):
        items = list(fields.items())
    elif isinstance(fields, (list, tuple)):
        items = []
        for f in fields:
            if not isinstance(f, str) or "=" not in f:
                raise DctDataError(f"--field: expected NAME=dct|array|label. Got {f!r}")
            items.append(tuple(f.split("=", 1)))
    else:
        raise TypeError(f"fields: expected a mapping or a list of 'NAME=KIND'. Got {type(fields).__name__}")
    out = {}
    for name, kind in items:
        if kind not in FIELD_KINDS:
            raise DctDataError(f"--field {name}: expected kind dct, array or label. Got {kind!r}")
        out[str(name)] = FieldKind(kind)
    return out


def default_kind(shape: tuple[int, ...], dtype: np.dtype) -> FieldKind:
    if dtype.kind == "f" and len(shape) >= 2:
        return FieldKind.DCT
    if dtype.kind in "iu" and shape == ():
        return FieldKind.LABEL
    return FieldKind.ARRAY


def dct_shape(name: str, shape: tuple[int, ...], where: str) -> tuple[int, int, int]:
    """Per-sample shape of a dct field as (C, H, W)."""
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 3:
        return shape
    hint = " (channels-last data? use --channels-last)" if len(shape) == 3 else ""
    raise DctDataError(
        f"{where}: field {name!r}: expected 2 or 3 dims per sample for kind dct ((H, W) or (C, H, W)). Got "
        f"{shape}{hint}"
    )


def calibration_indices(n: int, sample_values: int) -> list[int]:
    """Evenly spaced samples to calibrate on: at least CALIBRATION_SAMPLES, more when samples are
    small (up to CALIBRATION_VALUES values), since the integer ranges come from the tails."""
    k = min(n, max(CALIBRATION_SAMPLES, CALIBRATION_VALUES // max(1, sample_values)))
    return sorted({int(i) for i in np.linspace(0, n - 1, k)})


def _calibrate(x: torch.Tensor, name: str, cf, mask, quant, target_psnr, codec, quiet: bool) -> tuple[CodecSpec, dict]:
    """(spec, lossless stage) of one dct field, with a progress bar while the search runs."""
    from tqdm.auto import tqdm

    from dctdata.calibrate import calibrate_report

    bar = tqdm(desc=f"calibrate {name}", unit="eval", disable=quiet or not sys.stderr.isatty(), leave=False)
    try:

        def progress(evaluation: int, psnr_db: float) -> None:
            bar.update(1)
            bar.set_postfix_str(f"{psnr_db:.2f} dB")

        report = calibrate_report(
            x, cf=cf, mask=mask, quant=quant, target_psnr=target_psnr, codec=codec, progress=progress
        )
    finally:
        bar.close()
    return report.spec, report.codec


def plan_fields(
    source: Source,
    *,
    cf: int | None,
    mask: str | None,
    quant: str | None,
    target_psnr: float | None,
    overrides: dict[str, str],
    codec: dict | str,
    nan_fill: float | None,
    quiet: bool = True,
) -> tuple[FieldSpec, ...]:
    """The fields of a pack: kinds, shapes, and for dct fields the calibrated spec and lossless stage
    (`codec` "auto": the entropy coder or zstd-19 for integer coefficients, zstd-9 for the rest)."""
    default_stage = DEFAULT_CODEC if codec == AUTO else codec
    probe = source.probe()
    unknown = sorted(set(overrides) - set(probe))
    if unknown:
        raise DctDataError(
            f"--field {unknown[0]}: expected one of the source's fields {list(probe)}. Got no such field"
        )
    needs_calibration = quant in ("int8", "int16") or target_psnr is not None
    if target_psnr is None:
        cf = DEFAULT_CF if cf is None else cf
        mask = mask or "square"
        quant = quant or "float32"
    specs = []
    n = len(source)
    for name, (shape, dtype) in probe.items():
        kind = FieldKind(overrides.get(name) or source.default_kinds.get(name) or default_kind(shape, dtype))
        if dtype.kind not in "biuf":
            raise DctDataError(f"{source.description}: field {name!r}: expected a numeric dtype. Got {dtype}")
        if kind is FieldKind.LABEL and shape != ():
            raise DctDataError(
                f"{source.description}: field {name!r}: expected one scalar per sample for kind label. Got shape "
                f"{shape}"
            )
        spec, stage = None, default_stage
        if kind is FieldKind.DCT:
            if dtype.kind == "b":
                raise DctDataError(
                    f"{source.description}: field {name!r}: expected numbers for kind dct. Got bool (use --field "
                    f"{name}=array)"
                )
            shape = dct_shape(name, shape, source.description)
            c, h, w = shape
            if needs_calibration:
                idx = calibration_indices(n, c * h * w)
                x = source.take(idx)[name].reshape(len(idx), c, h, w).astype(np.float32)
                x = _check_finite(x, name, nan_fill, lambda j, idx=idx: source.where(idx[j]))
                spec, stage = _calibrate(torch.from_numpy(x), name, cf, mask, quant, target_psnr, codec, quiet)
                if not isinstance(spec, CodecSpec) or spec.sample_shape != shape:
                    raise DctDataError(
                        f"field {name!r}: calibration: expected a CodecSpec for shape {shape}. Got {spec!r}"
                    )
            else:
                spec = CodecSpec(cf=cf, height=h, width=w, channels=c, mask=mask, dtype=quant)
        specs.append(FieldSpec(name, kind, shape, dtype.name, spec, stage))
        if has_side(specs[-1]):
            specs.append(side_field(specs[-1]))
    return tuple(specs)


def _check_out(out: str, overwrite: bool, storage_options: Mapping[str, Any] | None) -> str:
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a local directory path or an fsspec URL. Got {type(out).__name__}")
    out = os.fspath(out)
    if is_url(out):
        import fsspec

        fs, path = fsspec.core.url_to_fs(out, **dict(storage_options or {}))
        if fs.exists(path.rstrip("/") + "/" + MANIFEST_NAME) and not overwrite:
            raise DctDataError(
                f"{out}: expected an OUT prefix without a dataset. Got an existing {MANIFEST_NAME} (use --overwrite to "
                "replace it)"
            )
        return out.rstrip("/")
    out = os.path.abspath(out.removeprefix("file://"))
    if os.path.lexists(out) and not overwrite:
        raise DctDataError(
            f"{out}: expected an OUT path that does not exist. Got an existing path (use --overwrite to replace it)"
        )
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        got = (
            "a file in the way"
            if os.path.lexists(parent) or any(os.path.isfile(p) for p in _ancestors(parent))
            else "a missing directory"
        )
        raise DctDataError(f"{out}: expected an existing parent directory. Got {got} at {parent}")
    return out


def _ancestors(path: str) -> list[str]:
    out = []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def _check_not_source(source: object, out: str) -> None:
    """Refuse an OUT that is the source or contains it: --overwrite would delete the data being packed."""
    if not isinstance(source, (str, os.PathLike)) or is_url(out) or not os.path.exists(os.fspath(source)):
        return
    src, dst = os.path.realpath(os.fspath(source)), os.path.realpath(out)
    if src == dst or src.startswith(dst.rstrip(os.sep) + os.sep):
        raise DctDataError(
            f"{out}: expected an OUT path outside the source. Got the source {os.fspath(source)} itself or a directory "
            "holding it"
        )


def partial_dir(out: str) -> str:
    """The temporary sibling a local pack writes into (fixed name, so --resume finds it)."""
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")


def pack(
    source: str | os.PathLike,
    out: str | os.PathLike,
    *,
    format: str = "zarr",
    cf: int | None = None,
    mask: str | None = None,
    quant: str | None = None,
    target_psnr: float | None = None,
    fields: Mapping[str, str] | list[str] | None = None,
    key: str | list[str] | None = None,
    channels_last: bool = False,
    nan: object = "error",
    strict: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    codec: Mapping[str, Any] | str | None = AUTO,
    writer_options: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Pack SOURCE into a dctdata dataset at OUT; returns the manifest written (see module docstring)."""
    if format not in STORAGES:
        raise DctDataError(f"--format: expected one of {STORAGES}. Got {format!r}")
    if cf is not None:
        parse_cf(cf)
    if mask is not None:
        parse_mask(mask)
    if quant is not None and quant not in QUANT_TO_DTYPE:
        raise DctDataError(f"--quant: expected one of {list(QUANT_TO_DTYPE)}. Got {quant!r}")
    if target_psnr is not None:
        parse_number(target_psnr, "--target-psnr", above=0, expected="a positive number of dB", type_error=DctDataError)
    parse_optional_int(workers, "--workers", minimum=1, expected="a positive int", type_error=DctDataError)
    if workers not in (None, 1) and scheduler is not None:
        raise DctDataError(
            f"--workers/--scheduler: expected one of them (--workers starts a local cluster). Got workers={workers} "
            f"scheduler={scheduler!r}"
        )
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler):
        raise DctDataError(f"--scheduler: expected a Dask scheduler address such as tcp://host:8786. Got {scheduler!r}")
    parallel = (workers or 1) > 1 or scheduler is not None
    if parallel:
        parallel_mod.require_dask()
    nan_fill = parse_nan(nan)
    overrides = parse_field_overrides(fields)
    codec = codec if codec == AUTO else parse_codec_config(codec)
    storage_options = dict(storage_options or {})
    out = _check_out(out, overwrite, storage_options)
    _check_not_source(source, out)
    url = is_url(out)
    if resume and url:
        raise DctDataError(
            f"--resume: expected a local OUT directory (the progress journal lives in its temporary sibling). Got {out}"
        )
    options = dict(writer_options or {})
    if url:
        options["storage_options"] = storage_options
    settings = {
        "source": os.fspath(source),
        "format": format,
        "cf": cf,
        "mask": mask,
        "quant": quant,
        "target_psnr": target_psnr,
        "fields": overrides,
        "key": key,
        "channels_last": bool(channels_last),
        "nan": "error" if nan_fill is None else f"fill={nan_fill}",
        "codec": codec,
        "writer_options": dict(writer_options or {}),
    }

    src = open_source(source, key=key, channels_last=channels_last)
    root = out if url else partial_dir(out)
    journal = None
    owned = url  # whether an error may delete root (never a partial pack we could not read)
    keep_partial = False
    try:
        n = len(src)
        settings["samples"] = n
        writer = make_writer(format, options)
        specs = None
        if not url and os.path.isdir(root):
            if resume:
                journal = Journal.resume(root, settings)
                specs = journal.specs
                owned = True
            else:
                log.warning("%s: discarding an unfinished pack (use --resume to continue it)", root)
                shutil.rmtree(root)
        elif resume:
            log.warning("%s: --resume: no unfinished pack to resume; starting from the beginning", out)
        if specs is None:
            specs = plan_fields(
                src,
                cf=cf,
                mask=mask,
                quant=None if quant is None else QUANT_TO_DTYPE[quant],
                target_psnr=target_psnr,
                overrides=overrides,
                codec=codec,
                nan_fill=nan_fill,
                quiet=quiet,
            )
            if url:
                _remove_manifest(out, storage_options)  # an --overwrite target stops being a dataset now
            else:
                os.makedirs(root)
                owned = True
            writer.open(root, specs, n)
            if not url:
                journal = Journal.start(root, settings, specs)
        parts = writer.plan(specs, n)
        results: dict[int, dict] = journal.verified(parts) if journal is not None else {}
        if results:
            log.info("resuming: %d of %d parts already done and verified", len(results), len(parts))
        job = PartJob(
            os.fspath(source), key, bool(channels_last), specs, nan_fill, bool(strict), writer, root, n, threads=1
        )
        todo = [(i, a, b) for i, (a, b) in enumerate(parts) if i not in results]
        keep_partial = not url  # from here on an interruption leaves resumable work
        _run(
            job,
            todo,
            results,
            journal,
            src=src,
            workers=workers,
            scheduler=scheduler,
            quiet=quiet,
            total=len(parts),
            done=len(results),
        )
        ordered = [results[i] for i in range(len(parts))]
        stats = _combine_stats(specs, ordered)
        result = writer.finish(root, specs, n, ordered)
        manifest = Manifest(
            storage=format,
            samples=n,
            fields=specs,
            pack={
                "source": os.fspath(source),
                "cf": cf,
                "mask": mask,
                "quant": quant,
                "target_psnr": target_psnr,
                "nan": settings["nan"],
                "nan_filled": stats.pop("__nan_filled__"),
                "channels_last": bool(channels_last),
                "source_info": dict(src.info),
            },
            stats=stats,
            checksums=result.get("checksums", {}),
            layout=result.get("layout", {}),
        )
        if url:
            write_manifest_url(manifest, out, storage_options)  # the commit on an object store
        else:
            journal.remove()
            write_manifest(manifest, root)
            _commit(root, out)
        keep_partial = False
        owned = False
        return manifest
    except DctDataError:
        keep_partial = False  # a data or settings problem: a rerun starts over anyway
        raise
    finally:
        src.close()
        if keep_partial:
            log.warning("%s: pack interrupted; rerun the same command with --resume to finish it", root)
        elif owned and not url and os.path.isdir(root):
            shutil.rmtree(root, ignore_errors=True)


def _remove_manifest(out: str, storage_options: Mapping[str, Any]) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(out, **dict(storage_options))
    loc = path.rstrip("/") + "/" + MANIFEST_NAME
    if fs.exists(loc):
        fs.rm(loc)


def _commit(tmp: str, out: str) -> None:
    """Rename the finished temporary directory to OUT (replacing an old OUT only now)."""
    old = None
    if os.path.lexists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.replace(out, os.path.join(old, "d"))
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _run(
    job: "PartJob", todo, results: dict, journal, *, src, workers, scheduler, quiet: bool, total: int, done: int
) -> None:
    """Run the parts in `todo` (serially here, or on Dask), journaling each as it finishes."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=total, initial=done, unit="part", desc="pack", disable=quiet or not sys.stderr.isatty(), leave=False
    )

    def finished(res: dict) -> None:
        results[res["index"]] = res
        if journal is not None:
            journal.record(res)
        bar.update(1)

    try:
        if (workers or 1) > 1 or scheduler is not None:
            parallel_mod.run_parts(job, todo, workers=workers, scheduler=scheduler, on_done=finished)
        else:
            threads = torch.get_num_threads()
            try:
                for i, a, b in todo:
                    finished(run_part(job, i, a, b, src=src))
            finally:
                torch.set_num_threads(threads)
    finally:
        bar.close()


def _combine_stats(specs, parts: list[dict]) -> dict:
    stats: dict[str, Any] = {}
    for f in user_fields(specs):
        if f.is_dct:
            scores = [v for p in parts for v in p["stats"]["psnr"][f.name]]
            err = max(p["stats"]["max_error"][f.name] for p in parts)
            over = sum(p["stats"]["overflow"][f.name] for p in parts)
            # no scores: every sample was constant (PSNR undefined); max error still says how close
            stats[f.name] = FieldStats(
                min(scores) if scores else None, statistics.median(scores) if scores else None, err, over
            )
        else:
            stats[f.name] = FieldStats(math.inf, math.inf, 0.0, 0)
    stats["__nan_filled__"] = sum(p["stats"]["nan_filled"] for p in parts)
    return stats
