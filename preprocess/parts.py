"""One pack *part*: read samples [start, stop) from the source, encode them, hand them to the writer.

A part is the unit of parallel work (a Dask task), of progress (a `--resume` journal line) and of
output files (a zarr shard of every field, or one webdataset tar): parts never share a file, and a
part's bytes depend only on its samples and the shared CodecSpecs, so any execution order gives the
same dataset. `PartJob` is what every task gets: the source *name* (each process opens the source
itself; data never travels through the scheduler), the field specs chosen once by the client
(calibration included), and the writer (options only).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterator

import numpy as np
import torch

from dctdata.errors import DctDataError, OverflowCountError
from dctdata.format.fields import SIDE_SUFFIX, FieldSpec, user_fields
from dctdata.layer import Decompress
from dctdata.metrics import item_errors, psnr_from_mse
from dctdata.preprocess.sources import Source, open_source
from dctdata.quantize import F32_SAFE_MAX, encode
from dctdata.wire import split_wire

BATCH_BYTES = 16 << 20  # source bytes per encoding batch
_SOURCES: dict[tuple, Source] = {}  # per-process cache: a worker opens each source once


@dataclasses.dataclass(frozen=True)
class PartJob:
    source: str
    key: Any
    channels_last: bool
    specs: tuple[FieldSpec, ...]
    nan_fill: float | None
    strict: bool
    writer: Any
    root: str
    samples: int
    # torch intra-op threads while encoding: 1. Measured on 2 cores: the per-batch ops are small and
    # memory-bound, and torch's thread pool fighting zarr's/zstd's threads made a serial pack 2.3x
    # slower (29 s -> 12.8 s for 1 GiB); parallelism comes from Dask workers instead.
    threads: int | None = 1


def batch_size(specs: tuple[FieldSpec, ...]) -> int:
    per = sum(max(f.source_sample_bytes, 4 * math.prod(f.shape)) for f in specs)
    return max(1, min(4096, BATCH_BYTES // max(per, 1)))


def _source(job: PartJob) -> Source:
    k = (job.source, repr(job.key), job.channels_last, os.getpid())
    if k not in _SOURCES:
        _SOURCES[k] = open_source(job.source, key=job.key, channels_last=job.channels_last)
    return _SOURCES[k]


def check_finite(x: np.ndarray, name: str, nan_fill: float | None, where) -> np.ndarray:
    bad = ~np.isfinite(x)
    if bad.any():
        j = int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
        if nan_fill is None:
            raise DctDataError(
                f"{where(j)}: field {name!r}: expected finite values in a dct field. Got NaN/Inf "
                "(use --nan fill=VALUE, or store a mask field)"
            )
        x = np.where(bad, np.float32(nan_fill), x)
    peak = np.abs(x).reshape(len(x), -1).max(axis=1) if x.size else np.zeros(len(x))
    if (peak > F32_SAFE_MAX).any():  # the 8x8 DCT would overflow float32 to inf
        j = int(np.argmax(peak > F32_SAFE_MAX))
        raise DctDataError(
            f"{where(j)}: field {name!r}: expected |x| <= {F32_SAFE_MAX:.3g} in a dct field (float32 max / 8: the 8x8 "
            "DCT "
            f"multiplies by up to 8). Got max |x| = {float(peak[j]):.3g} (rescale the data, or use --field "
            f"{name}=array)"
        )
    return x


def run_part(job: PartJob, index: int, start: int, stop: int, src: Source | None = None) -> dict:
    """Encode and write part `index` (samples [start, stop)); returns its files and error figures."""
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    src = src if src is not None else _source(job)
    stats = {
        "psnr": {f.name: [] for f in job.specs if f.is_dct},
        "max_error": {f.name: 0.0 for f in job.specs if f.is_dct},
        "overflow": {f.name: 0 for f in job.specs if f.is_dct},
        "nan_filled": 0,
    }
    layers = {f.name: Decompress(f.codec, dtype=torch.float64, normalize=False) for f in job.specs if f.is_dct}
    batches = _encoded(job, src, start, stop, stats, layers)
    out = job.writer.write_part(job.root, job.specs, job.samples, index, start, stop, batches)
    return {"index": index, "start": start, "stop": stop, "stats": stats, **out}


def _encoded(
    job: PartJob, src: Source, start: int, stop: int, stats: dict, layers: dict
) -> Iterator[dict[str, np.ndarray]]:
    by_name = {f.name: f for f in user_fields(job.specs)}  # side partners are made here, not read
    seen = start
    with torch.inference_mode():
        for a, batch in src.batches(batch_size(job.specs), start, stop):
            b = len(next(iter(batch.values())))
            missing = sorted(set(by_name) - set(batch))
            if missing:
                raise DctDataError(f"{src.where(a)}: expected fields {list(by_name)}. Got no field {missing[0]!r}")
            stored = {}
            for name, f in by_name.items():
                x = batch[name]
                where = lambda j, s=a: src.where(s + j)  # noqa: E731
                expect = f.shape if not f.is_dct or x.ndim - 1 == 3 else f.shape[1:]
                if tuple(x.shape[1:]) != tuple(expect):
                    raise DctDataError(
                        f"{where(0)}: field {name!r}: expected per-sample shape {tuple(expect)}. Got "
                        f"{tuple(x.shape[1:])} (ragged samples)"
                    )
                if not f.is_dct:
                    if x.dtype.name != f.dtype:
                        raise DctDataError(
                            f"{where(0)}: field {name!r}: expected dtype {f.dtype} like sample 0. Got {x.dtype}"
                        )
                    stored[name] = np.ascontiguousarray(x)
                    continue
                xf = np.array(x, dtype=np.float32).reshape(b, *f.shape)
                if job.nan_fill is not None:
                    stats["nan_filled"] += int((~np.isfinite(xf)).sum())
                xf = check_finite(xf, name, job.nan_fill, where)
                xt = torch.from_numpy(np.ascontiguousarray(xf))
                wire, over = encode(xt, f.codec)
                if over:
                    stats["overflow"][name] += over
                    if job.strict:
                        raise OverflowCountError(
                            f"{where(0)}..{a + b - 1}: field {name!r}: expected no {f.codec.dtype} overflow "
                            "(--strict). "
                            f"Got {over} clamped coefficients"
                        )
                scores, err = _figures(xt, layers[name](wire))
                stats["psnr"][name].extend(scores)
                stats["max_error"][name] = max(stats["max_error"][name], err)
                q, side = split_wire(wire, f.codec)
                stored[name] = f.to_stored(q)
                if side is not None:
                    stored[name + SIDE_SUFFIX] = side.numpy()
            seen += b
            yield stored
    if seen != stop:
        raise DctDataError(
            f"{src.description}: expected samples {start}..{stop - 1}. Got {seen - start} (the source ended early)"
        )


def _figures(x: torch.Tensor, x_hat: torch.Tensor) -> tuple[list[float], float]:
    """Per-sample PSNR against each sample's value range, and the max abs error."""
    mse, rng, max_err = item_errors(x, x_hat, dims=3)
    # A constant sample (zero range) has no PSNR against its range: left out, not reported as -inf/NaN.
    return psnr_from_mse(mse, rng)[rng > 0].tolist(), max_err
