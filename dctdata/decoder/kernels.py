"""The one kernel dispatch of the decode: which kernel turns a batch of coefficients into samples.

Every decode site calls `decode`: the functional decode (`dctdata.decompress`), the 2-D layer
(`Decompress`) and the volume layer (`VolumeDecompress`). Each supplies a `Source` (its codec's tables for
the fused kernels and its own torch graph) and `decode` runs the first registered kernel, for the
sample's dimensions, that is usable for the coefficients, the output dtype and `out`. A new kernel is one
`register` call, not a new branch at three sites (the registry of torchvision's v2 transforms works the
same way: kernels registered per kind of input, one function picks).

The kernels and when each is chosen, first usable wins (`choose` names it without decoding):

2-D samples (C, H, W):
1. `fused_cuda`, the Triton kernel (`dctdata.decoder.fused_cuda`): CUDA tensors in eager mode (not under
   torch.compile, torch.export, ONNX export, jit tracing or torch.func, no autograd to record), Triton
   importable, not switched off (environment `DCTDATA_TRITON_KERNEL=0`, or an earlier compile or launch
   failure in this process), coefficients int8/int16/float16/bfloat16/float32, a float32, float16 or
   bfloat16 output, `out` (when given) contiguous. When its compile or launch fails it is switched off
   for the process and the next usable kernel decodes the batch.
2. `fused_cpu`, the C kernel (`dctdata.decoder.fused`): plain CPU tensors in eager mode, the extension
   built with its AVX2+FMA inner loop, not switched off (`DCTDATA_FUSED_KERNEL=0`), coefficients
   int8/int16/float16/bfloat16/float32, a float32 output, `out` (when given) contiguous.
3. `torch`: everything else (float64, other devices, autograd, compile, export, ONNX, the kernels off):
   the site's torch graph (`Source._portable`), whose export holds only matmul/reshape-class ops.

Volumes (C, D, H, W): `fused_cpu` (`fused.synthesize_volume`, under the same rules), then `torch`. No
CUDA kernel is registered for volumes: on CUDA they take the torch graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda
from dctdata.errors import DctDataError

__all__ = ["Kernel", "Source", "choose", "decode", "kernels", "register"]


class Source(Protocol):
    """What a decode site hands `decode`: the codec's tables, built once per site, and its torch graph."""

    def _tables(self) -> fused.Tables:
        """The fused kernels' host tables (`fused.tables_for`)."""
        ...

    def _tables_on(self, device: torch.device) -> fused_cuda.DeviceTables:
        """The fused CUDA kernel's tables on `device`."""
        ...

    def _portable(
        self, q: torch.Tensor, side: torch.Tensor | None, out: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The site's torch graph: the decode every input takes when no fused kernel is usable."""
        ...


# usable(q, dtype, out): may this kernel decode coefficients q into `dtype` (into `out` when given)?
Usable = Callable[[torch.Tensor, torch.dtype, "torch.Tensor | None"], bool]
# run(source, q, side, out, dtype, cf, mask, size): the samples, or None when the kernel failed to launch
# and switched itself off (the next usable kernel then runs)
Run = Callable[..., "torch.Tensor | None"]


@dataclass(frozen=True)
class Kernel:
    """One registered kernel: its name (what `choose` returns), when it is usable, how it runs."""

    name: str
    usable: Usable
    run: Run


def _cuda_usable(q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> bool:
    return fused_cuda.usable(q, dtype, out)  # looked up per call: tests and benchmarks stub it


def _cpu_usable(q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> bool:
    return fused.usable(q, dtype, out)


def _run_cuda(
    source: Source,
    q: Tensor,
    side: Tensor | None,
    out: Tensor | None,
    dtype: torch.dtype,
    cf: int,
    mask: str,
    size: tuple[int, ...],
) -> torch.Tensor | None:
    tables = source._tables_on(q.device)
    h, w = size  # a 2-D sample's size (no CUDA kernel is registered for volumes)
    return fused_cuda.guarded(fused_cuda.synthesize, q, tables, cf, mask, (h, w), out, side, dtype)


def _run_cpu(
    source: Source,
    q: Tensor,
    side: Tensor | None,
    out: Tensor | None,
    dtype: torch.dtype,
    cf: int,
    mask: str,
    size: tuple[int, ...],
) -> torch.Tensor:
    h, w = size  # a 2-D sample's size
    return fused.synthesize(q, source._tables(), cf, mask, (h, w), out=out, side=side)


def _run_cpu_volume(
    source: Source,
    q: Tensor,
    side: Tensor | None,
    out: Tensor | None,
    dtype: torch.dtype,
    cf: int,
    mask: str,
    size: tuple[int, ...],
) -> torch.Tensor:
    d, h, w = size  # a volume's size
    return fused.synthesize_volume(q, source._tables(), cf, mask, (d, h, w), out=out, side=side)


def _run_torch(
    source: Source,
    q: Tensor,
    side: Tensor | None,
    out: Tensor | None,
    dtype: torch.dtype,
    cf: int,
    mask: str,
    size: tuple[int, ...],
) -> torch.Tensor:
    return source._portable(q, side, out, dtype)


def _always(q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> bool:
    return True


_TORCH = Kernel("torch", _always, _run_torch)
# sample dims -> kernels, in the order they are tried; the last one is usable for every input
_REGISTRY: dict[int, list[Kernel]] = {
    2: [Kernel("fused_cuda", _cuda_usable, _run_cuda), Kernel("fused_cpu", _cpu_usable, _run_cpu), _TORCH],
    3: [Kernel("fused_cpu", _cpu_usable, _run_cpu_volume), _TORCH],
}


def _listed(dims: object) -> list[Kernel]:
    kernels = _REGISTRY.get(dims) if isinstance(dims, int) else None
    if kernels is None:
        raise DctDataError(f"dims: expected one of {sorted(_REGISTRY)} (2-D samples or volumes). Got {dims!r}")
    return kernels


def kernels(dims: int) -> tuple[str, ...]:
    """The names of the kernels registered for samples of `dims` spatial dimensions, in the order tried."""
    return tuple(k.name for k in _listed(dims))


def register(dims: int, kernel: Kernel, before: str = "torch") -> None:
    """Add `kernel` for samples of `dims` dimensions, tried just before the registered kernel `before`
    (default: before the torch graph, after the fused kernels). A kernel of the same name is replaced."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel: expected a dctdata.decoder.kernels.Kernel. Got {type(kernel).__name__}")
    listed = [k for k in _listed(dims) if k.name != kernel.name]
    names = [k.name for k in listed]
    if before not in names:
        raise DctDataError(f"before: expected one of {names}. Got {before!r}")
    listed.insert(names.index(before), kernel)
    _REGISTRY[dims] = listed


def choose(dims: int, q: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None) -> str:
    """The name of the kernel `decode` tries first for coefficients `q`, output `dtype` and `out` (the
    rules are in the module docstring)."""
    return next(k.name for k in _listed(dims) if k.usable(q, dtype, out))


def decode(
    source: Source,
    q: torch.Tensor,
    dtype: torch.dtype,
    cf: int,
    mask: str,
    size: tuple[int, ...],
    out: torch.Tensor | None = None,
    side: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode the batch `q` (B, C, Hb, K, Wb), or (B, C, Db, Hb, K, Wb) for volumes (`len(size) == 3`), into
    samples of `dtype` (in `out` when given) with the first usable kernel (see the module docstring).

    Args:
        source: The decode site's codec tables and torch graph (`Source`).
        q: The coefficient batch in a wire dtype (or float64).
        dtype: The output dtype.
        cf: The codec's chop factor.
        mask: The codec's mask.
        size: The sample's spatial size, (H, W) or (D, H, W).
        out: A buffer of the output's shape and dtype to write into, or None.
        side: The per-sample (range, mid) values (B, C, 2) of a codec that carries them, or None.

    Returns:
        The decoded samples. When `out` is given it holds them too: the fused kernels write it and return it,
        the torch graphs write it and may return a tensor of their own.

    Raises:
        DctDataError: `size` has neither 2 nor 3 dimensions, or no registered kernel decoded the batch.
    """
    for kernel in _listed(len(size)):
        if kernel.usable(q, dtype, out):
            img = kernel.run(source, q, side, out, dtype, cf, mask, size)
            if img is not None:
                return img
    # not reached while the torch kernel is registered last (it always runs)
    raise DctDataError(f"decode: no kernel decoded coefficients {q.dtype} {tuple(q.shape)}")
