"""Issue 12, "each of fixes 1-6: bytes before and after at equal PSNR", measured on the product code.

    python -m benchmarks codec-ablation [--items mri,astronaut] [--modes tiles,whole] [--max-tiles 48]
        [--levels 35,40,45] [--before-python PATH] [--json PATH] [--threads 1]

Packs: the rate-distortion bench's (`benchmarks.items`: package-shipped images and SciML stand-ins,
as tiles of 60x76 and whole). Per pack, the final codec F is calibrated once with
`calibrate_report(x, quant=None, target_psnr=40, codec=zstd-19)`: zstd-19 as the lossless stage, so the
rows isolate issue 12 from the entropy stage (row 7 adds that). Each row switches ONE fix off in F
(leave-one-out) and compares the two codecs at equal PSNR:

- A codec is swept by a global step multiplier m: steps = max(m * base step, floors), where floors are
  calibrate's int8/int16 no-overflow rule recomputed on that codec's own coefficients; the dead zone's
  reconstruction offsets are refitted at each m (`calibrate.fit_recon`, as calibration fits them at its
  step) and the per-sample floor moves with the step (min_psnr - 20 log10 m), so each point is what the
  product would pack had its target been that PSNR. Points are real `encode` + `Decompress` runs.
- Bytes of a point = the coefficients of every sample through the lossless stage, one blob per sample
  as the webdataset writer stores them (tar headers and the .npy header are not counted: the same in
  every variant) + 8 B per channel per sample of side information (range, mid as float32) when the
  codec has it + the manifest of a one-shard webdataset pack built with the real `Manifest`,
  `FieldSpec` and `CodecSpec.to_dict` (compact JSON, `Manifest.to_json`).
- PSNR is the project's dataset PSNR (`dctdata.encoder.calibrate.dataset_psnr`, every item against its own
  range); bytes at exactly each level come from `benchmarks.curves.bytes_at` (log-linear between
  the Pareto points that bracket it, never extrapolated). Each row's cell is the geometric mean over
  packs of bytes after / bytes before, minus 1 (negative: the fix stores less), with the count of packs
  where both codecs bracket the level.

Rows (before -> after):
1 metadata: a v1-style manifest (EMULATED: v1's writer is gone. `json.dumps(indent=2)` as v1 wrote it,
  the codec entry with every CodecSpec field, the full (C, K) steps table and the rotation at float64
  repr of their float32 values, 16-17 digits, as v1 wrote its float64 steps; recon offsets at 0.01)
  -> the compact v2 manifest. Same coefficients.
2 zstd-9 -> zstd-19, same coefficients.
3a edge padding -> symmetric padding. 3b plain rounding without recon offsets -> dead zone (theta 0.4)
  with recon offsets.
4 no rotation: calibrate_report(..., rotation=False) -> F, whose calibration keeps the KLT only where it
  stores less; 4f: the same against calibrate_report(..., rotation=True) (the KLT always). C > 1 only.
6 the whole field in int16 at the same uniform step (what v1 did when any coefficient overflowed int8)
  -> F's int8 with per-frequency floors; only packs where F is int8 and a floor binds (plain int8 at
  the base step would clip). Packs where calibration chose int16 are counted in the note.
8 no side information (absolute steps: base step x the rate-optimal channel scale
  1/sqrt(mean 1/range^2), a DC offset at the middle of the DC range, floors from the data, no
  per-sample floor since that needs side information; the envelope of int8 and int16) -> F. Packs where
  F has no channel rotation only: a rotation is defined in range-normalized units and would mix
  channels of different scales without side information.
7 (extra) zstd-19 -> the lossless stage `pack(codec="auto")` chooses (`calibrate.choose_stage`: the
  context-modelled entropy coder fitted at each point, or zstd-19 when that is smaller), model included
  in the manifest bytes. F itself was calibrated for zstd-19, so this is the stage alone.
5 landing (with --before-python): the old package's `calibrate_report(x, quant=None, target_psnr=40)`
  run in a subprocess of that interpreter (arrays passed as .npy, never pickle) and decoded by it: its
  dataset PSNR on the calibration set (here the whole pack) against F's, and what the margin costs:
  bytes of F's curve at the old landing / at F's landing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from benchmarks.curves import Point, bytes_at, geomean
from benchmarks.items import MAX_TILES, MODES, load_items, packs_of
from dctdata.codec.metrics import channel_nmse, item_nmse
from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress
from dctdata.encoder.calibrate import (
    INT_LIMITS,
    calibrate_report,
    choose_stage,
    dataset_psnr,
    fit_recon,
    worst_case_amax,
)
from dctdata.encoder.quantize import coded_coefficients, encode, item_side
from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, FieldStats, Manifest
from dctdata.format.fields import has_side, side_field
from dctdata.stages import AUTO, DEFAULT_CODEC, ZSTD_MAX, get_stage

TARGET = 40.0
LEVELS = (35.0, 40.0, 45.0)
SPACING_DB = 2.5  # sweep points every ~2.5 dB: log(bytes) is close to linear in PSNR over that span
ZSTD9, ZSTD19 = dict(DEFAULT_CODEC), dict(ZSTD_MAX)
ROWS = {  # key -> (fix, before -> after)
    "1": ("1 metadata", "v1-style indented manifest, float64 tables -> compact v2"),
    "2": ("2 zstd level", "zstd-9 -> zstd-19"),
    "3a": ("3a padding", "edge -> symmetric"),
    "3b": ("3b quantizer", "plain rounding -> dead zone 0.4 + recon offsets"),
    "4": ("4 rotation (C > 1)", "none -> as calibrated (KLT where it stores less)"),
    "4f": ("4 rotation forced (C > 1)", "none -> KLT always"),
    "6": ("6 int16 fallback", "whole field int16, uniform step -> int8 with floors"),
    "8": ("8 side information", "absolute steps, no side -> per-sample (range, mid)"),
    "7": ("7 entropy stage (extra)", "zstd-19 -> auto (context-modelled rANS or zstd-19)"),
}
OLD_CALIBRATION = r"""
import json, sys, time
import numpy as np, torch
import dctdata
from dctdata.encoder.calibrate import calibrate_report
torch.set_num_threads(int(sys.argv[4]))
x = torch.from_numpy(np.load(sys.argv[1], allow_pickle=False))
t0 = time.perf_counter()
report = calibrate_report(x, quant=None, target_psnr=float(sys.argv[3]))
seconds = time.perf_counter() - t0
wire, overflow = dctdata.encode(x, report.spec)
with torch.inference_mode():
    x_hat = dctdata.Decompress(report.spec)(wire)
