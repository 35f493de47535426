"""Before/after of the CPU decode kernel, side by side in one process.

Times, interleaved round-robin (best of `--repeat`, so a busy machine hurts every variant alike), for
outputs of at least 64 MB: copying the output bytes into a preallocated buffer (the yardstick of
`python -m benchmarks codec`), the portable kernel (`synthesize_portable`: the exported graph, and the eager
CPU path before the chunked kernel), the chunked torch kernel with a fresh output and into a reused
`out=` buffer, and the fused C kernel (`dctdata.decoder.fused`, what `Decompress` takes) both ways. Fresh
outputs pay for page faults: run once more with `THP_MEM_ALLOC_ENABLE=1` (torch then backs large
tensors with huge pages) to see how much. With more than one thread the torch columns are the portable
graph (the chunked kernel runs on one thread only, see `transform.synthesize`) and the fused kernel
splits the batch over the threads.

    python -m benchmarks decode-kernels --threads 1 --sizes 256 1024 --cf 2 4 6 8 --codec v1 v2 --repeat 5
    python -m benchmarks decode-kernels --threads 1 --sizes 256 1024 --cf 2 4 6 8 --codec v1 v2 --wire int8
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import torch

from dctdata import CodecSpec, Decompress
from dctdata.codec.transform import synthesize_portable
from dctdata.decoder import fused

OUT_OF_CACHE_BYTES = 64 << 20


def variants(size: int, cf: int, wire: str, codec: str, nbytes: int = OUT_OF_CACHE_BYTES) -> dict:
    """The timed callables for one (size, CF): a copy of the output bytes and the three decode kernels.

    codec v1: steps and a DC offset folded into the weights; v2: dead-zone reconstruction offsets and
    per-sample (range, mid), the affine pass over the coefficients before the matmuls."""
    k = cf * cf
    quant = dict(steps=[[1e-3] * k], offsets=[[0.5] + [0.0] * (k - 1)]) if wire.startswith("int") else {}
    if codec == "v2":
        quant.update(recon=[[0.1] * k], side="range_mid")
    spec = CodecSpec(cf=cf, height=size, width=size, dtype=wire, **quant)
    layer = Decompress(spec)
    batch = -(-nbytes // (size * size * 4))
    q = (torch.randn(batch, *spec.coeff_shape) * 100).to(spec.torch_dtype)
    wire_value = (q, torch.rand(batch, 1, 2) + 0.5) if codec == "v2" else q
    src = torch.randn(batch, 1, size, size)
    dst, out = torch.empty_like(src), torch.empty_like(src)

    def torch_kernel(**kw):  # the chunked torch kernel: the fused one turned off for the call
        enabled, fused.ENABLED = fused.ENABLED, False
        try:
            return layer(wire_value, **kw)
        finally:
            fused.ENABLED = enabled

    def before():  # the eager CPU path before the chunked kernel: full-size passes, then the portable graph
        coef = q if codec == "v1" else layer._coefficients(q, wire_value[1], torch.float32)
        return synthesize_portable(coef, layer.weight, layer.trows, "square", (size, size), layer.bias_row)

    return {
        "batch": batch,
        "copy": lambda: dst.copy_(src),
        "portable": before,
        "chunked": torch_kernel,
        "out": lambda: torch_kernel(out=out),
        "fused": lambda: layer(wire_value),
        "fused_out": lambda: layer(wire_value, out=out),
    }


def best_interleaved(fns: dict, repeat: int) -> dict:
    """Best time of each callable, taking turns so load spikes hit every variant alike."""
    best = dict.fromkeys(fns, float("inf"))
    with torch.inference_mode():
        for fn in fns.values():  # warm up
            fn()
        for _ in range(repeat):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks decode-kernels", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count()])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--cf", type=int, nargs="+", default=[2, 4, 6, 8])
    p.add_argument("--wire", default="int16", help="coefficient wire dtype (int16: steps and offsets folded)")
    p.add_argument("--codec", nargs="+", default=["v1", "v2"], choices=["v1", "v2"], help="codec versions")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--bytes", type=int, default=OUT_OF_CACHE_BYTES, help="decoded output bytes per call (at least)")
    args = p.parse_args(argv)
    print(
        f"torch {torch.__version__}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '0')}, "
        f"wire {args.wire}, outputs >= {args.bytes / 2**20:g} MiB, best of {args.repeat} interleaved; times as x copy"
    )
    print(f"fused kernel: {fused.vector_isa()}, available {fused.available()}")
    print(
        "| codec | threads | size | CF | batch | copy ms | portable (before) | chunked | chunked, out= | fused | "
        "fused, out= |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    previous = torch.get_num_threads()
    for codec, n, size, cf in itertools.product(args.codec, args.threads, args.sizes, args.cf):
        torch.set_num_threads(n)
        fns = variants(size, cf, args.wire, codec, args.bytes)
        batch = fns.pop("batch")
        with torch.inference_mode():
            ref = fns["portable"]()
            for name in ("chunked", "fused"):
                torch.testing.assert_close(fns[name](), ref, atol=1e-3, rtol=1e-5)
        best = best_interleaved(fns, args.repeat)
        c = best["copy"]
        rows.append({"codec": codec, "threads": n, "size": size, "cf": cf, "batch": batch, "copy_s": c})
        rows[-1].update({f"x_{name}": best[name] / c for name in ("portable", "chunked", "out", "fused", "fused_out")})
        print(
            f"| {codec} | {n} | {size}² | {cf} | {batch} | {1e3 * c:.1f} | {best['portable'] / c:.1f}x | "
            f"{best['chunked'] / c:.1f}x | {best['out'] / c:.1f}x | {best['fused'] / c:.1f}x | "
            f"{best['fused_out'] / c:.1f}x |",
            flush=True,
        )
    torch.set_num_threads(previous)
    return rows


if __name__ == "__main__":
    main()
