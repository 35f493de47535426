"""EM denoising (SciML-Bench em_denoise, em_graphene_sim-like) with a small U-Net, raw vs packed.

    python examples/em_denoise.py                                 # 6 settings + raw, a few minutes on 2 cores
    python examples/em_denoise.py --n 1000 --epochs 20 --crop 256 --settings psnr=35 psnr=40 psnr=45

Both the noisy input and the clean target are packed as `dct` (the pack's default for float images)
at each setting, so the packed runs train against a decoded target; the test MSE is always against
the raw clean image of held-out pairs. Training uses random `--crop` crops of the decoded images,
the same ones for every run. The paper reports equal-or-better loss than the raw baseline.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _unet import UNet


class ResidualUNet(nn.Module):
    """clean = noisy - UNet(noisy): the network learns the noise."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.unet = UNet(1, 1, width)
        nn.init.zeros_(self.unet.head.weight)  # start as the identity: the first loss is the noise itself
        nn.init.zeros_(self.unet.head.bias)

    def forward(self, x):
        return x - self.unet(x)


def em_arrays(n: int, size: int, seed: int) -> dict:
    from dctdata.datasets import em_denoise

    ds = em_denoise(n=n, size=size, seed=seed)
    samples = [ds[i] for i in range(n)]
    return {k: np.stack([s[k] for s in samples]) for k in ("noisy", "clean")}


def make_task(args) -> _common.Task:
    def loss(net, b):
        return nn.functional.mse_loss(net(b["noisy"]), b["clean"])

    def mse(net, data):
        return float(nn.functional.mse_loss(net(data["noisy"]), data["clean"]))

    return _common.Task(
        name="em_denoise",
        train=em_arrays(args.n, args.size, args.seed),
        test=em_arrays(args.test, args.size, args.seed + 1),
        kinds={"noisy": "dct", "clean": "dct"},
        make_net=lambda: ResidualUNet(args.width),
        loss=loss,
        metric=_common.Metric("MSE", mse, higher_is_better=False),
        crop=args.crop,
        targets=("clean",),
        description=f"residual U-Net-{args.width} on em_denoise-like pairs (float32 1x{args.size}x{args.size}), "
        f"{args.crop}px crops;",
    )


DEFAULTS = dict(n=64, test=8, epochs=6, batch_size=8, lr=2e-3)
OPTIONS = {
    "--size": (int, 256, "image side"),
    "--crop": (int, 64, "training crop side, multiple of 4"),
    "--width": (int, 8, "U-Net base width"),
}


def check(a) -> str | None:
    if a.crop % 4 or a.crop > a.size or a.size % 4:
        return f"--crop/--size: expected multiples of 4 with crop <= size. Got crop {a.crop}, size {a.size}"
    return None


def main(argv: list[str] | None = None) -> list[dict]:
    return _common.main("em_denoise", make_task, __doc__, argv, DEFAULTS, OPTIONS, check)


if __name__ == "__main__":
    main()
