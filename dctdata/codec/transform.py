"""Pure DCT+Chop kernels: orthonormal 8x8 DCT-II basis, frequency masks, compress/decompress.

Coefficient layout (block-row frequency-planar): an image of shape (..., H, W) becomes
(..., Hb, K, Wb) with Hb = ceil(H / 8), Wb = ceil(W / 8) and K the number of kept frequencies.
Row [hb, k, :] holds frequency (u_k, v_k) of the Wb blocks of block row hb; kept frequencies are
listed in row-major (u, v) order (see `kept_frequencies`). Runs of one frequency are smooth, which
zstd likes, and the inverse transform reads them as a transposed BLAS operand and writes image rows
directly, with no permute pass (the fully planar (..., K, Hb, Wb) order needs one extra transpose
pass over a full-size tensor; `python -m benchmarks codec` measures the result). A DCT-domain network that
wants (K, Hb, Wb) planes gets them with `coeffs.transpose(-3, -2)`.

All work is per block (two small separable matmuls), so the cost per pixel does not depend on the
image size. `synthesize` has two kernels with the same math: a portable graph of matmul/reshape/
transpose/cat ops (CUDA, autograd, torch.compile, torch.export, ONNX) and, for plain CPU tensors in
eager mode, a chunked kernel that keeps every intermediate in cache and writes the output once.
`Decompress` and `dctdata.decompress` (`dctdata.decoder.functional`) take a fused kernel before both where one
applies: the C kernel of `dctdata.decoder.fused` on CPU, the Triton kernel of `dctdata.decoder.fused_cuda` on CUDA
(dequantization and inverse DCT in one pass); this module's kernels are their fallback.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TypeAlias

import torch
import torch.nn.functional as F

from dctdata.errors import DctDataError
from dctdata.parse import is_int, parse_int

BLOCK = 8
MASKS = ("square", "triangle")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# A dequantization or normalization table as callers hold it: a tensor, or the nested tuples of a CodecSpec.
TableLike: TypeAlias = torch.Tensor | Sequence[float] | Sequence[Sequence[float]]
# The chunked kernel's `prepare`: (coefficient rows of images b0:b1, b0, b1) -> the rows ready for the matmuls.
Prepare: TypeAlias = Callable[[torch.Tensor, int, int], torch.Tensor]


def parse_cf(cf: object) -> int:
    """Validate a chop factor: an int in 1..8."""
    return parse_int(cf, "cf", minimum=1, maximum=BLOCK)


def parse_mask(mask: object) -> str:
    """Validate a mask name."""
    if not isinstance(mask, str):
        raise TypeError(f"mask: expected one of {MASKS}. Got {mask!r} of type {type(mask).__name__}")
    if mask not in MASKS:
        raise DctDataError(f"mask: expected one of {MASKS}. Got {mask!r}")
    return mask


@functools.cache
def kept_frequencies(cf: int, mask: str = "square") -> tuple[tuple[int, int], ...]:
    """The (u, v) frequencies kept by a mask, in row-major order: plane k of the layout is entry k.

    Args:
        cf: The chop factor 1..8: frequencies u, v < cf are candidates.
        mask: "square" (u, v < cf: cf^2 kept) or "triangle" (u + v < cf: cf(cf+1)/2 kept).

    Returns:
        The K kept (u, v) pairs, in the order of the coefficient layout's K axis.

    Raises:
        DctDataError: `cf` is outside 1..8 or `mask` is not a known mask.
    """
    cf, mask = parse_cf(cf), parse_mask(mask)
    if mask == "square":
        return tuple((u, v) for u in range(cf) for v in range(cf))
    return tuple((u, v) for u in range(cf) for v in range(cf) if u + v < cf)


def num_kept(cf: int, mask: str = "square") -> int:
    """K: coefficients kept per 8x8 block (cf^2 for square, cf(cf+1)/2 for triangle).

    Args:
        cf: The chop factor 1..8: frequencies u, v < cf are candidates.
        mask: "square" (u, v < cf: cf^2 kept) or "triangle" (u + v < cf: cf(cf+1)/2 kept).

    Returns:
        K, the number of coefficients kept per 8x8 block.

    Raises:
        DctDataError: `cf` is outside 1..8 or `mask` is not a known mask.
    """
    return len(kept_frequencies(cf, mask))


def grid_shape(height: int, width: int) -> tuple[int, int]:
    """Blocks per column and row once an H x W image is padded to a multiple of 8."""
    return math.ceil(height / BLOCK), math.ceil(width / BLOCK)


@functools.cache
def _dct_matrix_f64() -> torch.Tensor:
    n = BLOCK
    i = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    t = math.sqrt(2.0 / n) * torch.cos(math.pi * (2 * j + 1) * i / (2 * n))
    t[0, :] = 1.0 / math.sqrt(n)
    return t


def dct_matrix(dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """Orthonormal DCT-II matrix T (8 x 8): T[0, j] = 1/sqrt(8), T[i, j] = sqrt(2/8) cos(pi (2j+1) i / 16).

    Args:
        dtype: The dtype of the matrix.
        device: The device of the matrix (default: the CPU).

    Returns:
        The (8, 8) orthonormal DCT-II matrix T.
    """
    return _dct_matrix_f64().to(dtype=dtype, device=device)


@functools.cache
def _basis_f64(cf: int, mask: str) -> torch.Tensor:
    t = _dct_matrix_f64()
    outer = torch.einsum("ui,vj->uvij", t, t).reshape(BLOCK, BLOCK, BLOCK * BLOCK)
    idx = kept_frequencies(cf, mask)
    return torch.stack([outer[u, v] for u, v in idx])


def basis(
    cf: int, mask: str = "square", dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """(K, 64) synthesis basis: row k is the 8x8 image of frequency (u_k, v_k), flattened row-major.

    Its rows are orthonormal, so analysis is `blocks @ basis.T` and synthesis `coeffs @ basis`.

    Args:
        cf: The chop factor 1..8: frequencies u, v < cf are candidates.
        mask: "square" (u, v < cf: cf^2 kept) or "triangle" (u + v < cf: cf(cf+1)/2 kept).
        dtype: The dtype of the basis.
        device (torch.device | str | None): The device of the basis (default: the CPU).

    Returns:
        The (K, 64) synthesis basis, K = `num_kept(cf, mask)`.

    Raises:
        DctDataError: `cf` is outside 1..8 or `mask` is not a known mask.
    """
    return _basis_f64(parse_cf(cf), parse_mask(mask)).to(dtype=dtype, device=device)


def _check_image(x: object, name: str = "x", axes: str = "H, W") -> torch.Tensor:
    """x as a float tensor of shape (..., *axes) with every one of those axes at least 1 (`axes`: "H, W" for
    images, "D, H, W" for volumes)."""
    rank = axes.count(",") + 1
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape (..., {axes}). Got {type(x).__name__}")
    if x.dim() < rank:
        raise DctDataError(f"{name}: expected rank >= {rank} with shape (..., {axes}). Got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a floating tensor (float16, bfloat16, float32 or float64). Got {x.dtype}")
    if min(x.shape[-rank:]) == 0:
        raise DctDataError(f"{name}: expected {axes} >= 1. Got shape {tuple(x.shape)}")
    return x


PADS = ("edge", "symmetric", "extend")
# What the encoder writes (format version 7): a partial block is filled from its own pixels only (`extend_axis`).
DEFAULT_PAD = "extend"
# "extend": an axis's last block with at least this many known pixels is mirrored inside itself; with fewer,
# the mirror would reach into the previous block, and the smooth fill below costs less.
EXTEND_MIRROR_FROM = BLOCK // 2


def _mirror(n: int, m: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Indices 0..m-1 into an axis of length n, extended half-sample symmetrically (x[n+j] = x[n-1-j])."""
    i = torch.arange(m, device=device) % (2 * n)
    return torch.where(i >= n, 2 * n - 1 - i, i)


