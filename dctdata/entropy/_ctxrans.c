/* _ctxrans: the CPython module of the context-modelled rANS coder (dctdata.entropy.ctxrans). The coder
 * itself, and the definition of its stored format, is ctxrans_core.c (no Python); this file turns Python
 * arguments into its calls, releases the GIL around the work and raises ValueError for its errors. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "ctxrans_core.h"

/* a core error as a Python exception (NULL for chaining) */
static PyObject *raise_core(const char *err) {
    if (err == CTX_ENOMEM) return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, err);
    return NULL;
}

static int parse_model(const Py_buffer *mb, model_t *m) {
    const char *err = ctx_parse_model(mb->buf, mb->len, m);
    if (err) { raise_core(err); return -1; }
    return 0;
}

static int check_model_shape(const model_t *m, const int dims[5]) {
    const char *err = ctx_check_shape(m, dims);
    if (err) { raise_core(err); return -1; }
    return 0;
}

static int parse_shape(PyObject *shape, int dims[5], Py_ssize_t *n) {
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 5) {
        PyErr_SetString(PyExc_ValueError, "ctxrans: shape must be a 5-tuple (B, C, Hb, K, Wb)");
        return -1;
    }
    *n = 1;
    for (int i = 0; i < 5; i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(shape, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < 1 || v > (1L << 30)) { PyErr_SetString(PyExc_ValueError, "ctxrans: bad shape"); return -1; }
        dims[i] = (int)v;
        if (*n > ((Py_ssize_t)1 << 40) / v) { PyErr_SetString(PyExc_ValueError, "ctxrans: shape too large"); return -1; }
        *n *= v;
    }
    return 0;
}


/* encode(model, q_buffer, shape, itemsize, mode=0, nseg=0) -> bytes: mode 0, 2 or 3 with nseg segments (the layouts
 * of ctxrans_core.c), or mode 1 = raw when coding does not save */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    Py_buffer mb, qb; PyObject *shape; int itemsize, mode = MODE_RANS, nseg = 0;
    if (!PyArg_ParseTuple(args, "y*y*Oi|ii", &mb, &qb, &shape, &itemsize, &mode, &nseg)) return NULL;
    PyObject *res = NULL;
    model_t m; int dims[5]; Py_ssize_t n;
    if (mode != MODE_RANS && mode != MODE_LANES && mode != MODE_SEGMENTS) {
        raise_core("ctxrans: encode mode must be 0, 2 or 3"); goto done;
    }
    if (parse_model(&mb, &m) < 0 || parse_shape(shape, dims, &n) < 0 || check_model_shape(&m, dims) < 0) goto done;
    if ((itemsize != 1 && itemsize != 2) || qb.len != n * itemsize) {
        PyErr_SetString(PyExc_ValueError, "ctxrans: buffer size does not match shape * itemsize"); goto done;
    }
    const char *err; uint8_t *out; ptrdiff_t outlen;
    Py_BEGIN_ALLOW_THREADS
    err = ctx_encode(&m, qb.buf, dims, itemsize, mode, nseg, &out, &outlen);
    Py_END_ALLOW_THREADS
    if (err) raise_core(err);
    else res = PyBytes_FromStringAndSize((const char *)out, outlen);
    free(out);
done:
    PyBuffer_Release(&mb); PyBuffer_Release(&qb);
    return res;
}

/* contexts(model, q, shape, itemsize, ctx_out int32[n], tok_out uint8[n]) -> bits in the bit section.
 * tok_out as in the encoder: token | 0x40 if a sign-flip symbol follows | 0x80 if the sign flips. */
static PyObject *py_contexts(PyObject *self, PyObject *args) {
    Py_buffer mb, qb, cb, tb; PyObject *shape; int itemsize;
    if (!PyArg_ParseTuple(args, "y*y*Oiw*w*", &mb, &qb, &shape, &itemsize, &cb, &tb)) return NULL;
    PyObject *res = NULL;
    model_t m; int dims[5]; Py_ssize_t n;
    if (parse_model(&mb, &m) < 0 || parse_shape(shape, dims, &n) < 0 || check_model_shape(&m, dims) < 0) goto done;
    if ((itemsize != 1 && itemsize != 2) || qb.len != n * itemsize || cb.len != n * 4 || tb.len != n) {
        PyErr_SetString(PyExc_ValueError, "ctxrans: buffer sizes do not match shape"); goto done;
    }
    int64_t bits;
    const char *err = ctx_contexts(&m, qb.buf, dims, itemsize, (int32_t *)cb.buf, (uint8_t *)tb.buf, &bits);
    if (err) raise_core(err);
    else res = PyLong_FromLongLong((long long)bits);
done:
    PyBuffer_Release(&mb); PyBuffer_Release(&qb); PyBuffer_Release(&cb); PyBuffer_Release(&tb);
    return res;
}

