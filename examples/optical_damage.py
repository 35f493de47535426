"""Optical damage (SciML-Bench optical_damage) with a convolutional autoencoder, raw vs packed.

    python examples/optical_damage.py                       # 6 settings + raw, a few minutes on 2 cores
    python examples/optical_damage.py --n 400 --epochs 20 --crop 256

The 16-bit 492x656 speckle frames are packed as `dct` (`--field image=dct`: integer images default to
exact storage) at each setting; an autoencoder (3 stride-2 convolutions down, 3 up) learns to
reconstruct `--crop` crops of them, standardised with the raw training set's mean and std. Test
metric: reconstruction MSE (standardised units) on whole held-out raw frames (cropped to 488x656, a
multiple of 8). The damage label is packed exactly (kind `label`) but not used by this loss.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common


def autoencoder(width: int = 16) -> nn.Module:
    w = width
    return nn.Sequential(
        nn.Conv2d(1, w, 3, 2, 1),
        nn.ReLU(inplace=True),
        nn.Conv2d(w, 2 * w, 3, 2, 1),
        nn.ReLU(inplace=True),
        nn.Conv2d(2 * w, 2 * w, 3, 2, 1),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(2 * w, 2 * w, 2, 2),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(2 * w, w, 2, 2),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(w, 1, 2, 2),
    )


def optical_arrays(n: int, seed: int) -> dict:
    from dctdata.datasets import optical_damage

    ds = optical_damage(n=n, seed=seed)
    samples = [ds[i] for i in range(n)]
    return {"image": np.stack([s["image"] for s in samples]), "label": np.stack([s["label"] for s in samples])}


def make_task(args) -> _common.Task:
    train = optical_arrays(args.n, args.seed)
    x = train["image"].astype(np.float64)
    mean, std = float(x.mean()), float(x.std())

    def prep(img):
        return (img - mean) / std

    def loss(net, b):
        x = prep(b["image"])
        return nn.functional.mse_loss(net(x), x)

    def mse(net, data):
        total = 0.0
        for i in range(len(data["image"])):
            x = prep(data["image"][i : i + 1, :, :488, :656])
            total += float(nn.functional.mse_loss(net(x), x))
        return total / len(data["image"])

    return _common.Task(
        name="optical_damage",
        train=train,
        test=optical_arrays(args.test, args.seed + 1),
        kinds={"image": "dct", "label": "label"},
        make_net=lambda: autoencoder(args.width),
        loss=loss,
        metric=_common.Metric("reconstruction MSE", mse, higher_is_better=False),
        crop=args.crop,
        description=f"autoencoder-{args.width} on optical_damage-like frames (uint16 1x492x656), {args.crop}px crops;",
    )


DEFAULTS = dict(n=32, test=8, epochs=8, batch_size=8, lr=2e-3)
OPTIONS = {"--crop": (int, 128, "training crop side, multiple of 8"), "--width": (int, 16, "autoencoder base width")}


def check(a) -> str | None:
    return (
        None if a.crop % 8 == 0 and 8 <= a.crop <= 488 else f"--crop: expected a multiple of 8 in 8..488. Got {a.crop}"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    return _common.main("optical_damage", make_task, __doc__, argv, DEFAULTS, OPTIONS, check)


if __name__ == "__main__":
    main()
