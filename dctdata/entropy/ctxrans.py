"""Context-modelled rANS lossless stage for quantized block-DCT coefficients.

Why hand-written: the project's rule is to use a maintained entropy coder library, and none did this
job at the speed the loaders need: a maintained rANS library (constriction) with per-context models,
numba (plus its JIT start-up in every DataLoader worker) and numpy-vectorized lanes all decoded several
times slower on the same coefficients (docs/benchmarks/entropy.md, "Why the entropy coder is
hand-written"). So the kernel is C: `ctxrans_core.c` (no Python; scalar and AVX2 decoders) and
the CPython module around it, `_ctxrans.c`, built by setuptools at install time, fuzzed in
tests/core/test_entropy.py (the command to run that under ASan/UBSan is there).

Drop-in for the product's lossless stage (numcodecs style, config in the manifest):

    codec = CtxCodec.fit(q_samples, cf=8, mask="square")      # once per field, on the calibration subset
    config = codec.get_config()                                # JSON-able; the fitted model is part of it
    buf = codec.encode(q)                                      # q: (B, C, Hb, K, Wb) int8/int16 -> bytes
    q2 = CtxCodec.from_config(config).decode(buf, q.shape, q.dtype)

What is coded (ctxrans_core.c has the bit-exact definition): every coefficient, in memory order of the
(B, C, Hb, K, Wb) layout, so the decoder writes its output sequentially.
  * DC (k = 0): residual from floor((left + top) / 2), context = local DC activity |L - TL| + |T - TL|.
  * AC (k > 0): the value, context = frequency class of k (k itself, or the diagonal u + v: fewer
    contexts for small sets) x channel group x buckets of
      - s_in = |q(u-1, v)| + |q(u, v-1)|, the two lower-frequency neighbours in the same block
        ("wide": 2 s_in + |q(u-2, v)| + |q(u, v-2)|),
      - "top": |same frequency in the block above| (not the left block: that is the symbol decoded
        just before, and depending on it serialises the decoder),
      - "ch" (C > 1): |same coefficient in the previous channel|.
  * |value| -> token (0..11 direct, then Exp-Golomb classes whose low bits are raw); the sign is a raw
    bit, or ("sign", C > 1) a coded "differs from the previous channel's sign" bit, which is cheap
    because RGB / multi-band coefficients mostly share signs.
Each context has a 2-parameter distribution over tokens, P(0) = z and a geometric law with ratio r for
|value| >= 1, each parameter one byte on a fixed grid (about 2 bytes per used context, zlib'd in the
config). `fit` picks the layout with the fewest bits *including the model's own bytes*, so small
datasets get small models. Frequency tables are built from the bytes with a fixed sequence of IEEE-754
double operations (no libm calls), so every platform builds the same tables; a CRC of the tables is
stored in the config and checked anyway.

Stream = mode byte + rANS states + LEB128 length of the rANS words + the rANS words + the raw-bit
section. Mode 0: two interleaved 64-bit states, 32-bit words. Mode 2 (config version 2, arrays of
LANES_MIN coefficients or more): sixteen 32-bit states, 16-bit words, which the kernel decodes as two
AVX2 vectors of 8 lanes (faster; 48 more header bytes and coarser words cost a fraction of a percent of
bytes; docs/benchmarks/entropy.md has both measured). Mode 3 (config version 3, arrays of 2 * `segment`
coefficients or more): the array's block rows cut into about one segment per `segment` coefficients, each a
mode 2 stream of its rows (contexts restart at a segment's top row, as at the array's), after a header of the
segment count and lengths. Why: a GPU decodes a mode 2 stream with 16 lanes of one warp, one dependent step
after another, thousands of them for a 256x256 sample; independent segments are decoded by warps of
their own (dctdata.entropy.device), so the segment length sets a batch's GPU decode time. A segment costs
60-100 bytes (its 16 states, its length, the row-above context its top row lacks), whatever the sample's rate,
so `segment_bytes` bounds the count: beyond the count the first version 3 packs wrote (one per SEGMENT_V3 =
16384 coefficients), one more segment per `segment_bytes` bytes of the stream, i.e. about 1% more bytes at
most with the default 6000. The stream's length there is `CtxCodec.estimate`'s (the model's ideal code length
over sampled rows, and each segment's fixed bytes), so that a sample is encoded once. Both are in the config
("segment", "segment_bytes"; a version 3 config without
them is the first release's rule: 16384 and no bound). The decoder reads the segment count from the stream:
they only decide what the encoder writes. docs/guides/gpu-entropy-decoder.md has the bytes per segment length.
Mode 1: a raw copy when
coding would not save. No model, shape or dtype in the stream: the caller passes the shape and dtype it
expects (the decoded size is known up front, and `max_coefficients` of the stream's length bounds it).

Untrusted input: decode() raises `CtxCodecError` (a ValueError) for any malformed stream, argument or
config, or returns an array of the declared shape; it never reads or writes out of bounds, does a
bounded amount of work per coefficient, and allocates only the output array (fuzzed in
tests/core/test_entropy.py, also against an ASan/UBSan build of the kernel: the command is there).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal, TypeAlias, overload

import numpy as np
import numpy.typing as npt

import dctdata.entropy._ctxrans as _ctxrans
from dctdata.codec import transform3d
from dctdata.codec.transform import kept_frequencies as _kept_frequencies
from dctdata.errors import DctDataError, IntegrityError

# A stored stream: bytes from a store or a member, or a slice of a uint8 array.
BytesLike: TypeAlias = bytes | bytearray | memoryview | npt.NDArray[Any]
# `CtxCodec.fit`'s report: (a layout tried, its total bits, its model's bytes), in the order tried.
FitReport: TypeAlias = list[tuple[dict[str, Any], float, int]]

__all__ = [
    "CtxCodec",
    "CtxCodecError",
    "check_coefficients",
    "fit",
    "kept_frequencies",
    "max_coefficients",
    "supports",
]

# The codec owns its id: the entropy stage (`dctdata.stages.ctxrans`) writes it into the manifest and as a zarr
# codec name, and the configs this module writes carry it.
CODEC_ID = "dctdata_ctxrans"


def kept_frequencies(cf: int, mask: str) -> tuple[tuple[int, ...], ...]:
    """dctdata's kept frequencies ((u, v, w) triples for the volume masks "cube" and "tetra"); a bad cf or mask
    in a config is a CtxCodecError like any other."""
    try:
        if mask in transform3d.MASKS3:
            return transform3d.kept_frequencies(cf, mask)
        return _kept_frequencies(cf, mask)
    except (DctDataError, TypeError) as exc:
        raise CtxCodecError(str(exc)) from None


def coded_plane(cf: int, mask: str) -> tuple[tuple[tuple[int, ...], ...], int]:
    """(the frequencies of one row the kernel codes, rows per block row) for blocks of (cf, mask).

    2-D blocks: the block's kept (u, v), one row. Volumes (8x8x8 blocks, `kept_frequencies` of "cube" or
    "tetra"): a "cube" block row (K = cf^3 planes, u outermost) is coded as cf rows of the (v, w) square, one per
    depth frequency u, a view of the same memory: in-block contexts see the (v - 1, w) and (v, w - 1)
    neighbours, "top" sees the same (v, w) at u - 1, and every row keeps the kernel's limit of 64 planes. A
    "tetra" row's planes differ in number per u, so it is coded as one row of its (u, v, w) triples (its lower
    neighbours along w and v in-block, u with "wide"), which the kernel takes up to cf 6 (56 planes)."""
    freqs = kept_frequencies(cf, mask)
    if mask == "cube":
        return tuple((v, w) for v in range(cf) for w in range(cf)), cf
    return freqs, 1


log = logging.getLogger(__name__)

# 2: streams of LANES_MIN coefficients or more use the kernel's 16-lane layout (mode 2);
# 3: streams of 2 * segment coefficients or more are segments of block rows (mode 3); the config may name
#    `segment` (coefficients per segment) and `segment_bytes` (without them: SEGMENT_V3 and no bound, what the
#    first version 3 packs were written with)
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)  # an older config keeps writing what the release that wrote it reads
MODE_LANES = _ctxrans.MODE_LANES
MODE_SEGMENTS = _ctxrans.MODE_SEGMENTS
LANES_MIN = 1 << 14  # below this, the 16-lane layout's 48 more header bytes outweigh its faster decode
SEGMENT_V3 = 1 << 14  # coefficients per segment (mode 3) of a version 3 config without "segment"
SEGMENT = 1 << 13  # what `fit` writes: a 256x256 int8 sample at CF 8 is 8 segments (the byte cost and GPU time
# it was picked by are in docs/guides/gpu-entropy-decoder.md)
SEGMENT_BYTES = 6000  # and one segment beyond SEGMENT_V3's count per this many stream bytes (0: no bound)
SEGMENT_FIXED_BYTES = 54  # a segment's bytes beyond its symbols' ideal code length, for `CtxCodec.estimate`
ESTIMATE_ROWS = (8, 2)  # `CtxCodec.estimate` walks 2 block rows of every 8 (arrays of 16 block rows or more)
SEGMENT_RANGE = (1 << 10, 1 << 24)  # the segment lengths a config may name
SEGMENT_BYTES_MAX = 1 << 30
SCALE = _ctxrans.SCALE  # frequency precision: tables sum to 2^15
MTOT = 1 << SCALE
D = _ctxrans.D  # magnitudes 0..D-1 are tokens of their own
NTOK = _ctxrans.NTOK  # D + 17 Exp-Golomb classes: |value| up to D + 2^17 - 2 (covers int16 DC residuals)
NFEAT = _ctxrans.NFEAT  # feature sums are clamped to NFEAT - 1 before bucketing
LUTB = _ctxrans.LUTB
_CUM_BYTES = 64  # cum[NTOK + 1] uint16 padded to a cache line in the kernel's tables
TABPAD = _ctxrans.TABPAD
LUTN = 1 << LUTB
MAGIC = _ctxrans.MAGIC
MAX_CONTEXTS = 1 << 16
MAX_KEPT = getattr(_ctxrans, "MAX_K", 64)  # kept frequencies per block the kernel codes (a volume block has up to 512)
MAX_ELEMENTS = 1 << 34  # refuse absurd declared shapes before allocating


class CtxCodecError(IntegrityError):
    """Malformed stream, config or arguments (an IntegrityError, so a DctDataError and a ValueError)."""


def max_coefficients(nbytes: int) -> int:
    """The most coefficients a stream of `nbytes` bytes can code: 2^19 + 2^14 per byte, a bound that follows
    from the coder's arithmetic (ctxrans_core.c, ctx_max_coefficients, has the derivation) and holds for every
    stream this codec writes; the most compressible array, all zeros, codes about 6,500 per byte. A reader
    checks a declared shape against it before allocating, so a small stream cannot claim a huge array."""
    return int(_ctxrans.max_coefficients(int(nbytes)))


def check_coefficients(nbytes: int, count: int) -> None:
    """CtxCodecError when a stream of `nbytes` bytes cannot hold `count` coefficients (`max_coefficients`)."""
    most = max_coefficients(nbytes)
    if count > most:
        raise CtxCodecError(f"ctxrans: a stream of {nbytes} bytes cannot hold {count} coefficients (at most {most})")


def _check_out(out: object) -> None:
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
        raise CtxCodecError("out: expected a writeable C-contiguous numpy array")


# -------------------------------------------------------------------------------------------------
# Parametric token distributions: one byte for P(0), one byte for the geometric ratio.
# Grids use only repeated multiplication by hex-literal constants (exact IEEE-754, no libm).
_C16 = float.fromhex("0x1.ea4afa2a490dap-1")  # 2^(-1/16)
_C8 = float.fromhex("0x1.d5818dcfba487p-1")  # 2^(-1/8)


def _powers(c: float, n: int) -> list[float]:
    out, x = [], 1.0
    for _ in range(n):
        out.append(x)
        x *= c
    return out


_P8 = _powers(_C8, 130)
# z = P(|value| = 0): 0.5 * 2^(-(128 - i)/8) for i < 128, else 1 - 0.5 * 2^(-(i - 127)/8)
Z_GRID = [0.5 * _P8[128 - i] if i < 128 else 1.0 - 0.5 * _P8[i - 127] for i in range(256)]
# 1 - r = 2^(-i/16): mean |value| from ~1 to ~65000
T_GRID = _powers(_C16, 256)


@lru_cache(maxsize=4096)
def _freqs(iz: int, ir: int) -> tuple[int, ...]:
    """Integer frequencies (sum 2^15, each >= 1) of the tokens for parameter bytes (iz, ir)."""
    z, t = Z_GRID[iz], T_GRID[ir]
    r = 1.0 - t
    nz = 1.0 - z
    p = [z]
    rk = 1.0
    for _ in range(1, D):  # |value| = m in 1..D-1: (1 - z) (1 - r) r^(m-1)
        p.append(nz * t * rk)
        rk *= r
    # rk = r^(D-1) = P(|value| >= D | nonzero); class j covers [D + 2^j - 1, D + 2^(j+1) - 1)
    r_pow2 = r  # r^(2^j)
    tail_prev = rk  # r^(D - 1 + 2^0 - 1) = r^(D-1)
    for j in range(NTOK - D):
        nxt = tail_prev * r_pow2 if j < NTOK - D - 1 else 0.0  # r^(D - 2 + 2^(j+1))
        p.append(nz * (tail_prev - nxt))
        tail_prev = nxt
        r_pow2 *= r_pow2
        # tail_prev is r^(D-2+2^(j+1)) = r^(D-2+2^j) * r^(2^j): note r_pow2 was r^(2^j) when used
    f = [max(1, int(x * MTOT + 0.5)) for x in p]
    diff = MTOT - sum(f)
    while diff != 0:  # give or take from the largest entries, deterministically
        i = max(range(NTOK), key=lambda j: (f[j], -j))
        step = diff if diff > 0 else max(diff, 1 - f[i])
        if step == 0:
            raise RuntimeError("cannot normalise frequencies")  # unreachable: every token keeps >= 1
        f[i] += step
        diff -= step
    return tuple(f)


def _flip_freq(i: int) -> int:
    """Frequency (of 2^15) of "sign differs from the previous channel's" for parameter byte i."""
    return min(MTOT - 1, max(1, int(Z_GRID[i] * MTOT + 0.5)))


@lru_cache(maxsize=1)
def _token_logp_table() -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """(-log2 P(token | nonzero) for every ratio byte (256 x NTOK-1), log2 grid of z) for fitting."""
    t = np.array(T_GRID)[:, None]
    r = 1.0 - t
    m = np.arange(1, D)[None, :]
    p = np.zeros((256, NTOK))
    p[:, 1:D] = t * r ** (m - 1)
    for j in range(NTOK - D):
        a, b = D + 2**j - 1, D + 2 ** (j + 1) - 1
        p[:, D + j] = r[:, 0] ** (a - 1) - (r[:, 0] ** (b - 1) if j < NTOK - D - 1 else 0.0)
    p = np.maximum(p, 1.0 / MTOT)
    return -np.log2(p[:, 1:]), np.array(Z_GRID)


_BLAS_ROWS = 2048  # contexts from which `_param_costs` multiplies by BLAS


def _param_costs(h: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """h (nctx, NTOK) token counts -> the bits of each context's counts under every z byte and every ratio
    byte: (nctx, 256) each, computed once for every precision `_fit_params` picks from. The caller passes the
    contexts that have counts only (`_used`): a small set leaves most of a layout's contexts empty."""
    nlp, zg = _token_logp_table()
    hf = h.astype(np.float64)
    # numpy's own loops, not BLAS products, for the few contexts of a small set: BLAS threads stall on a busy
    # machine for longer than such a product takes; many contexts keep the BLAS product (its work pays)
    zero_rest = np.stack([hf[:, 0], hf[:, 1:].sum(1)], 1)  # (nctx, 2): zeros, nonzeros
    cz: npt.NDArray[np.float64] = np.einsum("ij,jk->ik", zero_rest, -np.log2(np.stack([zg, 1.0 - zg])))
    cr: npt.NDArray[np.float64] = hf[:, 1:] @ nlp.T if len(h) >= _BLAS_ROWS else np.einsum("ij,kj->ik", hf[:, 1:], nlp)
    return cz, cr


