r"""GPU decode of the entropy stage (dctdata.entropy.device): batches of 256x256 samples on a CUDA device.

Packs the synthetic set `python -m benchmarks gpu` uses (`benchmarks.loader.synthetic`: noisy micrographs, float32
0..255) with the default settings at `--target-psnr 40` (int8 coefficients, the context-modelled entropy coder,
config version 3: each 256x256 sample is segments of `segment` coefficients, 8 of 8192 by default), takes each
sample's stream (the encoder is deterministic: the bytes the pack stores), and on the GPU:
- decodes every sample once and checks it bit for bit against the CPU decoder;
- times batches (default 32 and 256 samples; the streams repeat when the batch is larger than the set) with
  CUDA events after a warm-up, in several stream layouts of the same model: mode 3 with each `--segment` length
  (default: what packs write now, SEGMENT, and what the first version 3 packs wrote, SEGMENT_V3 = 16384) and
  the version 2 streams (mode 2: one half-warp a sample), to show what the segments buy;
- decodes hostile streams (truncations, flipped bytes, declared shapes too large): each must fail exactly when
  the CPU decoder fails, never crash or read out of bounds.
It prints a Markdown table and writes JSON to `--out`. On the CPU (`--device cpu`) it runs the lane emulator
instead (the same results; the timings are not the GPU's): the tests run it that way.

    python -m benchmarks gpu-ctxrans --out gpu_ctxrans.json                       # ~1 min on an H200
    python -m benchmarks gpu-ctxrans --segment 16384 8192 4096 2048 --out sweep.json  # batch time per length
    python -m benchmarks gpu-ctxrans --quick --device cpu --out /tmp/q.json       # no GPU: the script's checks

Under compute-sanitizer (a few samples, each hostile stream decoded alone in a buffer of exactly its bytes, the
caching allocator off so that each tensor is its own allocation); compute-sanitizer comes with the CUDA toolkit
or the `nvidia-cuda-sanitizer-api` wheel (nvidia/cu13/bin/compute-sanitizer):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
        python -m benchmarks gpu-ctxrans --quick --out /tmp/gpu_ctxrans_quick.json
    (also --tool racecheck and --tool synccheck: shared-memory races, warp-synchronous misuse)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

import dctdata
from benchmarks.segment_cost import segments_of
from dctdata.entropy import device as gpu
from dctdata.entropy.ctxrans import SEGMENT, SEGMENT_V3, CtxCodec, CtxCodecError
from dctdata.stages import CtxransStage, get_stage


def pack_streams(n: int, size: int, target_psnr: float, workdir: str) -> tuple[CtxCodec, np.ndarray]:
    """The synthetic set packed by the product: (its dct field's entropy codec, its coefficients (n, C, Hb, K, Wb))."""
    from benchmarks.loader import synthetic

    src = os.path.join(workdir, "x.npy")
    np.save(src, synthetic(n, size))
    out = os.path.join(workdir, "pack")
    dctdata.pack(src, out, quant="int8", target_psnr=target_psnr, quiet=True)
    ds = dctdata.open_dataset(out)
    field = next(f for f in ds.manifest.fields if f.codec is not None)
    q = ds.reader.read(field, 0, ds.manifest.samples)
    stage = get_stage(field.lossless)
    if isinstance(stage, CtxransStage):
        codec = stage.codec
    else:  # the pack preferred zstd for this set: the entropy coder fitted as the pack would have
        codec = CtxCodec.fit(q, field.codec.cf, field.codec.mask)
    return codec, np.ascontiguousarray(q)


def as_batch(bufs: list[bytes], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Streams back to back in one uint8 buffer on `dev` (through pinned memory on CUDA), and N + 1 offsets."""
    offsets = torch.zeros(len(bufs) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(b) for b in bufs], dtype=torch.int64), 0)
    host = torch.frombuffer(bytearray(b"".join(bufs)), dtype=torch.uint8) if bufs else torch.zeros(0, torch.uint8)
    if dev.type == "cuda":
        host = host.pin_memory()
    return host.to(dev, non_blocking=True), offsets.to(dev, non_blocking=True)


def timed(fn, dev: torch.device, repeat: int) -> list[float]:
    """Milliseconds of `repeat` calls of fn (CUDA events on CUDA), after two warm-up calls."""
    for _ in range(2):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    times = []
    for _ in range(repeat):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return times


def cpu_outcome(codec: CtxCodec, buf: bytes, shape, dtype) -> np.ndarray | None:
    try:
        return codec.decode(buf, (1, *shape), dtype)[0]
    except CtxCodecError:
        return None


def hostile_streams(bufs: list[bytes], rng: np.random.Generator, count: int) -> list[bytes]:
    """Truncations at spread-out points and byte flips of the given streams."""
    out = []
    for k in range(count):
        b = bytearray(bufs[k % len(bufs)])
        if k % 2 == 0:
            out.append(bytes(b[: int(rng.integers(0, len(b)))]))
        else:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
            out.append(bytes(b))
    return out


def check_hostile(codec, bufs, shape, dtype, dev, alone: bool) -> dict[str, int]:
    """Each stream's status against the CPU decoder: fails exactly when the CPU fails, decodes to the CPU's array
    otherwise. alone: one decode per stream, in a buffer of exactly its bytes (for compute-sanitizer)."""
    agree = failed = 0
    groups = [[b] for b in bufs] if alone else [bufs]
    for group in groups:
        out, status = gpu.decode_batch(codec, *as_batch(group, dev), shape, dtype)
        out, status = out.cpu().numpy(), status.cpu().numpy()
        for i, b in enumerate(group):
            want = cpu_outcome(codec, b, shape, dtype)
            ok = (status[i] != 0 and want is None and not out[i].any()) or (
                status[i] == 0 and want is not None and np.array_equal(out[i], want)
            )
            agree += ok
            failed += int(status[i] != 0)
    return {"streams": len(bufs), "agree_with_cpu": agree, "failed": failed}


def plan_sweep(codec, buffer, offsets, shape, dtype, dev, repeat: int, first) -> list[dict]:
    """The batch timed under each launch plan the device allows (units a block 1, 2, 4, 8; the model and the
    row buffers in shared memory or not), each checked against the chosen plan's first sample: what
    `plan_launch`'s choice costs against the others on this GPU."""
    info = gpu.launch_info(codec, shape, 1, dev)
    chosen = gpu.plan_launch
    rows = []
    try:
        for smem_tables in (True, False):
            for smem_rows in (True, False):
                for upb in (1, 2, 4, 8):

                    def forced(units, blob, K, Wb, *_, t=smem_tables, r=smem_rows, u=upb):
                        return gpu.make_plan(units, blob, K, Wb, u, t, r)

                    plan = forced(offsets.numel() - 1, info["model_bytes"], shape[2], shape[3])
                    if plan.smem_bytes > gpu._device(dev.index or 0).smem_block:
                        continue
                    gpu.plan_launch = forced
                    out, status = gpu.decode_batch(codec, buffer, offsets, shape, dtype)
                    exact = bool((status.cpu() == 0).all()) and torch.equal(out.cpu()[0], first)
                    ms = timed(lambda: gpu.decode_batch(codec, buffer, offsets, shape, dtype), dev, repeat)
                    rows.append({"units_per_block": upb, "smem_tables": smem_tables, "smem_rows": smem_rows,
                                 "ms_median": statistics.median(ms), "bit_exact": exact})  # fmt: skip
    finally:
        gpu.plan_launch = chosen
    return rows


def run(a: argparse.Namespace) -> dict[str, Any]:
    dev = torch.device(a.device)
    n = 4 if a.quick else a.samples
    batches = [4] if a.quick else a.batches
    repeat = 2 if a.quick else a.repeat
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"lane emulator ({platform.machine()})",
        "torch": torch.__version__,
        "args": vars(a),
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        codec, q = pack_streams(n, a.size, a.target_psnr, tmp)
        result["pack_s"] = time.perf_counter() - t0
    shape, dtype = q.shape[1:], q.dtype
    bound = codec.segment_bytes if a.segment_bytes is None else a.segment_bytes
    layouts = {f"mode 3, segment {s}": codec.with_streams(version=3, segment=s, segment_bytes=bound) for s in a.segment}
    layouts["mode 2 (one unit a sample)"] = codec.with_streams(version=2)
    result["pack_segment"], result["segment_bytes"] = codec.segment, bound
    result["sample_shape"], result["dtype"] = list(shape), str(dtype)
    result["bit_exact"] = True
    for name, c in layouts.items():
        bufs = [c.encode(q[i : i + 1]) for i in range(n)]
        mode = bufs[0][0]
        t0 = time.perf_counter()
        out, status = gpu.decode_batch(c, *as_batch(bufs, dev), shape, dtype)  # compiles and uploads once
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        first_s = time.perf_counter() - t0
        exact = bool((status.cpu() == 0).all()) and np.array_equal(out.cpu().numpy(), q)
        exact = exact and all(np.array_equal(c.decode(b, (1, *shape), dtype)[0], q[i]) for i, b in enumerate(bufs[:8]))
        result["bit_exact"] &= exact
        for size in batches:
            batch_bufs = [bufs[i % n] for i in range(size)]
            buffer, offsets = as_batch(batch_bufs, dev)
            cpu_out = np.empty((size, 1, *shape), dtype)
            ms = timed(lambda c=c, b=buffer, o=offsets: gpu.decode_batch(c, b, o, shape, dtype), dev, repeat)
            cpu_ms = timed(
                lambda c=c, b=batch_bufs, o=cpu_out: c.decode_many(b, o), torch.device("cpu"), max(1, min(repeat, 5))
            )
            row = {
                "layout": name,
                "mode": int(mode),
                "segment": c.segment if c.version >= 3 else None,
                "units_per_sample": gpu.units_per_sample(c, shape),
                "segments_per_sample": sum(map(segments_of, batch_bufs)) / size,
                "batch": size,
                "bytes_per_sample": sum(len(b) for b in batch_bufs) / size,
                "ms_median": statistics.median(ms),
                "ms_min": min(ms),
                "samples_per_s": size / (statistics.median(ms) / 1e3),
                "output_GBps": size * q[0].nbytes / (statistics.median(ms) / 1e3) / 1e9,
                "cpu_1thread_ms": statistics.median(cpu_ms),
                "first_call_s": first_s,
                "bit_exact": exact,
            }
            if dev.type == "cuda":
                row["launch"] = gpu.launch_info(c, shape, size, dev)
                if a.plans:
                    row["plans"] = plan_sweep(c, buffer, offsets, shape, dtype, dev, repeat, out.cpu()[0])
            result["rows"].append(row)
    rng = np.random.default_rng(0)
    bufs = [codec.encode(q[i : i + 1]) for i in range(n)]
    hostile = hostile_streams(bufs, rng, 40 if a.quick else 200)
    result["hostile"] = check_hostile(codec, hostile, shape, dtype, dev, alone=a.quick)
    # 2 and 3 bytes cannot hold 2^20 coefficients (at most 2^19 + 2^14 a byte): refused before decoding
    big = (shape[0], shape[1] * 4, shape[2], shape[3] * 4)
    _, status = gpu.decode_batch(codec, *as_batch([bufs[0][:2], bufs[1 % n][:3]], dev), big, dtype)
    h = result["hostile"]
    h["oversized_refused"] = int((status.cpu() == 2).sum())
    result["hostile_ok"] = h["agree_with_cpu"] == h["streams"] and h["oversized_refused"] == 2
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Device: {result['device']}; samples {tuple(result['sample_shape'])} {result['dtype']}; "
        f"bit-exact: {result['bit_exact']}; hostile streams agree with the CPU: {result['hostile_ok']} "
        f"({result['hostile']['agree_with_cpu']}/{result['hostile']['streams']})",
        "",
        "| layout | segments a sample | units a sample | batch | B/sample | ms/batch (median) | ms (min) | samples/s "
        "| output GB/s | CPU 1 thread ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['layout']} | {r['segments_per_sample']:g} | {r['units_per_sample']} | {r['batch']} | "
            f"{r['bytes_per_sample']:.0f} | {r['ms_median']:.3f} | {r['ms_min']:.3f} | {r['samples_per_s']:.0f} | "
            f"{r['output_GBps']:.1f} | {r['cpu_1thread_ms']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks gpu-ctxrans",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--samples", type=int, default=64, help="distinct samples packed (default 64)")
    p.add_argument("--size", type=int, default=256, help="sample height and width (default 256)")
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    p.add_argument("--repeat", type=int, default=50, help="timed decodes per batch size (default 50)")
    p.add_argument(
        "--segment",
        type=int,
        nargs="+",
        default=sorted({SEGMENT, SEGMENT_V3}),
        help=f"coefficients per segment of the mode 3 rows, one row per length and batch (default: {SEGMENT}, what "
        f"packs write now, and {SEGMENT_V3}, what the first version 3 packs wrote)",
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        help="stream bytes per segment beyond the first version 3 count, for the mode 3 rows (default: the pack's; "
        "0: segments by coefficients alone)",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--plans", action="store_true", help="also time every launch plan the device allows (CUDA)")
    p.add_argument("--quick", action="store_true", help="4 samples, each hostile stream alone: for compute-sanitizer")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_ctxrans: no CUDA device (torch.cuda.is_available() is False); --device cpu runs the emulator")
        return {}
    result = run(a)
    print(table(result))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)
    if not (result["bit_exact"] and result["hostile_ok"]):
        print("gpu_ctxrans: FAILED (see bit_exact / hostile above)", file=sys.stderr)
        sys.exit(1)
    return result


if __name__ == "__main__":
    main()
