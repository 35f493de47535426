/* _synth: the eager CPU decode kernel, fused (see dctdata/decoder/fused.py for why it is C and what it computes).
 *
 * One pass per group of 8 neighbouring blocks of a block row ("blocks in lanes"): the (Hb, K, Wb) layout
 * keeps frequency k of consecutive blocks contiguous, so a group's coefficients are 8-wide loads.
 *   1. dequantize: y[c, k] = A[c, k] q + D[c, k] + R[c, k] sign(q)       (per channel, any wire dtype)
 *   2. optional C x C mix across channels: y'[c'] = sum_c M[c', c] y[c]
 *      then a per-(sample, channel) affine map y'' = alpha y' + beta [k == 0]
 *      (without a mix, alpha and beta are folded into the tables of step 1 once per sample)
 *   3. separable 8x8 inverse DCT: Z[u][j] = sum_v T[v][j] y[(u, v)], img[i][j] = sum_u T[u][i] Z[u][j]
 *   4. an 8x8 transpose (lanes are blocks, rows must be pixels), cropped stores into out (B, C, H, W) float32;
 *      with `stream`, full 32-byte-aligned rows go out as non-temporal stores (no read-for-ownership of
 *      output lines that would be evicted before anyone reads them).
 * The AVX2+FMA version of steps 3-4 is picked at run time (__builtin_cpu_supports); the portable C one
 * runs anywhere.
 * Volumes (synthesize3): the same steps per group of 8 neighbouring 8x8x8 blocks of a block row (db, hb) of
 * the (Db, Hb, K, Wb) layout; step 3 is the separable 8x8x8 inverse DCT (w, then v, then u), step 4 the
 * transpose and stores of the 64 rows (depth l, row i) the group covers. Every size is checked against the buffers here as well as in Python, so no call that
 * returns without an exception read or wrote outside them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#if defined(__GNUC__) || defined(__clang__)
#include <immintrin.h>
#define SYNTH_X86 1
#endif
#endif

#define LANES 8
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

typedef struct {
    Py_ssize_t B, C, Hb, K, Wb, H, W; /* volumes: Hb counts the block rows Db * Hb3, H is the volume's */
    Py_ssize_t Db, Hb3, depth;         /* volumes only: blocks along D and H, and the depth D */
    int cf, tri, qkind; /* qkind: 0 int8, 1 int16, 2 float32 */
    int stream;         /* non-temporal stores for full, aligned rows */
    const void *q;
    float *out;
    const float *A, *D, *R, *M, *alpha, *beta; /* R, M, alpha, beta may be NULL */
    float T[8][8];                             /* T[u][i]: orthonormal DCT-II rows */
} job_t;

static void load_lanes(const job_t *jb, size_t off, int n, float *x) {
    int l = 0;
    switch (jb->qkind) {
    case 0: for (; l < n; l++) x[l] = (float)((const int8_t *)jb->q)[off + l]; break;
    case 1: for (; l < n; l++) x[l] = (float)((const int16_t *)jb->q)[off + l]; break;
    default: for (; l < n; l++) x[l] = ((const float *)jb->q)[off + l]; break;
    }
    for (; l < LANES; l++) x[l] = 0.0f;
}

/* Step 1 for one group, any lane count: sc (C, K, LANES) float; A/D/R are the tables in force for this sample. */
static void dequantize(const job_t *jb, const float *A, const float *D, const float *R, Py_ssize_t b, Py_ssize_t hb,
                       Py_ssize_t g0, int n, float *sc) {
    const Py_ssize_t C = jb->C, K = jb->K;
    for (Py_ssize_t c = 0; c < C; c++) {
        size_t base = ((((size_t)b * C + c) * jb->Hb + hb) * K) * jb->Wb + g0;
        for (Py_ssize_t k = 0; k < K; k++) {
            float x[LANES];
            load_lanes(jb, base + (size_t)k * jb->Wb, n, x);
            float a = A[c * K + k], d = D[c * K + k];
            float *y = sc + (c * K + k) * LANES;
            if (R) {
                float r = R[c * K + k];
                for (int l = 0; l < LANES; l++) y[l] = a * x[l] + d + r * (float)((x[l] > 0.0f) - (x[l] < 0.0f));
            } else {
                for (int l = 0; l < LANES; l++) y[l] = a * x[l] + d;
            }
        }
    }
}

