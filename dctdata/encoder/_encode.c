/* The encode's elementwise passes in one C loop each (dctdata/encoder/encode_kernels.py says why and when):
 *
 *   normalize(x, rng, mid, out, n): out[i, j] = (float)(((double)x[i, j] - mid[i]) / rng[i]) per item i of n values,
 *       the float64 arithmetic of `quantize.normalize` (IEEE-754 subtraction and division, then one rounding to
 *       float32), so the bits are the torch path's.
 *   quantize(c, qkind, out, over, (L, C, R, K, Wb), offsets, steps, theta): per value of c (L, C, R, K, Wb) float32,
 *       v = (c - offsets[ch, k]) / steps[ch, k] in float32, q = rint(v) (ties to even), or with a dead zone
 *       (theta >= 0) sign(v) floor(|v| + theta); values past the integer range counted per leading index in
 *       over (int64, L) and clamped; stored as int8 (qkind 0) or int16 (qkind 1). Returns the number of
 *       non-finite values (nothing is written where there are any: the caller raises).
 *   figures(ref, est, n, sse, lo, hi, peak): per item i of n float32 values, the pack's error figures in one pass:
 *       sse[i] = sum of ((double)est - (double)ref)^2, peak[i] = the largest of those squares (float64), lo[i] and
 *       hi[i] the extremes of ref (float32, exact). The squares and extremes are `metrics.item_figures`' own
 *       values; the sum is float64 in another order than torch's (its last bits may differ). Returns the
 *       number of non-finite values seen (the caller then takes the torch path, which propagates them).
 *
 * All are single-threaded, release the GIL, and are compiled twice: portable C and an AVX2 version the
 * compiler vectorizes, picked at run time. No -ffast-math: every operation is the IEEE one torch runs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENC_X86 1
#define AVX2_TARGET __attribute__((target("avx2")))
#else
#define AVX2_TARGET
#endif

#define NORMALIZE_BODY                                                                                                 \
    for (Py_ssize_t i = 0; i < items; i++) {                                                                          \
        const double r = (double)rng[i], m = (double)mid[i];                                                          \
        const float *xi = x + i * n;                                                                                  \
        float *oi = out + i * n;                                                                                      \
        for (Py_ssize_t j = 0; j < n; j++) oi[j] = (float)(((double)xi[j] - m) / r);                                 \
    }

static void normalize_c(const float *x, const float *rng, const float *mid, float *out, Py_ssize_t items, Py_ssize_t n) {
    NORMALIZE_BODY
}

#ifdef ENC_X86
AVX2_TARGET static void normalize_avx2(const float *x, const float *rng, const float *mid, float *out, Py_ssize_t items,
                                       Py_ssize_t n) {
    NORMALIZE_BODY
}
#endif

/* One block row (Wb values of one kept frequency): the quantized values and the count past [lo, hi]. A missing
 * offset is 0 and a missing step 1: v - 0 and v / 1 are v exactly, so one loop serves every table. */
#define QUANT_ROW(T, ROUND)                                                                                            \
    {                                                                                                                  \
        int64_t bad = 0;                                                                                               \
        T *d = (T *)dst;                                                                                               \
        for (Py_ssize_t j = 0; j < wb; j++) {                                                                          \
            const float v = (src[j] - off) / step;                                                                     \
            float r = ROUND;                                                                                           \
            bad += (r < lo) | (r > hi);                                                                                \
            r = r < lo ? lo : (r > hi ? hi : r);                                                                       \
            d[j] = (T)r;                                                                                               \
        }                                                                                                              \
        *count += bad;                                                                                                 \
    }
/* sign(v) floor(|v| + theta): v = 0 gives floor(theta) = 0 either way */
#define DEAD copysignf(floorf(fabsf(v) + th), v)
#define NEAREST rintf(v)

typedef struct {
    const float *c, *offsets, *steps;
    void *out;
    int64_t *over;
    Py_ssize_t L, C, R, K, Wb;
    int qkind, dead;
    float theta;
} qjob_t;

