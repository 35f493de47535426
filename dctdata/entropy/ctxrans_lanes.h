/* ctxrans_lanes.h: the context-modelled rANS decoder of dctdata's entropy stage for 16 lanes (half a warp) at a time.
 *
 * One source, two builds:
 *   - CUDA C++ through NVRTC (dctdata/entropy/device.py compiles it at run time: no nvcc at install). A unit is a
 *     half-warp: lane l holds rANS state l of the part it decodes; collectives are __ballot_sync / __shfl_sync
 *     with the half-warp's mask, and __syncwarp wherever one lane reads what another wrote.
 *   - plain C (the lane emulator, _ctxlanes.c): every per-lane block is a loop over the 16 lanes, every
 *     collective the same function computed over those loops, so CI checks the kernel's own arithmetic, bounds
 *     and order of reads bit for bit against the CPU decoder (ctxrans_core.c) without a GPU.
 * Rules that keep the two builds the same program: code between CL_LANES_BEGIN and CL_LANES_END is per lane (it may
 * read uniform values, never write them, and holds no collective); everything else is uniform (the same value in
 * every lane: the CUDA build computes it in each lane, the emulator once); cl_lane_index `ln` exists only inside
 * per-lane blocks in the emulator, so uniform code that touched it would not compile there.
 *
 * What it decodes (the format is ctxrans_core.c's, which has the bit-exact definition): a batch of streams, one per
 * sample of shape (C, Hb, K, Wb), each of mode 0 (2 states of 64 bits), 1 (raw), 2 (16 states of 32 bits) or
 * 3 (segments of block rows, each a mode 0, 1 or 2 stream). The units of a sample take its segments in turn
 * (a mode 0, 1 or 2 stream is one part for its first unit). Within a part (mode 2):
 *   - the DC plane of a block row is serial (its context and prediction use the left neighbour): lane 0 decodes
 *     it with the 16 states spilled to shared memory;
 *   - an AC plane row is decoded 16 coefficients per step, coefficient i by lane i % 16; contexts use only
 *     values decoded in earlier steps (lower planes of the row in shared memory, the row above, the previous
 *     channel in the output). A step's rANS words are taken in lane order by ballot + popc (tokens, and for
 *     channels whose signs are coded as flips, each aligned group of 8 lanes' tokens then its flips: the word
 *     order of the format); its raw bits by an exclusive scan of the lanes' bit counts (five ballots);
 *   - planes with the left-block context (F_LT) are serial like DC; a mode 0 part is serial throughout.
 * Every read of the stream is bounded by the part's bytes (words past the end read as zero and set `over`, bits
 * past the end read as zero), every write lands in the sample's output slot; a stream that ran past its end
 * stops at the next block row or run, as the CPU decoder does, and the checks at the end are the CPU's, in its
 * order: so a unit's status is the CPU decoder's error, and its output the CPU's array when the status is 0.
 * The model (the "blob" of ctxrans.py, the CPU decoder's) is trusted: the host parsed and checked it.
 */
#ifndef CTXRANS_LANES_H
#define CTXRANS_LANES_H

/* fixed-width types without host headers (NVRTC has none): int is 32 bits and long long 64 on every target */
typedef signed char cl_i8;
typedef unsigned char cl_u8;
typedef short cl_i16;
typedef unsigned short cl_u16;
typedef int cl_i32;
typedef unsigned int cl_u32;
typedef long long cl_i64;
typedef unsigned long long cl_u64;

#define CL_SCALE 15
#define CL_MTOT (1u << CL_SCALE)
#define CL_MASK (CL_MTOT - 1u)
#define CL_D 12
#define CL_NTOK (CL_D + 17)
#define CL_NFEAT 1024
#define CL_HDR 6
#define CL_LUTB 8
#define CL_CUMB 64
#define CL_TABB (CL_CUMB + (1 << CL_LUTB))
#define CL_DEC_BLOCK 256
#define CL_L2 (1u << 16)          /* mode 2: states in [2^16, 2^32), 16-bit words */
#define CL_L0 (1ull << 31)        /* mode 0: states in [2^31, 2^63), 32-bit words */
enum { CL_F_LT = 1, CL_F_CH = 2, CL_F_TOP = 4, CL_F_SFLIP = 8, CL_F_WIDE = 16 };
enum { CL_MODE_RANS = 0, CL_MODE_RAW = 1, CL_MODE_LANES = 2, CL_MODE_SEGMENTS = 3 };

/* Status of a sample (the low byte; the bits above: 1 + the segment the error is in, 0 outside segments), one per
 * error of the CPU decoder (dctdata.entropy.device.STATUS has the messages) */
enum {
    CL_OK = 0,
    CL_ST_EMPTY = 1,     /* empty stream */
    CL_ST_TOO_MANY = 2,  /* a stream of n bytes cannot hold the declared coefficients */
    CL_ST_RAW_LEN = 3,   /* raw stream has the wrong length */
    CL_ST_HEADER = 4,    /* bad stream header */
    CL_ST_STATE = 5,     /* corrupt stream (bad initial state) */
    CL_ST_SECLEN = 6,    /* corrupt stream (bad section length) */
    CL_ST_SECEND = 7,    /* truncated stream (section length beyond the end) */
    CL_ST_WORDS = 8,     /* truncated stream (its rANS words ran out) */
    CL_ST_BITS = 9,      /* truncated stream (its raw bits ran out) */
    CL_ST_UNCLEAN = 10,  /* corrupt stream (does not end cleanly) */
    CL_ST_BITLEN = 11,   /* corrupt stream (bit section length) */
    CL_ST_SEGCOUNT = 12, /* corrupt stream (bad segment count) */
    CL_ST_SEGLEN = 13,   /* corrupt stream (bad segment length) */
    CL_ST_SEGEND = 14,   /* truncated stream (segments beyond the end) */
    CL_ST_SEGFILL = 15,  /* corrupt stream (segments do not fill the stream) */
    CL_ST_OFFSETS = 16   /* the batch's offsets do not give this sample a byte range inside the buffer */
};