/* Step 2: mix channels (sc -> mix -> sc) and apply this sample's (alpha, beta). */
static void mix_channels(const job_t *jb, Py_ssize_t b, float *sc, float *mix) {
    const Py_ssize_t C = jb->C, per = jb->K * LANES;
    for (Py_ssize_t co = 0; co < C; co++) {
        float *dst = mix + co * per;
        for (Py_ssize_t e = 0; e < per; e++) dst[e] = 0.0f;
        for (Py_ssize_t c = 0; c < C; c++) {
            float m = jb->M[co * C + c];
            const float *src = sc + c * per;
            for (Py_ssize_t e = 0; e < per; e++) dst[e] += m * src[e];
        }
        if (jb->alpha) {
            float a = jb->alpha[b * C + co], bt = jb->beta[b * C + co];
            for (Py_ssize_t e = 0; e < per; e++) dst[e] *= a;
            for (int l = 0; l < LANES; l++) dst[l] += bt;
        }
    }
    memcpy(sc, mix, sizeof(float) * (size_t)(C * per));
}

static void store_rows(const job_t *jb, float *dst, const float *tile, Py_ssize_t g0, int n) {
    for (int l = 0; l < n; l++) {
        Py_ssize_t col = (g0 + l) * 8, cols = jb->W - col < 8 ? jb->W - col : 8;
        memcpy(dst + l * 8, tile + l * 8, sizeof(float) * (size_t)cols);
    }
}

/* Steps 3-4, portable: X (K, LANES) -> out rows of block row hb, blocks g0 .. g0 + n - 1, channel c. */
static void idct_generic(const job_t *jb, const float *X, Py_ssize_t b, Py_ssize_t c, Py_ssize_t hb, Py_ssize_t g0,
                         int n) {
    float Z[8][8][LANES];
    int k0 = 0;
    for (int u = 0; u < jb->cf; u++) {
        int nv = jb->tri ? jb->cf - u : jb->cf;
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < LANES; l++) Z[u][j][l] = 0.0f;
        for (int v = 0; v < nv; v++) {
            const float *x = X + (k0 + v) * LANES;
            for (int j = 0; j < 8; j++) {
                float t = jb->T[v][j];
                for (int l = 0; l < LANES; l++) Z[u][j][l] += t * x[l];
            }
        }
        k0 += nv;
    }
    Py_ssize_t rows = jb->H - hb * 8 < 8 ? jb->H - hb * 8 : 8;
    for (Py_ssize_t i = 0; i < rows; i++) {
        float img[8][LANES], tile[LANES * 8];
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < LANES; l++) img[j][l] = 0.0f;
        for (int u = 0; u < jb->cf; u++) {
            float t = jb->T[u][i];
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < LANES; l++) img[j][l] += t * Z[u][j][l];
        }
        for (int l = 0; l < LANES; l++)
            for (int j = 0; j < 8; j++) tile[l * 8 + j] = img[j][l];
        store_rows(jb, jb->out + (((size_t)b * jb->C + c) * jb->H + hb * 8 + i) * jb->W + g0 * 8, tile, g0, n);
    }
}

#ifdef SYNTH_X86
__attribute__((target("avx2,fma"))) static inline void transpose8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20); r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20); r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31); r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31); r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* Step 4 for one output row of a group, shared by the 2-D and 3-D kernels: r[l] holds pixel l of every lane;
 * transposed, it is the row's 8 pixels of each of the n blocks from g0 on, stored at dst and cropped to W. */