#define QUANTIZE_BODY                                                                                                  \
    const Py_ssize_t wb = j->Wb;                                                                                      \
    const int has_off = j->offsets != NULL, has_step = j->steps != NULL, dead = j->dead;                              \
    const float th = j->theta;                                                                                         \
    const float lo = j->qkind == 0 ? -128.0f : -32768.0f, hi = j->qkind == 0 ? 127.0f : 32767.0f;                     \
    const size_t item = j->qkind == 0 ? 1 : 2;                                                                         \
    const float *src = j->c;                                                                                           \
    char *dst = (char *)j->out;                                                                                        \
    for (Py_ssize_t l = 0; l < j->L; l++) {                                                                            \
        int64_t *count = j->over + l;                                                                                  \
        *count = 0;                                                                                                    \
        for (Py_ssize_t ch = 0; ch < j->C; ch++)                                                                       \
            for (Py_ssize_t r = 0; r < j->R; r++)                                                                      \
                for (Py_ssize_t k = 0; k < j->K; k++) {                                                                \
                    const float off = has_off ? j->offsets[ch * j->K + k] : 0.0f;                                      \
                    const float step = has_step ? j->steps[ch * j->K + k] : 1.0f;                                      \
                    if (item == 1) {                                                                           \
                        if (dead) QUANT_ROW(int8_t, DEAD) else QUANT_ROW(int8_t, NEAREST)                              \
                    } else {                                                                                           \
                        if (dead) QUANT_ROW(int16_t, DEAD) else QUANT_ROW(int16_t, NEAREST)                            \
                    }                                                                                                  \
                    src += wb;                                                                                         \
                    dst += wb * item;                                                                                  \
                }                                                                                                      \
    }

static void quantize_c(const qjob_t *j) { QUANTIZE_BODY }

#ifdef ENC_X86
AVX2_TARGET static void quantize_avx2(const qjob_t *j) { QUANTIZE_BODY }
#endif

/* 8 partial sums (a float64 reduction the compiler may vectorize without reordering a single sum) */
#define FIGURES_BODY                                                                                                   \
    Py_ssize_t bad = 0;                                                                                                \
    for (Py_ssize_t i = 0; i < items; i++) {                                                                           \
        const float *r = ref + i * n, *e = est + i * n;                                                               \
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, top[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                  \
        float l = r[0], h = r[0];                                                                                      \
        Py_ssize_t j = 0;                                                                                              \
        for (; j + 8 <= n; j += 8)                                                                                     \
            for (int k = 0; k < 8; k++) {                                                                              \
                const double d = (double)e[j + k] - (double)r[j + k], d2 = d * d;                                      \
                acc[k] += d2;                                                                                          \
                top[k] = d2 > top[k] ? d2 : top[k];                                                                    \
                l = r[j + k] < l ? r[j + k] : l;                                                                       \
                h = r[j + k] > h ? r[j + k] : h;                                                                       \
            }                                                                                                          \
        for (; j < n; j++) {                                                                                           \
            const double d = (double)e[j] - (double)r[j], d2 = d * d;                                                  \
            acc[0] += d2;                                                                                              \
            top[0] = d2 > top[0] ? d2 : top[0];                                                                        \
            l = r[j] < l ? r[j] : l;                                                                                   \
            h = r[j] > h ? r[j] : h;                                                                                   \
        }                                                                                                              \
        double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));                 \
        double m = top[0];                                                                                             \
        for (int k = 1; k < 8; k++) m = top[k] > m ? top[k] : m;                                                       \
        if (!isfinite(s) || !isfinite(l) || !isfinite(h)) bad++; /* NaN/Inf in ref or est: the caller's torch path */ \
        sse[i] = s, peak[i] = m, lo[i] = l, hi[i] = h;                                                                 \
    }

static Py_ssize_t figures_c(const float *ref, const float *est, double *sse, float *lo, float *hi, double *peak,
                            Py_ssize_t items, Py_ssize_t n) {
    FIGURES_BODY
    return bad;
}

#ifdef ENC_X86
AVX2_TARGET static Py_ssize_t figures_avx2(const float *ref, const float *est, double *sse, float *lo, float *hi,
                                           double *peak, Py_ssize_t items, Py_ssize_t n) {
    FIGURES_BODY
    return bad;
}
#endif

