"""`python -m benchmarks max-error`: bytes at equal pointwise error bound, dctdata `--max-rel-error` against
SZ3 (absolute mode), ZFP (fixed accuracy) and SPERR (point-wise error mode).

Every item (channel of a sample) gets the bound r x its own value range, r in --bounds (default 1e-2,
1e-3, 1e-4): dctdata packs the whole set with `max_rel_error=r` (all its files counted, manifest
included); each peer compresses each item on its own with the absolute bound r x range (its own headers
counted). Every decoded value is checked against its bound; a peer that misses is reported, not hidden.
Compression ratio = float32 bytes / stored bytes; the last rows are geometric means over the fields.

A pack also stores bytes that do not grow with its samples (manifest.json, with the entropy coder's model,
and the zarr.json files): fixed per pack, while each peer's headers are per item. The "dctdata" column counts
them (as a user's small pack pays them); "per sample" leaves them out (what each further sample costs, the
ratio a large pack tends to), and `--split` lists the pack's bytes: coefficient shards, side shards (range
and mid per item plus the corrections) and the fixed files. `--n 32 --size 256` is the larger set.

Two sets (`--set`):
- "fields" (default): the test fields of `tests/sci_fields.py` (atoms, beam, clouds) and "spiky", smooth fields
  with a few outliers (the case a mean-square target hides), `--n` samples of `--size`^2 each.
- "items": the rate-distortion bench's items (`benchmarks.items`: arrays that ship inside installed packages,
  scientific and photographic, 8-bit and float, single- and multi-channel, plus the synthetic SciML stand-ins),
  each packed as tiles and whole like `python -m benchmarks rd` does; `--items` picks some. Geometric means
  are given over every pack and per group (sci, photo, rgb, multi). Many of these items hold integers (8-bit
  photos, counts): where a bound is below half a count, dctdata's value lattices decode them exactly, while
  the peers code to the bound.
- "volumes": nibabel's real MRI volumes (`tests/shipped_images.real_volumes`; needs nibabel, the `bench` extra):
  the fMRI run example4d as 2 int16 volumes of 24 x 96 x 128, anatomical.nii (25 x 41 x 33 int16) and
  functional.nii (20 volumes of 3 x 21 x 17, float32). dctdata packs them in their own dtype with `dims=3`;
  each peer codes each volume alone in 3-D (float32).
A peer whose library is missing is skipped (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sci_fields import synthetic_fields

import dctdata
from benchmarks.curves import geomean


def spiky(n: int, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.cumsum(np.cumsum(rng.standard_normal((n, 1, size, size)), -1), -2)
    for i in range(n):
        for _ in range(4):
            x[i, 0, rng.integers(size), rng.integers(size)] += 40 * x[i].std() * rng.choice([-1, 1])
    return x.astype(np.float32)


def fields(n: int, size: int, seed: int) -> dict[str, np.ndarray]:
    return {**synthetic_fields(n, size, seed), "spiky": spiky(n, size, seed)}


def item_packs(names: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """The rd bench's packs of the named items (all by default): ({"<item>/<mode>": (N, C, H, W) float32},
    {pack: group}, one line per item skipped because its package is missing)."""
    from benchmarks.items import load_items, packs_of

    items, skipped = load_items(names)
    packs = packs_of(items)
    return (
        {p.name: np.ascontiguousarray(p.x, dtype=np.float32) for p in packs},
        {p.name: p.item.group for p in packs},
        skipped,
    )


def bound_label(r: float) -> str:
    """1e-3 as the docs write it."""
    return f"{r:.0e}".replace("e-0", "e-").replace("e+0", "e")


def geomeans(cr: dict[tuple[str, str, float], float], packs, names, r: float) -> dict[str, float]:
    """Per codec (or column) the geometric mean of its ratios over `packs` at bound r."""
    return {c: geomean([cr[f, c, r] for f in packs]) for c in names}


def item_ranges(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(*x.shape[:2], -1).astype(np.float64)
    return flat.max(-1) - flat.min(-1)


def misses(x: np.ndarray, y: np.ndarray, bound: np.ndarray) -> int:
    """Items whose largest error exceeds their bound."""
    err = np.abs(y.astype(np.float64) - x.astype(np.float64)).reshape(*x.shape[:2], -1).max(-1)
    return int((err > bound).sum())


def pack_split(root: Path) -> dict[str, int]:
    """Bytes of a zarr pack by part: "coefficients" (the dct field's shards), "side" (its side partner's
    shards: range and mid per item, then the corrections; or its base64 in the manifest, where a small
    pack keeps it) and "fixed" (the rest of manifest.json and the zarr.json files: they do not grow with
    the samples)."""
    split = {"coefficients": 0, "side": 0, "fixed": 0}
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(root).parts
        part = "fixed"
        if len(rel) == 2 and rel[1].startswith("c."):
            part = "side" if rel[0].endswith("__side") else "coefficients"
        split[part] += p.stat().st_size
    arrays = json.loads((root / "manifest.json").read_text()).get("layout", {}).get("arrays", {})
    inline = sum(len(e["inline"]) for e in arrays.values() if isinstance(e, dict) and "inline" in e)
    split["side"] += inline
    split["fixed"] -= inline
    return split


def volume_sets() -> dict[str, np.ndarray]:
    """The real volumes: name -> (N, 1, D, H, W) in their own dtype."""
    import shipped_images

    return {name: x[:, None] for name, x in shipped_images.real_volumes().items()}


def ours(x: np.ndarray, r: float, split: dict[str, int] | None = None) -> tuple[int, int]:
    """(stored bytes, items over the bound) of a dctdata pack at max_rel_error=r, decoded by the reader;
    `split` (if given) gets the bytes by part (`pack_split`). Volumes (N, 1, D, H, W) are packed with dims=3."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.dct"
        if x.ndim == 5:
            dctdata.pack(x[:, 0], out, max_rel_error=r, dims=3, quiet=True)
        else:
            dctdata.pack(x, out, max_rel_error=r, quiet=True)
        parts = pack_split(out)
        nbytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        ds = dctdata.open_dataset(out, as_dict=True)
        layer = ds.decompressor("image")
        y = np.stack([layer(tuple(t[None] for t in ds[i]["image"]))[0].numpy() for i in range(len(ds))])
    if split is not None:
        split.update(parts)
    return nbytes, misses(x, y, r * item_ranges(x))


