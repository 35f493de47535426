"""A single small volume's fixed bytes by part, and its compression ratio against SPERR-3D (issue 46).

    python -m benchmarks fixed-bytes                      # the 25 x 41 x 33 int16 MRI stand-in at 40 dB
    python -m benchmarks fixed-bytes --targets 35 40 45 --json OUT.json
    python -m benchmarks fixed-bytes --targets 35 40 45 --items mri camera gravel em   # 2-D sets: bytes only
    python -m benchmarks fixed-bytes --nibabel            # nibabel's anatomical.nii itself (the bench extra)

The set is `tests/shipped_images.mri_volume` (a synthetic stand-in of nibabel's anatomical.nii: 25 x 41 x 33
int16, odd along every axis), packed alone with `dctdata.pack(..., dims=3, target_psnr=T, workers=1)`. Per
target, the stored bytes by part, read from the pack as written (so the script measures any checkout, an older
one included: run it with PYTHONPATH at another tree to compare):

- coefficients: the chunk files (`c.*`);
- zarr.json: the group's and every array's;
- manifest parts: the entropy model's `params` entries, `checksums`, `seal`, the codec tables (`steps`,
  `offsets`, `recon`), and the rest of manifest.json;
- fixed: everything but the coefficients (manifest.json and every zarr.json, as `benchmarks.ours.metadata_size`).

SPERR-3D (imagecodecs, PSNR mode, one thread) codes the same volume at a sweep of targets around the PSNR
dctdata reached; its bytes at that PSNR are interpolated on its Pareto front (`benchmarks.curves.bytes_at`), and
the ratio is SPERR's bytes over dctdata's (> 1: dctdata stores less). PSNR is the project's (`pack_psnr`: one
item, against the volume's range) for both.

`--nibabel`: the real volume instead of its stand-in: nibabel's test file anatomical.nii (33 x 41 x 25 big-endian
int16), its axes reversed to 25 x 41 x 33 as the stand-in has them.

`--items`: 2-D sets instead, each rd item whole (one sample) and as up to 16 tiles of 60 x 76 (`benchmarks.items`),
packed at each target: every stored byte, the fixed bytes and the PSNR reached (no peer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import numpy as np

TARGETS = (40.0,)
TABLES = ("steps", "offsets", "recon")


def _json_len(v: object) -> int:
    return len(json.dumps(v, separators=(",", ":")))


def parts(path: str) -> dict[str, int]:
    """Bytes of a pack by part (see the module docstring), from its files as written."""
    files = {
        os.path.relpath(os.path.join(r, n), path): os.path.getsize(os.path.join(r, n))
        for r, _, ns in os.walk(path)
        for n in ns
    }
    with open(os.path.join(path, "manifest.json")) as fh:
        text = fh.read()
    d = json.loads(text)
    params = sum(_json_len(f["lossless"]["params"]) + 9 for f in d["fields"] if "params" in (f.get("lossless") or {}))
    tables = sum(
        _json_len(f["codec"][t]) + len(t) + 3 for f in d["fields"] if f.get("codec") for t in TABLES if t in f["codec"]
    )
    out = {
        "coefficients": sum(n for k, n in files.items() if os.path.basename(k).startswith("c.")),
        "zarr.json": sum(n for k, n in files.items() if os.path.basename(k) == "zarr.json"),
        "model params": params,
        "checksums": _json_len(d["checksums"]) + 12,
        "seal": _json_len(d["seal"]) + 7 if "seal" in d else 0,
        "tables": tables,
        "manifest.json": files["manifest.json"],
    }
    named = ("model params", "checksums", "seal", "tables")
    out["manifest rest"] = out["manifest.json"] - sum(out[k] for k in named)
    out["fixed"] = out["manifest.json"] + out["zarr.json"]
    out["total"] = sum(files.values())
    return out


def sperr_points(x: np.ndarray, around: float) -> list:
    """SPERR-3D (PSNR mode) on the volume at targets from 4 dB below to 4 dB above `around`."""
    import imagecodecs

    from benchmarks.curves import Point, pack_psnr

    points = []
    v = x.astype(np.float64)
    for t in np.arange(around - 4.0, around + 4.01, 0.5):
        blob = imagecodecs.sperr_encode(v, float(t), "psnr", numthreads=1)
        rec = imagecodecs.sperr_decode(blob, numthreads=1)
        p = pack_psnr(x[None, None].astype(np.float32), np.asarray(rec, np.float32).reshape(1, 1, *x.shape))
        points.append(Point(f"psnr {t:g}", len(blob), p))
    return points


def anatomical() -> np.ndarray:
    """nibabel's anatomical.nii as (25, 41, 33) native int16."""
    import nibabel

    path = os.path.join(os.path.dirname(nibabel.__file__), "tests", "data", "anatomical.nii")
    x = np.asarray(nibabel.load(path).dataobj)
    return np.ascontiguousarray(np.transpose(x, (2, 1, 0)).astype(np.int16))


