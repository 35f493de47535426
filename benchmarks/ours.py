"""dctdata's rate-distortion points, measured through the product and nothing else.

Each point is a real `dctdata.pack` of the pack's samples (from a temporary .npy) at one
`--target-psnr`, read back with `dctdata.open_dataset` and the dataset's own `decompressor()`. Its size
is every stored file the manifest lists (`manifest.stored_bytes`) plus manifest.json itself, its PSNR
the achieved dataset PSNR of what comes back. So the bench measures whatever the codec, calibration
and format are, without knowing their internals.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
import torch

import dctdata
from benchmarks.curves import Point, pack_psnr
from dctdata.errors import DctDataError
from dctdata.format import MANIFEST_NAME

# Wide enough to bracket 35, 40 and 45 dB both when packs land on their target and when they land up
# to 5 dB above it (calibration margins on small packs).
TARGETS = tuple(26.0 + 2.5 * k for k in range(10))  # 26 .. 48.5 dB


def read_back(path: str, name: str) -> tuple[np.ndarray, float, float]:
    """(reconstruction (N, C, H, W), read seconds, Decompress seconds) of a packed dataset's dct field."""
    t0 = time.perf_counter()
    ds = dctdata.open_dataset(path, fields=[name], as_dict=True)
    batch = ds[0 : len(ds)][name]  # a (coefficients, side) pair for a codec with per-sample side information
    t1 = time.perf_counter()
    with torch.inference_mode():
        out = ds.decompressor(name)(batch)
    return out.numpy(), t1 - t0, time.perf_counter() - t1


def stored_size(path: str, manifest) -> int:
    """Every byte the pack stores: its files (`manifest.stored_bytes`: those listed, and from format 8 the
    zarr.json files it does not list) plus the manifest itself."""
    return int(manifest.stored_bytes) + os.path.getsize(os.path.join(path, MANIFEST_NAME))


def metadata_size(path: str, manifest) -> int:
    """The pack's fixed bytes: manifest.json and every zarr.json (they cost the same for one sample or many),
    counted on disk (format 8 lists no zarr.json in the manifest)."""
    meta = sum(os.path.getsize(os.path.join(r, "zarr.json")) for r, _, files in os.walk(path) if "zarr.json" in files)
    return int(meta) + os.path.getsize(os.path.join(path, MANIFEST_NAME))


def dctdata_points(x: np.ndarray, targets: tuple[float, ...] = TARGETS, workdir: str | None = None) -> list[Point]:
    """One point per target; a target the pack refuses (DctDataError) becomes a failed point with its reason.

    The packs are written under `workdir` (a new temporary folder by default) and removed. The manifest
    records the source path, so its length counts in the size (a few tens of bytes)."""
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="dctdata-bench-rd-") as tmp:
            return dctdata_points(x, targets, tmp)
    source = os.path.join(workdir, "source.npy")
    np.save(source, np.ascontiguousarray(x, dtype=np.float32))
    points = []
    for target in targets:
        out = os.path.join(workdir, f"pack-{target:g}")
        setting = f"--target-psnr {target:g}"
        t0 = time.perf_counter()
        try:
            manifest = dctdata.pack(source, out, target_psnr=target, quiet=True)
        except DctDataError as exc:
            points.append(Point(setting, None, None, note=str(exc)))
            continue
        encode_s = time.perf_counter() - t0
        rec, read_s, decompress_s = read_back(out, manifest.field(kind="dct").name)
        size, meta = stored_size(out, manifest), metadata_size(out, manifest)
        shutil.rmtree(out)
        points.append(
            Point(
                setting,
                size,
                pack_psnr(x, rec),
                encode_s,
                read_s + decompress_s,
                note=f"read {read_s:.3f} s, Decompress {decompress_s:.3f} s, metadata {meta} B",
            )
        )
    os.remove(source)
    return points
