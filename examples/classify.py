"""Classification (the paper's CIFAR-10 / ResNet task) on the CIFAR-like set, raw vs packed.

    python examples/classify.py                       # CIFAR-like, 6 settings + raw, a few minutes on 2 cores
    python examples/classify.py --cifar-root ~/data   # real CIFAR-10 already on disk (torchvision layout)
    python examples/classify.py --n 50000 --test 10000 --epochs 30 --width 64 --settings cf=4 cf=5 cf=6 psnr=35

The uint8 images are packed as `dct` (`--field image=dct`; integer images default to exact storage)
with each setting; a small ResNet (`--width` channels, 3 stages of residual blocks) trains on each
pack with `Decompress` as its first step and on the raw uint8 arrays. Test accuracy on held-out
images. The paper reports accuracy within 3% of the baseline at CR 2.6 (CF 5, float32 coefficients).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common


class Block(nn.Module):
    """A ResNet basic block (two 3x3 convs + shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet(width: int = 16, classes: int = 10, channels: int = 3) -> nn.Module:
    """A small ResNet for 32x32 inputs: stem, stages at width, 2*width (/2), 4*width (/2), pool, linear."""
    w = width
    return nn.Sequential(
        nn.Conv2d(channels, w, 3, 1, 1, bias=False),
        nn.BatchNorm2d(w),
        nn.ReLU(inplace=True),
        Block(w, w),
        Block(w, 2 * w, 2),
        Block(2 * w, 4 * w, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, classes),
    )


def load_cifar10(root: str, n: int, test: int) -> tuple[dict, dict]:
    """Real CIFAR-10 from torchvision's on-disk layout (never downloads)."""
    from torchvision.datasets import CIFAR10

    try:
        tr, te = CIFAR10(root, train=True, download=False), CIFAR10(root, train=False, download=False)
    except RuntimeError as exc:
        raise SystemExit(
            f"classify.py: --cifar-root {root}: expected torchvision's CIFAR-10 files (cifar-10-batches-py). Got: {exc}"
        ) from exc

    def arrays(ds, k):
        return {
            "image": np.ascontiguousarray(ds.data[:k].transpose(0, 3, 1, 2)),
            "label": np.asarray(ds.targets[:k], dtype=np.int64),
        }

    return arrays(tr, n), arrays(te, test)


def cifar_like_arrays(n: int, seed: int) -> dict:
    from dctdata.datasets import cifar_like

    ds = cifar_like(n=n, seed=seed)
    samples = [ds[i] for i in range(n)]
    return {"image": np.stack([s["image"] for s in samples]), "label": np.stack([s["label"] for s in samples])}


def make_task(args) -> _common.Task:
    if args.cifar_root:
        train, test = load_cifar10(args.cifar_root, args.n, args.test)
        what = "real CIFAR-10 (uint8 3x32x32)."
    else:
        train, test = cifar_like_arrays(args.n, args.seed), cifar_like_arrays(args.test, args.seed + 1)
        what = "CIFAR-like synthetic set (uint8 3x32x32, 10 classes)."
    x = train["image"].astype(np.float32)
    mean = torch.tensor(x.mean(axis=(0, 2, 3))).view(1, 3, 1, 1)
    std = torch.tensor(x.std(axis=(0, 2, 3))).view(1, 3, 1, 1)

    def prep(img: torch.Tensor) -> torch.Tensor:  # source units (0..255) -> standardised
        return (img - mean) / std

    def loss(net, b):
        return nn.functional.cross_entropy(net(prep(b["image"])), b["label"])

    def accuracy(net, data):
        correct = 0
        for i in range(0, len(data["label"]), 500):
            logits = net(prep(data["image"][i : i + 500]))
            correct += int((logits.argmax(1) == data["label"][i : i + 500]).sum())
        return correct / len(data["label"])

    return _common.Task(
        name="classify",
        train=train,
        test=test,
        kinds={"image": "dct", "label": "label"},
        make_net=lambda: resnet(args.width),
        loss=loss,
        metric=_common.Metric("accuracy", accuracy, higher_is_better=True),
        description=f"ResNet-{args.width} on a {what}",
    )


# int8 cannot hold 40 dB on every 8-bit image (calibration refuses rather than clamp): int16 there
SETTINGS = ("cf=3", "cf=5", "cf=7", "psnr=30", "psnr=35", "psnr=40+quant=int16")
DEFAULTS = dict(n=2000, test=1000, epochs=4, batch_size=64, lr=3e-3, settings=SETTINGS)
OPTIONS = {
    "--width": (int, 16, "ResNet base width"),
    "--cifar-root": (None, None, "directory holding torchvision's CIFAR-10 (download=False)"),
}


def main(argv: list[str] | None = None) -> list[dict]:
    return _common.main("classify", make_task, __doc__, argv, DEFAULTS, OPTIONS)


if __name__ == "__main__":
    main()
