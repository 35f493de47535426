"""The fused CUDA kernel alone, without the host: `fused_cuda.synthesize` replayed from a CUDA graph (issue 28).

The decode table (`python -m benchmarks gpu --decode-only`) times `Decompress` as a model calls it, and most of its
rows take the host's time per call (the layer's checks and Triton's launch), so it cannot say how fast the kernel
itself runs or whether a kernel change helped. Here `--calls` launches of the kernel are captured once in a CUDA
graph and the graph is replayed (best of `--repeat` replays, timed with CUDA events): the device's time per launch
and nothing else. The codecs, sizes and batches are the decode table's (`benchmarks.gpu.v1_spec` / `v2_spec`,
about 64 MB of output a batch).

`--kernel LABEL=PATH` (repeatable) times other copies of the kernel module side by side in one run, in turns, e.g.
an older revision's (`git show REV:dctdata/decoder/_triton_synth.py > old.py`); append `:plain` to a kernel that reads
its dead-zone tables as (a, d, r) (the form before the half-sign tables; see `dctdata.decoder._triton_synth`), whose
tables are then converted back (exact up to one rounding of d, which does not change the timing). Each kernel's
output is compared with the first kernel's (largest difference over the output's largest magnitude).

Run from the repository root on a CUDA machine (without CUDA it prints one line and exits 0):
    python -m benchmarks kernel-alone --out kernel_alone.json
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's dctdata

from benchmarks.gpu import BATCH_BYTES, DTYPES, skip_reason, v1_spec, v2_spec, wire, write_json
from benchmarks.kernel_sass import kernel_module as load_kernel
from benchmarks.kernel_sass import parse_kernel as parse_label_path
from dctdata.decoder import fused, fused_cuda
from dctdata.decoder.wire import split_wire


def parse_kernel(text: str) -> tuple[str, str, bool]:
    """`LABEL=PATH[:plain]` -> (label, path, plain tables)."""
    plain = text.endswith(":plain")
    label, path = parse_label_path(text[: -len(":plain")] if plain else text, "LABEL=PATH or LABEL=PATH:plain")
    return label, path, plain


def plain_tables(tables: fused_cuda.DeviceTables) -> fused_cuda.DeviceTables:
    """The (a, d, r) form of half-sign tables (a, d - r, 2 r): for kernels written before them."""
    if not tables.has_r:
        return tables
    cols = tables.columns.clone()
    cols[:, :, 2] /= 2
    cols[:, :, 1] += cols[:, :, 2]
    return fused_cuda.DeviceTables(cols, tables.m, tables.scale, tables.shift, tables.t, tables.cf, tables.mask)


def graph_us(call, calls: int, repeat: int) -> float:
    """Best device microseconds per call of `call` over `repeat` replays of a graph of `calls` calls."""
    call()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def rows(kernels, sizes, cfs, dtypes, calls: int, repeat: int) -> list[dict]:
    """One row per size, CF, dtype, codec and kernel: µs per launch, GB/s of output, and the difference from the
    first kernel's output."""
    dev = torch.device("cuda")
    out_rows = []
    saved = fused_cuda._kernel_module
    try:
        for size in sizes:
            for cf in cfs:
                for name in dtypes:
                    dtype = DTYPES[name]
                    batch = max(1, BATCH_BYTES // (size * size * dtype.itemsize))
                    for codec in ("v1", "v2"):
                        spec = v1_spec(cf, size) if codec == "v1" else v2_spec(cf, size)
                        q, side = split_wire(wire(spec, batch, dev), spec)
                        half = fused_cuda.device_tables(fused.tables_for(spec), dev, cf, spec.mask)
                        plain_form = plain_tables(half) if any(p for _, _, p in kernels) else half
                        first = None
                        for label, module, plain in kernels:
                            fused_cuda._kernel_module = module
                            tables = plain_form if plain else half
                            out = torch.empty(batch, 1, size, size, dtype=dtype, device=dev)
                            call = functools.partial(fused_cuda.synthesize, q, tables, cf, spec.mask, (size, size), out,
                                                     side, dtype)  # fmt: skip
                            us = graph_us(call, calls, repeat)
                            got = out.float()
                            first = got if first is None else first
                            diff = float((got - first).abs().max() / first.abs().max().clamp(min=1e-30))
                            out_rows.append({"size": size, "cf": cf, "dtype": name, "codec": codec, "kernel": label,
                                             "batch": batch, "us": us, "GBps": out.numel() * dtype.itemsize / us / 1e3,
                                             "diff": diff})  # fmt: skip
    finally:
        fused_cuda._kernel_module = saved
    return out_rows


def format_rows(result: list[dict]) -> str:
    """Markdown: one line per size, CF, dtype and kernel; v1 and v2 µs and GB/s, v2/v1."""
    lines = ["| size | CF | dtype | kernel | v1 µs | v2 µs | v1 GB/s | v2 GB/s | v2/v1 |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    pairs: dict = {}
    for r in result:
        pairs.setdefault((r["size"], r["cf"], r["dtype"], r["kernel"]), {})[r["codec"]] = r
    for (size, cf, dtype, kernel), p in pairs.items():
        if "v1" not in p or "v2" not in p:
            continue
        v1, v2 = p["v1"], p["v2"]
        lines.append(f"| {size}² | {cf} | {dtype} | {kernel} | {v1['us']:.1f} | {v2['us']:.1f} | {v1['GBps']:.0f} | "
                     f"{v2['GBps']:.0f} | {v2['GBps'] / v1['GBps']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks kernel-alone", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--cf", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    parser.add_argument("--kernel", action="append", default=[], metavar="LABEL=PATH[:plain]",
                        help="a kernel module to time (repeatable); default: this checkout's")  # fmt: skip
    parser.add_argument("--calls", type=int, default=20, help="launches captured in the graph")
    parser.add_argument("--repeat", type=int, default=10, help="graph replays (best is kept)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    specs = [parse_kernel(k) for k in args.kernel]  # checked before the CUDA test: a typo fails everywhere
    reason = skip_reason("cuda")
    if reason:
        print(f"kernel-alone: skipped ({reason})")
        return 0
    if not specs:
        specs = [("current", os.path.join(os.path.dirname(fused_cuda.__file__), "_triton_synth.py"), False)]
    kernels = [(label, load_kernel(label, path), plain) for label, path, plain in specs]
    result = rows(kernels, args.sizes, args.cf, args.dtypes, args.calls, args.repeat)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; the fused kernel alone (CUDA graph of "
          f"{args.calls} launches, best of {args.repeat} replays); int8 coefficients, about 64 MB of output a "
          "batch")  # fmt: skip
    print(format_rows(result))
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "argv": argv,
                              "rows": result})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
