"""The entropy stage decoded where the model runs: a batch of ctx-rANS streams to its coefficients on a GPU (or,
for CPU tensors, the same program on the CPU).

    coeffs, status = decode_batch(codec, buffer, offsets, (C, Hb, K, Wb), torch.int8)
    raise_for_status(status)                      # or skip the samples whose status is not 0

`buffer` holds N streams back to back (uint8, 1-D), `offsets` their N + 1 byte offsets (int64), and the result
is (N, C, Hb, K, Wb) coefficients on the buffer's device, equal bit for bit to `CtxCodec.decode` of each stream,
with an int32 status per sample (0: decoded; otherwise the CPU decoder's error, `describe` says which, and the
sample's coefficients are zeros). Nothing here raises for bad stream bytes: callers decide what a bad sample
means (raise, skip).

Why hand-written: no library decodes a context-modelled rANS stream on a GPU. nvCOMP's ANS and dietgpu are
order-0 byte coders (one table per chunk), Recoil's multi-table mode needs each symbol's table before decoding
starts; here a coefficient's table depends on coefficients decoded before it (lower frequencies of its block,
the block above, the previous channel, the left DC). So the kernel is ours: ctxrans_lanes.h, CUDA C++ compiled
at run time by NVRTC (cuda-python's `cuda.bindings`; no nvcc at install), launched on torch's current stream.
The same file built as C is the lane emulator (`_ctxlanes`), which CI runs bit-exactly against the CPU decoder
on real and fuzzed streams, and which this module runs for CPU tensors; it is imported there, on first use, so
a CUDA user never loads it.

Design (the numbers that decided it are in docs/guides/gpu-entropy-decoder.md):
- A unit is half a warp: 16 lanes, lane l holding rANS state l, decoding one part of a stream: a mode 0/1/2
  stream, or one segment of a mode 3 stream (version 3 configs cut samples of two segments or more into
  segments of block rows, `CtxCodec.segment` coefficients each: independent streams whose contexts restart at
  their top row). A stream is a chain of dependent steps (each lane's state, the shared word pointer, the bit
  position), so the decode time of a sample is its longest part's chain: segments are what let one sample use
  several units, and the segment length sets a small batch's decode time.
- A step decodes the 16 coefficients of one row of one AC plane: contexts from values decoded earlier (the
  block row's planes are kept in shared memory), table lookups in shared memory, the words taken in lane
  order by ballot + popc, the raw bits placed by a prefix sum made of five ballots. The DC plane (its context
  and prediction use the left neighbour) is decoded serially by lane 0, as are mode 0 streams and planes
  with the left-block context.
- The model (frequency, search-start, bucket and context tables: 50-250 KB) is copied to shared memory once
  per block when it fits, else read through the caches; units per block are chosen so that a batch's units
  are resident at once (`plan_launch`).
- Hostile bytes: every read is bounded by the sample's byte range, every write by its output slot; a stream
  that runs out stops at the next block row or run; the checks at the end are the CPU decoder's.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dctdata.entropy.ctxrans import CODEC_ID, MODE_SEGMENTS, CtxCodec, CtxCodecError
from dctdata.errors import DctDataError, IntegrityError

__all__ = [
    "STATUS",
    "compile_kernel",
    "decode_batch",
    "describe",
    "kernel_shape",
    "kernel_source",
    "launch_info",
    "make_plan",
    "plan_launch",
    "raise_for_status",
    "status_of",
    "units_per_sample",
]

log = logging.getLogger(__name__)

# Status codes (the low byte of a sample's status; ctxrans_lanes.h, CL_ST_*) and the CPU decoder's words for them
STATUS = {
    1: "empty stream",
    2: "the stream cannot hold the declared coefficients",
    3: "raw stream has the wrong length",
    4: "bad stream header",
    5: "corrupt stream (bad initial state)",
    6: "corrupt stream (bad section length)",
    7: "truncated stream (section length beyond the end)",
    8: "truncated stream (its rANS words ran out)",
    9: "truncated stream (its raw bits ran out)",
    10: "corrupt stream (does not end cleanly)",
    11: "corrupt stream (bit section length)",
    12: "corrupt stream (bad segment count)",
    13: "corrupt stream (bad segment length)",
    14: "truncated stream (segments beyond the end)",
    15: "corrupt stream (segments do not fill the stream)",
    16: "its offsets do not give it a byte range inside the buffer",
}
# The CPU decoder's messages, by the status they correspond to
_CPU_PREFIXES = (
    "empty stream",
    "a stream of ",
    "raw stream has the wrong length",
    "bad stream header",
    "corrupt stream (bad initial state)",
    "corrupt stream (bad section length)",
    "truncated stream (section length beyond the end)",
    "truncated stream (its rANS words ran out",
    "truncated stream (its raw bits ran out",
    "corrupt stream (does not end cleanly)",
    "corrupt stream (bit section length)",
    "corrupt stream (bad segment count)",
    "corrupt stream (bad segment length)",
    "truncated stream (segments beyond the end)",
    "corrupt stream (segments do not fill the stream)",
)
_KEY_NONE = 0x7FFFFFFF  # the kernel's status before any unit failed
_KERNELS = {1: "ctxrans_decode_i8", 2: "ctxrans_decode_i16"}
_ROW_ALIGN = 16


def describe(status: int) -> str:
    """A sample's status in words: "ok", or the CPU decoder's error (and the segment it is in)."""
    status = int(status)
    if status == 0:
        return "ok"
    code, seg = status & 0xFF, status >> 8
    what = STATUS.get(code, f"unknown status {status}")
    return f"ctxrans: segment {seg - 1}: {what}" if seg else f"ctxrans: {what}"


def status_of(message: str) -> int:
    """The status of a CPU decoder error message (`CtxCodec.decode`'s): its code, | (1 + segment) << 8 when the
    error is in a segment; ValueError for a message that is not one of the decoder's stream errors."""
    m = re.fullmatch(r"ctxrans: (?:segment (\d+) of \d+: )?(.*)", message, re.S)
    codes = [i + 1 for i, p in enumerate(_CPU_PREFIXES) if m and m.group(2).startswith(p)]
    if m is None or len(codes) != 1:
        raise ValueError(f"not a ctxrans stream error: {message!r}")
    return ((int(m.group(1)) + 1) << 8 if m.group(1) is not None else 0) | codes[0]


def raise_for_status(status: torch.Tensor, where: Callable[[int], str] | None = None) -> None:
    """IntegrityError naming the first sample whose status is not 0 (`where(i)` describes sample i; default
    "sample i"), and how many others failed. Reads the status on the host (a sync on CUDA)."""
    bad = torch.nonzero(status.detach().to("cpu")).flatten().tolist()
    if not bad:
        return
    i = bad[0]
    name = where(i) if where is not None else f"sample {i}"
    more = f" ({len(bad) - 1} more samples of the batch failed)" if len(bad) > 1 else ""
    raise IntegrityError(f"{name}: expected a {CODEC_ID} stream. Got {describe(int(status[i]))}{more}")


def kernel_shape(codec: CtxCodec, sample_shape: Sequence[int]) -> Sequence[int]:
    """The (C, rows, K, Wb) the kernel decodes for a sample: `sample_shape` itself, or for a volume model's
    (C, Db, Hb, K, Wb) the rows view its CPU coder writes (`dctdata.entropy.ctxrans.coded_plane`: a "cube"
    block row is cf rows of cf^2 planes), a view of the same memory. Volume shapes of the wrong form are
    left for `_check_args` to refuse."""
    lay = getattr(codec, "layout", None)
    try:
        shape = tuple(int(s) for s in sample_shape)
    except (TypeError, ValueError):
        return sample_shape
    if lay is None or not lay.volume or len(shape) != 5 or min(shape) < 1 or shape[3] != lay.kept:
        return shape
    return tuple(codec._rows((1, *shape))[1:])


def units_per_sample(codec: CtxCodec, sample_shape: Sequence[int]) -> int:
    """Units (half-warps) given to each sample: the segments this codec writes for it (1 without segments)."""
    mode, nseg = codec.stream_mode((1, *kernel_shape(codec, sample_shape)))
    return nseg if mode == MODE_SEGMENTS else 1


# ---------------------------------------------------------------------------------------------- arguments
def _check_args(
    codec: object, buffer: object, offsets: object, sample_shape: Sequence[int], dtype: torch.dtype | npt.DTypeLike
) -> tuple[tuple[int, ...], torch.dtype, int]:
    if not isinstance(codec, CtxCodec):
        raise TypeError(f"codec: expected a CtxCodec. Got {type(codec).__name__}")
    if not isinstance(buffer, torch.Tensor) or not isinstance(offsets, torch.Tensor):
        raise TypeError(
            f"buffer, offsets: expected torch tensors. Got {type(buffer).__name__}, {type(offsets).__name__}"
        )
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise CtxCodecError(f"buffer: expected a 1-D uint8 tensor. Got {buffer.dtype} of shape {tuple(buffer.shape)}")
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < 1:
        raise CtxCodecError(
            f"offsets: expected a 1-D int64 tensor of N + 1 byte offsets. Got {offsets.dtype} {tuple(offsets.shape)}"
        )
    try:
        shape = tuple(int(s) for s in sample_shape)
    except (TypeError, ValueError):
        raise TypeError(f"sample_shape: expected 4 ints (C, Hb, K, Wb). Got {sample_shape!r}") from None
    lay = codec.layout
    if len(shape) != 4 or min(shape) < 1 or shape[2] != lay.K or shape[0] > lay.channels:
        also = f" or a volume's (C, Db, Hb, K, Wb) with K={lay.kept}" if lay.volume else ""
        raise CtxCodecError(
            f"sample_shape: expected (C, Hb, K, Wb) with K={lay.K}{also} and C <= {lay.channels}. Got {shape}"
        )
    if math.prod(shape) > 1 << 31:
        raise CtxCodecError(f"sample_shape: expected at most 2^31 coefficients a sample. Got {shape}")
    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = ""
    dt = {"int8": torch.int8, "int16": torch.int16}.get(name)
    if dt is None:
        raise CtxCodecError(f"dtype: expected int8 or int16. Got {dtype!r}")
    return shape, dt, 1 if dt == torch.int8 else 2


def decode_batch(
    codec: CtxCodec,
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    sample_shape: Sequence[int],
    dtype: torch.dtype | npt.DTypeLike,
    *,
    cpu_decoder: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """N streams of `buffer` (bytes offsets[i] .. offsets[i + 1]) to (coefficients (N, *sample_shape) of dtype on
    buffer's device, status int32 (N,)): on a CUDA tensor the NVRTC kernel, on a CPU tensor the lane emulator;
    the same results. A sample whose status is not 0 (see `describe`) has zeros for coefficients.
    cpu_decoder=True: CPU tensors go through the CPU decoder instead (`CtxCodec.decode`, scalar and AVX2 C,
    several times the emulator's speed), with the same results and statuses; for a CPU stand-in of the GPU path.
    A volume model (mask "cube" or "tetra") also takes sample_shape (C, Db, Hb, K, Wb): the kernel decodes the
    rows view of `kernel_shape` and the result is viewed back as (N, C, Db, Hb, K, Wb)."""
    declared = tuple(sample_shape) if isinstance(sample_shape, (tuple, list)) else sample_shape
    sample_shape = kernel_shape(codec, sample_shape)
    volume = sample_shape != declared and len(declared) == 5
    declared = tuple(int(d) for d in declared) if volume else sample_shape
    out, status = _decode_rows(codec, buffer, offsets, sample_shape, dtype, cpu_decoder, declared)
    return (out.view(out.shape[0], *declared) if volume else out), status


def _decode_rows(
    codec: CtxCodec,
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    sample_shape: Sequence[int],
    dtype: torch.dtype | npt.DTypeLike,
    cpu_decoder: bool,
    declared: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    shape, dt, itemsize = _check_args(codec, buffer, offsets, sample_shape, dtype)
    n = offsets.numel() - 1
    units = units_per_sample(codec, shape)
    if buffer.device.type == "cuda":
        out, status = _decode_cuda(codec, buffer, offsets, shape, dt, itemsize, n, units)
    elif buffer.device.type == "cpu":
        if offsets.device.type != "cpu":
            raise CtxCodecError(f"offsets: expected a CPU tensor with a CPU buffer. Got {offsets.device}")
        out = torch.zeros((n, *shape), dtype=dt)
        if cpu_decoder:
            return out, _decode_cpu(codec, buffer, offsets, declared, out)
        from dctdata.entropy import _ctxlanes  # here, not with the module: CUDA users never load it

        status_np = np.zeros(n, np.int32)
        _ctxlanes.decode_batch(
            codec._blob,
            buffer.contiguous().numpy(),
            offsets.contiguous().numpy(),
            out.numpy(),
            shape,
            itemsize,
            units,
            status_np,
        )
        status = torch.from_numpy(status_np)
    else:
        raise CtxCodecError(f"buffer: expected a CPU or CUDA tensor. Got {buffer.device}")
    if n:
        out.masked_fill_((status != 0).view(n, 1, 1, 1, 1), 0)
    return out, status


def _decode_cpu(
    codec: CtxCodec, buffer: torch.Tensor, offsets: torch.Tensor, shape: Sequence[int], out: torch.Tensor
) -> torch.Tensor:
    """decode_batch through the CPU decoder: each stream into its slot of out (zeros where it fails); `shape` is the
    sample shape the CPU decoder is told (a volume's (C, Db, Hb, K, Wb))."""
    data, offs, dst = buffer.contiguous().numpy(), offsets.contiguous().numpy(), out.numpy()
    status = np.zeros(len(dst), np.int32)
    for i in range(len(dst)):
        a, b = int(offs[i]), int(offs[i + 1])
        if a < 0 or b < a or b > len(data):
            status[i] = 16
            continue
        try:
            codec.decode(data[a:b], out=dst[i : i + 1].reshape(1, *shape))
        except CtxCodecError as exc:
            status[i] = status_of(str(exc))
            dst[i] = 0
    return torch.from_numpy(status)


# ---------------------------------------------------------------------------------------------- NVRTC
def kernel_source() -> str:
    """ctxrans_lanes.h: the CUDA source of the kernels (and, as C, of the lane emulator)."""
    return resources.files("dctdata.entropy").joinpath("ctxrans_lanes.h").read_text(encoding="utf-8")


_NVRTC_LOCK = threading.Lock()


def _nvrtc() -> Any:  # cuda.bindings.nvrtc, which has no type hints
    """cuda.bindings.nvrtc with its library loaded: cuda-python finds libnvrtc itself where the toolkit or the
    nvidia wheel is on its search path; otherwise the wheel's copy (nvidia/*/lib, installed with torch) is
    loaded first."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise DctDataError(
            "the GPU entropy decoder needs cuda-python's NVRTC bindings: pip install cuda-bindings (or dctdata[gpu])"
        ) from exc
    try:
        nvrtc.nvrtcVersion()
        return nvrtc
    except Exception:  # cuda-pathfinder did not find the library: load the wheel's
        pass
    for pattern in ("libnvrtc-builtins.so.*", "libnvrtc.so.*"):
        for d in sys.path:
            found = sorted(f for f in glob.glob(os.path.join(d, "nvidia", "*", "lib", pattern)) if ".alt." not in f)
            if found:
                ctypes.CDLL(found[-1], mode=ctypes.RTLD_GLOBAL)
                break
    try:
        nvrtc.nvrtcVersion()
    except Exception as exc:
        raise DctDataError(f"the GPU entropy decoder needs NVRTC (libnvrtc): {exc}") from exc
    return nvrtc


def compile_kernel(arch: str = "compute_90", extra: Sequence[str] = ()) -> bytes:
    """The kernels compiled by NVRTC for `arch`: PTX for "compute_XY", a cubin for "sm_XY". Works without a
    GPU (CI compile-checks the source with it). DctDataError with NVRTC's log if the source does not compile."""
    nvrtc = _nvrtc()
    src = kernel_source().encode()
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *[o.encode() for o in extra]]
    image: bytes
    with _NVRTC_LOCK:
        err, prog = nvrtc.nvrtcCreateProgram(src, b"ctxrans_lanes.cu", 0, [], [])
        _nvrtc_check(nvrtc, err, "nvrtcCreateProgram")
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                _, size = nvrtc.nvrtcGetProgramLogSize(prog)
                text = b" " * size
                nvrtc.nvrtcGetProgramLog(prog, text)
                log_text = text.decode(errors="replace")
                raise DctDataError(f"NVRTC could not compile ctxrans_lanes.h for {arch}: {log_text}")
            if arch.startswith("sm_"):
                err, size = nvrtc.nvrtcGetCUBINSize(prog)
                _nvrtc_check(nvrtc, err, "nvrtcGetCUBINSize")
                image = b" " * size
                _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, image)[0], "nvrtcGetCUBIN")
            else:
                err, size = nvrtc.nvrtcGetPTXSize(prog)
                _nvrtc_check(nvrtc, err, "nvrtcGetPTXSize")
                image = b" " * size
                _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTX(prog, image)[0], "nvrtcGetPTX")
        finally:
            nvrtc.nvrtcDestroyProgram(prog)
    return image


