"""Quick start: pack a training set once, then train with the compact coefficients and decode them in the
model's first layer.

    python examples/quick_start.py                   # CPU, a few seconds
    python examples/quick_start.py --device cuda     # the coefficients cross to the GPU, decoded there

The same pack from the command line: `dctdata pack train.npy train.dct --target-psnr 40`, then
`dctdata info train.dct` (sizes and achieved PSNR) and `dctdata verify train.dct`.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from torch import nn

import dctdata


def smooth_fields(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Stand-in training data: (n, 1, size, size) float32 smooth random fields, samples first."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, size, size)).cumsum(-1).cumsum(-2)
    return (x / np.abs(x).max(axis=(2, 3), keepdims=True)).astype(np.float32)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=256, help="samples")
    p.add_argument("--size", type=int, default=64, help="image side")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when there is one)")
    p.add_argument("--out", default=None, help="where to write the pack (default: a temporary folder)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or os.path.join(tmp, "train.dct")
        # 1. Pack once, offline: calibration picks the settings that reach 40 dB (per sample, against its range).
        x = smooth_fields(args.n, args.size)
        manifest = dctdata.pack(x, out, target_psnr=40, quiet=True)
        stats = manifest.stats["image"]
        print(f"packed {manifest.samples} samples: {manifest.stored_bytes / x.nbytes:.3f} of float32, "
              f"PSNR min {stats.psnr_min:.2f} dB")  # fmt: skip

        # 2. Train: the loader yields coefficients; the model's first layer turns them back into images.
        ds = dctdata.open_dataset(out)
        loader = dctdata.make_loader(ds, batch_size=32, num_workers=args.workers, pin_memory=True)
        dctdata.balance_threads(args.workers)  # the main process gets the cores the workers leave
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        decompress = ds.decompressor().to(device)  # the first layer: coefficients in, float32 images out
        net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1)).to(device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        losses = []
        for epoch in range(args.epochs):
            dctdata.set_epoch(loader, epoch)  # the order is a function of (seed, epoch)
            for (coeffs,) in dctdata.DevicePrefetcher(loader, device):  # one field: a 1-tuple
                images = decompress(coeffs)  # (batch, 1, size, size), decoded on the device
                loss = nn.functional.mse_loss(net(images), torch.roll(images, 1, -1))  # toy task: a 1-pixel shift
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            print(f"epoch {epoch}: loss {np.mean(losses[-len(loader) :]):.4f}")
    return {"losses": losses, "batches": len(loader), "psnr_min": stats.psnr_min}


if __name__ == "__main__":
    main()
