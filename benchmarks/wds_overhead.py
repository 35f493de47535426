"""Bytes per sample of small samples as webdataset shards against zarr (issue 31 item 5): matplotlib's
Jacksboro fault elevation model cut into 64 x 64 int16 tiles at a stride of 16 (396 tiles), packed at
`--target-psnr 40` with the image coded as dct.

    python -m benchmarks wds-overhead [--target 40] [--json PATH]

Rows: zarr; webdataset with one sample per member (`samples_per_member=1`, a dct field's side values
their own member); webdataset as packed by default (about 256 KiB of source per member). Each row gives
the stored bytes of the pack (manifest and shards), bytes per sample, the ratio over the float32 tiles,
and the share of the shards that tar headers and padding take. Run it with an older checkout's
interpreter (`PYTHONPATH=/old/checkout /old/venv/bin/python benchmarks/wds_overhead.py`) for that
version's rows: rows its writer does not know (samples_per_member) are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

TILE, STRIDE = 64, 16


def dem_tiles() -> np.ndarray:
    from shipped_images import elevation_model

    z = elevation_model()
    h, w = z.shape
    return np.stack(
        [z[i : i + TILE, j : j + TILE] for i in range(0, h - TILE + 1, STRIDE) for j in range(0, w - TILE + 1, STRIDE)]
    )


def stored_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def payload_bytes(root: str) -> int:
    """Bytes of member data in the pack's shards (what the tar headers and padding come on top of)."""
    import tarfile

    total = 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(root, name)) as tf:
                total += sum(m.size for m in tf)
    return total


def measure(x: np.ndarray, target: float, fmt: str, options: dict | None, root: str) -> dict | None:
    import dctdata
    from dctdata.errors import DctDataError

    out = os.path.join(root, f"{fmt}-{(options or {}).get('samples_per_member', 'default')}")
    kw = {"writer_options": options} if options else {}
    try:
        m = dctdata.pack(x, out, target_psnr=target, fields={"image": "dct"}, format=fmt, quiet=True, **kw)
    except (DctDataError, TypeError) as exc:  # an older writer without the option
        print(f"skipped {fmt} {options}: {exc}", file=sys.stderr)
        return None
    total = stored_bytes(out)
    shards = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".tar"))
    row = {
        "format": fmt,
        "samples_per_member": (m.layout or {}).get("samples_per_member") if fmt == "webdataset" else None,
        "samples": int(x.shape[0]),
        "bytes": total,
        "bytes_per_sample": round(total / x.shape[0], 1),
        "ratio_over_float32": round(x.shape[0] * TILE * TILE * 4 / total, 2),
        "psnr_dataset": round(float(m.stats["image"].psnr_dataset), 2),
    }
    if fmt == "webdataset":
        row["tar_overhead"] = round(1 - payload_bytes(out) / shards, 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks wds-overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=float, default=40.0, help="--target-psnr of every pack (default 40)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    x = dem_tiles()[:, None]
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for fmt, options in (("zarr", None), ("webdataset", {"samples_per_member": 1}), ("webdataset", None)):
            row = measure(x, args.target, fmt, options, root)
            if row is not None:
                rows.append(row)
    print(f"{'format':<11} {'K':>4} {'bytes':>9} {'B/sample':>9} {'x f32':>6} {'tar ovh':>8} {'PSNR':>6}")
    for r in rows:
        k = "" if r["samples_per_member"] is None else str(r["samples_per_member"])
        ovh = f"{100 * r['tar_overhead']:.0f}%" if "tar_overhead" in r else ""
        print(
            f"{r['format']:<11} {k:>4} {r['bytes']:>9} {r['bytes_per_sample']:>9} {r['ratio_over_float32']:>6} "
            f"{ovh:>8} {r['psnr_dataset']:>6}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
