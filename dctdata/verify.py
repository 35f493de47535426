"""`dctdata verify`: checksums of every stored file, a full decode of every sample, and counts.

Problems are collected, one line each naming the file (or chunk) and the samples it affects, instead
of stopping at the first, so one run tells everything that is wrong with a pack.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from dctdata.decode_check import nonfinite_samples
from dctdata.errors import DctDataError
from dctdata.format.checksum import sha256_file
from dctdata.format.fields import assemble, user_fields, with_partners
from dctdata.format.location import join, manifest_location
from dctdata.format.manifest import Manifest, read_manifest
from dctdata.format.webdataset.layout import samples_of_file, shard_list
from dctdata.format.webdataset.reader import Files, ShardReader, check_location, codecs_for
from dctdata.format.zarr.layout import shard_of_file, zarr_layout
from dctdata.format.zarr.reader import ZarrReader
from dctdata.layer import Decompress

DECODE_BATCH = 64


def _bad_decodes(layer: Decompress | None, batch, where, first: int) -> list[str]:
    """One line per sample of a batched wire value that decodes to NaN/Inf."""
    if layer is None:
        return []
    return [f"{where(first + j)}: expected finite decoded values. Got NaN/Inf" for j in nonfinite_samples(layer, batch)]


def check_files(root: str, m: Manifest, storage_options: Mapping[str, Any] | None = None) -> tuple[list[str], int]:
    """Size and sha256 of every file the manifest lists."""
    problems = []
    for rel, e in m.checksums.items():
        path = join(root, *rel.split("/"))
        which = shard_of_file(m, rel) if m.storage == "zarr" else samples_of_file(m, rel)
        try:
            digest, size = sha256_file(path, storage_options, root=root, limit=e["bytes"])
        except FileNotFoundError:
            problems.append(f"{path}: expected a stored file. Got none (missing){which}")
            continue
        except OSError as exc:  # a FIFO, device or link out of the pack (SpecialFileError), permissions
            problems.append(f"{path}: expected a readable stored file. Got {type(exc).__name__}: {exc}{which}")
            continue
        if size != e["bytes"] or digest != e["sha256"]:
            problems.append(
                f"{path}: expected sha256 {e['sha256'][:16]}... and {e['bytes']} bytes. Got {digest[:16]}... and "
                f"{size} bytes{which}"
            )
    return problems, len(m.checksums)


def check_zarr_decode(
    root: str, m: Manifest, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[str], int]:
    """Read every chunk of every field through the integrity-checking reader; decode dct fields."""
    problems, seen = [], {}
    layout = zarr_layout(m, where=join(root, "manifest.json"))
    for f in user_fields(m.fields):
        fields = with_partners(m.fields, [f.name])  # a dct field and its side partner decode together
        reader = ZarrReader(root, m, fields, storage_options)
        layer = Decompress(f.codec) if f.is_dct else None
        chunk = layout[f.name]["chunk"]
        seen[f.name] = 0
        try:
            reader.ensure_open()  # metadata problems once per field, not once per chunk
        except DctDataError as exc:
            problems.append(str(exc))
            continue
        for a in range(0, m.samples, chunk):
            b = min(a + chunk, m.samples)
            try:
                (batch,) = assemble(fields, [g.to_tensor(reader.read(g, a, b)) for g in fields])
            except DctDataError as exc:
                problems.append(str(exc))
                continue
            seen[f.name] += b - a
            problems += _bad_decodes(layer, batch, lambda i, f=f: f"{root}: field {f.name!r} sample {i}", a)
    for name, n in seen.items():
        if n != m.samples and not problems:
            problems.append(f"{root}: field {name!r}: expected {m.samples} samples. Got {n}")
    return problems, min(seen.values()) if seen else 0


def check_webdataset(files: Files, m: Manifest, decode: bool) -> tuple[list[str], int, int]:
    """One pass per shard: size + sha256, tar structure and sample keys, and (decode) every sample."""
    shards = shard_list(m, files.location("manifest.json"))
    codecs = codecs_for(m.fields)
    layers = {f.name: Decompress(f.codec) for f in m.fields if f.is_dct} if decode else {}
    names = [f.name for f in user_fields(m.fields)]
    problems: list[str] = []
    decoded = 0
    for entry in shards:
        try:
            shard = ShardReader(files, entry, m.fields, codecs)
            if not decode:
                continue
            for a in range(0, len(shard), DECODE_BATCH):
                rows = [shard.decode(j) for j in range(a, min(a + DECODE_BATCH, len(shard)))]
                stacked = assemble(m.fields, [torch.stack([r[k] for r in rows]) for k in range(len(m.fields))])
                for name, batch in zip(names, stacked):
                    where = lambda i, n=name, s=shard: f"{s.where}: sample {i} field {n!r}"  # noqa: E731
                    problems += _bad_decodes(layers.get(name), batch, where, entry["start"] + a)
                decoded += len(rows)
        except DctDataError as exc:
            problems.append(str(exc))
    if decode and decoded != m.samples and not problems:
        problems.append(f"{files.root}: expected {m.samples} samples. Got {decoded}")
    return problems, len(shards), decoded


def verify_dataset(
    path_or_url: str | os.PathLike,
    decode: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    allow_pipe: bool = False,
) -> tuple[list[str], dict[str, Any]]:
    """(problems, summary): problems are one line each, naming the file/chunk and samples."""
    s = check_location(path_or_url, allow_pipe)
    if s.startswith("pipe:"):
        files = Files(s, storage_options)
        m = files.manifest()
    else:
        root, _ = manifest_location(s)
        files = Files(root, storage_options)
        m = read_manifest(s, storage_options)
    summary = {"samples": m.samples, "fields": len(m.names), "decoded": None}
    if m.storage == "webdataset":
        problems, summary["files"], decoded = check_webdataset(files, m, decode)
        summary["decoded"] = decoded if decode else None
        return problems, summary
    problems, summary["files"] = check_files(files.root, m, storage_options)
    if decode:
        more, summary["decoded"] = check_zarr_decode(files.root, m, storage_options)
        problems += more
    return problems, summary