@functools.cache
def _smooth_fill(r: int) -> tuple[tuple[float, ...], ...]:
    """(8 - r) rows of r weights: the padded values of a block with r known values along an axis that minimise
    sum_u u c_u^2 over the block's DCT coefficients c (a least-squares fill: the known values fixed, the
    higher frequencies the smaller; a constant stays a constant). As float32 numbers."""
    t = _dct_matrix_f64()
    a = t.T @ torch.diag(torch.arange(BLOCK, dtype=torch.float64)) @ t
    m = -torch.linalg.solve(a[r:, r:], a[r:, :r])
    return tuple(tuple(float(torch.tensor(v, dtype=torch.float32)) for v in row) for row in m.tolist())


def extend_axis(x: torch.Tensor, axis: int, n: int) -> torch.Tensor:
    """x with its axis `axis` (length n) filled to whole blocks from the last block's own r = n mod 8 known
    values: mirrored inside the block (x[n+j] = x[n-1-j]) when r >= EXTEND_MIRROR_FROM (r = 4 makes the
    block symmetric: its odd frequencies vanish), else the smooth fill of `_smooth_fill`. Elementwise
    float32 arithmetic (no matmul), so a value does not depend on the batch it is coded in."""
    r = n % BLOCK
    if r == 0:
        return x
    if r >= EXTEND_MIRROR_FROM:
        idx = torch.arange(n - 1, n - 1 - (BLOCK - r), -1, device=x.device)
        return torch.cat([x, x.index_select(axis, idx)], axis)
    known = [x.narrow(axis, n - r + i, 1) for i in range(r)]
    rows = []
    for weights in _smooth_fill(r):
        acc = known[0] * weights[0]
        for k, w in zip(known[1:], weights[1:], strict=True):
            acc = acc + k * w
        rows.append(acc)
    return torch.cat([x, *rows], axis)


