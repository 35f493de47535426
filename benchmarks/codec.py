"""`python -m benchmarks codec`: decode throughput of the DCT+Chop core on this CPU.

Reports, per thread count, image size and CF, decode time as a ratio to copying the same output
bytes into a preallocated buffer, twice: with outputs that stay in the CPU caches, and with outputs
of at least 64 MB that do not (there the copy runs at memory bandwidth), so each ratio means the
same on every machine. Out of cache it times decode twice: into a fresh output (it pays for fresh
pages, as a loader that allocates each batch does) and into a reused buffer (`Decompress(..., out=)`).
Also against the paper's dense block-diagonal formulation LHS . A . RHS (O(N^3) per image). The kernel
column says which CPU kernel `Decompress` took: the fused C one (`dctdata.decoder.fused`, a batch split over the
threads) where the CPU has AVX2, the torch kernels elsewhere.
"""

from __future__ import annotations

import time

import torch

from dctdata.codec.spec import CodecSpec
from dctdata.codec.transform import BLOCK, dct_matrix
from dctdata.decoder import fused
from dctdata.decoder.layer import Decompress


def paper_dense_operators(height: int, width: int, cf: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's block-diagonal chopped-DCT operators: LHS (cf*Hb x H) and RHS (W x cf*Wb).

    Compression is A = LHS . X . RHS; decompression X = LHS^T . A . RHS^T. A is block-interleaved
    (each 8x8 block's cf x cf corner side by side).
    """
    t = dct_matrix(torch.float32)[:cf]  # (cf, 8)
    lhs = torch.block_diag(*([t] * (height // BLOCK)))
    rhs = torch.block_diag(*([t] * (width // BLOCK))).T
    return lhs, rhs


def _time(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


IN_CACHE_BYTES = 2 << 20  # decoded output per call that stays in the CPU caches (at least one image)
OUT_OF_CACHE_BYTES = 64 << 20  # decoded output per call well past any CPU cache


def _decode_vs_copy(layer: Decompress, batch: int, spec: CodecSpec, repeat: int) -> tuple[float, float, float]:
    """Seconds for one batch: decode into a fresh output, decode into a reused `out=` buffer, and copy the
    same output bytes into a preallocated buffer."""
    coeffs = torch.randn(batch, *spec.coeff_shape)
    src = torch.randn(batch, spec.channels, spec.height, spec.width)
    dst = torch.empty_like(src)
    with torch.inference_mode():
        t_dec = _time(lambda: layer(coeffs), repeat)
        t_out = _time(lambda: layer(coeffs, out=dst), repeat)
        t_copy = _time(lambda: dst.copy_(src), repeat)
    return t_dec, t_out, t_copy


def run_codec_bench(sizes=(256, 1024), cfs=(2, 4, 6, 8), paper_sizes=(512, 1024), repeat=10, threads=(1,)):
    """Rows of dicts per (threads, size, cf): decode time and GB/s of decoded float32, and its ratio to
    copying the same bytes, both with outputs that stay in cache (`IN_CACHE_BYTES`, at least one image)
    and with outputs of at least `OUT_OF_CACHE_BYTES` (fresh output memory each call, as a loader
    sees it) and into a reused `out=` buffer; plus the ratio to the paper's dense formulation where
    `size` is in `paper_sizes`."""
    rows = []
    previous = torch.get_num_threads()
    try:
        for n_threads in threads:
            torch.set_num_threads(n_threads)
            for size in sorted(set(sizes) | set(paper_sizes)):
                image = size * size * 4
                small, big = max(1, IN_CACHE_BYTES // image), -(-OUT_OF_CACHE_BYTES // image)
                for cf in cfs:
                    spec = CodecSpec(cf=cf, height=size, width=size)
                    layer = Decompress(spec)
                    t_dec, _, t_copy = _decode_vs_copy(layer, small, spec, repeat)
                    t_big, t_big_out, t_big_copy = _decode_vs_copy(layer, big, spec, max(2, repeat // 3))
                    probe = torch.zeros(1, *spec.coeff_shape)
                    kernel = f"fused ({fused.vector_isa()})" if fused.usable(probe, torch.float32, None) else "torch"
                    row = {
                        "threads": n_threads,
                        "kernel": kernel,
                        "size": size,
                        "cf": cf,
                        "batch": small,
                        "decode_ms": 1e3 * t_dec / small,
                        "decode_GBps": small * image / t_dec / 1e9,
                        "x_copy": t_dec / t_copy,
                        "big_batch": big,
                        "big_MB": big * image / 1e6,
                        "big_decode_GBps": big * image / t_big / 1e9,
                        "x_copy_big": t_big / t_big_copy,
                        "x_copy_big_out": t_big_out / t_big_copy,
                        "paper_ms": None,
                        "speedup_vs_paper": None,
                    }
                    if size in paper_sizes:
                        lhs, rhs = paper_dense_operators(size, size, cf)
                        a = torch.randn(small, cf * size // BLOCK, cf * size // BLOCK)
                        lt, rt = lhs.T.contiguous(), rhs.T.contiguous()
                        with torch.inference_mode():
                            t_paper = _time(
                                lambda lt=lt, a=a, rt=rt: torch.matmul(torch.matmul(lt, a), rt), max(2, repeat // 3)
                            )
                        row["paper_ms"] = 1e3 * t_paper / small
                        row["speedup_vs_paper"] = t_paper / t_dec
                    rows.append(row)
    finally:
        torch.set_num_threads(previous)
    return rows


def format_rows(rows) -> str:
    head = (
        "| threads | size | CF | batch | decode ms/img | GB/s out | x copy (in cache) | batch >= 64 MB "
        "| GB/s out | x copy (out of cache) | x copy (out of cache, out=) | paper ms/img | speedup vs paper | kernel |"
    )
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        paper = "-" if r["paper_ms"] is None else f"{r['paper_ms']:.2f}"
        speed = "-" if r["speedup_vs_paper"] is None else f"{r['speedup_vs_paper']:.1f}x"
        lines.append(
            f"| {r['threads']} | {r['size']}² | {r['cf']} | {r['batch']} | {r['decode_ms']:.3f} | "
            f"{r['decode_GBps']:.2f} | {r['x_copy']:.1f}x | {r['big_batch']} ({r['big_MB']:.0f} MB) | "
            f"{r['big_decode_GBps']:.2f} | {r['x_copy_big']:.1f}x | {r['x_copy_big_out']:.1f}x | {paper} | {speed} | "
            f"{r['kernel']} |"
        )
    return "\n".join(lines)
