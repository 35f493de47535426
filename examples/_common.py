"""Shared by the four paper examples (classify, em_denoise, optical_damage, slstr_cloud).

One study = one synthetic (or real) training set, packed with several settings; the same network is
trained for the same budget (epochs, batch size, learning rate, initial weights, batch order, crops)
on every pack and on the raw arrays, then scored on held-out data. Written out: a markdown table
(stdout and OUT/results.md), OUT/results.json and OUT/results.png (final metric vs stored ratio,
drawn with Pillow).

The packed runs read the zarr pack through an ordinary DataLoader; every `dct` field of a batch goes
through its `Decompress` layer first (for the input that is `nn.Sequential(ds.decompressor(f), net)`
written out in the loop, because the targets are decoded by their own layers), everything after that
is identical to the raw run. The test metric is measured twice: on the raw held-out arrays (a model
trained on packed data, used on new data) and on the same arrays passed through the pack's codec
("coded": what a packed test set gives).

Settings (`--settings`): tokens joined by "+", e.g. `cf=5` (DCT+Chop with float32 coefficients, the
paper's setting: CR = 64/CF^2 before the lossless stage), `cf=5+quant=int8`, `psnr=40` (target PSNR
with int8 coefficients, CF and mask chosen by calibration), `psnr=40+quant=int16`, `mask=triangle`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

import dctdata
from dctdata.report import pack_summary

DEFAULT_SETTINGS = ("cf=3", "cf=5", "cf=7", "psnr=30", "psnr=35", "psnr=40")
_KEYS = {"cf": int, "mask": str, "quant": str, "psnr": float}


# Settings ------------------------------------------------------------------------------------------
def parse_setting(text: str) -> dict[str, Any]:
    """'cf=5+quant=int8' -> keywords for dctdata.pack (psnr -> target_psnr; psnr alone -> int8)."""
    kw: dict[str, Any] = {}
    for token in text.split("+"):
        key, sep, value = token.partition("=")
        if not sep or key not in _KEYS:
            raise dctdata.DctDataError(
                f"--settings {text!r}: expected tokens {'|'.join(_KEYS)}=VALUE joined by '+'. Got {token!r}"
            )
        try:
            kw[key] = _KEYS[key](value)
        except ValueError:
            raise dctdata.DctDataError(f"--settings {text!r}: expected a number for {key}. Got {value!r}") from None
    if "psnr" in kw:
        kw["target_psnr"] = kw.pop("psnr")
        kw.setdefault("quant", "int8")
    if "cf" not in kw and "target_psnr" not in kw:
        raise dctdata.DctDataError(f"--settings {text!r}: expected cf=N or psnr=DB. Got neither")
    return kw


def main(
    name: str,
    make_task: Callable[[argparse.Namespace], Task],
    doc: str,
    argv: list[str] | None,
    defaults: dict[str, Any],
    options: dict[str, tuple[type | None, Any, str]],
    check: Callable[[argparse.Namespace], str | None] = lambda args: None,
) -> list[dict[str, Any]]:
    """An example's command line: the shared flags (`defaults`: n, test, epochs, batch_size, lr and
    optionally settings), its own `options` ({flag: (type, default, help)}), then the study.
    `check(args)` returns a one-line problem with the flags, or None."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_arguments(p, **defaults)
    for flag, (kind, default, text) in options.items():
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    args = p.parse_args(argv)
    problem = check(args)
    if problem:
        raise SystemExit(f"{name}.py: {problem}")
    return run_study(make_task(args), args)


