"""Stored bytes against the target on int16 sets with a dark background, where the lossless stage "auto"
chooses decides the size, beside SPERR at the PSNR each pack reached: `python -m benchmarks stage-choice`.

    python -m benchmarks stage-choice                      # the docs table (docs/benchmarks/entropy.md)
    python -m benchmarks stage-choice --quick              # a smoke run: 8 slices, two targets
    python -m benchmarks stage-choice --sets stand-in      # the stand-ins made from matplotlib's MRI slice
    python -m benchmarks stage-choice --json OUT.json

Sets (`tests/shipped_images.py`; nothing downloaded):
- `--sets real` (the default; needs nibabel, the `bench` extra): nibabel's own test images. "fMRI slices":
  `fmri_slices`, the 48 slices (2 volumes x 24) of 96 x 128 of example4d.nii.gz, int16, packed as 48 2-D samples;
  "MRI volume": `anatomical_volume`, anatomical.nii, one 25 x 41 x 33 int16 volume (odd sizes), `dims=3`.
- `--sets stand-in`: the same shapes made from matplotlib's shipped MRI slice (`fmri_series`, `mri_volume`).

Each is a real `dctdata.pack` per `--target-psnr` (default settings: "auto" chooses the stage), read back
with the pack's own decompressor for its PSNR (`benchmarks.ours`). Per row: the stage, the coefficient
dtype, every stored byte (files + manifest.json), the fixed bytes (manifest.json and the zarr.json files:
they do not grow with the samples), the compression ratio over float32, and SPERR's (each slice or volume
coded alone, PSNR mode, swept; `benchmarks.peers`) at the PSNR the pack reached (log-interpolated, never
extrapolated): "vs SPERR" counts every stored byte, "payload vs SPERR" leaves the fixed bytes out. "monotone"
says whether stored bytes rise with the target over the sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import shipped_images

import dctdata
from benchmarks.curves import cr_at, geomean, pack_psnr
from benchmarks.ours import metadata_size, read_back, stored_size
from benchmarks.peers import PEERS, sperr_curves
from dctdata.format import MANIFEST_NAME

TARGETS = (30.0, 35.0, 40.0, 45.0, 50.0)
QUICK_TARGETS = (35.0, 45.0)


SETS = ("real", "stand-in")


def sets(quick: bool, which: str = "real") -> dict[str, tuple[np.ndarray, int]]:
    """name -> (source array, dims)."""
    if which == "real":
        slices, volume = shipped_images.fmri_slices(), shipped_images.anatomical_volume()
        slices = slices[:8] if quick else slices
    else:
        slices = shipped_images.fmri_series(slices=4) if quick else shipped_images.fmri_series()
        volume = shipped_images.mri_volume()
    return {
        f"fMRI slices {slices.shape[0]} x 96 x 128": (slices, 2),
        "MRI volume 25 x 41 x 33": (volume[None], 3),
    }


def peer_input(x: np.ndarray, dims: int) -> np.ndarray:
    """x as the peers take it: (N, 1, H, W) slices or (N, 1, D, H, W) volumes, float32."""
    return np.ascontiguousarray(x.astype(np.float32)[:, None])


def row(x: np.ndarray, dims: int, target: float, workdir: str) -> dict:
    """One pack of x at `target`: what it stores and what it reaches."""
    source, out = os.path.join(workdir, "source.npy"), os.path.join(workdir, f"pack-{target:g}")
    np.save(source, x)
    manifest = dctdata.pack(source, out, target_psnr=target, dims=dims, quiet=True)
    field = manifest.field(kind="dct")
    rec, _, _ = read_back(out, field.name)
    ref = x.astype(np.float32)[:, None] if x.ndim == 3 or dims == 3 else x.astype(np.float32)
    total, fixed = stored_size(out, manifest), metadata_size(out, manifest)
    result = dict(
        target=target,
        psnr=round(pack_psnr(ref, rec.reshape(ref.shape)), 3),
        stage=str(field.lossless.get("id")) + (f"-{field.lossless['level']}" if "level" in field.lossless else ""),
        dtype=field.codec.dtype,
        cf=field.codec.cf,
        stored_bytes=total,
        manifest_bytes=os.path.getsize(os.path.join(out, MANIFEST_NAME)),
        fixed_bytes=fixed,
        cr=round(x.size * 4 / total, 2),
        payload_cr=round(x.size * 4 / (total - fixed), 2),
    )
    shutil.rmtree(out)
    return result


def add_sperr(x: np.ndarray, dims: int, rows: list[dict]) -> None:
    """SPERR's CR at each row's PSNR, and the pack's over it (all bytes, payload only); NaN outside its sweep."""
    peer = peer_input(x, dims)
    points = sperr_curves(peer, False)["sperr"]
    for r in rows:
        sperr = cr_at(points, peer.size * 4, r["psnr"])
        r["sperr_cr"] = round(sperr, 2)
        r["vs_sperr"] = round(r["cr"] / sperr, 3)
        r["payload_vs_sperr"] = round(r["payload_cr"] / sperr, 3)


def run(quick: bool, targets: tuple[float, ...], which: str = "real", peers: bool = True) -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="dctdata-stage-choice-") as tmp:
        for name, (x, dims) in sets(quick, which).items():
            rows = [row(x, dims, t, tmp) for t in targets]
            if peers:
                add_sperr(x, dims, rows)
            sizes = [r["stored_bytes"] for r in rows]
            out[name] = dict(shape=list(x.shape), dims=dims, rows=rows, monotone=sizes == sorted(sizes))
    return out


def _f(v: float, digits: int) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def table(results: dict[str, dict]) -> str:
    sperr = any("sperr_cr" in r for res in results.values() for r in res["rows"])
    head = "| set | target dB | PSNR dB | stage | dtype | stored bytes | fixed bytes | CR |"
    rule = "|---|---:|---:|---|---|---:|---:|---:|"
    if sperr:
        head += " SPERR CR | vs SPERR | payload vs SPERR |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, res in results.items():
        for r in res["rows"]:
            line = (
                f"| {name} | {r['target']:g} | {r['psnr']:.2f} | {r['stage']} | {r['dtype']} | {r['stored_bytes']:,} "
                f"| {r['fixed_bytes']:,} | {r['cr']:.1f} |"
            )
            if sperr:
                line += f" {_f(r['sperr_cr'], 1)} | {_f(r['vs_sperr'], 2)} | {_f(r['payload_vs_sperr'], 2)} |"
            lines.append(line)
    lines.append("")
    for name, res in results.items():
        line = f"{name}: stored bytes {'rise' if res['monotone'] else 'do NOT rise'} with the target"
        if sperr:
            vs = [r["vs_sperr"] for r in res["rows"]]
            line += f"; vs SPERR geo-mean {_f(geomean(vs), 2)}, lowest {_f(min(vs), 2)}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks stage-choice", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 slices and two targets (a smoke run)")
    ap.add_argument("--targets", type=float, nargs="+", default=None, help=f"--target-psnr sweep (default {TARGETS})")
    ap.add_argument(
        "--sets", choices=SETS, default="real", help="nibabel's real images or the stand-ins (default real)"
    )
    ap.add_argument("--no-peers", action="store_true", help="leave SPERR out (no imagecodecs needed)")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    args = ap.parse_args(argv)
    targets = tuple(args.targets or (QUICK_TARGETS if args.quick else TARGETS))
    peers = not args.no_peers
    if peers and (why := PEERS["sperr"].missing()):
        print(why)
        peers = False
    results = run(args.quick, targets, args.sets, peers)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(targets=list(targets), sets=results, data=args.sets), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
