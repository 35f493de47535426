"""A volumetric denoiser trained from a `dims=3` pack against the same training on raw arrays.

    python examples/volume_denoise.py                          # a few minutes on 2 cores
    python examples/volume_denoise.py --n 64 --size 48 --epochs 20 --target-psnr 35 40 45

Data: advected and diffused scalars (`dctdata.datasets.volumes.advected_scalar`, the fronts and filaments of
turbulent mixing) with additive Gaussian noise. The noisy input and the clean target are packed together as
two volume fields (`dims=3`, 8x8x8 blocks) at each `--target-psnr`. The network, a small residual 3-D CNN, trains
on the pack's decoded batches: the DataLoader yields coefficients, and the pack's own first layer
(`ds.decompressor(field)`) decodes them where the model runs. The raw run trains on the float32 arrays with
the same seed, batches and steps. Every run is tested on held-out raw volumes against their raw clean target.
The table reports the pack's compression ratio and each run's test MSE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
from torch import nn

import dctdata
from dctdata.datasets.volumes import advected_scalar


class ResidualCNN3d(nn.Module):
    """clean = noisy - f(noisy), f three 3x3x3 convolutions: the network learns the noise."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv3d(1, width, 3, padding=1),
            nn.GELU(),
            nn.Conv3d(width, width, 3, padding=1),
            nn.GELU(),
            nn.Conv3d(width, 1, 3, padding=1),
        )
        nn.init.zeros_(self.f[-1].weight)  # start as the identity: the first loss is the noise itself
        nn.init.zeros_(self.f[-1].bias)

    def forward(self, x):
        return x - self.f(x)


def volumes(n: int, size: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """{"noisy", "clean"}: (n, 1, size, size, size) float32."""
    clean = advected_scalar(n=n, size=size, steps=6, seed=seed)[:, None]
    rng = np.random.default_rng(seed)
    noisy = clean + rng.normal(scale=noise, size=clean.shape).astype(np.float32)
    return {"noisy": noisy, "clean": clean}


def train(batches, make_batch, args) -> tuple[nn.Module, list[float]]:
    """Train a fresh network on `batches` (lists of sample indices per step) for args.epochs; per-epoch losses."""
    torch.manual_seed(args.seed)
    net = ResidualCNN3d(args.width)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    losses = []
    for epoch in range(args.epochs):
        total = 0.0
        for idx in batches[epoch]:
            noisy, clean = make_batch(idx)
            loss = nn.functional.mse_loss(net(noisy), clean)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total / len(batches[epoch]))
    return net, losses


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads) if args.threads else None
    data = volumes(args.n, args.size, args.noise, args.seed)
    test = volumes(args.test, args.size, args.noise, args.seed + 1)
    rng = np.random.default_rng(args.seed)
    batches = [np.array_split(rng.permutation(args.n), max(1, args.n // args.batch_size)) for _ in range(args.epochs)]

    def test_mse(net) -> float:
        with torch.no_grad():
            return float(nn.functional.mse_loss(net(torch.from_numpy(test["noisy"])), torch.from_numpy(test["clean"])))

    raw = {k: torch.from_numpy(v) for k, v in data.items()}
    net, losses = train(batches, lambda idx: (raw["noisy"][idx], raw["clean"][idx]), args)
    rows = [{"setting": "raw", "ratio_f32": 1.0, "psnr_dataset": None, "losses": losses, "test_mse": test_mse(net)}]
    work = args.out or tempfile.mkdtemp(prefix="dctdata-volume-denoise-")
    for target in args.target_psnr:
        path = os.path.join(work, f"psnr{target:g}.zarr")
        fields = {"noisy": data["noisy"][:, 0], "clean": data["clean"][:, 0]}
        manifest = dctdata.pack(fields, path, dims=3, target_psnr=target, overwrite=True, quiet=True)
        ds = dctdata.open_dataset(path, as_dict=True)
        layers = {k: ds.decompressor(k) for k in ("noisy", "clean")}

        def make_batch(idx, ds=ds, layers=layers):
            stored = torch.utils.data.default_collate([ds[int(i)] for i in idx])  # a DataLoader's batch
            with torch.no_grad():
                return layers["noisy"](stored["noisy"]), layers["clean"](stored["clean"])

        net, losses = train(batches, make_batch, args)
        ratio = sum(v.nbytes for v in fields.values()) / manifest.stored_bytes
        psnr = min(manifest.stats[k].psnr_dataset for k in ("noisy", "clean"))
        rows.append(
            {"setting": f"psnr={target:g}", "ratio_f32": ratio, "psnr_dataset": psnr, "losses": losses,
             "test_mse": test_mse(net)}
        )  # fmt: skip
    print(
        "| setting | ratio vs float32 | dataset PSNR (worst field) | first / last train loss | test MSE (raw clean) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        psnr = "-" if r["psnr_dataset"] is None else f"{r['psnr_dataset']:.1f} dB"
        print(
            f"| {r['setting']} | {r['ratio_f32']:.1f}x | {psnr} | {r['losses'][0]:.3g} / {r['losses'][-1]:.3g} | "
            f"{r['test_mse']:.4g} |"
        )
    if args.out:
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=32, help="training volumes")
    p.add_argument("--test", type=int, default=4, help="held-out volumes")
    p.add_argument("--size", type=int, default=32, help="volume edge")
    p.add_argument("--noise", type=float, default=0.2, help="noise standard deviation (the scalar is in [-1, 1])")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--width", type=int, default=8, help="channels of the hidden convolutions")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--target-psnr", type=float, nargs="+", default=[35.0, 40.0, 45.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--out", default=None, help="keep the packs and results.json here")
    args = p.parse_args(argv)
    for name in ("n", "test", "size", "epochs", "batch_size", "width"):
        if getattr(args, name) < 1:
            raise dctdata.DctDataError(
                f"--{name.replace('_', '-')}: expected a positive int. Got {getattr(args, name)}"
            )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    return run(args)


if __name__ == "__main__":
    try:
        main()
    except dctdata.DctDataError as exc:
        sys.exit(f"error: {exc}")