/* ------------------------------------------------------------------ the two builds' primitives */
#if defined(__CUDACC__)
#define CL_FN static __device__ __forceinline__
#define CL_BIG static __device__ __noinline__ /* called per block row or part: one copy of its code */
#define CL_LANE_SETUP                                                                                        \
    const int ln = (int)(threadIdx.x & 15u);                                                                 \
    const cl_u32 cl_hmask = 0xFFFFu << (threadIdx.x & 16u), cl_hshift = threadIdx.x & 16u;                   \
    (void)ln; (void)cl_hmask; (void)cl_hshift
#define CL_LANES_BEGIN {
#define CL_LANES_END }
#define CL_LANEVAR(T, v) T v
#define LV(v) v
#define CL_IS_LANE0 (ln == 0)
/* the half-warp's lanes whose pred holds, as bits 0-15 */
#define CL_BALLOT(dst, pred) (dst) = (__ballot_sync(cl_hmask, (pred)) >> cl_hshift) & 0xFFFFu
#define CL_SYNC() __syncwarp(cl_hmask)
/* a uniform value that lane 0 alone updated, to every lane */
#define CL_FROM_LANE0(v) (v) = __shfl_sync(cl_hmask, (v), 0, 16)
#define CL_POPC(v) __popc(v)
#define CL_LDG(p) __ldg(p)
/* exclusive prefix sum over the lanes of v (each < 32) into dst, and the sum into total: five ballots */
#define CL_EXSCAN5(dst, v, total)                                                                            \
    do {                                                                                                     \
        const cl_u32 lt_ = (1u << ln) - 1u;                                                                  \
        cl_u32 acc_ = 0, tot_ = 0;                                                                           \
        for (int b_ = 0; b_ < 5; b_++) {                                                                     \
            cl_u32 m_;                                                                                       \
            CL_BALLOT(m_, ((v) >> b_) & 1u);                                                                 \
            acc_ += (cl_u32)__popc(m_ & lt_) << b_;                                                          \
            tot_ += (cl_u32)__popc(m_) << b_;                                                                \
        }                                                                                                    \
        (dst) = acc_; (total) = tot_;                                                                        \
    } while (0)
#else /* the lane emulator: C */
#define CL_FN static inline
#define CL_BIG static
#define CL_LANE_SETUP do { } while (0)
#define CL_LANES_BEGIN for (int ln = 0; ln < 16; ln++) {
#define CL_LANES_END }
#define CL_LANEVAR(T, v) T v[16]
#define LV(v) v[ln]
#define CL_IS_LANE0 1
#define CL_BALLOT(dst, pred)                                                                                 \
    do {                                                                                                     \
        cl_u32 m_ = 0;                                                                                       \
        for (int ln = 0; ln < 16; ln++) m_ |= (cl_u32)((pred) ? 1 : 0) << ln;                                \
        (dst) = m_;                                                                                          \
    } while (0)
#define CL_SYNC() do { } while (0)
#define CL_FROM_LANE0(v) do { } while (0)
#define CL_POPC(v) __builtin_popcount(v)
#define CL_LDG(p) (*(p))
#define CL_EXSCAN5(dst, v, total)                                                                            \
    do {                                                                                                     \
        cl_u32 acc_ = 0;                                                                                     \
        for (int ln = 0; ln < 16; ln++) { (dst)[ln] = acc_; acc_ += (v)[ln] & 31u; }                         \
        (total) = acc_;                                                                                      \
    } while (0)
#endif

/* ------------------------------------------------------------------ the model and a part's bytes */
typedef struct {
    int C, K, nctx, flags, ntab;
    const cl_i32 *kc, *nup, *nlf, *nup2, *nlf2, *flipf, *bin, *blt, *bch, *bdc, *tidx;
    const cl_u8 *tab;
} cl_model;

/* the model at w (the blob: int32 header, then its arrays; tables at the end) */
CL_FN void cl_model_view(const cl_i32 *w, cl_model *m) {
    m->C = w[1]; m->K = w[2]; m->nctx = w[3]; m->flags = w[4]; m->ntab = w[5];
    const cl_i32 *p = w + CL_HDR;
    m->kc = p; p += m->C * m->K;
    m->nup = p; p += m->K; m->nlf = p; p += m->K; m->nup2 = p; p += m->K; m->nlf2 = p; p += m->K;
    m->flipf = p; p += m->C;
    m->bin = p; p += CL_NFEAT; m->blt = p; p += CL_NFEAT; m->bch = p; p += CL_NFEAT; m->bdc = p; p += CL_NFEAT;
    m->tidx = p; p += m->nctx;
    m->tab = (const cl_u8 *)p;
}

/* what a part of a stream reads and where it stands: the rANS words (nr bytes), the raw bits (blen bytes) */
typedef struct {
    const cl_u8 *w, *bits;
    cl_i64 nr, blen, ptr; /* ptr: bytes of words taken */
    cl_u64 pos;           /* bits taken */
    int over;             /* a word was needed past the end of the words */
} cl_io;

CL_FN cl_u32 cl_iabs(cl_i32 v) { return v < 0 ? (cl_u32)(-(cl_i64)v) : (cl_u32)v; }
CL_FN cl_u32 cl_clampf(cl_u32 s) { return s < CL_NFEAT ? s : CL_NFEAT - 1; }
CL_FN cl_i64 cl_max_coefficients(cl_i64 len) { return (1ll << 19) + (1ll << 14) * (len < 0 ? 0 : len); }

/* 32 bits of the bit section (blen bytes at bits) from bit pos on (bits past its end read as zeros) */
CL_FN cl_u32 cl_bits_at(const cl_u8 *bits, cl_i64 blen, cl_u64 pos) {
    const cl_u64 at = pos >> 3;
    cl_u32 w = 0;
    if (at + 4 <= (cl_u64)blen) {
        w = (cl_u32)CL_LDG(bits + at) | ((cl_u32)CL_LDG(bits + at + 1) << 8) | ((cl_u32)CL_LDG(bits + at + 2) << 16) |
            ((cl_u32)CL_LDG(bits + at + 3) << 24);
    } else {
        for (int j = 0; j < 4; j++)
            if (at + (cl_u64)j < (cl_u64)blen) w |= (cl_u32)CL_LDG(bits + at + j) << (8 * j);
    }
    return w >> (pos & 7u);
}

