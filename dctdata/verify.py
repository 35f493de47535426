"""`dctdata verify`: checksums of every stored file, a full decode of every sample, and counts.

One checker for every storage, through its reader (`dctdata.format.reader`): the stored files' sizes
and sha256, then each stored unit (a webdataset shard, a zarr field) read with every integrity check and
its dct samples decoded. Problems are collected, one line each naming the file (or chunk) and the
samples it affects, instead of stopping at the first, so one run tells everything that is wrong with a
pack. A field packed under `--max-error` also has its recorded largest error per channel (measured on every
sample at pack time) checked against the bound.

A trajectory pack (The Well, PDEBench, --time-dim) also has its figures per time step checked: every frame
at or above its field's per-sample floor, as recorded at pack time; and with the source (`reference`, the
CLI's `--source`), every decoded frame is measured against the source's frame again (PSNR and relative L2
error per channel), reported per field, channel and step range, and each frame below the floor named.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from dctdata.codec.metrics import frame_figures
from dctdata.decoder.decode_check import nonfinite_samples
from dctdata.decoder.layer import Decompress
from dctdata.errors import DctDataError
from dctdata.format import storages
from dctdata.format.fields import user_fields
from dctdata.format.location import check_location, manifest_location
from dctdata.format.manifest import Manifest, read_manifest
from dctdata.report import (
    FLOOR_SLACK_DB,
    StepFigures,
    floor_problems,
    frame_steps,
    step_ranges,
    time_table,
    trajectory_offsets,
)

DECODE_BATCH = 64
FRAMES_NAMED = 10  # frames below the floor named per field (all are counted)


def _bad_decodes(layer: Decompress | None, batch: object, where: Callable[[int], str], first: int) -> list[str]:
    """One line per sample of a batched wire value that decodes to NaN/Inf."""
    if layer is None:
        return []
    return [f"{where(first + j)}: expected finite decoded values. Got NaN/Inf" for j in nonfinite_samples(layer, batch)]


def bound_problems(m: Manifest) -> list[str]:
    """One line per channel of a field packed under `--max-error` whose recorded largest error (measured
    on every sample at pack time) exceeds the bound."""
    out: list[str] = []
    for f in m.fields:
        stats = m.stats.get(f.name)
        bound = f.codec.max_error if f.codec is not None else None  # dct fields only have a codec
        if bound is None or stats is None:
            continue
        for c, ch in enumerate(stats.channels or ()):
            if ch.max_abs_error is not None and ch.max_abs_error > bound:
                out.append(
                    f"field {f.name!r} channel {c}: expected a largest error <= {bound:g} (--max-error). "
                    f"Got {ch.max_abs_error:g} recorded"
                )
    return out


def verify_dataset(
    path_or_url: str | os.PathLike,
    decode: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    allow_pipe: bool = False,
    reference: Callable[[int, int], Mapping[str, np.ndarray]] | None = None,
    describe: Callable[[int], str] | None = None,
    ranges: Any = None,
) -> tuple[list[str], dict[str, Any]]:
    """(problems, summary): problems are one line each, naming the file/chunk and samples. A trajectory pack's
    summary has `over_time`: the table of its figures per field, channel and step range (`ranges`, as
    `dctdata.report.step_ranges` takes them), measured against the source when `reference(a, b)` gives the
    source's samples [a, b) by field (`describe(i)` names source sample i), else as recorded at pack time."""
    s = check_location(path_or_url, allow_pipe)
    if s.startswith("pipe:"):
        root = s
        m = storages.streaming().reader.stream_manifest(s, storage_options)  # the storage that reads streams
    else:
        root, _ = manifest_location(s)
        m = read_manifest(s, storage_options)
    reader = storages.open_reader(root, m, storage_options=storage_options)
    summary: dict[str, Any] = {"samples": m.samples, "fields": len(m.names), "decoded": None, "files": len(m.checksums)}
    problems = reader.check_files() + bound_problems(m)
    recorded = StepFigures.from_manifest(m)
    if recorded is not None:
        problems += floor_problems(recorded, list(m.fields))
        summary["over_time"] = time_table(recorded.rows(step_ranges(ranges, recorded.steps), list(m.fields)))
    check = None if reference is None else _SourceCheck(m, root, reference, describe)
    if check is not None and not decode:
        raise DctDataError(f"{root}: --source: expected a decode to measure (without --no-decode)")
    if check is not None:
        step_ranges(ranges, check.figures.steps)  # a bad --step-ranges fails before the decode
    if not (decode or reader.units_hash_files):
        return problems, summary
    layers = {f.name: Decompress(f.dct_codec) for f in m.fields if f.coded} if decode else {}
    seen = {f.name: 0 for f in user_fields(m.fields)}
    for unit in reader.units():
        try:
            for first, values in reader.read_unit(unit, DECODE_BATCH if decode else 0):
                if isinstance(values, DctDataError):  # a bad part of a unit that reading goes on past
                    problems.append(str(values))
                    continue
                for name, batch in zip(unit.fields, values):
                    seen[name] += len(batch[0] if isinstance(batch, tuple) else batch)
                    where = lambda i, n=name, u=unit.name: f"{u}: sample {i} field {n!r}"  # noqa: E731
                    problems += _bad_decodes(layers.get(name), batch, where, first)
                    if check is not None and name in layers:
                        check.add(name, batch, first)
        except DctDataError as exc:
            problems.append(str(exc))
    if decode:
        summary["decoded"] = min(seen.values())
        for name, n in seen.items():
            if n != m.samples and not problems:
                problems.append(f"{root}: field {name!r}: expected {m.samples} samples. Got {n}")
    if check is not None:
        problems += check.problems()
        rows = check.figures.rows(step_ranges(ranges, check.figures.steps), list(m.fields))
        summary["over_time"] = time_table(rows)
        summary["over_time_rows"] = rows
    return problems, summary