def _used(h: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Indices of the contexts with counts: the fit's costs and bits need only these (an empty context keeps
    the default bytes and spends nothing), so its cost follows the data, not the layout's size."""
    return np.flatnonzero(h.sum(1))


def _fit_params(
    h: npt.NDArray[Any], precision: int = 0, costs: tuple[npt.NDArray[Any], npt.NDArray[Any]] | None = None
) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
    """h (nctx, NTOK) token counts -> (iz, ir, bits per context) with the quantised 2-parameter model.

    `precision`: the parameter bytes are picked among multiples of 2^precision only (0: every byte). The
    kernel reads bytes either way; coarser bytes take fewer bits in the config's zlib stream, which is what a
    small set's model costs against its streams (`PRECISIONS`, chosen by `CtxCodec.fit` on the total).
    `costs`: `_param_costs(h[_used(h)])`, when the caller has them."""
    used = _used(h)
    cz, cr = _param_costs(h[used]) if costs is None else costs  # rows: the used contexts
    step = 1 << precision
    cz, cr = cz[:, ::step], cr[:, ::step]  # the grid 0, step, 2 step, ... (a strided view: no copy)
    jz, jr = cz.argmin(1), cr.argmin(1)
    rows = np.arange(len(used))
    iz, ir = np.full(len(h), 128, np.uint8), np.zeros(len(h), np.uint8)  # an empty context's bytes
    iz[used], ir[used] = jz * step, jr * step
    bits = np.zeros(len(h))
    bits[used] = cz[rows, jz] + cr[rows, jr]
    return iz, ir, bits