def add_arguments(
    p: argparse.ArgumentParser,
    *,
    n: int,
    test: int,
    epochs: int,
    batch_size: int,
    lr: float,
    settings: tuple[str, ...] = DEFAULT_SETTINGS,
) -> None:
    """The flags every example shares (scale up with --n/--epochs/--settings)."""
    p.add_argument("--out", default=None, help="output directory (default: results/<example>)")
    p.add_argument("--n", type=int, default=n, help=f"training samples (default {n})")
    p.add_argument("--test", type=int, default=test, help=f"held-out samples (default {test})")
    p.add_argument(
        "--epochs", type=int, default=epochs, help=f"training epochs, the same for every run (default {epochs})"
    )
    p.add_argument("--batch-size", type=int, default=batch_size, help=f"(default {batch_size})")
    p.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr:g})")
    p.add_argument(
        "--settings", nargs="+", default=list(settings), help=f"pack settings (default {' '.join(settings)})"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")


# The task ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Metric:
    """The test metric: its name, `fn(net, data) -> float`, and which way is better."""

    name: str
    fn: Callable[[nn.Module, dict[str, torch.Tensor]], float]
    higher_is_better: bool


@dataclasses.dataclass
class Task:
    """What an example supplies. Arrays are (N, ...) in the source dtype; `kinds` says how each field
    is packed. `loss(net, batch)` and `metric(net, data)` get float32 tensors in source units
    (decoded for packed runs), so they normalise the same way for every run."""

    name: str
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    kinds: dict[str, str]
    make_net: Callable[[], nn.Module]
    loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    metric: Metric
    crop: int | None = None  # random training crop (pixels) of every image field, same place for all
    targets: tuple[str, ...] = ()  # dct fields that are targets: kept raw in the (coded) evaluation
    description: str = ""


class ArrayDict(torch.utils.data.Dataset):
    """The raw baseline: the same arrays, no compression, as dicts of tensors."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v[i])) for k, v in self.arrays.items()}


def to_float(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def as_is(x: torch.Tensor) -> torch.Tensor:
    return x


def raw_decoders(task: Task) -> dict[str, Callable]:
    """Raw run: image fields (kind dct in the packs) become float32 as Decompress outputs; masks and
    labels stay as stored (the packs store them exactly too)."""
    return {k: to_float if task.kinds[k] == "dct" else as_is for k in task.train}


def tensors(task: Task, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    dec = raw_decoders(task)
    return {k: dec[k](torch.from_numpy(np.asarray(v))) for k, v in arrays.items()}


def random_crop(batch: dict[str, torch.Tensor], size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The same random crop of every (B, C, H, W) field; other fields pass through."""
    img = next(v for v in batch.values() if v.dim() == 4)
    h, w = img.shape[-2:]
    top = int(torch.randint(0, max(h - size, 0) + 1, (1,), generator=gen))
    left = int(torch.randint(0, max(w - size, 0) + 1, (1,), generator=gen))
    return {k: v[..., top : top + size, left : left + size] if v.dim() == 4 else v for k, v in batch.items()}


def train(task: Task, net: nn.Module, dataset, decode: dict[str, Callable], args) -> tuple[list[float], float]:
    """Train `net` for args.epochs; returns (mean loss per epoch, seconds). Batch order and crops are
    a function of args.seed only, so every run sees the same samples in the same order."""
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    losses, t0 = [], time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.Generator().manual_seed(args.seed * 7919 + epoch)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, generator=order, drop_last=True
        )
        net.train()
        total, count = 0.0, 0
        for batch in loader:
            batch = {k: decode[k](v) for k, v in batch.items()}  # Decompress for dct fields: the first layer
            if task.crop:
                batch = random_crop(batch, task.crop, gen)
            loss = task.loss(net, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            b = len(next(iter(batch.values())))
            total, count = total + loss.item() * b, count + b
        losses.append(total / max(count, 1))
    return losses, time.perf_counter() - t0


def coded(task: Task, manifest) -> dict[str, torch.Tensor]:
    """The held-out inputs passed through the pack's codec (encode + Decompress), as a packed test set
    gives them; targets (`task.targets`) stay raw, so the score is always against the truth."""
    out = {}
    for k, v in tensors(task, task.test).items():
        x = v
        f = manifest.field(k)
        if f.kind == "dct" and k not in task.targets:
            q, _ = dctdata.encode(x.float().reshape(len(x), *f.shape), f.codec)
            x = dctdata.Decompress(f.codec)(q).reshape(x.shape)
        out[k] = x
    return out


def evaluate(task: Task, net: nn.Module, data: dict[str, torch.Tensor]) -> float:
    net.eval()
    with torch.no_grad():
        return float(task.metric.fn(net, data))


# The study -----------------------------------------------------------------------------------------
def run_study(task: Task, args) -> list[dict[str, Any]]:
    """Raw baseline + one packed run per setting; writes results.{md,json,png} under args.out."""
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("n", "test", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise dctdata.DctDataError(
                f"--{name.replace('_', '-')}: expected an integer >= 1. Got {getattr(args, name)}"
            )
    if args.batch_size > args.n:
        raise dctdata.DctDataError(
            f"--batch-size: expected at most --n ({args.n}) samples per batch. Got {args.batch_size}"
        )
    settings = [(s, parse_setting(s)) for s in args.settings]
    out = os.path.abspath(args.out or os.path.join("results", task.name))
    clean_out(out)
    os.makedirs(os.path.join(out, "packs"))
    source = os.path.join(out, "source.npz")
    np.savez(source, **task.train)
    missing = sorted(set(task.train) - set(task.kinds))
    if missing:
        raise dctdata.DctDataError(f"{task.name}: expected a kind for every field. Got none for {missing}")
    raw_test = tensors(task, task.test)

    torch.manual_seed(args.seed)
    init = task.make_net().state_dict()

    def fresh() -> nn.Module:
        net = task.make_net()
        net.load_state_dict(init)
        return net

    rows = []
    _log(f"[{task.name}] raw baseline")
    net = fresh()
    losses, seconds = train(task, net, ArrayDict(task.train), raw_decoders(task), args)
    raw_bytes = sum(a.nbytes for a in task.train.values())
    f32_bytes = sum(4 * a.size for a in task.train.values())
    raw_metric = evaluate(task, net, raw_test)
    rows.append(
        {
            "setting": "raw",
            "stored_bytes": raw_bytes,
            "ratio_f32": f32_bytes / raw_bytes,
            "ratio_src": 1.0,
            "transfer": f32_bytes / raw_bytes,
            "psnr_min": math.inf,
            "psnr_median": math.inf,
            "codec": "none",
            "losses": losses,
            "train_seconds": seconds,
            "metric_raw": raw_metric,
            "metric_coded": raw_metric,
        }
    )
    for label, kw in settings:
        _log(f"[{task.name}] pack {label}")
        path = os.path.join(out, "packs", label.replace("=", "").replace("+", "_") + ".zarr")
        t = time.perf_counter()
        manifest = dctdata.pack(source, path, format="zarr", fields=task.kinds, overwrite=True, quiet=True, **kw)
        pack_seconds = time.perf_counter() - t
        ds = dctdata.open_dataset(path, as_dict=True)
        decode = {f.name: (ds.decompressor(f.name) if f.kind == "dct" else as_is) for f in manifest.fields}
        _log(f"[{task.name}] train {label}")
        net = fresh()
        losses, seconds = train(task, net, ds, decode, args)
        summary = pack_summary(manifest)
        rows.append(
            {
                "setting": label,
                **{
                    k: summary[k]
                    for k in ("stored_bytes", "ratio_f32", "ratio_src", "transfer", "psnr_min", "psnr_median")
                },
                "codec": ", ".join(f"{k}: {v}" for k, v in summary["settings"].items()),
                "losses": losses,
                "train_seconds": seconds,
                "pack_seconds": pack_seconds,
                "metric_raw": evaluate(task, net, raw_test),
                "metric_coded": evaluate(task, net, coded(task, manifest)),
            }
        )
    write_results(task, rows, out, args)
    return rows


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# Output --------------------------------------------------------------------------------------------
COLUMNS = (
    "setting",
    "codec",
    "stored ratio vs float32",
    "vs source",
    "transfer ratio",
    "PSNR min/median dB",
    "train loss first → final",
)


def table(task: Task, rows: list[dict[str, Any]]) -> str:
    cols = (*COLUMNS, f"test {task.metric.name} (raw)", f"test {task.metric.name} (coded)", "Δ vs raw")
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join([":--", ":--"] + ["--:"] * (len(cols) - 2)) + "|"]
    base = rows[0]["metric_raw"]
    for r in rows:
        psnr = "exact" if math.isinf(r["psnr_min"]) else f"{r['psnr_min']:.1f} / {r['psnr_median']:.1f}"
        delta = r["metric_raw"] - base
        rel = f"{delta:+.4f}" + (f" ({100 * delta / abs(base):+.1f}%)" if base else "")
        cells = [
            r["setting"],
            r["codec"],
            f"{r['ratio_f32']:.2f}",
            f"{r['ratio_src']:.2f}",
            f"{r['transfer']:.2f}",
            psnr,
            f"{r['losses'][0]:.4g} → {r['losses'][-1]:.4g}",
            f"{r['metric_raw']:.4f}",
            f"{r['metric_coded']:.4f}",
            "—" if r is rows[0] else rel,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(task: Task, rows: list[dict[str, Any]], out: str, args) -> None:
    text = table(task, rows)
    better = "higher" if task.metric.higher_is_better else "lower"
    header = (
        f"{task.name}: {task.description} {args.n} training / {args.test} test samples, {args.epochs} epochs, batch "
        f"{args.batch_size}, "
        f"lr {args.lr:g}, seed {args.seed}; {task.metric.name}: {better} is better. Stored ratio: uncompressed float32 "
        "bytes / the "
        "stored files the manifest lists (raw row: the source arrays uncompressed). (raw) = scored on the raw held-out "
        "arrays, (coded) = on held-out "
        "inputs through the same codec (targets stay raw). Δ vs raw on the (raw) column."
    )
    print(header)
    print()
    print(text)
    md = os.path.join(out, "results.md")
    _atomic_write(md, header + "\n\n" + text + "\n")
    payload = {
        "task": task.name,
        "metric": task.metric.name,
        "higher_is_better": task.metric.higher_is_better,
        "args": vars(args),
        "rows": rows,
    }
    _atomic_write(os.path.join(out, "results.json"), json.dumps(payload, indent=1, default=str))
    plot(task, rows, os.path.join(out, "results.png"))
    print(f"\nwrote {md}, results.json, results.png", file=sys.stderr)


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def plot(task: Task, rows: list[dict[str, Any]], path: str, size: tuple[int, int] = (720, 460)) -> None:
    """Final test metric (raw and coded inputs) vs stored ratio (log2 axis), raw baseline as a dashed line."""
    from PIL import Image, ImageDraw, ImageFont

    w, h = size
    left, right, top, bottom = 80, 20, 40, 60
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    xs = [math.log2(r["ratio_f32"]) for r in rows]
    ys = [r[k] for r in rows for k in ("metric_raw", "metric_coded")]
    x0, x1 = min(0.0, min(xs)), max(xs) + 0.3
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.1 or abs(y1) * 0.1 or 1.0
    y0, y1 = y0 - pad, y1 + pad

    def px(x: float, y: float) -> tuple[float, float]:
        return left + (x - x0) / (x1 - x0) * (w - left - right), top + (y1 - y) / (y1 - y0) * (h - top - bottom)

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for e in range(math.floor(x0), math.ceil(x1) + 1):
        if x0 <= e <= x1:
            x, _ = px(e, y0)
            d.line([x, h - bottom, x, h - bottom + 5], fill="black")
            d.text((x - 8, h - bottom + 8), f"{2**e:g}", fill="black", font=font)
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        _, yy = px(x0, y)
        d.line([left - 5, yy, left, yy], fill="black")
        d.text((5, yy - 6), f"{y:.4g}", fill="black", font=font)
    d.text((w // 2 - 120, h - 25), "stored ratio vs float32 (log scale)", fill="black", font=font)
    better = "higher" if task.metric.higher_is_better else "lower"
    d.text(
        (left, 10),
        f"{task.name}: test {task.metric.name} ({better} is better) vs stored ratio",
        fill="black",
        font=font,
    )
    # raw baseline: dashed line
    _, yb = px(x0, rows[0]["metric_raw"])
    for x in range(left, w - right, 12):
        d.line([x, yb, min(x + 6, w - right), yb], fill="gray")
    for r, x in zip(rows, xs):
        for key, colour in (("metric_coded", (220, 120, 0)), ("metric_raw", (0, 90, 200))):
            cx, cy = px(x, r[key])
            d.ellipse([cx - 4, cy - 4, cx + 4, cy + 4], fill=colour if r is not rows[0] else "black")
        cx, cy = px(x, r["metric_raw"])
        d.text((cx + 6, cy - 12), r["setting"], fill="black", font=font)
    d.ellipse([w - 230, top + 8, w - 222, top + 16], fill=(0, 90, 200))
    d.text((w - 216, top + 6), "raw test inputs", fill="black", font=font)
    d.ellipse([w - 230, top + 24, w - 222, top + 32], fill=(220, 120, 0))
    d.text((w - 216, top + 22), "coded test inputs", fill="black", font=font)
    tmp = path + ".tmp.png"
    img.save(tmp)
    os.replace(tmp, path)


def clean_out(path: str) -> None:
    """Remove the packs of a previous run (results files are overwritten)."""
    shutil.rmtree(os.path.join(path, "packs"), ignore_errors=True)