__attribute__((target("avx2,fma"))) static inline void store_row_avx2(const job_t *jb, float *dst, __m256 *r,
                                                                      Py_ssize_t g0, int n) {
    int full = n == LANES && (g0 + LANES) * 8 <= jb->W;
    transpose8(r);
    if (full && jb->stream && !((uintptr_t)dst & 31)) {
        for (int l = 0; l < LANES; l++) _mm256_stream_ps(dst + l * 8, r[l]);
    } else if (full) {
        for (int l = 0; l < LANES; l++) _mm256_storeu_ps(dst + l * 8, r[l]);
    } else {
        float tile[LANES * 8];
        for (int l = 0; l < LANES; l++) _mm256_storeu_ps(tile + l * 8, r[l]);
        store_rows(jb, dst, tile, g0, n);
    }
}

/* Step 1 for a full group (8 lanes), vectorized: sign-extending loads, one FMA, the dead-zone term as masks. */
__attribute__((target("avx2,fma"))) static void dequantize_avx2(const job_t *jb, const float *A, const float *D,
                                                                const float *R, Py_ssize_t b, Py_ssize_t hb,
                                                                Py_ssize_t g0, float *sc) {
    const Py_ssize_t C = jb->C, K = jb->K;
    const __m256 zero = _mm256_setzero_ps();
    for (Py_ssize_t c = 0; c < C; c++) {
        size_t base = ((((size_t)b * C + c) * jb->Hb + hb) * K) * jb->Wb + g0;
        for (Py_ssize_t k = 0; k < K; k++) {
            size_t off = base + (size_t)k * jb->Wb;
            __m256 x;
            if (jb->qkind == 0) {
                x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)jb->q + off))));
            } else if (jb->qkind == 1) {
                x = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)((const int16_t *)jb->q + off))));
            } else {
                x = _mm256_loadu_ps((const float *)jb->q + off);
            }
            __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(A[c * K + k]), x, _mm256_set1_ps(D[c * K + k]));
            if (R) {
                __m256 r = _mm256_set1_ps(R[c * K + k]);
                __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), r);
                __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), r);
                y = _mm256_add_ps(y, _mm256_sub_ps(pos, neg));
            }
            _mm256_storeu_ps(sc + (c * K + k) * LANES, y);
        }
    }
}

/* Even/odd butterflies on both passes (T[u][7 - i] = (-1)^u T[u][i]): half the FMAs of a plain 8x8 product. */
__attribute__((target("avx2,fma"))) static void idct_avx2(const job_t *jb, const float *X, Py_ssize_t b, Py_ssize_t c,
                                                          Py_ssize_t hb, Py_ssize_t g0, int n) {
    __m256 Z[8][8], img[8][8];
    int k0 = 0;
    for (int u = 0; u < jb->cf; u++) {
        int nv = jb->tri ? jb->cf - u : jb->cf;
        __m256 e[4], o[4];
        for (int j = 0; j < 4; j++) e[j] = o[j] = _mm256_setzero_ps();
        for (int v = 0; v < nv; v += 2) {
            __m256 x = _mm256_loadu_ps(X + (k0 + v) * LANES);
            for (int j = 0; j < 4; j++) e[j] = _mm256_fmadd_ps(_mm256_set1_ps(jb->T[v][j]), x, e[j]);
        }
        for (int v = 1; v < nv; v += 2) {
            __m256 x = _mm256_loadu_ps(X + (k0 + v) * LANES);
            for (int j = 0; j < 4; j++) o[j] = _mm256_fmadd_ps(_mm256_set1_ps(jb->T[v][j]), x, o[j]);
        }
        for (int j = 0; j < 4; j++) {
            Z[u][j] = _mm256_add_ps(e[j], o[j]);
            Z[u][7 - j] = _mm256_sub_ps(e[j], o[j]);
        }
        k0 += nv;
    }
    for (int j0 = 0; j0 < 8; j0 += 4) {
        for (int i = 0; i < 4; i++) {
            __m256 e[4], o[4];
            for (int j = 0; j < 4; j++) e[j] = o[j] = _mm256_setzero_ps();
            for (int u = 0; u < jb->cf; u += 2) {
                __m256 t = _mm256_set1_ps(jb->T[u][i]);
                for (int j = 0; j < 4; j++) e[j] = _mm256_fmadd_ps(t, Z[u][j0 + j], e[j]);
            }
            for (int u = 1; u < jb->cf; u += 2) {
                __m256 t = _mm256_set1_ps(jb->T[u][i]);
                for (int j = 0; j < 4; j++) o[j] = _mm256_fmadd_ps(t, Z[u][j0 + j], o[j]);
            }
            for (int j = 0; j < 4; j++) {
                img[i][j0 + j] = _mm256_add_ps(e[j], o[j]);
                img[7 - i][j0 + j] = _mm256_sub_ps(e[j], o[j]);
            }
        }
    }
    Py_ssize_t rows = jb->H - hb * 8 < 8 ? jb->H - hb * 8 : 8;
    float *dst = jb->out + (((size_t)b * jb->C + c) * jb->H + hb * 8) * jb->W + g0 * 8;
    for (Py_ssize_t i = 0; i < rows; i++, dst += jb->W) store_row_avx2(jb, dst, img[i], g0, n);
}
#endif