static int use_avx2(void) {
#ifdef ENC_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static Py_ssize_t count_nonfinite(const float *x, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}

static int get_floats(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name, int writable) {
    view->obj = NULL;
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    if (view->len != count * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError, "_encode: %s holds %zd bytes, expected %zd", name, view->len,
                     count * (Py_ssize_t)sizeof(float));
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

static void release(Py_buffer *v) {
    if (v->obj) PyBuffer_Release(v);
    v->obj = NULL;
}

/* normalize(x, rng, mid, out, n) */
static PyObject *py_normalize(PyObject *self, PyObject *args) {
    PyObject *xo, *ro, *mo, *oo;
    Py_ssize_t n;
    Py_buffer xb = {0}, rb = {0}, mb = {0}, ob = {0};
    if (!PyArg_ParseTuple(args, "OOOOn", &xo, &ro, &mo, &oo, &n)) return NULL;
    PyObject *res = NULL;
    if (PyObject_GetBuffer(xo, &xb, PyBUF_SIMPLE) < 0) goto done;
    if (n < 1 || xb.len % ((Py_ssize_t)sizeof(float) * n)) {
        PyErr_SetString(PyExc_ValueError, "_encode: x must hold whole items of n float32");
        goto done;
    }
    Py_ssize_t items = xb.len / (Py_ssize_t)sizeof(float) / n;
    if (get_floats(ro, &rb, items, "rng", 0) < 0 || get_floats(mo, &mb, items, "mid", 0) < 0 ||
        get_floats(oo, &ob, items * n, "out", 1) < 0)
        goto done;
    {
        const float *x = xb.buf, *r = rb.buf, *m = mb.buf;
        float *o = ob.buf;
        int avx2 = use_avx2();
        Py_BEGIN_ALLOW_THREADS
#ifdef ENC_X86
        if (avx2) normalize_avx2(x, r, m, o, items, n);
        else
#endif
            normalize_c(x, r, m, o, items, n);
        (void)avx2;
        Py_END_ALLOW_THREADS
    }
    res = Py_None;
    Py_INCREF(res);
done:
    release(&xb), release(&rb), release(&mb), release(&ob);
    return res;
}

/* quantize(c, qkind, out, over, (L, C, R, K, Wb), offsets, steps, theta) -> non-finite count */
static PyObject *py_quantize(PyObject *self, PyObject *args) {
    PyObject *co, *oo, *vo, *offo, *stepo;
    double theta;
    qjob_t j;
    Py_buffer cb = {0}, ob = {0}, vb = {0}, fb = {0}, sb = {0};
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTuple(args, "OiOO(nnnnn)OOd", &co, &j.qkind, &oo, &vo, &j.L, &j.C, &j.R, &j.K, &j.Wb, &offo,
                          &stepo, &theta))
        return NULL;
    PyObject *res = NULL;
    if (j.qkind != 0 && j.qkind != 1) {
        PyErr_SetString(PyExc_ValueError, "_encode: qkind must be 0 (int8) or 1 (int16)");
        return NULL;
    }
    if (j.L < 0 || j.C < 1 || j.R < 0 || j.K < 1 || j.Wb < 0) {
        PyErr_SetString(PyExc_ValueError, "_encode: shape (L, C, R, K, Wb) is inconsistent");
        return NULL;
    }
    Py_ssize_t n = j.L;
    Py_ssize_t dims[4] = {j.C, j.R, j.K, j.Wb};
    for (int d = 0; d < 4; d++) {
        if (dims[d] && n > PY_SSIZE_T_MAX / 4 / dims[d]) {
            PyErr_SetString(PyExc_ValueError, "_encode: shape too large");
            return NULL;
        }
        n *= dims[d];
    }
    if (get_floats(co, &cb, n, "c", 0) < 0) goto done;
    if (PyObject_GetBuffer(oo, &ob, PyBUF_WRITABLE) < 0) goto done;
    if (ob.len != n * (j.qkind == 0 ? 1 : 2)) {
        PyErr_SetString(PyExc_ValueError, "_encode: out does not match the shape and qkind");
        goto done;
    }
    if (PyObject_GetBuffer(vo, &vb, PyBUF_WRITABLE) < 0) goto done;
    if (vb.len != j.L * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "_encode: over must hold L int64");
        goto done;
    }
    if (offo != Py_None && get_floats(offo, &fb, j.C * j.K, "offsets", 0) < 0) goto done;
    if (stepo != Py_None && get_floats(stepo, &sb, j.C * j.K, "steps", 0) < 0) goto done;
    j.c = cb.buf, j.out = ob.buf, j.over = vb.buf;
    j.offsets = fb.obj ? fb.buf : NULL, j.steps = sb.obj ? sb.buf : NULL;
    j.dead = theta >= 0.0, j.theta = (float)theta;
    Py_ssize_t bad;
    {
        int avx2 = use_avx2();
        Py_BEGIN_ALLOW_THREADS
        bad = count_nonfinite(j.c, n);
        if (!bad) {
#ifdef ENC_X86
            if (avx2) quantize_avx2(&j);
            else
#endif
                quantize_c(&j);
        }
        (void)avx2;
        Py_END_ALLOW_THREADS
    }
    res = PyLong_FromSsize_t(bad);
done:
    release(&cb), release(&ob), release(&vb), release(&fb), release(&sb);
    return res;
}

