"""What the edge blocks and the table bytes cost: `python -m benchmarks edge-blocks` (issue 46, causes 2 and 3).

    python -m benchmarks edge-blocks                      # the docs table (docs/benchmarks/compression.md)
    python -m benchmarks edge-blocks --targets 40 --items mri

One run, three arms of the same `dctdata.pack(..., target_psnr=T, workers=1)` on each set:
- "before": partial blocks padded half-sample symmetric (format versions 2-6), the per-frequency
  reconstruction offsets always kept, candidates compared by their payload alone;
- "extend": only the padding changed to "extend" (a partial block filled from its own pixels, version 7);
- "now": what dctdata does today: "extend", and calibration weighing every table by its bytes
  (`dctdata.encoder.tables`: a reconstruction row that costs more than it saves becomes one value; int8/int16
  and cf candidates compared with their step and recon tables).

The earlier arms are obtained by switching those two choices off inside `dctdata.encoder.calibrate` for the
arm's pack (an ablation of this checkout, not an older install). Sets: the 25 x 41 x 33 int16 MRI volume
(`tests/shipped_images.py`, `dims=3`; r = 1 along every axis), and tiles of the rd bench's items (60 x 76: r =
4 along both axes, where "extend" equals the mirror; for mri also 58 x 75, r = 2 and 3). Per row: every stored
byte (files + manifest.json), the fixed bytes (all but the coefficient chunks), the PSNR reached, and the
ratios to "before".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
from shipped_images import mri_volume

import dctdata
import dctdata.encoder.calibrate as cal
from benchmarks.curves import pack_psnr
from benchmarks.items import load_items, tile_grid
from benchmarks.ours import read_back, stored_size
from dctdata.codec.spec import CodecSpec

TARGETS = (35.0, 40.0, 45.0)
ITEMS = ("mri", "gravel", "camera", "em")
ARMS = ("before", "extend", "now")


def sets(items: list[str]) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (source array, dims)."""
    out = {"MRI volume 25x41x33 (dims 3)": (mri_volume()[None], 3)}
    loaded, _ = load_items(items)
    for it in loaded:
        t = tile_grid(it.x, max_tiles=16)
        out[f"{it.name} {t.shape[0]} tiles 60x76"] = (t, 2)
        if it.name == "mri":
            out[f"{it.name} {t.shape[0]} tiles 58x75"] = (np.ascontiguousarray(t[..., :58, :75]), 2)
    return out


def pack_arm(x: np.ndarray, dims: int, tmp: str, arm: str, target: float) -> dict:
    """One pack of `x` under `arm`'s choices: its stored and fixed bytes, PSNR and coefficient dtype."""
    saved = cal.DEFAULT_PAD, cal.CodecSpec, cal.choose_recon, cal._pack_bytes
    pad = "symmetric" if arm == "before" else "extend"
    try:
        cal.DEFAULT_PAD = pad
        cal.CodecSpec = lambda **k: CodecSpec(**{"pad": pad, **k})  # type: ignore[misc]
        if arm != "now":
            cal.choose_recon = lambda v, q, delta, *a: delta
            cal._pack_bytes = lambda setting, s, size: size
        src, out = os.path.join(tmp, "s.npy"), os.path.join(tmp, "p")
        np.save(src, x)
        m = dctdata.pack(src, out, dims=dims, quiet=True, workers=1, target_psnr=target)
    finally:
        cal.DEFAULT_PAD, cal.CodecSpec, cal.choose_recon, cal._pack_bytes = saved
    f = m.field(kind="dct")
    rec, _, _ = read_back(out, f.name)
    ref = x.astype(np.float32)[:, None] if (x.ndim == 3 or dims == 3) else x.astype(np.float32)
    total = stored_size(out, m)
    payload = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns if n.startswith("c."))
    shutil.rmtree(out)
    return {"bytes": total, "fixed": total - payload, "psnr": pack_psnr(ref, rec.reshape(ref.shape))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks edge-blocks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help="--target-psnr sweep")
    ap.add_argument("--items", nargs="+", default=list(ITEMS), help="rd items cut into tiles")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this JSON file")
    args = ap.parse_args(argv)
    rows = []
    print("| set | target dB | before bytes (fixed) | extend / before | now bytes (fixed) | now / before |", end="")
    print(" dB before / now |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (x, dims) in sets(args.items).items():
            for t in args.targets:
                r = {arm: pack_arm(x, dims, tmp, arm, t) for arm in ARMS}
                b, e, n = r["before"], r["extend"], r["now"]
                rows.append({"set": name, "target": t, **{arm: r[arm] for arm in ARMS}})
                print(
                    f"| {name} | {t:g} | {b['bytes']:,} ({b['fixed']:,}) | {e['bytes'] / b['bytes']:.3f} | "
                    f"{n['bytes']:,} ({n['fixed']:,}) | {n['bytes'] / b['bytes']:.3f} | "
                    f"{b['psnr']:.2f} / {n['psnr']:.2f} |",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
