"""`dctdata verify OUT`: checksums of every stored file, a full decode of every sample, and counts.

Exit 0 when all is well; exit 1 listing each problem with the file/chunk and samples it affects.
"""

from __future__ import annotations

import hashlib
import math
import os
import re

import torch

from dctdata.errors import DctDataError
from dctdata.format import Manifest, is_url, join, manifest_location, read_manifest, zarr_layout


def register(sub) -> None:
    p = sub.add_parser("verify", help="check checksums, decode every sample, check counts (exit 1 on any problem)")
    p.add_argument("dataset", metavar="OUT", help="packed dataset directory or URL")
    p.add_argument("--no-decode", action="store_true", help="checksums and counts only")
    p.set_defaults(func=_main)


def _open(path: str):
    if is_url(path):
        import fsspec

        return fsspec.open(path, "rb").open()
    return open(path, "rb")


def _sha256(path: str) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with _open(path) as fh:
        while block := fh.read(1 << 20):
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _samples_of(m: Manifest, rel: str) -> str:
    """Which samples a stored file holds (zarr shard keys `<field>/c.<i>.0...`, webdataset shards)."""
    match = re.match(r"^([A-Za-z_]\w*)/c\.(\d+)(\.0)*$", rel)
    try:
        arrays = zarr_layout(m) if m.storage == "zarr" else {}
    except DctDataError:
        arrays = {}
    if match and match.group(1) in arrays:
        shard = arrays[match.group(1)]["shard"]
        i = int(match.group(2))
        return f" (field {match.group(1)!r}, samples {i * shard}..{min((i + 1) * shard, m.samples) - 1})"
    start = 0
    shards = m.layout.get("shards", []) if isinstance(m.layout, dict) else []
    for s in shards if isinstance(shards, list) else []:
        n = s.get("samples", 0) if isinstance(s, dict) else 0
        n = n if isinstance(n, int) and not isinstance(n, bool) else 0
        if isinstance(s, dict) and s.get("name") == rel:
            return f" (samples {start}..{start + n - 1})"
        start += n
    return ""


def check_files(root: str, m: Manifest) -> tuple[list[str], int]:
    entries = dict(m.checksums)
    for s in m.layout.get("shards", []) if isinstance(m.layout, dict) else []:
        if isinstance(s, dict) and {"name", "sha256", "bytes"} <= set(s) and s["name"] not in entries:
            entries[s["name"]] = {"sha256": s["sha256"], "bytes": s["bytes"]}
    problems = []
    for rel, e in entries.items():
        path = join(root, *rel.split("/"))
        try:
            digest, size = _sha256(path)
        except FileNotFoundError:
            problems.append(f"{path}: expected a stored file. Got none (missing){_samples_of(m, rel)}")
            continue
        if size != e["bytes"] or digest != e["sha256"]:
            problems.append(
                f"{path}: expected sha256 {e['sha256'][:16]}... and {e['bytes']} bytes. Got {digest[:16]}... and {size} bytes{_samples_of(m, rel)}"
            )
    return problems, len(entries)


def check_zarr_decode(root: str, m: Manifest) -> tuple[list[str], int]:
    from dctdata.errors import IntegrityError
    from dctdata.loaders.zarr_dataset import DCTZarrDataset

    problems, seen = [], {}
    layout = zarr_layout(m, where=join(root, "manifest.json"))
    for f in m.fields:
        ds = DCTZarrDataset(root, manifest=m, fields=[f.name])
        layer = ds.decompressor(f.name) if f.kind == "dct" else None
        chunk = layout[f.name]["chunk"]
        seen[f.name] = 0
        try:
            ds._ensure_open()  # metadata problems once per field, not once per chunk
        except DctDataError as exc:
            problems.append(str(exc))
            continue
        for a in range(0, m.samples, chunk):
            b = min(a + chunk, m.samples)
            try:
                batch = torch.stack([s[0] for s in ds.__getitems__(list(range(a, b)))])
            except (IntegrityError, DctDataError) as exc:
                problems.append(str(exc))
                continue
            seen[f.name] += len(batch)
            if layer is not None:
                with torch.inference_mode():
                    x = layer(batch)
                bad = ~torch.isfinite(x.flatten(1)).all(1)
                for j in bad.nonzero().flatten().tolist():
                    problems.append(f"{root}: field {f.name!r} sample {a + j}: expected finite decoded values. Got NaN/Inf")
    for name, n in seen.items():
        if n != m.samples and not problems:
            problems.append(f"{root}: field {name!r}: expected {m.samples} samples. Got {n}")
    return problems, min(seen.values()) if seen else 0


def check_generic_decode(root: str, m: Manifest) -> tuple[list[str], int]:
    from dctdata.api import open_dataset

    n = 0
    try:
        ds = open_dataset(root)
        layers = {f.name: ds.decompressor(f.name) for f in m.fields if f.kind == "dct"}
        for sample in ds:
            values = sample if isinstance(sample, dict) else dict(zip(m.names, sample))
            for name, layer in layers.items():
                if not torch.isfinite(layer(values[name].unsqueeze(0))).all():
                    return [f"{root}: field {name!r} sample {n}: expected finite decoded values. Got NaN/Inf"], n
            n += 1
    except DctDataError as exc:
        return [str(exc)], n
    if n != m.samples:
        return [f"{root}: expected {m.samples} samples. Got {n}"], n
    return [], n


def verify_dataset(path_or_url: str, decode: bool = True) -> tuple[list[str], dict]:
    """(problems, summary): problems are one line each, naming the file/chunk and samples."""
    root, _ = manifest_location(path_or_url)
    m = read_manifest(path_or_url)
    if m.storage == "webdataset":  # one pass per shard: size + sha256, tar structure, full decode
        from dctdata.loaders.wds_dataset import verify_webdataset

        return verify_webdataset(path_or_url, decode=decode)
    problems, n_files = check_files(root, m)
    decoded = None
    if decode:
        more, decoded = (check_zarr_decode if m.storage == "zarr" else check_generic_decode)(root, m)
        problems += more
    return problems, {"samples": m.samples, "files": n_files, "decoded": decoded, "fields": len(m.fields)}


def _main(args) -> int:
    problems, summary = verify_dataset(args.dataset, decode=not args.no_decode)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        print(f"dctdata verify: {len(problems)} problem(s) in {args.dataset}")
        return 1
    decoded = "" if summary["decoded"] is None else f", {summary['decoded']} samples x {summary['fields']} fields decoded"
    print(f"OK {args.dataset}: {summary['samples']} samples, {summary['files']} files checksummed{decoded}")
    return 0
