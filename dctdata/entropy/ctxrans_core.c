/* ctxrans_core.c: context-modelled rANS for quantized block-DCT coefficients, the C core (no Python; the
 * CPython module around it is _ctxrans.c). This file defines the stored format bit for bit.
 *
 * Array layout: (B, C, Hb, K, Wb) int8 or int16, C-contiguous, coded in memory order, so the decoder
 * writes its output sequentially. Per coefficient (plane k of block (hb, wb) of channel c):
 *   k == 0 (DC): residual r = q - pred, pred = floor((left + top) / 2) (left or top alone at the
 *                edges, 0 in the first block); context = kc[c][0] + bdc[min(|L-TL| + |T-TL|, 1023)].
 *   k  > 0 (AC): r = q; context = kc[c][k] + bin[s_in] + blt[s_lt] + bch[s_ch] (sums clamped to 1023):
 *       s_in = |q(u-1,v)| + |q(u,v-1)| in the same block (a missing one is replaced by the other);
 *              with WIDE: 2 (|q(u-1,v)| + |q(u,v-1)|) + |q(u-2,v)| + |q(u,v-2)| (missing -> the nearer)
 *       s_lt = TOP: 2 |same k, block above| (0 in the first block row)
 *              LT:  |same k, left block| + |same k, block above| (2x the one that exists, 0 at (0,0))
 *       s_ch = |same position, previous channel| (c > 0 only)
 *   The bucket tables carry the strides, so "context" is an index into the per-context tables.
 *   |r| -> token t: t = |r| for |r| < D; else t = D + nb with e = |r| - D + 1 in [2^nb, 2^(nb+1)),
 *   followed by nb raw bits of e - 2^nb. Sign of r != 0: a raw bit (1 = negative), or with SFLIP, for
 *   AC in channel c > 0 whose previous-channel value is nonzero, a rANS-coded "sign differs" bit with
 *   probability flipf[c] / 2^15.
 * Tokens and sign flips use interleaved rANS states (frequency precision 2^15; state = coefficient index
 * % NS, one shared word stream): mode 0 has 2 64-bit states (32-bit words, L = 2^31), mode 2 16 32-bit
 * states (16-bit words, L = 2^16; see NS2 and DEC_BLOCK for its word order). Raw bits and plain signs go
 * to a separate LSB-first bit section, read without arithmetic coding.
 *
 * Stream: byte 0 = mode (0 or 2: rANS, 1: raw copy of the array). Then the NS states (uint64 LE in mode
 * 0, uint32 LE in mode 2), LEB128 length of the rANS section, the rANS section (LE words), then the bit
 * section to the end.
 * The decoder never reads outside `buf`, writes only inside `out`, does a bounded amount of work per
 * coefficient, and reports truncation or corruption when the sections do not end exactly at their
 * ends with both states back at L.
 *
 * Model blob (native-endian int32 words; built in memory by ctxrans.py, never stored, so its layout is
 * free to change; MAGIC says which):
 *   [0] magic 0x43545834 [1] C [2] K [3] nctx [4] flags (1 LT, 2 CH, 4 TOP, 8 SFLIP, 16 WIDE) [5] ntab
 *   kc[C*K], nup[K], nlf[K], nup2[K], nlf2[K], flipf[C], bin[1024], blt[1024], bch[1024], bdc[1024],
 *   tidx[nctx] (each context's table: contexts with the same parameters share one), then ntab tables
 *   of TABB bytes: cum[NTOK+1] uint16 (cumulative frequencies, 0 .. 2^15) padded with 0xFFFF to 64
 *   bytes, and lut[2^LUTB] uint8 (token at slot >> (15 - LUTB): where the table search starts); then
 *   TABPAD zero bytes. ctxrans.py places the tables on 64-byte boundaries (one cache line per cum); any address works.
 *
 * Decoder speed (the DataLoader workers' cost): with AVX2 (chosen at run time), mode 2 streams decode 8
 * coefficients per vector step and every stream's contexts are computed 8 at a time (dec_run_body,
 * ctx_run_body); the scalar code below reads both modes on any CPU. The decoder has its own walk (dec_walk)
 * in the order of WALKF. Per block row and AC plane it computes the table offsets of a run of up to 256 coefficients
 * first (their contexts depend on decoded values only), then runs the rANS steps; runs whose remaining
 * sections hold the worst case (8 bytes of words, 3 bytes of raw bits per coefficient) skip the per-read
 * bounds checks, the others take the checked path, so no read leaves `buf` whatever the stream says.
 * Runs whose tables expect mostly zeros (mean P(0) > ZNUM / ZDEN) skip a zero's bit read behind a branch;
 * denser runs are branch-free there (a zero test would be mispredicted).
 * The two states alternate between two locals (registers), the bit section is read by position with one
 * unaligned load per coefficient, magnitude and sign come from a per-token table without branches.
 * The vector paths' table lookups are 8-lane gathers, made either by the gather instruction or by eight
 * scalar loads (sg32): on the AMD EPYC of our development machine the loads decoded faster (five sets,
 * docs/benchmarks/entropy.md, "Table lookups by scalar loads"), so they are the default on AMD CPUs;
 * elsewhere the instruction is (not measured). `set_gather` switches it; both read the same bytes, and only the loads are visible to ASan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxrans_core.h"

const char CTX_ENOMEM[] = "ctxrans: out of memory";

/* Two layouts of the rANS section (byte 0 of a stream says which); coefficient i uses state i % NS, its
 * sign-flip symbol too (right after its token); each state reads at most one word per symbol:
 *   mode 0: NS0 = 2 states in [2^31, 2^63), 32-bit words;
 *   mode 2: NS2 = 16 states in [2^16, 2^32), 16-bit words. The states are two vectors of 8 lanes: the AVX2
 *           decoder steps a run's coefficients 8 at a time (dec_run_body); the scalar decoder reads the same. */
typedef uint64_t rans_t; /* both modes' states (mode 2 keeps x < 2^32) */
#define NS0 2
#define NS2 16
#define NSMAX NS2
#define RANS_L ((uint64_t)1 << 31)
#define IO_BITS 32
#define RANS_L2 ((uint64_t)1 << 16)
/* The decoder computes the table offsets of up to DEC_BLOCK coefficients of a block row's AC plane (a run)
 * ahead of their rANS steps. Mode 2 orders a run's words by groups, the coefficients of one aligned block
 * of 8 indices: the group's token words in order, then its sign-flip words in order (the vector decoder
 * steps a group's tokens at once); the encoder writes that order too. */
#define DEC_BLOCK 256


#define VEC_CTX_MIN 16 /* shorter runs: the scalar context loop is as fast (measured on 8x8 tiles: faster) */

static int find_steps(const int32_t *tab, steps_t *st) {
    st->n = 0; st->val[0] = tab[0];
    for (int i = 1; i < NFEAT; i++) if (tab[i] != tab[i - 1]) {
        if (st->n == MAXSTEPS) return 0;
        st->at[st->n] = i; st->val[++st->n] = tab[i];
    }
    return 1;
}

const char *ctx_parse_model(const void *blob, ptrdiff_t len, model_t *m) {
    const int32_t *w = (const int32_t *)blob;
    if (len < (ptrdiff_t)(HDR * 4) || w[0] != MAGIC) goto bad;
    m->C = w[1]; m->K = w[2]; m->nctx = w[3]; m->flags = w[4]; m->ntab = w[5];
    if (m->C < 1 || m->C > 4096 || m->K < 1 || m->K > 64 || m->nctx < 1 || m->nctx > (1 << 20)) goto bad;
    if (m->ntab < 1 || m->ntab > m->nctx) goto bad;
    ptrdiff_t nint = HDR + (ptrdiff_t)m->C * m->K + 4 * m->K + m->C + 4 * NFEAT + m->nctx;
    if (len != nint * 4 + (ptrdiff_t)m->ntab * TABB + TABPAD) goto bad;
    const int32_t *p = w + HDR;
    m->kc = p; p += m->C * m->K;
    m->nup = p; p += m->K; m->nlf = p; p += m->K; m->nup2 = p; p += m->K; m->nlf2 = p; p += m->K;
    m->flipf = p; p += m->C;
    m->bin = p; p += NFEAT; m->blt = p; p += NFEAT; m->bch = p; p += NFEAT; m->bdc = p; p += NFEAT;
    m->tidx = p; p += m->nctx;
    m->tab = (const uint8_t *)p;
    for (int i = 0; i < m->nctx; i++) if ((uint32_t)m->tidx[i] >= (uint32_t)m->ntab) goto bad;
    for (int k = 0; k < m->K; k++) {
        const int32_t *nb[4] = {m->nup, m->nlf, m->nup2, m->nlf2};
        for (int j = 0; j < 4; j++) if (nb[j][k] >= k || nb[j][k] < -1) goto bad;
        if (k > 0 && m->nup[k] < 0 && m->nlf[k] < 0) goto bad;
    }
    for (int c = 0; c < m->C; c++) if (m->flipf[c] < 1 || m->flipf[c] >= (int32_t)MTOT) goto bad;
    m->vsteps = 0; /* the decoder sets it when its runs are long enough (VEC_CTX_MIN) */
    return NULL;
bad:
    return "ctxrans: malformed model blob";
}

static inline uint32_t iabs32(int32_t v) { return v < 0 ? (uint32_t)(-(int64_t)v) : (uint32_t)v; }
static inline uint32_t clampf(uint32_t s) { return s < NFEAT ? s : NFEAT - 1; }

static inline int token_of(uint32_t m, int *nb, uint32_t *extra) {
    if (m < D) { *nb = 0; *extra = 0; return (int)m; }
    uint32_t e = m - D + 1;
    int b = 31 - __builtin_clz(e);
    *nb = b; *extra = e - (1u << b);
    return D + b;
}

/* ------------------------------------------------------------------ context walk
 * One walk over the array in memory order, shared by encoder, decoder and the fitting helper. For
 * each coefficient it computes the context, then runs STEP with: ctx, p (pointer to the value: the
 * encoder reads *p, the decoder writes it), pred (DC prediction, 0 for AC), prevv (previous-channel
 * value, 0 if none), sflag (sign coded as a flip of prevv's). Per plane the neighbour pointers are
 * hoisted; edge cases use pointer aliasing instead of branches. The walk covers Hb block rows of an array of
 * Hf (strides), from q: a segment's rows (mode 3) are walked as an array of their own, the first of them
 * without a row above. */