typedef void (*idct_fn)(const job_t *, const float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, int);

static int use_avx2(int portable) {
#ifdef SYNTH_X86
    return !portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    (void)portable;
    return 0;
#endif
}

/* The dequantization tables in force for sample b: without a channel mix, its (alpha, beta) are folded into
 * A, D and R (written to eff, 3 C K floats); otherwise the tables as they are. */
static void sample_tables(const job_t *jb, Py_ssize_t b, float *eff, const float **A, const float **D,
                          const float **R) {
    const Py_ssize_t C = jb->C, K = jb->K;
    if (!jb->alpha || jb->M) return;
    float *ea = eff, *ed = eff + C * K, *er = eff + 2 * C * K;
    for (Py_ssize_t c = 0; c < C; c++) {
        float a = jb->alpha[b * C + c], bt = jb->beta[b * C + c];
        for (Py_ssize_t k = 0; k < K; k++) {
            ea[c * K + k] = a * jb->A[c * K + k];
            ed[c * K + k] = a * jb->D[c * K + k] + (k == 0 ? bt : 0.0f);
            er[c * K + k] = jb->R ? a * jb->R[c * K + k] : 0.0f;
        }
    }
    *A = ea, *D = ed, *R = jb->R ? er : NULL;
}

/* Steps 1-2 for one group of block row hb (volumes: of the (Db * Hb3, K, Wb) view): sc (C, K, LANES) receives
 * its dequantized, mixed coefficients. */
static void group_coefficients(const job_t *jb, int avx2, const float *A, const float *D, const float *R,
                               Py_ssize_t b, Py_ssize_t hb, Py_ssize_t g0, int n, float *sc, float *mix) {
#ifdef SYNTH_X86
    if (avx2 && n == LANES) dequantize_avx2(jb, A, D, R, b, hb, g0, sc);
    else
#endif
        dequantize(jb, A, D, R, b, hb, g0, n, sc);
    if (jb->M) mix_channels(jb, b, sc, mix);
}



/* ------------------------------------------------------------------ volumes: 8x8x8 blocks
 * X (K, LANES): the dequantized coefficients of one channel of a group, kept frequencies (u, v, w) in
 * row-major order (tetra: w < cf - u - v within row (u, v), and v < cf - u). Stage 1 contracts w into
 * Z1[u][v][j], stage 2 v into Z2[u][i][j], stage 3 u into the voxels [l][i][j]; rows (l, i) are cropped to
 * the volume and stored. */
static inline float *row3(const job_t *jb, Py_ssize_t b, Py_ssize_t c, Py_ssize_t d, Py_ssize_t h, Py_ssize_t g0) {
    return jb->out + ((((size_t)b * jb->C + c) * jb->depth + d) * jb->H + h) * jb->W + g0 * 8;
}

