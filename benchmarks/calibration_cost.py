"""Issue 44, "a target-PSNR pack at most 1.5x the fixed-setting pack": what calibration costs a pack.

    python -m benchmarks calibration-cost [--frames 32] [--size 492x656] [--target-psnr 40] [--repeat 3]
        [--threads N] [--workers N] [--before-python PATH] [--json PATH] [--workdir DIR]

The case: `--frames` frames of the optical_damage stand-in (`dctdata.datasets.optical_damage`, 492 x 656
uint16) saved as one (N, 1, H, W) uint16 .npy. For each interpreter (this one, and `--before-python`, a
python whose `import dctdata` is another version, when given):

1. `python -m dctdata pack FRAMES OUT --target-psnr T` once, to learn the setting calibration chooses
   (cf, mask, quant from the manifest);
2. then, `--repeat` times, the target pack and the fixed-setting pack of that same setting
   (`--cf CF --mask MASK --quant Q`: no search, the finest steps the dtype holds) one after the other,
   alternating which goes first (and which interpreter goes first), each in a fresh process with a fresh OUT
   and its stderr captured: their wall times.

Printed: per interpreter the median wall time of each pack and their ratio (target / fixed, the number
the issue bounds), the stored bytes (every file the manifest lists plus manifest.json) and the per-frame
minimum and dataset PSNR the manifest records for both packs, and whether the two interpreters' target
packs stored the same bytes (every data file's checksum equal). The load average before and after is
printed with the times: they are wall-clock on whatever machine runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.calibration_time import child_env, stored_bytes
from dctdata.datasets import OPTICAL_SHAPE, optical_damage
from dctdata.format.compact import unpack_checksum


def write_frames(path: str, n: int, shape: tuple[int, int]) -> np.ndarray:
    """n optical_damage frames (N, 1, H, W) uint16 saved at path; returns them."""
    ds = optical_damage(n=n, shape=shape)
    frames = np.stack([ds[i]["image"] for i in range(n)])
    np.save(path, frames)
    return frames


def run_pack(python: str, frames: str, out: str, flags: list[str], cwd: str, env: dict[str, str]) -> dict[str, Any]:
    """One `python -m dctdata pack FRAMES OUT FLAGS` in a fresh process: wall time and what it stored."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "dctdata", "pack", frames, out, *flags], cwd=cwd, capture_output=True, text=True, env=env
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(os.path.join(out, "manifest.json")):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} pack {' '.join(flags)}: exit {proc.returncode}: {tail}")
    stored, manifest = stored_bytes(out)
    field = next(f for f in manifest["fields"] if f["kind"] == "dct")
    codec, stats = field["codec"], manifest["stats"][field["name"]]
    files = manifest["checksums"]
    shutil.rmtree(out)
    return {
        "seconds": seconds,
        "setting": {"cf": codec["cf"], "mask": codec["mask"], "quant": codec["dtype"]},
        "lossless": field["lossless"].get("id"),
        "stored_bytes": stored,
        # what must agree for "the same bytes": every data file, and the field's codec and lossless stage
        "identity": {"files": {name: unpack_checksum(e, name)["sha256"] for name, e in files.items()}, "field": field},
        "psnr_min": stats["psnr_min"],
        "psnr_dataset": stats["psnr_dataset"],
    }


