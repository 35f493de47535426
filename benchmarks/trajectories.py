"""Trajectories: bytes on disk of a Well-format set against its HDF5 files (as written, with gzip, with
zstd where hdf5plugin is installed), and time windows/s of `dctdata.open_dataset(..., n_steps_input=...)`
against The Well's own `WellDataset` on the raw HDF5: the same windows, DataLoader workers 0 and 2, from a
zarr pack and from a webdataset pack (one trajectory a shard, so no window crosses shards).

    python -m benchmarks trajectories [--files 2] [--traj 4] [--steps 40] [--size 64] [--target-psnr 40]
        [--n-in 4] [--n-out 1] [--batch 16] [--workers 0 2] [--epochs 2] [--json OUT]

Also the relative L2 error of every channel's frames (what surrogate papers report), mean and worst.

Data: `dctdata.datasets.well` shallow-water files (height, velocity (2 components), a constant
bathymetry per trajectory), float32. Windows/s: `torch.utils.data.DataLoader(ds, batch_size,
num_workers, shuffle=False)` over every window of both datasets (WellDataset needs `the_well`: without
it only dctdata's rows are measured); a warm-up epoch, then the best of `--epochs`, the two datasets
alternating inside each round so they see the same machine load. Torch runs one thread in the main
process and in each worker (`dctdata.loaders.threads.worker_init`) for both.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import dctdata
from dctdata.datasets.well import write_well_file
from dctdata.loaders.threads import worker_init


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _recompress(src_dir: str, dst_dir: str, **options) -> None:
    """Copy every HDF5 file of a folder with its datasets rewritten under `options` (chunked by frame)."""
    import h5py

    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        with h5py.File(os.path.join(src_dir, name)) as a, h5py.File(os.path.join(dst_dir, name), "w") as b:
            for k, v in a.attrs.items():
                b.attrs[k] = v

            def copy(path, obj, a=a, b=b):
                if isinstance(obj, h5py.Group):
                    g = b.require_group(path)
                    for k, v in obj.attrs.items():
                        g.attrs[k] = v
                elif isinstance(obj, h5py.Dataset):
                    big = obj.ndim >= 3 and obj.size >= 4096
                    chunks = (1, 1, *obj.shape[2:]) if big and obj.ndim >= 4 else True if big else None
                    d = b.create_dataset(path, data=obj[()], chunks=chunks, **(options if big else {}))
                    for k, v in obj.attrs.items():
                        d.attrs[k] = v

            a.visititems(copy)


def relative_l2(raw: str, pack: str) -> dict[str, dict[str, float]]:
    """Per channel of the windows' fields: the relative L2 error ||x' - x|| / ||x|| of every frame (frames
    whose reference is all zero left out), its mean and worst, read back through full-trajectory windows
    and compared with the HDF5 files as WellDataset would read them (`WellSource`'s frames)."""
    import numpy as np

    from dctdata.preprocess.sources.well import WellSource

    ds = dctdata.open_dataset(pack, n_steps_input=1, full_trajectory_mode=True, max_rollout_steps=1 << 30)
    src = WellSource(raw)
    errors: dict[str, list[float]] = {c: [] for c in ds.field_names}
    for i in range(len(ds)):
        item = ds[i]
        got = torch.cat([item["input_fields"], item["output_fields"]]).numpy()
        frames = ds.frame_indices(i)
        ref = src.read_batch(int(frames[0]), int(frames[-1]) + 1)
        ref = np.concatenate([np.moveaxis(ref[f["stored"]], 1, -1) for f in ds.info["fields"]], axis=-1)
        for c, name in enumerate(ds.field_names):
            a, b = got[..., c].reshape(len(got), -1), ref[..., c].reshape(len(ref), -1)
            norm = np.linalg.norm(b, axis=1)
            keep = norm > 0
            errors[name] += (np.linalg.norm(a - b, axis=1)[keep] / norm[keep]).tolist()
    src.close()
    return {c: {"mean": float(np.mean(e)), "max": float(np.max(e))} for c, e in errors.items() if e}


def _epoch(loader) -> tuple[int, float]:
    t0, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch["input_fields"])
    return n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks trajectories", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--traj", type=int, default=4, help="trajectories per file")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--n-in", type=int, default=4)
    p.add_argument("--n-out", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2], help="none: bytes and errors only")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", default=None, help="write the results here as JSON")
    a = p.parse_args(argv)
    if min(a.files, a.traj, a.epochs, a.batch) < 1 or a.steps < a.n_in + a.n_out or min(a.workers, default=0) < 0:
        raise SystemExit("--files/--traj/--epochs/--batch >= 1, --steps >= n_in + n_out, --workers >= 0: expected")
    try:
        from the_well.data import WellDataset
    except ImportError:
        WellDataset = None
    torch.set_num_threads(1)
    result: dict = {"settings": vars(a), "bytes": {}, "windows": []}
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "raw")
        os.makedirs(raw)
        for i in range(a.files):
            write_well_file(os.path.join(raw, f"part{i:02d}.h5"), a.traj, a.steps, a.size, seed=i)
        sizes = {"HDF5 as written": _size(raw)}
        _recompress(raw, os.path.join(d, "gzip"), compression="gzip", compression_opts=4, shuffle=True)
        sizes["HDF5 gzip-4 + shuffle"] = _size(os.path.join(d, "gzip"))
        try:
            import hdf5plugin

            _recompress(raw, os.path.join(d, "zstd"), **hdf5plugin.Zstd(clevel=9))
            sizes["HDF5 zstd-9 (hdf5plugin)"] = _size(os.path.join(d, "zstd"))
        except ImportError:
            pass
        pack = os.path.join(d, "pack.zarr")
        t0 = time.perf_counter()
        m = dctdata.pack(raw, pack, target_psnr=a.target_psnr, quiet=True)
        result["pack_seconds"] = time.perf_counter() - t0
        sizes[f"dctdata zarr at {a.target_psnr:g} dB"] = _size(pack)
        wds = os.path.join(d, "pack.wds")  # the same target; one trajectory a shard
        dctdata.pack(
            raw, wds, format="webdataset", target_psnr=a.target_psnr, quiet=True,
            writer_options={"samples_per_shard": a.steps},
        )  # fmt: skip
        sizes[f"dctdata webdataset at {a.target_psnr:g} dB"] = _size(wds)
        result["bytes"] = sizes
        result["psnr_min"] = {k: v.psnr_min for k, v in m.stats.items()}
        result["relative_l2"] = relative_l2(raw, pack)
        window = dict(n_steps_input=a.n_in, n_steps_output=a.n_out)
        for workers in a.workers:
            datasets = {
                "dctdata": dctdata.open_dataset(pack, **window),
                "dctdata webdataset": dctdata.open_dataset(wds, shuffle=False, **window),
            }
            if WellDataset is not None:
                datasets["WellDataset (HDF5)"] = WellDataset(path=raw, **window)
            loaders = {
                name: torch.utils.data.DataLoader(
                    ds,
                    batch_size=a.batch,
                    num_workers=workers,
                    persistent_workers=workers > 0,
                    worker_init_fn=worker_init if workers else None,
                )
                for name, ds in datasets.items()
            }
            for loader in loaders.values():
                _epoch(loader)  # warm-up: workers start, files open
            best: dict[str, tuple[int, float]] = {}
            for _ in range(a.epochs):
                for name, loader in loaders.items():
                    n, s = _epoch(loader)
                    if name not in best or s < best[name][1]:
                        best[name] = (n, s)
            del loaders
            result["windows"] += [
                {"reader": k, "workers": workers, "windows": n, "seconds": s} for k, (n, s) in best.items()
            ]
    raw_bytes = result["bytes"]["HDF5 as written"]
    print("| stored as | bytes | vs HDF5 |")
    print("|---|---:|---:|")
    for name, n in result["bytes"].items():
        print(f"| {name} | {n} | {raw_bytes / n:.2f}x |")
    print()
    print("| channel | relative L2, mean | worst frame |")
    print("|---|---:|---:|")
    for name, e in result["relative_l2"].items():
        print(f"| {name} | {e['mean']:.4f} | {e['max']:.4f} |")
    print()
    print("| reader | workers | windows/s |")
    print("|---|---:|---:|")
    for r in result["windows"]:
        print(f"| {r['reader']} | {r['workers']} | {r['windows'] / r['seconds']:.0f} |")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
