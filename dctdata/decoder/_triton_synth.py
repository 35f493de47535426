"""The Triton kernel of `dctdata.decoder.fused_cuda` (imported only there, and only where Triton is installed).

One program decodes a strip of `BLOCKS` neighbouring 8x8 blocks of one block row of one channel of one
sample, and each thread owns one whole block: its 64 accumulators, its coefficients, its pixels. For each
kept frequency (u, v), in compile-time loops over the kept columns v and, inside, the kept rows u, every
thread loads its block's stored coefficient (the strip reads one coalesced row of the (Hb, K, Wb) layout),
dequantizes it once, applies the channel rotation (a sum over the input channels' rows) and the output map,
and adds T[u, i] y to the column pass w[i] of column v (eight fused multiply-adds); after the rows of column
v, image[i, j] += w[i] T[v, j]. The per-sample output map (x <- alpha x + beta) is linear, so it is applied
to the coefficients: y <- alpha y, and 8 beta added to the DC coefficient (the DC basis is 1/8 at every
pixel), what the fused CPU kernel computes too. Each output row of a block is stored once, cropped by the
store's mask.

Why a block a thread: a layout with a column a thread (8 threads a block) dequantizes every coefficient 8
times, and v2's dequantization (dead zone offsets, output map, rotation) costs several times v1's, so v2
ran well below v1. With the block in one thread each coefficient is dequantized once, and what is left is
the inverse DCT's multiply-adds, which v1 and v2 share. The tensors are shaped (..., BLOCKS) with the
blocks last, so Triton's default layout puts consecutive blocks on consecutive threads and keeps a block's
values in one thread's registers; `fused_cuda.launch_config` keeps BLOCKS = 32 x num_warps, one block a
thread.

Why the rows u are a compile-time loop and not a tensor axis: the column pass is then a chain of fused
multiply-adds (a reduction over a tensor axis compiles to a tree of separate multiplies and adds), the DCT
rows T[u, :] are not held as one 64-register table through the whole block, and a triangle mask's dropped
frequencies are skipped when compiling instead of masked when running. The compiled kernel then needs fewer
registers, so more warps fit on a multiprocessor, for v1 and v2 alike (`python -m benchmarks kernel-sass`
reads the machine code as launched).

Why the dead zone's sign term is r' s with s = clamp(q / 2 + 1/2, 0, 1) (`fused_cuda.device_tables` stores
d' = d - r and r' = 2 r): for an integer q, s is 0, 1/2 or 1 where sign(q) is -1, 0 or 1, so
a q + d' + r' s = a q + d + r sign(q), and the clamp to [0, 1] compiles to one saturating multiply-add, where
sign(q) as a clamp to [-1, 1] took two min/max instructions per coefficient (v2's largest cost over v1).
Float wires take s by two selects.

Written for Triton 3.x (3.6 on the GPU image, 3.8 here): loads, stores, elementwise arithmetic and
compile-time loops; no tl.dot, no newer features. Only `triton.language` builtins, none of its @jit-defined
helpers (tl.zeros and tl.sum are such): those stay compiled-mode functions when Triton was imported before
TRITON_INTERPRET=1 was set, and the interpreter cannot call them (the tests' case)."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # fused_cuda then keeps the portable graph
    raise ImportError(f"the fused CUDA kernel needs Triton (pip install 'dctdata[gpu]'): {exc}") from exc


@triton.jit
def _dequantized(q_row, tab, wb, in_w, u: tl.constexpr, UP: tl.constexpr, HAS_R: tl.constexpr):
    """Stored coefficients of row u of one channel under the strip's blocks (BLOCKS,), dequantized:
    y = a q + d' + r' s (see the module doc). q_row points at the coefficient's row of the channel's (K, Wb)
    plane of this block row; tab at the channel's tables of this column v (`DeviceTables.columns`)."""
    qi = tl.load(q_row + wb, mask=in_w, other=0)
    q = qi.to(tl.float32)
    y = q * tl.load(tab + u) + tl.load(tab + UP + u)
    if HAS_R:
        r = tl.load(tab + 2 * UP + u)
        if qi.dtype.is_int():
            s = tl.minimum(tl.maximum(q * 0.5 + 0.5, 0.0), 1.0)
        else:
            s = tl.where(q > 0, 1.0, tl.where(q < 0, 0.0, 0.5))
        y += r * s
    return y


