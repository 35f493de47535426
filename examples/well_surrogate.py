"""Train a small surrogate (a U-Net stepping a shallow-water state forward) on a Well-format set, once
from the raw HDF5 files and once from a dctdata pack of them: same windows, same steps, same seed. Both
are validated on the raw validation files: the one-step and rollout relative L2 errors, with the wall
time and the bytes each training run's data took on disk.

    python examples/well_surrogate.py [--traj 4] [--steps 30] [--size 24] [--epochs 4] [--rollout 5] [--target-psnr 40]

Data: `dctdata.datasets.well` shallow-water files (train: two files; validation: one), in The Well's
layout. The packed run reads `dctdata.open_dataset(pack, n_steps_input=..., n_steps_output=1)`: items
with WellDataset's keys; the raw run reads the same windows' frames from the HDF5 files (exactly, with
h5py). The model sees `n_in` frames and the constant bathymetry, channels first, z-scored with the
statistics the pack recorded, and predicts the next frame's change.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _unet import UNet

import dctdata
from dctdata.datasets.well import write_well_file
from dctdata.preprocess.sources.well import WellSource

VALID_BATCH = 64  # validation windows per forward pass


class RawWindows(torch.utils.data.Dataset):
    """The windows of `like` (a dctdata WindowDataset), read exactly from the raw HDF5 files."""

    def __init__(self, raw_dir: str, like) -> None:
        self.src, self.like = WellSource(raw_dir), like

    def __len__(self) -> int:
        return len(self.like)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        frames = self.like.frame_indices(i)
        got = self.src.read_batch(int(frames[0]), int(frames[-1]) + 1)
        step = int(frames[1] - frames[0]) if len(frames) > 1 else 1
        x = np.concatenate([got[f["stored"]] for f in self.like.info["fields"]], axis=1)[::step]
        x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, 1, -1)))
        n_in = self.like.n_steps_input
        k = self.like.locate(i)[0]
        return {
            "input_fields": x[:n_in],
            "output_fields": x[n_in:],
            "constant_fields": self.like._constant(k)["fields"],  # kept exactly in the pack
        }


def _inputs(batch, mean, std) -> torch.Tensor:
    x = (batch["input_fields"] - mean) / std  # (B, T, H, W, F)
    b, t, h, w, f = x.shape
    x = x.permute(0, 1, 4, 2, 3).reshape(b, t * f, h, w)
    c = batch["constant_fields"].permute(0, 3, 1, 2)
    return torch.cat([x, c], 1)


def _step(model, batch, mean, std) -> torch.Tensor:
    """The next frame, (B, H, W, F), from the window's inputs."""
    delta = model(_inputs(batch, mean, std)).permute(0, 2, 3, 1) * std
    return batch["input_fields"][:, -1] + delta


def _rel_l2(pred: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """||pred - ref|| / ||ref|| of each item of a batch."""
    dims = tuple(range(1, ref.ndim))
    return torch.linalg.vector_norm(pred - ref, dim=dims) / torch.linalg.vector_norm(ref, dim=dims)


def train(name, train_ds, valid, args, mean, std) -> dict:
    torch.manual_seed(args.seed)
    fields = len(mean)
    model = UNet(args.n_in * fields + 1, fields, width=args.width)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, generator=g)
    losses, t0 = [], time.perf_counter()
    for _ in range(args.epochs):
        total, n = 0.0, 0
        for batch in loader:
            pred = _step(model, batch, mean, std)
            loss = (((pred - batch["output_fields"][:, 0]) / std) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + loss.item() * len(pred), n + len(pred)
        losses.append(total / n)
    seconds = time.perf_counter() - t0
    model.eval()  # validation in batches: BatchNorm in eval mode treats every item on its own
    one, roll = [], []
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(valid["one"], batch_size=VALID_BATCH):
            one.append(_rel_l2(_step(model, batch, mean, std), batch["output_fields"][:, 0]))
        for batch in torch.utils.data.DataLoader(valid["roll"], batch_size=VALID_BATCH):
            state = {k: batch[k] for k in ("input_fields", "constant_fields")}
            for _ in range(batch["output_fields"].shape[1]):
                nxt = _step(model, state, mean, std)
                state["input_fields"] = torch.cat([state["input_fields"][:, 1:], nxt[:, None]], 1)
            roll.append(_rel_l2(nxt, batch["output_fields"][:, -1]))
    return {
        "data": name,
        "losses": losses,
        "seconds": seconds,
        "one_step_rel_l2": float(torch.cat(one).mean()),
        "rollout_rel_l2": float(torch.cat(roll).mean()),
    }


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traj", type=int, default=4, help="trajectories per file")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--size", type=int, default=24, help="grid points per side (a multiple of 4: the U-Net pools twice)")
    p.add_argument("--n-in", type=int, default=2)
    p.add_argument("--rollout", type=int, default=5, help="validation rollout steps")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="folder for the data and packs (default: a temporary one)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or tmp
        train_raw, valid_raw = os.path.join(out, "train"), os.path.join(out, "valid")
        os.makedirs(train_raw, exist_ok=True)
        os.makedirs(valid_raw, exist_ok=True)
        for i in range(2):
            write_well_file(os.path.join(train_raw, f"part{i}.h5"), a.traj, a.steps, a.size, seed=i)
        write_well_file(os.path.join(valid_raw, "part0.h5"), a.traj, a.steps, a.size, seed=99)
        packs = {split: os.path.join(out, f"{split}.zarr") for split in ("train", "valid")}
        dctdata.pack(train_raw, packs["train"], target_psnr=a.target_psnr, quiet=True, overwrite=True)
        # the validation pack only numbers the windows and keeps the constants (exactly): both runs validate on
        # the raw files' values, so it skips the target's calibration
        dctdata.pack(valid_raw, packs["valid"], cf=4, quiet=True, overwrite=True)
        window = dict(n_steps_input=a.n_in, n_steps_output=1)
        packed = dctdata.open_dataset(packs["train"], **window)
        stats = packed.stats
        mean = torch.tensor([stats["mean"]["height"], *stats["mean"]["velocity"]], dtype=torch.float32)
        std = torch.tensor([stats["std"]["height"], *stats["std"]["velocity"]], dtype=torch.float32).clamp_min(1e-6)
        valid_like = dctdata.open_dataset(packs["valid"], **window)
        roll_like = dctdata.open_dataset(
            packs["valid"], n_steps_input=a.n_in, n_steps_output=a.rollout, full_trajectory_mode=False
        )
        valid = {"one": RawWindows(valid_raw, valid_like), "roll": RawWindows(valid_raw, roll_like)}
        rows = [
            {**train("raw HDF5", RawWindows(train_raw, packed), valid, a, mean, std), "bytes": _size(train_raw)},
            {**train(f"dctdata {a.target_psnr:g} dB", packed, valid, a, mean, std), "bytes": _size(packs["train"])},
        ]
    print("| data | bytes on disk | train s | one-step rel. L2 | rollout rel. L2 |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['data']} | {r['bytes']} | {r['seconds']:.1f} | {r['one_step_rel_l2']:.4f} | "
            f"{r['rollout_rel_l2']:.4f} |"
        )
    return rows


if __name__ == "__main__":
    main()