np.save(sys.argv[2], x_hat.numpy().astype(np.float32))
s = report.spec
print(json.dumps({"seconds": seconds, "setting": f"cf={s.cf} {s.mask} {s.dtype}", "overflow": int(overflow),
                  "dctdata": dctdata.__file__}))
"""


# Codecs and their sweeps ---------------------------------------------------------------------------
@dataclasses.dataclass
class Variant:
    """One codec of a row at its calibrated step (m = 1), with what its sweep needs."""

    name: str
    spec: CodecSpec
    coef: torch.Tensor  # coded coefficients minus offsets (N, C, Hb, K, Wb): the quantizer's input x step
    base: torch.Tensor  # (C, 1) unfloored step per channel
    floors: torch.Tensor  # (C, K) the no-overflow floors of calibrate's rule on these coefficients


def variant(name: str, x: torch.Tensor, spec: CodecSpec, base: torch.Tensor | None = None) -> Variant:
    """A Variant of `spec`; base defaults to the spec's smallest step per channel (the unfloored one)."""
    coef, _ = coded_coefficients(x, spec)
    if spec.offsets is not None:
        coef = coef - torch.tensor(spec.offsets, dtype=torch.float32).reshape(spec.channels, 1, spec.kept, 1)
    amax = coef.abs().amax(dim=(0, 2, 4)).double() * 1.1
    if spec.side is not None:  # a normalized item has a hard bound (calibrate.worst_case_amax)
        rot = None if spec.rotation is None else torch.tensor(spec.rotation, dtype=torch.float64)
        amax = torch.minimum(amax, worst_case_amax(spec.cf, spec.mask, rot, spec.channels))
    floors = (amax / (INT_LIMITS[spec.dtype] - 0.5)).clamp(min=1e-12)
    if base is None:
        base = torch.tensor(spec.steps, dtype=torch.float64).amin(1)
    return Variant(name, spec, coef, base.reshape(-1, 1).double(), floors)


