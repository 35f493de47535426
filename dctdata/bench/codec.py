"""`dctdata bench codec`: decode throughput of the DCT+Chop core on this CPU.

Reports, per image size and CF, single-thread decode time as a ratio to copying the output into a
preallocated buffer (the memory-bandwidth floor), and against the paper's dense block-diagonal
formulation LHS . A . RHS (O(N^3) per image).
"""

from __future__ import annotations

import time

import torch

from dctdata.layer import Decompress
from dctdata.spec import CodecSpec
from dctdata.transform import BLOCK, dct_matrix


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


def run_codec_bench(
    sizes=(256, 1024), cfs=(2, 4, 6, 8), paper_sizes=(512, 1024), batch_pixels=2**21, repeat=10, threads=1
):
    """Rows of dicts: size, cf, batch, decode ms, GB/s of decoded float32, ratio to copy, ratio to paper."""
    torch.set_num_threads(threads)
    rows = []
    for size in sorted(set(sizes) | set(paper_sizes)):
        batch = max(1, batch_pixels // (size * size))
        for cf in cfs:
            spec = CodecSpec(cf=cf, height=size, width=size)
            layer = Decompress(spec)
            coeffs = torch.randn(batch, *spec.coeff_shape)
            src = torch.randn(batch, 1, size, size)
            dst = torch.empty_like(src)
            with torch.inference_mode():
                t_dec = _time(lambda layer=layer, coeffs=coeffs: layer(coeffs), repeat)
                t_copy = _time(lambda dst=dst, src=src: dst.copy_(src), repeat)
                row = {
                    "size": size,
                    "cf": cf,
                    "batch": batch,
                    "decode_ms": 1e3 * t_dec / batch,
                    "decode_GBps": src.numel() * 4 / t_dec / 1e9,
                    "x_copy": t_dec / t_copy,
                    "paper_ms": None,
                    "speedup_vs_paper": None,
                }
                if size in paper_sizes:
                    lhs, rhs = paper_dense_operators(size, size, cf)
                    a = torch.randn(batch, cf * size // BLOCK, cf * size // BLOCK)
                    lt, rt = lhs.T.contiguous(), rhs.T.contiguous()
                    t_paper = _time(
                        lambda lt=lt, a=a, rt=rt: torch.matmul(torch.matmul(lt, a), rt), max(2, repeat // 3)
                    )
                    row["paper_ms"] = 1e3 * t_paper / batch
                    row["speedup_vs_paper"] = t_paper / t_dec
            rows.append(row)
    return rows


def format_rows(rows) -> str:
    head = "| size | CF | batch | decode ms/img | GB/s out | x copy | paper ms/img | speedup vs paper |"
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        paper = "-" if r["paper_ms"] is None else f"{r['paper_ms']:.2f}"
        speed = "-" if r["speedup_vs_paper"] is None else f"{r['speedup_vs_paper']:.1f}x"
        lines.append(
            f"| {r['size']}² | {r['cf']} | {r['batch']} | {r['decode_ms']:.3f} | {r['decode_GBps']:.2f} | "
            f"{r['x_copy']:.1f}x | {paper} | {speed} |"
        )
    return "\n".join(lines)
