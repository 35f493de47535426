"""Packing from Python: arrays, dicts of arrays, map-style datasets, generators and an incremental
`Writer`, with one set of settings reused, then reading the packs back.

    python examples/from_python.py            # a few seconds on 2 cores; the packs go to a temporary folder
    python examples/from_python.py --out DIR  # keep them

Every keyword is a field of `dctdata.PackSettings` (the CLI's flags in snake_case), and a pack from Python
is the same dataset, byte for byte, as `dctdata pack` of the same data.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import dctdata
from dctdata.datasets import em_denoise


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="samples per pack")
    p.add_argument("--size", type=int, default=64, help="image side")
    p.add_argument("--out", default=None, help="folder for the packs (default: a temporary one)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.n, 2, args.size, args.size)).cumsum(-1).cumsum(-2).astype(np.float32)
    t = np.arange(args.n, dtype=np.float32) * 0.1
    packs = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        path = lambda name: os.path.join(out, name)  # noqa: E731

        # An array or tensor, samples first (one field, "image"); a dict of arrays: a field each.
        packs["array"] = dctdata.pack(x, path("fields.dct"), target_psnr=40, quiet=True)
        packs["dict"] = dctdata.pack({"u": x, "t": t}, path("dict.dct"), target_psnr=40, quiet=True)

        # A map-style dataset (here a synthetic EM set of {"noisy", "clean"} pairs), a target per field.
        em = em_denoise(n=args.n, size=args.size)
        packs["dataset"] = dctdata.pack(
            em, path("em.dct"), target_psnr={"noisy": 35, "clean": 45}, format="webdataset", quiet=True
        )

        # A generator: read once, in order (`length=` when known); fixed settings need no calibration.
        samples = ({"u": x[i, 0], "step": i} for i in range(args.n))
        packs["generator"] = dctdata.pack(samples, path("gen.dct"), cf=6, length=args.n, quiet=True)

        # Settings as one object, reused: the Writer packs samples as they come (an error inside the block
        # leaves nothing at OUT; the pack is committed when the block ends).
        settings = dctdata.PackSettings(target_psnr=40, format="webdataset", samples_per_shard=16)
        with dctdata.Writer(path("sim.dct"), settings=settings, coords={"t": t}) as w:
            for i in range(args.n):
                w.write({"u": x[i], "t": t[i]})
        packs["writer"] = w.manifest

        # Reading back: the dataset kind follows the manifest (zarr: map-style, webdataset: iterable).
        ds = dctdata.open_dataset(path("fields.dct"))
        (coeffs,) = ds[0:4]  # a batch of 4 samples' coefficients
        first = ds.decompressor()(coeffs)
        error = float(np.abs(first.numpy() - x[:4]).max())
        sim = dctdata.open_dataset(path("sim.dct"), as_dict=True)
        times = [float(s["t"]) for s in sim]
        for name, m in packs.items():
            print(f"{name:9s}: {m.samples} samples, {m.stored_bytes / 1e3:.1f} kB, fields {list(m.names)}")
        print(f"max error of 4 decoded samples: {error:.4f}; sim.dct coordinate t: {sim.coords['t'][:3]}")
    return {"packs": packs, "error": error, "times": times}


if __name__ == "__main__":
    main()
