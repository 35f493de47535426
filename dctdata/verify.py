"""`dctdata verify`: checksums of every stored file, a full decode of every sample, and counts.

One checker for every storage, through its reader (`dctdata.format.reader`): the stored files' sizes
and sha256, then each stored unit (a webdataset shard, a zarr field) read with every integrity check and
its dct samples decoded. Problems are collected, one line each naming the file (or chunk) and the
samples it affects, instead of stopping at the first, so one run tells everything that is wrong with a
pack. A field packed under `--max-error` also has its recorded largest error per channel (measured on every
sample at pack time) checked against the bound.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from dctdata.decoder.decode_check import nonfinite_samples
from dctdata.decoder.layer import Decompress
from dctdata.errors import DctDataError
from dctdata.format import storages
from dctdata.format.fields import user_fields
from dctdata.format.location import check_location, manifest_location
from dctdata.format.manifest import Manifest, read_manifest

DECODE_BATCH = 64


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
) -> tuple[list[str], dict[str, Any]]:
    """(problems, summary): problems are one line each, naming the file/chunk and samples."""
    s = check_location(path_or_url, allow_pipe)
    if s.startswith("pipe:"):
        root = s
        m = storages.streaming().reader.stream_manifest(s, storage_options)  # the storage that reads streams
    else:
        root, _ = manifest_location(s)
        m = read_manifest(s, storage_options)
    reader = storages.open_reader(root, m, storage_options=storage_options)
    summary = {"samples": m.samples, "fields": len(m.names), "decoded": None, "files": len(m.checksums)}
    problems = reader.check_files() + bound_problems(m)
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
        except DctDataError as exc:
            problems.append(str(exc))
    if decode:
        summary["decoded"] = min(seen.values())
        for name, n in seen.items():
            if n != m.samples and not problems:
                problems.append(f"{root}: field {name!r}: expected {m.samples} samples. Got {n}")
    return problems, summary