def _nvrtc_check(nvrtc: Any, err: object, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise DctDataError(f"NVRTC {what} failed: {err}")


def _cache_path(arch: str) -> str | None:
    """Where a compiled kernel is kept between processes (None: no cache): $DCTDATA_CACHE_DIR or
    $XDG_CACHE_HOME/dctdata or ~/.cache/dctdata, keyed by the source, the options and NVRTC's version."""
    root = os.environ.get("DCTDATA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dctdata"
    )
    try:
        version = _nvrtc().nvrtcVersion()[1:]
    except DctDataError:
        return None
    key = hashlib.sha256(f"{kernel_source()}|{arch}|{version}".encode()).hexdigest()[:24]
    return os.path.join(root, f"ctxrans-{arch}-{key}.cubin")


def _cached_image(arch: str) -> bytes:
    """The kernels for `arch`, from the cache when a previous process compiled them, else compiled (and cached
    when the cache directory is writable: written aside, then renamed)."""
    path = _cache_path(arch)
    if path is not None:
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError:
            pass
    image = compile_kernel(arch)
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(image)
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("kernel cache not written (%s)", exc)
    return image


# ---------------------------------------------------------------------------------------------- launch plan
@dataclass(frozen=True)
class LaunchPlan:
    units_per_block: int  # half-warps per block (blockDim.x = 16 x this)
    blocks: int
    smem_tables: bool  # the model in shared memory (else read through the caches)
    smem_rows: bool  # the units' row buffers in shared memory (else a global scratch tensor)
    smem_bytes: int  # dynamic shared memory per block

    @property
    def threads(self) -> int:
        return 16 * self.units_per_block


def make_plan(units: int, blob_bytes: int, K: int, Wb: int, upb: int, smem_tables: bool, smem_rows: bool) -> LaunchPlan:
    """The launch of `units` half-warps with upb of them a block, the model and the row buffers in shared memory or
    not: the dynamic shared memory it takes (the kernel's layout: the model, each unit's rows, each unit's 16
    spilled states)."""
    rows = -(-2 * K * Wb * 2 // _ROW_ALIGN) * _ROW_ALIGN
    tab = -(-blob_bytes // 16) * 16
    smem = (tab if smem_tables else 0) + upb * ((rows if smem_rows else 0) + 128)
    return LaunchPlan(upb, -(-units // upb), smem_tables, smem_rows, smem)


def plan_launch(
    units: int, blob_bytes: int, K: int, Wb: int, sms: int, smem_block: int, smem_sm: int, regs: int = 255
) -> LaunchPlan:
    """How to launch `units` half-warps: one unit a block, with the model (blob_bytes) in shared memory when that
    keeps as many units resident at once as reading it through the caches does (each block holds its own copy,
    so a large model in shared memory allows one or two blocks an SM), then its two block rows (2 K Wb int16) in
    shared memory when they fit, and 16 spilled states. Why one unit a block: a unit's decode is one long chain
    of dependent steps whose serial sections (DC, F_LT planes) run on one lane; two units sharing a warp wait
    for each other's divergent sections, which costs more than the model's shared-memory copy saves
    (`python -m benchmarks gpu-ctxrans --plans` times every layout on a GPU). `make_plan` builds the others."""
    best = None
    for smem_tables in (True, False):
        for smem_rows in (True, False):
            plan = make_plan(units, blob_bytes, K, Wb, 1, smem_tables, smem_rows)
            if plan.smem_bytes > smem_block:
                continue
            per_sm = min(32, smem_sm // plan.smem_bytes, 65536 // (regs * 32))
            resident = min(units, per_sm * sms)
            score = (resident, smem_tables, smem_rows)
            if best is None or score > best[0]:
                best = (score, plan)
    if best is None:  # no shared memory at all would be needed beyond 128 bytes a unit: any GPU has that
        raise DctDataError(f"the GPU entropy decoder needs {128} bytes of shared memory a unit. Got {smem_block}")
    return best[1]


# ---------------------------------------------------------------------------------------------- CUDA
class _Device:
    """The kernels loaded in one device's primary context (torch's), and its limits."""

    def __init__(self, index: int) -> None:
        from cuda.bindings import driver

        self.driver = driver
        self.index = index
        _cu(driver.cuInit(0))
        self.dev = _cu(driver.cuDeviceGet(index))
        self.ctx = _cu(driver.cuDevicePrimaryCtxRetain(self.dev))
        attr = driver.CUdevice_attribute
        self.sms = _cu(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev))
        self.smem_block = _cu(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.dev)
        )
        self.smem_sm = _cu(
            driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, self.dev)
        )
        major, minor = torch.cuda.get_device_capability(index)
        self.arch = f"sm_{major}{minor}"
        image = _cached_image(self.arch)
        with self.current():
            self.module = _cu(driver.cuModuleLoadData(image))
            self.functions = {
                k: _cu(driver.cuModuleGetFunction(self.module, name.encode())) for k, name in _KERNELS.items()
            }
        self.smem_set = {k: 48 << 10 for k in _KERNELS}
        num_regs = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
        self.regs = max(_cu(driver.cuFuncGetAttribute(num_regs, f)) for f in self.functions.values())

    def current(self) -> _PushContext:
        return _PushContext(self.driver, self.ctx)

    def launch(
        self,
        itemsize: int,
        plan: LaunchPlan,
        stream: int,
        args: Sequence[ctypes.c_void_p | ctypes.c_int64 | ctypes.c_int32],
    ) -> None:
        driver = self.driver
        fn = self.functions[itemsize]
        with self.current():
            if plan.smem_bytes > self.smem_set[itemsize]:
                attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                _cu(driver.cuFuncSetAttribute(fn, attr, plan.smem_bytes))
                self.smem_set[itemsize] = plan.smem_bytes
            ptrs = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
            _cu(
                driver.cuLaunchKernel(
                    fn, plan.blocks, 1, 1, plan.threads, 1, 1, plan.smem_bytes, driver.CUstream(stream),
                    ctypes.addressof(ptrs), 0,
                )
            )  # fmt: skip


class _PushContext:
    def __init__(self, driver: Any, ctx: Any) -> None:  # cuda.bindings.driver and its context handle
        self.driver, self.ctx = driver, ctx

    def __enter__(self) -> None:
        _cu(self.driver.cuCtxPushCurrent(self.ctx))

    def __exit__(self, *exc: object) -> None:
        _cu(self.driver.cuCtxPopCurrent())


def _cu(result: Any) -> Any:  # cuda.bindings' results and values have no type hints
    """A cuda.bindings driver call's value, or DctDataError naming its error."""
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise DctDataError(f"the GPU entropy decoder: CUDA driver error {name.decode() if name else err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


_DEVICES: dict[int, _Device] = {}
_DEVICES_LOCK = threading.Lock()


def _device(index: int) -> _Device:
    with _DEVICES_LOCK:
        dev = _DEVICES.get(index)
        if dev is None:
            dev = _DEVICES[index] = _Device(index)
        return dev


def launch_info(
    codec: CtxCodec, sample_shape: Sequence[int], n: int, device: torch.device | str = "cuda"
) -> dict[str, Any]:
    """How `decode_batch` launches n samples of sample_shape on a CUDA device (compiles the kernel if it was not):
    the architecture, registers a thread, units per sample, and the launch plan. For benchmarks' records."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    dev = _device(index)
    sample_shape = kernel_shape(codec, sample_shape)
    units = units_per_sample(codec, sample_shape)
    blob = -(-len(codec._blob) // 16) * 16
    _, _Hb, K, Wb = (int(s) for s in sample_shape)
    plan = plan_launch(n * units, blob, K, Wb, dev.sms, dev.smem_block, dev.smem_sm, dev.regs)
    return {"arch": dev.arch, "registers": dev.regs, "sms": dev.sms, "units_per_sample": units, "model_bytes": blob,
            **plan.__dict__, "threads": plan.threads}  # fmt: skip


def _device_blob(codec: CtxCodec, device: torch.device) -> torch.Tensor:
    """The codec's model on the device, padded to 16 bytes; uploaded once per codec and device."""
    cache: dict[int | None, torch.Tensor] = codec.__dict__.setdefault("_device_blobs", {})
    blob = cache.get(device.index)
    if blob is None:
        raw = np.asarray(codec._blob, np.uint8)
        padded = np.zeros(-(-len(raw) // 16) * 16, np.uint8)
        padded[: len(raw)] = raw
        blob = cache[device.index] = torch.from_numpy(padded).to(device)
    return blob


def _decode_cuda(
    codec: CtxCodec,
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    shape: tuple[int, ...],
    dt: torch.dtype,
    itemsize: int,
    n: int,
    units: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    device = buffer.device
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out = torch.empty((n, *shape), dtype=dt, device=device)
    status = torch.full((n,), _KEY_NONE, dtype=torch.int32, device=device)
    if n == 0:
        return out, status.zero_()
    dev = _device(device.index)
    blob = _device_blob(codec, device)
    buffer = buffer.contiguous()
    offsets = offsets.to(device=device, non_blocking=True).contiguous()
    C, Hb, K, Wb = shape
    total = n * units
    plan = plan_launch(total, blob.numel(), K, Wb, dev.sms, dev.smem_block, dev.smem_sm, dev.regs)
    rows = None if plan.smem_rows else torch.empty(total * 2 * K * Wb, dtype=torch.int16, device=device)
    stream = torch.cuda.current_stream(device)
    args: list[ctypes.c_void_p | ctypes.c_int64 | ctypes.c_int32] = [
        ctypes.c_void_p(buffer.data_ptr()),
        ctypes.c_int64(buffer.numel()),
        ctypes.c_void_p(offsets.data_ptr()),
        ctypes.c_int32(n),
        ctypes.c_void_p(blob.data_ptr()),
        ctypes.c_int32(blob.numel()),
        ctypes.c_int32(int(plan.smem_tables)),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int32(C),
        ctypes.c_int32(Hb),
        ctypes.c_int32(K),
        ctypes.c_int32(Wb),
        ctypes.c_int32(units),
        ctypes.c_void_p(0 if rows is None else rows.data_ptr()),
        ctypes.c_void_p(status.data_ptr()),
    ]
    with torch.cuda.device(device):
        dev.launch(itemsize, plan, stream.cuda_stream, args)
    for t in (buffer, offsets, blob, out, status) + (() if rows is None else (rows,)):
        t.record_stream(stream)
    return out, torch.where(status == _KEY_NONE, torch.zeros_like(status), status)
