"""GPU layer benchmark (issue 28): the fused CUDA decode against the portable graph, and nvCOMP's zstd decode.

Two tables, printed as Markdown and written to `--out` as JSON:
- decode: `Decompress` GB/s of output, v1 and v2 codecs (those of `python -m benchmarks gpu`'s decode table: int8
  coefficients; v2 = dead zone, reconstruction offsets and a per-sample (range, mid)), each through the portable
  graph ("eager": the Triton kernel off) and the fused Triton kernel ("fused"), at every size x CF x output dtype,
  batches of about 64 MB of output, best of --repeat runs of 50 queued calls timed with CUDA events after 50 ms of
  warm-up calls. Also: the kernel's first call (its compile), and the largest difference fused vs eager relative to
  the output's range.
- nvcomp: `dctdata.stages.nvcomp_zstd.decode_batch` on zstd-19 frames (int8 Laplacian values, like coefficients) per
  call: 64 KiB samples as one frame each, 32 / 64 / 256 / 1,024 per call; the same with nvCOMP's allocations
  taken from torch's caching allocator; unaligned streams (copied to aligned ones first); and 1 MiB samples as
  one frame or as 16 frames of 64 KiB. Per row: ms per call with --calls calls queued and one synchronization
  (device throughput), ms per call when each call is checked (status read back: latency), host ms per call,
  samples/s and GB/s of decoded bytes; every decode is compared byte for byte with the source.

Run from the repository root on a CUDA machine (about a minute on an H200; without CUDA it prints one line):
    python -m benchmarks gpu-layer --out gpu_layer.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's dctdata

from benchmarks.gpu import QUEUED_CALLS, _seconds, v1_spec, v2_spec, wire  # the gpu table's codecs, timing
from dctdata.codec.spec import CodecSpec
from dctdata.decoder import fused_cuda
from dctdata.decoder.layer import Decompress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BATCH_BYTES = 64 << 20


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def best_seconds(fn, repeat: int, dev: torch.device) -> float:
    """Best time of one call of `fn`: the gpu table's timing (`QUEUED_CALLS` calls between two CUDA events after
    warm-up calls, the device's rate; the wall clock off CUDA)."""
    return _seconds(fn, dev, repeat, calls=QUEUED_CALLS)


def measure(spec: CodecSpec, dtype: torch.dtype, batch: int, repeat: int, dev: torch.device, calls: list) -> dict:
    """Seconds per batch of one codec through the portable graph and the fused kernel (`calls` counts the
    kernel's calls), the kernel's first call, and how far apart the two outputs are."""
    layer = Decompress(spec, dtype=dtype).to(device=dev, dtype=dtype)
    x = wire(spec, batch, dev)
    res = {}
    with torch.inference_mode():
        fused_cuda.ENABLED = False
        res["eager_s"] = best_seconds(lambda: layer(x), repeat, dev)
        eager = layer(x).float()
        fused_cuda.ENABLED = True
        calls.clear()
        t0 = time.perf_counter()
        out = layer(x)
        sync(dev)
        res["first_call_s"] = time.perf_counter() - t0
        res["fused_ran"] = bool(calls) and fused_cuda.broken() is None
        if res["fused_ran"]:
            res["fused_s"] = best_seconds(lambda: layer(x), repeat, dev)
            res["max_rel_diff"] = float((out.float() - eager).abs().max()) / (float(eager.abs().max()) or 1.0)
        else:
            res["error"] = fused_cuda.broken() or "the fused kernel did not run"
    return res