def spec_at(v: Variant, m: float) -> CodecSpec:
    """The variant with every step scaled by m (floors kept), recon refitted, the floor moved along."""
    steps = torch.maximum(m * v.base, v.floors)
    kw: dict[str, Any] = {"steps": steps.tolist()}
    if v.spec.min_psnr is not None:
        kw["min_psnr"] = min(199.0, max(1.0, v.spec.min_psnr - 20.0 * math.log10(m)))
    if v.spec.recon is not None:
        val = v.coef / steps.to(torch.float32).reshape(1, v.spec.channels, 1, v.spec.kept, 1)
        lim = INT_LIMITS[v.spec.dtype]
        q = (torch.sign(val) * torch.floor(val.abs() + v.spec.theta)).clamp(-lim, lim)
        kw["recon"] = fit_recon(val, q, dims=(0, 2, 4)).tolist()
    return v.spec.replace(**kw)


def per_sample_bytes(stage: dict, q: np.ndarray) -> int:
    """The coefficients of every sample through the stage, one blob per sample (the webdataset writer's
    member; the entropy coder takes a batch of one, as the writer gives it)."""
    codec = get_stage(stage)
    if codec.needs_shape:
        return sum(len(codec.encode(q[i : i + 1])) for i in range(len(q)))
    return sum(len(codec.encode(q[i])) for i in range(len(q)))


def manifest_of(spec: CodecSpec, stage: dict, stats: FieldStats, n: int, coeff_bytes: int) -> Manifest:
    """The manifest a one-shard webdataset pack of this field would write (sha256 a placeholder)."""
    c, h, w = spec.sample_shape
    field = FieldSpec("image", "dct", (c, h, w), "float32", spec, stage)
    fields = (field, side_field(field)) if has_side(field) else (field,)
    shard = {"name": "shard-000000.tar", "samples": n, "sha256": "0" * 64, "bytes": coeff_bytes}
    settings = {"source": "source.npy", "cf": None, "mask": None, "quant": None, "target_psnr": TARGET}
    settings |= {"nan": "error", "nan_filled": 0, "channels_last": False, "source_info": {}}
    return Manifest(
        storage="webdataset",
        samples=n,
        fields=fields,
        pack=settings,
        stats={"image": stats},
        checksums={shard["name"]: {"sha256": shard["sha256"], "bytes": coeff_bytes}},
        layout={"shards": [shard], "max_shard_size": 256 << 20, "samples_per_shard": None},
    )


def v1_codec_entry(spec: CodecSpec) -> dict[str, Any]:
    """The codec entry as v1 wrote it: every CodecSpec field, full (C, K) tables, float64 repr."""

    def long(v):  # a float32 value printed at float64 repr (16-17 digits, as v1's float64 steps)
        return [long(e) for e in v] if isinstance(v, (tuple, list)) else float(np.float32(v))

    d: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name in ("steps", "offsets", "rotation", "mean", "std") and value is not None:
            value = long(value)
        elif isinstance(value, tuple):
            value = json.loads(json.dumps(value))
        d[f.name] = value
    return d


def metadata_bytes(manifest: Manifest, style: str) -> int:
    if style == "v2":
        return len(manifest.to_json().encode())
    d = manifest.to_dict()
    d["version"] = 1
    d["fields"][0]["codec"] = v1_codec_entry(manifest.fields[0].codec)
    return len((json.dumps(d, indent=2, allow_nan=False) + "\n").encode())