#define WALK(T, STEP) WALKF(T, STEP, m->flags)
/* FL: the flags, a constant in the specialised decoders (the compiler then drops unused features) */
#define WALKF(T, STEP, FL)                                                                                \
{                                                                                                         \
    const ptrdiff_t rowstride = (ptrdiff_t)K * Wb, chstride = (ptrdiff_t)Hf * K * Wb;                  \
    const int use_lt = (FL) & F_LT, use_ch = (FL) & F_CH, use_top = (FL) & F_TOP;                         \
    const int use_wide = (FL) & F_WIDE, use_sflip = (FL) & F_SFLIP;                                       \
    for (int b = 0; b < B; b++) for (int c = 0; c < C; c++) {                                             \
        T *pc = q + ((ptrdiff_t)b * C + c) * chstride;                                                   \
        const int32_t *kc = m->kc + (ptrdiff_t)c * K;                                                    \
        const uint32_t flip1 = (uint32_t)m->flipf[c];                                                     \
        (void)flip1;                                                                                      \
        for (int hb = 0; hb < Hb; hb++) {                                                                 \
            T *row = pc + hb * rowstride;                                                                 \
            { /* DC plane */                                                                              \
                const int32_t base = kc[0];                                                               \
                const int32_t prevv = 0; const int sflag = 0;                                             \
                for (int wb = 0; wb < Wb; wb++) {                                                         \
                    int32_t pred; uint32_t act = 0;                                                       \
                    if (wb > 0 && hb > 0) {                                                               \
                        int32_t L = row[wb - 1], Tp = row[wb - rowstride], TL = row[wb - rowstride - 1];  \
                        act = iabs32(L - TL) + iabs32(Tp - TL); pred = (L + Tp) >> 1;                     \
                    } else if (wb > 0) pred = row[wb - 1];                                                \
                    else if (hb > 0) pred = row[wb - rowstride];                                          \
                    else pred = 0;                                                                        \
                    int32_t ctx = base + m->bdc[clampf(act)];                                             \
                    T *p = row + wb;                                                                      \
                    STEP                                                                                  \
                }                                                                                         \
            }                                                                                             \
            for (int k = 1; k < K; k++) {                                                                 \
                T *pl = row + (ptrdiff_t)k * Wb;                                                         \
                const int ku = m->nup[k], kl = m->nlf[k];                                                 \
                const T *pu = row + (ptrdiff_t)(ku >= 0 ? ku : kl) * Wb;                                 \
                const T *pf = row + (ptrdiff_t)(kl >= 0 ? kl : ku) * Wb;                                 \
                const T *pu2 = m->nup2[k] >= 0 ? row + (ptrdiff_t)m->nup2[k] * Wb : pu;                  \
                const T *pf2 = m->nlf2[k] >= 0 ? row + (ptrdiff_t)m->nlf2[k] * Wb : pf;                  \
                const T *pt = hb > 0 ? pl - rowstride : pl - 1;      /* first row: 2x the left value */   \
                const T *pch = c > 0 ? pl - chstride : pl;           /* only read when c > 0 */           \
                const int32_t base = kc[k];                                                               \
                const int chctx = use_ch && c > 0, sflag = use_sflip && c > 0;                            \
                for (int wb = 0; wb < Wb; wb++) {                                                         \
                    uint32_t s_in = iabs32(pu[wb]) + iabs32(pf[wb]);                                      \
                    if (use_wide) s_in = 2 * s_in + iabs32(pu2[wb]) + iabs32(pf2[wb]);                    \
                    int32_t ctx = base + m->bin[clampf(s_in)];                                            \
                    if (use_top) {   /* block above only: no dependency on the symbol just decoded */    \
                        ctx += m->blt[hb > 0 ? clampf(2 * iabs32(pl[wb - rowstride])) : 0];               \
                    } else if (use_lt) {                                                                  \
                        uint32_t s_lt;                                                                    \
                        if (wb > 0) s_lt = iabs32(pl[wb - 1]) + iabs32(pt[wb]);                           \
                        else s_lt = hb > 0 ? 2 * iabs32(pl[-rowstride]) : 0;                              \
                        ctx += m->blt[clampf(s_lt)];                                                      \
                    }                                                                                     \
                    const int32_t prevv = c > 0 ? (int32_t)pch[wb] : 0;                                   \
                    if (chctx) ctx += m->bch[clampf(iabs32(prevv))];                                      \
                    const int32_t pred = 0;                                                               \
                    T *p = pl + wb;                                                                       \
                    STEP                                                                                  \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
}

/* ------------------------------------------------------------------ bit section */
typedef struct { uint8_t *buf; ptrdiff_t len, cap; uint64_t acc; int n; } bitw_t;

static inline void bw_put(bitw_t *w, uint32_t v, int nbits) { /* nbits <= 24 */
    w->acc |= (uint64_t)v << w->n; w->n += nbits;
    while (w->n >= 8) { w->buf[w->len++] = (uint8_t)w->acc; w->acc >>= 8; w->n -= 8; }
}

typedef struct { const uint8_t *p, *start, *end; uint64_t bits; int n; ptrdiff_t virt; } bitr_t;

static inline void br_refill(bitr_t *r) {
    if (r->end - r->p >= 8) {
        uint64_t w = 0;
        for (int j = 0; j < 8; j++) w |= (uint64_t)r->p[j] << (8 * j); /* compiles to one load on LE */
        r->bits |= w << r->n;
        r->p += (63 - r->n) >> 3;
        r->n |= 56;
    } else { /* near the end: byte by byte, zeros past it (counted in virt) */
        while (r->n <= 56) {
            uint64_t byte = 0;
            if (r->p < r->end) byte = *r->p++; else r->virt++;
            r->bits |= byte << r->n; r->n += 8;
        }
    }
}

static inline uint32_t br_get(bitr_t *r, int nbits) { /* nbits <= 24 */
    if (r->n < nbits) br_refill(r);
    uint32_t v = (uint32_t)(r->bits & ((1u << nbits) - 1));
    r->bits >>= nbits; r->n -= nbits;
    return v;
}

/* ------------------------------------------------------------------ encoder */
static inline void enc_put(rans_t *x, uint8_t **ptr, uint32_t start, uint32_t freq, const int w16) {
    if (w16) { /* mode 2: the state stays below 2^32, so the step runs in 32-bit arithmetic (a cheaper division) */
        uint32_t v = (uint32_t)*x;
        if (v >= ((RANS_L2 >> SCALE) << 16) * freq) { *ptr -= 2; (*ptr)[0] = (uint8_t)v; (*ptr)[1] = (uint8_t)(v >> 8); v >>= 16; }
        *x = ((v / freq) << SCALE) + (v % freq) + start;
        return;
    } else if (*x >= ((RANS_L >> SCALE) << IO_BITS) * freq) {
        *ptr -= 4; uint32_t w = (uint32_t)*x; for (int j = 0; j < 4; j++) (*ptr)[j] = (uint8_t)(w >> (8 * j)); *x >>= 32;
    }
    *x = ((*x / freq) << SCALE) + (*x % freq) + start;
}

/* forward pass: contexts + tokens (bit 6: a flip symbol follows, bit 7: its value), raw bits out */
#define ENC_STEP                                                                                          \
    { int32_t r = (int32_t)*p - pred; uint32_t mag = iabs32(r); int nb; uint32_t extra;                   \
      int t = token_of(mag, &nb, &extra);                                                                 \
      if (nb) bw_put(bw, extra, nb);                                                                      \
      if (r) {                                                                                            \
          if (sflag && prevv) t |= 0x40 | (((r < 0) != (prevv < 0)) << 7);                                \
          else bw_put(bw, r < 0, 1);                                                                      \
      }                                                                                                   \
      ctxo[n] = ctx; toko[n] = (uint8_t)t; n++; }

#define FILL_FUNC(T, SUF)                                                                                 \
static ptrdiff_t fill_##SUF(const model_t *m, T *q, int B, int C, int Hb, int Hf, int K, int Wb,        \
                             int32_t *ctxo, uint8_t *toko, bitw_t *bw) {                                  \
    ptrdiff_t n = 0;                                                                                     \
    WALK(T, ENC_STEP)                                                                                     \
    return n;                                                                                             \
}
FILL_FUNC(int8_t, i8)
FILL_FUNC(int16_t, i16)

const char *ctx_check_shape(const model_t *m, const int dims[5]) {
    if (dims[1] > m->C || dims[3] != m->K) return "ctxrans: array shape does not match the model (channels or K)";
    return NULL;
}

static ptrdiff_t dims_count(const int dims[5]) {
    ptrdiff_t n = 1;
    for (int i = 0; i < 5; i++) n *= dims[i];
    return n;
}

/* The rows h0 .. h0 + Hs - 1 of q (dims: the whole array) as they are coded: in walk order (b, c, row, k, wb) */
static void gather_rows(const void *q, const int dims[5], int h0, int Hs, int itemsize, uint8_t *dst) {
    const ptrdiff_t row = (ptrdiff_t)dims[3] * dims[4] * itemsize, ch = row * dims[2];
    for (ptrdiff_t bc = 0; bc < (ptrdiff_t)dims[0] * dims[1]; bc++, dst += row * Hs)
        memcpy(dst, (const uint8_t *)q + bc * ch + h0 * row, row * Hs);
}

/* Mode 1: the raw copy of rows h0 .. h0 + Hs - 1 of q, into a malloc'd *out */
static const char *raw_part(const void *q, const int dims[5], int h0, int Hs, int itemsize, uint8_t **out,
                            ptrdiff_t *outlen) {
    const ptrdiff_t qlen = (ptrdiff_t)dims[0] * dims[1] * Hs * dims[3] * dims[4] * itemsize;
    *out = (uint8_t *)malloc(qlen + 1);
    if (!*out) return CTX_ENOMEM;
    (*out)[0] = MODE_RAW; gather_rows(q, dims, h0, Hs, itemsize, *out + 1); *outlen = qlen + 1;
    return NULL;
}

/* One part of a stream: rows h0 .. h0 + Hs - 1 of q (all of it in modes 0 and 2, a segment in mode 3) in
 * `mode` (0 or 2), or the raw copy of those rows (mode 1) when coding does not save, into a malloc'd *out */
static const char *encode_part(const model_t *m, const void *q, const int dims[5], int h0, int Hs, int itemsize,
                               int mode, uint8_t **out, ptrdiff_t *outlen) {
    *out = NULL; *outlen = 0;
    const int w16 = mode == MODE_LANES, ns = w16 ? NS2 : NS0, state_bytes = w16 ? 4 : 8;
    const int B = dims[0], C = dims[1], Hf = dims[2], K = dims[3], Wb = dims[4];
    const ptrdiff_t n = (ptrdiff_t)B * C * Hs * K * Wb, qlen = n * itemsize;
    const void *q0 = (const uint8_t *)q + (ptrdiff_t)h0 * K * Wb * itemsize;
    const char *err = NULL;
    int32_t *ctxo = (int32_t *)malloc(n * sizeof(int32_t)); uint8_t *toko = (uint8_t *)malloc(n);
    ptrdiff_t rcap = n * 4 + 64;        /* token + flip cost < 32 bits per coefficient, + header */
    uint8_t *rbuf = (uint8_t *)malloc(rcap);
    bitw_t bw = {0};
    bw.cap = n * 3 + 16; bw.buf = (uint8_t *)malloc(bw.cap); /* <= 17 + 1 bits per coefficient */
    if (!ctxo || !toko || !rbuf || !bw.buf) { err = CTX_ENOMEM; goto done; }
    uint8_t *ptr = rbuf + rcap;
    {
        if (itemsize == 1) fill_i8(m, (int8_t *)q0, B, C, Hs, Hf, K, Wb, ctxo, toko, &bw);
        else fill_i16(m, (int16_t *)q0, B, C, Hs, Hf, K, Wb, ctxo, toko, &bw);
        if (bw.n) bw.buf[bw.len++] = (uint8_t)bw.acc; /* zero-padded last byte */
        for (ptrdiff_t i = 0; i < n; i++) if (ctxo[i] < 0 || ctxo[i] >= m->nctx) { err = "ctxrans: model context out of range"; goto done; }
        const ptrdiff_t chstride = (ptrdiff_t)Hs * K * Wb; /* of the coded sequence */
        rans_t x[NSMAX];
        for (int s = 0; s < ns; s++) x[s] = w16 ? RANS_L2 : RANS_L;
#define ENC_FLIP(i)                                                                                       \
    if (toko[i] & 0x40) {                                                                                 \
        uint32_t f1 = (uint32_t)m->flipf[(i / chstride) % C];                                             \
        if (toko[i] & 0x80) enc_put(&x[i % ns], &ptr, MTOT - f1, f1, w16);                                \
        else enc_put(&x[i % ns], &ptr, 0, MTOT - f1, w16);                                                \
    }
#define ENC_TOKEN(i)                                                                                      \
    {                                                                                                     \
        const uint16_t *cum = (const uint16_t *)(m->tab + (ptrdiff_t)m->tidx[ctxo[i]] * TABB);            \
        int t = toko[i] & 0x3f;                                                                           \
        enc_put(&x[i % ns], &ptr, cum[t], (uint32_t)cum[t + 1] - cum[t], w16);                            \
    }
        /* rANS is LIFO: the words are written in the reverse of the order they are read */
        if (!w16) for (ptrdiff_t i = n - 1; i >= 0; i--) { ENC_FLIP(i) ENC_TOKEN(i) } /* flip after token */
        else for (ptrdiff_t i = n - 1; i >= 0;) { /* by groups: tokens, then flips */
            const ptrdiff_t run0 = i - (i % Wb) % DEC_BLOCK, blk = i & ~(ptrdiff_t)7;
            const ptrdiff_t g0 = blk > run0 ? blk : run0;
            for (ptrdiff_t j = i; j >= g0; j--) ENC_FLIP(j)
            for (ptrdiff_t j = i; j >= g0; j--) ENC_TOKEN(j)
            i = g0 - 1;
        }
#undef ENC_FLIP
#undef ENC_TOKEN
        ptrdiff_t nr = (rbuf + rcap) - ptr;
        uint8_t hdr[1 + NSMAX * 8 + 10]; int h = 0; /* mode, states (LE), LEB128(nr), put in front */
        hdr[h++] = (uint8_t)mode;
        for (int s = 0; s < ns; s++) for (int j = 0; j < state_bytes; j++) hdr[h++] = (uint8_t)(x[s] >> (8 * j));
        ptrdiff_t v = nr;
        do { uint8_t byte = v & 0x7f; v >>= 7; hdr[h++] = byte | (v ? 0x80 : 0); } while (v);
        ptr -= h; memcpy(ptr, hdr, h);
    }
    {
        const ptrdiff_t head = rbuf + rcap - ptr, total = head + bw.len;
        if (total >= qlen + 1) { /* raw fallback: never larger than the part + 1 byte */
            err = raw_part(q, dims, h0, Hs, itemsize, out, outlen);
        } else {
            *out = (uint8_t *)malloc(total);
            if (!*out) { err = CTX_ENOMEM; goto done; }
            memcpy(*out, ptr, head); memcpy(*out + head, bw.buf, bw.len); *outlen = total;
        }
    }
done:
    free(ctxo); free(toko); free(rbuf); free(bw.buf);
    return err;
}

/* LEB128 at *p (at most 5 bytes, before end): 1 and *v, or 0 */
static int get_leb(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (*p >= end) return 0;
        const uint8_t byte = *(*p)++;
        *v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) return 1;
    }
    return 0;
}

/* the first row of segment s of nseg over Hb rows */
static int seg_row(int s, int nseg, int Hb) { return (int)((int64_t)s * Hb / nseg); }

static int put_leb(uint8_t *p, uint64_t v) {
    int h = 0;
    do { uint8_t byte = v & 0x7f; v >>= 7; p[h++] = byte | (v ? 0x80 : 0); } while (v);
    return h;
}

/* mode 0 or 2 (the rANS layouts above), or 3 (nseg segments of block rows, each a mode 2 stream, or a raw copy
 * when coding does not save); the whole array's raw copy (mode 1) when the stream would not be smaller */
const char *ctx_encode(const model_t *m, const void *q, const int dims[5], int itemsize, int mode, int nseg,
                       uint8_t **out, ptrdiff_t *outlen) {
    *out = NULL; *outlen = 0;
    if (mode != MODE_RANS && mode != MODE_LANES && mode != MODE_SEGMENTS) return "ctxrans: encode mode must be 0, 2 or 3";
    if (mode != MODE_SEGMENTS) return encode_part(m, q, dims, 0, dims[2], itemsize, mode, out, outlen);
    if (nseg < 1 || nseg > dims[2]) return "ctxrans: encode needs 1 to Hb segments";
    const ptrdiff_t qlen = dims_count(dims) * itemsize;
    uint8_t **part = (uint8_t **)calloc(nseg, sizeof(uint8_t *));
    ptrdiff_t *plen = (ptrdiff_t *)calloc(nseg, sizeof(ptrdiff_t));
    const char *err = NULL;
    if (!part || !plen) { err = CTX_ENOMEM; goto done; }
    ptrdiff_t total = 0;
    for (int s = 0; s < nseg && !err; s++) {
        const int h0 = seg_row(s, nseg, dims[2]);
        err = encode_part(m, q, dims, h0, seg_row(s + 1, nseg, dims[2]) - h0, itemsize, MODE_LANES, &part[s], &plen[s]);
        total += plen[s];
    }
    if (err) goto done;
    uint8_t *head = (uint8_t *)malloc(11 + 10 * (size_t)nseg);
    if (!head) { err = CTX_ENOMEM; goto done; }
    int h = 0;
    head[h++] = MODE_SEGMENTS;
    h += put_leb(head + h, (uint64_t)nseg);
    for (int s = 0; s < nseg; s++) h += put_leb(head + h, (uint64_t)plen[s]);
    if (h + total >= qlen + 1) { /* raw fallback: never larger than the array + 1 byte */
        free(head);
        err = raw_part(q, dims, 0, dims[2], itemsize, out, outlen);
        goto done;
    }
    *out = (uint8_t *)malloc(h + total);
    if (!*out) { free(head); err = CTX_ENOMEM; goto done; }
    memcpy(*out, head, h); *outlen = h;
    for (int s = 0; s < nseg; s++) { memcpy(*out + *outlen, part[s], plen[s]); *outlen += plen[s]; }
    free(head);
done:
    if (part) for (int s = 0; s < nseg; s++) free(part[s]);
    free(part); free(plen);
    return err;
}

/* The estimate's step: the token's cost in its context, its raw bits, the sign (a raw bit or a flip symbol) */
#define EST_STEP                                                                                          \
    { int32_t r = (int32_t)*p - pred; uint32_t mag = iabs32(r); int nb; uint32_t extra;                   \
      int t = token_of(mag, &nb, &extra); (void)extra;                                                    \
      uint64_t a = cost[(ptrdiff_t)((uint32_t)ctx < nctx ? ctx : 0) * NTOK + t] + ((uint64_t)nb << 8);        \
      if (r) a += (sflag && prevv) ? fcost[2 * c + ((r < 0) != (prevv < 0))] : 256u;                      \
      acc += hb >= hfirst ? a : 0; first += hb == hfirst ? a : 0; }

#define EST_FUNC(T, SUF)                                                                                  \
static uint64_t est_##SUF(const model_t *m, T *q, int B, int C, int Hb, int Hf, int K, int Wb,          \
                          const uint16_t *cost, const uint16_t *fcost, int hfirst, uint64_t *first_row) { \
    uint64_t acc = 0, first = 0; const uint32_t nctx = (uint32_t)m->nctx; /* a context out of range costs as context 0 */ \
    WALK(T, EST_STEP)                                                                                     \
    *first_row = first;                                                                                   \
    return acc;                                                                                           \
}
EST_FUNC(int8_t, i8)
EST_FUNC(int16_t, i16)

