/* _ctxlanes: the lane emulator of the GPU decoder of the entropy stage. ctxrans_lanes.h built as C: each unit's
 * 16 lanes run as loops, its collectives (ballot, shuffles, scans) as functions of those loops. It decodes a batch
 * of streams exactly as the CUDA kernel does, one unit after another, so CI compares it with the CPU decoder
 * (ctxrans_core.c) without a GPU, and dctdata.entropy.device uses it for CPU tensors. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "ctxrans_core.h"
#include "ctxrans_lanes.h"

/* the two headers describe one format */
typedef char cl_same_format[(CL_SCALE == SCALE && CL_D == D && CL_NTOK == NTOK && CL_NFEAT == NFEAT && CL_HDR == HDR &&
                             CL_LUTB == LUTB && CL_CUMB == CUMB && CL_TABB == TABB && CL_MODE_LANES == MODE_LANES &&
                             CL_MODE_SEGMENTS == MODE_SEGMENTS && (int)CL_F_LT == (int)F_LT &&
                             (int)CL_F_CH == (int)F_CH && (int)CL_F_TOP == (int)F_TOP &&
                             (int)CL_F_SFLIP == (int)F_SFLIP && (int)CL_F_WIDE == (int)F_WIDE)
                                ? 1 : -1];

/* every unit of every sample, in order; status[i]: the smallest key of sample i's units, 0 when none failed */
static void emulate(const cl_u8 *buf, cl_i64 buflen, const cl_i64 *offsets, int n, const cl_i32 *blob, void *out,
                    int is8, int C, int Hb, int K, int Wb, int U, cl_i16 *rows, cl_i32 *status) {
    cl_model mv;
    cl_model_view(blob, &mv);
    cl_u64 xs[16];
    cl_part P;
    P.m = &mv; P.is8 = is8; P.C = C; P.Hb = Hb; P.K = K; P.Wb = Wb; P.rows = rows; P.xs = xs;
    const cl_i64 each = (cl_i64)C * Hb * K * Wb * (is8 ? 1 : 2);
    for (int i = 0; i < n; i++) {
        const cl_i64 o0 = offsets[i], o1 = offsets[i + 1];
        cl_u32 best = 0;
        P.out = (cl_u8 *)out + i * each;
        for (int u = 0; u < U; u++) {
            memset(xs, 0, sizeof xs);
            const cl_u32 key = o0 < 0 || o1 < o0 || o1 > buflen ? CL_ST_OFFSETS
                                                                : cl_decode_unit(&P, buf + o0, o1 - o0, u, U);
            if (key && (!best || key < best)) best = key;
        }
        status[i] = (cl_i32)best;
    }
}

/* decode_batch(model, buf, offsets, out, sample_shape, itemsize, units_per_sample, status) -> None: offsets int64
 * (n + 1), out (n, C, Hb, K, Wb) of itemsize bytes, status int32 (n); what the CUDA kernel computes */
static PyObject *py_decode_batch(PyObject *self, PyObject *args) {
    Py_buffer mb, bb, ob, qb, sb;
    int C, Hb, K, Wb, itemsize, U;
    if (!PyArg_ParseTuple(args, "y*y*y*w*(iiii)iiw*", &mb, &bb, &ob, &qb, &C, &Hb, &K, &Wb, &itemsize, &U, &sb))
        return NULL;
    PyObject *res = NULL;
    model_t m;
    const char *err = ctx_parse_model(mb.buf, mb.len, &m);
    if (err) { PyErr_SetString(PyExc_ValueError, err); goto done; }
    if (C < 1 || Hb < 1 || K < 1 || Wb < 1 || C > m.C || K != m.K || Hb > (1 << 20) || Wb > (1 << 20) ||
        (itemsize != 1 && itemsize != 2) || U < 1 || U > Hb) {
        PyErr_SetString(PyExc_ValueError, "ctxlanes: sample shape, itemsize or units do not fit the model");
        goto done;
    }
    if (ob.len % 8 != 0 || sb.len % 4 != 0 || ob.len / 8 != sb.len / 4 + 1) {
        PyErr_SetString(PyExc_ValueError, "ctxlanes: expected n + 1 int64 offsets and n int32 statuses");
        goto done;
    }
    const Py_ssize_t n = sb.len / 4, each = (Py_ssize_t)C * Hb * K * Wb * itemsize;
    if (n > 0 && (each > PY_SSIZE_T_MAX / n || qb.len != n * each)) {
        PyErr_SetString(PyExc_ValueError, "ctxlanes: output buffer size does not match n * sample shape * itemsize");
        goto done;
    }
    if (n > INT32_MAX) { PyErr_SetString(PyExc_ValueError, "ctxlanes: too many samples"); goto done; }
    cl_i16 *rows = (cl_i16 *)malloc(sizeof(cl_i16) * 2 * (size_t)K * Wb);
    if (!rows) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    emulate((const cl_u8 *)bb.buf, (cl_i64)bb.len, (const cl_i64 *)ob.buf, (int)n, (const cl_i32 *)mb.buf, qb.buf,
            itemsize == 1, C, Hb, K, Wb, U, rows, (cl_i32 *)sb.buf);
    Py_END_ALLOW_THREADS
    free(rows);
    res = Py_None;
    Py_INCREF(res);
done:
    PyBuffer_Release(&mb); PyBuffer_Release(&bb); PyBuffer_Release(&ob); PyBuffer_Release(&qb);
    PyBuffer_Release(&sb);
    return res;
}

static PyMethodDef methods[] = {
    {"decode_batch", py_decode_batch, METH_VARARGS,
     "decode_batch(model, buf, offsets, out, sample_shape, itemsize, units_per_sample, status) -> None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ctxlanes", "the lane emulator of the GPU entropy decoder",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ctxlanes(void) {
    ctx_init();
    return PyModule_Create(&moddef);
}