def fixed_flags(setting: dict[str, Any]) -> list[str]:
    """The flags of the fixed-setting pack of a target pack's chosen setting."""
    return ["--cf", str(setting["cf"]), "--mask", setting["mask"], "--quant", setting["quant"]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = child_env(args.threads)
    extra = [] if args.workers is None else ["--workers", str(args.workers)]
    versions = [("current", sys.executable)]
    if args.before_python:
        versions.insert(0, ("before", args.before_python))
    with tempfile.TemporaryDirectory(prefix="calibration-cost-", dir=args.workdir) as tmp:
        path = os.path.join(tmp, "frames.npy")
        frames = write_frames(path, args.frames, tuple(int(v) for v in args.size.split("x")))
        target = ["--target-psnr", f"{args.target_psnr:g}", *extra]
        packs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        flags: dict[str, list[str]] = {}
        for label, python in versions:  # the setting each version's calibration chooses (not timed)
            first = run_pack(python, path, os.path.join(tmp, f"{label}-probe.dct"), target, tmp, env)
            flags[label] = fixed_flags(first["setting"]) + extra
            packs[label] = {"target": [], "fixed": []}
        load_before = os.getloadavg()[0]
        for run in range(args.repeat):
            order = versions if run % 2 == 0 else versions[::-1]
            kinds = ("target", "fixed") if run % 2 == 0 else ("fixed", "target")
            for label, python in order:
                for kind in kinds:
                    out = os.path.join(tmp, f"{label}-{kind}.dct")
                    row = run_pack(python, path, out, target if kind == "target" else flags[label], tmp, env)
                    packs[label][kind].append(row)
                    print(f"{label} {kind} run {run + 1}: {row['seconds']:.1f} s", file=sys.stderr, flush=True)
        load_after = os.getloadavg()[0]
    rows = []
    for label, python in versions:
        t, f = packs[label]["target"], packs[label]["fixed"]
        t_med = statistics.median(r["seconds"] for r in t)
        f_med = statistics.median(r["seconds"] for r in f)
        rows.append(
            {
                "version": label,
                "python": python,
                "target_seconds": [r["seconds"] for r in t],
                "fixed_seconds": [r["seconds"] for r in f],
                "ratio": t_med / f_med,
                "setting": t[0]["setting"],
                "fixed_flags": flags[label],
                "target_bytes": t[0]["stored_bytes"],
                "fixed_bytes": f[0]["stored_bytes"],
                "target_psnr_min": t[0]["psnr_min"],
                "fixed_psnr_min": f[0]["psnr_min"],
                "target_psnr_dataset": t[0]["psnr_dataset"],
                "fixed_psnr_dataset": f[0]["psnr_dataset"],
                "target_identity": t[0]["identity"],
                "deterministic": all(r["identity"] == t[0]["identity"] for r in t),
            }
        )
    same = None
    if len(rows) == 2:
        same = rows[0]["target_identity"] == rows[1]["target_identity"]
    n, c, h, w = frames.shape
    lines = [
        f"{n} frames {h}x{w} uint16 ({frames.nbytes / 1e6:.1f} MB, one .npy), `python -m dctdata pack FRAMES OUT "
        f"--target-psnr {args.target_psnr:g}` against the fixed-setting pack of the setting it chose; "
        f"{os.cpu_count()} CPU(s), {'default' if args.threads is None else args.threads} torch thread(s), "
        f"{'default' if args.workers is None else args.workers} worker(s), {args.repeat} run(s) each, alternating; "
        f"load average {load_before:.1f} before, {load_after:.1f} after",
        "",
        "| dctdata | setting | target pack s (runs) | fixed pack s (runs) | target / fixed | stored bytes target / "
        "fixed | frame PSNR min target / fixed | dataset PSNR target / fixed |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["setting"]
        lines.append(
            f"| {r['version']} | cf={s['cf']} {s['mask']} {s['quant']} | "
            f"{' / '.join(f'{v:.1f}' for v in r['target_seconds'])} | "
            f"{' / '.join(f'{v:.1f}' for v in r['fixed_seconds'])} | {r['ratio']:.2f}x | "
            f"{r['target_bytes']:,} / {r['fixed_bytes']:,} | {r['target_psnr_min']:.2f} / {r['fixed_psnr_min']:.2f} | "
            f"{r['target_psnr_dataset']:.2f} / {r['fixed_psnr_dataset']:.2f} |"
        )
    lines.append("")
    if same is not None:
        verdict = "the same" if same else "different"
        lines.append(f"- the two versions' target packs stored {verdict} bytes (files, codec, stage)")
    for r in rows:
        if not r["deterministic"]:
            lines.append(f"- {r['version']}: its target packs differed between runs")
    print("\n".join(lines))
    payload = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "frames": [n, c, h, w],
        "load_before": load_before,
        "load_after": load_after,
        "rows": rows,
        "same_target_bytes": same,
    }
    payload = json.loads(json.dumps(payload, default=float), parse_constant=lambda v: None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1)
            fh.write("\n")
    return payload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks calibration-cost", description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--size", default="x".join(map(str, OPTICAL_SHAPE)), help="frame HxW (default the real 492x656)")
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--repeat", type=int, default=3, help="runs of each pack, alternating which goes first")
    p.add_argument("--threads", type=int, help="torch/BLAS threads of every pack (default: theirs)")
    p.add_argument("--workers", type=int, help="--workers of every pack (default: the pack's own)")
    p.add_argument("--before-python", help="also time a python whose `import dctdata` is another version")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--workdir", help="where the frames and packs go (default: a temporary folder, removed)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