/* The ideal code length of q (the whole array as one part) in 1/256 bits: per coefficient cost[ctx * NTOK + token]
 * (-log2 of the token's probability in its context), its raw bits and its sign (fcost[2c], fcost[2c + 1]: a flip
 * symbol's cost, same and differing sign, on channel c). No rANS states and no stream: a context pass alone, for
 * the encoder's choice of a segment count. */
const char *ctx_estimate(const model_t *m, const void *q, const int dims[5], int itemsize, const uint16_t *cost,
                         const uint16_t *fcost, int every, int run, uint64_t *bits256, int64_t *top256) {
    const int Hb = dims[2];
    if (every < 1 || run < 1 || run >= every || Hb < 2 * every) every = run = Hb; /* every row */
    const ptrdiff_t rowbytes = (ptrdiff_t)dims[3] * dims[4] * itemsize;
    uint64_t acc = 0, first, alone; int64_t counted = 0, top = 0, tops = 0;
#define EST(P, H, HF) (itemsize == 1                                                                      \
    ? est_i8(m, (int8_t *)(P), dims[0], dims[1], (H), Hb, dims[3], dims[4], cost, fcost, (HF), &first)     \
    : est_i16(m, (int16_t *)(P), dims[0], dims[1], (H), Hb, dims[3], dims[4], cost, fcost, (HF), &first))
    for (int h0 = 0; h0 < Hb; h0 += every) {
        const int h1 = h0 + run < Hb ? h0 + run : Hb, from = h0 > 0 ? h0 - 1 : 0; /* the row above for contexts */
        const uint8_t *p = (const uint8_t *)q + from * rowbytes;
        acc += EST(p, h1 - from, h0 - from);
        counted += h1 - h0;
        if (h0 > 0) { /* its first row again without the row above, as a segment's top row is coded */
            const uint64_t with = first;
            alone = EST(p + rowbytes, 1, 0);
            top += (int64_t)alone - (int64_t)with; tops++;
        }
    }
    if (!tops && Hb >= 2) { /* every row walked: the middle row's top-row cost */
        const uint8_t *p = (const uint8_t *)q + (Hb / 2 - 1) * rowbytes;
        EST(p, 2, 1);
        const uint64_t with = first;
        alone = EST(p + rowbytes, 1, 0);
        top = (int64_t)alone - (int64_t)with; tops = 1;
    }
#undef EST
    *bits256 = counted == Hb ? acc : (uint64_t)((double)acc * Hb / counted);
    *top256 = tops ? top / tops : 0;
    return NULL;
}

/* contexts: tok as in the encoder: token | 0x40 if a sign-flip symbol follows | 0x80 if the sign flips */
const char *ctx_contexts(const model_t *m, const void *q, const int dims[5], int itemsize, int32_t *ctx, uint8_t *tok,
                         int64_t *bits) {
    bitw_t bw = {0};
    bw.cap = dims_count(dims) * 3 + 16; bw.buf = (uint8_t *)malloc(bw.cap);
    if (!bw.buf) return CTX_ENOMEM;
    if (itemsize == 1) fill_i8(m, (int8_t *)q, dims[0], dims[1], dims[2], dims[2], dims[3], dims[4], ctx, tok, &bw);
    else fill_i16(m, (int16_t *)q, dims[0], dims[1], dims[2], dims[2], dims[3], dims[4], ctx, tok, &bw);
    *bits = (int64_t)bw.len * 8 + bw.n;
    free(bw.buf);
    return NULL;
}