/* the word at byte off of the words, or 0 when it is not all inside them */
CL_FN cl_u32 cl_word16(const cl_io *io, cl_i64 off) {
    if (off + 2 > io->nr) return 0;
    return (cl_u32)CL_LDG(io->w + off) | ((cl_u32)CL_LDG(io->w + off + 1) << 8);
}

/* the token of slot (x mod 2^15) in table e: search-start table, then the short search the CPU makes */
CL_FN cl_u32 cl_token(const cl_u8 *e, cl_u32 slot) {
    const cl_u16 *cum = (const cl_u16 *)e;
    cl_u32 t = e[CL_CUMB + (slot >> (CL_SCALE - CL_LUTB))] & 31u;
    t = t < CL_NTOK - 1 ? t : CL_NTOK - 1;
    while (t < CL_NTOK - 1 && cum[t + 1] <= slot) t++;
    return t;
}

/* the magnitude a token starts at, and its Exp-Golomb raw bits */
CL_FN cl_u32 cl_mbase(cl_u32 t) { return t < CL_D ? t : (cl_u32)(CL_D - 1) + (1u << (t - CL_D)); }
CL_FN cl_u32 cl_ebits(cl_u32 t) { return t < CL_D ? 0u : t - CL_D; }

/* value of token t with raw bits `raw` (its extra bits, then its sign unless flipped: neg >= 0) */
CL_FN cl_i32 cl_value(cl_u32 t, cl_u32 raw, int neg) {
    const cl_u32 eb = cl_ebits(t);
    const cl_u32 mag = cl_mbase(t) + (raw & ((1u << eb) - 1u));
    const cl_u32 n = neg >= 0 ? (cl_u32)neg : (t > 0 ? (raw >> eb) & 1u : 0u);
    return (cl_i32)((mag ^ (0u - n)) + n);
}

CL_FN cl_i32 cl_load(const void *p, cl_i64 i, int is8) {
    return is8 ? (cl_i32)((const cl_i8 *)p)[i] : (cl_i32)((const cl_i16 *)p)[i];
}
CL_FN void cl_store(void *p, cl_i64 i, cl_i32 v, int is8) {
    if (is8) ((cl_i8 *)p)[i] = (cl_i8)v;
    else ((cl_i16 *)p)[i] = (cl_i16)v;
}

/* ------------------------------------------------------------------ one thread, serial (lane 0) */
/* renormalise state x (mode 2: 16-bit words below 2^16; mode 0: 32-bit words below 2^31) */
CL_FN cl_u64 cl_renorm1(cl_u64 x, cl_io *io, int w16) {
    if (w16) {
        if (x < CL_L2) {
            cl_u32 w = 0;
            if (io->ptr + 2 <= io->nr) { w = cl_word16(io, io->ptr); io->ptr += 2; }
            else io->over = 1;
            x = (x << 16) | w;
        }
    } else if (x < CL_L0) {
        cl_u32 w = 0;
        if (io->ptr + 4 <= io->nr) {
            w = cl_word16(io, io->ptr) | (cl_word16(io, io->ptr + 2) << 16);
            io->ptr += 4;
        } else io->over = 1;
        x = (x << 32) | w;
    }
    return x;
}

CL_FN cl_u32 cl_tok1(const cl_u8 *e, cl_u64 *xs, cl_io *io, int w16) {
    const cl_u16 *cum = (const cl_u16 *)e;
    const cl_u64 x = *xs;
    const cl_u32 slot = (cl_u32)(x & CL_MASK);
    const cl_u32 t = cl_token(e, slot);
    *xs = cl_renorm1((cl_u64)((cl_u32)cum[t + 1] - cum[t]) * (x >> CL_SCALE) + slot - cum[t], io, w16);
    return t;
}

CL_FN cl_u32 cl_flip1(cl_u64 *xs, cl_io *io, cl_u32 flip1, int w16) {
    const cl_u64 x = *xs;
    const cl_u32 s2 = (cl_u32)(x & CL_MASK), f0 = CL_MTOT - flip1;
    const cl_u32 flip = s2 >= f0;
    *xs = cl_renorm1(flip ? (cl_u64)flip1 * (x >> CL_SCALE) + s2 - f0 : (cl_u64)f0 * (x >> CL_SCALE) + s2, io, w16);
    return flip;
}

/* raw bits of token t from the bit section: `sign` says whether a sign bit follows its extra bits */
CL_FN cl_u32 cl_take_bits(cl_io *io, cl_u32 t, int sign) {
    const cl_u32 nb = cl_ebits(t) + (sign && t > 0 ? 1u : 0u);
    const cl_u32 raw = nb ? cl_bits_at(io->bits, io->blen, io->pos) & ((1u << nb) - 1u) : 0u;
    io->pos += nb;
    return raw;
}

/* one coefficient in mode 0's order (its token, its sign flip, its raw bits), as the CPU's dec_sym */
CL_FN cl_i32 cl_sym1(const cl_u8 *e, cl_u64 *xs, cl_io *io, cl_i32 prevv, int sflag, cl_u32 flip1, int w16) {
    const cl_u32 t = cl_tok1(e, xs, io, w16);
    if (sflag && prevv != 0 && t != 0) {
        const int neg = (int)((cl_u32)(prevv < 0) ^ cl_flip1(xs, io, flip1, w16));
        return cl_value(t, cl_take_bits(io, t, 0), neg);
    }
    return cl_value(t, cl_take_bits(io, t, 1), -1);
}

/* ------------------------------------------------------------------ a part: where it is and what it writes */
typedef struct {
    const cl_model *m;
    void *out;                /* the sample's output: (C, Hb, K, Wb) of int8 (is8) or int16 */
    int is8, C, Hb, K, Wb;    /* the sample's shape */
    int h0, Hs;               /* the part's block rows */
    cl_i16 *rows;             /* 2 * K * Wb: the current block row and the one above, as stored */
    cl_u64 *xs;               /* 16 states, for the serial sections */
} cl_part;

