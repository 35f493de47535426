"""The format-independent pack orchestrator: source -> per-field encoding -> a Writer -> manifest last.

    pack(source, out, format="zarr", cf=None, mask="square", quant="none", target_psnr=None, ...)

Steps: open the source (`dctdata.preprocess.sources`), decide each field's kind (floating arrays with
>= 2 dims per sample -> `dct`, integer scalars -> `label`, everything else -> `array`; a source may
default decoded images to `dct`; `fields={"mask": "array"}` overrides), build a CodecSpec per `dct`
field (from cf/mask/quant directly, or from `dctdata.calibrate` on up to 64 evenly spaced samples when
quant is int8/int16 or a target PSNR is set), then stream batches: validate shapes/dtypes/NaN, encode
`dct` fields with `dctdata.encode`, decode them again to measure PSNR (per sample, against its value
range) and max error, count overflows, and hand the stored arrays to the writer. The manifest is
written last, into a temporary sibling directory that is renamed to OUT only when everything worked;
on any error the temporary directory is removed, so OUT never holds a partial dataset.

Defaults without a target PSNR: cf=4, mask square, quant none (fp32): 16 of 64 frequencies kept, a
4x smaller tensor on the device. With `target_psnr`, calibration chooses whatever of cf/mask/quant is
left None (smallest stored size that reaches the target).

Writer interface (one per storage format; `dctdata.preprocess.zarr_writer`, and the webdataset writer
`dctdata.preprocess.wds_writer`). A writer module defines `make_writer(**options) -> Writer`, where:

    class Writer:
        def open(self, directory: str, fields: tuple[FieldSpec, ...], n_samples: int) -> None
            # directory exists and is empty (the temporary sibling); write every data file under it.
        def write(self, start: int, batch: dict[str, np.ndarray]) -> None
            # samples [start, start + B) in order, called with consecutive starts; batch[name] has
            # shape (B, *field.stored_shape) and dtype field.stored_dtype (see dctdata.format).
            # Batch sizes are the orchestrator's choice; a writer buffers as its layout needs.
        def close(self) -> dict
            # flush; return {"layout": {...storage-specific manifest entries...},
            #                "checksums": {relative path: {"sha256": hex, "bytes": n}}}
        def abort(self) -> None
            # release open files after an error (the orchestrator deletes the directory).

Writers never compute error figures and never write the manifest; the orchestrator does both.
"""

from __future__ import annotations

import importlib
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

from dctdata.errors import DctDataError, OverflowCountError
from dctdata.format import STORAGES, FieldSpec, FieldStats, Manifest, write_manifest
from dctdata.layer import Decompress
from dctdata.lossless import DEFAULT_CODEC, parse_codec_config
from dctdata.metrics import psnr
from dctdata.quantize import encode
from dctdata.spec import QUANT_TO_DTYPE, CodecSpec
from dctdata.transform import parse_cf, parse_mask
from dctdata.preprocess.sources import Source, open_source

log = logging.getLogger(__name__)

DEFAULT_CF = 4
CALIBRATION_SAMPLES = 64
BATCH_BYTES = 16 << 20  # source bytes per encoding batch
WRITER_MODULES = {"zarr": "dctdata.preprocess.zarr_writer", "webdataset": "dctdata.preprocess.wds_writer"}


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
        if kind not in ("dct", "array", "label"):
            raise DctDataError(f"--field {name}: expected kind dct, array or label. Got {kind!r}")
        out[str(name)] = kind
    return out


def default_kind(shape: tuple[int, ...], dtype: np.dtype) -> str:
    if dtype.kind == "f" and len(shape) >= 2:
        return "dct"
    if dtype.kind in "iu" and shape == ():
        return "label"
    return "array"


def dct_shape(name: str, shape: tuple[int, ...], where: str) -> tuple[int, int, int]:
    """Per-sample shape of a dct field as (C, H, W)."""
    if len(shape) == 2:
        return (1, *shape)
    if len(shape) == 3:
        return shape
    hint = " (channels-last data? use --channels-last)" if len(shape) == 3 else ""
    raise DctDataError(f"{where}: field {name!r}: expected 2 or 3 dims per sample for kind dct ((H, W) or (C, H, W)). Got {shape}{hint}")


def _calibrate(x: torch.Tensor, name: str, cf, mask, quant, target_psnr) -> CodecSpec:
    try:
        from dctdata.calibrate import calibrate
    except ImportError as exc:
        raise DctDataError(
            f"field {name!r}: --quant {quant}"
            + (f" --target-psnr {target_psnr}" if target_psnr is not None else "")
            + " needs calibration (dctdata.calibrate), which is unavailable in this build. Got no calibrate module; "
            "use --quant none|fp16|bf16 with --cf"
        ) from exc
    return calibrate(x, cf=cf, mask=mask, quant=quant, target_psnr=target_psnr)


