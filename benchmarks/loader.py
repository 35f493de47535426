"""`python -m benchmarks loader`: samples/s through DataLoader(num_workers) to the model input.

One synthetic set (the em_denoise stand-in's noisy micrographs in an 8-bit value range, so JPEG/PNG
can hold them) stored
four ways, each read with shuffle through a DataLoader and turned into the float32 (B, 1, H, W)
tensor a model consumes:
- dctdata zarr: coefficients (calibrated int8 at a target PSNR) -> `Decompress` in the main process;
- raw float32 zarr (uncompressed, one sample per chunk) -> as is;
- PNG files -> torchvision.io.decode_png in the workers -> float;
- JPEG files (quality chosen so its median PSNR reaches dctdata's) -> torchvision.io.decode_jpeg.
Reported: samples/s (best of `--epochs`), stored bytes read per sample, median PSNR.

`run_batch_bench` times the read path alone: one batch of random stored samples to arrays, the
dctdata zarr reader against tensorstore and zarr-python on the same pack and on raw float32 zarr, at one
thread and at all cores.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np
import torch
from sci_fields import micrographs as synthetic  # the set of every loader bench: tests/sci_fields.py
from torch.utils.data import default_collate

from dctdata.codec.metrics import psnr


class _Files(torch.utils.data.Dataset):
    def __init__(self, files, kind):
        self.files, self.kind = files, kind

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torchvision.io as tio

        data = tio.read_file(self.files[i])
        img = tio.decode_png(data) if self.kind == "png" else tio.decode_jpeg(data)
        return img


class _RawZarr(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path, self.arr, self.pid = path, None, None

    def __len__(self):
        import zarr

        return zarr.open_array(self.path, mode="r").shape[0]

    def __getstate__(self):
        return {"path": self.path, "arr": None, "pid": None}

    def __getitem__(self, i):
        if self.pid != os.getpid():
            import zarr

            self.arr, self.pid = zarr.open_array(self.path, mode="r"), os.getpid()
        return torch.from_numpy(self.arr[i])


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _time_loader(ds, to_input, batch, workers, epochs) -> float:
    best = 0.0
    for e in range(epochs):
        loader = torch.utils.data.DataLoader(
            ds,
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            generator=torch.Generator().manual_seed(e),
            persistent_workers=False,
        )
        n, t0 = 0, time.perf_counter()
        with torch.inference_mode():
            for b in loader:
                x = to_input(b)
                n += x.shape[0]
        best = max(best, n / (time.perf_counter() - t0))
    return best


def jpeg_files(u8: np.ndarray, directory: str, target_psnr: float, qualities=(75, 85, 90, 95, 98, 100)):
    """JPEG files of uint8 images (N, H, W) at the first quality whose median PSNR on the first 64
    reaches `target_psnr`: (quality, paths, that median PSNR)."""
    from PIL import Image

    os.makedirs(directory, exist_ok=True)
    ref = torch.from_numpy(u8[:64].astype(np.float32))
    for q in qualities:
        paths = [os.path.join(directory, f"{i:05d}.jpg") for i in range(len(u8))]
        for f, im in zip(paths, u8):
            Image.fromarray(im).save(f, quality=q)
        dec = np.stack([np.asarray(Image.open(f)) for f in paths[:64]]).astype(np.float32)
        got = float(statistics.median(psnr(ref, torch.from_numpy(dec)).tolist()))
        if got >= target_psnr:
            break
    return q, paths, got


def run_batch_bench(n=2048, size=256, batch=32, target_psnr=40.0, rounds=3, batches=20, workdir=None):
    """Milliseconds to turn one batch of `batch` random stored samples into arrays (median over
    `batches` batches, best of `rounds` rounds; within a round the cases take turns in blocks of
    batches, `_time_interleaved`) from a local pack: the dctdata zarr reader
    (coefficients) of the default pack (its lossless stage chosen by size, usually the entropy coder) and
    of a `--lossless zstd` pack (zstd-19: what a user who wants tensorstore-speed reads packs; on this
    bench's field its streams decoded 1.25-1.93x as fast as zstd-9's, benchmarks/zstd_levels.py),
    tensorstore and zarr-python on that zstd pack (they cannot decode the entropy coder), and both on raw
    float32 zarr of the same samples. The dctdata reader and tensorstore run at one
    thread and at all cores (the reader: torch's threads = the cores; tensorstore: its default
    concurrency), so each row has a like-for-like tensorstore raw float32 row. Rows: name, threads
    ("1" or "all"), ms, bytes_per_sample."""
    import tensorstore as ts
    import zarr

    import dctdata
    from dctdata.loaders.threads import available_cores
    from dctdata.stages import ZSTD_MAX

    before = torch.get_num_threads()
    cores = available_cores()
    x = synthetic(n, size)
    rng = np.random.default_rng(0)
    picks = [np.sort(rng.choice(n, batch, replace=False)) for _ in range(batches)]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        np.save(os.path.join(tmp, "x.npy"), x)
        out, raw = os.path.join(tmp, "dct"), os.path.join(tmp, "raw.zarr")
        zstd = os.path.join(tmp, "dct-zstd")
        dctdata.pack(os.path.join(tmp, "x.npy"), out, quant="int8", target_psnr=target_psnr, quiet=True)
        zstd_stage = dict(ZSTD_MAX)
        dctdata.pack(
            os.path.join(tmp, "x.npy"), zstd, quant="int8", target_psnr=target_psnr, lossless=zstd_stage, quiet=True
        )
        zpack = f"--lossless zstd pack (zstd-{zstd_stage['level']})"
        zarr.create_array(raw, shape=x.shape, chunks=(1, *x.shape[1:]), dtype="float32", compressors=None)[:] = x
        ds = dctdata.open_dataset(out)
        layer = ds.decompressor()

        def ts_array(path, one_thread):  # its default pools decode and copy chunks in parallel
            one = {"data_copy_concurrency": {"limit": 1}, "file_io_concurrency": {"limit": 1}}
            spec = {
                "driver": "zarr3",
                "kvstore": {"driver": "file", "path": path},
                "context": one if one_thread else {},
            }
            return ts.open(spec, read=True).result()

        ds_zstd = dctdata.open_dataset(zstd)
        stage = ds.manifest.field("image").lossless.get("id", "raw")
        ts_dct, ts_raw = ts_array(os.path.join(zstd, "image"), True), ts_array(raw, True)
        ts_dct_all, ts_raw_all = ts_array(os.path.join(zstd, "image"), False), ts_array(raw, False)
        z_dct, z_raw = zarr.open_array(os.path.join(zstd, "image"), mode="r"), zarr.open_array(raw, mode="r")
        ours = lambda d: lambda i: d.__getitems__(i.tolist())  # noqa: E731
        all_cores = f"{cores} threads"
        cases = {  # name: (read one batch, pack, torch threads: 1 or the cores)
            f"dctdata zarr reader, default pack ({stage}; coefficients), 1 thread": (ours(ds), out, 1),
            f"dctdata zarr reader, default pack ({stage}; coefficients), {all_cores}": (ours(ds), out, cores),
            "dctdata zarr reader + Decompress, 1 thread": (
                lambda i: layer(default_collate(ds.__getitems__(i.tolist()))[0]),
                out,
                1,
            ),
            f"dctdata zarr reader, {zpack} (coefficients), 1 thread": (ours(ds_zstd), zstd, 1),
            f"dctdata zarr reader, {zpack} (coefficients), {all_cores}": (ours(ds_zstd), zstd, cores),
            "tensorstore, same zstd pack (no missing-chunk check), 1 thread": (
                lambda i: ts_dct.oindex[i].read().result(),
                zstd,
                1,
            ),
            "tensorstore, same zstd pack (no missing-chunk check), default concurrency": (
                lambda i: ts_dct_all.oindex[i].read().result(),
                zstd,
                cores,
            ),
            "zarr-python, same zstd pack (no missing-chunk check)": (
                lambda i: z_dct.get_orthogonal_selection((i,)),
                zstd,
                1,
            ),
            "tensorstore, raw float32 zarr, 1 thread": (lambda i: ts_raw.oindex[i].read().result(), raw, 1),
            "tensorstore, raw float32 zarr, default concurrency": (
                lambda i: ts_raw_all.oindex[i].read().result(),
                raw,
                cores,
            ),
            "zarr-python, raw float32 zarr": (lambda i: z_raw.get_orthogonal_selection((i,)), raw, 1),
        }
        best = {name: float("inf") for name in cases}
        try:
            with torch.inference_mode():
                for _ in range(rounds):
                    times = _time_interleaved(cases, picks)
                    best = {name: min(best[name], float(np.median(times[name]))) for name in cases}
        finally:
            torch.set_num_threads(before)
        return [
            {
                "name": name,
                "threads": "1" if threads == 1 else "all",
                "ms": 1e3 * best[name],
                "bytes_per_sample": _dir_bytes(root) / n,
            }
            for name, (_, root, threads) in cases.items()
        ]


def _time_interleaved(cases: dict, picks: list, block: int = 5) -> dict[str, list[float]]:
    """{name: seconds per batch} for every case of `run_batch_bench` over every batch of `picks`. The
    cases take turns in blocks of `block` batches, so all of them see the machine in the same states (a
    shared machine's speed moves within seconds); each block starts with one untimed batch, which wakes
    the threads the case uses after the other cases ran (turns of one batch penalised the all-cores
    rows, measured). Case c reads picks[(k + c * block) % len(picks)] at step k: neighbouring cases
    read different batches in a round (a batch the case before just read would be in cache)."""
    n = len(picks)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for first in range(0, n, block):
        for c, (name, (fn, _, threads)) in enumerate(cases.items()):
            torch.set_num_threads(threads)
            fn(picks[(first - 1 + c * block) % n])
            for k in range(first, min(first + block, n)):
                t0 = time.perf_counter()
                fn(picks[(k + c * block) % n])
                times[name].append(time.perf_counter() - t0)
    return times


def format_batch_rows(rows) -> str:
    """The read-path table; each row's ratio is against tensorstore on raw float32 at the same threads
    (one thread, or all cores: tensorstore's default concurrency)."""
    base = {r["threads"]: r["ms"] for r in rows if r["name"].startswith("tensorstore, raw")}
    lines = [
        "| read path | ms per batch | vs tensorstore raw float32, same threads | stored bytes/sample |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['ms']:.2f} | {r['ms'] / base[r['threads']]:.2f}x | {r['bytes_per_sample']:.0f} |"
        )
    return "\n".join(lines)


def run_loader_bench(n=512, size=256, target_psnr=40.0, batch=32, workers=2, epochs=2, workdir=None):
    import zarr
    from PIL import Image

    import dctdata

    torch.set_num_threads(1)
    x = synthetic(n, size)
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        np.save(os.path.join(tmp, "x.npy"), x)
        out = os.path.join(tmp, "dct")
        dctdata.pack(os.path.join(tmp, "x.npy"), out, quant="int8", target_psnr=target_psnr, quiet=True)
        ds = dctdata.open_dataset(out)
        layer = ds.decompressor()
        dct_psnr = ds.manifest.stats["image"].psnr_median
        spec = ds.manifest.field("image").codec
        rows.append(
            {
                "pipeline": f"dctdata zarr (cf={spec.cf} {spec.mask} {spec.dtype}) + Decompress",
                "sps": _time_loader(ds, lambda b: layer(b[0]), batch, workers, epochs),
                "bytes": _dir_bytes(out) / n,
                "psnr": dct_psnr,
            }
        )
        raw = os.path.join(tmp, "raw.zarr")
        arr = zarr.create_array(raw, shape=x.shape, chunks=(1, 1, size, size), dtype="float32", compressors=None)
        arr[:] = x
        rows.append(
            {
                "pipeline": "raw float32 zarr",
                "sps": _time_loader(_RawZarr(raw), lambda b: b.float(), batch, workers, epochs),
                "bytes": _dir_bytes(raw) / n,
                "psnr": float("inf"),
            }
        )
        u8 = x[:, 0].astype(np.uint8)
        png_dir = os.path.join(tmp, "png")
        os.makedirs(png_dir)
        png = [os.path.join(png_dir, f"{i:05d}.png") for i in range(n)]
        for f, im in zip(png, u8):
            Image.fromarray(im).save(f)
        rows.append(
            {
                "pipeline": "PNG + torchvision decode_png",
                "sps": _time_loader(_Files(png, "png"), lambda b: b.float(), batch, workers, epochs),
                "bytes": _dir_bytes(png_dir) / n,
                "psnr": float("inf"),
            }
        )
        jpg_dir = os.path.join(tmp, "jpg")
        q, jpg, jp = jpeg_files(u8, jpg_dir, dct_psnr)
        rows.append(
            {
                "pipeline": f"JPEG q={q} + torchvision decode_jpeg",
                "sps": _time_loader(_Files(jpg, "jpeg"), lambda b: b.float(), batch, workers, epochs),
                "bytes": _dir_bytes(jpg_dir) / n,
                "psnr": jp,
            }
        )
    return rows


def format_rows(rows) -> str:
    base = rows[0]["sps"]
    lines = ["| pipeline | samples/s | vs dctdata | bytes read/sample | median PSNR dB |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        p = "lossless" if r["psnr"] == float("inf") else f"{r['psnr']:.1f}"
        lines.append(f"| {r['pipeline']} | {r['sps']:.0f} | {r['sps'] / base:.2f}x | {r['bytes']:.0f} | {p} |")
    return "\n".join(lines)