CL_FN cl_i64 cl_at(const cl_part *P, int c, int hb, int k, int wb) {
    return (((cl_i64)c * P->Hb + hb) * P->K + k) * P->Wb + wb;
}

/* the context table offset of AC coefficient (k, wb) of block row hl (cur, and top when hl > 0) in channel c, all
 * but the left-neighbour term (F_LT adds it); pv: the previous channel's value (0 in channel 0) */
CL_FN cl_u32 cl_ac_context(const cl_part *P, const cl_i16 *cur, const cl_i16 *top, int c, int hl, int k, int wb,
                           cl_i32 pv) {
    const cl_model *m = P->m;
    const int Wb = P->Wb, fl = m->flags;
    const int ku = m->nup[k], kl = m->nlf[k];
    const int pu = ku >= 0 ? ku : kl, pf = kl >= 0 ? kl : ku;
    cl_u32 s_in = cl_iabs(cur[pu * Wb + wb]) + cl_iabs(cur[pf * Wb + wb]);
    if (fl & CL_F_WIDE) {
        const int pu2 = m->nup2[k] >= 0 ? m->nup2[k] : pu, pf2 = m->nlf2[k] >= 0 ? m->nlf2[k] : pf;
        s_in = 2 * s_in + cl_iabs(cur[pu2 * Wb + wb]) + cl_iabs(cur[pf2 * Wb + wb]);
    }
    cl_i32 ctx = m->kc[c * m->K + k] + m->bin[cl_clampf(s_in)];
    if (fl & CL_F_TOP) ctx += hl > 0 ? m->blt[cl_clampf(2 * cl_iabs(top[k * Wb + wb]))] : m->blt[0];
    else if ((fl & CL_F_LT) && wb == 0) ctx += m->blt[hl > 0 ? cl_clampf(2 * cl_iabs(top[k * Wb])) : 0];
    if ((fl & CL_F_CH) && c > 0) ctx += m->bch[cl_clampf(cl_iabs(pv))];
    return (cl_u32)ctx;
}

CL_FN cl_u32 cl_table(const cl_model *m, cl_u32 ctx) {
    return (cl_u32)m->tidx[ctx < (cl_u32)m->nctx ? ctx : 0] * CL_TABB;
}

/* the left-neighbour term of F_LT (wb > 0) */
CL_FN cl_u32 cl_lt_context(const cl_part *P, const cl_i16 *cur, const cl_i16 *top, int hl, int k, int wb) {
    const int Wb = P->Wb;
    cl_u32 s = cl_iabs(cur[k * Wb + wb - 1]);
    s += hl > 0 ? cl_iabs(top[k * Wb + wb]) : cl_iabs(cur[k * Wb + wb - 1]);
    return (cl_u32)P->m->blt[cl_clampf(s)];
}

CL_FN void cl_put(const cl_part *P, cl_i16 *cur, int c, int hb, int k, int wb, cl_i32 v) {
    const cl_i32 s = P->is8 ? (cl_i32)(cl_i8)v : (cl_i32)(cl_i16)v; /* as the output stores it */
    cur[k * P->Wb + wb] = (cl_i16)s;
    cl_store(P->out, cl_at(P, c, hb, k, wb), s, P->is8);
}

/* Serial: the DC plane of block row hl of channel c, from state si on (states xs, ns of them) */
/* (The serial functions work on copies of the part, the model and where the stream stands: kept in registers in the
 * CUDA build, not reloaded from the caller's frame after every store.) */
CL_BIG void cl_dc_row(const cl_part *Pc, cl_i16 *cur, const cl_i16 *top, int c, int hl, cl_io *iop, unsigned si,
                     int ns) {
    cl_model mc = *Pc->m;
    cl_part Pl = *Pc;
    Pl.m = &mc;
    cl_io iol = *iop;
    const cl_part *P = &Pl;
    const cl_model *m = &mc;
    cl_io *io = &iol;
    const int hb = P->h0 + hl, w16 = ns == 16;
    for (int wb = 0; wb < P->Wb; wb++) {
        cl_i32 pred = 0;
        cl_u32 act = 0;
        if (wb > 0 && hl > 0) {
            const cl_i32 L = cur[wb - 1], T = top[wb], TL = top[wb - 1];
            act = cl_iabs(L - TL) + cl_iabs(T - TL);
            pred = (L + T) >> 1;
        } else if (wb > 0) pred = cur[wb - 1];
        else if (hl > 0) pred = top[wb];
        const cl_u32 ctx = (cl_u32)(m->kc[c * m->K] + m->bdc[cl_clampf(act)]);
        const cl_i32 v = cl_sym1(m->tab + cl_table(m, ctx), &P->xs[si], io, 0, 0, 0, w16);
        cl_put(P, cur, c, hb, 0, wb, pred + v);
        si = (si + 1) & (unsigned)(ns - 1);
    }
    *iop = iol;
}

/* Serial: coefficients w0 .. w0 + nw - 1 of AC plane k (a run), from state si on. Mode 0: each in mode 0's order.
 * Mode 2 (the F_LT planes): by groups of the aligned 8 state indices, the tokens, then the sign flips. */
