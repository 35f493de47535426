/* ctxrans_core.h: the C core of the context-modelled rANS coder (no Python): the stored format's constants,
 * the in-memory model, the encoder, the decoder and the fitting helper. ctxrans_core.c defines the format
 * bit for bit; _ctxrans.c is the CPython module around it. */
#ifndef CTXRANS_CORE_H
#define CTXRANS_CORE_H

#include <stddef.h>
#include <stdint.h>

#define SCALE 15
#define MTOT (1u << SCALE)
#define MASK (MTOT - 1)
#define D 12
#define NTOK (D + 17)
#define NCUM (NTOK + 1)
#define NFEAT 1024
#define HDR 6
#define MAGIC 0x43545834
#ifndef LUTB
#define LUTB 8
#endif
#define LUTN (1 << LUTB)
#define CUMB 64 /* cum[NCUM] uint16 padded to one 64-byte line: cum[t] and cum[t + 1] in one line */
#define TABB (CUMB + LUTN) /* bytes per distinct table: cum then lut */
#define TABPAD 4 /* bytes after the last table: the vector decoder reads 4 bytes at any lut entry */

#define MODE_RANS 0
#define MODE_RAW 1
#define MODE_LANES 2
#define MODE_SEGMENTS 3

enum { F_LT = 1, F_CH = 2, F_TOP = 4, F_SFLIP = 8, F_WIDE = 16 };

/* A bucket table (bin, blt, bch: 1024 entries) as the values between its change points, so that the vector
 * context loop computes an entry with compares instead of a gather */
#define MAXSTEPS 16
typedef struct { int n; int32_t at[MAXSTEPS], val[MAXSTEPS + 1]; } steps_t;

/* The model blob parsed (pointers into it; see ctxrans_core.c for its layout) */
typedef struct {
    int C, K, nctx, flags, ntab;
    const int32_t *kc, *nup, *nlf, *nup2, *nlf2, *flipf, *bin, *blt, *bch, *bdc, *tidx;
    const uint8_t *tab; /* ntab * TABB: contexts share tables (tidx[ctx]) */
    steps_t sin, slt, sch; /* bin, blt, bch as steps; vsteps: all three have at most MAXSTEPS */
    int vsteps;
} model_t;

/* Every function below that can fail returns NULL or its error message (a static string); CTX_ENOMEM is the
 * message of an allocation failure. None touches Python: callers may release the GIL around any of them. */
extern const char CTX_ENOMEM[];

void ctx_init(void); /* once, before any other call: token tables and the CPU's vector features */
int ctx_set_simd(int on);   /* the AVX2 decoder of mode 2 on (1) or off (0), or unchanged (-1): the previous setting */
int ctx_set_gather(int on); /* its lookups by gather instruction (1) or scalar loads (0), or unchanged (-1) */

const char *ctx_parse_model(const void *blob, ptrdiff_t len, model_t *m);
const char *ctx_check_shape(const model_t *m, const int dims[5]); /* dims = (B, C, Hb, K, Wb) against the model */
/* The stream of q (dims, itemsize 1 or 2) in `mode` (MODE_RANS, MODE_LANES or MODE_SEGMENTS with nseg segments
 * of block rows; the raw copy when coding would not save) into a malloc'd *out of *outlen bytes, which the caller
 * frees */
const char *ctx_encode(const model_t *m, const void *q, const int dims[5], int itemsize, int mode, int nseg,
                       uint8_t **out, ptrdiff_t *outlen);
/* Per coefficient its context (ctx) and token (tok, as the encoder's: | 0x40 when a sign-flip symbol follows,
 * | 0x80 when the sign flips), and the bits of the bit section (*bits) */
const char *ctx_contexts(const model_t *m, const void *q, const int dims[5], int itemsize, int32_t *ctx, uint8_t *tok,
                         int64_t *bits);
/* The ideal code length of q in 1/256 bits (contexts from the array's top row; `run` block rows of every `every`
 * when the array has 2 * every rows or more, scaled to all): cost[nctx * NTOK] per context and token, fcost[2 * C]
 * per channel a flip symbol's cost (sign the same, sign differs), raw bits and signs added; *top256: what a row
 * costs more without the row above (a segment's top row), on average over the sampled runs' first rows */
const char *ctx_estimate(const model_t *m, const void *q, const int dims[5], int itemsize, const uint16_t *cost,
                         const uint16_t *fcost, int every, int run, uint64_t *bits256, int64_t *top256);
void ctx_decode_setup(model_t *m, const int dims[5]); /* before ctx_decode of arrays of these dims */
/* One stream into `out` (outlen = the array's bytes), never reading outside `in` or writing outside `out`; an
 * error with numbers in it is written to msg (cap bytes) */
const char *ctx_decode(const model_t *m, const uint8_t *in, ptrdiff_t len, void *out, ptrdiff_t outlen,
                       const int dims[5], int itemsize, char *msg, size_t cap);
#define CTX_MSG 200 /* enough for any message of ctx_decode */
/* The most coefficients a stream of len bytes can code (ctx_decode refuses a larger declared shape at once) */
int64_t ctx_max_coefficients(int64_t len);

#endif