static void idct3_generic(const job_t *jb, const float *X, Py_ssize_t b, Py_ssize_t c, Py_ssize_t db, Py_ssize_t hb,
                          Py_ssize_t g0, int n) {
    static float zero[LANES];
    float Z1[8][8][8][LANES], Z2[8][8][8][LANES];
    const int cf = jb->cf;
    int k0 = 0;
    for (int u = 0; u < cf; u++) {
        int nv = jb->tri ? cf - u : cf;
        for (int v = 0; v < nv; v++) {
            int nw = jb->tri ? cf - u - v : cf;
            for (int j = 0; j < 8; j++) {
                float *z = Z1[u][v][j];
                memcpy(z, zero, sizeof zero);
                for (int w = 0; w < nw; w++) {
                    float t = jb->T[w][j];
                    const float *x = X + (k0 + w) * LANES;
                    for (int l = 0; l < LANES; l++) z[l] += t * x[l];
                }
            }
            k0 += nw;
        }
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) {
                float *z = Z2[u][i][j];
                memcpy(z, zero, sizeof zero);
                for (int v = 0; v < nv; v++) {
                    float t = jb->T[v][i];
                    for (int l = 0; l < LANES; l++) z[l] += t * Z1[u][v][j][l];
                }
            }
    }
    Py_ssize_t depth = jb->depth - db * 8 < 8 ? jb->depth - db * 8 : 8, rows = jb->H - hb * 8 < 8 ? jb->H - hb * 8 : 8;
    for (Py_ssize_t dl = 0; dl < depth; dl++)
        for (Py_ssize_t i = 0; i < rows; i++) {
            float tile[LANES * 8];
            for (int j = 0; j < 8; j++) {
                float acc[LANES];
                memcpy(acc, zero, sizeof zero);
                for (int u = 0; u < cf; u++) {
                    float t = jb->T[u][dl];
                    for (int l = 0; l < LANES; l++) acc[l] += t * Z2[u][i][j][l];
                }
                for (int l = 0; l < LANES; l++) tile[l * 8 + j] = acc[l];
            }
            store_rows(jb, row3(jb, b, c, db * 8 + dl, hb * 8 + i, g0), tile, g0, n);
        }
}

#ifdef SYNTH_X86
/* One even/odd butterfly pass: out[o] = sum_s T[s][o] in[s * stride] for o in 0..7 and s < ns, with
 * T[s][7 - o] = (-1)^s T[s][o] (half the FMAs of a plain product). */
__attribute__((target("avx2,fma"))) static inline void butterfly8(const float T[8][8], const __m256 *in, int stride,
                                                                  int ns, __m256 *out, int ostride) {
    __m256 e[4], o[4];
    for (int j = 0; j < 4; j++) e[j] = o[j] = _mm256_setzero_ps();
    for (int s = 0; s < ns; s += 2) {
        __m256 x = in[s * stride];
        for (int j = 0; j < 4; j++) e[j] = _mm256_fmadd_ps(_mm256_set1_ps(T[s][j]), x, e[j]);
    }
    for (int s = 1; s < ns; s += 2) {
        __m256 x = in[s * stride];
        for (int j = 0; j < 4; j++) o[j] = _mm256_fmadd_ps(_mm256_set1_ps(T[s][j]), x, o[j]);
    }
    for (int j = 0; j < 4; j++) {
        out[j * ostride] = _mm256_add_ps(e[j], o[j]);
        out[(7 - j) * ostride] = _mm256_sub_ps(e[j], o[j]);
    }
}