/* ------------------------------------------------------------------ decoder */
typedef struct { const uint8_t *p, *end; int over; } rbuf_t;

/* valid tables leave x >= 2^16 (mode 0) or >= 2 (mode 2) after a step, so one word restores x >= L */
static inline void renorm(rans_t *x, rbuf_t *r, const int w16) {
    if (w16) {
        if (*x < RANS_L2) {
            uint32_t w = 0;
            if (r->end - r->p >= 2) { w = (uint32_t)r->p[0] | ((uint32_t)r->p[1] << 8); r->p += 2; }
            else r->over = 1;
            *x = (*x << 16) | w;
        }
    } else if (*x < RANS_L) {
        uint32_t w = 0;
        if (r->end - r->p >= 4) { w = (uint32_t)r->p[0] | ((uint32_t)r->p[1] << 8) | ((uint32_t)r->p[2] << 16) | ((uint32_t)r->p[3] << 24); r->p += 4; }
        else r->over = 1;
        *x = (*x << 32) | w;
    }
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint32_t rd32le(const uint8_t *p) { uint32_t w; memcpy(&w, p, 4); return w; }
static inline uint64_t rd64le(const uint8_t *p) { uint64_t w; memcpy(&w, p, 8); return w; }
#else
static inline uint32_t rd32le(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t rd64le(const uint8_t *p) {
    uint64_t w = 0;
    for (int j = 0; j < 8; j++) w |= (uint64_t)p[j] << (8 * j);
    return w;
}
#endif

/* renorm without a data-dependent branch while 4 bytes are left (a well-predicted test), else renorm */
static inline __attribute__((always_inline)) rans_t renorm_x(rans_t x, rbuf_t *r, const int unchecked, const int w16) {
    if (w16 && (unchecked || r->end - r->p >= 4)) {
        const uint64_t need = x < RANS_L2;
        const uint64_t w = (rd32le(r->p) & 0xFFFF) & (0 - need);
        r->p += need << 1;
        return (x << (need << 4)) | w;
    }
    if (!w16 && (unchecked || r->end - r->p >= 4)) {
        const uint64_t need = x < RANS_L; /* arithmetic, so compilers emit no branch */
        const uint64_t w = rd32le(r->p) & (0 - need);
        r->p += need << 2;
        return (x << (need << 5)) | w;
    }
    renorm(&x, r, w16);
    return x;
}

/* Bit section reader for the decoder: a bit position instead of a bit buffer (fewer instructions per
 * read, no refill state). Bits past the end read as zeros; `pos` counts every bit taken, so the caller's
 * final check sees a stream that ran past its end. */
typedef struct { const uint8_t *base; uint64_t pos, fast; ptrdiff_t len; } bitp_t;

static __attribute__((noinline)) uint64_t bp_tail(const bitp_t *b, uint64_t at) { /* the last 7 bytes */
    uint64_t w = 0;
    for (int j = 0; j < 8; j++) if ((ptrdiff_t)(at + j) < b->len) w |= (uint64_t)b->base[at + j] << (8 * j);
    return w;
}

/* the next 57 bits (unmasked); the caller takes what it needs and advances pos */
static inline __attribute__((always_inline)) uint64_t bp_peek(const bitp_t *b, const int unchecked) {
    const uint64_t at = b->pos >> 3; /* fast: at + 8 <= len */
    const uint64_t w = unchecked || __builtin_expect(at < b->fast, 1) ? rd64le(b->base + at) : bp_tail(b, at);
    return w >> (b->pos & 7);
}

static inline __attribute__((always_inline)) uint32_t bp_get(bitp_t *b, uint32_t nbits, const int unchecked) {
    const uint32_t v = (uint32_t)bp_peek(b, unchecked) & ((1u << nbits) - 1); /* nbits <= 24 */
    b->pos += nbits;
    return v;
}

/* per token t (32 entries: a search-start byte is masked to 5 bits, so any blob indexes inside): the
 * Exp-Golomb raw bits after it (eb) and their mask, those plus a plain sign bit (t > 0: nb, nmask), and
 * the magnitude the raw bits are added to */
typedef struct { uint32_t mbase, emask, nmask; uint8_t eb, nb, pad[2]; } toki_t;
static toki_t TOKI[32];

static void init_token_tables(void) {
    for (int t = 0; t < 32; t++) {
        uint32_t eb = t >= D && t < NTOK ? (uint32_t)(t - D) : 0, nb = eb + (t > 0 && t < NTOK);
        TOKI[t].mbase = t < D ? (uint32_t)t : t < NTOK ? (uint32_t)D - 1 + (1u << (t - D)) : 0;
        TOKI[t].eb = (uint8_t)eb; TOKI[t].nb = (uint8_t)nb;
        TOKI[t].emask = (1u << eb) - 1; TOKI[t].nmask = (1u << nb) - 1;
    }
}

/* One coefficient from state *xs with the table at e: the token (search-start table, then a short search
 * that stops inside the padded table whatever its bytes), its raw bits and plain sign from the bit section
 * in one read (extra bits, then the sign bit, LSB first: the order the encoder wrote them), or a sign
 * coded as "differs from prevv's" (flipc: this channel codes them) in a second rANS step. */
/* The token of state *xs with the table at e */
static inline __attribute__((always_inline)) uint32_t dec_tok(const uint8_t *e, rans_t *xs, rbuf_t *r,
                                                              const int unchecked, const int w16) {
    const uint16_t *cum = (const uint16_t *)e;
    const rans_t x = *xs;
    const uint32_t slot = (uint32_t)(x & MASK);
    uint32_t t = e[CUMB + (slot >> (SCALE - LUTB))] & 31;
    while (t < NTOK - 1 && cum[t + 1] <= slot) t++;
    *xs = renorm_x((rans_t)((uint32_t)cum[t + 1] - cum[t]) * (x >> SCALE) + slot - cum[t], r, unchecked, w16);
    return t;
}

/* A "sign differs from the previous channel's" symbol of state *xs (probability flip1 / 2^15) */
static inline __attribute__((always_inline)) uint32_t dec_flip(rans_t *xs, rbuf_t *r, uint32_t flip1,
                                                               const int unchecked, const int w16) {
    const rans_t x = *xs;
    const uint32_t s2 = (uint32_t)(x & MASK), f0 = MTOT - flip1;
    const uint32_t flip = s2 >= f0;
    *xs = renorm_x(flip ? (rans_t)flip1 * (x >> SCALE) + s2 - f0 : (rans_t)f0 * (x >> SCALE) + s2, r, unchecked, w16);
    return flip;
}

/* The value of token t: its raw bits, and its sign from the bit section (sneg < 0) or sneg */
static inline __attribute__((always_inline)) int32_t dec_value(uint32_t t, bitp_t *b, int32_t sneg,
                                                               const int unchecked) {
    const toki_t *ti = &TOKI[t];
    uint32_t mag, neg;
    if (sneg >= 0) {
        mag = ti->mbase + bp_get(b, ti->eb, unchecked);
        neg = (uint32_t)sneg;
    } else {
        const uint32_t raw = (uint32_t)bp_peek(b, unchecked) & ti->nmask;
        b->pos += ti->nb;
        mag = ti->mbase + (raw & ti->emask);
        neg = (raw >> ti->eb) & 1;
    }
    return (int32_t)((mag ^ (0u - neg)) + neg);
}

/* One coefficient in mode 0's order (token, its sign flip, its bits) */
static inline __attribute__((always_inline)) int32_t dec_sym(const uint8_t *e, rans_t *xs, rbuf_t *r, bitp_t *b,
                                                             int32_t prevv, int flipc, uint32_t flip1,
                                                             const int unchecked, const int zfast, const int w16) {
    const uint32_t t = dec_tok(e, xs, r, unchecked, w16);
    if (zfast && t == 0) return 0; /* runs of mostly zeros: a well-predicted branch */
    int32_t sneg = -1;
    if (flipc && prevv != 0 && t != 0) sneg = (int32_t)((uint32_t)(prevv < 0) ^ dec_flip(xs, r, flip1, unchecked, w16));
    return dec_value(t, b, sneg, unchecked);
}

/* dec_sym on a mode 2 state (valid tables keep it below 2^32; the vector decoder's arithmetic is 32-bit) */
static inline __attribute__((always_inline)) int32_t dec_sym32(const uint8_t *e, uint32_t *xs, rbuf_t *r, bitp_t *b,
                                                               int32_t prevv, int flipc, uint32_t flip1,
                                                               const int unchecked, const int zfast) {
    rans_t x = *xs;
    const int32_t v = dec_sym(e, &x, r, b, prevv, flipc, flip1, unchecked, zfast, 1);
    *xs = (uint32_t)x;
    return v;
}

/* ------------------------------------------------------------------ mode 2: 8 lanes at once (AVX2)
 * A run's coefficients whose table offsets are known (off[j]: every AC context except F_LT's left neighbour
 * and the sign flips of SFLIP channels) are decoded 8 states at a time, lane l holding state l: per group,
 * the token search (search-start table, then cum pairs, both by gather), the rANS step, the renormalisation
 * (the lanes that need a word take the next ones in lane order, which is the coefficients' order) and the
 * raw bits (a prefix sum of the lanes' bit counts gives each lane its position). A group is the part of
 * the run inside one aligned block of 8 coefficient indices, so its first and last groups may be partial.
 * The caller guarantees the room: 16 readable bytes at the word pointer and 8 + 3 per coefficient after
 * the bit position; the tables are followed by TABPAD bytes for the search-start gather. */
static int g_simd; /* set at import when the CPU has AVX2; `set_simd` switches it for tests */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(CTX_NO_SIMD)
#include <immintrin.h>
#define HAVE_SIMD 1
static uint8_t RANK[256][8]; /* RANK[m][l]: set bits of m below bit l (the word lane l takes) */
static int g_gather_hw; /* 1: the gather instruction, 0: scalar loads (sg32); set at import, `set_gather` */

static inline int32_t sg_ld(const char *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* A 32-bit gather (lane l: 4 bytes at base + idx[l] * scale) as eight scalar loads: the same bytes as
 * the instruction reads, and faster where its microcode is slow (measured on AMD EPYC) */
__attribute__((target("avx2"))) static inline __m256i sg32(const void *base, __m256i idx, const int scale) {
    const char *b = (const char *)base;
    const __m128i lo = _mm256_castsi256_si128(idx), hi = _mm256_extracti128_si256(idx, 1);
    const uint64_t i01 = (uint64_t)_mm_cvtsi128_si64(lo), i23 = (uint64_t)_mm_extract_epi64(lo, 1);
    const uint64_t i45 = (uint64_t)_mm_cvtsi128_si64(hi), i67 = (uint64_t)_mm_extract_epi64(hi, 1);
#define SG_LD(i) sg_ld(b + (int64_t)(int32_t)(uint32_t)(i) * scale)
    __m128i r0 = _mm_cvtsi32_si128(SG_LD(i01)), r1 = _mm_cvtsi32_si128(SG_LD(i45)); /* lanes inserted in place: */
    r0 = _mm_insert_epi32(r0, SG_LD(i01 >> 32), 1); r1 = _mm_insert_epi32(r1, SG_LD(i45 >> 32), 1); /* no store */
    r0 = _mm_insert_epi32(r0, SG_LD(i23), 2); r1 = _mm_insert_epi32(r1, SG_LD(i67), 2); /* and reload of 8 ints */
    r0 = _mm_insert_epi32(r0, SG_LD(i23 >> 32), 3); r1 = _mm_insert_epi32(r1, SG_LD(i67 >> 32), 3);
#undef SG_LD
    return _mm256_inserti128_si256(_mm256_castsi128_si256(r0), r1, 1);
}
/* The instance of a vector path (ctx_run, dec_run) for the current lookups, called directly (a call through a
 * function pointer chosen per run was slower: docs/benchmarks/design.md) */
#define BY_LOOKUP(fn, ...) do { if (g_gather_hw) fn##_hw(__VA_ARGS__); else fn##_sl(__VA_ARGS__); } while (0)
/* HW: a compile-time constant in each instance of the vector paths */
#define GATHER(HW, base, idx, scale) \
    ((HW) ? _mm256_i32gather_epi32((const int *)(base), (idx), (scale)) : sg32((base), (idx), (scale)))

static void init_rank(void) {
    for (int m = 0; m < 256; m++) for (int l = 0; l < 8; l++) RANK[m][l] = (uint8_t)__builtin_popcount(m & ((1 << l) - 1));
}

/* the constants of one 8-lane step, set once per run */
typedef struct { __m256i lane, zero, one, mask, ntok1, dv, dm1, low16, upper, bcast3, pick8, pick16, join, f0, f1; } vk_t;

/* a bucket table's entry for each lane's feature (v in [0, NFEAT)) */
__attribute__((target("avx2"))) static inline __m256i vsteps(const steps_t *st, __m256i v) {
    __m256i acc = _mm256_set1_epi32(st->val[0]);
    for (int i = 0; i < st->n; i++)
        acc = _mm256_blendv_epi8(acc, _mm256_set1_epi32(st->val[i + 1]), _mm256_cmpgt_epi32(v, _mm256_set1_epi32(st->at[i] - 1)));
    return acc;
}

__attribute__((target("avx2"))) static inline __m256i vload(const char *p, int i, const int is8) {
    return is8 ? _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + i)))
               : _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
}

