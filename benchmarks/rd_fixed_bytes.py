"""How much of `python -m benchmarks rd`'s bytes are fixed per pack (manifest.json and zarr.json files), and
what the ratios would be without them: the README's "Fixed bytes are what is left at 35 dB" numbers.

    python -m benchmarks rd-fixed-bytes ratios RD.json        # RD.json from `python -m benchmarks rd --json RD.json`
    python -m benchmarks rd-fixed-bytes files OUT.json [--target-psnr 35] [--items mri cell ...]

`ratios`: the geometric-mean ratios of the run as measured, and with each dctdata point's fixed bytes
(its note's "metadata N B") taken out of its size, peers unchanged.
`files`: packs every `bench rd` pack once at one target (as the bench does: a temporary .npy, default
settings) and lists the bytes of each stored file, fixed and total.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

import dctdata
from benchmarks.curves import Point, geomean
from benchmarks.items import load_items, packs_of
from benchmarks.ours import metadata_size
from benchmarks.rd import BEST, PackResult, ratios


def _results(run: dict, payload_only: bool) -> list[PackResult]:
    out = []
    for k in run["packs"]:
        curves = {}
        for name, pts in k["curves"].items():
            curves[name] = []
            for p in pts:
                size = p["bytes"]
                if payload_only and name == "dctdata" and size:
                    size -= int(re.search(r"metadata (\d+) B", p["note"]).group(1))
                curves[name].append(Point(p["setting"], size, p["psnr"]))
        out.append(
            PackResult(k["name"], k["mode"], k["group"], k["samples"], tuple(k["shape"]), k["raw_bytes"], curves)
        )
    return out


def show_ratios(path: str) -> None:
    run = json.load(open(path))
    levels = run["config"]["levels"]
    for title, payload_only in (("as measured", False), ("fixed bytes taken out of dctdata's", True)):
        res = _results(run, payload_only)
        print(f"\n{title}\n| packs | vs best peer {' / '.join(f'{v:g}' for v in levels)} dB | vs ZFP |\n|---|---|---|")
        for group in ("all packs", "tiles", "whole items"):
            best = " / ".join(f"{geomean(ratios(res, BEST, v, group)):.3f}" for v in levels)
            zfp = " / ".join(f"{geomean(ratios(res, 'zfp', v, group)):.3f}" for v in levels)
            print(f"| {group} | {best} | {zfp} |")


def list_files(out: str, target: float, names: list[str] | None) -> None:
    items, _ = load_items(names)
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for k, p in enumerate(packs_of(items)):
            src = os.path.join(d, "source.npy")
            np.save(src, np.ascontiguousarray(p.x, dtype=np.float32))
            dst = os.path.join(d, f"pack-{k}")
            manifest = dctdata.pack(src, dst, target_psnr=target, quiet=True)
            sizes = {
                os.path.relpath(os.path.join(r, f), dst): os.path.getsize(os.path.join(r, f))
                for r, _, fs in os.walk(dst)
                for f in fs
            }
            fixed = metadata_size(dst, manifest)  # the bench's own count of a pack's fixed bytes
            res[p.name] = {"fixed": fixed, "total": sum(sizes.values()), "files": sizes}
            print(f"{p.name}: fixed {fixed} B of {sum(sizes.values())} B", flush=True)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks rd-fixed-bytes", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("ratios")
    r.add_argument("run")
    f = sub.add_parser("files")
    f.add_argument("out")
    f.add_argument("--target-psnr", type=float, default=35.0)
    f.add_argument("--items", nargs="*")
    a = ap.parse_args(argv)
    if a.what == "ratios":
        show_ratios(a.run)
    else:
        list_files(a.out, a.target_psnr, a.items)


if __name__ == "__main__":
    main(sys.argv[1:])