__attribute__((target("avx2,fma"))) static void idct3_avx2(const job_t *jb, const float *X, Py_ssize_t b, Py_ssize_t c,
                                                           Py_ssize_t db, Py_ssize_t hb, Py_ssize_t g0, int n) {
    __m256 Z1[8][8][8], Z2[8][8][8], img[8][8][8]; /* [u][v][j], [u][i][j], [l][i][j] */
    __m256 in[8];
    const int cf = jb->cf;
    int k0 = 0;
    for (int u = 0; u < cf; u++) {
        int nv = jb->tri ? cf - u : cf;
        for (int v = 0; v < nv; v++) {
            int nw = jb->tri ? cf - u - v : cf;
            for (int w = 0; w < nw; w++) in[w] = _mm256_loadu_ps(X + (k0 + w) * LANES);
            butterfly8(jb->T, in, 1, nw, Z1[u][v], 1);
            k0 += nw;
        }
        for (int j = 0; j < 8; j++) butterfly8(jb->T, &Z1[u][0][j], 8, nv, &Z2[u][0][j], 8);
    }
    Py_ssize_t depth = jb->depth - db * 8 < 8 ? jb->depth - db * 8 : 8, rows = jb->H - hb * 8 < 8 ? jb->H - hb * 8 : 8;
    for (Py_ssize_t i = 0; i < rows; i++)
        for (int j = 0; j < 8; j++) butterfly8(jb->T, &Z2[0][i][j], 64, cf, &img[0][i][j], 64);
    for (Py_ssize_t dl = 0; dl < depth; dl++)
        for (Py_ssize_t i = 0; i < rows; i++)
            store_row_avx2(jb, row3(jb, b, c, db * 8 + dl, hb * 8 + i, g0), img[dl][i], g0, n);
}
#endif

typedef void (*idct3_fn)(const job_t *, const float *, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t, Py_ssize_t,
                         int);

/* The driver of both kernels: per sample its tables, per block row (volumes: (db, hb) of the (Db * Hb3, K, Wb)
 * view) and group of 8 blocks steps 1-2, then steps 3-4 per channel. */
static void run(const job_t *jb, int volume, int avx2, float *sc, float *mix, float *eff) {
    idct_fn idct = idct_generic;
    idct3_fn idct3 = idct3_generic;
#ifdef SYNTH_X86
    if (avx2) idct = idct_avx2, idct3 = idct3_avx2;
#endif
    const Py_ssize_t C = jb->C, K = jb->K, groups = (jb->Wb + LANES - 1) / LANES;
    for (Py_ssize_t b = 0; b < jb->B; b++) {
        const float *A = jb->A, *D = jb->D, *R = jb->R;
        sample_tables(jb, b, eff, &A, &D, &R);
        for (Py_ssize_t r = 0; r < jb->Hb; r++) {
            for (Py_ssize_t g = 0; g < groups; g++) {
                Py_ssize_t g0 = g * LANES;
                int n = jb->Wb - g0 < LANES ? (int)(jb->Wb - g0) : LANES;
                group_coefficients(jb, avx2, A, D, R, b, r, g0, n, sc, mix);
                for (Py_ssize_t c = 0; c < C; c++) {
                    if (volume) idct3(jb, sc + c * K * LANES, b, c, r / jb->Hb3, r % jb->Hb3, g0, n);
                    else idct(jb, sc + c * K * LANES, b, c, r, g0, n);
                }
            }
        }
    }
}

/* Ask for transparent huge pages on the 2 MB-aligned interior of a fresh (untouched) output: one fault per
 * 2 MB instead of one per 4 KB page. Advice only: where THP is off or unsupported nothing changes. */
static void advise_hugepages(void *buf, Py_ssize_t len) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = ((uintptr_t)buf + huge - 1) & ~(huge - 1), end = ((uintptr_t)buf + (uintptr_t)len) & ~(huge - 1);
    if (end > start) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)buf, (void)len;
#endif
}

static int optional_floats(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name) {
    view->obj = NULL;
    if (obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len != count * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "_synth: %s holds %zd bytes, expected %zd", name, view->len,
                     count * (Py_ssize_t)sizeof(float));
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 1;
}

static int mul_ok(Py_ssize_t *acc, Py_ssize_t f) {
    if (f < 0 || (f > 0 && *acc > PY_SSIZE_T_MAX / f)) return 0;
    *acc *= f;
    return 1;
}

/* synthesize(q, qkind, out, (B, C, Hb, K, Wb, H, W), cf, triangle, A, D, R, M, alpha, beta, portable, stream,
 * fresh): fresh says out has never been written (huge pages are asked for).
 * synthesize3(q, qkind, out, (B, C, Db, Hb, K, Wb, D, H, W), cf, tetra, ...): the same for volumes. */