def plan_fields(
    source: Source,
    *,
    cf: int | None,
    mask: str | None,
    quant: str | None,
    target_psnr: float | None,
    overrides: dict[str, str],
    codec: dict,
    nan_fill: float | None,
) -> tuple[FieldSpec, ...]:
    probe = source.probe()
    unknown = sorted(set(overrides) - set(probe))
    if unknown:
        raise DctDataError(f"--field {unknown[0]}: expected one of the source's fields {list(probe)}. Got no such field")
    needs_calibration = quant in ("int8", "int16") or target_psnr is not None
    if target_psnr is None:
        cf = DEFAULT_CF if cf is None else cf
        mask = mask or "square"
        quant = quant or "float32"
    specs = []
    n = len(source)
    for name, (shape, dtype) in probe.items():
        kind = overrides.get(name) or source.default_kinds.get(name) or default_kind(shape, dtype)
        if dtype.kind not in "biuf":
            raise DctDataError(f"{source.description}: field {name!r}: expected a numeric dtype. Got {dtype}")
        if kind == "label" and shape != ():
            raise DctDataError(f"{source.description}: field {name!r}: expected one scalar per sample for kind label. Got shape {shape}")
        spec = None
        if kind == "dct":
            if dtype.kind == "b":
                raise DctDataError(f"{source.description}: field {name!r}: expected numbers for kind dct. Got bool (use --field {name}=array)")
            shape = dct_shape(name, shape, source.description)
            c, h, w = shape
            if needs_calibration:
                idx = sorted({int(i) for i in np.linspace(0, n - 1, min(n, CALIBRATION_SAMPLES))})
                x = source.take(idx)[name].reshape(len(idx), c, h, w).astype(np.float32)
                x = _check_finite(x, name, nan_fill, lambda j: source.where(idx[j]))
                spec = _calibrate(torch.from_numpy(x), name, cf, mask, quant, target_psnr)
                if not isinstance(spec, CodecSpec) or spec.sample_shape != shape:
                    raise DctDataError(f"field {name!r}: calibration: expected a CodecSpec for shape {shape}. Got {spec!r}")
            else:
                spec = CodecSpec(cf=cf, height=h, width=w, channels=c, mask=mask, dtype=quant)
        specs.append(FieldSpec(name, kind, shape, dtype.name, spec, codec))
    return tuple(specs)


def _check_finite(x: np.ndarray, name: str, nan_fill: float | None, where) -> np.ndarray:
    bad = ~np.isfinite(x)
    if bad.any():
        j = int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
        if nan_fill is None:
            raise DctDataError(
                f"{where(j)}: field {name!r}: expected finite values in a dct field. Got NaN/Inf "
                "(use --nan fill=VALUE, or store a mask field)"
            )
        x = np.where(bad, np.float32(nan_fill), x)
    return x


def get_writer(format: str, options: Mapping[str, Any] | None = None):
    if format not in STORAGES:
        raise DctDataError(f"--format: expected one of {STORAGES}. Got {format!r}")
    name = WRITER_MODULES[format]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise DctDataError(f"--format {format}: expected the writer module {name}. Got none in this build") from exc
    return module.make_writer(**dict(options or {}))


def _check_out(out: str, overwrite: bool) -> str:
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a local directory path. Got {type(out).__name__}")
    out = os.path.abspath(os.fspath(out))
    if "://" in os.fspath(out):
        raise DctDataError(f"OUT: expected a local directory (pack writes locally; copy to object storage after). Got {out}")
    if os.path.lexists(out) and not overwrite:
        raise DctDataError(f"{out}: expected an OUT path that does not exist. Got an existing path (use --overwrite to replace it)")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise DctDataError(f"{out}: expected an existing parent directory. Got missing {parent}")
    return out


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
    codec: Mapping[str, Any] | None = DEFAULT_CODEC,
    writer_options: Mapping[str, Any] | None = None,
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
    if target_psnr is not None and (isinstance(target_psnr, bool) or not isinstance(target_psnr, (int, float)) or not target_psnr > 0):
        raise DctDataError(f"--target-psnr: expected a positive number of dB. Got {target_psnr!r}")
    if (workers not in (None, 1)) or scheduler is not None:
        raise DctDataError(
            f"--workers/--scheduler: parallel and Dask packing are not yet supported. Expected --workers 1 and no --scheduler. "
            f"Got workers={workers!r} scheduler={scheduler!r}"
        )
    nan_fill = parse_nan(nan)
    overrides = parse_field_overrides(fields)
    codec = parse_codec_config(codec)
    out = _check_out(out, overwrite)

    src = open_source(source, key=key, channels_last=channels_last)
    tmp = None
    writer = None
    try:
        specs = plan_fields(
            src, cf=cf, mask=mask, quant=None if quant is None else QUANT_TO_DTYPE[quant], target_psnr=target_psnr,
            overrides=overrides, codec=codec, nan_fill=nan_fill,
        )  # fmt: skip
        n = len(src)
        writer = get_writer(format, writer_options)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=os.path.dirname(out))
        writer.open(tmp, specs, n)
        stats = _encode_all(src, specs, writer, strict=strict, nan_fill=nan_fill, quiet=quiet)
        result = writer.close()
        writer = None
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
                "nan": "error" if nan_fill is None else f"fill={nan_fill}",
                "nan_filled": stats.pop("__nan_filled__"),
                "channels_last": bool(channels_last),
                "source_info": dict(src.info),
            },
            stats=stats,
            checksums=result.get("checksums", {}),
            layout=result.get("layout", {}),
        )
        write_manifest(manifest, tmp)
        _commit(tmp, out)
        tmp = None
        return manifest
    finally:
        if writer is not None:
            try:
                writer.abort()
            except Exception:  # noqa: BLE001 - the original error matters more
                log.debug("writer.abort failed", exc_info=True)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        src.close()