class _SourceCheck:
    """Every decoded frame of a trajectory pack against the source's frame: its figures per time step, and the
    frames below their field's per-sample floor."""

    def __init__(self, m, root: str, reference, where) -> None:
        offsets = trajectory_offsets(m.pack.get("source_info"))
        if offsets is None:
            raise DctDataError(
                f"{root}: --source: expected a pack of trajectories (The Well's or PDEBench's layout, --time-dim). "
                "Got a pack of independent samples"
            )
        self.offsets: np.ndarray = offsets
        self.specs = {f.name: (f, f.codec) for f in m.fields if f.codec is not None}  # the dct fields
        self.layers = {name: Decompress(codec, normalize=False) for name, (_, codec) in self.specs.items()}
        self.figures = StepFigures.for_trajectories({name: f.shape[0] for name, (f, _) in self.specs.items()}, offsets)
        self.reference = reference
        self.where = where or (lambda i: f"sample {i} (step {int(frame_steps(offsets, i, 1)[0])})")
        self.cached: tuple[int, int, Mapping[str, np.ndarray]] | None = None
        self.low: dict[str, list[tuple[int, int, float]]] = {name: [] for name in self.specs}

    def _source(self, a: int, b: int) -> Mapping[str, np.ndarray]:
        if self.cached is None or self.cached[:2] != (a, b):  # one read for a webdataset unit's fields
            self.cached = (a, b, self.reference(a, b))
        return self.cached[2]

    def add(self, name: str, batch, first: int) -> None:
        f, codec = self.specs[name]
        with torch.inference_mode():
            decoded = self.layers[name](batch)
        n = len(decoded)
        src = self._source(first, first + n)
        if name not in src:
            raise DctDataError(f"{self.where(first)}: --source: expected field {name!r}. Got fields {sorted(src)}")
        x = torch.from_numpy(np.asarray(src[name], dtype=np.float64).reshape(n, *f.shape))
        finite = torch.isfinite(x)
        valid = None if bool(finite.all()) else finite
        scores, errors, _ = frame_figures(torch.nan_to_num(x), decoded, codec.dims, valid)
        psnr, rel = scores.cpu().numpy(), errors.cpu().numpy()
        below = None
        if codec.min_psnr is not None:
            below = psnr < codec.min_psnr - FLOOR_SLACK_DB
            self.low[name] += [(first + int(i), int(c), float(psnr[i, c])) for i, c in zip(*np.nonzero(below))]
        self.figures.add(name, frame_steps(self.offsets, first, n), psnr, rel, below)

    def problems(self) -> list[str]:
        out = []
        for name, low in self.low.items():
            floor = self.specs[name][1].min_psnr
            for i, c, db in sorted(low, key=lambda h: h[2])[:FRAMES_NAMED]:
                out.append(
                    f"{self.where(i)} field {name!r} channel {c}: expected a PSNR >= the "
                    f"per-sample floor {floor:.2f} dB against the source. Got {db:.2f} dB"
                )
            if len(low) > FRAMES_NAMED:
                out.append(f"field {name!r}: {len(low) - FRAMES_NAMED} more frame(s) below the floor {floor:.2f} dB")
        return out
