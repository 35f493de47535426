"""Volume DCT+Chop kernels: 8x8x8 block DCT-II of (..., D, H, W) samples, frequency masks, and the inverse
transform as three small matmuls.

Coefficient layout, the 2-D layout with one more block axis: a volume (..., D, H, W) becomes
(..., Db, Hb, K, Wb) with Db, Hb, Wb = ceil(D / 8), ceil(H / 8), ceil(W / 8) and K the kept frequencies.
Row [db, hb, k, :] holds frequency (u_k, v_k, w_k) (u along D, v along H, w along W; row-major order,
`kept_frequencies`) of the Wb blocks of block row (db, hb). As in 2-D, runs of one frequency are smooth
(the lossless stage likes them) and the inverse transform reads them as a transposed operand and writes
raster rows. Viewed as (..., Db * Hb, K, Wb) it has the 2-D layout's form, with K up to 512: the
quantizer, the per-sample side values and the entropy coder's array walk work on that view.

Masks: "cube" keeps u, v, w < CF (CF^3 coefficients), "tetra" keeps u + v + w < CF (CF(CF+1)(CF+2)/6,
the 3-D triangle: the lowest total frequencies, where a smooth field's energy is). "square" and
"triangle" are accepted for them (the same rule in one more dimension).

Decoding (`synthesize`) is separable per block: stage 1 contracts w with the DCT matrix (the
coefficients enter as a transposed operand), stage 2 contracts v, stage 3 contracts u and writes whole
raster planes. The cost per voxel does not depend on the volume's size. Only matmul, reshape, transpose
and cat ops, so the graph runs on CUDA, under torch.compile and exports to ONNX; `dctdata.decoder.volume`'s
layer runs the fused C kernel (`dctdata.decoder.fused.synthesize_volume`) on plain CPU tensors instead.
"""

from __future__ import annotations

import functools
import math

import torch

from dctdata.codec.transform import (
    BLOCK,
    DEFAULT_PAD,
    PADS,
    _check_image,
    _dct_matrix_f64,
    _mirror,
    extend_axis,
    parse_cf,
)
from dctdata.errors import DctDataError

MASKS3 = ("cube", "tetra")
MASK_ALIASES = {"square": "cube", "triangle": "tetra"}  # the 2-D names of the same rules
BLOCK3 = BLOCK**3  # coefficients of a full 8x8x8 block


def parse_mask3(mask: object) -> str:
    """A volume mask name ("cube", "tetra", or their 2-D names "square", "triangle") -> "cube" or "tetra"."""
    if not isinstance(mask, str):
        raise TypeError(f"mask: expected one of {MASKS3}. Got {mask!r} of type {type(mask).__name__}")
    name = MASK_ALIASES.get(mask, mask)
    if name not in MASKS3:
        raise DctDataError(f"mask: expected one of {MASKS3} (or {tuple(MASK_ALIASES)}) for a volume. Got {mask!r}")
    return name


@functools.cache
def kept_frequencies(cf: int, mask: str = "cube") -> tuple[tuple[int, int, int], ...]:
    """The (u, v, w) frequencies kept by a volume mask, in row-major order: plane k of the layout is entry k."""
    cf, mask = parse_cf(cf), parse_mask3(mask)
    r = range(cf)
    return tuple((u, v, w) for u in r for v in r for w in r if mask == "cube" or u + v + w < cf)


def num_kept(cf: int, mask: str = "cube") -> int:
    """K: coefficients kept per 8x8x8 block (cf^3 for cube, cf(cf+1)(cf+2)/6 for tetra)."""
    return len(kept_frequencies(cf, mask))


def frequency_index(cf: int, mask: str = "cube") -> list[int]:
    """Each kept frequency's index u*64 + v*8 + w among all 512 of a block (the order of `compress(cf=8,
    mask="cube")`)."""
    return [u * BLOCK * BLOCK + v * BLOCK + w for u, v, w in kept_frequencies(cf, mask)]


def grid_shape(depth: int, height: int, width: int) -> tuple[int, int, int]:
    """Blocks along D, H and W once a volume is padded to multiples of 8."""
    return math.ceil(depth / BLOCK), math.ceil(height / BLOCK), math.ceil(width / BLOCK)