/* The context loop of dec_walk for coefficients w0 .. w0 + n8 - 1 of a run (n8 a multiple of 8), 8 at a time:
 * off[j] (the table offsets) and, when pv is not NULL, pv[j] (the previous channel's values), equal to what
 * the scalar loop computes. ptop: the row above (NULL in the first row); pch: the previous channel (NULL
 * for channel 0). Every read lies inside the run's neighbours. */
__attribute__((target("avx2"), always_inline)) static inline void ctx_run_body(
    const model_t *m, int n8, int w0, int32_t base, const char *pu, const char *pf, const char *pu2, const char *pf2,
    const char *ptop, const char *pch, const int wide, const int top, const int chctx, int32_t *pv, uint32_t *off,
    const int is8, const int HW) {
    const __m256i lim = _mm256_set1_epi32(NFEAT - 1), nmax = _mm256_set1_epi32(m->nctx - 1);
    const __m256i tabb = _mm256_set1_epi32(TABB), basev = _mm256_set1_epi32(base);
    const __m256i top0 = _mm256_set1_epi32(top ? m->blt[0] : 0);
    for (int j = 0; j < n8; j += 8) {
        const int wb = w0 + j;
        __m256i s = _mm256_add_epi32(_mm256_abs_epi32(vload(pu, wb, is8)), _mm256_abs_epi32(vload(pf, wb, is8)));
        if (wide) s = _mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_add_epi32(_mm256_abs_epi32(vload(pu2, wb, is8)),
                                                                             _mm256_abs_epi32(vload(pf2, wb, is8))));
        __m256i ctx = _mm256_add_epi32(basev, vsteps(&m->sin, _mm256_min_epi32(s, lim)));
        if (top && ptop) {
            const __m256i a = _mm256_abs_epi32(vload(ptop, wb, is8));
            ctx = _mm256_add_epi32(ctx, vsteps(&m->slt, _mm256_min_epi32(_mm256_add_epi32(a, a), lim)));
        } else ctx = _mm256_add_epi32(ctx, top0);
        if (pch) {
            const __m256i pvv = vload(pch, wb, is8);
            if (chctx) ctx = _mm256_add_epi32(ctx, vsteps(&m->sch, _mm256_min_epi32(_mm256_abs_epi32(pvv), lim)));
            if (pv) _mm256_storeu_si256((__m256i *)(pv + j), pvv);
        }
        const __m256i ok = _mm256_cmpeq_epi32(_mm256_min_epu32(ctx, nmax), ctx); /* ctx < nctx, else context 0 */
        const __m256i t = GATHER(HW, m->tidx, _mm256_and_si256(ctx, ok), 4);
        _mm256_storeu_si256((__m256i *)(off + j), _mm256_mullo_epi32(t, tabb));
    }
}

#define CTX_RUN_ARGS                                                                                              \
    const model_t *m, int n8, int w0, int32_t base, const char *pu, const char *pf, const char *pu2, const char *pf2, \
        const char *ptop, const char *pch, const int wide, const int top, const int chctx, int32_t *pv, uint32_t *off, \
        const int is8
__attribute__((target("avx2"))) static void ctx_run_hw(CTX_RUN_ARGS) {
    ctx_run_body(m, n8, w0, base, pu, pf, pu2, pf2, ptop, pch, wide, top, chctx, pv, off, is8, 1);
}
__attribute__((target("avx2"))) static void ctx_run_sl(CTX_RUN_ARGS) {
    ctx_run_body(m, n8, w0, base, pu, pf, pu2, pf2, ptop, pch, wide, top, chctx, pv, off, is8, 0);
}

/* renormalise the lanes of `need`: each takes the next 16-bit word, in lane order */
__attribute__((target("avx2,popcnt"))) static inline __m256i renorm8(__m256i x, __m256i need, const uint8_t **pp) {
    const unsigned nm = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
    const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)*pp));
    const __m256i wl = _mm256_permutevar8x32_epi32(words, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)RANK[nm])));
    *pp += 2 * __builtin_popcount(nm);
    return _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), wl), need);
}

/* out[j .. j + cnt - 1] = lanes a .. a + cnt - 1 of v, their low byte or two (as the scalar stores' conversion) */
__attribute__((target("avx2"))) static inline void store8(const vk_t *k, __m256i v, char *out, int j, int a, int cnt,
                                                          const int is8) {
    if (cnt == 8) {
        if (is8) {
            const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, k->pick8), k->join);
            _mm_storel_epi64((__m128i *)(out + j), _mm256_castsi256_si128(b));
        } else {
            const __m256i b = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, k->pick16), 0x08);
            _mm_storeu_si128((__m128i *)(out + 2 * j), _mm256_castsi256_si128(b));
        }
        return;
    }
    int32_t tmp[8];
    _mm256_storeu_si256((__m256i *)tmp, v);
    for (int l = a; l < a + cnt; l++) {
        if (is8) ((int8_t *)out)[j + l - a] = (int8_t)tmp[l];
        else ((int16_t *)out)[j + l - a] = (int16_t)tmp[l];
    }
}

/* One group of 8 lanes (the aligned block of 8 coefficient indices holding coefficients j .. j + cnt - 1 of
 * the run, at lanes a .. a + cnt - 1): decodes them into out[j ..] and returns the lanes' new states. pv:
 * the previous channel's values when this channel codes signs as flips, else NULL. */
__attribute__((target("avx2,popcnt"), always_inline)) static inline __m256i step8(
    const vk_t *k, __m256i x, const uint8_t *tab, const uint32_t *off, const int32_t *pv, int j, int a, int cnt,
    char *out, const int is8, const uint8_t **pp, uint64_t *ppos, const uint8_t *bits, const int HW) {
    const __m256i act = _mm256_and_si256(_mm256_cmpgt_epi32(k->lane, _mm256_set1_epi32(a - 1)),
                                         _mm256_cmpgt_epi32(_mm256_set1_epi32(a + cnt), k->lane));
    const __m256i offv = _mm256_loadu_si256((const __m256i *)(off + j - a)); /* off is padded by 8 */
    const __m256i slot = _mm256_and_si256(x, k->mask);
    __m256i t = GATHER(HW, tab + CUMB, _mm256_add_epi32(offv, _mm256_srli_epi32(slot, SCALE - LUTB)), 1);
    t = _mm256_min_epu32(_mm256_and_si256(t, _mm256_set1_epi32(31)), k->ntok1);
    __m256i pair = GATHER(HW, tab, _mm256_add_epi32(offv, _mm256_add_epi32(t, t)), 1);
    __m256i hi = _mm256_srli_epi32(pair, 16);
    __m256i more = _mm256_andnot_si256(_mm256_cmpgt_epi32(hi, slot), _mm256_and_si256(act, _mm256_cmpgt_epi32(k->ntok1, t)));
    while (!_mm256_testz_si256(more, more)) { /* lanes whose slot lies past cum[t + 1]: next token */
        t = _mm256_sub_epi32(t, more);
        pair = GATHER(HW, tab, _mm256_add_epi32(offv, _mm256_add_epi32(t, t)), 1);
        hi = _mm256_srli_epi32(pair, 16);
        more = _mm256_andnot_si256(_mm256_cmpgt_epi32(hi, slot), _mm256_and_si256(more, _mm256_cmpgt_epi32(k->ntok1, t)));
    }
    const __m256i lo = _mm256_and_si256(pair, k->low16);
    const __m256i xn = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(hi, lo), _mm256_srli_epi32(x, SCALE)),
                                        _mm256_sub_epi32(slot, lo));
    x = _mm256_blendv_epi8(x, xn, act);
    x = renorm8(x, _mm256_and_si256(act, _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), k->zero)), pp);
    if (_mm256_testz_si256(t, act)) { /* all tokens zero (sparse data): no flips, no bits */
        store8(k, k->zero, out, j, a, cnt, is8);
        return x;
    }
    /* sign flips: lanes whose previous-channel value and token are nonzero, after the group's tokens */
    __m256i fl = k->zero, sneg = k->zero;
    if (pv) {
        const __m256i pvv = _mm256_loadu_si256((const __m256i *)(pv + j - a)); /* pv is padded by 8 */
        fl = _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpeq_epi32(pvv, k->zero), _mm256_cmpeq_epi32(t, k->zero)), act);
        if (!_mm256_testz_si256(fl, fl)) {
            const __m256i s2 = _mm256_and_si256(x, k->mask);
            const __m256i isf = _mm256_cmpgt_epi32(s2, _mm256_sub_epi32(k->f0, k->one)); /* s2 >= f0 */
            const __m256i xf = _mm256_sub_epi32(
                _mm256_add_epi32(_mm256_mullo_epi32(_mm256_blendv_epi8(k->f0, k->f1, isf), _mm256_srli_epi32(x, SCALE)), s2),
                _mm256_and_si256(isf, k->f0));
            x = _mm256_blendv_epi8(x, xf, fl);
            x = renorm8(x, _mm256_and_si256(fl, _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), k->zero)), pp);
            sneg = _mm256_xor_si256(_mm256_srli_epi32(pvv, 31), _mm256_and_si256(isf, k->one));
        }
    }
    /* raw bits: Exp-Golomb extra bits then the sign (t > 0, not a flip), LSB first, lanes in order */
    const uint64_t pos = *ppos;
    const __m256i eb = _mm256_max_epi32(_mm256_sub_epi32(t, k->dv), k->zero);
    const __m256i plain = _mm256_andnot_si256(fl, _mm256_and_si256(_mm256_cmpgt_epi32(t, k->zero), k->one));
    const __m256i nb = _mm256_and_si256(act, _mm256_add_epi32(eb, plain));
    __m256i s = _mm256_add_epi32(nb, _mm256_slli_si256(nb, 4));
    s = _mm256_add_epi32(s, _mm256_slli_si256(s, 8));
    s = _mm256_add_epi32(s, _mm256_and_si256(_mm256_permutevar8x32_epi32(s, k->bcast3), k->upper));
    const __m256i rel = _mm256_add_epi32(_mm256_set1_epi32((int)(pos & 7)), _mm256_sub_epi32(s, nb));
    __m256i raw = GATHER(HW, bits + (pos >> 3), _mm256_srli_epi32(rel, 3), 1);
    raw = _mm256_srlv_epi32(raw, _mm256_and_si256(rel, _mm256_set1_epi32(7)));
    raw = _mm256_and_si256(raw, _mm256_sub_epi32(_mm256_sllv_epi32(k->one, nb), k->one));
    const __m256i big = _mm256_add_epi32(k->dm1, _mm256_sllv_epi32(k->one, eb));
    const __m256i mag = _mm256_add_epi32(_mm256_blendv_epi8(big, t, _mm256_cmpgt_epi32(k->dv, t)),
                                         _mm256_and_si256(raw, _mm256_sub_epi32(_mm256_sllv_epi32(k->one, eb), k->one)));
    const __m256i neg = _mm256_blendv_epi8(_mm256_and_si256(_mm256_srlv_epi32(raw, eb), k->one), sneg, fl);
    const __m256i v = _mm256_add_epi32(_mm256_xor_si256(mag, _mm256_sub_epi32(k->zero, neg)), neg);
    *ppos = pos + (uint32_t)_mm256_extract_epi32(s, 7);
    store8(k, v, out, j, a, cnt, is8);
    return x;
}

