"""The fused CUDA decode: `Decompress` on CUDA tensors in one Triton kernel (`dctdata.decoder._triton_synth`).

Why hand-written: on CUDA the portable graph (`transform.synthesize_portable`) runs each step as its own
kernel, and a v2 codec (dead zone with reconstruction offsets, channel rotation, per-sample (range, mid),
normalization) adds half a dozen elementwise passes over the coefficients before the two matmuls, each a
round trip through device memory, so v2 decoded well below v1 (issue 28). torch.compile fuses them too,
but it compiles per shape and only inside a compiled model; a Triton kernel is compiled once per codec
class and does dequantization, rotation, side map, normalization, inverse DCT and crop in one pass that
reads the stored coefficients once and writes each output pixel once.

What it computes is the fused CPU kernel's (`dctdata.decoder.fused`, from the same `fused.tables_for` tables):
    y = A[c, k] q + D[c, k] + R[c, k] sign(q);  y <- M @ y over channels;  y <- alpha[b, c] y + 8 beta[b, c] [k = 0]
then the inverse DCT of y, cropped to (H, W), in float32 arithmetic, written in the layer's dtype.

Used when (`usable`): Triton imports, `ENABLED` (environment `DCTDATA_TRITON_KERNEL=0` turns it off), CUDA
tensors in eager mode (`transform.eager_on`: not under torch.compile, torch.export, ONNX export, jit
tracing or torch.func, no autograd to record), coefficients int8/int16/float16/bfloat16/float32, a
float32/float16/bfloat16 output, and `out` (when given) contiguous. Everything else keeps the portable
graph, whose export produces only matmul/reshape-class ops. If the kernel fails to compile or launch, the
failure is logged once, the kernel is switched off for the process (`broken()` says why) and the portable
graph runs: a Triton or driver mismatch costs speed, not the decode.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal, ParamSpec, TypeVar

import torch

from dctdata.codec.transform import BLOCK, dct_matrix, eager_on, grid_shape, kept_frequencies, num_kept
from dctdata.decoder.fused import Tables, _maybe, check_shape
from dctdata.errors import DctDataError

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

ENABLED = os.environ.get("DCTDATA_TRITON_KERNEL", "1") != "0"
WIRES = (torch.int8, torch.int16, torch.float16, torch.bfloat16, torch.float32)
OUTPUTS = (torch.float32, torch.float16, torch.bfloat16)
MAX_PROGRAMS = 2**31 - 1  # a CUDA grid's x dimension; larger batches are launched in runs of samples

# dctdata.decoder._triton_synth once imported; None before, False where Triton is missing
_kernel_module: ModuleType | Literal[False] | None = None
_broken: str | None = None  # why the kernel was switched off for this process, or None


def _module() -> ModuleType | Literal[False]:
    global _kernel_module
    if _kernel_module is None:
        try:
            _kernel_module = importlib.import_module("dctdata.decoder._triton_synth")
        except ImportError as exc:  # no Triton (CPU-only torch builds, some platforms)
            log.debug("fused CUDA kernel unavailable: %s", exc)
            _kernel_module = False
    return _kernel_module


def available() -> bool:
    """True when Triton imports, the kernel is enabled and has not failed in this process."""
    return ENABLED and _broken is None and bool(_module())


def broken() -> str | None:
    """Why the kernel was switched off in this process (its compile or launch failed), or None."""
    return _broken


def usable(q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> bool:
    """True when `Decompress` takes the kernel for coefficients `q`, output dtype `dtype` and `out` (see the
    module doc)."""
    if q.device.type != "cuda" or dtype not in OUTPUTS or q.dtype not in WIRES:
        return False
    if out is not None and not out.is_contiguous():
        return False
    if not (eager_on("cuda", q) if out is None else eager_on("cuda", q, out)):
        return False
    return available()


@dataclass(frozen=True)
class DeviceTables:
    """`fused.Tables` as float32 tensors on one device, laid out for the kernel, plus the DCT matrix it reads.
    Checked once here (dtype, shape, contiguity, one device), not on every decode: a layer decodes many batches
    with one.

    `columns` (C, CF, NT, UP) holds the dequantization tables by kept column v of frequencies: for each v the
    tables over the rows u, padded with zeros to UP (`padded_rows`) where the mask keeps fewer. The tables are
    a and d for a v1 codec; for a v2 codec (NT = 3) a, d' = d - r and r' = 2 r, the kernel's form of the dead
    zone's sign term (a q + d' + r' clamp(q / 2 + 1/2, 0, 1) = a q + d + r sign(q) for integer q; see
    `dctdata.decoder._triton_synth`). By column because the kernel works through one column v at a time: the values
    it reads for v are neighbours (one or two cache lines a column), not CF entries apart as in (C, K)."""

    columns: torch.Tensor
    m: torch.Tensor | None
    scale: torch.Tensor | None
    shift: torch.Tensor | None
    t: torch.Tensor
    cf: int
    mask: str

    def __post_init__(self) -> None:
        cols = self.columns
        if not isinstance(cols, torch.Tensor) or cols.dim() != 4:
            raise DctDataError(f"tables.columns: expected a (C, CF, NT, UP) float32 tensor. Got {cols!r:.80}")
        c, nt = cols.shape[0], cols.shape[2]
        device = cols.device
        for name, t, shape in (("columns", cols, (c, self.cf, nt, padded_rows(self.cf))), ("m", self.m, (c, c)),
                               ("scale", self.scale, (c,)), ("shift", self.shift, (c,)),
                               ("t", self.t, (BLOCK, BLOCK))):  # fmt: skip
            if t is None:
                continue
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape
                    or not t.is_contiguous() or t.device != device):  # fmt: skip
                got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise DctDataError(
                    f"tables.{name}: expected a contiguous float32 tensor of shape {shape} on {device}. Got {got}"
                )
        if nt not in (2, 3):
            raise DctDataError(f"tables.columns: expected 2 (a, d) or 3 (a, d - r, 2 r) tables. Got {nt}")
        if (self.scale is None) != (self.shift is None):
            raise DctDataError("tables: expected scale and shift both or neither")

    @property
    def channels(self) -> int:
        return self.columns.shape[0]

    @property
    def has_r(self) -> bool:
        return self.columns.shape[2] == 3

    @property
    def device(self) -> torch.device:
        return self.columns.device


def padded_rows(cf: int) -> int:
    """The kept rows u of a column, padded to a power of two (the kernel's UP)."""
    return 8 if cf > 4 else (4 if cf > 2 else 2)


def column_index(cf: int, mask: str) -> torch.Tensor:
    """(CF, UP) int64: the stored coefficient k of frequency (row u, column v) at [v, u] (`kept_frequencies`
    order), or -1 where the mask drops it."""
    index = torch.full((cf, padded_rows(cf)), -1, dtype=torch.int64)
    for k, (u, v) in enumerate(kept_frequencies(cf, mask)):
        index[v, u] = k
    return index


def device_tables(tables: Tables, device: torch.device | str, cf: int, mask: str) -> DeviceTables:
    """The kernel's copy of `tables` (from `fused.tables_for`, for coefficients kept by `cf` and `mask`) on
    `device`."""
    if not isinstance(tables, Tables):
        raise TypeError(f"tables: expected dctdata.decoder.fused.Tables (see tables_for). Got {type(tables).__name__}")
    if tables.kept != num_kept(cf, mask):
        raise DctDataError(f"tables: expected K = {num_kept(cf, mask)} for cf={cf} mask={mask!r}. Got {tables.kept}")
    index = column_index(cf, mask)
    a, d, r = tables.a, tables.d, tables.r
    if r is not None:  # the kernel's form of the dead zone's sign term (see dctdata.decoder._triton_synth)
        d, r = d - r, r + r
    stacked = torch.stack([x.to(torch.float32) for x in (a, d, r) if x is not None], 1)
    padded = torch.cat([stacked, torch.zeros(*stacked.shape[:2], 1)], 2)  # (C, NT, K + 1): index -1 reads the 0
    columns = padded[:, :, index].permute(0, 2, 1, 3)  # (C, CF, NT, UP)

    def put(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=device, dtype=torch.float32).contiguous()

    return DeviceTables(
        put(columns), _maybe(put, tables.m), _maybe(put, tables.scale), _maybe(put, tables.shift),
        dct_matrix(torch.float32, device).contiguous(), cf, mask,
    )  # fmt: skip


def launch_config(wb: int) -> tuple[int, int]:
    """(blocks per strip, warps per program): 32 blocks per warp, one block a thread (see
    `dctdata.decoder._triton_synth`); 1 warp for samples up to 256 pixels wide, else 2 (wider samples take several
    strips per block row, which keeps one compiled kernel per codec for every larger size)."""
    warps = 1 if wb <= 32 else 2
    return 32 * warps, warps


def synthesize(
    q: torch.Tensor,
    tables: DeviceTables,
    cf: int,
    mask: str,
    size: tuple[int, int],
    out: torch.Tensor | None = None,
    side: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Decode (B, C, Hb, K, Wb) stored coefficients into (B, C, H, W) `dtype` (`out` when given) in one kernel.

    `side` (B, C, 2) = [range, mid] per sample and channel (v2 specs that carry it). Every shape, dtype and
    size the kernel indexes is checked here; non-contiguous inputs are copied first. Runs on CUDA tensors,
    and on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, how the tests check its values).
    """
    module = _module()
    if not module:
        raise DctDataError("fused CUDA kernel: Triton is not installed (pip install triton, or use the portable path)")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"coeffs: expected a torch.Tensor. Got {type(q).__name__}")
    if q.dtype not in WIRES:
        raise TypeError(f"coeffs: expected one of {WIRES} (fused CUDA kernel). Got {q.dtype}")
    if dtype not in OUTPUTS:
        raise TypeError(f"dtype: expected one of {OUTPUTS} (fused CUDA kernel). Got {dtype}")
    if not isinstance(tables, DeviceTables):
        raise TypeError(f"tables: expected dctdata.decoder.fused_cuda.DeviceTables. Got {type(tables).__name__}")
    if (tables.cf, tables.mask) != (cf, mask):
        raise DctDataError(f"tables: built for cf={tables.cf} mask={tables.mask!r}; expected cf={cf} mask={mask!r}")
    c, k = tables.channels, num_kept(cf, mask)
    if tables.device != q.device:
        raise DctDataError(
            f"tables.columns: expected a contiguous float32 tensor on {q.device}. Got one on {tables.device}"
        )
    h, w = size
    hb, wb = grid_shape(h, w)
    if q.dim() != 5:
        raise DctDataError(f"coeffs: expected shape (B, C, Hb, K, Wb). Got {tuple(q.shape)}")
    b = q.shape[0]
    check_shape(q, (b, c, hb, k, wb), "coeffs")
    if side is not None:
        if tables.scale is None:
            raise DctDataError("side: these tables (a v1 spec) take no side information")
        if side.shape != (b, c, 2) or side.device != q.device or not side.is_floating_point():  # one test a call
            check_shape(side, (b, c, 2), "side")
            raise DctDataError(f"side: expected a floating tensor on {q.device}. Got {side.dtype} on {side.device}")
        if not side.is_contiguous():
            side = side.contiguous()
    if out is None:
        out = torch.empty(b, c, h, w, dtype=dtype, device=q.device)
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or not out.is_contiguous() or out.device != q.device:
        raise DctDataError(f"out: expected a contiguous {dtype} tensor on {q.device}. Got {out!r:.80}")
    check_shape(out, (b, c, h, w), "out")
    if b == 0:
        return out
    q = q.contiguous()
    blocks, warps = launch_config(wb)
    strips = -(-wb // blocks)
    per_sample = c * hb * strips
    dummy = tables.columns
    flags = dict(
        CF=cf, UP=tables.columns.shape[3], TRIANGLE=mask == "triangle", BLOCKS=blocks, HAS_R=tables.has_r,
        HAS_M=tables.m is not None, HAS_OUT=tables.scale is not None, HAS_SIDE=side is not None, num_warps=warps,
    )  # fmt: skip
    run = max(1, MAX_PROGRAMS // per_sample)  # samples per launch
    tables_in = (tables.columns, _or(tables.m, dummy), _or(tables.scale, dummy), _or(tables.shift, dummy))
    switch = q.is_cuda and q.device.index != torch.cuda.current_device()  # Triton launches on the current device
    with torch.cuda.device(q.device) if switch else contextlib.nullcontext():
        for b0 in range(0, b, run):
            b1 = min(b, b0 + run)
            module.synthesize_kernel[((b1 - b0) * per_sample,)](
                _samples(q, b0, b1), _samples(out, b0, b1), *tables_in,
                dummy if side is None else _samples(side, b0, b1), tables.t, c, hb, wb, h, w, k, strips, **flags,
            )  # fmt: skip
    return out


def _samples(t: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
    """Samples b0:b1 of `t`; `t` itself when that is all of it (one launch, the usual case: no view built)."""
    return t if b0 == 0 and b1 == t.shape[0] else t[b0:b1]


def _or(t: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return default if t is None else t


def guarded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
    """`fn(*args, **kwargs)` (a `synthesize` call), or None after switching the kernel off when it fails to
    compile or launch (logged once with the reason; `broken()` keeps it). Errors about the caller's
    arguments (DctDataError, TypeError) propagate."""
    global _broken
    try:
        return fn(*args, **kwargs)
    except (DctDataError, TypeError):
        raise
    except Exception as exc:  # Triton compile errors, missing ptxas, driver/arch mismatches
        _broken = f"{type(exc).__name__}: {exc}"
        log.warning("fused CUDA kernel failed (%s); Decompress uses the portable graph from now on", _broken)
        return None
