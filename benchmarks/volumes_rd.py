"""Volumes at equal PSNR: dctdata's 8x8x8 packing (`dims=3`) against SZ3, ZFP and SPERR in 3-D mode and against
today's 2-D packing of the same volumes (D channels of 8x8 blocks), on synthetic SciML volumes or real MRI volumes;
and the first layer's decode speed on volumes beside the 2-D layer's on the same output bytes.

    python -m benchmarks volumes-rd                       # the docs table (docs/guides/volumes.md)
    python -m benchmarks volumes-rd --set real            # nibabel's real MRI volumes (docs/benchmarks/compression.md)
    python -m benchmarks volumes-rd --quick               # a smoke run: small volumes, three targets
    python -m benchmarks volumes-rd --json OUT.json --size 64 --samples 4
    python -m benchmarks volumes-rd --device cuda --targets 40 --size 128 --samples 8   # the layers' GPU GB/s

Items, `--set synthetic` (the default; `dctdata.datasets.volumes`): a power-law Gaussian random field (a density
box), one component of a solenoidal von Karman velocity field, and an advected and diffused scalar. Each is N
float32 volumes. `--set real` (needs nibabel, the `bench` extra; `tests/shipped_images.real_volumes`): nibabel's
test images, packed in their own dtype: the fMRI run example4d.nii.gz as 2 int16 volumes of 24 x 96 x 128, the
anatomical volume anatomical.nii (1 x 25 x 41 x 33 int16) and the functional run functional.nii (20 x 3 x 21 x 17,
scaled int16 as float32).

- dctdata 3-D: `dctdata.pack(x, dims=3, target_psnr=T)` at each target, read back with `open_dataset` and the
  pack's own `decompressor()`; size = every stored file plus manifest.json (`benchmarks.ours`).
- dctdata 2-D: the same (N, D, H, W) array packed as today does (D channels a sample), same targets.
- ZFP fixed-accuracy (zfpy), SZ3 (imagecodecs, absolute bound) and SPERR (imagecodecs, PSNR mode): each volume
  compressed on its own in 3-D (`benchmarks.peers`, float32), swept over their knobs.

PSNR is the project's dataset PSNR with one item per (sample, channel) volume, against its own range; bytes at
35/40/45 dB are interpolated on each codec's Pareto front (`benchmarks.curves.bytes_at`), never extrapolated.
Ratios are dctdata 3-D's compression ratio over the other's; geometric means over the items.

Decode speed: `ds.decompressor()` of the packs nearest 40 dB on their whole batch of coefficients (CPU, one
thread), best of `--repeat` runs, as output GB/s (float32 bytes written per second): the 3-D layer, the 2-D
layer of the D-channel pack (its D x D channel rotation included), and the 2-D layer of the same voxels packed
as (N * D, 1, H, W) slices (no rotation): equal output bytes each.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import tempfile
import time

import numpy as np
import torch

import dctdata
from benchmarks.curves import Point, cr_at, geomean, pack_psnr
from benchmarks.ours import read_back, stored_size
from benchmarks.peers import sperr_curves, sz3_curves, zfp_curves
from dctdata.datasets.volumes import advected_scalar, power_law_field, velocity_component
from dctdata.errors import DctDataError

LEVELS = (35.0, 40.0, 45.0)
TARGETS = (31.0, 33.5, 36.0, 38.5, 41.0, 43.5, 46.0, 48.5)
QUICK_TARGETS = (34.0, 40.0, 46.0)
ITEMS = {
    "density (power-law GRF)": power_law_field,
    "velocity u_x (von Karman)": velocity_component,
    "advected scalar": advected_scalar,
}

SETS = ("synthetic", "real")


log = logging.getLogger(__name__)


def items(n: int, size: int, which: str = "synthetic") -> dict[str, np.ndarray]:
    """name -> (N, 1, D, H, W): float32 (synthetic), or the real volumes in their own dtype."""
    if which == "real":
        import shipped_images

        return {name: x[:, None] for name, x in shipped_images.real_volumes().items()}
    return {name: make(n=n, size=size)[:, None] for name, make in ITEMS.items()}


def dctdata_curve(x: np.ndarray, dims: int, targets, workdir: str, keep: float | None = None):
    """Points of dctdata packs of x (N, 1, D, H, W): dims=3 packs it as volumes, dims=2 as (N, D, H, W) samples of
    D channels. The pack at target `keep` is left in workdir (its path returned) for the speed run; the others
    are removed."""
    workdir = tempfile.mkdtemp(dir=workdir)
    source = os.path.join(workdir, f"source-{dims}.npy")
    np.save(source, np.ascontiguousarray(x[:, 0]))
    points, kept = [], None
    for target in targets:
        out = os.path.join(workdir, f"pack-{dims}d-{target:g}")
        setting = f"--target-psnr {target:g}" + (" --dims 3" if dims == 3 else "")
        t0 = time.perf_counter()
        try:
            manifest = dctdata.pack(source, out, target_psnr=target, dims=3 if dims == 3 else None, quiet=True)
        except DctDataError as exc:
            points.append(Point(setting, None, None, note=str(exc)))
            continue
        encode_s = time.perf_counter() - t0
        rec, read_s, decompress_s = read_back(out, manifest.field(kind="dct").name)
        size_bytes, psnr = stored_size(out, manifest), pack_psnr(x, rec.reshape(x.shape))
        points.append(Point(setting, size_bytes, psnr, encode_s, read_s + decompress_s))
        if keep is not None and target == keep:
            kept = out
        else:
            shutil.rmtree(out)
    os.remove(source)
    return points, kept


def decode_speed(path: str, repeat: int, device: str = "cpu") -> tuple[float, tuple[int, ...]]:
    """(output GB/s of the pack's decompressor on all its samples on `device`, output shape): best of `repeat`."""
    ds = dctdata.open_dataset(path)
    batch = ds[0 : len(ds)][0]
    layer = ds.decompressor().to(device)
    batch = [t.to(device) for t in batch] if isinstance(batch, (tuple, list)) else batch.to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    best = math.inf
    with torch.inference_mode():
        out = layer(batch)
        for _ in range(repeat):
            sync()
            t0 = time.perf_counter()
            layer(batch, out=out)
            sync()
            best = min(best, time.perf_counter() - t0)
    return out.numel() * 4 / best / 1e9, tuple(out.shape)


def run(n: int, size: int, targets, repeat: int, workdir: str, device: str = "cpu", which: str = "synthetic") -> dict:
    results = {}
    speed_target = min(targets, key=lambda t: abs(t - 40.0))
    for name, x in items(n, size, which).items():
        raw = x.size * 4
        curves = {}
        curves["dctdata 3-D"], vol_pack = dctdata_curve(x, 3, targets, workdir, keep=speed_target)
        curves["dctdata 2-D"], flat_pack = dctdata_curve(x, 2, targets, workdir, keep=speed_target)
        x = x.astype(np.float32)  # the peers code float32
        for peer in (zfp_curves, sz3_curves, sperr_curves):  # a peer whose library is missing is left out
            try:
                curves.update(peer(x, False))
            except ImportError as exc:
                log.warning("%s skipped: %s is not installed (pip install 'dctdata[bench]')", peer.__name__, exc.name)
        cr = {c: [cr_at(p, raw, v) for v in LEVELS] for c, p in curves.items()}
        slices = os.path.join(workdir, f"slices-{len(results)}")  # the 2-D layer without a channel rotation
        dctdata.pack(x.reshape(-1, 1, *x.shape[-2:]), slices, target_psnr=speed_target, quiet=True)
        speed = {}
        for label, path in (("dctdata 3-D", vol_pack), ("dctdata 2-D", flat_pack), ("2-D slices", slices)):
            if path is not None:
                gbs, shape = decode_speed(path, repeat, device)
                speed[label] = {"gb_per_s": gbs, "output_shape": list(shape)}
        results[name] = {
            "shape": list(x.shape),
            "raw_bytes": raw,
            "cr": cr,
            "speed": speed,
            "points": {c: [p.__dict__ for p in pts] for c, pts in curves.items()},
        }
    return results


def report(results: dict, targets, device: str = "cpu") -> str:
    lines = [f"compression ratio (float32 bytes / stored bytes) at {' / '.join(f'{v:g}' for v in LEVELS)} dB"]
    codecs = list(next(iter(results.values()))["cr"])
    lines.append("| item | " + " | ".join(codecs) + " |")
    lines.append("|---" * (len(codecs) + 1) + "|")
    for name, r in results.items():
        cells = [" / ".join("-" if not math.isfinite(v) else f"{v:.1f}" for v in r["cr"][c]) for c in codecs]
        lines.append(f"| {name} {tuple(r['shape'])} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("dctdata 3-D's ratio over each (geometric mean over items, per level; '-' where a sweep misses it)")
    lines.append("| vs | " + " | ".join(f"{v:g} dB" for v in LEVELS) + " | all levels |")
    lines.append("|---" * (len(LEVELS) + 2) + "|")
    for other in codecs[1:]:
        per, everything = [], []
        for i in range(len(LEVELS)):
            vals = [r["cr"]["dctdata 3-D"][i] / r["cr"][other][i] for r in results.values()]
            vals = [v for v in vals if math.isfinite(v)]
            everything += vals
            per.append(f"{geomean(vals):.2f}" if vals else "-")
        lines.append(f"| {other} | " + " | ".join(per) + f" | {geomean(everything):.2f} |")
    lines.append("")
    lines.append(f"Decompress on {device} (the packs nearest 40 dB, whole batch, output float32 GB/s, best of runs)")
    lines.append("| item | 3-D layer | 2-D layer, D channels | 2-D layer, slices | 3-D / 2-D slices |")
    lines.append("|---|---|---|---|---|")
    for name, r in results.items():
        gbs = {k: v["gb_per_s"] for k, v in r["speed"].items()}
        if len(gbs) == 3:
            s3, s2, sl = gbs["dctdata 3-D"], gbs["dctdata 2-D"], gbs["2-D slices"]
            lines.append(f"| {name} | {s3:.2f} | {s2:.2f} | {sl:.2f} | {s3 / sl:.2f} |")
    lines.append(f"\ntargets swept by dctdata: {', '.join(f'{t:g}' for t in targets)} dB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks volumes-rd", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4, help="volumes per item (default 4)")
    p.add_argument("--size", type=int, default=48, help="edge of each cubic volume (default 48)")
    p.add_argument("--repeat", type=int, default=5, help="decode timing runs (best counts; default 5)")
    p.add_argument("--quick", action="store_true", help="16^3 volumes, 2 per item, three targets")
    p.add_argument("--json", default=None, metavar="OUT", help="also write every point as JSON")
    p.add_argument("--targets", default=None, metavar="DB,DB,...", help="dctdata's targets (default: the sweep)")
    p.add_argument("--device", default="cpu", help="where the decode speed is measured (cpu, cuda)")
    p.add_argument("--set", choices=SETS, default="synthetic", help="synthetic volumes or nibabel's real MRI volumes")
    args = p.parse_args(argv)
    for name, v in (("--samples", args.samples), ("--size", args.size), ("--repeat", args.repeat)):
        if v < 1:
            raise DctDataError(f"{name}: expected a positive int. Got {v}")
    n, size = (2, 16) if args.quick else (args.samples, args.size)
    targets = QUICK_TARGETS if args.quick else TARGETS
    if args.targets is not None:
        try:
            targets = tuple(float(t) for t in args.targets.split(","))
        except ValueError:
            raise DctDataError(f"--targets: expected dB values separated by commas. Got {args.targets!r}") from None
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dctdata-volumes-rd-") as tmp:
        results = run(n, size, targets, args.repeat, tmp, args.device, args.set)
    print(report(results, targets, args.device))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"set": args.set, "samples": n, "size": size, "targets": list(targets), "items": results}, f, indent=1
            )
