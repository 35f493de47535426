"""`python -m benchmarks decompress-host`: the host's Python per `Decompress` call on the fused CUDA path.

With 64 MB batches the decode table of `python -m benchmarks gpu` is bound by the host on an H100: one call's
checks and launch take about as long as its kernel. This measures that Python (input checks, tables, the
output's allocation, the launch arguments) without a GPU: CPU tensors, the fused path forced on, and the
Triton launch replaced by a no-op, so the figure is the layer's own cost, not Triton's launcher or the kernel.
v1 and v2 (the gpu table's codecs) are timed in turns; best of --repeat runs of --calls calls each.

    python -m benchmarks decompress-host --cf 4 --size 256 --batch 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's dctdata

from benchmarks.gpu import v1_spec, v2_spec, wire
from dctdata.decoder import fused_cuda
from dctdata.decoder.layer import Decompress


class _NoLaunch:
    """Stands in for the Triton kernel: `kernel[grid](*args)` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class _NoKernelModule:
    synthesize_kernel = _NoLaunch()


@contextlib.contextmanager
def stubbed_launch():
    """The fused CUDA path taken for CPU tensors, its launch a no-op (restored on exit)."""
    saved = fused_cuda._kernel_module, fused_cuda.usable
    fused_cuda._kernel_module, fused_cuda.usable = _NoKernelModule(), lambda *args: True
    try:
        yield
    finally:
        fused_cuda._kernel_module, fused_cuda.usable = saved


def host_seconds(cf: int, size: int, batch: int, calls: int, repeat: int) -> dict[str, float]:
    """Best seconds per call of each codec's `Decompress` with the launch stubbed out."""
    layers = {}
    for codec, make in (("v1", v1_spec), ("v2", v2_spec)):
        spec = make(cf, size)
        layers[codec] = (Decompress(spec), wire(spec, batch, torch.device("cpu")))
    best = dict.fromkeys(layers, float("inf"))
    with stubbed_launch(), torch.inference_mode():
        for layer, x in layers.values():
            for _ in range(20):
                layer(x)
        for _ in range(repeat):
            for codec, (layer, x) in layers.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    layer(x)
                best[codec] = min(best[codec], (time.perf_counter() - t0) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks decompress-host", description=__doc__.split("\n\n")[0])
    p.add_argument("--cf", type=int, default=4, help="chop factor")
    p.add_argument("--size", type=int, default=256, help="square sample side")
    p.add_argument("--batch", type=int, default=256, help="samples a call")
    p.add_argument("--calls", type=int, default=300, help="calls a timed run")
    p.add_argument("--repeat", type=int, default=5, help="timed runs a codec (best is kept)")
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args(argv)
    best = host_seconds(args.cf, args.size, args.batch, args.calls, args.repeat)
    print(f"Decompress host Python per call (launch stubbed), cf={args.cf} {args.size}² batch {args.batch}, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs")  # fmt: skip
    for codec, s in best.items():
        print(f"  {codec}: {s * 1e6:.1f} µs")
    print(f"  v1 / v2: {best['v1'] / best['v2']:.2f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"argv": argv, "us_per_call": {k: v * 1e6 for k, v in best.items()}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