@functools.cache
def _basis_f64(cf: int, mask: str) -> torch.Tensor:
    t = _dct_matrix_f64()
    outer = torch.einsum("ui,vj,wk->uvwijk", t, t, t).reshape(BLOCK, BLOCK, BLOCK, BLOCK3)
    return torch.stack([outer[u, v, w] for u, v, w in kept_frequencies(cf, mask)])


def basis(
    cf: int, mask: str = "cube", dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """(K, 512) synthesis basis: row k is the 8x8x8 block of frequency (u_k, v_k, w_k), flattened (d, h, w).
    Its rows are orthonormal (analysis is `blocks @ basis.T`). For tests and bounds: the transforms below
    are separable and never build it."""
    return _basis_f64(parse_cf(cf), parse_mask3(mask)).to(dtype=dtype, device=device)


def pad_to_blocks(x: torch.Tensor, pad: str = DEFAULT_PAD) -> torch.Tensor:
    """(N, D, H, W) -> (N, Db*8, Hb*8, Wb*8): as the 2-D `dctdata.codec.transform.pad_to_blocks`: "extend" (each
    partial block from its own voxels, W, then H, then D), "symmetric" (half-sample mirror) or "edge"."""
    d, h, w = x.shape[-3:]
    db, hb, wb = grid_shape(d, h, w)
    if (db * BLOCK, hb * BLOCK, wb * BLOCK) == (d, h, w):
        return x
    if pad == "extend":
        return extend_axis(extend_axis(extend_axis(x, -1, w), -2, h), -3, d)
    if pad == "edge":
        idx = [torch.arange(n * BLOCK, device=x.device).clamp(max=m - 1) for n, m in ((db, d), (hb, h), (wb, w))]
    elif pad == "symmetric":
        idx = [_mirror(m, n * BLOCK, x.device) for n, m in ((db, d), (hb, h), (wb, w))]
    else:
        raise DctDataError(f"pad: expected one of {PADS}. Got {pad!r}")
    return x.index_select(-3, idx[0]).index_select(-2, idx[1]).index_select(-1, idx[2])


def compress(x: torch.Tensor, cf: int = 8, mask: str = "cube", pad: str = DEFAULT_PAD) -> torch.Tensor:
    """(..., D, H, W) float -> (..., Db, Hb, K, Wb) float32 DCT coefficients of the kept frequencies.

    Separable: three small matmuls per block (one per axis), then the mask's frequencies are picked."""
    x = _check_image(x, axes="D, H, W")
    cf, mask = parse_cf(cf), parse_mask3(mask)
    *lead, d, h, w = x.shape
    db, hb, wb = grid_shape(d, h, w)
    t = _dct_matrix_f64().to(dtype=torch.float32, device=x.device)[:cf]  # (U, 8): rows of the kept frequencies
    v = pad_to_blocks(x.reshape(-1, d, h, w).to(torch.float32), pad)
    v = v.reshape(-1, db, BLOCK, hb, BLOCK, wb, BLOCK)  # (N, Db, l, Hb, i, Wb, j)
    v = torch.matmul(v, t.T)  # contract j -> w: (N, Db, l, Hb, i, Wb, W)
    v = torch.einsum("vi,ndlhiqw->ndlhvqw", t, v)  # contract i -> v
    v = torch.einsum("ul,ndlhvqw->ndhuvwq", t, v)  # contract l -> u: (N, Db, Hb, U, V, W, Wb)
    v = v.reshape(-1, db, hb, cf**3, wb)
    if mask == "tetra":
        sel = [u * cf * cf + vv * cf + ww for u, vv, ww in kept_frequencies(cf, mask)]
        v = v[:, :, :, sel, :]
    return v.reshape(*lead, db, hb, v.shape[-2], wb).contiguous()


def cube_planes(coeffs: torch.Tensor, cf: int, mask: str) -> torch.Tensor:
    """(..., K, Wb) -> (..., U, V, W, Wb): frequency (u, v, w) at [u, v, w]; frequencies the mask drops are
    zero. Only reshape and cat (the tetra's runs along w are padded to cf and missing (u, v) rows added)."""
    *lead, _k, wb = coeffs.shape
    if mask == "cube":
        return coeffs.reshape(*lead, cf, cf, cf, wb)
    rows, start = [], 0
    zeros = coeffs.new_zeros(*lead, cf, wb)
    for u in range(cf):
        for v in range(cf):
            n = max(0, cf - u - v)  # tetra keeps w < cf - u - v in row (u, v)
            if n == 0:
                rows.append(zeros)
                continue
            run = coeffs[..., start : start + n, :]
            start += n
            rows.append(run if n == cf else torch.cat([run, zeros[..., : cf - n, :]], dim=-2))
    return torch.stack(rows, dim=-3).reshape(*lead, cf, cf, cf, wb)


def synthesize(coeffs: torch.Tensor, trows: torch.Tensor, mask: str, size: tuple[int, int, int]) -> torch.Tensor:
    """Inverse transform of (B, C, Db, Hb, K, Wb) float coefficients -> (B, C, D, H, W) in trows' dtype.

    trows (cf, 8) = T[:cf]. Stage 1 contracts w (coefficients as a transposed operand), stage 2 contracts
    v, stage 3 contracts u and writes raster planes. The block-row axis Hb is moved behind u on the
    coefficients (the smallest tensor of the three stages), so stage 3's output is already in raster
    order. Only matmul/reshape/transpose/cat ops."""
    b, c, db, hb, _, wb = coeffs.shape
    cf = trows.shape[0]
    y = cube_planes(coeffs.to(trows.dtype), cf, mask)  # (B, C, Db, Hb, U, V, W, Wb)
    y = y.transpose(3, 4)  # (B, C, Db, U, Hb, V, W, Wb)
    z = torch.matmul(y.transpose(-1, -2), trows)  # stage 1: (B, C, Db, U, Hb, V, Wb, 8j)
    z = z.reshape(b, c, db, cf, hb, cf, wb * BLOCK)
    z = torch.matmul(trows.transpose(0, 1), z)  # stage 2: (B, C, Db, U, Hb, 8i, Wb*8)
    z = z.reshape(b, c, db, cf, hb * BLOCK * wb * BLOCK)
    img = torch.matmul(trows.transpose(0, 1), z)  # stage 3: (B, C, Db, 8l, Hb*8 x Wb*8)
    img = img.reshape(b, c, db * BLOCK, hb * BLOCK, wb * BLOCK)
    d, h, w = size
    if (db * BLOCK, hb * BLOCK, wb * BLOCK) != (d, h, w):
        img = img[..., :d, :h, :w].contiguous()
    return img


def parse_size(size: object) -> tuple[int, int, int]:
    """Validate an output (D, H, W)."""
    from dctdata.parse import is_int

    if not isinstance(size, (tuple, list)) or len(size) != 3:
        raise TypeError(f"size: expected a triple (D, H, W). Got {size!r}")
    for name, v in zip("DHW", size):
        if not is_int(v):
            raise TypeError(f"size: expected integer {name}. Got {v!r}")
        if v < 1:
            raise DctDataError(f"size: expected {name} >= 1. Got {v}")
    d, h, w = (int(v) for v in size)
    return d, h, w


def decompress(coeffs: torch.Tensor, cf: int, size: tuple[int, int, int], mask: str = "cube") -> torch.Tensor:
    """(..., Db, Hb, K, Wb) coefficients -> (..., D, H, W) float32 volume (inverse DCT, crop the padding)."""
    if not isinstance(coeffs, torch.Tensor):
        raise TypeError(f"coeffs: expected a torch.Tensor of shape (..., Db, Hb, K, Wb). Got {type(coeffs).__name__}")
    cf, mask, size = parse_cf(cf), parse_mask3(mask), parse_size(size)
    k = num_kept(cf, mask)
    grid = grid_shape(*size)
    expected = (grid[0], grid[1], k, grid[2])
    if coeffs.dim() < 4 or tuple(coeffs.shape[-4:]) != expected:
        raise DctDataError(
            f"coeffs: expected shape (..., Db, Hb, K, Wb) = (..., {', '.join(map(str, expected))}) for K={k} kept "
            f"frequencies and size {size}. Got {tuple(coeffs.shape)}"
        )
    *lead, db, hb, _, wb = coeffs.shape
    trows = _dct_matrix_f64()[:cf].to(dtype=torch.float32, device=coeffs.device)
    y = coeffs.to(torch.float32).reshape(-1, 1, db, hb, k, wb)
    return synthesize(y, trows, mask, size).reshape(*lead, *size)