def run(targets: list[float], real: bool = False) -> list[dict]:
    from shipped_images import mri_volume

    import dctdata
    from benchmarks.curves import bytes_at, pack_psnr
    from benchmarks.ours import read_back

    x = anatomical() if real else mri_volume()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dctdata-fixed-bytes-") as tmp:
        src = os.path.join(tmp, "mri.npy")
        np.save(src, x[None])
        for t in targets:
            out = os.path.join(tmp, f"p{t:g}")
            m = dctdata.pack(src, out, dims=3, target_psnr=t, quiet=True, workers=1)
            rec, _, _ = read_back(out, m.field(kind="dct").name)
            psnr = pack_psnr(x[None, None].astype(np.float32), rec.reshape(1, 1, *x.shape))
            row = {"target": t, "psnr": psnr, "version": m.version, **parts(out)}
            sperr = bytes_at(sperr_points(x, psnr), psnr)
            row["sperr bytes"] = sperr
            row["cr"] = x.nbytes / row["total"]
            row["vs sperr"] = sperr / row["total"]
            rows.append(row)
            shutil.rmtree(out)
    return rows


def run_items(names: list[str], targets: list[float]) -> list[dict]:
    """The 2-D sets of `--items` (see the module docstring)."""
    import dctdata
    from benchmarks.curves import pack_psnr
    from benchmarks.items import load_items, tile_grid
    from benchmarks.ours import read_back

    items, _ = load_items(names)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dctdata-fixed-bytes-") as tmp:
        for it in items:
            whole = it.x[None, None] if it.x.ndim == 2 else it.x[None]
            for name, x in ((f"{it.name} tiles", tile_grid(it.x, max_tiles=16)), (f"{it.name} whole", whole)):
                src, out = os.path.join(tmp, "s.npy"), os.path.join(tmp, "p")
                np.save(src, np.ascontiguousarray(x, dtype=np.float32))
                for t in targets:
                    m = dctdata.pack(src, out, target_psnr=t, quiet=True, workers=1)
                    rec, _, _ = read_back(out, m.field(kind="dct").name)
                    p = parts(out)
                    psnr = pack_psnr(x.astype(np.float32).reshape(rec.shape), rec)
                    rows.append({"set": name, "target": t, "psnr": psnr, "version": m.version, **p})
                    cells = f"{m.version} | {p['total']:,} | {p['fixed']:,}"
                    print(f"| {name} | {t:g} ({psnr:.2f}) | {cells} |", flush=True)
                    shutil.rmtree(out)
    return rows


COLUMNS = ("coefficients", "zarr.json", "model params", "checksums", "seal", "tables", "manifest rest", "fixed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fixed-bytes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help="--target-psnr values")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    ap.add_argument("--items", nargs="+", help="2-D rd items (whole and as tiles) instead of the volume")
    ap.add_argument("--nibabel", action="store_true", help="nibabel's anatomical.nii instead of its stand-in")
    args = ap.parse_args(argv)
    if args.items:
        print("| set | target dB (reached) | format | total | fixed |\n|---|---|---:|---:|---:|")
        rows = run_items(args.items, args.targets)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)
        return 0
    rows = run(args.targets, args.nibabel)
    print("| target dB (reached) | format | " + " | ".join(COLUMNS) + " | total | CR | SPERR-3D bytes | SPERR / ours |")
    print("|---|---:|" + "---:|" * (len(COLUMNS) + 4))
    for r in rows:
        cells = " | ".join(f"{r[c]:,}" for c in COLUMNS)
        print(
            f"| {r['target']:g} ({r['psnr']:.2f}) | {r['version']} | {cells} | {r['total']:,} | {r['cr']:.2f} | "
            f"{r['sperr bytes']:,.0f} | {r['vs sperr']:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
