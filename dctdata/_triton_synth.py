"""The Triton kernel of `dctdata.fused_cuda` (imported only there, and only where Triton is installed).

One program decodes a strip of `BLOCKS` neighbouring 8x8 blocks of one block row of one channel of one
sample: 8 x (8 BLOCKS) output pixels. Per kept frequency (u, v) it loads the strip's stored coefficients
(one coalesced row of the (Hb, K, Wb) layout), dequantizes them (y = a q + d + r sign(q)), applies the
channel rotation (a sum over the input channels' rows), then runs the separable inverse DCT in
registers: Z_u[j] = sum_v y[u, v] T[v, j] for every column, image[i, :] += T[u, i] Z_u, and applies the
per-sample output map (x <- alpha x + beta) to each pixel (the map is linear, so once a pixel costs less
than once a coefficient). Each output pixel is written once, cropped by the store's mask.

The accumulator is (8 rows, 8 BLOCKS columns) with the columns along the image row (memory-contiguous),
so Triton's default layout gives each thread all 8 rows of its columns when the strip has at least
32 x num_warps x (elements per thread) columns (`fused_cuda.launch_config` keeps BLOCKS = 16 x num_warps):
a column's coefficients are then loaded and dequantized by one thread, not once per row.

Written for Triton 3.x (3.6 on the GPU image, 3.8 here): loads, stores, elementwise arithmetic, one static
(compile-time) loop and runtime loops; no tl.dot, no reductions, no newer features. Only `triton.language`
builtins, none of its @jit-defined helpers (tl.zeros is one): those stay compiled-mode functions when Triton
was imported before TRITON_INTERPRET=1 was set, and the interpreter cannot call them (the tests' case).
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # fused_cuda then keeps the portable graph
    raise ImportError(f"the fused CUDA kernel needs Triton (pip install 'dctdata[gpu]'): {exc}") from exc


@triton.jit
def _dequantized(q_ptr, a_ptr, d_ptr, r_ptr, b64, ch, hb, C, HB, K, WB, wb, in_w, k, HAS_R: tl.constexpr):
    """Stored coefficient k of channel `ch` under the strip's columns, dequantized: a q + d (+ r sign(q))."""
    row = ((b64 * C + ch) * HB + hb) * K + k  # int64: (sample, channel, block row, frequency) row of Wb values
    q = tl.load(q_ptr + row * WB + wb, mask=in_w, other=0).to(tl.float32)
    d = tl.load(d_ptr + ch * K + k)
    if HAS_R:  # d + r sign(q) as a choice between three per-frequency constants: two selects per value
        r = tl.load(r_ptr + ch * K + k)
        d = tl.where(q > 0, d + r, tl.where(q < 0, d - r, d))
    return q * tl.load(a_ptr + ch * K + k) + d


@triton.jit
def _coefficient(q_ptr, a_ptr, d_ptr, r_ptr, m_ptr, b64, c, hb, C, HB, K, WB, wb, in_w, k,
                 COLS: tl.constexpr, HAS_R: tl.constexpr, HAS_M: tl.constexpr):  # fmt: skip
    """Coefficient k of output channel c: dequantized and rotated (M[c, :] over the input channels)."""
    if HAS_M:
        y = tl.full((COLS,), 0.0, tl.float32)
        for ch in range(0, C):
            m = tl.load(m_ptr + c * C + ch)
            y += m * _dequantized(q_ptr, a_ptr, d_ptr, r_ptr, b64, ch, hb, C, HB, K, WB, wb, in_w, k, HAS_R)
    else:
        y = _dequantized(q_ptr, a_ptr, d_ptr, r_ptr, b64, c, hb, C, HB, K, WB, wb, in_w, k, HAS_R)
    return y


@triton.jit(do_not_specialize=["C", "HB", "WB", "H", "K", "STRIPS"])
def synthesize_kernel(q_ptr, out_ptr, a_ptr, d_ptr, r_ptr, m_ptr, scale_ptr, shift_ptr, side_ptr, t_ptr,
                      C, HB, WB, H, W, K, STRIPS,
                      CF: tl.constexpr, TRIANGLE: tl.constexpr, BLOCKS: tl.constexpr, HAS_R: tl.constexpr,
                      HAS_M: tl.constexpr, HAS_OUT: tl.constexpr, HAS_SIDE: tl.constexpr):  # fmt: skip
    """(B, C, HB, K, WB) stored coefficients -> (B, C, H, W) images; one program per (strip, block row,
    channel, sample), channel fastest (the programs that read the same rows for a rotation run together).

    a, d, r (C, K) float32: dequantization; m (C, C) float32: rotation (output channel, input channel);
    scale, shift (C,) float32 and side (B, C, 2) = [range, mid]: the output map alpha = scale range,
    beta = scale mid + shift (alpha = scale, beta = shift without side); t (8, 8) float32: the DCT matrix.
    Pointers of absent tables are never read (their flags are off). The loop over u runs at run time and
    the one over v is unrolled (CF terms): unrolling both made the CF 8 kernel many times slower to compile. Sizes are
    not specialized on (only W, whose multiples of 16 let rows be stored aligned), so one compile serves
    every sample size of a codec.
    """
    COLS: tl.constexpr = BLOCKS * 8
    pid = tl.program_id(0)
    c = pid % C
    rest = pid // C
    strip = rest % STRIPS
    rest = rest // STRIPS
    hb = rest % HB
    b64 = (rest // HB).to(tl.int64)
    col = tl.arange(0, COLS)
    wb = strip * BLOCKS + col // 8
    in_w = wb < WB
    j = col % 8
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
    acc = tl.full((8, COLS), 0.0, tl.float32)
    for u in range(0, CF):
        z = tl.full((COLS,), 0.0, tl.float32)
        for v in tl.static_range(CF):
            if TRIANGLE:  # row u keeps v < CF - u, after u CF - u (u - 1) / 2 kept frequencies of the rows above
                keep = u + v < CF
                k = tl.minimum(u * CF - (u * (u - 1)) // 2 + v, K - 1)  # in bounds; zeroed below when not kept
            else:
                k = u * CF + v
            y = _coefficient(q_ptr, a_ptr, d_ptr, r_ptr, m_ptr, b64, c, hb, C, HB, K, WB, wb, in_w, k, COLS,
                             HAS_R, HAS_M)  # fmt: skip
            if TRIANGLE:
                y = tl.where(keep, y, 0.0)
            z += y * tl.load(t_ptr + v * 8 + j)
        t_u = tl.load(t_ptr + u * 8 + tl.arange(0, 8))
        acc += t_u[:, None] * z[None, :]
    if HAS_OUT:  # the output map is linear: applied once a pixel, not once a coefficient
        acc = acc * alpha + beta
    rows = hb * 8 + tl.arange(0, 8)
    cols = strip * COLS + col
    offsets = ((b64 * C + c) * H + rows[:, None]) * W + cols[None, :]
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)