def pad_to_blocks(x: torch.Tensor, pad: str = DEFAULT_PAD) -> torch.Tensor:
    """(N, H, W) -> (N, Hb*8, Wb*8). "extend" fills each partial block from its own pixels (`extend_axis`, W then
    H), so its padded part costs (nearly) nothing; "symmetric" mirrors the sample (half-sample symmetric), which
    for a block with fewer than 4 pixels along an axis copies the previous block's pixels in; "edge" repeats
    the last row and column, a step at the border. The decoder crops either way."""
    _n, h, w = x.shape
    hb, wb = grid_shape(h, w)
    if hb * BLOCK == h and wb * BLOCK == w:
        return x
    if pad == "extend":
        return extend_axis(extend_axis(x, -1, w), -2, h)
    if pad == "edge":
        return F.pad(x.unsqueeze(1), (0, wb * BLOCK - w, 0, hb * BLOCK - h), mode="replicate").squeeze(1)
    if pad != "symmetric":
        raise DctDataError(f"pad: expected one of {PADS}. Got {pad!r}")
    return x.index_select(-2, _mirror(h, hb * BLOCK, x.device)).index_select(-1, _mirror(w, wb * BLOCK, x.device))


def to_blocks(x: torch.Tensor, pad: str = DEFAULT_PAD) -> torch.Tensor:
    """(N, H, W) -> (N, Hb*Wb, 64): pad to a multiple of 8, then one row per block."""
    n, h, w = x.shape
    hb, wb = grid_shape(h, w)
    x = pad_to_blocks(x, pad)
    return x.reshape(n, hb, BLOCK, wb, BLOCK).permute(0, 1, 3, 2, 4).reshape(n, hb * wb, BLOCK * BLOCK)


def compress(x: torch.Tensor, cf: int = 8, mask: str = "square", pad: str = DEFAULT_PAD) -> torch.Tensor:
    """(..., H, W) float -> (..., Hb, K, Wb) float32 DCT coefficients of the kept frequencies.

    Args:
        x: Float samples (..., H, W), any H, W >= 1 (float16, bfloat16, float32 or float64).
        cf: The chop factor 1..8: frequencies u, v < cf are candidates.
        mask: "square" (u, v < cf: cf^2 kept) or "triangle" (u + v < cf: cf(cf+1)/2 kept).
        pad: How a sample is filled to whole 8x8 blocks: "extend" (each partial block from its own pixels,
            `extend_axis`), "symmetric" (half-sample mirror, format versions 2-6) or "edge" (replicate the edge, as
            version-1 packs).

    Returns:
        The float32 coefficients (..., Hb, K, Wb), Hb = ceil(H / 8), Wb = ceil(W / 8).

    Raises:
        TypeError: `x` is not a floating torch.Tensor.
        DctDataError: `x` has fewer than two axes or an empty one, or `cf`, `mask` or `pad` is invalid.
    """
    x = _check_image(x)
    m = basis(cf, mask, dtype=torch.float32, device=x.device)
    *lead, h, w = x.shape
    hb, wb = grid_shape(h, w)
    blocks = to_blocks(x.reshape(-1, h, w).to(torch.float32), pad)
    coeffs = torch.matmul(blocks, m.T).reshape(-1, hb, wb, m.shape[0])  # (N, Hb, Wb, K)
    return coeffs.transpose(-1, -2).reshape(*lead, hb, m.shape[0], wb)


