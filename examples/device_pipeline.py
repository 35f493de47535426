"""The device path end to end, in memory: coefficients -> DataLoader -> prefetcher -> Decompress -> v2 -> CNN.

    python examples/device_pipeline.py                 # CPU: ~10 s on 2 cores
    python examples/device_pipeline.py --device cuda   # side-stream prefetch, decode on the GPU

What crosses the host-device link is the compact int8 coefficient tensor (transfer ratio printed);
the model's first layer turns it into images on the device, torchvision transforms v2 augment and
normalize the decoded batch there, and a tiny CNN learns the CIFAR-like classes. A packed dataset
works the same way: replace the TensorDataset by `dctdata.open_dataset(path)` and `Decompress(spec)`
by `ds.decompressor()`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.transforms import v2

import dctdata
from dctdata.codec.metrics import psnr
from dctdata.datasets import cifar_like
from dctdata.encoder.calibrate import calibrate
from dctdata.loaders.device import DevicePrefetcher, resolve_device, with_decompress


def tiny_cnn(channels: int = 3, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def images_and_labels(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ds = cifar_like(n=n, seed=seed)
    x = np.stack([ds[i]["image"] for i in range(n)]).astype(np.float32) / 255.0
    y = np.array([int(ds[i]["label"]) for i in range(n)])
    return torch.from_numpy(x), torch.from_numpy(y)


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--train", type=int, default=512, help="training images")
    p.add_argument("--test", type=int, default=500, help="held-out images")
    p.add_argument("--cf", type=int, default=6, help="chop factor 1..8")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)

    # Offline side (normally `dctdata pack`): calibrate int8 steps on a subset, encode everything.
    x_train, y_train = images_and_labels(args.train, args.seed)
    x_test, y_test = images_and_labels(args.test, args.seed + 1)
    spec = calibrate(x_train[:256], cf=args.cf, quant="int8")
    # int8 coefficients plus each image's (range, mid) per channel: the pair the first layer takes
    (q_train, s_train), over_train = dctdata.encode(x_train, spec)
    (q_test, s_test), over_test = dctdata.encode(x_test, spec)
    decode = dctdata.Decompress(spec)
    fidelity = psnr(x_test, decode((q_test, s_test)), dims=3).median().item()
    print(
        f"coefficients {tuple(q_train.shape[1:])} {q_train.dtype} per image (image {tuple(x_train.shape[1:])} "
        "float32): "
        f"transfer ratio {spec.transfer_ratio:.1f}x, median PSNR {fidelity:.1f} dB, overflow {over_train + over_test}"
    )

    # Online side: a DataLoader of coefficients, pinned when a GPU is the target, prefetched to the device.
    pin = device.type == "cuda"
    train = DataLoader(
        TensorDataset(q_train, s_train, y_train),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=pin,
        drop_last=True,
    )
    test = DataLoader(TensorDataset(q_test, s_test, y_test), batch_size=256, pin_memory=pin)
    mean, std = x_train.mean(dim=(0, 2, 3)).tolist(), x_train.std(dim=(0, 2, 3)).tolist()
    net = with_decompress(
        decode,
        tiny_cnn(),
        transforms=v2.Normalize(mean, std),  # every mode
        train_transforms=v2.RandomHorizontalFlip(),  # training only; one draw per batch
    ).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    t0, seen = time.perf_counter(), 0
    for epoch in range(args.epochs):
        net.train()
        total = 0.0
        batches = DevicePrefetcher(train, device)
        for coeffs, side, label in batches:  # int8 (B, 3, Hb, K, Wb) and (B, 3, 2), already on `device`
            loss = nn.functional.cross_entropy(net((coeffs, side)), label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item()
            seen += len(label)
        print(f"epoch {epoch + 1}: train loss {total / len(batches):.3f}")
    elapsed = time.perf_counter() - t0

    net.eval()
    correct = 0
    with torch.no_grad():
        for coeffs, side, label in DevicePrefetcher(test, device):
            correct += (net((coeffs, side)).argmax(1) == label).sum().item()
    acc = correct / len(y_test)
    print(f"test accuracy {acc:.3f} (chance 0.100) on {device}; {seen / elapsed:.0f} training samples/s")
    return acc


if __name__ == "__main__":
    main()