@triton.jit
def _coefficients(q_ptr, q_plane, tab_ptr, m_ptr, b64, c, v: tl.constexpr, u: tl.constexpr, k: tl.constexpr, hb, C,
                  HB, K, WB, wb, in_w, CF: tl.constexpr, UP: tl.constexpr, HAS_R: tl.constexpr,
                  HAS_M: tl.constexpr):  # fmt: skip
    """Stored coefficient k, frequency (u, v), of output channel c (BLOCKS,): dequantized and rotated (M[c, :]
    over the input channels). q_plane points at channel c's (K, Wb) plane of this block row."""
    NT: tl.constexpr = 3 if HAS_R else 2
    if HAS_M:
        y = tl.full(wb.shape, 0.0, tl.float32)
        for ch in range(0, C):
            q_row = q_ptr + (((b64 * C + ch) * HB + hb) * K + k) * WB
            tab = tab_ptr + (ch * CF + v) * (NT * UP)
            y += tl.load(m_ptr + c * C + ch) * _dequantized(q_row, tab, wb, in_w, u, UP, HAS_R)
    else:
        y = _dequantized(q_plane + k * WB, tab_ptr + (c * CF + v) * (NT * UP), wb, in_w, u, UP, HAS_R)
    return y


@triton.jit(do_not_specialize=["C", "HB", "WB", "H", "K", "STRIPS"])
def synthesize_kernel(q_ptr, out_ptr, tab_ptr, m_ptr, scale_ptr, shift_ptr, side_ptr, t_ptr,
                      C, HB, WB, H, W, K, STRIPS,
                      CF: tl.constexpr, UP: tl.constexpr, TRIANGLE: tl.constexpr, BLOCKS: tl.constexpr,
                      HAS_R: tl.constexpr, HAS_M: tl.constexpr, HAS_OUT: tl.constexpr,
                      HAS_SIDE: tl.constexpr):  # fmt: skip
    """(B, C, HB, K, WB) stored coefficients -> (B, C, H, W) images; one program per (strip, block row,
    channel, sample), channel fastest (the programs that read the same rows for a rotation run together).

    tab (C, CF, NT, UP) float32: dequantization (`DeviceTables.columns`: a, d' and, with HAS_R, r'; UP, the
    kept rows u padded to a power of two, is its last axis);
    m (C, C) float32: rotation (output channel, input channel);
    scale, shift (C,) float32 and side (B, C, 2) = [range, mid]: the output map alpha = scale range,
    beta = scale mid + shift (alpha = scale, beta = shift without side); t (8, 8) float32: the DCT matrix.
    Pointers of absent tables are never read (their flags are off). Sizes are not specialized on (only W,
    whose multiples of 16 let rows be stored aligned), so one compile serves every sample size of a codec.
    """
    pid = tl.program_id(0)
    c = pid % C
    rest = pid // C
    strip = rest % STRIPS
    rest = rest // STRIPS
    hb = rest % HB
    b64 = (rest // HB).to(tl.int64)
    wb = strip * BLOCKS + tl.arange(0, BLOCKS)  # this thread's block column
    in_w = wb < WB
    e8 = tl.arange(0, 8)  # a row (i) or column (j) inside a block
    alpha = 1.0
    beta = 0.0
    if HAS_OUT:
        alpha = tl.load(scale_ptr + c)
        beta = tl.load(shift_ptr + c)
        if HAS_SIDE:
            at = (b64 * C + c) * 2
            rng = tl.load(side_ptr + at).to(tl.float32)
            mid = tl.load(side_ptr + at + 1).to(tl.float32)
            beta = alpha * mid + beta
            alpha = alpha * rng
    q_plane = q_ptr + ((b64 * C + c) * HB + hb) * K * WB  # channel c's (K, Wb) plane of this block row
    acc = tl.full((8, 8, BLOCKS), 0.0, tl.float32)  # (row i, column j, block)
    for v in tl.static_range(CF):
        w = tl.full((8, BLOCKS), 0.0, tl.float32)  # (row i, block): the column pass of column v
        # a triangle keeps row u for v < CF - u, after u CF - u (u - 1) / 2 kept frequencies of the rows above
        for u in tl.static_range(CF - v if TRIANGLE else CF):
            y = _coefficients(q_ptr, q_plane, tab_ptr, m_ptr, b64, c, v, u,
                              u * CF - (u * (u - 1)) // 2 + v if TRIANGLE else u * CF + v, hb, C, HB, K, WB, wb, in_w,
                              CF, UP, HAS_R, HAS_M)  # fmt: skip
            if HAS_OUT:  # the output map, on the coefficients (see the module doc)
                y = y * alpha
                if u == 0 and v == 0:
                    y += 8.0 * beta
            w += tl.load(t_ptr + u * 8 + e8)[:, None] * y[None, :]  # w[i] += T[u, i] y[u, v]
        acc += w[:, None, :] * tl.load(t_ptr + v * 8 + e8)[None, :, None]  # image[i, j] += w[i] T[v, j]
    rows = (hb * 8 + e8)[:, None, None]
    cols = (wb * 8)[None, None, :] + e8[None, :, None]
    offsets = ((b64 * C + c) * H + rows) * W + cols
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=(rows < H) & (cols < W))
