"""decode="cpu" against decode="device": bytes crossing to the device per sample and loader throughput with
the decompressor, for the default pack (entropy coder) and the zstd pack, zarr and webdataset.

    python -m benchmarks device-decode --size 256 --samples 512 --workers 2 --device cpu
    python -m benchmarks device-decode --size 256 --samples 2048 --workers 8 --device cuda --json out.json

Each row packs a synthetic set (smooth fields with Poisson noise, `--target-psnr`), then runs `--epochs`
epochs of `make_loader` (`--batch` samples, `--workers` workers, pinned on CUDA) through
`ds.decompressor()` on `--device`, and reports the best epoch's samples/s, the stored bytes per sample
(the pack's files over its samples), and the bytes per sample that reached the decompressor (the
coefficient tensors for decode="cpu", `StoredBatch.nbytes` for decode="device"). Both modes of a row
run side by side in one process, so their ratio is what to read on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

import dctdata
from dctdata.decoder.wire import StoredBatch
from dctdata.loaders.device import DevicePrefetcher
from dctdata.loaders.distributed import make_loader
from dctdata.stages import AUTO, ZSTD_MAX


def fields(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Smooth random fields (products of sines) with Poisson counts, float32 (n, 1, size, size)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    out = np.empty((n, 1, size, size), np.float32)
    for i in range(n):
        a, b, p = rng.uniform(1, 6, 3)
        out[i, 0] = rng.poisson((20 + 10 * np.sin(a * np.pi * xx + p) * np.cos(b * np.pi * yy)) * 4) / 4.0
    return out


def crossed(value) -> int:
    """Bytes of a batch's dct value that go to the device."""
    if isinstance(value, StoredBatch):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(t.nbytes for t in value)
    return value.nbytes


def run(path: str, decode: str, args) -> dict:
    ds = dctdata.open_dataset(path, decode=decode)
    device = torch.device(args.device)
    layer = ds.decompressor().to(device)
    loader = make_loader(ds, batch_size=args.batch, num_workers=args.workers, pin_memory=device.type == "cuda")
    best, moved = 0.0, 0
    for _ in range(args.epochs):
        n, moved, t = 0, 0, time.perf_counter()
        for batch in DevicePrefetcher(loader, device):
            x = layer(batch[0])
            n += len(x)
            moved += crossed(batch[0])
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - t))
    return {"samples_per_s": best, "crossed_per_sample": moved / len(ds)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks device-decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--target-psnr", type=float, default=40.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    x = fields(args.samples, args.size)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dctdata-device-decode-") as d:
        for fmt in ("zarr", "webdataset"):
            for stage, codec in (("default", AUTO), ("zstd", dict(ZSTD_MAX))):
                path = os.path.join(d, f"{fmt}-{stage}")
                dctdata.pack(x, path, format=fmt, target_psnr=args.target_psnr, codec=codec, quiet=True)
                stored = sum(e["bytes"] for e in dctdata.format.read_manifest(path).checksums.values())
                got = {mode: run(path, mode, args) for mode in ("cpu", "device")}
                row = {
                    "storage": fmt,
                    "stage": stage,
                    "stored_per_sample": stored / args.samples,
                    **{f"{k}_{mode}": v for mode, r in got.items() for k, v in r.items()},
                }
                row["speed_ratio"] = row["samples_per_s_device"] / row["samples_per_s_cpu"]
                rows.append(row)
                print(
                    f"{fmt:10s} {stage:7s} stored {row['stored_per_sample']:9.0f} B/sample | crossed cpu "
                    f"{row['crossed_per_sample_cpu']:9.0f} device {row['crossed_per_sample_device']:9.0f} B/sample | "
                    f"samples/s cpu {row['samples_per_s_cpu']:8.0f} device {row['samples_per_s_device']:8.0f} "
                    f"({row['speed_ratio']:.2f}x)",
                    flush=True,
                )
    if args.json:
        meta = {"device": args.device, "torch": torch.__version__, "dctdata": dctdata.__version__, **vars(args)}
        with open(args.json, "w") as fh:
            json.dump({"settings": meta, "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
