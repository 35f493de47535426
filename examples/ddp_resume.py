"""Distributed training that survives preemption: DDP over a packed dataset, stopped mid-epoch and resumed
exactly where it stopped (every sample once per epoch across ranks and DataLoader workers).

    torchrun --nproc_per_node 2 examples/ddp_resume.py --out run                  # gloo on CPUs, nccl on GPUs
    torchrun --nproc_per_node 2 examples/ddp_resume.py --out run --stop-after 5   # "preempted" after 5 steps
    torchrun --nproc_per_node 2 examples/ddp_resume.py --out run                  # resumes from run/ckpt/
    python examples/ddp_resume.py --out run                                       # one process, the same code

Rank 0 packs a small labelled set into OUT/train.dct the first time (each sample carries its `id`, so the
run can show that no sample is skipped or repeated). Every `--save-every` steps, and when stopped, each rank
writes its checkpoint: the model, the optimizer and its loader's `state_dict()` (torchdata's
StatefulDataLoader: the position inside the epoch, workers included). A rerun loads it and goes on from the
next batch; at the end of every epoch the ranks' ids are gathered and checked: all samples, each once.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import dctdata
from dctdata.loaders import to_device


def make_set(out: str, n: int, size: int) -> None:
    """Rank 0 packs the training set once: smooth fields and their index as a `label` field."""
    rng = np.random.default_rng(0)
    image = rng.normal(size=(n, 1, size, size)).cumsum(-1).cumsum(-2)
    image = (image / np.abs(image).max(axis=(2, 3), keepdims=True)).astype(np.float32)
    # n divisible by the world size: DistributedSampler then gives every rank the same samples count, no repeats
    dctdata.pack({"image": image, "id": np.arange(n)}, out, target_psnr=40, quiet=True)


def save(path: str, state: dict) -> None:
    """Write atomically: a checkpoint is either the old one or the new one, never half of each."""
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="run folder: the pack and the checkpoints")
    p.add_argument("--samples", type=int, default=256, help="samples in the training set")
    p.add_argument("--size", type=int, default=32, help="image side")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--save-every", type=int, default=4, help="checkpoint every N steps")
    p.add_argument("--stop-after", type=int, default=None, help="stop after N steps of this run (a preemption)")
    args = p.parse_args(argv)

    distributed = "RANK" in os.environ  # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    data, ckpt = os.path.join(args.out, "train.dct"), os.path.join(args.out, "ckpt", f"rank{rank}.pt")
    if rank == 0:
        os.makedirs(os.path.dirname(ckpt), exist_ok=True)
        if not os.path.exists(data):
            make_set(data, args.samples, args.size)
    if distributed:
        dist.barrier()  # the pack exists before any rank opens it

    ds = dctdata.open_dataset(data)
    loader = dctdata.make_loader(ds, batch_size=args.batch_size, num_workers=args.workers, seed=0)
    decompress = ds.decompressor("image").to(device)  # the first layer
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1)).to(device)
    model = nn.parallel.DistributedDataParallel(net) if distributed else net
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    start, seen, steps = 0, [], 0
    if os.path.exists(ckpt):  # resume: same model, optimizer, epoch and place in the epoch
        state = torch.load(ckpt, weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        if state["loader"] is not None:  # None: saved between two epochs
            loader.load_state_dict(state["loader"])
        start, seen = state["epoch"], state["seen"]
        print(f"rank {rank}: resuming epoch {start} after {len(seen)} samples")

    def checkpoint(epoch: int, between_epochs: bool = False) -> None:
        position = None if between_epochs else loader.state_dict()
        save(
            ckpt, {"model": net.state_dict(), "opt": opt.state_dict(), "loader": position, "epoch": epoch, "seen": seen}
        )

    checked = []
    for epoch in range(start, args.epochs):
        dctdata.set_epoch(loader, epoch)  # a resumed loader continues this epoch where it stopped
        for coeffs, ids in loader:
            images = decompress(to_device(coeffs, device))  # (coefficients, side values) of the batch
            loss = nn.functional.mse_loss(model(images), torch.roll(images, 1, -1))  # toy task: a 1-pixel shift
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.extend(ids.tolist())
            steps += 1
            if steps % args.save_every == 0 or steps == args.stop_after:
                checkpoint(epoch)
            if steps == args.stop_after:
                print(f"rank {rank}: stopped after {steps} steps (rerun the same command to resume)")
                if distributed:
                    dist.destroy_process_group()
                return {"stopped": True, "epoch": epoch, "seen": list(seen)}
        everyone = [None] * world
        if distributed:
            dist.all_gather_object(everyone, seen)
        else:
            everyone = [seen]
        ids = sorted(i for part in everyone for i in part)
        if ids != list(range(len(ds))):
            raise RuntimeError(f"epoch {epoch}: expected every sample once. Got {len(ids)} ids")
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}; all {len(ds)} samples seen once across {world} rank(s)")
        checked.append(epoch)
        seen = []
        checkpoint(epoch + 1, between_epochs=True)
    if distributed:
        dist.destroy_process_group()
    return {"stopped": False, "checked": checked}


if __name__ == "__main__":
    main()