# The parameter precisions `fit` tries (`_fit_params`): 8-bit parameters are finer than a context of a few
# hundred symbols can tell apart, and on one small volume their zlib'd bytes were a twentieth of the pack; 3
# (one byte in 8) was the best total there, a large set keeps 0.
PRECISIONS = (0, 1, 2, 3, 4)


def _fit_flips(n_has: npt.NDArray[Any], n_flip: npt.NDArray[Any]) -> tuple[list[int], float]:
    """Per channel the flip-probability byte and the bits it spends (exact, integer frequencies)."""
    out, bits = [], 0.0
    for nh, nf in zip(n_has.tolist(), n_flip.tolist()):
        best = (128, float(nh))
        if nh:
            for i in range(256):
                f1 = _flip_freq(i)
                b = -(nf * math.log2(f1 / MTOT) + (nh - nf) * math.log2(1 - f1 / MTOT))
                if b < best[1]:
                    best = (i, b)
        out.append(best[0])
        bits += best[1]
    return out, bits


def _table_bits(h: npt.NDArray[Any], iz: npt.NDArray[Any], ir: npt.NDArray[Any]) -> float:
    """Exact bits of the token counts under the integer tables (what the coder will spend); the used contexts
    only (an empty one spends nothing)."""
    used = _used(h)
    keys = np.asarray(iz, np.int64)[used] * 256 + np.asarray(ir, np.int64)[used]
    _cum_tables(iz[used], ir[used])  # builds the pairs' rows of _NLOG_CACHE too
    return float(-(h[used] * _NLOG_CACHE[keys]).sum())


# -------------------------------------------------------------------------------------------------
# Context layout
DEFAULT_EDGES_IN = (1, 2, 3, 5, 7, 11, 17)  # bucket(s) = number of edges <= s
DEFAULT_EDGES_LT = (1, 3, 7)
DEFAULT_EDGES_CH = (1, 3)
DEFAULT_EDGES_DC = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_EDGES_WIDE = (1, 3, 5, 8, 12, 17, 25, 36, 52)  # for s_in = 2 (a + b) + a2 + b2
# The alternative `fit` tries for edges_in: one edge per octave, from 1/16 to 4 times the data's scale. The
# default edges, scaled by the first AC frequency's magnitude, put every s_in below that scale in one bucket;
# at high rates (tight error bounds) the higher frequencies are many times smaller than the first, so their
# contexts merged. Octaves keep them apart (docs/benchmarks/entropy.md, "Octave edges").
OCTAVE_EDGES_IN = tuple(2.0**j for j in range(-4, 3))
F_LT, F_CH, F_TOP, F_SFLIP, F_WIDE = 1, 2, 4, 8, 16
FEATURES_ALL = ("top", "wide", "ch", "sign", "lt")
FEATURES = ("top", "ch", "sign")  # fit's default: "wide" costs more decode speed than its bytes are worth


def edge_scale(mean1: float) -> int:
    """The power of two `fit` scales its bucket edges by, from the mean magnitude of the first AC frequency:
    the default edges suit int8-sized coefficients, and int16 packs often hold 10x their magnitudes."""
    return max(1, int(2 ** round(math.log2(max(mean1, 1.0) / 4.0)))) if mean1 > 8 else 1


def scaled_edges(edges: Sequence[float], scale: int) -> tuple[int, ...]:
    """`edges` times `scale` as distinct bucket edges in 1..NFEAT - 1 (feature sums are clamped there)."""
    return tuple(sorted({min(NFEAT - 1, max(1, round(x * scale))) for x in edges}))


def _bucket_table(edges: Sequence[int], stride: int) -> npt.NDArray[Any]:
    s = np.arange(NFEAT)
    return (np.searchsorted(np.asarray(edges, dtype=np.int64), s, side="right") * stride).astype(np.int32)


def _neighbours(freqs: Sequence[Sequence[int]]) -> npt.NDArray[Any]:
    """(4, K) plane index of (u-1, v), (u, v-1), (u-2, v), (u, v-2) in the same block, -1 if not kept.

    Volumes ((u, v, w) frequencies of 8x8x8 blocks): the lower neighbours along w, v and u that are kept, in
    that order, then -1 (the kernel's s_in sums the first two; "wide" adds the third)."""
    pos = {uv: k for k, uv in enumerate(freqs)}
    if freqs and len(freqs[0]) == 3:
        rows = np.full((4, len(freqs)), -1, np.int32)
        for k, (u, v, w) in enumerate(freqs):
            lower = [pos.get(f, -1) for f in ((u, v, w - 1), (u, v - 1, w), (u - 1, v, w))] if k else []
            for j, n in enumerate(n for n in lower if n >= 0):
                rows[j, k] = n
        return rows
    offs = ((-1, 0), (0, -1), (-2, 0), (0, -2))
    return np.array(
        [[pos.get((u + du, v + dv), -1) if k else -1 for k, (u, v) in enumerate(freqs)] for du, dv in offs], np.int32
    )