/* A run of nw coefficients whose first uses state si: states 0-7 and 8-15 are two vectors whose steps
 * alternate, so one's gathers overlap the other's (each step waits for its own previous one only) */
__attribute__((target("avx2,popcnt"), always_inline)) static inline void dec_run_body(
    const uint8_t *tab, const uint32_t *off, const int32_t *pv, uint32_t flip1, int nw, unsigned si, char *out,
    const int is8, rbuf_t *r, bitp_t *bp, uint32_t *xs, const int HW) {
    vk_t k;
    k.lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); k.zero = _mm256_setzero_si256(); k.one = _mm256_set1_epi32(1);
    k.mask = _mm256_set1_epi32(MASK); k.ntok1 = _mm256_set1_epi32(NTOK - 1); k.dv = _mm256_set1_epi32(D);
    k.dm1 = _mm256_set1_epi32(D - 1); k.low16 = _mm256_set1_epi32(0xFFFF);
    k.upper = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1); k.bcast3 = _mm256_set1_epi32(3);
    k.pick8 = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    k.pick16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    k.join = _mm256_setr_epi32(0, 4, 1, 5, 2, 3, 6, 7);
    k.f0 = _mm256_set1_epi32((int)(MTOT - flip1)); k.f1 = _mm256_set1_epi32((int)flip1);
    __m256i xa = _mm256_loadu_si256((const __m256i *)xs), xb = _mm256_loadu_si256((const __m256i *)(xs + 8));
    const uint8_t *p = r->p;
    uint64_t pos = bp->pos;
    for (int j = 0; j < nw;) {
        const unsigned at = (si + (unsigned)j) & (NS2 - 1);
        const int a = (int)(at & 7), cnt = nw - j < 8 - a ? nw - j : 8 - a;
        if (at < 8) xa = step8(&k, xa, tab, off, pv, j, a, cnt, out, is8, &p, &pos, bp->base, HW);
        else xb = step8(&k, xb, tab, off, pv, j, a, cnt, out, is8, &p, &pos, bp->base, HW);
        j += cnt;
    }
    _mm256_storeu_si256((__m256i *)xs, xa);
    _mm256_storeu_si256((__m256i *)(xs + 8), xb);
    r->p = p;
    bp->pos = pos;
}

#define DEC_RUN_ARGS                                                                                            \
    const uint8_t *tab, const uint32_t *off, const int32_t *pv, uint32_t flip1, int nw, unsigned si, char *out, \
        const int is8, rbuf_t *r, bitp_t *bp, uint32_t *xs
__attribute__((target("avx2,popcnt"))) static void dec_run_hw(DEC_RUN_ARGS) {
    dec_run_body(tab, off, pv, flip1, nw, si, out, is8, r, bp, xs, 1);
}
__attribute__((target("avx2,popcnt"))) static void dec_run_sl(DEC_RUN_ARGS) {
    dec_run_body(tab, off, pv, flip1, nw, si, out, is8, r, bp, xs, 0);
}
#else
#define HAVE_SIMD 0
#endif

#ifndef ZNUM
#define ZNUM 1 /* runs whose tables expect more than ZNUM / ZDEN zeros take the zero shortcut */
#define ZDEN 2
#endif

/* The decoder's walk (the order of WALKF), specialised by element size (IS8), flags (FL) and the number
 * of states (NS: 2 for mode 0, 8 for mode 2), all compile-time constants in the instances below. Per block
 * row and AC plane, the contexts of a run of coefficients depend only on decoded ones (lower planes, the row
 * above, the previous channel; not on the left neighbour unless F_LT), so their table offsets are computed
 * first in a loop of their own and the decoding loop is left with the rANS steps. Mode 0's two states
 * alternate between xa and xb (registers); mode 2's sixteen live in xv, state si next, and its runs go to
 * the AVX2 decoder when they can. */
#define LD(ptr, i) (IS8 ? (int32_t)((const int8_t *)(ptr))[i] : (int32_t)((const int16_t *)(ptr))[i])
#define ST(ptr, i, v) do { if (IS8) ((int8_t *)(ptr))[i] = (int8_t)(v); else ((int16_t *)(ptr))[i] = (int16_t)(v); } while (0)
#define DEC(e, prevv, sflag, UNCH, ZF)                                                                    \
    (NS == NS0 ? dec_sym((e), &xa, &r, &bp, (prevv), (sflag), flip1, (UNCH), (ZF), 0)                    \
               : dec_sym32((e), &xv[si], &r, &bp, (prevv), (sflag), flip1, (UNCH), (ZF)))
#define NEXT_STATE do { if (NS == NS0) { rans_t sw_ = xa; xa = xb; xb = sw_; } else si = (si + 1) & (NS2 - 1); } while (0)

/* a mode 2 run of an SFLIP channel, scalar: by groups (see DEC_BLOCK), the tokens, then the sign flips */
#define GROUPED_RUN(UNCH)                                                                                             \
    for (int j = 0; j < nw;) {                                                                                        \
        const int cnt = nw - j < 8 - (int)(si & 7) ? nw - j : 8 - (int)(si & 7);                                      \
        const unsigned s0 = si;                                                                                       \
        uint32_t pend = 0; /* bit l: coefficient j + l waits for its sign flip */                                     \
        for (int l = 0; l < cnt; l++) {                                                                               \
            const int wb = w0 + j + l;                                                                                \
            uint32_t e = off[j + l];                                                                                  \
            if (use_lt) {                                                                                             \
                if (wb > 0) {                                                                                         \
                    uint32_t s_lt = iabs32(LD(pl, wb - 1));                                                           \
                    s_lt += hb > 0 ? iabs32(LD(pl, wb - rowstride)) : iabs32(LD(pl, wb - 1));                         \
                    e += (uint32_t)blt[clampf(s_lt)];                                                                 \
                }                                                                                                     \
                e = (uint32_t)tidx[e < nctx ? e : 0] * TABB;                                                          \
            }                                                                                                         \
            rans_t xt = xv[si];                                                                                       \
            const uint32_t t = dec_tok(tab + e, &xt, &r, UNCH, 1);                                                    \
            xv[si] = (uint32_t)xt;                                                                                    \
            int32_t v = 0;                                                                                            \
            if (t == 0) { /* sparse data: mostly zeros, no bits */                                                    \
            } else if (pv[j + l] != 0) { /* the magnitude now (a left context), the sign below */                     \
                v = (int32_t)(TOKI[t].mbase + bp_get(&bp, TOKI[t].eb, UNCH));                                         \
                pend |= 1u << l;                                                                                      \
            } else v = dec_value(t, &bp, -1, UNCH);                                                                   \
            ST(pl, wb, v);                                                                                            \
            si = (si + 1) & (NS2 - 1);                                                                                \
        }                                                                                                             \
        for (int l = 0; l < cnt; l++) if (pend >> l & 1) {                                                            \
            const int wb = w0 + j + l;                                                                                \
            rans_t xt = xv[(s0 + (unsigned)l) & (NS2 - 1)];                                                           \
            const uint32_t neg = (uint32_t)(pv[j + l] < 0) ^ dec_flip(&xt, &r, flip1, UNCH, 1);                       \
            xv[(s0 + (unsigned)l) & (NS2 - 1)] = (uint32_t)xt;                                                        \
            const int32_t mag = LD(pl, wb);                                                                           \
            ST(pl, wb, neg ? -mag : mag);                                                                             \
        }                                                                                                             \
        j += cnt;                                                                                                     \
    }

/* A stream that ran past the end of its words or of its bits cannot end cleanly: the walk stops at the start of the
 * next block row or run after that (its caller reports how far it got), so the work done on a stream that ends early
 * is bounded by the stream, not by the declared shape. */
#define OVERRUN (r.over || bp.pos > (uint64_t)bp.len * 8)

