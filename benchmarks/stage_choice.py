"""Stored bytes against the target on int16 sets with a dark background, where the lossless stage "auto"
chooses decides the size: `python -m benchmarks stage-choice`.

    python -m benchmarks stage-choice                      # the docs table (docs/benchmarks/entropy.md)
    python -m benchmarks stage-choice --quick              # a smoke run: 8 slices, two targets
    python -m benchmarks stage-choice --json OUT.json

Sets (`tests/shipped_images.py`, from matplotlib's shipped MRI slice; nothing downloaded):
- "fMRI slices": `fmri_series`, 2 volumes x 24 slices of 96 x 128 int16 (the same slices in each volume), packed
  as 48 2-D samples;
- "MRI volume": `mri_volume`, one 25 x 41 x 33 int16 volume (odd sizes), packed with `dims=3`.

Each is a real `dctdata.pack` per `--target-psnr` (default settings: "auto" chooses the stage), read back
with the pack's own decompressor for its PSNR (`benchmarks.ours`). Per row: the stage, the coefficient
dtype, every stored byte (files + manifest.json), manifest.json alone, and the compression ratio over
float32. "monotone" says whether stored bytes rise with the target over the sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
from shipped_images import fmri_series, mri_volume

import dctdata
from benchmarks.curves import pack_psnr
from benchmarks.ours import read_back, stored_size
from dctdata.format import MANIFEST_NAME

TARGETS = (30.0, 35.0, 40.0, 45.0, 50.0)
QUICK_TARGETS = (35.0, 45.0)


def sets(quick: bool) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (source array, dims)."""
    slices = fmri_series(slices=4) if quick else fmri_series()
    return {
        f"fMRI slices {slices.shape[0]} x 96 x 128": (slices, 2),
        "MRI volume 25 x 41 x 33": (mri_volume()[None], 3),
    }


def row(x: np.ndarray, dims: int, target: float, workdir: str) -> dict:
    """One pack of x at `target`: what it stores and what it reaches."""
    source, out = os.path.join(workdir, "source.npy"), os.path.join(workdir, f"pack-{target:g}")
    np.save(source, x)
    manifest = dctdata.pack(source, out, target_psnr=target, dims=dims, quiet=True)
    field = manifest.field(kind="dct")
    rec, _, _ = read_back(out, field.name)
    ref = x.astype(np.float32)[:, None] if x.ndim == 3 or dims == 3 else x.astype(np.float32)
    total = stored_size(out, manifest)
    result = dict(
        target=target,
        psnr=round(pack_psnr(ref, rec.reshape(ref.shape)), 3),
        stage=str(field.lossless.get("id")) + (f"-{field.lossless['level']}" if "level" in field.lossless else ""),
        dtype=field.codec.dtype,
        cf=field.codec.cf,
        stored_bytes=total,
        manifest_bytes=os.path.getsize(os.path.join(out, MANIFEST_NAME)),
        cr=round(x.size * 4 / total, 2),
    )
    shutil.rmtree(out)
    return result


def run(quick: bool, targets: tuple[float, ...]) -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="dctdata-stage-choice-") as tmp:
        for name, (x, dims) in sets(quick).items():
            rows = [row(x, dims, t, tmp) for t in targets]
            sizes = [r["stored_bytes"] for r in rows]
            out[name] = dict(shape=list(x.shape), dims=dims, rows=rows, monotone=sizes == sorted(sizes))
    return out


def table(results: dict[str, dict]) -> str:
    lines = [
        "| set | target dB | PSNR dB | stage | dtype | stored bytes | manifest bytes | CR |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for name, res in results.items():
        for r in res["rows"]:
            lines.append(
                f"| {name} | {r['target']:g} | {r['psnr']:.2f} | {r['stage']} | {r['dtype']} | {r['stored_bytes']:,} "
                f"| {r['manifest_bytes']:,} | {r['cr']:.1f} |"
            )
    lines.append("")
    lines += [
        f"{name}: stored bytes {'rise' if r['monotone'] else 'do NOT rise'} with the target"
        for name, r in results.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks stage-choice", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 slices and two targets (a smoke run)")
    ap.add_argument("--targets", type=float, nargs="+", default=None, help=f"--target-psnr sweep (default {TARGETS})")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    args = ap.parse_args(argv)
    targets = tuple(args.targets or (QUICK_TARGETS if args.quick else TARGETS))
    results = run(args.quick, targets)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(targets=list(targets), sets=results), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