/* estimate(model, q, shape, itemsize, cost uint16[nctx * NTOK + 2 * C], every=1, run=1) -> (the ideal code length,
 * a top row's added cost) in 1/256 bits (ctx_estimate: per context and token its cost, then per channel a flip
 * symbol's two costs) */
static PyObject *py_estimate(PyObject *self, PyObject *args) {
    Py_buffer mb, qb, cb; PyObject *shape; int itemsize, every = 1, run = 1;
    if (!PyArg_ParseTuple(args, "y*y*Oiy*|ii", &mb, &qb, &shape, &itemsize, &cb, &every, &run)) return NULL;
    PyObject *res = NULL;
    model_t m; int dims[5]; Py_ssize_t n;
    if (parse_model(&mb, &m) < 0 || parse_shape(shape, dims, &n) < 0 || check_model_shape(&m, dims) < 0) goto done;
    if ((itemsize != 1 && itemsize != 2) || qb.len != n * itemsize
        || cb.len != ((Py_ssize_t)m.nctx * NTOK + 2 * (Py_ssize_t)m.C) * 2) {
        PyErr_SetString(PyExc_ValueError, "ctxrans: buffer sizes do not match shape and model"); goto done;
    }
    uint64_t bits; int64_t top; const char *err;
    const uint16_t *cost = (const uint16_t *)cb.buf;
    Py_BEGIN_ALLOW_THREADS
    err = ctx_estimate(&m, qb.buf, dims, itemsize, cost, cost + (ptrdiff_t)m.nctx * NTOK, every, run, &bits, &top);
    Py_END_ALLOW_THREADS
    if (err) raise_core(err);
    else res = Py_BuildValue("KL", (unsigned long long)bits, (long long)top);
done:
    PyBuffer_Release(&mb); PyBuffer_Release(&qb); PyBuffer_Release(&cb);
    return res;
}

/* The model, shape and output size checks shared by decode and decode_many; sets m's vector steps. */
static int decode_setup(const Py_buffer *mb, PyObject *shape, int itemsize, Py_ssize_t outlen, Py_ssize_t items,
                        model_t *m, int dims[5], Py_ssize_t *n) {
    if (parse_model(mb, m) < 0 || parse_shape(shape, dims, n) < 0 || check_model_shape(m, dims) < 0) return -1;
    const Py_ssize_t each = *n * itemsize; /* <= 2^41: parse_shape bounds n */
    if ((itemsize != 1 && itemsize != 2) || outlen % each != 0 || outlen / each != items) {
        PyErr_SetString(PyExc_ValueError, "ctxrans: output buffer size does not match shape * itemsize");
        return -1;
    }
    ctx_decode_setup(m, dims);
    return 0;
}

/* decode(model, buf, out_writable, shape, itemsize) -> None; ValueError if corrupt/truncated */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer mb, ib, ob; PyObject *shape; int itemsize;
    if (!PyArg_ParseTuple(args, "y*y*w*Oi", &mb, &ib, &ob, &shape, &itemsize)) return NULL;
    PyObject *res = NULL;
    model_t m; int dims[5]; Py_ssize_t n;
    const char *err = NULL; char msg[CTX_MSG];
    if (decode_setup(&mb, shape, itemsize, ob.len, 1, &m, dims, &n) == 0) {
        Py_BEGIN_ALLOW_THREADS
        err = ctx_decode(&m, (const uint8_t *)ib.buf, ib.len, ob.buf, ob.len, dims, itemsize, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        if (err) PyErr_SetString(PyExc_ValueError, err);
        else { res = Py_None; Py_INCREF(res); }
    }
    PyBuffer_Release(&mb); PyBuffer_Release(&ib); PyBuffer_Release(&ob);
    return res;
}

/* decode_many(model, bufs, out_writable, shape, itemsize) -> int: stream i of the sequence `bufs` into the i-th of
 * len(bufs) consecutive arrays of `shape` in `out`, in order, with the GIL released once for all of them (a reader
 * thread decoding a run of a batch's chunks then holds it only for the call). Returns how many decoded cleanly
 * before the first that did not (len(bufs) when all did); `decode` on that one gives its error. */