def decode_rows(sizes, cfs, dtypes, repeat: int, dev: torch.device, batch_bytes: int = BATCH_BYTES) -> list[dict]:
    """One row per size x CF x dtype: GB/s of v1 and v2, eager and fused."""
    rows = []
    calls: list = []
    real = fused_cuda.synthesize
    fused_cuda.synthesize = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        for size in sizes:
            for cf in cfs:
                for name in dtypes:
                    item = torch.empty((), dtype=DTYPES[name]).element_size()
                    batch = max(1, batch_bytes // (size * size * item))
                    row = {"size": size, "cf": cf, "dtype": name, "batch": batch}
                    for codec, make in (("v1", v1_spec), ("v2", v2_spec)):
                        res = measure(make(cf, size), DTYPES[name], batch, repeat, dev, calls)
                        for path in ("eager", "fused"):
                            if f"{path}_s" in res:
                                res[f"{path}_GBps"] = batch * size * size * item / res[f"{path}_s"] / 1e9
                        row.update({f"{codec}_{k}": v for k, v in res.items()})
                    rows.append(row)
                    print(format_decode_rows([row], header=len(rows) == 1), flush=True)
    finally:
        fused_cuda.synthesize = real
        fused_cuda.ENABLED = True
    return rows


def _num(r: dict, key: str) -> str:
    return f"{r[key]:.1f}" if key in r else "-"


def _ratio(r: dict, a: str, b: str) -> str:
    return f"{r[a] / r[b]:.2f}x" if a in r and b in r else "-"


def _diff(r: dict, codec: str) -> str:
    key = f"{codec}_max_rel_diff"
    return f"{r[key]:.1e}" if key in r else str(r.get(f"{codec}_error", "-"))


def format_decode_rows(rows, header: bool = True) -> str:
    lines = []
    if header:
        lines += [
            "| size | CF | dtype | batch | v1 eager GB/s | v1 fused GB/s | v2 eager GB/s | v2 fused GB/s | "
            "v2 fused / v1 eager | v2 fused / v1 fused | first fused call s (v1, v2) | max rel diff (v1, v2) |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
    for r in rows:
        lines.append(
            f"| {r['size']}² | {r['cf']} | {r['dtype']} | {r['batch']} | {_num(r, 'v1_eager_GBps')} | "
            f"{_num(r, 'v1_fused_GBps')} | {_num(r, 'v2_eager_GBps')} | {_num(r, 'v2_fused_GBps')} | "
            f"{_ratio(r, 'v2_fused_GBps', 'v1_eager_GBps')} | {_ratio(r, 'v2_fused_GBps', 'v1_fused_GBps')} | "
            f"{r['v1_first_call_s']:.2f}, {r['v2_first_call_s']:.2f} | {_diff(r, 'v1')}, {_diff(r, 'v2')} |"
        )
    return "\n".join(lines)


# --- nvCOMP ------------------------------------------------------------------------------------------------


def laplacian(nbytes: int, seed: int) -> bytes:
    """int8 Laplacian values (about 2.3x under zstd-19, like packed int8 coefficients)."""
    return np.random.default_rng(seed).laplace(0, 6, nbytes).clip(-127, 127).astype(np.int8).tobytes()


def collate(streams: list[bytes], align: int):
    """One host buffer of the streams (each at a multiple of `align`), its (N+1) offsets and frame bounds."""
    starts, ends, at, parts = [], [], 0, []
    for s in streams:
        pad = -at % align
        parts.append(bytes(pad) + s)
        starts.append(at + pad)
        at += pad + len(s)
        ends.append(at)
    return np.frombuffer(b"".join(parts), np.uint8), np.array([*starts, at]), np.array(starts), np.array(ends)


def padded_frames(zf, host: np.ndarray, starts, ends):
    """The frame table of streams placed at `starts` with padding between them (each walked and checked)."""
    cols = [], [], [], []
    for i, (s, e) in enumerate(zip(starts, ends)):
        for f in zf.walk(host[s:e], f"sample {i}"):
            for col, v in zip(cols, (s + f.start, s + f.end, f.size, i)):
                col.append(v)
    return zf.FrameTable(*(np.asarray(c, dtype=np.int64) for c in cols))


def nvcomp_case(nz, zf, dev, name, streams, raws, sample_bytes, frames_per_sample, calls, align=8, torch_alloc=False):
    """Time decode_batch on one collated batch of `streams` (each sample's stream: frames_per_sample frames)."""
    host, offsets, starts, ends = collate(streams, align)
    if align > 1:
        frames = padded_frames(zf, host, starts, ends)
    elif frames_per_sample > 1:
        frames = zf.frame_table(host, offsets, sample_bytes)
    else:
        frames = None  # plain offsets: the decoder realigns the streams on the device first
    data = torch.from_numpy(host.copy()).to(dev)
    expected = torch.from_numpy(np.frombuffer(b"".join(raws), np.int8).copy()).to(dev)
    n = len(streams)
    row = {"case": name, "samples": n, "frames": n * frames_per_sample, "sample_bytes": sample_bytes,
           "stored_bytes": int(sum(len(s) for s in streams)), "torch_allocator": torch_alloc}  # fmt: skip
    decode = lambda: nz.decode_batch(data, offsets, (sample_bytes,), torch.int8, frames)  # noqa: E731
    if torch_alloc:
        nz.use_torch_allocator(True)
    try:
        t0 = time.perf_counter()
        values, status = decode()
        status.check()
        row["first_call_ms"] = 1e3 * (time.perf_counter() - t0)
        row["bit_exact"] = bool(torch.equal(values.reshape(-1), expected))
        sync(dev)
        t0 = time.perf_counter()
        pending = [decode() for _ in range(calls)]
        host_s = time.perf_counter() - t0
        sync(dev)
        queued_s = time.perf_counter() - t0
        for _, s in pending:
            s.check()
        row["bit_exact"] &= bool(torch.equal(pending[-1][0].reshape(-1), expected))
        del pending
        t0 = time.perf_counter()
        for _ in range(calls):
            decode()[1].check()
        checked_s = time.perf_counter() - t0
    finally:
        if torch_alloc:
            nz.use_torch_allocator(False)
    row["queued_ms_per_call"] = 1e3 * queued_s / calls
    row["host_ms_per_call"] = 1e3 * host_s / calls
    row["checked_ms_per_call"] = 1e3 * checked_s / calls
    row["samples_per_s"] = n / (queued_s / calls)
    row["GBps"] = n * sample_bytes / (queued_s / calls) / 1e9
    return row


def nvcomp_rows(frame_counts, calls: int, dev: torch.device, small: int = 64 << 10, big: int = 1 << 20):
    """Rows of the nvCOMP table and the library's facts; `small` and `big` are the sample sizes (tests shrink)."""
    import zstandard

    from dctdata.stages import nvcomp_zstd as nz
    from dctdata.stages import zstd_frames as zf

    nv = nz.nvcomp()  # MissingExtraError names the extra
    meta = {"nvcomp": getattr(nv, "__version__", "?")}
    try:
        codec = nv.Codec(algorithm="Zstd", bitstream_kind=nv.BitstreamKind.RAW)
        meta["alignment"] = codec.get_required_decompression_alignment()
    except Exception as exc:  # a fact for the report, not a reason to stop
        meta["alignment"] = f"unknown ({type(exc).__name__}: {exc})"
    pool = ThreadPoolExecutor(os.cpu_count() or 4)
    raws = list(pool.map(lambda s: laplacian(small, s), range(128)))
    one = list(pool.map(lambda r: zstandard.ZstdCompressor(level=19).compress(r), raws))
    rows = []

    def run(*args, **kwargs):
        try:
            row = nvcomp_case(nz, zf, dev, *args, **kwargs)
        except Exception as exc:  # report the row's failure and go on
            row = {"case": args[0], "samples": len(args[1]), "error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        print(format_nvcomp_rows([row], header=len(rows) == 1), flush=True)

    tile = lambda items, n: [items[i % len(items)] for i in range(n)]  # noqa: E731
    kib = size_label(small)
    for n in frame_counts:
        run(f"{kib} samples, 1 frame each", tile(one, n), tile(raws, n), small, 1, calls)
    for n in (32, 256):
        run(f"{kib}, torch allocator", tile(one, n), tile(raws, n), small, 1, calls, torch_alloc=True)
    run(f"{kib}, unaligned streams", tile(one, 256), tile(raws, 256), small, 1, calls, align=1)
    pieces = big // small
    raws_big = list(pool.map(lambda s: laplacian(big, 1000 + s), range(16)))
    single = list(pool.map(lambda r: zstandard.ZstdCompressor(level=19).compress(r), raws_big))
    multi = list(pool.map(lambda r: zf.encode_frames(r, 19, small), raws_big))
    for n in (2, 4, 16, 64):
        run(f"{size_label(big)} samples, 1 frame each", tile(single, n), tile(raws_big, n), big, 1, calls)
        label = f"{size_label(big)} samples, {pieces} frames of {kib}"
        run(label, tile(multi, n), tile(raws_big, n), big, pieces, calls)
    pool.shutdown()
    return rows, meta


def size_label(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_nvcomp_rows(rows, header: bool = True) -> str:
    lines = []
    if header:
        lines += [
            "| case | samples | frames | ms/call queued | ms/call checked | host ms/call | first call ms | "
            "samples/s | GB/s decoded | bit-exact |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['samples']} | - | error: {r['error']} | | | | | | |")
            continue
        lines.append(
            f"| {r['case']} | {r['samples']} | {r['frames']} | {r['queued_ms_per_call']:.3f} | "
            f"{r['checked_ms_per_call']:.3f} | {r['host_ms_per_call']:.3f} | {r['first_call_ms']:.1f} | "
            f"{r['samples_per_s']:,.0f} | {r['GBps']:.1f} | {'yes' if r['bit_exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks gpu-layer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048], help="square sample sides")
    p.add_argument("--cf", type=int, nargs="+", default=[2, 4, 6, 8], help="chop factors")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=sorted(DTYPES))
    p.add_argument("--repeat", type=int, default=20, help="timed calls per decode measurement (best is kept)")
    p.add_argument("--frames", type=int, nargs="+", default=[32, 64, 256, 1024], help="64 KiB frames per call")
    p.add_argument("--calls", type=int, default=20, help="nvCOMP calls per measurement")
    p.add_argument("--skip-decode", action="store_true", help="only the nvCOMP table")
    p.add_argument("--skip-nvcomp", action="store_true", help="only the decode table")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    started = time.perf_counter()
    result: dict = {"argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__}
    if not torch.cuda.is_available():
        print("gpu_layer: skipped: no CUDA device (torch.cuda.is_available() is False)")
        result["skipped"] = "no CUDA device"
    else:
        dev = torch.device("cuda")
        result["device"] = torch.cuda.get_device_name(dev)
        try:
            import triton

            result["triton"] = triton.__version__
        except ImportError:
            result["triton"] = None
        print(f"{result['device']}; torch {torch.__version__}; triton {result['triton']}")
        if not args.skip_decode:
            print(f"\nDecompress, int8 coefficients in, batches of about {BATCH_BYTES >> 20} MB of output")
            result["decode"] = decode_rows(args.sizes, args.cf, args.dtypes, args.repeat, dev)
        if not args.skip_nvcomp:
            print(
                f"\nnvCOMP zstd (dctdata.stages.nvcomp_zstd.decode_batch), zstd-19 frames, {args.calls} calls per row"
            )
            try:
                result["nvcomp"], meta = nvcomp_rows(args.frames, args.calls, dev)
                result.update(meta)
                print(f"nvCOMP {meta['nvcomp']}, required decompression alignment {meta['alignment']} bytes")
            except ImportError as exc:  # MissingExtraError
                print(f"nvCOMP rows skipped: {exc}")
                result["nvcomp_skipped"] = str(exc)
    result["seconds"] = time.perf_counter() - started
    print(f"\n{result['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