def parse_size(size: object) -> tuple[int, int]:
    """Validate an output (H, W)."""
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise TypeError(f"size: expected a pair (H, W). Got {size!r}")
    h, w = size
    for name, v in (("H", h), ("W", w)):
        if not is_int(v):
            raise TypeError(f"size: expected integer {name}. Got {v!r}")
        if v < 1:
            raise DctDataError(f"size: expected {name} >= 1. Got {v}")
    return int(h), int(w)


def check_coeff_grid(shape: tuple[int, ...], k: int, size: tuple[int, int], name: str = "coefficients") -> None:
    """Raise unless `shape` ends in (Hb, K, Wb) matching K kept frequencies and an H x W image."""
    hb, wb = grid_shape(*size)
    if len(shape) < 3 or tuple(shape[-3:]) != (hb, k, wb):
        raise DctDataError(
            f"{name}: expected shape (..., Hb, K, Wb) = (..., {hb}, {k}, {wb}) for K={k} kept frequencies "
            f"and size {size}. Got {tuple(shape)}"
        )


def fold_basis(
    cf: int,
    mask: str = "square",
    channels: int = 1,
    steps: TableLike | None = None,
    offsets: TableLike | None = None,
    mean: TableLike | None = None,
    std: TableLike | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Fold dequantization (coef = q * step + offset) and normalization ((x - mean) / std) into the
    separable synthesis weights, so decoding stays one pass: two small matmuls and no elementwise
    work on the data.

    Returns (wcol, zbias, trows) in float64: wcol (C, cf, cf, 8) with wcol[c, u, v, j] =
    step[c, (u, v)] * T[v, j] / std[c] (zero for frequencies the mask drops); zbias (C, cf, 8) or
    None, the per-row bias of the first stage; trows (cf, 8) = T[:cf]. Tables are (C, K) / (C,).
    """
    cf, mask = parse_cf(cf), parse_mask(mask)
    t = _dct_matrix_f64()
    idx = kept_frequencies(cf, mask)
    k = len(idx)
    f64 = torch.float64
    s = torch.ones(channels, k, dtype=f64) if steps is None else torch.as_tensor(steps, dtype=f64).reshape(channels, k)
    inv_std = (
        torch.ones(channels, dtype=f64) if std is None else 1.0 / torch.as_tensor(std, dtype=f64).reshape(channels)
    )
    wcol = torch.zeros(channels, cf, cf, BLOCK, dtype=f64)
    for kk, (u, v) in enumerate(idx):
        wcol[:, u, v, :] = (s[:, kk] * inv_std).unsqueeze(1) * t[v]
    zbias = None
    if offsets is not None or mean is not None:
        zbias = torch.zeros(channels, cf, BLOCK, dtype=f64)
        if offsets is not None:
            o = torch.as_tensor(offsets, dtype=f64).reshape(channels, k)
            for kk, (u, v) in enumerate(idx):
                zbias[:, u, :] += (o[:, kk] * inv_std).unsqueeze(1) * t[v]
        if mean is not None:
            # T[0, i] = 1/sqrt(8) for every i, so a constant c on row u=0 scaled by sqrt(8) adds c everywhere.
            m = torch.as_tensor(mean, dtype=f64).reshape(channels)
            zbias[:, 0, :] -= (m * inv_std * math.sqrt(BLOCK)).unsqueeze(1)
    return wcol, zbias, t[:cf].clone()


def fold_shift(
    shape: tuple[int, int],
    steps: TableLike | None = None,
    offsets: TableLike | None = None,
    mean: TableLike | None = None,
) -> torch.Tensor | None:
    """`fold_basis`'s first-stage bias as a (C, K) = `shape` float64 term added to the stored coefficients
    before the folded weights: (offset - 8 mean [k is DC]) / step (the DC basis function is 1/8
    everywhere), or None when there is no bias. Tables as for `fold_basis`."""
    if offsets is None and mean is None:
        return None
    as64 = functools.partial(torch.as_tensor, dtype=torch.float64)
    shift = torch.zeros(shape, dtype=torch.float64) if offsets is None else as64(offsets).reshape(shape).clone()
    if mean is not None:
        shift[:, 0] -= BLOCK * as64(mean).reshape(shape[0])
    return shift if steps is None else shift / as64(steps).reshape(shape)


def square_planes(coeffs: torch.Tensor, cf: int, mask: str) -> torch.Tensor:
    """(..., K, Wb) -> (..., cf, cf, Wb): frequency (u, v) at [u, v]; frequencies the mask drops are zero."""
    *lead, _k, wb = coeffs.shape
    if mask == "square":
        return coeffs.reshape(*lead, cf, cf, wb)
    rows, start = [], 0
    for u in range(cf):
        n = cf - u  # triangle keeps v < cf - u in row u
        row = coeffs[..., start : start + n, :]
        start += n
        if n < cf:
            row = torch.cat([row, row.new_zeros(*lead, cf - n, wb)], dim=-2)
        rows.append(row)
    return torch.stack(rows, dim=-3)


def augment_bias(wcol: torch.Tensor, zbias: torch.Tensor | None) -> torch.Tensor:
    """Append the first-stage bias as an extra v-row of the weights: (C, U, V, 8) -> (C, U, V+1, 8).

    `synthesize(..., bias_row=True)` pairs it with a row of ones appended to the coefficients, so the
    bias rides inside the matmul instead of costing a pass over the intermediate.
    """
    if zbias is None:
        return wcol
    return torch.cat([wcol, zbias.unsqueeze(2)], dim=2)


CHUNK_BYTES = 1 << 20  # output bytes per step of the chunked CPU kernel: its intermediates stay in L2


def eager_cpu(*tensors: torch.Tensor) -> bool:
    """True when the chunked CPU kernel may run: plain CPU tensors, eager mode, no autograd to record.

    torch.compile, torch.export (fake and functional tensors are subclasses), jit tracing, ONNX
    export and torch.func transforms (vmap, grad) all see the portable path, so exported graphs keep
    matmul/reshape/transpose/cat ops only.
    """
    return eager_on("cpu", *tensors)


def eager_on(device_type: str, *tensors: torch.Tensor) -> bool:
    """`eager_cpu` for plain tensors on devices of `device_type` ("cpu", "cuda"): the condition of the
    hand-written kernels (the fused C kernel on CPU, the fused Triton kernel on CUDA)."""
    if torch.compiler.is_compiling() or getattr(torch.compiler, "is_exporting", lambda: False)():
        return False
    if getattr(torch._C, "_are_functorch_transforms_active", lambda: False)():
        return False
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    grad = torch.is_grad_enabled()
    return all(
        type(t) is torch.Tensor and t.device.type == device_type and not (grad and t.requires_grad) for t in tensors
    )


def synthesize(
    coeffs: torch.Tensor,
    weight: torch.Tensor,
    trows: torch.Tensor,
    mask: str,
    size: tuple[int, int],
    bias_row: bool = False,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    prepare: Prepare | None = None,
) -> torch.Tensor:
    """Inverse transform of (B, C, Hb, K, Wb) coefficients (any real dtype) -> (B, C, H, W) in `dtype`
    (default: weight's dtype), written into `out` when given. With `bias_row`, `shift` (C, K) is the
    same bias as an additive term on the coefficients (`fold_shift`), which the chunked kernel uses.
    `prepare(coeffs[b0:b1, :, r0:r1], b0, b1)`, when given, turns stored coefficients into the float
    ones to synthesize (the v2 affine pass); the chunked kernel calls it on each slice in cache.

    Plain CPU tensors in eager mode with one intra-op thread take `synthesize_chunked` (same math, a few
    block rows at a time, written straight into the output); everything else (CUDA, autograd, compile,
    export, ONNX) takes `synthesize_portable`, whose graph is matmul/reshape/transpose/cat only. With
    several threads the chunked kernel's hundred small ops per call each pay a thread barrier, which
    makes it slower than the portable graph's few large matmuls, so it is kept to one thread, the
    setting `balance_threads` gives a main process next to its workers.
    """
    b, c, _hb, _, _wb = coeffs.shape
    dtype = weight.dtype if dtype is None else dtype
    eager = eager_cpu(coeffs, weight, trows) and (out is None or eager_cpu(out))  # first: compile never asks threads
    if eager and (shift is not None or not bias_row) and torch.get_num_threads() == 1:
        if out is None:
            out = torch.empty(b, c, *size, dtype=dtype)
        if prepare is None:
            prepare = _converter(weight.dtype, shift)
        return synthesize_chunked(coeffs, weight[:, :, :-1] if bias_row else weight, trows, mask, out, prepare)
    if prepare is not None:
        coeffs = prepare(coeffs, 0, b)
    img = synthesize_portable(coeffs, weight, trows, mask, size, bias_row).to(dtype)
    if out is None:
        return img
    return out.copy_(img)


def synthesize_portable(
    coeffs: torch.Tensor,
    weight: torch.Tensor,
    trows: torch.Tensor,
    mask: str,
    size: tuple[int, int],
    bias_row: bool = False,
) -> torch.Tensor:
    """Inverse transform of (B, C, Hb, K, Wb) coefficients (any real dtype) -> (B, C, H, W) in weight's dtype.

    Separable per block: stage 1 contracts v with the folded column weights into
    Z[b, c, hb, u, wb, j] (the coefficients enter as a transposed operand, no copy); stage 2
    contracts u with T and writes image rows in raster order. With `bias_row`, `weight` carries
    the bias as its last v-row (`augment_bias`) and a row of ones is appended to the coefficients;
    that concatenation also does the integer-to-float conversion, so it costs no extra pass. Only
    matmul/reshape/transpose/cat ops, so it exports to ONNX.
    """
    b, c, hb, _, wb = coeffs.shape
    cf = trows.shape[0]
    y = square_planes(coeffs, cf, mask)  # (B, C, Hb, U, V, Wb)
    if bias_row:
        ones = torch.ones(b, c, hb, cf, 1, wb, dtype=weight.dtype, device=coeffs.device)
        y = torch.cat([y, ones], dim=-2)  # type promotion: converts and augments in one pass
    else:
        y = y.to(weight.dtype)
    z = torch.matmul(y.transpose(-1, -2), weight.unsqueeze(1))  # (B, C, Hb, U, Wb, 8)
    z = z.reshape(b * c * hb, cf, wb * BLOCK)
    img = torch.matmul(trows.transpose(0, 1), z)  # (B*C*Hb, 8, Wb*8): raster rows
    img = img.reshape(b, c, hb * BLOCK, wb * BLOCK)
    h, w = size
    if hb * BLOCK != h or wb * BLOCK != w:
        img = img[..., :h, :w].contiguous()
    return img


TRANSPOSED_ABOVE_CF = 4  # from CF 5 up the chunked kernel's first matmul computes Z transposed (see below)


def _converter(dtype: torch.dtype, shift: torch.Tensor | None) -> Prepare:
    """The chunked kernel's default `prepare`: convert to `dtype`, adding the (C, K) `shift` in the same pass."""
    if shift is None:
        return lambda x, b0, b1: x.to(dtype)
    table = shift.to(dtype).reshape(1, shift.shape[0], 1, shift.shape[1], 1)
    return lambda x, b0, b1: torch.add(x, table)


def synthesize_chunked(
    coeffs: torch.Tensor, weight: torch.Tensor, trows: torch.Tensor, mask: str, out: torch.Tensor, prepare: Prepare
) -> torch.Tensor:
    """`synthesize_portable`'s math into `out` (B, C, H, W), `CHUNK_BYTES` of output at a time.

    The portable graph makes each intermediate (the converted coefficients, the v2 affine pass, Z,
    the padded image, the dtype cast) a full-size tensor that goes out to memory and back. Here they
    live in cache: each step prepares a few block rows of every channel (`prepare`: conversion, bias
    or the v2 affine pass), runs the two matmuls per channel and writes image rows into `out`
    (through `matmul(out=)` when no crop or cast is needed), so the output is written once. `weight`
    has no bias row.

    Above `TRANSPOSED_ABOVE_CF` the first matmul computes Z transposed, (8 x V) @ (V x Wb) per (u, block
    row): BLAS runs that shape faster than (Wb x V) @ (V x 8), enough to pay for the transposing copy
    into `out` once V is large (docs/benchmarks/design.md). Eager CPU only: the loop is Python and `out=`
    is not traceable.
    """
    b, c, hb, _, wb = coeffs.shape
    h, w = out.shape[-2:]
    cf = trows.shape[0]
    tt = trows.transpose(0, 1)  # (8, U)
    transposed = cf > TRANSPOSED_ABOVE_CF
    wt = weight.transpose(-1, -2)  # (C, U, 8, V)
    rows = max(1, CHUNK_BYTES // (c * wb * BLOCK * BLOCK * weight.element_size()))  # block rows per step
    aligned = h == hb * BLOCK and w == wb * BLOCK
    direct = aligned and out.dtype == weight.dtype
    if rows >= hb:  # whole images per step
        steps = [(i, min(i + rows // hb, b), 0, hb) for i in range(0, b, rows // hb)]
    else:  # a few block rows of one image per step
        steps = [(i, i + 1, r, min(r + rows, hb)) for i in range(b) for r in range(0, hb, rows)]
    for b0, b1, r0, r1 in steps:
        n, r = b1 - b0, r1 - r0
        coef = prepare(coeffs[b0:b1, :, r0:r1], b0, b1).to(weight.dtype)  # (n, C, r, K, Wb)
        for ch in range(c):
            y = square_planes(coef[:, ch], cf, mask)  # (n, r, U, V, Wb)
            target = out[b0:b1, ch, r0 * BLOCK : min(r1 * BLOCK, h), :w]
            if transposed:
                zt = torch.matmul(wt[ch], y).view(n, r, cf, BLOCK * wb)  # (n, r, U, 8j x Wb)
                img = torch.matmul(tt, zt).view(n, r, BLOCK, BLOCK, wb).transpose(-1, -2)  # (n, r, i, Wb, j)
                if aligned:
                    target.view(n, r, BLOCK, wb, BLOCK).copy_(img)
                else:
                    target.copy_(img.reshape(n, r * BLOCK, wb * BLOCK)[:, : target.shape[1], :w])
                continue
            z = torch.matmul(y.transpose(-1, -2), weight[ch]).view(n, r, cf, wb * BLOCK)  # (n, r, U, Wb x 8j)
            if direct:
                torch.matmul(tt, z, out=target.view(n, r, BLOCK, w))
            else:
                img = torch.matmul(tt, z).view(n, r * BLOCK, wb * BLOCK)
                target.copy_(img[:, : target.shape[1], :w])
    return out


def decompress(coeffs: torch.Tensor, cf: int, size: tuple[int, int], mask: str = "square") -> torch.Tensor:
    """(..., Hb, K, Wb) coefficients -> (..., H, W) float32 image (inverse DCT, crop padding), with this module's
    torch kernels only: the reference path (`quantize.decode_reference`). The public `dctdata.decompress`
    (`dctdata.decoder.functional`) takes the fused kernels first."""
    if not isinstance(coeffs, torch.Tensor):
        raise TypeError(f"coeffs: expected a torch.Tensor of shape (..., Hb, K, Wb). Got {type(coeffs).__name__}")
    size = parse_size(size)
    k = num_kept(cf, mask)
    check_coeff_grid(tuple(coeffs.shape), k, size, "coeffs")
    *lead, hb, _, wb = coeffs.shape
    wcol, _, trows = fold_basis(cf, mask)
    f32, dev = torch.float32, coeffs.device
    y = coeffs.to(torch.float32).reshape(-1, 1, hb, k, wb)
    return synthesize(y, wcol.to(dev, f32), trows.to(dev, f32), mask, size).reshape(*lead, *size)