CL_BIG void cl_serial_run(const cl_part *Pc, cl_i16 *cur, const cl_i16 *top, int c, int hl, int k, int w0, int nw,
                         cl_io *iop, unsigned si, int ns) {
    cl_model mc = *Pc->m;
    cl_part Pl = *Pc;
    Pl.m = &mc;
    cl_io iol = *iop;
    const cl_part *P = &Pl;
    const cl_model *m = &mc;
    cl_io *io = &iol;
    const int hb = P->h0 + hl, fl = m->flags, w16 = ns == 16;
    const int use_lt = (fl & CL_F_LT) && !(fl & CL_F_TOP), sflag = (fl & CL_F_SFLIP) && c > 0;
    const cl_u32 flip1 = (cl_u32)m->flipf[c];
    for (int j = 0; j < nw;) {
        const int cnt = w16 && sflag ? (nw - j < 8 - (int)(si & 7u) ? nw - j : 8 - (int)(si & 7u)) : 1;
        const unsigned s0 = si;
        cl_u32 pend = 0; /* lanes of the group whose sign is a flip, decoded after the group's tokens */
        for (int l = 0; l < cnt; l++) {
            const int wb = w0 + j + l;
            const cl_i32 pv = c > 0 ? cl_load(P->out, cl_at(P, c - 1, hb, k, wb), P->is8) : 0;
            cl_u32 ctx = cl_ac_context(P, cur, top, c, hl, k, wb, pv);
            if (use_lt && wb > 0) ctx += cl_lt_context(P, cur, top, hl, k, wb);
            const cl_u8 *e = m->tab + cl_table(m, ctx);
            cl_i32 v;
            if (!w16 || !sflag) v = cl_sym1(e, &P->xs[si], io, pv, sflag, flip1, w16);
            else {
                const cl_u32 t = cl_tok1(e, &P->xs[si], io, w16);
                if (t != 0 && pv != 0) { v = cl_value(t, cl_take_bits(io, t, 0), 0); pend |= 1u << l; }
                else v = cl_value(t, cl_take_bits(io, t, 1), -1);
            }
            cl_put(P, cur, c, hb, k, wb, v);
            si = (si + 1) & (unsigned)(ns - 1);
        }
        for (int l = 0; l < cnt; l++)
            if (pend >> l & 1u) {
                const int wb = w0 + j + l;
                const cl_i32 pv = cl_load(P->out, cl_at(P, c - 1, hb, k, wb), P->is8);
                const cl_u32 neg = (cl_u32)(pv < 0) ^ cl_flip1(&P->xs[(s0 + (unsigned)l) & 15u], io, flip1, w16);
                const cl_i32 mag = cur[k * P->Wb + wb];
                cl_put(P, cur, c, hb, k, wb, neg ? -mag : mag);
            }
        j += cnt;
    }
    *iop = iol;
}

/* ------------------------------------------------------------------ a part, decoded */
/* Status of part `in` (len bytes: a stream of mode 0, 1 or 2) decoded into rows h0 .. h0 + Hs - 1. Its hot path (the
 * lanes' steps) works on local copies of everything it reads (model arrays, shape, where the stream stands), so
 * the CUDA build keeps them in registers: nothing the steps store can alias them. */