static PyObject *py_decode_many(PyObject *self, PyObject *args) {
    Py_buffer mb, ob; PyObject *seq, *shape; int itemsize;
    if (!PyArg_ParseTuple(args, "y*Ow*Oi", &mb, &seq, &ob, &shape, &itemsize)) return NULL;
    PyObject *res = NULL, *fast = PySequence_Fast(seq, "ctxrans: bufs must be a sequence of bytes-like objects");
    Py_buffer *bufs = NULL; Py_ssize_t got = 0, k = 0; char msg[CTX_MSG];
    model_t m; int dims[5]; Py_ssize_t n;
    if (!fast) goto done;
    const Py_ssize_t items = PySequence_Fast_GET_SIZE(fast);
    if (decode_setup(&mb, shape, itemsize, ob.len, items, &m, dims, &n) < 0) goto done;
    bufs = (Py_buffer *)PyMem_Calloc(items ? items : 1, sizeof(Py_buffer));
    if (!bufs) { PyErr_NoMemory(); goto done; }
    for (; got < items; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &bufs[got], PyBUF_SIMPLE) < 0) goto done;
    const Py_ssize_t each = n * itemsize;
    Py_BEGIN_ALLOW_THREADS
    for (; k < items; k++)
        if (ctx_decode(&m, (const uint8_t *)bufs[k].buf, bufs[k].len, (uint8_t *)ob.buf + k * each, each, dims,
                       itemsize, msg, sizeof msg)) break;
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(k);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    Py_XDECREF(fast);
    PyBuffer_Release(&mb); PyBuffer_Release(&ob);
    return res;
}

/* set_simd([on]) -> the previous setting (without `on`: the current one, unchanged): tests run mode 2 through
 * both decoders on one machine */
static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on)) return NULL;
    return PyBool_FromLong(ctx_set_simd(on));
}

/* set_gather([instruction]) -> the previous setting (without an argument: the current one, unchanged): the
 * vector decoder's lookups by the gather instruction (True) or by scalar loads (False); tests and benchmarks
 * run both on one machine */
static PyObject *py_set_gather(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p", &on)) return NULL;
    return PyBool_FromLong(ctx_set_gather(on));
}

/* max_coefficients(nbytes) -> the most coefficients a stream of nbytes can code (decode refuses larger shapes) */
static PyObject *py_max_coefficients(PyObject *self, PyObject *args) {
    long long len;
    if (!PyArg_ParseTuple(args, "L", &len)) return NULL;
    return PyLong_FromLongLong((long long)ctx_max_coefficients(len));
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS, "encode(model, q, shape, itemsize, mode=0, nseg=0) -> bytes"},
    {"decode", py_decode, METH_VARARGS, "decode(model, buf, out, shape, itemsize) -> None"},
    {"decode_many", py_decode_many, METH_VARARGS, "decode_many(model, bufs, out, shape, itemsize) -> decoded"},
    {"set_simd", py_set_simd, METH_VARARGS, "set_simd([on]) -> previous: the AVX2 decoder of mode 2 on or off"},
    {"set_gather", py_set_gather, METH_VARARGS,
     "set_gather([instruction]) -> previous: the AVX2 decoder's lookups by gather instructions or scalar loads"},
    {"max_coefficients", py_max_coefficients, METH_VARARGS,
     "max_coefficients(nbytes) -> the most coefficients a stream of nbytes bytes can code"},
    {"estimate", py_estimate, METH_VARARGS, "estimate(model, q, shape, itemsize, cost, every=1, run=1) -> (ideal bits, top row bits) * 256"},
    {"contexts", py_contexts, METH_VARARGS, "contexts(model, q, shape, itemsize, ctx_out, tok_out) -> raw bits"},
    {NULL, NULL, 0, NULL}};

/* MODNAME lets benchmark variants (other -D settings) be built side by side from this file */
#ifndef MODNAME
#define MODNAME _ctxrans
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, STR(MODNAME), "context-modelled rANS kernels", -1, methods};

PyMODINIT_FUNC CAT(PyInit_, MODNAME)(void) {
    PyObject *mod = PyModule_Create(&moddef);
    ctx_init();
    if (mod) {
        PyModule_AddIntConstant(mod, "NTOK", NTOK); PyModule_AddIntConstant(mod, "D", D);
        PyModule_AddIntConstant(mod, "SCALE", SCALE); PyModule_AddIntConstant(mod, "NFEAT", NFEAT);
        PyModule_AddIntConstant(mod, "LUTB", LUTB); PyModule_AddIntConstant(mod, "MAGIC", MAGIC);
        PyModule_AddIntConstant(mod, "TABPAD", TABPAD); PyModule_AddIntConstant(mod, "MODE_LANES", MODE_LANES);
        PyModule_AddIntConstant(mod, "MODE_SEGMENTS", MODE_SEGMENTS);
    }
    return mod;
}