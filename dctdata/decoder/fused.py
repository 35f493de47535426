"""The fused CPU decode: `Decompress` on plain CPU tensors in one C pass (`dctdata/decoder/_synth.c`).

Why hand-written: the torch kernels (`transform.synthesize_chunked`) spend most of their time in op
overhead and in separate elementwise passes (to float, x step, + offset, sign x recon, rotation, the
per-sample (range, mid) and normalization) around two small matmuls per block, so they stay several times
slower than copying the output. No library we know does dequantization + 8x8 inverse DCT +
crop into an output buffer in one pass (BLAS sees only the matmuls; torch.compile was not tried). The kernel
reads the stored coefficients once, does everything per group of 8 neighbouring blocks in registers and L1,
and writes each output pixel once (AVX2+FMA picked at run time; portable C elsewhere), with non-temporal
stores and huge pages for large outputs, so a decode costs about what writing its output costs
(docs/benchmarks/decode.md has the measurements). Each call is single-threaded and releases
the GIL; with several torch threads (a main process without `balance_threads`) a batch of at least
`SPLIT_MIN_BYTES` of output per thread is split into runs of samples on a small thread pool (`dctdata.pool`), and no
call falls back to the portable graph's many-thread matmuls, which are far slower than one thread of this
kernel. A loader worker has one thread.

What it computes, per sample b, channel c and kept frequency k (float32):
    y = A[c, k] q + D[c, k] + R[c, k] sign(q);  y <- M @ y over channels;  y <- alpha[b, c] y + beta[b, c] [k = 0]
then the inverse DCT of y, cropped to (H, W). `tables_for` builds A, D, R, M and the per-channel output
affine map from a CodecSpec (v1: steps, offsets, mean and std folded into A and D; v2: scale, shift,
dead-zone recon, rotation, per-sample side and normalization).

Used when: the extension is built, the CPU has AVX2 and FMA, `ENABLED` (environment
`DCTDATA_FUSED_KERNEL=0` turns it off), plain CPU tensors in eager mode (`transform.eager_cpu`, the
chunked kernel's condition), any number of intra-op threads, coefficients int8/int16/float16/bfloat16/float32,
a float32 output, and `out` (when given) contiguous. Everything else (float64, other output dtypes,
strided `out`, CUDA, autograd, compile, export, ONNX) keeps the torch paths of `transform.synthesize`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt
import torch

from dctdata.codec import transform3d
from dctdata.codec.spec import CodecSpec, dequant_tables
from dctdata.codec.transform import BLOCK, eager_cpu, grid_shape, num_kept
from dctdata.errors import DctDataError
from dctdata.pool import run_split

try:
    import dctdata.decoder._synth as _synth
except ImportError:  # a source tree without the built extension: the torch kernels run
    _synth = None

ENABLED = os.environ.get("DCTDATA_FUSED_KERNEL", "1") != "0"
REQUIRE_VECTOR = True  # Decompress takes the kernel only with its AVX2 inner loop (see `usable`; tests turn it off)
WIRE_KINDS = {torch.int8: 0, torch.int16: 1, torch.float32: 2}
CONVERTED = (torch.float16, torch.bfloat16)  # converted to float32 (a pass over K/64 of the output) first
# Outputs at least this large are written with non-temporal stores: past a typical last-level cache they
# would be evicted before the consumer reads them, and skipping the read-for-ownership of every output
# line halves the memory traffic.
STREAM_ABOVE_BYTES = 32 << 20
# Outputs the kernel allocates itself, at least this large, ask the OS for transparent huge pages before the
# first write (Linux madvise): a fresh 64 MB output otherwise pays a page fault per 4 KiB page, which costs
# more than the decode itself (`THP_MEM_ALLOC_ENABLE=1` does the same for every torch allocation).
HUGEPAGES_ABOVE_BYTES = 8 << 20
# Output bytes each thread must get before a call is split: handing a run to the pool has a fixed cost that
# only a large call outweighs (small in-cache calls run slower split; docs/benchmarks/design.md).
SPLIT_MIN_BYTES = 4 << 20


def available() -> bool:
    """True when the extension is built and not turned off."""
    return _synth is not None and ENABLED


def vector_isa() -> str | None:
    """The instruction set the kernel uses on this CPU ("avx2+fma" or "portable"), None without it."""
    return None if _synth is None else _synth.vector_isa()


_VECTOR_ISA = vector_isa()


@dataclass(frozen=True)
class Tables:
    """The kernel's float32 tables for one spec: a, d (C, K); r (C, K) or None; m (C, C) or None; and the
    per-channel output map x -> scale x + shift (float64 (C,) each, None for v1, where it is folded)."""

    a: torch.Tensor
    d: torch.Tensor
    r: torch.Tensor | None
    m: torch.Tensor | None
    scale: torch.Tensor | None
    shift: torch.Tensor | None

    @property
    def channels(self) -> int:
        return self.a.shape[0]

    @property
    def kept(self) -> int:
        return self.a.shape[1]


def dc_gain(dims: int) -> float:
    """A constant c adds c times this to the DC coefficient: 8 for an 8x8 block (its DC basis function is 1/8
    everywhere), sqrt(512) for an 8x8x8 one."""
    return float(BLOCK) if dims == 2 else math.sqrt(transform3d.BLOCK3)


def tables_for(spec: CodecSpec, normalize: bool = True) -> Tables:
    """The kernel's tables for `spec` (the same math as `Decompress`'s weights or its v2 affine pass)."""
    steps, offsets, recon, rot, inv_std, mean = dequant_tables(spec, normalize)

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32).contiguous()

    if spec.recon is None and spec.rotation is None and spec.side is None:
        d = offsets.clone()
        d[:, 0] -= dc_gain(spec.dims) * mean
        col = inv_std.unsqueeze(1)
        return Tables(f32(steps * col), f32(d * col), None, None, None, None)
    recon = None if recon is None else -recon * steps
    return Tables(f32(steps), f32(offsets), _maybe(f32, recon), _maybe(f32, rot), inv_std, -mean * inv_std)


def _maybe(fn: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor | None) -> torch.Tensor | None:
    """fn(t), or None for a table the spec does not have."""
    return None if t is None else fn(t)


def usable(q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> bool:
    """True when `Decompress` takes `synthesize` for coefficients `q`, output dtype `dtype` and `out` (see the
    module doc). Only with the AVX2 inner loop: the portable C one (SSE2 or NEON by auto-vectorization) was
    no faster than the chunked torch kernel, and slower at CF 8."""
    if not available() or (REQUIRE_VECTOR and _VECTOR_ISA == "portable") or dtype != torch.float32:
        return False
    if q.dtype not in WIRE_KINDS and q.dtype not in CONVERTED:
        return False
    if out is not None and not out.is_contiguous():
        return False
    return eager_cpu(q) if out is None else eager_cpu(q, out)


def check_shape(t: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
    """DctDataError naming `name` unless `t` has exactly `shape` (the kernels index by it)."""
    if t.shape != shape:  # torch.Size compares equal to a tuple: no copy on this per-call path
        raise DctDataError(f"{name}: expected shape {shape}. Got {tuple(t.shape)}")


def synthesize(
    q: torch.Tensor,
    tables: Tables,
    cf: int,
    mask: str,
    size: tuple[int, int],
    out: torch.Tensor | None = None,
    side: torch.Tensor | None = None,
    portable: bool = False,
    stream: bool | None = None,
) -> torch.Tensor:
    """Decode (B, C, Hb, K, Wb) stored coefficients into (B, C, H, W) float32 (`out` when given).

    `side` (B, C, 2) = [range, mid] per sample and channel (v2 specs that carry it). `portable` runs the
    plain C inner loop even where AVX2 is present (tests compare both). `stream` (default: outputs of
    `STREAM_ABOVE_BYTES` or more) writes with non-temporal stores. Every shape, dtype and size the C
    code indexes is checked here (and again in C); non-contiguous coefficients are copied first.
    """
    return _synthesize(q, tables, cf, mask, tuple(size), out, side, portable, stream)


def synthesize_volume(
    q: torch.Tensor,
    tables: Tables,
    cf: int,
    mask: str,
    size: tuple[int, int, int],
    out: torch.Tensor | None = None,
    side: torch.Tensor | None = None,
    portable: bool = False,
    stream: bool | None = None,
) -> torch.Tensor:
    """`synthesize` for volumes: (B, C, Db, Hb, K, Wb) coefficients of 8x8x8 blocks (mask "cube" or "tetra")
    into (B, C, D, H, W) float32."""
    return _synthesize(q, tables, cf, mask, tuple(size), out, side, portable, stream)


def _synthesize(
    q: torch.Tensor,
    tables: Tables,
    cf: int,
    mask: str,
    size: tuple[int, ...],
    out: torch.Tensor | None,
    side: torch.Tensor | None,
    portable: bool,
    stream: bool | None,
) -> torch.Tensor:
    if _synth is None:
        raise DctDataError("fused kernel: dctdata.decoder._synth is not built (reinstall dctdata to compile it)")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"coeffs: expected a torch.Tensor. Got {type(q).__name__}")
    if q.dtype in CONVERTED:
        q = q.to(torch.float32)
    if q.dtype not in WIRE_KINDS:
        raise TypeError(f"coeffs: expected int8, int16, float16, bfloat16 or float32 (fused kernel). Got {q.dtype}")
    if not isinstance(tables, Tables):
        raise TypeError(f"tables: expected dctdata.decoder.fused.Tables (see tables_for). Got {type(tables).__name__}")
    c, k = tables.channels, tables.kept
    for name, t, shape in (
        ("a", tables.a, (c, k)),
        ("d", tables.d, (c, k)),
        ("r", tables.r, (c, k)),
        ("m", tables.m, (c, c)),
    ):
        if t is not None and (t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous()):
            raise DctDataError(
                f"tables.{name}: expected a contiguous float32 tensor of shape {shape}. Got {t.dtype} {tuple(t.shape)}"
            )
    scale, shift = tables.scale, tables.shift
    if (scale is None) != (shift is None):
        raise DctDataError("tables: expected scale and shift both or neither")
    if scale is not None and shift is not None and not (scale.shape == shift.shape == (c,)):
        raise DctDataError(f"tables: expected scale and shift of shape ({c},). Got {tuple(scale.shape)}")
    volume = len(size) == 3
    kept = transform3d.num_kept(cf, mask) if volume else num_kept(cf, mask)
    if k != kept:
        raise DctDataError(f"tables: expected K = {kept} for cf={cf} mask={mask!r}. Got {k}")
    *rows, wb = transform3d.grid_shape(*size) if volume else grid_shape(*size)
    axes = "(B, C, Db, Hb, K, Wb)" if volume else "(B, C, Hb, K, Wb)"
    if q.dim() != len(size) + 3:
        raise DctDataError(f"coeffs: expected shape {axes}. Got {tuple(q.shape)}")
    b = q.shape[0]
    check_shape(q, (b, c, *rows, k, wb), "coeffs")
    fresh = out is None
    if fresh:
        out = torch.empty(b, c, *size, dtype=torch.float32)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or not out.is_contiguous():
        raise DctDataError(f"out: expected a contiguous float32 tensor for the fused kernel. Got {out!r:.80}")
    check_shape(out, (b, c, *size), "out")
    alpha_n = beta_n = None  # the per-sample output map, float32 arrays (B, C)
    if scale is not None and shift is not None:
        alpha = scale.expand(b, c)
        beta = shift.expand(b, c)
        if side is not None:
            check_shape(side, (b, c, 2), "side")
            rng, mid = side[..., 0].to(torch.float64), side[..., 1].to(torch.float64)
            alpha, beta = alpha * rng, scale * mid + beta
        alpha_n = alpha.to(torch.float32).contiguous().numpy()
        beta_n = (dc_gain(len(size)) * beta).to(torch.float32).contiguous().numpy()  # a constant on the DC term
    elif side is not None:
        raise DctDataError("side: these tables (a v1 spec) take no side information")

    def opt(t: torch.Tensor | None) -> npt.NDArray[Any] | None:
        return None if t is None else t.numpy()

    qn, on = q.detach().resolve_neg().contiguous().numpy(), out.detach().numpy()
    stream = out.numel() * 4 >= STREAM_ABOVE_BYTES if stream is None else stream
    huge = fresh and out.numel() * 4 >= HUGEPAGES_ABOVE_BYTES
    kernel = _synth.synthesize3 if volume else _synth.synthesize
    reduced = int(mask in ("triangle", "tetra"))

    def part(b0: int, b1: int) -> None:
        kernel(
            qn[b0:b1], WIRE_KINDS[q.dtype], on[b0:b1], (b1 - b0, c, *rows, k, wb, *size), cf, reduced,
            tables.a.numpy(), tables.d.numpy(), opt(tables.r), opt(tables.m),
            None if alpha_n is None else alpha_n[b0:b1], None if beta_n is None else beta_n[b0:b1], portable, stream,
            huge,
        )  # fmt: skip

    _run_split(part, b, out.numel() * 4)
    return out


def _run_split(part: Callable[[int, int], object], b: int, nbytes: int) -> None:
    """`part(b0, b1)` over [0, b): in one call, or split into up to torch.get_num_threads() runs of samples
    on the process's thread pool (`dctdata.pool`; the kernel releases the GIL) when torch may use several
    threads and each run gets at least SPLIT_MIN_BYTES of output. A loader worker (one thread,
    `make_loader`) never starts a pool."""
    run_split(part, b, min(torch.get_num_threads(), b, max(1, nbytes // SPLIT_MIN_BYTES)))