def _commit(tmp: str, out: str) -> None:
    """Rename the finished temporary directory to OUT (replacing an old OUT only now)."""
    old = None
    if os.path.lexists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.replace(out, os.path.join(old, "d"))
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _batch_size(specs: tuple[FieldSpec, ...]) -> int:
    per = sum(max(f.source_sample_bytes, 4 * math.prod(f.shape)) for f in specs)
    return max(1, min(4096, BATCH_BYTES // max(per, 1)))


def _encode_all(src: Source, specs, writer, *, strict: bool, nan_fill, quiet: bool) -> dict:
    from tqdm.auto import tqdm

    n = len(src)
    by_name = {f.name: f for f in specs}
    layers = {f.name: Decompress(f.codec, dtype=torch.float64, normalize=False) for f in specs if f.kind == "dct"}
    scores: dict[str, list[float]] = {k: [] for k in layers}
    max_err = {k: 0.0 for k in layers}
    overflow = {f.name: 0 for f in specs}
    nan_filled = 0
    seen = 0
    bar = tqdm(total=n, unit="sample", desc="pack", disable=quiet or not sys.stderr.isatty(), leave=False)
    try:
        for start, batch in src.batches(_batch_size(specs)):
            b = len(next(iter(batch.values())))
            missing = sorted(set(by_name) - set(batch))
            if missing:
                raise DctDataError(f"{src.where(start)}: expected fields {list(by_name)}. Got no field {missing[0]!r}")
            stored = {}
            for name, f in by_name.items():
                x = batch[name]
                where = lambda j, s=start: src.where(s + j)  # noqa: E731
                expect = f.shape if f.kind != "dct" or x.ndim - 1 == 3 else f.shape[1:]
                if tuple(x.shape[1:]) != tuple(expect):
                    raise DctDataError(
                        f"{where(0)}: field {name!r}: expected per-sample shape {tuple(expect)}. Got {tuple(x.shape[1:])} (ragged samples)"
                    )
                if f.kind != "dct":
                    if x.dtype.name != f.dtype:
                        raise DctDataError(f"{where(0)}: field {name!r}: expected dtype {f.dtype} like sample 0. Got {x.dtype}")
                    stored[name] = np.ascontiguousarray(x)
                    continue
                xf = np.array(x, dtype=np.float32).reshape(b, *f.shape)
                if nan_fill is not None:
                    nan_filled += int((~np.isfinite(xf)).sum())
                xf = _check_finite(xf, name, nan_fill, where)
                xt = torch.from_numpy(np.ascontiguousarray(xf))
                q, over = encode(xt, f.codec)
                if over:
                    overflow[name] += over
                    if strict:
                        raise OverflowCountError(
                            f"{where(0)}..{start + b - 1}: field {name!r}: expected no {f.codec.dtype} overflow (--strict). "
                            f"Got {over} clamped coefficients"
                        )
                x_hat = layers[name](q)
                scores[name].extend(psnr(xt, x_hat, dims=3).tolist())
                max_err[name] = max(max_err[name], float((xt.double() - x_hat).abs().max()))
                stored[name] = f.to_stored(q)
            writer.write(start, stored)
            seen += b
            bar.update(b)
    finally:
        bar.close()
    if seen != n:
        raise DctDataError(f"{src.description}: expected {n} samples. Got {seen}")
    stats: dict[str, Any] = {}
    for f in specs:
        if f.kind == "dct":
            s = scores[f.name]
            stats[f.name] = FieldStats(min(s), statistics.median(s), max_err[f.name], overflow[f.name])
        else:
            stats[f.name] = FieldStats(math.inf, math.inf, 0.0, 0)
    stats["__nan_filled__"] = nan_filled
    return stats