CL_BIG int cl_decode_part(cl_part *P, const cl_u8 *in, cl_i64 len) {
    CL_LANE_SETUP;
    const cl_model *m = P->m;
    const int C = P->C, Hb = P->Hb, K = P->K, Wb = P->Wb, h0 = P->h0, Hs = P->Hs, is8 = P->is8, fl = m->flags;
    void *const out = P->out;
    cl_i16 *const rows = P->rows;
    cl_u64 *const xs = P->xs;
    const cl_i32 *const kc = m->kc, *const bin = m->bin, *const blt = m->blt, *const bch = m->bch;
    const cl_i32 *const tidx = m->tidx, *const flipf = m->flipf;
    const cl_u8 *const tab = m->tab;
    const cl_u32 nctx = (cl_u32)m->nctx;
    const cl_i64 total = (cl_i64)C * Hs * K * Wb, plane = (cl_i64)K * Wb;
    if (len < 1) return CL_ST_EMPTY;
    if (total > cl_max_coefficients(len)) return CL_ST_TOO_MANY;
    const int mode = CL_LDG(in);
    if (mode == CL_MODE_RAW) { /* the rows as stored: (c, row, k, wb) */
        const int isz = is8 ? 1 : 2;
        if (len - 1 != total * isz) return CL_ST_RAW_LEN;
        const cl_i64 each = (cl_i64)Hs * plane * isz;
        for (int c = 0; c < C; c++) {
            cl_u8 *dst = (cl_u8 *)out + cl_at(P, c, h0, 0, 0) * isz;
            const cl_u8 *src = in + 1 + c * each;
            CL_LANES_BEGIN
            for (cl_i64 i = ln; i < each; i += 16) dst[i] = CL_LDG(src + i);
            CL_LANES_END
        }
        return CL_OK;
    }
    if (mode != CL_MODE_RANS && mode != CL_MODE_LANES) return CL_ST_HEADER;
    const int w16 = mode == CL_MODE_LANES, ns = w16 ? 16 : 2, sb = w16 ? 4 : 8;
    if (len < 2 + ns * sb) return CL_ST_HEADER;
    CL_SYNC(); /* every lane is done with xs (a previous part's final check) before lane 0 writes it */
    /* the initial states: in the lanes (mode 2) and in xs (mode 0, and the spills of mode 2) */
    int bad = 0;
    for (int s = 0; s < ns; s++) {
        cl_u64 x = 0;
        for (int j = 0; j < sb; j++) x |= (cl_u64)CL_LDG(in + 1 + sb * s + j) << (8 * j);
        if (w16 ? (x < CL_L2 || x >= ((cl_u64)CL_L2 << 16)) : (x < CL_L0 || x >= (CL_L0 << 32))) bad = 1;
        if (CL_IS_LANE0) xs[s] = x;
    }
    if (bad) return CL_ST_STATE;
    cl_i64 p = 1 + (cl_i64)ns * sb;
    cl_u64 nr64 = 0;
    for (int shift = 0;; shift += 7) {
        if (p >= len || shift > 35) return CL_ST_SECLEN;
        const cl_u8 byte = CL_LDG(in + p);
        p++;
        nr64 |= (cl_u64)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
    }
    if (nr64 > (cl_u64)(len - p)) return CL_ST_SECEND;
    /* where the part stands: words wsec[0 .. nr), bits bsec[0 .. blen); ptr bytes and pos bits taken */
    const cl_u8 *const wsec = in + p, *const bsec = in + p + nr64;
    const cl_i64 nr = (cl_i64)nr64, blen = len - p - nr;
    cl_i64 ptr = 0;
    cl_u64 pos = 0;
    int over = 0;
    CL_LANEVAR(cl_u32, x);
    CL_LANES_BEGIN
    LV(x) = 0;
    if (w16) {
        for (int j = 0; j < 4; j++) LV(x) |= (cl_u32)CL_LDG(in + 1 + 4 * ln + j) << (8 * j);
    }
    CL_LANES_END
    CL_SYNC(); /* xs written by lane 0 */
    unsigned si = 0; /* the state of the next coefficient: its index within the part mod ns */
    const int use_lt = (fl & CL_F_LT) && !(fl & CL_F_TOP), use_top = (fl & CL_F_TOP) != 0;
    const int use_wide = (fl & CL_F_WIDE) != 0, use_ch = (fl & CL_F_CH) != 0, sflag_any = (fl & CL_F_SFLIP) != 0;
/* a serial section (lane 0, the states in xs): the lanes' states out before, back after; where the part stands,
 * from lane 0 to all */
#define CL_SERIAL(CALL)                                                                                      \
    do {                                                                                                     \
        if (w16) {                                                                                           \
            CL_LANES_BEGIN                                                                                   \
            xs[ln] = LV(x);                                                                                  \
            CL_LANES_END                                                                                     \
        }                                                                                                    \
        CL_SYNC();                                                                                           \
        if (CL_IS_LANE0) {                                                                                   \
            cl_io io_;                                                                                       \
            io_.w = wsec; io_.bits = bsec; io_.nr = nr; io_.blen = blen;                                     \
            io_.ptr = ptr; io_.pos = pos; io_.over = over;                                                   \
            CALL;                                                                                            \
            ptr = io_.ptr; pos = io_.pos; over = io_.over;                                                   \
        }                                                                                                    \
        CL_SYNC();                                                                                           \
        CL_FROM_LANE0(ptr); CL_FROM_LANE0(pos); CL_FROM_LANE0(over);                                         \
        if (w16) {                                                                                           \
            CL_LANES_BEGIN                                                                                   \
            LV(x) = (cl_u32)xs[ln];                                                                          \
            CL_LANES_END                                                                                     \
        }                                                                                                    \
    } while (0)
#define CL_OVERRUN (over || pos > (cl_u64)blen * 8u)
    int stopped = 0;
    for (int c = 0; c < C && !stopped; c++) {
        const int sflag = sflag_any && c > 0, chctx = use_ch && c > 0;
        const cl_u32 flip1 = (cl_u32)flipf[c], f0 = CL_MTOT - flip1;
        for (int hl = 0; hl < Hs && !stopped; hl++) {
            const int hb = h0 + hl;
            cl_i16 *const cur = rows + (hl & 1) * plane;
            const cl_i16 *const top = rows + ((hl + 1) & 1) * plane;
            if (CL_OVERRUN) { stopped = 1; break; }
            /* the DC plane: lane 0, serial */
            CL_SERIAL(cl_dc_row(P, cur, top, c, hl, &io_, si, ns));
            si = (si + (unsigned)Wb) & (unsigned)(ns - 1);
            for (int k = 1; k < K && !stopped; k++) {
                /* the plane's neighbours (see the CPU's walk) and where its values go */
                const int ku = m->nup[k], kl = m->nlf[k];
                const int pu = ku >= 0 ? ku : kl, pf = kl >= 0 ? kl : ku;
                const int pu2 = m->nup2[k] >= 0 ? m->nup2[k] : pu, pf2 = m->nlf2[k] >= 0 ? m->nlf2[k] : pf;
                const cl_i16 *const cu = cur + pu * Wb, *const cf = cur + pf * Wb;
                const cl_i16 *const cu2 = cur + pu2 * Wb, *const cf2 = cur + pf2 * Wb, *const ct = top + k * Wb;
                cl_i16 *const ck = cur + k * Wb;
                const cl_i64 here = (((cl_i64)c * Hb + hb) * K + k) * Wb, prev = here - (cl_i64)Hb * plane;
                const cl_i32 base = kc[c * K + k] + (use_top && hl == 0 ? blt[0] : 0);
                for (int w0 = 0; w0 < Wb; w0 += CL_DEC_BLOCK) {
                    if (CL_OVERRUN) { stopped = 1; break; }
                    const int nw = Wb - w0 < CL_DEC_BLOCK ? Wb - w0 : CL_DEC_BLOCK;
                    if (!w16 || use_lt) { /* serial: mode 0, or the left neighbour in the context */
                        CL_SERIAL(cl_serial_run(P, cur, top, c, hl, k, w0, nw, &io_, si, ns));
                        si = (si + (unsigned)nw) & (unsigned)(ns - 1);
                        continue;
                    }
                    /* mode 2: steps of the lanes a .. a + cnt - 1 (coefficient i by lane i % 16) */
                    for (int j = 0; j < nw;) {
                        const int a = (int)si, cnt = nw - j < 16 - a ? nw - j : 16 - a;
                        const cl_u32 actm = ((1u << cnt) - 1u) << a;
                        const int wa = w0 + j - a; /* lane l's coefficient: wb = wa + l */
                        CL_LANEVAR(cl_u32, e);
                        CL_LANEVAR(cl_i32, pv);
                        CL_LANEVAR(cl_u32, t);
                        CL_LANEVAR(cl_u32, fli);
                        CL_LANEVAR(cl_u32, need);
                        CL_LANES_BEGIN
                        LV(e) = 0; LV(pv) = 0; LV(t) = 0; LV(fli) = 0;
                        if (actm >> ln & 1u) { /* the context: decoded neighbours only */
                            const int wb = wa + ln;
                            cl_u32 s_in = cl_iabs(cu[wb]) + cl_iabs(cf[wb]);
                            if (use_wide) s_in = 2 * s_in + cl_iabs(cu2[wb]) + cl_iabs(cf2[wb]);
                            cl_i32 ctx = base + bin[cl_clampf(s_in)];
                            if (use_top && hl > 0) ctx += blt[cl_clampf(2 * cl_iabs(ct[wb]))];
                            if (c > 0) LV(pv) = cl_load(out, prev + wb, is8);
                            if (chctx) ctx += bch[cl_clampf(cl_iabs(LV(pv)))];
                            LV(e) = (cl_u32)tidx[(cl_u32)ctx < nctx ? (cl_u32)ctx : 0] * CL_TABB;
                        }
                        CL_LANES_END
                        /* the words: all tokens in lane order; with sign flips, per group of 8 lanes the tokens,
                         * then the flips */
                        for (int g = 0; g < (sflag ? 2 : 1); g++) {
                            const cl_u32 gm = sflag ? actm & (0xFFu << (8 * g)) : actm;
                            if (!gm) continue;
                            for (int ph = 0; ph < (sflag ? 2 : 1); ph++) {
                                cl_u32 wm;
                                CL_LANES_BEGIN
                                LV(need) = 0;
                                if (gm >> ln & 1u) {
                                    const cl_u32 xv = LV(x), slot = xv & CL_MASK;
                                    cl_u32 xn = xv;
                                    if (ph == 0) {
                                        const cl_u8 *tb = tab + LV(e);
                                        const cl_u16 *cum = (const cl_u16 *)tb;
                                        const cl_u32 tt = cl_token(tb, slot), lo = cum[tt];
                                        LV(t) = tt;
                                        xn = ((cl_u32)cum[tt + 1] - lo) * (xv >> CL_SCALE) + slot - lo;
                                        LV(need) = xn < CL_L2;
                                    } else if (LV(t) != 0 && LV(pv) != 0) {
                                        const cl_u32 flip = slot >= f0;
                                        xn = flip ? flip1 * (xv >> CL_SCALE) + slot - f0 : f0 * (xv >> CL_SCALE) + slot;
                                        LV(fli) = 2u | flip;
                                        LV(need) = xn < CL_L2;
                                    }
                                    LV(x) = xn;
                                }
                                CL_LANES_END
                                CL_BALLOT(wm, LV(need));
                                if (wm) {
                                    CL_LANES_BEGIN
                                    if (LV(need)) {
                                        const cl_i64 off = ptr + 2 * (cl_i64)CL_POPC(wm & ((1u << ln) - 1u));
                                        const cl_u32 w = off + 2 <= nr ? (cl_u32)CL_LDG(wsec + off) |
                                                                             ((cl_u32)CL_LDG(wsec + off + 1) << 8)
                                                                       : 0u;
                                        LV(x) = (LV(x) << 16) | w;
                                    }
                                    CL_LANES_END
                                    const cl_i64 taken = 2 * (cl_i64)CL_POPC(wm);
                                    if (ptr + taken > nr) over = 1;
                                    ptr += taken;
                                }
                            }
                        }
                        /* the raw bits: extra bits, then the sign unless it was a flip; lanes in order */
                        CL_LANEVAR(cl_u32, nb);
                        CL_LANEVAR(cl_u32, boff);
                        cl_u32 btotal;
                        CL_LANES_BEGIN
                        LV(nb) = (actm >> ln & 1u) ? cl_ebits(LV(t)) + (LV(t) > 0 && !LV(fli) ? 1u : 0u) : 0u;
                        CL_LANES_END
                        CL_EXSCAN5(boff, nb, btotal);
                        CL_LANES_BEGIN
                        if (actm >> ln & 1u) {
                            const int wb = wa + ln;
                            const cl_u32 n_ = LV(nb);
                            const cl_u32 raw = n_ ? cl_bits_at(bsec, blen, pos + LV(boff)) & ((1u << n_) - 1u) : 0u;
                            const int neg = LV(fli) ? (int)((cl_u32)(LV(pv) < 0) ^ (LV(fli) & 1u)) : -1;
                            const cl_i32 v = cl_value(LV(t), raw, neg);
                            const cl_i32 sv = is8 ? (cl_i32)(cl_i8)v : (cl_i32)(cl_i16)v; /* as stored */
                            ck[wb] = (cl_i16)sv;
                            cl_store(out, here + wb, sv, is8);
                        }
                        CL_LANES_END
                        pos += btotal;
                        CL_SYNC(); /* the row buffer and the output, for the next steps' contexts */
                        j += cnt;
                        si = (si + (unsigned)cnt) & 15u;
                    }
                }
            }
        }
    }
#undef CL_SERIAL
#undef CL_OVERRUN
    if (over) return CL_ST_WORDS;
    if (pos > (cl_u64)blen * 8u) return CL_ST_BITS;
    int clean = ptr == nr;
    if (w16) {
        cl_u32 off_l;
        CL_BALLOT(off_l, LV(x) != CL_L2);
        clean = clean && off_l == 0;
    } else {
        clean = clean && xs[0] == CL_L0 && xs[1] == CL_L0;
    }
    if (!clean) return CL_ST_UNCLEAN;
    if ((pos + 7) / 8 != (cl_u64)blen) return CL_ST_BITLEN;
    return CL_OK;
}

