"""Where a webdataset loader's time goes on a small machine: the per-sample cost in process (no workers)
and the rate with DataLoader workers, for the default pack (entropy coder) decoded with the kernel's
vector paths on and off, and for the same data with `--lossless zstd`.

    python -m benchmarks loader-workers [--samples 512] [--size 256] [--workers 0 2] [--epochs 3]

Packs `benchmarks.loader.synthetic` fields at `--target-psnr 40` into webdataset shards of 64
samples (as `python -m benchmarks stream` does), then iterates `DataLoader(DCTWebDataset(...), batch_size=32,
persistent_workers=True)` over every pack and setting: one warm-up epoch (the workers start, under the
setting, which they inherit), then the best of `--epochs` epochs; the settings alternate inside each
round, so they see the same machine load. One table: samples/s and µs per sample.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

import dctdata
from benchmarks.loader import synthetic
from dctdata.entropy.ctxrans import decoder_settings
from dctdata.loaders.wds_dataset import DCTWebDataset
from dctdata.stages import ZSTD_MAX


def _epoch(loader, simd: bool) -> tuple[int, float]:
    with decoder_settings(simd=simd):
        t0, n = time.perf_counter(), 0
        for batch in loader:
            coeffs = batch[0][0] if isinstance(batch[0], (list, tuple)) else batch[0]
            n += len(coeffs)
        return n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks loader-workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args(argv)
    if a.samples < 32 or a.size < 16 or a.epochs < 1 or min(a.workers) < 0:
        raise SystemExit("--samples >= 32, --size >= 16, --epochs >= 1, --workers >= 0: expected")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src.npy")
        np.save(src, synthetic(a.samples, a.size))
        common = dict(target_psnr=40, quiet=True, format="webdataset", writer_options={"samples_per_shard": 64})
        dctdata.pack(src, os.path.join(d, "default"), **common)
        dctdata.pack(src, os.path.join(d, "zstd"), lossless=dict(ZSTD_MAX), **common)
        cases = [("default pack, vector decoder", "default", True), ("default pack, scalar decoder", "default", False)]
        cases.append(("--lossless zstd pack", "zstd", True))
        for workers in a.workers:
            loaders = {}
            for name, pack, simd in cases:
                ds = DCTWebDataset(os.path.join(d, pack), buffer_size=256)
                loaders[name] = torch.utils.data.DataLoader(
                    ds, batch_size=32, num_workers=workers, persistent_workers=workers > 0
                )
                _epoch(loaders[name], simd)  # warm-up: the workers start under this setting
            best: dict[str, tuple[int, float]] = {}
            for _ in range(a.epochs):
                for name, _, simd in cases:
                    n, s = _epoch(loaders[name], simd)
                    if name not in best or s < best[name][1]:
                        best[name] = (n, s)
            del loaders  # their workers end
            rows += [{"case": c, "workers": workers, "samples": n, "seconds": s} for c, (n, s) in best.items()]
    print("| case | workers | samples/s | µs per sample |")
    print("|---|---:|---:|---:|")
    for r in rows:
        rate, us = r["samples"] / r["seconds"], r["seconds"] / r["samples"] * 1e6
        print(f"| {r['case']} | {r['workers']} | {rate:.0f} | {us:.0f} |")
    return rows


if __name__ == "__main__":
    main()