static int get_doubles(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name) {
    view->obj = NULL;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0) return -1;
    if (view->len != count * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "_encode: %s holds %zd bytes, expected %zd", name, view->len,
                     count * (Py_ssize_t)sizeof(double));
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

/* figures(ref, est, n, sse, lo, hi, peak) -> non-finite count */
static PyObject *py_figures(PyObject *self, PyObject *args) {
    PyObject *ro, *eo, *so, *lo, *ho, *po;
    Py_ssize_t n;
    Py_buffer rb = {0}, eb = {0}, sb = {0}, lb = {0}, hb = {0}, pb = {0};
    if (!PyArg_ParseTuple(args, "OOnOOOO", &ro, &eo, &n, &so, &lo, &ho, &po)) return NULL;
    PyObject *res = NULL;
    if (PyObject_GetBuffer(ro, &rb, PyBUF_SIMPLE) < 0) goto done;
    if (n < 1 || rb.len % ((Py_ssize_t)sizeof(float) * n)) {
        PyErr_SetString(PyExc_ValueError, "_encode: ref must hold whole items of n float32");
        goto done;
    }
    Py_ssize_t items = rb.len / (Py_ssize_t)sizeof(float) / n;
    if (get_floats(eo, &eb, items * n, "est", 0) < 0 || get_doubles(so, &sb, items, "sse") < 0 ||
        get_floats(lo, &lb, items, "lo", 1) < 0 || get_floats(ho, &hb, items, "hi", 1) < 0 ||
        get_doubles(po, &pb, items, "peak") < 0)
        goto done;
    Py_ssize_t bad;
    {
        const float *r = rb.buf, *e = eb.buf;
        double *s = sb.buf, *p = pb.buf;
        float *l = lb.buf, *h = hb.buf;
        int avx2 = use_avx2();
        Py_BEGIN_ALLOW_THREADS
#ifdef ENC_X86
        if (avx2) bad = figures_avx2(r, e, s, l, h, p, items, n);
        else
#endif
            bad = figures_c(r, e, s, l, h, p, items, n);
        (void)avx2;
        Py_END_ALLOW_THREADS
    }
    res = PyLong_FromSsize_t(bad);
done:
    release(&rb), release(&eb), release(&sb), release(&lb), release(&hb), release(&pb);
    return res;
}

static PyObject *py_vector_isa(PyObject *self, PyObject *args) {
    return PyUnicode_FromString(use_avx2() ? "avx2" : "portable");
}

static PyMethodDef methods[] = {
    {"normalize", py_normalize, METH_VARARGS,
     "normalize(x, rng, mid, out, n): out = (x - mid) / rng per item of n float32 values, in float64"},
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(c, qkind, out, over, (L, C, R, K, Wb), offsets, steps, theta) -> non-finite count (theta < 0: "
     "no dead zone)"},
    {"figures", py_figures, METH_VARARGS,
     "figures(ref, est, n, sse, lo, hi, peak) -> non-finite count: per item of n float32 values the float64 sum and "
     "largest of the squared errors and the float32 extremes of ref"},
    {"vector_isa", py_vector_isa, METH_NOARGS, "the instruction set the loops run with here"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_encode", "the encode's fused elementwise loops", -1,
                                    methods};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&moddef); }