def _per_item(x: np.ndarray, r: float, enc, dec) -> tuple[int, int]:
    bound = r * item_ranges(x)
    y = np.empty_like(x)
    total = 0
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            b = enc(np.ascontiguousarray(x[i, c]), max(float(bound[i, c]), 1e-30))
            total += len(b)
            y[i, c] = dec(b, x.shape[2:])
    return total, misses(x, y, bound)


def sz3(x: np.ndarray, r: float) -> tuple[int, int]:
    from pysz import sz, szConfig, szErrorBoundMode

    def enc(a, e):
        config = szConfig()
        config.errorBoundMode = szErrorBoundMode.ABS
        config.absErrorBound = e
        return sz.compress(a, config)[0]

    return _per_item(x, r, enc, lambda b, shape: sz.decompress(b, np.float32, shape)[0])


def zfp(x: np.ndarray, r: float) -> tuple[int, int]:
    import zfpy

    return _per_item(x, r, lambda a, e: zfpy.compress_numpy(a, tolerance=e), lambda b, shape: zfpy.decompress_numpy(b))


def sperr(x: np.ndarray, r: float) -> tuple[int, int]:
    import imagecodecs

    if not imagecodecs.SPERR.available:
        raise ImportError("this imagecodecs build has no SPERR")
    return _per_item(
        x,
        r,
        lambda a, e: imagecodecs.sperr_encode(a.astype(np.float64), e, "pwe", numthreads=1),
        lambda b, shape: imagecodecs.sperr_decode(b, numthreads=1),
    )


