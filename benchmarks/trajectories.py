"""Trajectories: bytes on disk of a Well-format set against its HDF5 files (as written, with gzip, with
zstd where hdf5plugin is installed), and time windows/s of `dctdata.open_dataset(..., n_steps_input=...)`
against The Well's own `WellDataset` on the raw HDF5: the same windows, DataLoader workers 0 and 2, from a
zarr pack and from a webdataset pack (one trajectory a shard, so no window crosses shards). `--layout
pdebench` (or `both`) measures the same for one PDEBench-format file.

    python -m benchmarks trajectories [--layout well|pdebench|both] [--files 2] [--traj 4] [--steps 40]
        [--size 64] [--target-psnr 40] [--n-in 4] [--n-out 1] [--batch 16] [--workers 0 2] [--epochs 2]
        [--json OUT]

Also the relative L2 error of every channel's frames (what surrogate papers report), mean and worst.

Data: `dctdata.datasets.well` shallow-water files (height, velocity (2 components), a constant
bathymetry per trajectory), float32. Windows/s: `torch.utils.data.DataLoader(ds, batch_size,
num_workers, shuffle=False)` over every window of both datasets (WellDataset needs `the_well`: without
it only dctdata's rows are measured); a warm-up epoch, then the best of `--epochs`, the two datasets
alternating inside each round so they see the same machine load. Torch runs one thread in the main
process and in each worker (`dctdata.loaders.threads.worker_init`) for both.

PDEBench layout (`--layout pdebench|both`): one file of `--files * --traj` trajectories in PDEBench's
per-variable 2-D CFD layout (`dctdata.datasets.well.write_pdebench_file`: `density`, `pressure`, `Vx`,
`Vy`, the same shallow-water model), packed as `dctdata pack FILE OUT --target-psnr T` does. PDEBench
ships no window loader on PyPI, so its peer is `H5Windows` below: a minimal torch Dataset that reads the
same windows from the HDF5 file with h5py (one slice per variable a window, the file opened once per
process). Its results are under the JSON's "pdebench" key; the Well layout's at the top level.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

import dctdata
from dctdata.datasets.well import write_pdebench_file, write_well_file
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


class H5Windows(torch.utils.data.Dataset):
    """The windows of a PDEBench per-variable file read with h5py: item i is trajectory i // per, start
    step i % per, `input_fields` (n_in, x, y, c) and `output_fields` (n_out, x, y, c), the channels the
    variables in sorted order (dctdata's field order)."""

    def __init__(self, path: str, n_steps_input: int, n_steps_output: int) -> None:
        import h5py

        from dctdata.preprocess.sources.pdebench import _variables

        self.path, self.n_in, self.n_out = path, n_steps_input, n_steps_output
        with h5py.File(path, "r") as fh:
            self.variables = _variables(fh)
            n, steps = fh[self.variables[0]].shape[:2]
        self.per = steps - n_steps_input - n_steps_output + 1
        self.n = n * self.per
        self._fh = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import h5py
        import numpy as np

        if self._fh is None:  # opened in the process that reads (each DataLoader worker its own)
            self._fh = h5py.File(self.path, "r")
        t, s = divmod(i, self.per)
        w = np.stack([self._fh[v][t, s : s + self.n_in + self.n_out] for v in self.variables], axis=-1)
        w = torch.from_numpy(w)
        return {"input_fields": w[: self.n_in], "output_fields": w[self.n_in :]}


def relative_l2(raw: str, pack: str, source=None) -> dict[str, dict[str, float]]:
    """Per channel of the windows' fields: the relative L2 error ||x' - x|| / ||x|| of every frame (frames
    whose reference is all zero left out), its mean and worst, read back through full-trajectory windows
    and compared with the HDF5 files as WellDataset would read them (`WellSource`'s frames, or `source`'s:
    a trajectory source of the raw file, e.g. `PDEBenchSource`)."""
    import numpy as np

    from dctdata.preprocess.sources.well import WellSource

    ds = dctdata.open_dataset(pack, n_steps_input=1, full_trajectory_mode=True, max_rollout_steps=1 << 30)
    src = WellSource(raw) if source is None else source
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


def _hdf5_rows(raw: str, d: str) -> dict[str, int]:
    """Bytes of the raw folder as written, with gzip-4 + shuffle and with zstd-9 where hdf5plugin is installed."""
    sizes = {"HDF5 as written": _size(raw)}
    _recompress(raw, os.path.join(d, "gzip"), compression="gzip", compression_opts=4, shuffle=True)
    sizes["HDF5 gzip-4 + shuffle"] = _size(os.path.join(d, "gzip"))
    try:
        import hdf5plugin

        _recompress(raw, os.path.join(d, "zstd"), **hdf5plugin.Zstd(clevel=9))
        sizes["HDF5 zstd-9 (hdf5plugin)"] = _size(os.path.join(d, "zstd"))
    except ImportError:
        pass
    return sizes


def _windows_rows(a, datasets_for) -> list[dict]:
    """Windows/s of every reader `datasets_for()` gives, per worker count: a warm-up epoch, then the best
    of `a.epochs`, the readers alternating inside each round."""
    rows: list[dict] = []
    for workers in a.workers:
        loaders = {
            name: torch.utils.data.DataLoader(
                ds,
                batch_size=a.batch,
                num_workers=workers,
                persistent_workers=workers > 0,
                worker_init_fn=worker_init if workers else None,
            )
            for name, ds in datasets_for().items()
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
        rows += [{"reader": k, "workers": workers, "windows": n, "seconds": s} for k, (n, s) in best.items()]
    return rows


def _run(a, d: str, raw: str, source_file: str | None, peers) -> dict:
    """Pack `raw` (a folder of files, or `source_file` inside it when given) to zarr and webdataset at the
    target; bytes, relative L2 and the windows/s of both packs and of `peers(window)`'s readers."""
    result: dict = {}
    src = source_file or raw
    sizes = _hdf5_rows(raw, d)
    pack = os.path.join(d, "pack.zarr")
    t0 = time.perf_counter()
    m = dctdata.pack(src, pack, target_psnr=a.target_psnr, quiet=True)
    result["pack_seconds"] = time.perf_counter() - t0
    sizes[f"dctdata zarr at {a.target_psnr:g} dB"] = _size(pack)
    wds = os.path.join(d, "pack.wds")  # the same target; one trajectory a shard
    dctdata.pack(
        src, wds, format="webdataset", target_psnr=a.target_psnr, quiet=True,
        writer_options={"samples_per_shard": a.steps},
    )  # fmt: skip
    sizes[f"dctdata webdataset at {a.target_psnr:g} dB"] = _size(wds)
    result["bytes"] = sizes
    result["psnr_min"] = {k: v.psnr_min for k, v in m.stats.items()}
    if source_file is None:
        result["relative_l2"] = relative_l2(raw, pack)
    else:
        from dctdata.preprocess.sources.pdebench import PDEBenchSource

        result["relative_l2"] = relative_l2(raw, pack, PDEBenchSource(source_file, "variables"))
    window = dict(n_steps_input=a.n_in, n_steps_output=a.n_out)

    def datasets_for() -> dict:
        return {
            "dctdata": dctdata.open_dataset(pack, **window),
            "dctdata webdataset": dctdata.open_dataset(wds, shuffle=False, **window),
            **peers(window),
        }

    result["windows"] = _windows_rows(a, datasets_for)
    return result


def _print(title: str, r: dict) -> None:
    print(f"{title}\n")
    raw_bytes = r["bytes"]["HDF5 as written"]
    print("| stored as | bytes | vs HDF5 |")
    print("|---|---:|---:|")
    for name, n in r["bytes"].items():
        print(f"| {name} | {n} | {raw_bytes / n:.2f}x |")
    print()
    print("| channel | relative L2, mean | worst frame |")
    print("|---|---:|---:|")
    for name, e in r["relative_l2"].items():
        print(f"| {name} | {e['mean']:.4f} | {e['max']:.4f} |")
    print()
    print("| reader | workers | windows/s |")
    print("|---|---:|---:|")
    for w in r["windows"]:
        print(f"| {w['reader']} | {w['workers']} | {w['windows'] / w['seconds']:.0f} |")
    print()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks trajectories", description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", choices=["well", "pdebench", "both"], default="well", help="the raw files' layout")
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--traj", type=int, default=4, help="trajectories per file (pdebench: files * traj in one file)")
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
    torch.set_num_threads(1)
    result: dict = {"settings": vars(a)}
    if a.layout in ("well", "both"):
        try:
            from the_well.data import WellDataset
        except ImportError:
            WellDataset = None
        with tempfile.TemporaryDirectory() as d:
            raw = os.path.join(d, "raw")
            os.makedirs(raw)
            for i in range(a.files):
                write_well_file(os.path.join(raw, f"part{i:02d}.h5"), a.traj, a.steps, a.size, seed=i)

            def well_peers(window: dict) -> dict:
                return {} if WellDataset is None else {"WellDataset (HDF5)": WellDataset(path=raw, **window)}

            result.update(_run(a, d, raw, None, well_peers))
        _print("The Well layout", result)
    if a.layout in ("pdebench", "both"):
        with tempfile.TemporaryDirectory() as d:
            raw = os.path.join(d, "raw")
            os.makedirs(raw)
            path = write_pdebench_file(os.path.join(raw, "2D_CFD_Train.hdf5"), a.files * a.traj, a.steps, a.size)

            def pdebench_peers(window: dict) -> dict:
                return {"h5py windows (HDF5)": H5Windows(path, **window)}

            result["pdebench"] = _run(a, d, raw, path, pdebench_peers)
        _print("PDEBench layout (per-variable 2-D CFD)", result["pdebench"])
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
