"""Cloud segmentation (SciML-Bench slstr_cloud) with a small U-Net, raw vs packed.

    python examples/slstr_cloud.py                          # 6 settings + raw, a few minutes on 2 cores
    python examples/slstr_cloud.py --n 500 --size 256 --epochs 30 --width 32

Fields: `refs` (6 reflectances, 0-1) and `bts` (3 brightness temperatures, K) are packed as `dct`;
the cloud mask `bayes` and a `valid` mask are packed as `array` (stored exactly, lossless).

NaN borders, handled explicitly here, before packing (the pack's `--nan fill=VALUE` is one value for
every field, and filling the temperatures with 0 would put a ~300 K step at the swath edge that rings
through the edge blocks): `valid` = 1 where all 9 channels are finite; NaN reflectances are filled
with 0 (dark, close to ocean), NaN temperatures with that scene's mean valid temperature per channel
(no step, nothing to ring). The loss and the metric only count valid pixels, so the fill values never
matter to training. Test metric: cloud IoU over the valid pixels of held-out scenes.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
from _unet import UNet


def fill_nan(refs: np.ndarray, bts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(refs, bts, valid) with NaN filled as the module docstring says; per scene, (N, C, H, W) in."""
    valid = np.isfinite(refs).all(axis=1, keepdims=True) & np.isfinite(bts).all(axis=1, keepdims=True)
    refs = np.where(valid, refs, np.float32(0.0))
    fill = np.stack([[np.nanmean(np.where(v[0], c, np.nan)) for c in s] for s, v in zip(bts, valid)]).astype(np.float32)
    bts = np.where(valid, bts, fill[:, :, None, None])
    return refs.astype(np.float32), bts.astype(np.float32), valid.astype(np.uint8)


def slstr_arrays(n: int, size: int, seed: int) -> dict:
    from dctdata.datasets import slstr_cloud

    ds = slstr_cloud(n=n, size=size, seed=seed)
    samples = [ds[i] for i in range(n)]
    refs, bts, valid = fill_nan(np.stack([s["refs"] for s in samples]), np.stack([s["bts"] for s in samples]))
    return {"refs": refs, "bts": bts, "bayes": np.stack([s["bayes"] for s in samples]), "valid": valid}


def make_task(args) -> _common.Task:
    train = slstr_arrays(args.n, args.size, args.seed)
    stats = {}
    for k in ("refs", "bts"):  # per-channel mean/std over valid pixels of the raw training set
        v = np.broadcast_to(train["valid"].astype(bool), train[k].shape)
        x = np.moveaxis(train[k], 1, 0)[np.moveaxis(v, 1, 0)].reshape(train[k].shape[1], -1)
        stats[k] = (torch.tensor(x.mean(1)).view(1, -1, 1, 1), torch.tensor(x.std(1)).view(1, -1, 1, 1))

    def inputs(b):
        return torch.cat([(b[k] - stats[k][0]) / stats[k][1] for k in ("refs", "bts")], 1)

    def loss(net, b):
        valid = b["valid"].float()
        bce = nn.functional.binary_cross_entropy_with_logits(net(inputs(b)), b["bayes"].float(), reduction="none")
        return (bce * valid).sum() / valid.sum().clamp_min(1.0)

    def iou(net, data):
        pred = net(inputs(data)) > 0
        valid, cloud = data["valid"].bool(), data["bayes"].bool()
        inter = (pred & cloud & valid).sum().item()
        union = ((pred | cloud) & valid).sum().item()
        return inter / max(union, 1)

    return _common.Task(
        name="slstr_cloud",
        train=train,
        test=slstr_arrays(args.test, args.size, args.seed + 1),
        kinds={"refs": "dct", "bts": "dct", "bayes": "array", "valid": "array"},
        make_net=lambda: UNet(9, 1, args.width),
        loss=loss,
        metric=_common.Metric("cloud IoU", iou, higher_is_better=True),
        description=f"U-Net-{args.width} on slstr_cloud-like scenes (9x{args.size}x{args.size}, NaN swath edge filled "
        "+ valid mask);",
    )


DEFAULTS = dict(n=32, test=8, epochs=10, batch_size=8, lr=3e-3)
OPTIONS = {"--size": (int, 128, "scene side, multiple of 4"), "--width": (int, 8, "U-Net base width")}


def check(a) -> str | None:
    return None if a.size % 4 == 0 else f"--size: expected a multiple of 4. Got {a.size}"


def main(argv: list[str] | None = None) -> list[dict]:
    return _common.main("slstr_cloud", make_task, __doc__, argv, DEFAULTS, OPTIONS, check)


if __name__ == "__main__":
    main()