CODECS = {"dctdata": ours, "SZ3": sz3, "ZFP": zfp, "SPERR": sperr}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks max-error", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--set", choices=("fields", "items", "volumes"), default="fields", help="what to compress (see above)"
    )
    parser.add_argument("--items", nargs="+", default=None, help="--set items: these items only (default: all)")
    parser.add_argument("--n", type=int, default=8, help="--set fields: samples per field")
    parser.add_argument("--size", type=int, default=96, help="--set fields: sample side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bounds", default="1e-2,1e-3,1e-4", help="relative bounds r (x each item's range)")
    parser.add_argument("--split", action="store_true", help="list dctdata's bytes by part (coefficients, side, fixed)")
    parser.add_argument(
        "--json", default=None, help="also write the rows here: 'packs', 'geomeans' (`python -m benchmarks docs-table`)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bounds = [float(b) for b in args.bounds.split(",")]
    if args.set == "items":
        data, groups, skipped = item_packs(args.items)
        for line in skipped:
            print(line)
        what = f"{len(data)} packs of the rd bench's items (tiles and whole)"
    elif args.set == "volumes":
        data, groups = volume_sets(), {}
        what = "nibabel's real volumes (dctdata dims=3, peers 3-D)"
    else:
        data, groups = fields(args.n, args.size, args.seed), {}
        what = f"{args.n} x {args.size}^2 per field"
    codecs = {}
    probe = spiky(1, 16, args.seed)
    for name, fn in CODECS.items():
        try:
            fn(probe, 1e-2)
            codecs[name] = fn
        except ImportError as exc:
            print(f"{name} skipped: {exc}")
    cr: dict[tuple[str, str, float], float] = {}
    splits: dict[tuple[str, float], dict[str, int]] = {}
    names = list(codecs)
    peers = [c for c in codecs if c != "dctdata"]
    if "dctdata" in codecs:  # per sample: without the pack's fixed files, beside the measured column
        names.insert(1, "per sample")
    width = max(8, *(len(f) for f in data))
    head = f"{'field':{width}} {'bound':>7} " + " ".join(f"{c:>10}" for c in names) + "   over-bound items"
    print(f"compression ratio vs float32 at equal max error (r x each item's range), {what}")
    print(head)
    t0 = time.perf_counter()
    rows, means = [], []
    for fname, x in data.items():
        raw = x.size * 4
        for r in bounds:
            over = {}
            for name, fn in codecs.items():
                if name == "dctdata":
                    split = splits[fname, r] = {}
                    nbytes, over[name] = fn(x, r, split)
                    cr[fname, "per sample", r] = raw / (nbytes - split["fixed"])
                else:  # the peers code float32 (an integer source as its values)
                    nbytes, over[name] = fn(x.astype(np.float32, copy=False), r)
                cr[fname, name, r] = raw / nbytes
            row = " ".join(f"{cr[fname, c, r]:10.2f}" for c in names)
            missed = " ".join(f"{c}:{v}" for c, v in over.items() if v)
            print(f"{fname:{width}} {r:7.0e} {row}   {missed}", flush=True)
            key = {"pack": fname, "group": groups[fname]} if groups else {"field": fname}
            rows.append(
                key
                | {"bound": bound_label(r)}
                | {c: round(cr[fname, c, r], 2) for c in names}
                | {"over-bound items": missed or "-"}
            )
    sets = {"geomean": list(data)}
    if groups:
        for g in dict.fromkeys(groups.values()):
            sets[f"  {g}"] = [f for f in data if groups[f] == g]
    print("geometric mean over the " + ("packs, then per group" if groups else "fields"))
    for label, packs in sets.items():
        for r in bounds:
            g = geomeans(cr, packs, names, r)
            rel = ""
            if "dctdata" in g:
                rel = "dctdata vs " + " ".join(f"{c} {g['dctdata'] / g[c]:.2f}" for c in peers)
            if "per sample" in g:
                rel += " (per sample: " + " ".join(f"{c} {g['per sample'] / g[c]:.2f}" for c in peers) + ")"
            print(f"{label:{width}} {r:7.0e} " + " ".join(f"{g[c]:10.2f}" for c in names) + f"   {rel}")
            means.append(
                {"over": label.strip() if label != "geomean" else "all", "bound": bound_label(r)}
                | {c: round(g[c], 2) for c in names}
                | ({f"dctdata / {c}": round(g["dctdata"] / g[c], 2) for c in peers} if "dctdata" in g else {})
            )
    if args.split and splits:
        print("dctdata's bytes by part: coefficient shards, side shards (range, mid, corrections), fixed files")
        for (fname, r), s in splits.items():
            total = sum(s.values())
            parts = " ".join(f"{k} {v} ({v / total:.1%})" for k, v in s.items())
            print(f"{fname:{width}} {r:7.0e} total {total}: {parts}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        result = {"command": "python -m benchmarks max-error " + " ".join(argv if argv is not None else sys.argv[1:])}
        Path(args.json).write_text(json.dumps(result | {"packs": rows, "geomeans": means}, indent=1) + "\n")


if __name__ == "__main__":
    main()