static PyObject *synthesize_any(PyObject *args, int volume) {
    PyObject *qobj, *oobj, *robj, *mobj, *aobj, *bobj;
    Py_buffer qb = {0}, ob = {0}, ab = {0}, db = {0}, rb = {0}, mb = {0}, alb = {0}, beb = {0};
    job_t jb;
    int portable = 0, stream = 0, fresh = 0, ok;
    memset(&jb, 0, sizeof jb);
    if (volume)
        ok = PyArg_ParseTuple(args, "OiO(nnnnnnnnn)iiy*y*OOOO|ppp", &qobj, &jb.qkind, &oobj, &jb.B, &jb.C, &jb.Db,
                              &jb.Hb3, &jb.K, &jb.Wb, &jb.depth, &jb.H, &jb.W, &jb.cf, &jb.tri, &ab, &db, &robj, &mobj,
                              &aobj, &bobj, &portable, &stream, &fresh);
    else
        ok = PyArg_ParseTuple(args, "OiO(nnnnnnn)iiy*y*OOOO|ppp", &qobj, &jb.qkind, &oobj, &jb.B, &jb.C, &jb.Hb, &jb.K,
                              &jb.Wb, &jb.H, &jb.W, &jb.cf, &jb.tri, &ab, &db, &robj, &mobj, &aobj, &bobj, &portable,
                              &stream, &fresh);
    if (!ok) return NULL;
    PyObject *res = NULL;
    float *scratch = NULL;
    const char *err = NULL;
    int kept = 0, cf = jb.cf;
    if (cf >= 1 && cf <= 8) {
        if (volume) kept = jb.tri ? cf * (cf + 1) * (cf + 2) / 6 : cf * cf * cf;
        else kept = jb.tri ? cf * (cf + 1) / 2 : cf * cf;
    }
    if (volume) { /* a volume's block rows are the (Db * Hb, K, Wb) view's rows */
        if (jb.depth < 1 || jb.H < 1 || jb.Db != (jb.depth + 7) / 8 || jb.Hb3 != (jb.H + 7) / 8)
            err = "_synth: shape (B, C, Db, Hb, K, Wb, D, H, W) is inconsistent";
        else if (jb.Hb = jb.Db, !mul_ok(&jb.Hb, jb.Hb3)) err = "_synth: shape too large";
    }
    if (err) {
    } else if (jb.qkind < 0 || jb.qkind > 2) err = "_synth: qkind must be 0 (int8), 1 (int16) or 2 (float32)";
    else if (!kept) err = "_synth: cf must be in 1..8";
    else if (jb.B < 0 || jb.C < 1 || jb.H < 1 || jb.W < 1 || jb.K != kept || (!volume && jb.Hb != (jb.H + 7) / 8) ||
             jb.Wb != (jb.W + 7) / 8)
        err = volume ? "_synth: shape (B, C, Db, Hb, K, Wb, D, H, W) is inconsistent"
                     : "_synth: shape (B, C, Hb, K, Wb, H, W) is inconsistent";
    if (err) goto done;
    if (PyObject_GetBuffer(qobj, &qb, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(oobj, &ob, PyBUF_WRITABLE) < 0) goto done;
    {
        static const int item[3] = {1, 2, 4};
        Py_ssize_t nq = item[jb.qkind], no = sizeof(float), ck = jb.C;
        if (!(mul_ok(&nq, jb.B) && mul_ok(&nq, jb.C) && mul_ok(&nq, jb.Hb) && mul_ok(&nq, jb.K) && mul_ok(&nq, jb.Wb) &&
              mul_ok(&no, jb.B) && mul_ok(&no, jb.C) && mul_ok(&no, volume ? jb.depth : 1) && mul_ok(&no, jb.H) &&
              mul_ok(&no, jb.W) && mul_ok(&ck, jb.K))) {
            err = "_synth: shape too large";
            goto done;
        }
        if (qb.len != nq || ob.len != no) {
            err = "_synth: coefficient or output buffer size does not match the shape";
            goto done;
        }
        if (ab.len != ck * (Py_ssize_t)sizeof(float) || db.len != ck * (Py_ssize_t)sizeof(float)) {
            err = "_synth: tables A and D must hold C * K float32";
            goto done;
        }
        if (optional_floats(robj, &rb, ck, "R") < 0 || optional_floats(mobj, &mb, jb.C * jb.C, "M") < 0 ||
            optional_floats(aobj, &alb, jb.B * jb.C, "alpha") < 0 || optional_floats(bobj, &beb, jb.B * jb.C, "beta") < 0)
            goto done;
        if ((alb.obj == NULL) != (beb.obj == NULL)) {
            err = "_synth: alpha and beta come together";
            goto done;
        }
        jb.q = qb.buf, jb.out = ob.buf, jb.A = ab.buf, jb.D = db.buf;
        jb.R = rb.obj ? rb.buf : NULL, jb.M = mb.obj ? mb.buf : NULL;
        jb.alpha = alb.obj ? alb.buf : NULL, jb.beta = beb.obj ? beb.buf : NULL;
        for (int u = 0; u < 8; u++)
            for (int i = 0; i < 8; i++)
                jb.T[u][i] = (float)(u == 0 ? sqrt(0.125) : 0.5 * cos(M_PI * (2 * i + 1) * u / 16.0));
        size_t per = (size_t)ck * LANES;
        scratch = malloc(sizeof(float) * (2 * per + 3 * (size_t)ck));
        if (!scratch) {
            PyErr_NoMemory();
            goto done;
        }
        int avx2 = use_avx2(portable);
        jb.stream = stream;
        if (fresh) advise_hugepages(ob.buf, ob.len);
        Py_BEGIN_ALLOW_THREADS
        run(&jb, volume, avx2, scratch, scratch + per, scratch + 2 * per);
        Py_END_ALLOW_THREADS
#ifdef SYNTH_X86
        if (jb.stream) _mm_sfence();
#endif
    }
    res = Py_None;
    Py_INCREF(res);
done:
    if (err) PyErr_SetString(PyExc_ValueError, err);
    free(scratch);
    PyBuffer_Release(&ab);
    PyBuffer_Release(&db);
    if (qb.obj) PyBuffer_Release(&qb);
    if (ob.obj) PyBuffer_Release(&ob);
    if (rb.obj) PyBuffer_Release(&rb);
    if (mb.obj) PyBuffer_Release(&mb);
    if (alb.obj) PyBuffer_Release(&alb);
    if (beb.obj) PyBuffer_Release(&beb);
    return res;
}

static PyObject *py_synthesize(PyObject *self, PyObject *args) { return synthesize_any(args, 0); }

static PyObject *py_synthesize3(PyObject *self, PyObject *args) { return synthesize_any(args, 1); }

static PyObject *py_vector_isa(PyObject *self, PyObject *args) {
    return PyUnicode_FromString(use_avx2(0) ? "avx2+fma" : "portable");
}

static PyMethodDef methods[] = {
    {"synthesize", py_synthesize, METH_VARARGS,
     "synthesize(q, qkind, out, (B, C, Hb, K, Wb, H, W), cf, triangle, A, D, R, M, alpha, beta, portable=False, "
     "stream=False, fresh=False)"},
    {"synthesize3", py_synthesize3, METH_VARARGS,
     "synthesize3(q, qkind, out, (B, C, Db, Hb, K, Wb, D, H, W), cf, tetra, A, D, R, M, alpha, beta, portable=False, "
     "stream=False, fresh=False): the volume decode"},
    {"vector_isa", py_vector_isa, METH_NOARGS, "the instruction set the kernel runs with here"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_synth", "fused dequantize + 8x8 (8x8x8) inverse DCT", -1, methods};

PyMODINIT_FUNC PyInit__synth(void) { return PyModule_Create(&moddef); }
