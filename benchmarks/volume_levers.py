"""What moves the bytes of a `dims=3` pack of real volumes: `python -m benchmarks volume-levers` (issue 46).

    python -m benchmarks volume-levers                    # the docs table (docs/benchmarks/compression.md)
    python -m benchmarks volume-levers --targets 40 --sets anatomical
    python -m benchmarks volume-levers --json OUT.json

Sets: nibabel's real volumes (`tests/shipped_images.real_volumes`; needs nibabel, the `bench` extra), packed in
their own dtype. Per set and `--target-psnr`, one `dctdata.pack` per arm, each read back for its PSNR:
- "auto": the default 3-D pack (calibration chooses the stage, int8 or int16, cf);
- "int8", "int16": the coefficient dtype forced (`quant`), so its steps too: whether the choice is right;
- "zstd-19": the lossless stage forced to zstd-19 instead of the entropy coder;
- "2-D channels": the same array packed 2-D, the depth as channels (what a block as deep as the volume with
  a rotation across it would reach, on the short axis);
- "2-D slices": every depth slice a sample of its own.

Per row: every stored byte (files + manifest.json), the fixed bytes (manifest.json and the zarr.json files),
the PSNR reached and the bytes over "auto"'s. A 2-D arm lands at its own PSNR (often above the target), so its
ratio is only an upper bound of what it saves. Per set: the coded voxels over the voxels (each axis padded to
whole blocks of 8), and what prediction of the DC across blocks could save: the order-0 entropy of the
quantized DC of every 8x8x8 block of the "auto" pack at the middle target, as is and as the difference to the
block on its left, over the pack's stored bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile

import numpy as np
import torch

import dctdata
from benchmarks.curves import pack_psnr
from benchmarks.ours import metadata_size, read_back, stored_size
from dctdata.errors import DctDataError
from dctdata.parse import parse_choice

TARGETS = (35.0, 40.0, 45.0)
ARMS: dict[str, dict] = {
    "auto": {"dims": 3},
    "int8": {"dims": 3, "quant": "int8"},
    "int16": {"dims": 3, "quant": "int16"},
    "zstd-19": {"dims": 3, "lossless": {"id": "zstd", "level": 19}},
    "2-D channels": {},
    "2-D slices": {"slices": True},
}


def volume_sets(names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The named real volumes (all by default): name -> (N, D, H, W) in their own dtype."""
    import shipped_images

    sets = shipped_images.real_volumes()
    if names is None:
        return sets
    return {n: sets[n] for n in dict.fromkeys(parse_choice(n, "--sets", tuple(sets)) for n in names)}


def entropy_bytes(values: np.ndarray) -> float:
    """Order-0 entropy of the values, in bytes."""
    _, counts = np.unique(values, return_counts=True)
    p = counts / counts.sum()
    return float(-(counts * np.log2(p)).sum()) / 8


def dc_bytes(path: str, name: str) -> tuple[float, float]:
    """(order-0 entropy of each block's quantized DC, of its difference to the block on its left) in bytes,
    over every sample of a `dims=3` pack (coefficient rows (C, Db, Hb, K, Wb), the DC first of K)."""
    ds = dctdata.open_dataset(path, as_dict=True)
    dc = np.stack([np.asarray(ds[i][name][0])[..., 0, :] for i in range(len(ds))]).astype(np.int64)
    return entropy_bytes(dc), entropy_bytes(np.diff(dc, axis=-1, prepend=0))


def arm_row(x: np.ndarray, arm: str, target: float, workdir: str, keep: bool = False) -> dict:
    """One pack of x (N, D, H, W) under `arm` at `target`: its bytes, fixed bytes, PSNR and choices."""
    kw = dict(ARMS[arm])
    source = x.reshape(-1, 1, *x.shape[-2:]) if kw.pop("slices", False) else x
    out = os.path.join(workdir, f"{arm}-{target:g}")
    manifest = dctdata.pack(source, out, target_psnr=target, quiet=True, **kw)
    field = manifest.field(kind="dct")
    rec, _, _ = read_back(out, field.name)
    ref = x.astype(np.float32)[:, None]
    row = dict(
        arm=arm,
        target=target,
        psnr=round(pack_psnr(ref, rec.reshape(ref.shape)), 2),
        bytes=stored_size(out, manifest),
        fixed=metadata_size(out, manifest),
        stage=str(field.lossless.get("id")),
        dtype=field.codec.dtype,
        cf=field.codec.cf,
    )
    if keep:
        row["dc_bytes"], row["dc_left_bytes"] = dc_bytes(out, field.name)
    shutil.rmtree(out)
    return row


def run(sets: dict[str, np.ndarray], targets: tuple[float, ...], arms: list[str]) -> dict[str, dict]:
    middle = targets[len(targets) // 2]
    results = {}
    with tempfile.TemporaryDirectory(prefix="dctdata-volume-levers-") as tmp:
        for name, x in sets.items():
            rows = []
            for t in targets:
                for arm in arms:
                    rows.append(arm_row(x, arm, t, tmp, keep=arm == "auto" and t == middle))
                auto = next(r for r in rows if r["arm"] == "auto" and r["target"] == t)
                for r in rows:
                    if r["target"] == t:
                        r["vs_auto"] = round(r["bytes"] / auto["bytes"], 3)
            coded = math.prod(-(-n // 8) * 8 for n in x.shape[1:]) / math.prod(x.shape[1:])
            results[name] = dict(shape=list(x.shape), dtype=x.dtype.name, coded_over_voxels=round(coded, 2), rows=rows)
    return results


def table(results: dict[str, dict]) -> str:
    lines = [
        "| set | target dB | arm | PSNR dB | stored bytes | fixed bytes | / auto | stage | dtype |",
        "|---|---:|---|---:|---:|---:|---:|---|---|",
    ]
    notes = []
    for name, res in results.items():
        for r in res["rows"]:
            lines.append(
                f"| {name} | {r['target']:g} | {r['arm']} | {r['psnr']:.2f} | {r['bytes']:,} | {r['fixed']:,} "
                f"| {r['vs_auto']:.3f} | {r['stage']} | {r['dtype']} |"
            )
        note = f"{name} {tuple(res['shape'])} {res['dtype']}: coded voxels / voxels {res['coded_over_voxels']:.2f}"
        dc = next((r for r in res["rows"] if "dc_bytes" in r), None)
        if dc is not None:
            note += (
                f"; quantized DC at {dc['target']:g} dB: {dc['dc_bytes']:.0f} B as is, {dc['dc_left_bytes']:.0f} B "
                f"predicted from the left block (order-0), of {dc['bytes']:,} B stored "
                f"({dc['dc_bytes'] / dc['bytes']:.1%})"
            )
        notes.append(note)
    return "\n".join([*lines, "", *notes])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks volume-levers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help=f"dB (default {TARGETS})")
    ap.add_argument("--sets", nargs="+", default=None, help="these real volumes only (default: all)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), help="these arms only (default: all; 'auto' always)")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    args = ap.parse_args(argv)
    arms = [
        "auto",
        *(a for a in dict.fromkeys(parse_choice(a, "--arms", tuple(ARMS)) for a in args.arms) if a != "auto"),
    ]
    if any(t <= 0 for t in args.targets):
        raise DctDataError(f"--targets: expected positive dB values. Got {args.targets}")
    torch.set_num_threads(1)
    results = run(volume_sets(args.sets), tuple(sorted(args.targets)), arms)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(targets=sorted(args.targets), sets=results), f, indent=1)
