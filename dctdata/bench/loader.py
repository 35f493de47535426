"""`dctdata bench loader`: samples/s through DataLoader(num_workers) to the model input.

One synthetic set (the em_denoise stand-in's noisy micrographs in an 8-bit value range, so JPEG/PNG
can hold them) stored
four ways, each read with shuffle through a DataLoader and turned into the float32 (B, 1, H, W)
tensor a model consumes:
- dctdata zarr: coefficients (calibrated int8 at a target PSNR) -> `Decompress` in the main process;
- raw float32 zarr (uncompressed, one sample per chunk) -> as is;
- PNG files -> torchvision.io.decode_png in the workers -> float;
- JPEG files (quality chosen so its median PSNR reaches dctdata's) -> torchvision.io.decode_jpeg.
Reported: samples/s (best of `--epochs`), stored bytes read per sample, median PSNR.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np
import torch

from dctdata.metrics import psnr


def synthetic(n: int, size: int, seed: int = 0) -> np.ndarray:
    """float32 (n, 1, size, size) in 0..255 (whole numbers): noisy micrographs from the em stand-in."""
    from dctdata.datasets import em_denoise

    ds = em_denoise(n=n, size=size, seed=seed)
    x = np.stack([ds[i]["noisy"] for i in range(n)]).astype(np.float64)
    lo, hi = x.min(axis=(1, 2, 3), keepdims=True), x.max(axis=(1, 2, 3), keepdims=True)
    return np.rint(255.0 * (x - lo) / np.maximum(hi - lo, 1e-12)).astype(np.float32)


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


def run_loader_bench(n=512, size=256, target_psnr=40.0, batch=32, workers=2, epochs=2, workdir=None):
    import zarr
    from PIL import Image

    import dctdata

    torch.set_num_threads(1)
    x = synthetic(n, size)
    xt = torch.from_numpy(x)
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
        os.makedirs(jpg_dir)
        for q in (75, 85, 90, 95, 98, 100):
            jpg = [os.path.join(jpg_dir, f"{i:05d}.jpg") for i in range(n)]
            for f, im in zip(jpg, u8):
                Image.fromarray(im).save(f, quality=q)
            dec = np.stack([np.asarray(Image.open(f)) for f in jpg[:64]]).astype(np.float32)
            jp = float(statistics.median(psnr(xt[:64, 0], torch.from_numpy(dec)).tolist()))
            if jp >= dct_psnr:
                break
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
