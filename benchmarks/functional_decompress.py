"""The functional `dctdata.decompress` on the CPU: the fused C kernel (what it takes now, as `Decompress` does)
against its previous path (`transform.decompress`, the torch kernels) and a copy of the same output bytes into
a reused buffer, one torch thread, float32 coefficients of 256x256 samples. The paths take turns, best of
--repeat rounds each, so a busy machine slows them alike.

    python benchmarks/functional_decompress.py [--batch 64] [--cf 2 4 8] [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dctdata
from dctdata.codec import transform
from dctdata.decoder import fused


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks functional-decompress", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--cf", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"fused kernel: {fused.vector_isa()}; torch {torch.__version__}; 1 thread; batch {args.batch} x "
          f"{args.size}^2 float32 out; best of {args.repeat} rounds")  # fmt: skip
    print("| CF | copy ms | fused ms | previous ms | fused / previous | fused / copy |")
    print("|---:|---:|---:|---:|---:|---:|")
    size = (args.size, args.size)
    for cf in args.cf:
        y = dctdata.compress(torch.rand(args.batch, *size), cf)
        src, dst = torch.rand(args.batch, *size), torch.empty(args.batch, *size)
        runs = {
            "copy": lambda src=src, dst=dst: dst.copy_(src),
            "fused": lambda y=y, cf=cf: dctdata.decompress(y, cf, size),
            "previous": lambda y=y, cf=cf: transform.decompress(y, cf, size),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.repeat):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        ms = {k: 1e3 * v for k, v in best.items()}
        print(f"| {cf} | {ms['copy']:.2f} | {ms['fused']:.2f} | {ms['previous']:.2f} | "
              f"{ms['fused'] / ms['previous']:.2f}x | {ms['fused'] / ms['copy']:.1f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