static inline __attribute__((always_inline)) ptrdiff_t dec_walk(const model_t *m, void *q, int B, int C, int Hb,
                                                                 int Hf, int K, int Wb, rans_t *x, rbuf_t *rr,
                                                                 bitp_t *br, const int IS8, const int FL, const int NS) {
    const int use_top = FL & F_TOP, use_lt = (FL & F_LT) && !use_top, use_ch = FL & F_CH; /* as WALKF */
    const int use_wide = FL & F_WIDE, use_sflip = FL & F_SFLIP;
    const ptrdiff_t rowstride = (ptrdiff_t)K * Wb, chstride = (ptrdiff_t)Hf * K * Wb; /* Hb of Hf rows: WALKF */
    const uint32_t nctx = (uint32_t)m->nctx;
    const int32_t *tidx = m->tidx, *bin = m->bin, *blt = m->blt, *bch = m->bch, *bdc = m->bdc;
    const uint8_t *tab = m->tab;
    rbuf_t r = *rr; bitp_t bp = *br;
    rans_t xa = x[0], xb = x[1];
    uint32_t xv[NS2]; /* mode 2's states as the vector decoder loads them */
    unsigned si = 0;
    if (NS == NS2) for (int l = 0; l < NS2; l++) xv[l] = (uint32_t)x[l];
    ptrdiff_t n = 0;
    uint32_t offbuf[DEC_BLOCK + 16] = {0}; /* 8 entries either side for the vector decoder's loads */
    int32_t pvbuf[DEC_BLOCK + 16] = {0};   /* mode 2, SFLIP channels: the previous channel's values */
    uint32_t *off = offbuf + 8;
    int32_t *pv = pvbuf + 8;
    /* int8: |v| and the "top" and "ch" bucket terms by table (a load instead of sign tricks) */
    uint16_t abs8[256];
    int32_t topb[256], chb[256];
    if (IS8) for (int v = -128; v < 128; v++) {
        abs8[(uint8_t)v] = (uint16_t)iabs32(v);
        topb[(uint8_t)v] = blt[clampf(2 * iabs32(v))];
        chb[(uint8_t)v] = bch[clampf(iabs32(v))];
    }
#define ABSV(ptr, i) (IS8 ? (uint32_t)abs8[(uint8_t)((const int8_t *)(ptr))[i]] : iabs32(LD(ptr, i)))
    const int es = IS8 ? 1 : 2;
    for (int b = 0; b < B; b++) for (int c = 0; c < C; c++) {
        char *pc = (char *)q + ((ptrdiff_t)b * C + c) * chstride * es;
        const int32_t *kc = m->kc + (ptrdiff_t)c * K;
        const uint32_t flip1 = (uint32_t)m->flipf[c];
        const int chctx = use_ch && c > 0, sflag = use_sflip && c > 0;
        for (int hb = 0; hb < Hb; hb++) {
            char *row = pc + hb * rowstride * es;
            if (OVERRUN) goto stop;
            { /* DC plane: the prediction and context use the left neighbour, decoded just before */
                const int32_t base = kc[0];
                for (int wb = 0; wb < Wb; wb++) {
                    int32_t pred; uint32_t act = 0;
                    if (wb > 0 && hb > 0) {
                        int32_t L = LD(row, wb - 1), Tp = LD(row, wb - rowstride), TL = LD(row, wb - rowstride - 1);
                        act = iabs32(L - TL) + iabs32(Tp - TL); pred = (L + Tp) >> 1;
                    } else if (wb > 0) pred = LD(row, wb - 1);
                    else if (hb > 0) pred = LD(row, wb - rowstride);
                    else pred = 0;
                    uint32_t ctx = (uint32_t)(base + bdc[clampf(act)]);
                    ctx = ctx < nctx ? ctx : 0;
                    int32_t v = DEC(tab + (ptrdiff_t)tidx[ctx] * TABB, 0, 0, 0, 0);
                    ST(row, wb, pred + v);
                    NEXT_STATE;
                }
                n += Wb;
            }
            for (int k = 1; k < K; k++) {
                char *pl = row + (ptrdiff_t)k * Wb * es;
                const int ku = m->nup[k], kl = m->nlf[k];
                const char *pu = row + (ptrdiff_t)(ku >= 0 ? ku : kl) * Wb * es;
                const char *pf = row + (ptrdiff_t)(kl >= 0 ? kl : ku) * Wb * es;
                const char *pu2 = m->nup2[k] >= 0 ? row + (ptrdiff_t)m->nup2[k] * Wb * es : pu;
                const char *pf2 = m->nlf2[k] >= 0 ? row + (ptrdiff_t)m->nlf2[k] * Wb * es : pf;
                const char *pch = c > 0 ? pl - chstride * es : pl; /* only read when c > 0 */
                const int32_t base = kc[k];
                for (int w0 = 0; w0 < Wb; w0 += DEC_BLOCK) {
                    if (OVERRUN) { n += w0; goto stop; }
                    const int nw = Wb - w0 < DEC_BLOCK ? Wb - w0 : DEC_BLOCK;
                    int j0 = 0; /* contexts from decoded neighbours only: 8 at a time, then one at a time */
#if HAVE_SIMD
                    if (!use_lt && g_simd && m->vsteps && nw >= VEC_CTX_MIN) {
                        j0 = nw & ~7;
                        BY_LOOKUP(ctx_run, m, j0, w0, base, pu, pf, pu2, pf2, hb > 0 ? pl - rowstride * es : NULL,
                                  c > 0 ? pch : NULL, use_wide, use_top, chctx, NS == NS2 && sflag ? pv : NULL, off, IS8);
                    }
#endif
                    for (int j = j0; j < nw; j++) {
                        const int wb = w0 + j;
                        uint32_t s_in = ABSV(pu, wb) + ABSV(pf, wb);
                        if (use_wide) s_in = 2 * s_in + ABSV(pu2, wb) + ABSV(pf2, wb);
                        int32_t ctx = base + bin[clampf(s_in)];
                        if (use_top) {
                            if (hb == 0) ctx += blt[0];
                            else if (IS8) ctx += topb[(uint8_t)((const int8_t *)pl)[wb - rowstride]];
                            else ctx += blt[clampf(2 * iabs32(LD(pl, wb - rowstride)))];
                        } else if (use_lt && wb == 0) ctx += blt[hb > 0 ? clampf(2 * iabs32(LD(pl, -rowstride))) : 0];
                        if (chctx) ctx += IS8 ? chb[(uint8_t)((const int8_t *)pch)[wb]] : bch[clampf(iabs32(LD(pch, wb)))];
                        if (use_lt) off[j] = (uint32_t)ctx; /* the left neighbour's part is added below */
                        else off[j] = (uint32_t)tidx[(uint32_t)ctx < nctx ? (uint32_t)ctx : 0] * TABB;
                        if (NS == NS2 && sflag) pv[j] = LD(pch, wb);
                    }
                    /* Each coefficient takes at most 2 words (8 bytes) and 17 raw bits (3 bytes): when the
                     * rest of both sections holds a whole run's worth (and, in mode 2, 16 bytes more for the
                     * vector decoder's loads), its reads skip the checks */
                    const int room = r.end - r.p >= (ptrdiff_t)nw * 8 + (NS == NS2 ? 16 : 0) && bp.len >= 8 &&
                                     (bp.pos >> 3) + (uint64_t)nw * 3 + 8 <= (uint64_t)bp.len;
#if HAVE_SIMD
                    if (NS == NS2 && room && !use_lt && g_simd) {
                        BY_LOOKUP(dec_run, tab, off, sflag ? pv : NULL, flip1, nw, si, pl + (ptrdiff_t)w0 * es, IS8, &r,
                                  &bp, xv);
                        si = (si + (unsigned)nw) & (NS2 - 1);
                        continue;
                    }
#endif
                    if (NS == NS2 && sflag) { /* by groups (see DEC_BLOCK): the tokens, then the sign flips */
                        if (room) GROUPED_RUN(1) else GROUPED_RUN(0) /* the reads' checks decided per run */
                        continue;
                    }
                    /* a run whose tables expect mostly zeros (mean P(0) > 0.8: high frequencies, sparse
                     * data) skips the rest of a zero's work behind a branch that is then well predicted;
                     * denser runs stay branch-free */
                    uint64_t pz = 0;
                    if (!use_lt) for (int j = 0; j < nw; j++) pz += ((const uint16_t *)(tab + off[j]))[1];
                    const int sparse = !use_lt && pz * ZDEN > (uint64_t)nw * MTOT * ZNUM;
                    if (room && sparse) {
                        for (int j = 0; j < nw; j++) {
                            const int wb = w0 + j;
                            const int32_t prevv = sflag ? LD(pch, wb) : 0;
                            int32_t v = DEC(tab + off[j], prevv, sflag, 1, 1);
                            ST(pl, wb, v);
                            NEXT_STATE;
                        }
                    } else if (!use_lt && room) {
                        for (int j = 0; j < nw; j++) {
                            const int wb = w0 + j;
                            const int32_t prevv = sflag ? LD(pch, wb) : 0;
                            int32_t v = DEC(tab + off[j], prevv, sflag, 1, 0);
                            ST(pl, wb, v);
                            NEXT_STATE;
                        }
                    } else if (sparse) { /* sparse streams have little room: most of their runs come here */
                        for (int j = 0; j < nw; j++) {
                            const int wb = w0 + j;
                            const int32_t prevv = sflag ? LD(pch, wb) : 0;
                            int32_t v = DEC(tab + off[j], prevv, sflag, 0, 1);
                            ST(pl, wb, v);
                            NEXT_STATE;
                        }
                    } else {
                        for (int j = 0; j < nw; j++) {
                            const int wb = w0 + j;
                            uint32_t ctx = off[j];
                            if (use_lt) { /* the left neighbour: decoded just before */
                                if (wb > 0) {
                                    uint32_t s_lt = iabs32(LD(pl, wb - 1));
                                    s_lt += hb > 0 ? iabs32(LD(pl, wb - rowstride)) : iabs32(LD(pl, wb - 1));
                                    ctx += (uint32_t)blt[clampf(s_lt)];
                                }
                                ctx = ctx < nctx ? ctx : 0;
                                ctx = (uint32_t)tidx[ctx] * TABB;
                            }
                            const int32_t prevv = sflag ? LD(pch, wb) : 0;
                            int32_t v = DEC(tab + ctx, prevv, sflag, 0, 0);
                            ST(pl, wb, v);
                            NEXT_STATE;
                        }
                    }
                }
                n += Wb;
            }
        }
    }
stop:
    *rr = r; *br = bp;
    if (NS == NS0) {
        if (n & 1) { x[0] = xb; x[1] = xa; } else { x[0] = xa; x[1] = xb; }
    } else for (int l = 0; l < NS2; l++) x[l] = xv[l]; /* state i is xv[i]: lanes do not rotate */
    return n;
}