class _Layout:
    """Where each coefficient's context index comes from (everything but the parameters)."""

    def __init__(
        self,
        cf: int,
        mask: str,
        channels: int,
        freq_classes: str,
        channel_groups: Sequence[int],
        edges_in: Sequence[int],
        edges_lt: Sequence[int],
        edges_ch: Sequence[int],
        edges_dc: Sequence[int],
        lt_mode: str = "top",
        wide: bool = False,
        sign_flip: Sequence[int] = (),
    ) -> None:
        self.cf, self.mask, self.channels = cf, mask, channels
        self.volume = mask in transform3d.MASKS3  # 8x8x8 blocks: arrays (B, C, Db, Hb, K, Wb) (`coded_plane`)
        self.kept = len(kept_frequencies(cf, mask))  # planes per block of the arrays this model codes
        self.freqs, self.split = coded_plane(cf, mask)
        self.K = len(self.freqs)  # planes per row the kernel codes
        if self.K > MAX_KEPT:
            raise CtxCodecError(f"cf={cf} mask={mask!r}: expected at most {MAX_KEPT} kept frequencies. Got {self.K}")
        self.freq_classes = freq_classes
        self.channel_groups = list(channel_groups)
        self.edges_in, self.edges_lt = tuple(edges_in), tuple(edges_lt)
        self.edges_ch, self.edges_dc = tuple(edges_ch), tuple(edges_dc)
        if freq_classes == "k":
            fc = list(range(self.K))
        elif freq_classes == "uv":
            fc = [sum(f) for f in self.freqs]  # the diagonal u + v (+ w for a volume)
        else:
            raise CtxCodecError(f"freq_classes: expected 'k' or 'uv'. Got {freq_classes!r}")
        nfc = max(fc) + 1
        ngroups = max(self.channel_groups) + 1
        nb_in, nb_lt, nb_ch, nb_dc = len(edges_in) + 1, len(edges_lt) + 1, len(edges_ch) + 1, len(edges_dc) + 1
        if channels == 1 or not edges_ch:
            nb_ch = 1
        self.n_dc = ngroups * nb_dc
        per_class = nb_in * nb_lt * nb_ch
        self.nctx = self.n_dc + ngroups * nfc * per_class
        if self.nctx > MAX_CONTEXTS:
            raise CtxCodecError(f"model: expected at most {MAX_CONTEXTS} contexts. Got {self.nctx}")
        kc = np.zeros((channels, self.K), np.int32)
        for c in range(channels):
            g = self.channel_groups[c]
            kc[c, 0] = g * nb_dc
            for k in range(1, self.K):
                kc[c, k] = self.n_dc + (g * nfc + fc[k]) * per_class
        self.kc = kc
        self.bin = _bucket_table(edges_in, nb_lt * nb_ch)
        self.blt = _bucket_table(edges_lt, nb_ch) if edges_lt else np.zeros(NFEAT, np.int32)
        self.bch = _bucket_table(edges_ch, 1) if nb_ch > 1 else np.zeros(NFEAT, np.int32)
        self.bdc = _bucket_table(edges_dc, 1)
        self.lt_mode, self.wide = lt_mode, bool(wide)
        self.sign_flip = tuple(int(i) for i in sign_flip)
        if self.sign_flip and len(self.sign_flip) != channels:
            raise CtxCodecError(f"sign_flip: expected {channels} entries or none. Got {len(self.sign_flip)}")
        self.flags = (
            ((F_LT if lt_mode == "lt" else F_TOP) if edges_lt else 0)
            | (F_CH if nb_ch > 1 else 0)
            | (F_WIDE if self.wide else 0)
            | (F_SFLIP if self.sign_flip and channels > 1 else 0)
        )
        self.flipf = np.array([_flip_freq(i) for i in (self.sign_flip or (128,) * channels)], np.int32)
        self.nbr = _neighbours(self.freqs)

    def blob(self, cum: npt.NDArray[Any], lutb: int = LUTB) -> npt.NDArray[Any]:
        """The kernel's model (native byte order: built in memory, never stored): int32 header, tables
        and per context the index of its frequency table, then each distinct table (contexts with the
        same parameter bytes share one, so the decoder's working set stays in L1): cum[NTOK+1] uint16
        padded to 64 bytes and a 2^LUTB-entry uint8 search-start table (token of slot >> (SCALE - LUTB)).
        Returned as a uint8 array whose tables start on 64-byte boundaries (one cache line per cum)."""
        cum = np.ascontiguousarray(cum, dtype=np.uint16)
        uniq, tidx = _unique_rows(cum)
        head = np.array([MAGIC, self.channels, self.K, self.nctx, self.flags, len(uniq)], np.int32)
        ints = np.concatenate(
            [
                head,
                self.kc.ravel(),
                self.nbr.ravel(),
                self.flipf,
                self.bin,
                self.blt,
                self.bch,
                self.bdc,
                np.asarray(tidx, np.int32).reshape(-1),
            ]
        ).astype(np.int32)
        probes = np.arange(1 << lutb, dtype=np.int64) << (SCALE - lutb)
        lut = _search_starts(uniq, probes)
        padded = np.full((len(uniq), _CUM_BYTES // 2), 0xFFFF, np.uint16)  # > every slot: searches stop
        padded[:, : NTOK + 1] = uniq
        tab = np.concatenate([padded.view(np.uint8), lut], 1)
        size = ints.nbytes + tab.nbytes + TABPAD  # zero bytes after the tables: the vector decoder's reads
        raw = np.zeros(size + 64, np.uint8)
        at = (-raw.ctypes.data - ints.nbytes) % 64  # so that the tables start on a 64-byte boundary
        out = raw[at : at + size]
        out[: ints.nbytes] = ints.view(np.uint8)
        out[ints.nbytes : ints.nbytes + tab.nbytes] = tab.ravel()
        return out

    def layout_config(self) -> dict[str, Any]:
        return {
            "freq_classes": self.freq_classes,
            "lt_mode": self.lt_mode,
            "wide": self.wide,
            "sign_flip": list(self.sign_flip),
            "channel_groups": self.channel_groups,
            "edges_in": list(self.edges_in),
            "edges_lt": list(self.edges_lt),
            "edges_ch": list(self.edges_ch),
            "edges_dc": list(self.edges_dc),
        }


def _freqs_many(iz: npt.NDArray[Any], ir: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Vectorised `_freqs` for many (iz, ir) pairs: the same IEEE-754 operations in the same order per
    pair (numpy's elementwise + - * are correctly rounded), so the result is bit-identical; pairs whose
    normalisation would need more than one step fall back to `_freqs` (tested in tests/core/test_entropy.py)."""
    zg, tg = np.array(Z_GRID), np.array(T_GRID)
    z, t = zg[iz], tg[ir]
    r = 1.0 - t
    nz = 1.0 - z
    p = np.empty((len(z), NTOK))
    p[:, 0] = z
    rk = np.ones_like(z)
    for m in range(1, D):
        p[:, m] = nz * t * rk
        rk = rk * r
    r_pow2, tail_prev = r.copy(), rk
    for j in range(NTOK - D):
        nxt = tail_prev * r_pow2 if j < NTOK - D - 1 else np.zeros_like(z)
        p[:, D + j] = nz * (tail_prev - nxt)
        tail_prev = nxt
        r_pow2 = r_pow2 * r_pow2
    f: npt.NDArray[np.int64] = np.maximum(1, np.floor(p * MTOT + 0.5)).astype(np.int64)
    diff = MTOT - f.sum(1)
    i = f.argmax(1)  # first maximum, as _freqs's tie-break
    rows = np.arange(len(f))
    ok = f[rows, i] + diff >= 1
    f[rows[ok], i[ok]] += diff[ok]
    for k in np.nonzero(~ok)[0]:
        f[k] = _freqs(int(iz[k]), int(ir[k]))
    return f


def _search_starts(uniq: npt.NDArray[Any], probes: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Per table and probe slot the number of cum[1:] entries <= the slot, clipped to NTOK - 1 (`blob`'s search
    starts): one binary search over all tables at once when each table is nondecreasing (every table a model
    builds), the table-by-probe comparison otherwise."""
    ends = uniq[:, 1:].astype(np.int64)
    if len(ends) and np.all(ends[:, 1:] >= ends[:, :-1]):
        off = np.arange(len(ends), dtype=np.int64)[:, None] << 20  # above every uint16 entry and probe
        at = np.searchsorted((ends + off).ravel(), (probes[None, :] + off).ravel(), side="right")
        counts = at.reshape(len(ends), -1) - np.arange(len(ends))[:, None] * ends.shape[1]
    else:
        counts = (ends[:, :, None] <= probes[None, None, :]).sum(1)
    starts: npt.NDArray[np.uint8] = counts.clip(0, NTOK - 1).astype(np.uint8)
    return starts


_ROW_MIX = np.random.default_rng(0x5EED).integers(1, 1 << 62, NTOK + 1, dtype=np.uint64) | np.uint64(1)


def _unique_rows(cum: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """`np.unique(cum, axis=0, return_inverse=True)` of (n, NTOK + 1) tables, the same result without sorting
    n rows as records (that sort dominated a small set's fit): the rows are grouped by a 64-bit mix of their
    values, checked equal within each group, and only the distinct rows are sorted as records."""
    mix = cum.astype(np.uint64) @ _ROW_MIX  # wraps modulo 2^64
    _, first, inv = np.unique(mix, return_index=True, return_inverse=True)
    reps = cum[first]
    if not np.array_equal(reps[inv.reshape(-1)], cum):  # two different rows mixed alike: the plain way
        uniq, tidx = np.unique(cum, axis=0, return_inverse=True)
        return uniq, tidx.reshape(-1)
    uniq, order = np.unique(reps, axis=0, return_inverse=True)
    return uniq, order.reshape(-1)[inv.reshape(-1)]


# The cumulative table of every parameter pair (iz * 256 + ir) built so far: `fit` asks for the same pairs for
# every layout and grid it tries. Rows are written before their flag, and always with the same values.
_CUM_CACHE = np.zeros((1 << 16, NTOK + 1), np.uint16)
_CUM_BUILT = np.zeros(1 << 16, bool)
_NLOG_CACHE = np.zeros((1 << 16, NTOK))  # log2(P(token)) of the same tables (`_table_bits`)


def _cum_tables(iz: npt.NDArray[Any], ir: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """(nctx, NTOK + 1) uint16 cumulative frequencies (0 .. 2^15) for the parameter bytes."""
    keys = np.asarray(iz, np.int64).reshape(-1) * 256 + np.asarray(ir, np.int64).reshape(-1)
    uniq = np.flatnonzero(np.bincount(keys, minlength=1 << 16))  # the distinct pairs (bytes: keys < 2^16)
    new = uniq[~_CUM_BUILT[uniq]]
    if new.size:
        f = _freqs_many(new // 256, new % 256)
        cum = np.zeros((len(new), NTOK + 1), np.int64)
        np.cumsum(f, axis=1, out=cum[:, 1:])
        _CUM_CACHE[new] = cum.astype(np.uint16)
        _NLOG_CACHE[new] = np.log2(np.diff(cum.astype(np.float64), axis=1) / MTOT)
        _CUM_BUILT[new] = True
    tables: npt.NDArray[np.uint16] = _CUM_CACHE[keys]
    return tables


def _check_int_list(name: str, v: object, lo: int, hi: int, maxlen: int) -> list[int]:
    if not isinstance(v, (list, tuple)) or len(v) > maxlen:
        raise CtxCodecError(f"config {name}: expected a list of at most {maxlen} ints. Got {v!r:.80}")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise CtxCodecError(f"config {name}: expected ints in [{lo}, {hi}]. Got {x!r}")
        out.append(int(x))
    return out


def _check_segment(segment: object, name: str = "segment") -> int:
    lo, hi = SEGMENT_RANGE
    if isinstance(segment, bool) or not isinstance(segment, (int, np.integer)) or not lo <= segment <= hi:
        raise CtxCodecError(f"{name}: expected coefficients per segment, an int in [{lo}, {hi}]. Got {segment!r}")
    return int(segment)


def _check_segment_bytes(value: object, name: str = "segment_bytes") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= SEGMENT_BYTES_MAX:
        raise CtxCodecError(
            f"{name}: expected stream bytes per added segment, an int in [0, {SEGMENT_BYTES_MAX}] (0: no bound). "
            f"Got {value!r}"
        )
    return int(value)


# -------------------------------------------------------------------------------------------------
class CtxCodec:
    """numcodecs-style codec. Construct with `fit` or `from_config`; the config carries the model."""

    codec_id = CODEC_ID

    def __init__(
        self,
        layout: _Layout,
        iz: npt.NDArray[Any],
        ir: npt.NDArray[Any],
        kernel: Any = None,  # the C kernel module (dctdata.entropy._ctxrans or a build of it)
        version: int = FORMAT_VERSION,
        segment: int = SEGMENT,
        segment_bytes: int = SEGMENT_BYTES,
    ):
        self._k = kernel or _ctxrans
        self.version = version
        self.segment = _check_segment(segment)  # coefficients per segment of a mode 3 stream (version 3)
        self.segment_bytes = _check_segment_bytes(segment_bytes)  # stream bytes per segment beyond SEGMENT_V3's
        self.layout = layout
        self.iz = np.asarray(iz, np.uint8)
        self.ir = np.asarray(ir, np.uint8)
        if self.iz.shape != (layout.nctx,) or self.ir.shape != (layout.nctx,):
            raise CtxCodecError(f"model params: expected {layout.nctx} contexts. Got {self.iz.shape}")
        self.cum = _cum_tables(self.iz, self.ir)
        self._blob_built: npt.NDArray[Any] | None = None
        self.table_crc = zlib.crc32(self.cum.astype("<u2").tobytes())

    @property
    def _blob(self) -> npt.NDArray[Any]:
        """The kernel's model (`_Layout.blob`), built on first use: `fit` builds a codec per candidate for its
        config's bytes and codes with one of them."""
        if self._blob_built is None:
            self._blob_built = self.layout.blob(self.cum, self._k.LUTB)
        return self._blob_built

    def with_kernel(self, kernel: Any) -> CtxCodec:
        """Same model on another build of the kernel (benchmarks of compile variants)."""
        return CtxCodec(self.layout, self.iz, self.ir, kernel, self.version, self.segment, self.segment_bytes)

    def with_streams(
        self, version: int | None = None, segment: int | None = None, segment_bytes: int | None = None
    ) -> CtxCodec:
        """The same model writing another config version's streams (1: mode 0, 2: mode 2, 3: segments), segment
        length or bound (None keeps this codec's); every codec of the model reads them all."""
        version = self.version if version is None else version
        if isinstance(version, bool) or version not in READ_VERSIONS:
            raise CtxCodecError(f"version: expected one of {READ_VERSIONS}. Got {version!r}")
        segment = self.segment if segment is None else segment
        segment_bytes = self.segment_bytes if segment_bytes is None else segment_bytes
        return CtxCodec(self.layout, self.iz, self.ir, self._k, version, segment, segment_bytes)

    # ---- config -------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        params = np.stack([self.iz, self.ir], 1).tobytes()
        lay = self.layout
        return {
            "id": CODEC_ID,
            "version": self.version,
            "cf": lay.cf,
            "mask": lay.mask,
            "channels": lay.channels,
            **lay.layout_config(),
            "params": base64.b64encode(zlib.compress(params, 9)).decode("ascii"),
            "table_crc": self.table_crc,
            # a version 3 config without them: SEGMENT_V3 and no bound (the configs written before keep their bytes)
            **({"segment": self.segment} if self.version >= 3 and self.segment != SEGMENT_V3 else {}),
            **({"segment_bytes": self.segment_bytes} if self.version >= 3 and self.segment_bytes else {}),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CtxCodec:
        if not isinstance(config, Mapping):
            raise CtxCodecError(f"config: expected a mapping. Got {type(config).__name__}")
        keys = {
            "id",
            "version",
            "cf",
            "mask",
            "channels",
            "freq_classes",
            "lt_mode",
            "wide",
            "sign_flip",
            "channel_groups",
            "edges_in",
            "edges_lt",
            "edges_ch",
            "edges_dc",
            "params",
            "table_crc",
        }
        optional = {"segment", "segment_bytes"}
        if not keys <= set(config) <= keys | optional:
            raise CtxCodecError(
                f"config: expected keys {sorted(keys)} (and {sorted(optional)} in version 3). Got {sorted(config)}"
            )
        version = config["version"]
        is_int = isinstance(version, int) and not isinstance(version, bool)
        if config["id"] != CODEC_ID or not is_int or version not in READ_VERSIONS:
            newer = is_int and version > FORMAT_VERSION
            raise CtxCodecError(
                f"config: expected id {CODEC_ID!r} version {' or '.join(map(str, READ_VERSIONS))}. "
                f"Got {config['id']!r} {version!r}" + (": written by a newer dctdata, upgrade dctdata" if newer else "")
            )
        for name in sorted(optional & set(config)):
            if version < 3:
                raise CtxCodecError(f"config {name}: expected only in a version 3 config. Got version {version}")
        segment = _check_segment(config.get("segment", SEGMENT_V3), "config segment")
        segment_bytes = _check_segment_bytes(config.get("segment_bytes", 0), "config segment_bytes")
        cf = config["cf"]
        if isinstance(cf, bool) or not isinstance(cf, int) or not 1 <= cf <= 8:
            raise CtxCodecError(f"config cf: expected 1..8. Got {cf!r}")
        ch = config["channels"]
        if isinstance(ch, bool) or not isinstance(ch, int) or not 1 <= ch <= 4096:
            raise CtxCodecError(f"config channels: expected 1..4096. Got {ch!r}")
        groups = _check_int_list("channel_groups", config["channel_groups"], 0, ch - 1, ch)
        if len(groups) != ch:
            raise CtxCodecError(f"config channel_groups: expected {ch} entries. Got {len(groups)}")
        edges = {
            n: _check_int_list(n, config[n], 1, NFEAT - 1, 32) for n in ("edges_in", "edges_lt", "edges_ch", "edges_dc")
        }
        for n, e in edges.items():
            if any(b <= a for a, b in itertools.pairwise(e)):
                raise CtxCodecError(f"config {n}: expected increasing edges. Got {e}")
        if not edges["edges_in"] or not edges["edges_dc"]:
            raise CtxCodecError("config edges_in/edges_dc: expected at least one edge")
        if config["lt_mode"] not in ("lt", "top"):
            raise CtxCodecError(f"config lt_mode: expected 'lt' or 'top'. Got {config['lt_mode']!r}")
        if not isinstance(config["wide"], bool):
            raise CtxCodecError(f"config wide: expected a bool. Got {config['wide']!r}")
        flips = _check_int_list("sign_flip", config["sign_flip"], 0, 255, ch)
        if flips and len(flips) != ch:
            raise CtxCodecError(f"config sign_flip: expected {ch} entries or none. Got {len(flips)}")
        lay = _Layout(
            cf,
            config["mask"],
            ch,
            config["freq_classes"],
            groups,
            **edges,
            lt_mode=config["lt_mode"],
            wide=config["wide"],
            sign_flip=flips,
        )
        try:
            raw = zlib.decompressobj().decompress(base64.b64decode(config["params"], validate=True), 2 * lay.nctx + 1)
        except (ValueError, TypeError, zlib.error) as exc:
            raise CtxCodecError(
                f"config params: expected base64 zlib bytes. Got {str(config['params'])[:40]!r}"
            ) from exc
        if len(raw) != 2 * lay.nctx:
            raise CtxCodecError(f"config params: expected {2 * lay.nctx} bytes. Got {len(raw)}")
        p = np.frombuffer(raw, np.uint8).reshape(-1, 2)
        codec = cls(lay, p[:, 0], p[:, 1], version=version, segment=segment, segment_bytes=segment_bytes)
        if codec.table_crc != config["table_crc"]:
            raise CtxCodecError("config table_crc: the frequency tables built here differ from the writer's")
        return codec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CtxCodec) and self.get_config() == other.get_config()

    def __repr__(self) -> str:
        lay = self.layout
        return (
            f"CtxCodec(cf={lay.cf}, mask={lay.mask!r}, channels={lay.channels}, contexts={lay.nctx}, "
            f"freq_classes={lay.freq_classes!r}, lt={bool(lay.edges_lt)}, ch={lay.flags & 2 > 0})"
        )

    # ---- coding -------------------------------------------------------------------------------
    def _rows(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The kernel's (B, C, rows, K, Wb) of an array shape this model codes: itself for 2-D blocks; a volume's
        (B, C, Db, Hb, K, Wb) or (B, C, Db * Hb, K, Wb) as the view `coded_plane` describes."""
        return _kernel_shape(tuple(shape), self.layout.volume, self.layout.split)

    def _check_array(self, q: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if not isinstance(q, np.ndarray):
            raise TypeError(f"q: expected a numpy array (B, C, Hb, K, Wb). Got {type(q).__name__}")
        lay = self.layout
        if q.dtype not in (np.int8, np.int16) or q.ndim not in ((5, 6) if lay.volume else (5,)) or q.size == 0:
            raise CtxCodecError(f"q: expected int8/int16 of shape (B, C, Hb, K, Wb). Got {q.dtype} {q.shape}")
        if q.shape[-2] != lay.kept or q.shape[1] > lay.channels:
            raise CtxCodecError(f"q: expected K={lay.kept} and C <= {lay.channels}. Got shape {q.shape}")
        return np.ascontiguousarray(q).reshape(self._rows(q.shape))

    def encode(self, q: npt.NDArray[Any]) -> bytes:
        q = self._check_array(q)
        shape = tuple(int(s) for s in q.shape)
        mode, nseg = self.stream_mode(shape)
        if mode == MODE_SEGMENTS and self.segment_bytes:
            # beyond the first version 3 count, one segment per segment_bytes bytes of the stream as the model
            # estimates it (a context pass, no trial encode)
            base = _stream_mode(self.version, SEGMENT_V3, shape)  # (not a codec built per call: its tables cost)
            cap = max(base[1], 1) + self._estimate(q, shape, nseg) // self.segment_bytes
            if cap < nseg:
                n = math.prod(shape)
                mode, nseg = (MODE_SEGMENTS, cap) if cap >= 2 else (MODE_LANES if n >= LANES_MIN else 0, 0)
        buf: bytes = self._k.encode(self._blob, q, shape, q.itemsize, mode, nseg)
        return buf

    def estimate(self, q: npt.NDArray[Any]) -> int:
        """Bytes of the stream `encode` would write of q in this codec's most segments (`stream_mode`), estimated
        from the model without encoding: each coefficient's ideal code length in its context (-log2 of its token's
        probability), its raw bits and sign, over sampled block rows of a 2-D array (every row of a volume), plus
        each segment's top row coded without the row above and its fixed bytes (its 16 states, its length). What
        `encode` sets the segment count by; the raw copy's fallback is not taken into account."""
        q = self._check_array(q)
        shape = tuple(int(s) for s in q.shape)
        return self._estimate(q, shape, self.stream_mode(shape)[1])

    def _estimate(self, q: npt.NDArray[Any], shape: tuple[int, ...], nseg: int) -> int:
        # 2-D blocks: block rows sampled, ESTIMATE_ROWS[1] of every ESTIMATE_ROWS[0], each run walked from the row
        # above it so that its contexts are the encoder's; a volume's rows (depth slabs of block rows, each `split`
        # coded rows) all, as sampling them missed the length by 10-20%
        every, run = (1, 1) if self.layout.volume else ESTIMATE_ROWS
        bits, top = self._k.estimate(self._blob, q, shape, q.itemsize, self._cost_table(), every, run)
        # each segment: its fixed bytes, and all but the array's first its top row coded without the row above
        return int((bits + top * max(nseg - 1, 0)) / 2048 + SEGMENT_FIXED_BYTES * max(nseg, 1))

    def _cost_table(self) -> npt.NDArray[np.uint16]:
        """The kernel's costs for `estimate`: per context and token -log2 of its probability in 1/256 bits, then
        per channel a flip symbol's cost when the sign is the same and when it differs (built once per codec)."""
        table: npt.NDArray[np.uint16] | None = getattr(self, "_costs", None)
        if table is None:
            freq = np.diff(self.cum.astype(np.int64), axis=1)
            tok = np.round(256 * (SCALE - np.log2(np.maximum(freq, 1)))).astype(np.uint16)
            f1 = self.layout.flipf.astype(np.int64)  # a flip symbol's frequency of "the sign differs"
            flips = np.stack([SCALE - np.log2(MTOT - f1), SCALE - np.log2(f1)], 1)
            table = np.concatenate([tok.ravel(), np.round(256 * flips).astype(np.uint16).ravel()])
            self._costs = table
        return table

    def stream_mode(self, shape: Sequence[int]) -> tuple[int, int]:
        """(mode, segments) this codec writes an array of `shape` (B, C, Hb, K, Wb) in: mode 3 with one segment per
        `segment` coefficients (at most one per block row) from version 3, for arrays of two segments or more; mode 2
        from version 2, else mode 0 (segments 0 outside mode 3). The most segments: `encode` writes fewer where
        `segment_bytes` bounds them (a low-rate array), and a raw copy (mode 1) where coding does not save."""
        return _stream_mode(self.version, self.segment, shape)

    def decode(
        self,
        buf: BytesLike,
        shape: Sequence[int] | None = None,
        dtype: npt.DTypeLike | None = None,
        out: npt.NDArray[Any] | None = None,
    ) -> npt.NDArray[Any]:
        """Stored bytes -> array of the declared shape/dtype; CtxCodecError if they cannot be it.

        Either shape and dtype, or `out`: a C-contiguous int8/int16 array of 5 dims to decode into
        (a zarr chunk buffer, a slice of a pinned batch); out's shape/dtype are the declared ones. A volume
        model also takes 6 dims (B, C, Db, Hb, K, Wb)."""
        if out is not None:
            _check_out(out)
            shape, dtype = out.shape, out.dtype
        declared, dt = self._declared(shape, dtype)
        rows = self._rows(declared)
        if out is None:  # a declared shape the stream cannot hold is refused before its array is allocated
            try:
                nbytes = buf.nbytes if isinstance(buf, np.ndarray) else memoryview(buf).nbytes
                check_coefficients(nbytes, math.prod(rows))
            except TypeError:
                raise CtxCodecError(f"buf: expected bytes-like. Got {type(buf).__name__}") from None
            out = np.empty(declared, dt)
        try:
            self._k.decode(self._blob, buf, out.reshape(rows), rows, dt.itemsize)
        except ValueError as exc:
            raise CtxCodecError(f"{exc}") from None
        except TypeError:  # not a bytes-like object
            raise CtxCodecError(f"buf: expected bytes-like. Got {type(buf).__name__}") from None
        return out

    def decode_many(self, bufs: Sequence[BytesLike], out: npt.NDArray[Any]) -> int:
        """Streams `bufs` into out[0], out[1], ... (out: C-contiguous int8/int16 of shape (len(bufs), B, C, Hb,
        K, Wb), each out[i] the declared array of bufs[i]), in one kernel call that releases the GIL once: a
        reader thread decoding a run of chunks holds the GIL for the call, not for each chunk. Returns how many
        decoded before the first that did not (len(bufs) when all did); `decode` of that one gives its error."""
        if not isinstance(bufs, (list, tuple)):
            raise TypeError(f"bufs: expected a list or tuple of bytes-like objects. Got {type(bufs).__name__}")
        _check_out(out)
        if out.ndim not in ((6, 7) if self.layout.volume else (6,)) or out.shape[0] != len(bufs):
            raise CtxCodecError(f"out: expected shape (len(bufs)={len(bufs)}, B, C, Hb, K, Wb). Got {out.shape}")
        declared, dt = self._declared(out.shape[1:], out.dtype)
        shape = self._rows(declared)
        try:
            return int(self._k.decode_many(self._blob, bufs, out.reshape(len(bufs), *shape), shape, dt.itemsize))
        except ValueError as exc:
            raise CtxCodecError(f"{exc}") from None
        except (TypeError, BufferError) as exc:
            raise CtxCodecError(f"bufs: expected bytes-like objects ({exc})") from None

    def _declared(
        self, shape: Sequence[int] | None, dtype: npt.DTypeLike | None
    ) -> tuple[tuple[int, ...], np.dtype[Any]]:
        """The declared shape and dtype checked against this model; CtxCodecError otherwise."""
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise CtxCodecError(f"dtype: expected int8 or int16. Got {dtype!r}") from exc
        if dt not in (np.int8, np.int16):
            raise CtxCodecError(f"dtype: expected int8 or int16. Got {dt}")
        try:
            if shape is None:
                raise TypeError(shape)
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError) as exc:
            raise CtxCodecError(f"shape: expected 5 ints. Got {shape!r}") from exc
        if self.layout.volume and len(shape) == 6:  # (B, C, Db, Hb, K, Wb)
            if min(shape) < 1 or math.prod(shape) > MAX_ELEMENTS:
                raise CtxCodecError(f"shape: expected 6 positive ints (B, C, Db, Hb, K, Wb). Got {shape}")
            lay = self.layout
            if shape[4] != lay.kept or shape[1] > lay.channels:
                raise CtxCodecError(f"shape: expected K={lay.kept} and C <= {lay.channels}. Got {shape}")
            return shape, dt
        if len(shape) != 5 or min(shape) < 1 or math.prod(shape) > MAX_ELEMENTS:
            raise CtxCodecError(f"shape: expected 5 positive ints (B, C, Hb, K, Wb). Got {shape}")
        if shape[3] != self.layout.kept or shape[1] > self.layout.channels:
            raise CtxCodecError(f"shape: expected K={self.layout.kept} and C <= {self.layout.channels}. Got {shape}")
        return shape, dt

    # ---- fitting ------------------------------------------------------------------------------
    @staticmethod
    def _counts(
        layout: _Layout, qs: Sequence[npt.NDArray[Any]]
    ) -> tuple[npt.NDArray[Any], int, npt.NDArray[Any], npt.NDArray[Any]]:
        """-> token counts (nctx, NTOK), bits of the bit section, and per channel the number of signs
        coded as flips and of actual flips (when the layout codes signs as flips)."""
        dummy = layout.blob(np.ones((layout.nctx, NTOK + 1), np.uint16))
        h = np.zeros(layout.nctx * NTOK, np.int64)
        raw = 0
        C = layout.channels
        n_has, n_flip = np.zeros(C, np.int64), np.zeros(C, np.int64)
        for q in qs:
            ctx = np.empty(q.size, np.int32)
            tok = np.empty(q.size, np.uint8)
            raw += _ctxrans.contexts(dummy, q, tuple(q.shape), q.itemsize, ctx, tok)
            h += np.bincount(ctx.astype(np.int64) * NTOK + (tok & 0x3F), minlength=layout.nctx * NTOK)
            if layout.flags & F_SFLIP:
                ch = np.broadcast_to(np.arange(C).reshape(1, C, 1, 1, 1), q.shape).ravel()[: q.size]
                has = (tok & 0x40) > 0
                n_has += np.bincount(ch[has], minlength=C)[:C]
                n_flip += np.bincount(ch[has & ((tok & 0x80) > 0)], minlength=C)[:C]
        return h.reshape(layout.nctx, NTOK), raw, n_has, n_flip

    @overload
    @classmethod
    def fit(
        cls,
        q_samples: npt.NDArray[Any] | Sequence[npt.NDArray[Any]],
        cf: int,
        mask: str = ...,
        *,
        features: Sequence[str] = ...,
        layouts: Sequence[Mapping[str, Any]] | None = ...,
        segment: int = ...,
        segment_bytes: int = ...,
        return_report: Literal[False] = ...,
        _first_only: bool = ...,
    ) -> CtxCodec: ...

    @overload
    @classmethod
    def fit(
        cls,
        q_samples: npt.NDArray[Any] | Sequence[npt.NDArray[Any]],
        cf: int,
        mask: str = ...,
        *,
        features: Sequence[str] = ...,
        layouts: Sequence[Mapping[str, Any]] | None = ...,
        segment: int = ...,
        segment_bytes: int = ...,
        return_report: Literal[True],
        _first_only: bool = ...,
    ) -> tuple[CtxCodec, FitReport]: ...

    @classmethod
    def fit(  # noqa: C901 (over the limit: to split)
        cls,
        q_samples: npt.NDArray[Any] | Sequence[npt.NDArray[Any]],
        cf: int,
        mask: str = "square",
        *,
        features: Sequence[str] = FEATURES,
        layouts: Sequence[Mapping[str, Any]] | None = None,
        segment: int = SEGMENT,
        segment_bytes: int = SEGMENT_BYTES,
        return_report: bool = False,
        _first_only: bool = False,
    ) -> CtxCodec | tuple[CtxCodec, FitReport]:
        """Fit a model on calibration samples: an array (N, C, Hb, K, Wb) or a list of such arrays.

        Coordinate descent over the context layout from a strong default, one feature toggled at a
        time, keeping a change when it lowers the total bits (coded streams + the model's own bytes).
        `features` are the optional context features it may use; each saves bytes and costs decode speed
        (docs/benchmarks/entropy.md has both measured): drop "wide" then "top" when decode speed matters
        more than a few percent of size.
          "top"  |same frequency in the block above|
          "wide" second-order in-block neighbours
          "ch"   |same coefficient, previous channel| (C > 1)
          "sign" sign coded relative to the previous channel's (C > 1: RGB and multi-band coefficients
                 mostly share signs, so it saves most before any channel decorrelation)
          "lt"   left block too (the symbol decoded just before: longest dependency chain; off by default)
        `layouts`: explicit list of layout dicts to try instead (benchmarks). `segment`: coefficients per segment
        of the mode 3 streams the codec writes (shorter: a faster GPU decode, more bytes); `segment_bytes`: the
        stream bytes each segment beyond the first version 3 count needs (0: no bound)."""
        segment, segment_bytes = _check_segment(segment), _check_segment_bytes(segment_bytes)
        unknown = set(features) - set(FEATURES_ALL)
        if unknown:
            raise CtxCodecError(f"features: expected a subset of {FEATURES_ALL}. Got {sorted(unknown)}")
        qs = [q_samples] if isinstance(q_samples, np.ndarray) else list(q_samples)
        qs = [np.ascontiguousarray(q) for q in qs]
        volume = mask in transform3d.MASKS3  # (N, C, Db, Hb, K, Wb) or (N, C, Db * Hb, K, Wb) arrays
        if not qs or any(q.ndim not in ((5, 6) if volume else (5,)) or q.dtype not in (np.int8, np.int16) for q in qs):
            raise CtxCodecError("q_samples: expected int8/int16 arrays of shape (N, C, Hb, K, Wb)")
        channels = qs[0].shape[1]
        if any(q.shape[1] != channels for q in qs):
            raise CtxCodecError("q_samples: expected the same number of channels in every array")
        if qs[0].shape[-2] != len(kept_frequencies(cf, mask)):
            raise CtxCodecError(
                f"q_samples: expected K={len(kept_frequencies(cf, mask))} for cf={cf} {mask}. Got {qs[0].shape}"
            )
        if volume:
            split = coded_plane(cf, mask)[1]
            qs = [q.reshape(_kernel_shape(q.shape, True, split)) for q in qs]
        # scale the bucket edges to the data: int16 packs often have magnitudes 10x int8's
        sample = (
            np.concatenate([np.abs(q[:, :, :, 1:2].astype(np.int32)).ravel() for q in qs])
            if qs[0].shape[3] > 1
            else np.zeros(1)
        )
        scale = edge_scale(float(sample.mean()) if sample.size else 0.0)
        report: FitReport = []

        def evaluate(layout: Mapping[str, Any]) -> tuple[CtxCodec, float]:
            spec = dict(layout)
            if channels > 1 and "sign_flip" not in spec and "sign" in features:
                spec["sign_flip"] = (128,) * channels  # gather flip statistics, decide below
            lay = _Layout(cf, mask, channels, **spec)
            h, raw, n_has, n_flip = cls._counts(lay, qs)
            flip_bits = 0.0
            if lay.flags & F_SFLIP:
                ib, fb = _fit_flips(n_has, n_flip)
                if fb + 8 * channels < n_has.sum():  # cheaper than raw sign bits, model included
                    spec["sign_flip"], flip_bits = tuple(ib), fb
                else:
                    spec["sign_flip"], flip_bits = (), float(n_has.sum())
                lay = _Layout(cf, mask, channels, **spec)
            costs = _param_costs(h[_used(h)])  # once for every grid below
            iz, ir, _ = _fit_params(h, PRECISIONS[0], costs)
            codec = cls(lay, iz, ir, segment=segment, segment_bytes=segment_bytes)
            config = codec.get_config()
            model_bytes = len(json.dumps(config, separators=(",", ":")))
            bits = _table_bits(h, iz, ir) + raw + flip_bits + 8 * model_bytes
            base = model_bytes - len(config["params"])  # the config but its params (a CRC's digits aside)
            best_p, coarser = (bits, iz, ir), False
            for precision in PRECISIONS[1:]:  # the model's bytes against its streams' (`_fit_params`)
                iz, ir, _ = _fit_params(h, precision, costs)
                nbytes = base + len(base64.b64encode(zlib.compress(np.stack([iz, ir], 1).tobytes(), 9)))
                total = _table_bits(h, iz, ir) + raw + flip_bits + 8 * nbytes
                if total >= best_p[0]:  # past the best: coarser only costs more
                    break
                best_p, coarser = (total, iz, ir), True
            if coarser:  # the codec of the grid that won, its bits with its own config's length
                _, iz, ir = best_p
                codec = cls(lay, iz, ir, segment=segment, segment_bytes=segment_bytes)
                model_bytes = len(json.dumps(codec.get_config(), separators=(",", ":")))
                bits = _table_bits(h, iz, ir) + raw + flip_bits + 8 * model_bytes
            report.append((spec, bits, model_bytes))
            log.debug(
                "%s g=%s %s=%s wide=%s ch=%s flips=%s ctx=%d model=%dB bits=%.0f", spec["freq_classes"],
                spec["channel_groups"], spec["lt_mode"], bool(spec["edges_lt"]), spec["wide"], bool(spec["edges_ch"]),
                bool(spec.get("sign_flip")), lay.nctx, model_bytes, bits,
            )  # fmt: skip
            return codec, bits

        if layouts is not None:  # explicit list: try them all
            best = min((evaluate(spec) for spec in layouts), key=lambda cb: cb[1])
        else:  # greedy: one feature at a time from a strong default, keep what saves bits

            def sc(e: Sequence[float]) -> tuple[int, ...]:
                return scaled_edges(e, scale)

            use = set(features)
            cur: dict[str, Any] = dict(
                freq_classes="uv",
                lt_mode="lt" if "lt" in use else "top",
                wide="wide" in use,
                channel_groups=[0] * channels,
                edges_in=sc(DEFAULT_EDGES_WIDE if "wide" in use else DEFAULT_EDGES_IN),
                edges_lt=sc(DEFAULT_EDGES_LT) if use & {"top", "lt"} else (),
                edges_ch=sc(DEFAULT_EDGES_CH) if channels > 1 and "ch" in use else (),
                edges_dc=sc(DEFAULT_EDGES_DC),
            )
            best = evaluate(cur)
            if _first_only:
                return best[0], report
            wide_in = {True: sc(DEFAULT_EDGES_WIDE), False: sc(DEFAULT_EDGES_IN)}
            octave_in = sc(OCTAVE_EDGES_IN)

            def toggles(c: Mapping[str, Any]) -> Iterator[dict[str, Any]]:  # one-feature changes of the current layout
                yield dict(freq_classes="k" if c["freq_classes"] == "uv" else "uv")
                if "wide" in use:
                    yield dict(wide=not c["wide"], edges_in=wide_in[not c["wide"]])
                if not c["wide"] and octave_in != wide_in[False]:
                    yield dict(edges_in=wide_in[False] if c["edges_in"] == octave_in else octave_in)
                if use & {"top", "lt"}:
                    yield dict(edges_lt=() if c["edges_lt"] else sc(DEFAULT_EDGES_LT))
                if channels > 1:
                    if "ch" in use:
                        yield dict(edges_ch=() if c["edges_ch"] else sc(DEFAULT_EDGES_CH))
                    for g in ([0] * channels, [0] + [1] * (channels - 1), list(range(channels))):
                        if g != c["channel_groups"] and (channels <= 4 or max(g) <= 1):
                            yield dict(channel_groups=g)

            seen = {json.dumps(cur, sort_keys=True)}
            for _ in range(3):  # coordinate descent, a few passes
                improved = False
                for mv in list(toggles(cur)):
                    cand = {**cur, **mv}
                    key = json.dumps(cand, sort_keys=True)
                    if key in seen:
                        continue
                    seen.add(key)
                    got = evaluate(cand)
                    if got[1] < best[1]:
                        best, cur, improved = got, cand, True
                if not improved:
                    break
        return (best[0], report) if return_report else best[0]

    @classmethod
    def estimate_bytes(
        cls,
        q_samples: npt.NDArray[Any] | Sequence[npt.NDArray[Any]],
        cf: int,
        mask: str = "square",
        features: Sequence[str] = FEATURES,
    ) -> float:
        """Stored bytes of q_samples (streams + model) with the starting layout of `fit`, without the
        layout search or any encoding: one context pass, for the settings search (cf, mask, dtype)
        that today measures zstd sizes. Close to what `fit` + `encode` store: the layout search only
        refines the starting layout (docs/benchmarks/design.md)."""
        _, report = cls.fit(q_samples, cf, mask, features=features, return_report=True, _first_only=True)
        return report[0][1] / 8


def _stream_mode(version: int, segment: int, shape: Sequence[int]) -> tuple[int, int]:
    """`CtxCodec.stream_mode` of a codec of this config version and segment length."""
    n = math.prod(int(s) for s in shape)
    if version >= 3 and n >= 2 * segment and int(shape[2]) >= 2:
        return MODE_SEGMENTS, min(int(shape[2]), n // segment)
    return (MODE_LANES if version >= 2 and n >= LANES_MIN else 0), 0


def supports(cf: int, mask: str) -> bool:
    """Whether this kernel codes blocks of (cf, mask): at most MAX_KEPT planes per coded row (`coded_plane`: every
    2-D block and volume "cube"; "tetra" up to cf 6)."""
    return len(coded_plane(cf, mask)[0]) <= MAX_KEPT


def _kernel_shape(shape: tuple[int, ...], volume: bool, split: int) -> tuple[int, ...]:
    """(B, C, rows, K, Wb) the kernel codes for an array shape: a volume's (B, C, Db, Hb, K, Wb) merges Db and Hb,
    and each block row of `split` rows becomes `split` rows of K / split planes (a view of the same memory)."""
    if not volume:
        return tuple(shape)
    if len(shape) == 6:
        shape = (*shape[:2], shape[2] * shape[3], *shape[4:])
    b, c, r, k, wb = shape
    return (b, c, r * split, k // split, wb)


def fit(
    q_samples: npt.NDArray[Any] | Sequence[npt.NDArray[Any]], cf: int, mask: str = "square", **options: Any
) -> dict[str, Any]:
    """Fit on calibration samples and return the JSON config (the manifest entry); see CtxCodec.fit."""
    codec: CtxCodec = CtxCodec.fit(q_samples, cf, mask, **options)
    return codec.get_config()


@contextlib.contextmanager
def decoder_settings(simd: bool | None = None, gather: bool | None = None) -> Iterator[None]:
    """The kernel's 16-lane decoder for the block, then its settings as they were: `simd` switches the AVX2
    paths (off: the scalar decoder, as on a CPU without AVX2), `gather` makes their table lookups with the
    gather instruction (True) or scalar loads (False; the default on AMD CPUs). None keeps a setting.
    Process-wide; for benchmarks and tests that run every decoder on one machine."""
    was_simd, was_gather = _ctxrans.set_simd(), _ctxrans.set_gather()
    try:
        if simd is not None:
            _ctxrans.set_simd(simd)
        if gather is not None:
            _ctxrans.set_gather(gather)
        yield
    finally:
        _ctxrans.set_simd(was_simd)
        _ctxrans.set_gather(was_gather)
