"""What a fill costs: the README's masked-data numbers.

    python -m benchmarks masked-fill            # 24 SLSTR-like scenes of 128x128, about a minute on 2 cores
    python -m benchmarks masked-fill --n 8      # quicker

The set is the issue's: 3 reflectances (0..1) and 3 brightness temperatures (~290 K) per scene, NaN
beyond a slanted swath edge in every channel (`dctdata.datasets.slstr.cloud_field`).

1. One CodecSpec (the one `--nan mask --target-psnr 40` calibrates), three fills of the invalid
   pixels: stored bytes after the lossless stage, overflowing coefficients, and the per-channel PSNR
   over valid pixels. Plus the bytes of the stored validity mask.
2. Whole packs at `--target-psnr 40`: `--nan mask` against `--nan fill=0`, stored size and the
   per-channel PSNR each reports (over valid pixels), next to one computed here from the decoded pack.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import dctdata
import dctdata.codec.metrics
from dctdata.datasets.slstr import cloud_field
from dctdata.preprocess.masking import fill_invalid
from dctdata.stages import DEFAULT_CODEC, get_stage


def scenes(n: int, size: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([(im := cloud_field(rng, size)[0])[:3], im[6:9]]) for _ in range(n)])


def channel_psnr(x: np.ndarray, x_hat: torch.Tensor) -> list[float]:
    valid = torch.from_numpy(np.isfinite(x))
    p = dctdata.codec.metrics.psnr(torch.from_numpy(np.nan_to_num(x)).double(), x_hat.double(), valid=valid)
    return [round(dctdata.codec.metrics.pooled_psnr(p[:, c]), 2) for c in range(x.shape[1])]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks masked-fill", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="scenes")
    ap.add_argument("--size", type=int, default=128, help="scene height and width")
    args = ap.parse_args(argv)
    x = scenes(args.n, args.size)
    valid = np.isfinite(x)
    codec = get_stage(DEFAULT_CODEC)
    with tempfile.TemporaryDirectory() as tmp:
        packs = {}
        for nan in ("mask", "fill=0"):
            m = dctdata.pack(x, Path(tmp) / nan, nan=nan, target_psnr=40, quiet=True)
            ds = dctdata.open_dataset(Path(tmp) / nan)
            x_hat = ds.decompressor()(ds[0 : len(x)][0])
            packs[nan] = (m, channel_psnr(x, x_hat))
    spec = packs["mask"][0].field("image").codec
    mean = np.where(valid, x, 0).sum((2, 3), keepdims=True) / valid.sum((2, 3), keepdims=True)
    print(
        f"{args.n} scenes of 6x{args.size}x{args.size}, {100 * (~valid).mean():.1f}% invalid; one CodecSpec: "
        f"cf={spec.cf} {spec.mask} {spec.dtype}, steps of --nan mask --target-psnr 40"
    )
    print("| fill | stored kB | overflow | PSNR per channel over valid pixels (dB) |")
    print("|---|---:|---:|---|")
    for name, filled in (
        ("pull-push (--nan mask)", fill_invalid(x, valid)),
        ("item mean", np.where(valid, x, mean)),
        ("constant 0", np.where(valid, x, 0)),
    ):
        q, over = dctdata.encode(torch.from_numpy(np.ascontiguousarray(filled, np.float32)), spec)
        stored = sum(len(codec.encode(q[i].numpy().tobytes())) for i in range(len(q)))
        print(f"| {name} | {stored / 1e3:.1f} | {over} | {channel_psnr(x, dctdata.Decompress(spec)(q))} |")
    mask_bytes = sum(len(codec.encode(np.ascontiguousarray(valid[i]).tobytes())) for i in range(len(x)))
    print(f"validity mask: {mask_bytes / 1e3:.1f} kB stored")
    print()
    print("| pack at --target-psnr 40 | stored kB | codec | reported PSNR per channel | computed here |")
    print("|---|---:|---|---|---|")
    for nan, (m, mine) in packs.items():
        c = m.field("image").codec
        reported = [round(ch.psnr_dataset, 2) for ch in m.stats["image"].channels]
        print(f"| --nan {nan} | {m.stored_bytes / 1e3:.1f} | cf={c.cf} {c.mask} {c.dtype} | {reported} | {mine} |")


if __name__ == "__main__":
    main()
