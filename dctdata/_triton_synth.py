"""The Triton kernel of `dctdata.fused_cuda` (imported only there, and only where Triton is installed).

One program decodes a strip of `BLOCKS` neighbouring 8x8 blocks of one block row of one channel of one
sample, and each thread owns one whole block: its 64 accumulators, its coefficients, its pixels. For each
kept column v of frequencies (a compile-time loop) the thread loads its block's coefficients y[u, v] of
every kept row u at once (a (UP, BLOCKS) tensor whose u axis stays in the thread; the strip reads coalesced
rows of the (Hb, K, Wb) layout), dequantizes each once (y = a q + d + r sign(q); column v's a, d and r come
from `fused_cuda.DeviceTables.columns`, whose UP rows lie side by side: a vector load each), applies the
channel rotation (a sum over the input channels' rows), then runs the separable inverse DCT in registers: the
column pass w[i] = sum_u T[u, i] y[u, v] (a reduction inside the thread) and image[i, j] += w[i] T[v, j].
The per-sample output map (x <- alpha x + beta) is linear, so it is applied to the coefficients: y <-
alpha y, and 8 beta added to the DC coefficient (the DC basis is 1/8 at every pixel), at most 64 multiplies
a block instead of one a pixel (what the fused CPU kernel computes too). Each output row of a block is one
vector store, cropped by the store's mask.

Why a block a thread: a layout with a column a thread (8 threads a block) dequantizes every coefficient 8
times, and v2's dequantization (dead zone offsets, output map, rotation) costs several times v1's, so v2
ran well below v1. With the block in one thread each coefficient is dequantized once, and what is left is
the inverse DCT's multiply-adds, which v1 and v2 share. The tensors are shaped (..., BLOCKS) with the
blocks last, so Triton's default layout puts consecutive blocks on consecutive threads and keeps a block's
values in one thread's registers; `fused_cuda.launch_config` keeps BLOCKS = 32 x num_warps, one block a
thread. Why the u axis is a tensor and the v loop unrolled: every coefficient load of a block is issued
before the arithmetic that waits for it (a loop at run time waits once an iteration), and no value is
picked out of a tensor by index (Triton has no such operation).

Written for Triton 3.x (3.6 on the GPU image, 3.8 here): loads, stores, elementwise arithmetic, `tl.reduce`
with this module's `_add`, and compile-time loops; no tl.dot, no newer features. Only `triton.language`
builtins, none of its @jit-defined helpers (tl.zeros and tl.sum are such): those stay compiled-mode
functions when Triton was imported before TRITON_INTERPRET=1 was set, and the interpreter cannot call them
(the tests' case)."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # fused_cuda then keeps the portable graph
    raise ImportError(f"the fused CUDA kernel needs Triton (pip install 'dctdata[gpu]'): {exc}") from exc


@triton.jit
def _add(a, b):  # tl.reduce's combine: this module's own, so the interpreter can call it (see the module doc)
    return a + b


@triton.jit
def _dequantized(q_ch, tab, WB, wb, in_w, k, keep, u, UP: tl.constexpr, HAS_R: tl.constexpr):
    """Stored coefficients k (UP,) of one channel under the strip's blocks, dequantized: y = a q + d (+ r sign(q)),
    a (UP, BLOCKS) tensor. q_ch points at the channel's (K, Wb) plane of this block row; tab at the channel's
    tables of this column v (`DeviceTables.columns`: a, d, r over u, each UP neighbouring floats, so one or two
    vector loads; zero where not kept)."""
    qi = tl.load(q_ch + (k * WB)[:, None] + wb[None, :], mask=keep[:, None] & in_w[None, :], other=0)
    q = qi.to(tl.float32)
    y = q * tl.load(tab + u)[:, None] + tl.load(tab + UP + u)[:, None]
    if HAS_R:
        r = tl.load(tab + 2 * UP + u)[:, None]
        if qi.dtype.is_int():  # an integer's sign is the integer clamped to [-1, 1]: two min/max, no selects
            y += r * tl.minimum(tl.maximum(q, -1.0), 1.0)
        else:
            y += tl.where(q > 0, r, tl.where(q < 0, -r, 0.0))
    return y


@triton.jit
def _coefficients(q_ptr, tab_ptr, m_ptr, b64, c, v, hb, C, HB, K, WB, wb, in_w, k, keep, u,
                  CF: tl.constexpr, UP: tl.constexpr, BLOCKS: tl.constexpr, HAS_R: tl.constexpr,
                  HAS_M: tl.constexpr):  # fmt: skip
    """Coefficients k (UP,) of column v of output channel c: dequantized and rotated (M[c, :] over the input
    channels)."""
    NT: tl.constexpr = 3 if HAS_R else 2
    if HAS_M:
        y = tl.full((UP, BLOCKS), 0.0, tl.float32)
        for ch in range(0, C):
            q_ch = q_ptr + ((b64 * C + ch) * HB + hb) * K * WB
            tab = tab_ptr + (ch * CF + v) * (NT * UP)
            y += tl.load(m_ptr + c * C + ch) * _dequantized(q_ch, tab, WB, wb, in_w, k, keep, u, UP, HAS_R)
    else:
        q_ch = q_ptr + ((b64 * C + c) * HB + hb) * K * WB
        y = _dequantized(q_ch, tab_ptr + (c * CF + v) * (NT * UP), WB, wb, in_w, k, keep, u, UP, HAS_R)
    return y


@triton.jit(do_not_specialize=["C", "HB", "WB", "H", "K", "STRIPS"])
def synthesize_kernel(q_ptr, out_ptr, tab_ptr, m_ptr, scale_ptr, shift_ptr, side_ptr, t_ptr,
                      C, HB, WB, H, W, K, STRIPS,
                      CF: tl.constexpr, UP: tl.constexpr, TRIANGLE: tl.constexpr, BLOCKS: tl.constexpr,
                      HAS_R: tl.constexpr, HAS_M: tl.constexpr, HAS_OUT: tl.constexpr,
                      HAS_SIDE: tl.constexpr):  # fmt: skip
    """(B, C, HB, K, WB) stored coefficients -> (B, C, H, W) images; one program per (strip, block row,
    channel, sample), channel fastest (the programs that read the same rows for a rotation run together).

    tab (C, CF, NT, UP) float32: dequantization (`DeviceTables.columns`: a, d and, with HAS_R, r; UP, the kept
    rows u padded to a power of two, is its last axis);
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
    u = tl.arange(0, UP)
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
    t_ui = tl.load(t_ptr + u[:, None] * 8 + e8[None, :], mask=(u < CF)[:, None], other=0.0)  # T[u, i], 0 past CF
    acc = tl.full((8, 8, BLOCKS), 0.0, tl.float32)  # (row i, column j, block)
    for v in tl.static_range(CF):
        if TRIANGLE:  # row u keeps v < CF - u, after u CF - u (u - 1) / 2 kept frequencies of the rows above
            keep = u + v < CF
            k = tl.minimum(u * CF - (u * (u - 1)) // 2 + v, K - 1)  # in bounds; not read when not kept
        else:
            keep = u < CF
            k = u * CF + v
        y = _coefficients(q_ptr, tab_ptr, m_ptr, b64, c, v, hb, C, HB, K, WB, wb, in_w, k, keep, u, CF, UP, BLOCKS,
                          HAS_R, HAS_M)  # fmt: skip
        if HAS_OUT:  # the output map, on the coefficients (see the module doc)
            y = y * alpha
            if v == 0:
                y += tl.where(u == 0, 8.0 * beta, 0.0)[:, None]
        w = tl.reduce(t_ui[:, :, None] * y[:, None, :], 0, _add)  # (i, block): sum over u of T[u, i] y[u, v]
        acc += w[:, None, :] * tl.load(t_ptr + v * 8 + e8)[None, :, None]  # image[i, j] += w[i] T[v, j]
    rows = (hb * 8 + e8)[:, None, None]
    cols = (wb * 8)[None, None, :] + e8[None, :, None]
    offsets = ((b64 * C + c) * H + rows) * W + cols
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=(rows < H) & (cols < W))