typedef ptrdiff_t (*dec_fn)(const model_t *, void *, int, int, int, int, int, int, rans_t *, rbuf_t *, bitp_t *);
#define DECODE_FUNC(SUF, IS8, FL, NS)                                                                     \
static ptrdiff_t dec_##SUF(const model_t *m, void *q, int B, int C, int Hb, int Hf, int K, int Wb,       \
                           rans_t *x, rbuf_t *rr, bitp_t *br) {                                           \
    return dec_walk(m, q, B, C, Hb, Hf, K, Wb, x, rr, br, IS8, FL, NS);                                   \
}
/* per mode: generic (any flags) plus versions specialised for the layouts `fit` produces */
#define SPEC(FLV, NAME)                                                                                   \
    DECODE_FUNC(i8_##NAME, 1, FLV, NS0) DECODE_FUNC(i16_##NAME, 0, FLV, NS0)                              \
    DECODE_FUNC(i8_##NAME##_l, 1, FLV, NS2) DECODE_FUNC(i16_##NAME##_l, 0, FLV, NS2)
SPEC(m->flags, any)
SPEC(0, s0) SPEC(F_TOP, s1) SPEC(F_WIDE, s2) SPEC(F_TOP | F_WIDE, s3)
SPEC(F_TOP | F_CH | F_SFLIP, s4) SPEC(F_TOP | F_WIDE | F_CH | F_SFLIP, s5)
SPEC(F_TOP | F_CH, s6) SPEC(F_TOP | F_WIDE | F_CH, s7)

static dec_fn pick_decoder(int flags, int itemsize, int lanes) {
#define PICK(FLV, NAME)                                                                                   \
    if (flags == (FLV)) return lanes ? (itemsize == 1 ? dec_i8_##NAME##_l : dec_i16_##NAME##_l)             \
                                     : (itemsize == 1 ? dec_i8_##NAME : dec_i16_##NAME);
    PICK(0, s0) PICK(F_TOP, s1) PICK(F_WIDE, s2) PICK(F_TOP | F_WIDE, s3)
    PICK(F_TOP | F_CH | F_SFLIP, s4) PICK(F_TOP | F_WIDE | F_CH | F_SFLIP, s5)
    PICK(F_TOP | F_CH, s6) PICK(F_TOP | F_WIDE | F_CH, s7)
    return lanes ? (itemsize == 1 ? dec_i8_any_l : dec_i16_any_l) : (itemsize == 1 ? dec_i8_any : dec_i16_any);
}

/* What a stream of len bytes can code at most (mode 0, 2 or 3 with tables whose frequencies are all >= 1, as
 * ctxrans.py builds them; mode 1 holds fewer). Decoding a coefficient takes a token symbol, which multiplies its
 * state x by at most (2 fmax + M - 1) / (3 M) with M = 2^15 and fmax = M - (NTOK - 1) (every other token keeps a
 * frequency of 1 or more): x' = f (x >> 15) + (x mod M) - cum[t], x >> 15 >= 2 in mode 2 (x >= 2^16), the
 * worst case; so log2 x falls by at least 0.000822 per coefficient (mode 0: 0.00121); sign-flip symbols never
 * raise it. It rises only by the words read: at most 16.6 bits per 16-bit word (x' >= 2 before one), 32.0001
 * per 32-bit word. From initial states below 2^32 (2^63) to final ones at L = 2^16 (2^31): a mode 2 stream of
 * len bytes codes at most (16 * 16 + 8.3 len) / 0.000822 < 311,500 + 10,100 len coefficients, a mode 0 one at
 * most (2 * 32 + 8.0001 len) / 0.00121 < 53,000 + 6,700 len; a mode 3 stream is segments of those, each at least
 * 66 (18) bytes long, at most 14,900 (9,700) coefficients per byte of the segment. 2^19 + 2^14 len covers all.
 * The most compressible array (all zeros, every token at fmax) costs 0.00123 bits a coefficient: 6,500 per byte. */
int64_t ctx_max_coefficients(int64_t len) { return ((int64_t)1 << 19) + ((int64_t)1 << 14) * (len < 0 ? 0 : len); }

/* Rows h0 .. h0 + Hs - 1 of out (dims: the whole array) from src, in walk order (b, c, row, k, wb) */
static void scatter_rows(void *out, const int dims[5], int h0, int Hs, int itemsize, const uint8_t *src) {
    const ptrdiff_t row = (ptrdiff_t)dims[3] * dims[4] * itemsize, ch = row * dims[2];
    for (ptrdiff_t bc = 0; bc < (ptrdiff_t)dims[0] * dims[1]; bc++, src += row * Hs)
        memcpy((uint8_t *)out + bc * ch + h0 * row, src, row * Hs);
}

/* One part of a stream (mode 0, 1 or 2: a whole array, or one segment of mode 3) into rows h0 .. h0 + Hs - 1
 * of out (dims: the whole array): NULL when it decoded cleanly, else the error (a static string, or msg) */
static const char *decode_part(const model_t *m, const uint8_t *in, ptrdiff_t len, void *out, const int dims[5],
                               int h0, int Hs, int itemsize, char *msg, size_t cap) {
    const uint8_t *end = in + len;
    const ptrdiff_t total = (ptrdiff_t)dims[0] * dims[1] * Hs * dims[3] * dims[4];
    if (len < 1) return "ctxrans: empty stream";
    if (total > ctx_max_coefficients(len)) {
        snprintf(msg, cap, "ctxrans: a stream of %td bytes cannot hold %td coefficients (at most %lld)", len, total,
                 (long long)ctx_max_coefficients(len));
        return msg;
    }
    if (in[0] == MODE_RAW) {
        if (len - 1 != total * itemsize) return "ctxrans: raw stream has the wrong length";
        scatter_rows(out, dims, h0, Hs, itemsize, in + 1);
        return NULL;
    }
    const int lanes = in[0] == MODE_LANES, ns = lanes ? NS2 : NS0, state_bytes = lanes ? 4 : 8;
    const rans_t lo = lanes ? RANS_L2 : RANS_L, hi = lanes ? RANS_L2 << 16 : RANS_L << IO_BITS;
    if ((in[0] != MODE_RANS && !lanes) || len < 2 + ns * state_bytes) return "ctxrans: bad stream header";
    rans_t x[NSMAX];
    for (int s = 0; s < ns; s++) {
        x[s] = 0;
        for (int j = 0; j < state_bytes; j++) x[s] |= (rans_t)in[1 + state_bytes * s + j] << (8 * j);
        if (x[s] < lo || x[s] >= hi) return "ctxrans: corrupt stream (bad initial state)";
    }
    const uint8_t *p = in + 1 + ns * state_bytes;
    uint64_t nr = 0; int shift = 0;
    for (;;) {
        if (p >= end || shift > 35) return "ctxrans: corrupt stream (bad section length)";
        uint8_t byte = *p++; nr |= (uint64_t)(byte & 0x7f) << shift; shift += 7;
        if (!(byte & 0x80)) break;
    }
    if (nr > (uint64_t)(end - p)) return "ctxrans: truncated stream (section length beyond the end)";
    rbuf_t r; r.p = p; r.end = p + nr; r.over = 0;
    bitp_t b; b.base = p + nr; b.len = end - (p + nr); b.pos = 0; b.fast = b.len >= 8 ? (uint64_t)(b.len - 7) : 0;
    void *q0 = (uint8_t *)out + (ptrdiff_t)h0 * dims[3] * dims[4] * itemsize;
    const ptrdiff_t done = pick_decoder(m->flags, itemsize, lanes)(m, q0, dims[0], dims[1], Hs, dims[2], dims[3],
                                                                  dims[4], x, &r, &b);
    if (r.over || b.pos > (uint64_t)b.len * 8) {
        snprintf(msg, cap, "ctxrans: truncated stream (its %s ran out by coefficient %td of %td)",
                 r.over ? "rANS words" : "raw bits", done, total);
        return msg;
    }
    int clean = r.p == r.end;
    for (int s = 0; s < ns; s++) clean &= x[s] == lo;
    if (!clean) return "ctxrans: corrupt stream (does not end cleanly)";
    if ((b.pos + 7) / 8 != (uint64_t)b.len) return "ctxrans: corrupt stream (bit section length)";
    return NULL;
}

/* One stream into `out` (n * itemsize bytes of shape dims), without the GIL's help: NULL when it decoded
 * cleanly, else the error (a static string, or `msg` with numbers in it). The model's vector steps (m->vsteps)
 * are set by the caller for these dims. Mode 3: byte 0, LEB128 nseg (1 .. Hb), nseg LEB128 segment lengths
 * that add up to the rest of the stream, then the segments, each a mode 0, 1 or 2 stream of its rows. */
const char *ctx_decode(const model_t *m, const uint8_t *in, ptrdiff_t len, void *out, ptrdiff_t outlen,
                       const int dims[5], int itemsize, char *msg, size_t cap) {
    (void)outlen; /* the caller checked it: dims * itemsize */
    if (len < 1 || in[0] != MODE_SEGMENTS) return decode_part(m, in, len, out, dims, 0, dims[2], itemsize, msg, cap);
    const ptrdiff_t total = dims_count(dims);
    if (total > ctx_max_coefficients(len)) {
        snprintf(msg, cap, "ctxrans: a stream of %td bytes cannot hold %td coefficients (at most %lld)", len, total,
                 (long long)ctx_max_coefficients(len));
        return msg;
    }
    const uint8_t *p = in + 1, *end = in + len;
    uint64_t nseg; /* the segment lengths are read twice: to check them all first, then to decode */
    if (!get_leb(&p, end, &nseg) || nseg < 1 || nseg > (uint64_t)dims[2]) return "ctxrans: corrupt stream (bad segment count)";
    uint64_t sum = 0;
    const uint8_t *lens = p;
    for (uint64_t s = 0; s < nseg; s++) {
        uint64_t v;
        if (!get_leb(&p, end, &v)) return "ctxrans: corrupt stream (bad segment length)";
        sum += v;
        if (sum > (uint64_t)(end - p)) return "ctxrans: truncated stream (segments beyond the end)";
    }
    if (sum != (uint64_t)(end - p)) return "ctxrans: corrupt stream (segments do not fill the stream)";
    const uint8_t *seg = p;
    p = lens;
    for (int s = 0; s < (int)nseg; s++) {
        uint64_t v;
        get_leb(&p, end, &v);
        const int h0 = seg_row(s, (int)nseg, dims[2]);
        const char *err = v >= 1 && seg[0] == MODE_SEGMENTS ? "ctxrans: bad stream header"
                          : decode_part(m, seg, (ptrdiff_t)v, out, dims, h0, seg_row(s + 1, (int)nseg, dims[2]) - h0,
                                        itemsize, msg, cap);
        if (err) { /* "ctxrans: what" -> "ctxrans: segment s of n: what" */
            char what[CTX_MSG];
            snprintf(what, sizeof what, "%s", err + 9);
            snprintf(msg, cap, "ctxrans: segment %d of %d: %s", s, (int)nseg, what);
            return msg;
        }
        seg += v;
    }
    return NULL;
}

void ctx_decode_setup(model_t *m, const int dims[5]) {
    m->vsteps = g_simd && dims[4] >= VEC_CTX_MIN && find_steps(m->bin, &m->sin) && find_steps(m->blt, &m->slt) &&
                find_steps(m->bch, &m->sch);
}

int ctx_set_simd(int on) {
    const int was = g_simd;
#if HAVE_SIMD
    if (on >= 0) g_simd = on && __builtin_cpu_supports("avx2");
#else
    (void)on; /* no vector decoder in this build (not x86-64, or CTX_NO_SIMD) */
#endif
    return was;
}

int ctx_set_gather(int on) {
#if HAVE_SIMD
    const int was = g_gather_hw;
    if (on >= 0) g_gather_hw = on;
#else
    const int was = 0; /* no vector decoder in this build */
    (void)on;
#endif
    return was;
}

void ctx_init(void) {
    init_token_tables();
#if HAVE_SIMD
    init_rank();
    g_simd = __builtin_cpu_supports("avx2");
    g_gather_hw = !__builtin_cpu_is("amd"); /* scalar loads on AMD: see the header */
#endif
}