/* ------------------------------------------------------------------ a sample's stream, for one unit */
/* LEB128 at in[*p] (at most 5 bytes, before len): 1 and *v, or 0 (the CPU's get_leb) */
CL_FN int cl_leb(const cl_u8 *in, cl_i64 len, cl_i64 *p, cl_u64 *v) {
    *v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (*p >= len) return 0;
        const cl_u8 byte = CL_LDG(in + *p);
        (*p)++;
        *v |= (cl_u64)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) return 1;
    }
    return 0;
}

/* The status key of unit u (of U) of sample stream `in` (len bytes): 0, or the error of its first failing part:
 * the code, | (1 + segment) << 8 in a mode 3 stream's segments. The units of a sample share its parts (a mode 0, 1
 * or 2 stream: unit 0; mode 3: segments u, u + U, ...); the smallest key of a sample is the CPU decoder's error. */
CL_BIG cl_u32 cl_decode_unit(cl_part *P, const cl_u8 *in, cl_i64 len, int u, int U) {
    const int Hb = P->Hb;
    if (len < 1 || CL_LDG(in) != CL_MODE_SEGMENTS) {
        if (u != 0) return 0;
        P->h0 = 0; P->Hs = Hb;
        return (cl_u32)cl_decode_part(P, in, len);
    }
    if ((cl_i64)P->C * Hb * P->K * P->Wb > cl_max_coefficients(len)) return CL_ST_TOO_MANY;
    cl_i64 p = 1;
    cl_u64 nseg, sum = 0;
    if (!cl_leb(in, len, &p, &nseg) || nseg < 1 || nseg > (cl_u64)Hb) return CL_ST_SEGCOUNT;
    const cl_i64 lens = p;
    for (cl_u64 s = 0; s < nseg; s++) {
        cl_u64 v;
        if (!cl_leb(in, len, &p, &v)) return CL_ST_SEGLEN;
        sum += v;
        if (sum > (cl_u64)(len - p)) return CL_ST_SEGEND;
    }
    if (sum != (cl_u64)(len - p)) return CL_ST_SEGFILL;
    cl_i64 at = p, q = lens;
    for (int s = 0; s < (int)nseg; s++) {
        cl_u64 v;
        cl_leb(in, len, &q, &v); /* read above: it parses */
        if (s % U == u) {
            P->h0 = (int)((cl_i64)s * Hb / (cl_i64)nseg);
            P->Hs = (int)((cl_i64)(s + 1) * Hb / (cl_i64)nseg) - P->h0;
            const int st = v >= 1 && CL_LDG(in + at) == CL_MODE_SEGMENTS ? CL_ST_HEADER
                                                                        : cl_decode_part(P, in + at, (cl_i64)v);
            if (st) return ((cl_u32)(s + 1) << 8) | (cl_u32)st;
        }
        at += (cl_i64)v;
    }
    return 0;
}