def worst_channel(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """The dataset PSNR of the worst channel: what a target promises (every channel separately)."""
    return -10.0 * math.log10(float(channel_nmse(x, x_hat).max()))


def measure(x: torch.Tensor, spec: CodecSpec, stages: dict[str, dict | str], styles=("v2",)) -> dict[str, Any]:
    """One point: encode + Decompress, PSNR, and total bytes per (stage name, metadata style)."""
    wire, overflow = encode(x, spec)
    with torch.inference_mode():
        x_hat = Decompress(spec, normalize=False)(wire)
    q, side = wire if isinstance(wire, tuple) else (wire, None)
    nm, ok = item_nmse(x, x_hat)
    per_item = sorted(-10.0 * math.log10(max(v, 1e-300)) for v in nm[ok].tolist())
    stats = FieldStats(per_item[0], float(np.median(per_item)), float((x - x_hat).abs().max()), overflow)
    qn = q.contiguous().numpy()
    side_bytes = 0 if side is None else 8 * spec.channels * len(qn)
    point: dict[str, Any] = {"psnr": dataset_psnr(x, x_hat), "worst_channel": worst_channel(x, x_hat)}
    point |= {"overflow": overflow, "side": side_bytes, "bytes": {}}
    for name, stage in stages.items():
        config = choose_stage(qn, spec, AUTO) if stage == AUTO else dict(stage)
        coeff = per_sample_bytes(config, qn)
        manifest = manifest_of(spec, config, stats, len(qn), coeff + side_bytes)
        for style in styles:
            point["bytes"][f"{name}/{style}"] = coeff + side_bytes + metadata_bytes(manifest, style)
        point[f"stage/{name}"] = config["id"]
    return point


def sweep(x, v: Variant, need: tuple[float, ...], stages=None, styles=("v2",)) -> list[dict[str, Any]]:
    """Points of the variant from the step multiplier m = 1 outwards, every ~SPACING_DB, until they
    bracket every PSNR in `need` (at most 3 extra points each way). An int8 codec whose floors cap its
    PSNR near the top level also gets the points of its int16 twin there, as calibration would switch
    to int16 at such a target: the curve is the envelope of both."""
    stages = stages or {"zstd19": ZSTD19}

    def at(u: Variant, m: float) -> dict[str, Any]:
        return {"m": m, "dtype": u.spec.dtype, **measure(x, spec_at(u, m), stages, styles)}

    points = [at(v, 1.0)]
    p0 = points[0]["psnr"]
    lo, hi = min(need), max(need)
    for t in np.arange(lo - 1.0, hi + 1.0 + 1e-9, SPACING_DB):
        points.append(at(v, 10.0 ** ((p0 - t) / 20.0)))
    for _ in range(3):
        coarse = max(points, key=lambda p: p["m"])
        fine = min(points, key=lambda p: p["m"])
        if min(p["psnr"] for p in points) > lo - 0.2:
            points.append(at(v, coarse["m"] * 10.0 ** ((coarse["psnr"] - lo + 1.0) / 20.0)))
        elif max(p["psnr"] for p in points) < hi + 0.2 and fine["m"] > 1e-3:
            points.append(at(v, fine["m"] / 10.0 ** (max(hi - fine["psnr"], 0.0) / 20.0 + 0.1)))
        else:
            break
    if v.spec.dtype == "int8" and max(p["psnr"] for p in points) < hi + 1.0:
        twin = variant(v.name + " int16", x, v.spec.replace(dtype="int16"), v.base)
        ms = [10.0 ** ((p0 - t) / 20.0) for t in np.arange(hi - 2.0, hi + 1.0 + 1e-9, 1.5)]
        points += [at(twin, m) for m in ms]
    return sorted(points, key=lambda p: (p["dtype"], p["m"]))


def curve(points: list[dict[str, Any]], key: str = "zstd19/v2") -> list[Point]:
    return [Point(f"m={p['m']:.4g}", p["bytes"][key], p["psnr"]) for p in points]


# The variants of one pack ----------------------------------------------------------------------------
def calibrate(x: torch.Tensor, **kw) -> CodecSpec:
    return calibrate_report(x, quant=None, target_psnr=TARGET, codec=ZSTD19, **kw).spec


def floors_bind(v: Variant) -> bool:
    return bool((torch.tensor(v.spec.steps, dtype=torch.float64) > v.base * (1 + 1e-6)).any())


def no_side_variants(x: torch.Tensor, final: Variant) -> list[Variant]:
    """Fix 8 off: the final codec coding x itself (int8 and int16, whose envelope is compared)."""
    spec = final.spec
    side = item_side(x)  # (N, C, 2)
    scale = 1.0 / (1.0 / side[..., 0].double().pow(2)).mean(0).sqrt()  # (C,) rate-optimal channel scale
    base = final.base.flatten() * scale
    plain = spec.replace(side=None, min_psnr=None, recon=None, steps=base.tolist())
    dc = coded_coefficients(x, plain)[0][:, :, :, 0, :]  # the DC plane (N, C, Hb, Wb)
    mid = (dc.amax(dim=(0, 2, 3)) + dc.amin(dim=(0, 2, 3))).double() / 2
    offsets = [[float(o)] + [0.0] * (spec.kept - 1) for o in mid]
    out = []
    for dtype in ("int8", "int16"):
        s = plain.replace(dtype=dtype, offsets=offsets, recon=spec.recon)
        out.append(variant(f"no side {dtype}", x, s, base))
    return out


def old_landing(python: str, x: np.ndarray, threads: int) -> dict[str, Any]:
    """The old package's calibration on x, run by `python` with cwd outside any checkout."""
    with tempfile.TemporaryDirectory(prefix="codec-ablation-") as tmp:
        src, out = os.path.join(tmp, "x.npy"), os.path.join(tmp, "x_hat.npy")
        np.save(src, np.ascontiguousarray(x, dtype=np.float32))
        proc = subprocess.run(
            [python, "-c", OLD_CALIBRATION, src, out, str(TARGET), str(threads)],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        x_hat = np.load(out, allow_pickle=False)
    info["psnr"] = dataset_psnr(torch.from_numpy(x), torch.from_numpy(x_hat))
    info["worst_channel"] = worst_channel(torch.from_numpy(x), torch.from_numpy(x_hat))
    return info


def run_pack(pack, levels: tuple[float, ...], before_python: str | None, threads: int) -> dict[str, Any]:
    """Every row's curves on one pack."""
    t0 = time.perf_counter()
    x = torch.from_numpy(np.ascontiguousarray(pack.x, dtype=np.float32))
    n, c, h, w = x.shape
    final = variant("final", x, calibrate(x))
    spec = final.spec
    res: dict[str, Any] = {
        "name": pack.name,
        "samples": n,
        "shape": [c, h, w],
        "final": f"cf={spec.cf} {spec.mask} {spec.dtype}" + (" KLT" if spec.rotation else ""),
        "floors_bind": floors_bind(final),
        "curves": {},
        "rows": {},
        "notes": [],
    }
    need = tuple(levels)
    if before_python:
        old = old_landing(before_python, pack.x, threads)
        res["old"] = old
        if "psnr" in old:
            need = (*need, old["psnr"])
    stages = {"zstd19": ZSTD19, "zstd9": ZSTD9, "auto": AUTO}
    pts = sweep(x, final, need, stages=stages, styles=("v2", "v1"))
    res["curves"]["final"] = pts
    landing = next(p for p in pts if p["m"] == 1.0 and p["dtype"] == spec.dtype)
    res["new_psnr"], res["new_worst_channel"] = landing["psnr"], landing["worst_channel"]
    res["auto_stage_at_landing"] = landing["stage/auto"]
    pairs: dict[str, tuple[list[Point], list[Point]]] = {
        "1": (curve(pts, "zstd19/v1"), curve(pts)),
        "2": (curve(pts, "zstd9/v2"), curve(pts)),
        "7": (curve(pts), curve(pts, "auto/v2")),
    }
    other = {
        "3a": [variant("edge", x, spec.replace(pad="edge"), final.base)],
        "3b": [variant("plain", x, spec.replace(theta=None, recon=None), final.base)],
    }
    if c > 1:
        other["4"] = [variant("no rotation", x, calibrate(x, rotation=False))]
        if spec.rotation is None:
            res["curves"]["klt"] = sweep(x, variant("klt", x, calibrate(x, rotation=True)), levels)
            res["notes"].append("calibration chose no rotation (row 4f forces it)")
    if spec.dtype == "int8" and res["floors_bind"]:
        other["6"] = [variant("int16 uniform", x, spec.replace(dtype="int16"), final.base)]
    if spec.rotation is None:
        other["8"] = no_side_variants(x, final)
    for key, variants in other.items():
        before = []
        for v in variants:
            points = sweep(x, v, levels)
            res["curves"][v.name] = points
            before += curve(points)
        pairs[key] = (before, curve(pts))
    if c > 1:
        pairs["4f"] = (pairs["4"][0], curve(res["curves"].get("klt", pts)))
    for key, (before, after) in pairs.items():
        res["rows"][key] = {f"{lv:g}": bytes_at(after, lv) / bytes_at(before, lv) for lv in levels}
    if "psnr" in res.get("old", {}):
        f_curve = curve(pts)
        res["margin_cost"] = bytes_at(f_curve, res["old"]["psnr"]) / bytes_at(f_curve, res["new_psnr"])
    res["seconds"] = time.perf_counter() - t0
    return res


# Tables ----------------------------------------------------------------------------------------------
def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{(v - 1) * 100:+.1f} %"


def summary(results: list[dict[str, Any]], levels: tuple[float, ...]) -> dict[str, dict[str, Any]]:
    """Per row and level: geometric mean of after/before over the packs where both reach the level."""
    out = {}
    for key in ROWS:
        cells = {}
        for lv in levels:
            ratios = [r["rows"][key][f"{lv:g}"] for r in results if key in r["rows"]]
            finite = [v for v in ratios if math.isfinite(v) and v > 0]
            cells[f"{lv:g}"] = {"ratio": geomean(finite), "packs": len(finite), "of": len(ratios)}
        out[key] = cells
    return out


def row_table(summ: dict[str, dict[str, Any]], levels: tuple[float, ...]) -> str:
    counts = "/".join(f"{lv:g}" for lv in levels)
    head = ["fix", "before -> after", *(f"{lv:g} dB" for lv in levels), f"packs ({counts})"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(levels) + "---|"]
    for key, (fix, change) in ROWS.items():
        cells = summ[key]
        counts = "/".join(f"{cells[f'{lv:g}']['packs']}" for lv in levels)
        of = max(cells[f"{lv:g}"]["of"] for lv in levels)
        pct = [_pct(cells[f"{lv:g}"]["ratio"]) for lv in levels]
        lines.append(f"| {fix} | {change} | " + " | ".join(pct) + f" | {counts} of {of} |")
    return "\n".join(lines)


def landing_summary(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    done = [r for r in results if "psnr" in r.get("old", {})]
    if not done:
        return None

    def spread(vals):
        return {"mean": float(np.mean(vals)), "min": float(np.min(vals)), "max": float(np.max(vals))}

    costs = [r["margin_cost"] for r in done if math.isfinite(r.get("margin_cost", math.nan))]
    return {
        "packs": len(done),
        "old_above_target": spread([r["old"]["psnr"] - TARGET for r in done]),
        "new_above_target": spread([r["new_psnr"] - TARGET for r in done]),
        "old_worst_channel_above_target": spread([r["old"]["worst_channel"] - TARGET for r in done]),
        "new_worst_channel_above_target": spread([r["new_worst_channel"] - TARGET for r in done]),
        "margin_cost": geomean(costs),
        "margin_cost_packs": len(costs),
        "old_seconds": float(sum(r["old"]["seconds"] for r in done)),
        "failed": [f"{r['name']}: {r['old']['error']}" for r in results if "error" in r.get("old", {})],
    }


def landing_table(land: dict[str, Any]) -> str:
    def s(d):
        return f"{d['mean']:+.2f} / {d['min']:+.2f} / {d['max']:+.2f}"

    old, new = "old `calibrate_report` (0.5 dB margin + 2 SE)", "new `calibrate_report` (target + 0.15 dB)"
    n = land["packs"]
    return "\n".join(
        [
            "| calibration | dataset PSNR - target: mean / min / max | worst channel's - target | packs |",
            "|---|---|---|---:|",
            f"| {old} | {s(land['old_above_target'])} | {s(land['old_worst_channel_above_target'])} | {n} |",
            f"| {new} | {s(land['new_above_target'])} | {s(land['new_worst_channel_above_target'])} | {n} |",
            "",
            f"What the old landing costs on the new codec's curve (bytes at the old landing / at the new one, "
            f"geo-mean over {land['margin_cost_packs']} packs): {_pct(land['margin_cost'])}",
        ]
    )


def pack_table(results: list[dict[str, Any]], level: float) -> str:
    keys = list(ROWS)
    head = ["pack", "N", "C", "final codec", "floors bind", "new landing", "old landing", *keys]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * 2 + "---|---|" + "---:|" * (2 + len(keys))]
    for r in results:
        old = r.get("old", {}).get("psnr", math.nan)
        cells = [_pct(r["rows"][k][f"{level:g}"]) if k in r["rows"] else "" for k in keys]
        lines.append(
            f"| {r['name']} | {r['samples']} | {r['shape'][0]} | {r['final']} | {'yes' if r['floors_bind'] else 'no'} "
            f"| {r['new_psnr']:.2f} | {'-' if not math.isfinite(old) else f'{old:.2f}'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


# Command line ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks codec-ablation", description=__doc__.splitlines()[0])
    p.add_argument("--items", help="comma-separated bench items (default: all installed)")
    p.add_argument("--modes", default=",".join(MODES), help="tiles,whole (default both)")
    p.add_argument("--max-tiles", type=int, default=MAX_TILES)
    p.add_argument("--levels", default=",".join(f"{lv:g}" for lv in LEVELS), help="PSNR levels in dB")
    p.add_argument("--before-python", help="a python whose `import dctdata` is the version before issue 12")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    args = p.parse_args(argv)
    args.items = None if not args.items else args.items.split(",")
    args.modes = tuple(args.modes.split(","))
    args.levels = tuple(sorted(float(v) for v in args.levels.split(",")))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    items, skipped = load_items(args.items)
    packs = packs_of(items, args.modes, args.max_tiles)
    results = []
    for i, pack in enumerate(packs):
        try:
            results.append(run_pack(pack, args.levels, args.before_python, args.threads))
        except DctDataError as exc:  # a pack the product refuses is reported, not fatal to a long run
            skipped.append(f"{pack.name} skipped: {exc}")
            continue
        print(f"[{i + 1}/{len(packs)}] {pack.name}: {results[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
        if args.json:  # keep what has been measured if a long run is interrupted
            _write(args.json, {"packs": _clean(results), "partial": True})
    summ = summary(results, args.levels)
    land = landing_summary(results)
    seconds = time.perf_counter() - t0
    lines = [
        f"{len(packs)} pack(s) of {len(items)} item(s) ({', '.join(args.modes)}; tiles 60x76, at most "
        f"{args.max_tiles}); final codec calibrated at {TARGET:g} dB with zstd-19; torch "
        f"{torch.__version__}, {args.threads} thread(s); {seconds:.0f} s",
        "",
        "Bytes after / bytes before at equal dataset PSNR, minus 1 (geometric mean over packs; negative: the fix "
        "stores less). packs: where both codecs reach the level, of the packs the row applies to.",
        "",
        row_table(summ, args.levels),
    ]
    if land is not None:
        lines += ["", landing_table(land)] + [f"- old calibration failed on {f}" for f in land["failed"]]
    mid = args.levels[len(args.levels) // 2]
    lines += ["", f"Per pack, after/before - 1 at {mid:g} dB:", "", pack_table(results, mid)]
    lines += [f"- {r['name']}: {n}" for r in results for n in r["notes"]] + [f"- {s}" for s in skipped]
    print("\n".join(lines))
    payload = _clean(
        {
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "target": TARGET,
            "rows": {k: {"fix": ROWS[k][0], "change": ROWS[k][1], "levels": summ[k]} for k in ROWS},
            "landing": land,
            "packs": results,
            "seconds": seconds,
            "skipped": skipped,
        }
    )
    if args.json:
        _write(args.json, payload)
    return payload


def _write(path: str, payload: dict[str, Any]) -> None:
    """Write atomically (a temporary sibling, then rename)."""
    with open(path + ".partial", "w") as fh:
        json.dump(payload, fh, indent=1)
        fh.write("\n")
    os.replace(path + ".partial", path)


if __name__ == "__main__":
    main()
