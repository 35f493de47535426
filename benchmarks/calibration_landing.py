"""Where `--target-psnr` lands each channel, whether the per-sample floor holds, and what the pack stores
(issue 31), on real arrays and images that ship inside installed packages and one synthetic volume.

    python benchmarks/calibration_landing.py [--sets dem,rgb,volume,mri] [--targets 38.5,39.5,40.5,41.5]
        [--json PATH] [--threads 1]

Each set is packed for real (`dctdata.pack(array, out, target_psnr=T)`, zarr, the default lossless
stage) and every figure is read from the manifest the pack wrote: per channel, the dataset-level PSNR
(each item against its own range) and the lowest item PSNR, the per-sample floor the codec records
(`min_psnr`), and the stored bytes of the whole pack. Every set is small enough that the calibration
subset is the whole set, so the manifest's figures are the calibration subset's. Run it with another
interpreter (e.g. an older checkout's venv) to get that version's rows: it only uses the public API.

Sets (N samples x C channels of 64 x 64):
- dem: matplotlib's Jacksboro fault elevation model (int16 metres, 344 x 403) cut into tiles at a
  stride of 16 (396 tiles, C = 1), packed as int16 with `fields={"image": "dct"}`;
- rgb: scikit-image's astronaut, coffee and chelsea photos cut into tiles (C = 3, uint8);
- volume: synthetic 3-D power-law fields (24 volumes, 8 depth slices as channels, float32);
- mri: matplotlib's MRI slice (uint16) cut into tiles with 8 channels taken 1 pixel apart in depth-like
  order (a stand-in for adjacent slices: the package ships one slice), float32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

TILE = 64


def dem_tiles(stride: int = 16) -> np.ndarray:
    from shipped_images import elevation_model

    z = elevation_model()
    h, w = z.shape
    return np.stack(
        [z[i : i + TILE, j : j + TILE] for i in range(0, h - TILE + 1, stride) for j in range(0, w - TILE + 1, stride)]
    )


def rgb_tiles(stride: int = TILE) -> np.ndarray:
    from shipped_images import sample_images

    out = []
    for img in sample_images(("astronaut", "coffee", "chelsea"), include_sklearn=False).values():
        x = img.transpose(2, 0, 1)
        _, h, w = x.shape
        out += [
            x[:, i : i + TILE, j : j + TILE]
            for i in range(0, h - TILE + 1, stride)
            for j in range(0, w - TILE + 1, stride)
        ]
    return np.stack(out)


def volume_tiles(n: int = 24, depth: int = 8, beta: float = 3.6, seed: int = 0) -> np.ndarray:
    """3-D power-law noise (spectrum k^-beta), `depth` slices of a 4x deeper volume, scaled to counts
    around 1000 with Gaussian read noise of 2 counts: smooth fields whose slices are correlated."""
    rng = np.random.default_rng(seed)
    d = depth * 4
    kz = np.fft.fftfreq(d)[:, None, None]
    ky = np.fft.fftfreq(TILE)[None, :, None]
    kx = np.fft.rfftfreq(TILE)[None, None, :]
    k = np.sqrt(kz**2 + ky**2 + kx**2)
    k[0, 0, 0] = 1.0
    amp = k ** (-beta / 2)
    amp[0, 0, 0] = 0.0
    out = []
    for _ in range(n):
        spec = amp * (rng.standard_normal(amp.shape) + 1j * rng.standard_normal(amp.shape))
        v = np.fft.irfftn(spec, s=(d, TILE, TILE), axes=(0, 1, 2))[:depth]
        out.append(1000 + 300 * v / v.std() + rng.normal(0, 2, v.shape))
    return np.stack(out).astype(np.float32)


def mri_stack(depth: int = 8, stride: int = 32) -> np.ndarray:
    from shipped_images import mri_slice

    z = mri_slice().astype(np.float32)
    h, w = z.shape
    return np.stack(
        [
            np.stack([z[i + k : i + k + TILE, j : j + TILE] for k in range(depth)])
            for i in range(0, h - TILE - depth + 1, stride)
            for j in range(0, w - TILE + 1, stride)
        ]
    )


SETS = {
    "dem": (dem_tiles, {"fields": {"image": "dct"}}),
    "rgb": (rgb_tiles, {"fields": {"image": "dct"}}),
    "volume": (volume_tiles, {}),
    "mri": (mri_stack, {}),
}


def measure(name: str, x: np.ndarray, target: float, options: dict, root: str) -> dict:
    import dctdata
    from dctdata.format.fields import user_fields

    out = os.path.join(root, f"{name}-{target}")
    t0 = time.perf_counter()
    m = dctdata.pack(x, out, target_psnr=target, quiet=True, overwrite=True, **options)
    seconds = time.perf_counter() - t0
    (f,) = [g for g in user_fields(m.fields)]
    s = m.stats[f.name]
    channels = s.channels or ()
    row = {
        "set": name,
        "samples": int(x.shape[0]),
        "channels": len(channels),
        "target": target,
        "kind": str(f.kind),
        "stored_bytes": m.stored_bytes,
        "seconds": round(seconds, 2),
        "psnr_dataset": [c.psnr_dataset for c in channels],
        "psnr_min": [c.psnr_min for c in channels],
    }
    if f.is_dct:
        c = f.codec
        row.update(
            codec=f"cf={c.cf} {c.mask} {c.dtype}" + (" rot" if c.rotation is not None else ""),
            lossless=(f.lossless or {}).get("id", "raw"),
            min_psnr=c.min_psnr,
        )
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| set | target dB | kind / codec | channel PSNR - target, dB (min..max) | lowest item dB | floor dB | "
        "stored bytes |",
        "|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        excess = [p - r["target"] for p in r["psnr_dataset"] if p is not None]
        span = f"{min(excess):+.2f}..{max(excess):+.2f}" if excess else "-"
        low = min((p for p in r["psnr_min"] if p is not None), default=None)
        floor = r.get("min_psnr")
        codec = r.get("codec", "")
        lines.append(
            f"| {r['set']} | {r['target']:g} | {r['kind']} {codec} {r.get('lossless', '')} | {span} | "
            f"{'-' if low is None else f'{low:.2f}'} | {'-' if floor is None else f'{floor:.2f}'} | "
            f"{r['stored_bytes']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks calibration-landing", description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {list(SETS)}")
    p.add_argument("--targets", default="38.5,39.5,40.5,41.5", help="target PSNRs in dB, comma-separated")
    p.add_argument("--samples", type=int, default=None, help="keep only the first N samples of each set (tests)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: this is a shared machine)")
    args = p.parse_args(argv)
    import torch

    import dctdata

    torch.set_num_threads(args.threads)
    names = [s for s in args.sets.split(",") if s]
    unknown = sorted(set(names) - set(SETS))
    if unknown:
        p.error(f"--sets: expected names from {list(SETS)}. Got {unknown}")
    targets = [float(t) for t in args.targets.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            make, options = SETS[name]
            x = make()[: args.samples]
            for t in targets:
                rows.append(measure(name, x, t, options, root))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\ndctdata {dctdata.__version__} ({os.path.dirname(dctdata.__file__)}), python {sys.version.split()[0]}")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    return rows


if __name__ == "__main__":
    main()