/* ------------------------------------------------------------------ the CUDA kernel */
#if defined(__CUDACC__)
#define CL_KEY_NONE 0x7FFFFFFF /* status[] starts at this; the host turns what is left of it into 0 */

/* Samples i of the batch: bytes offsets[i] .. offsets[i + 1] of buf (buflen bytes), into out[i] (C, Hb, K, Wb) of
 * int8 (is8) or int16; units_per_sample half-warps per sample, blockDim.x / 16 units per block. The model blob
 * (bloblen bytes, a multiple of 16) is copied to shared memory when smem_tables, followed there by each unit's
 * row buffers (2 K Wb int16) unless `rows` (global, 2 K Wb int16 per unit of the grid) is given, then its 16
 * spilled states. status[i] (set to CL_KEY_NONE before) takes the smallest key of its sample's units. */
static __device__ __forceinline__ void cl_batch(const cl_u8 *buf, cl_i64 buflen, const cl_i64 *offsets,
                                                int nsamples, const cl_u8 *blob, int bloblen, int smem_tables,
                                                void *out, int C, int Hb, int K, int Wb, int U, cl_i16 *rows,
                                                cl_i32 *status, int is8) {
    extern __shared__ __align__(16) cl_u8 cl_smem[];
    const int upb = (int)(blockDim.x >> 4), lu = (int)(threadIdx.x >> 4), ln = (int)(threadIdx.x & 15u);
    const cl_i64 rowlen = 2ll * K * Wb, rowbytes = ((rowlen * 2 + 15) / 16) * 16;
    const cl_i64 tabbytes = smem_tables ? (cl_i64)bloblen : 0;
    if (smem_tables) { /* 16 bytes a thread, four loads in flight before their stores */
        const uint4 *src = (const uint4 *)blob;
        uint4 *dst = (uint4 *)cl_smem;
        const int n16 = bloblen / 16, step = (int)blockDim.x;
        int i = (int)threadIdx.x;
        for (; i + 3 * step < n16; i += 4 * step) {
            const uint4 a = __ldg(src + i), b = __ldg(src + i + step), c = __ldg(src + i + 2 * step),
                        d = __ldg(src + i + 3 * step);
            dst[i] = a; dst[i + step] = b; dst[i + 2 * step] = c; dst[i + 3 * step] = d;
        }
        for (; i < n16; i += step) dst[i] = __ldg(src + i);
        __syncthreads();
    }
    const cl_i64 unit = (cl_i64)blockIdx.x * upb + lu;
    if (unit >= (cl_i64)nsamples * U) return;
    cl_model mv;
    cl_model_view((const cl_i32 *)(smem_tables ? cl_smem : blob), &mv);
    cl_part P;
    P.m = &mv; P.is8 = is8; P.C = C; P.Hb = Hb; P.K = K; P.Wb = Wb;
    const int i = (int)(unit / U), u = (int)(unit % U);
    P.out = (cl_u8 *)out + (cl_i64)i * C * Hb * K * Wb * (is8 ? 1 : 2);
    P.rows = rows ? rows + unit * rowlen : (cl_i16 *)(cl_smem + tabbytes + lu * rowbytes);
    P.xs = (cl_u64 *)(cl_smem + tabbytes + (rows ? 0 : upb * rowbytes) + lu * 128);
    const cl_i64 o0 = offsets[i], o1 = offsets[i + 1];
    cl_u32 key;
    if (o0 < 0 || o1 < o0 || o1 > buflen) key = CL_ST_OFFSETS;
    else key = cl_decode_unit(&P, buf + o0, o1 - o0, u, U);
    if (key && ln == 0) atomicMin(status + i, (cl_i32)key);
}

extern "C" __global__ void ctxrans_decode_i8(const cl_u8 *buf, cl_i64 buflen, const cl_i64 *offsets, int nsamples,
                                             const cl_u8 *blob, int bloblen, int smem_tables, void *out, int C,
                                             int Hb, int K, int Wb, int U, cl_i16 *rows, cl_i32 *status) {
    cl_batch(buf, buflen, offsets, nsamples, blob, bloblen, smem_tables, out, C, Hb, K, Wb, U, rows, status, 1);
}

extern "C" __global__ void ctxrans_decode_i16(const cl_u8 *buf, cl_i64 buflen, const cl_i64 *offsets, int nsamples,
                                              const cl_u8 *blob, int bloblen, int smem_tables, void *out, int C,
                                              int Hb, int K, int Wb, int U, cl_i16 *rows, cl_i32 *status) {
    cl_batch(buf, buflen, offsets, nsamples, blob, bloblen, smem_tables, out, C, Hb, K, Wb, U, rows, status, 0);
}
#endif /* __CUDACC__ */

#endif /* CTXRANS_LANES_H */
