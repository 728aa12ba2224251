/*
 * fastensor._C: the tensor codec (ft_codec_*), on addresses the caller keeps alive (and, for
 * decoding, any buffer). The GIL is released while the codec runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fastensor.h"
#include "_ext.h"

/* codec_bound(nbytes, elem_size, block_bytes) -> the most bytes an encoding takes */
static PyObject *py_codec_bound(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long nbytes;
    unsigned esize, block;
    if (!PyArg_ParseTuple(args, "KII", &nbytes, &esize, &block))
        return NULL;
    return PyLong_FromSize_t(ft_codec_bound(nbytes, esize, block));
}

/* codec_encode(ctx, address, nbytes, elem_size, block_bytes, flags, dst, capacity[, device,
 * stream]) -> size; with a device (>= 0), device memory coded on its GPU (ordered after
 * stream) into host memory */
static PyObject *py_codec_encode(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned long long addr, nbytes, dst, room, stream = 0;
    unsigned esize, block, flags;
    int device = -1;
    if (!PyArg_ParseTuple(args, "OKKIIIKK|iK", &cap, &addr, &nbytes, &esize, &block, &flags,
                          &dst, &room, &device, &stream))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    if (device >= 0 && flags) {
        PyErr_SetString(PyExc_ValueError, "codec_encode: flags on the GPU");
        return NULL;
    }
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = device >= 0 ? ft_codec_encode_cuda(ctx, (const void *)(uintptr_t)addr, nbytes, esize,
                                           block, (void *)(uintptr_t)dst, (size_t)room, device,
                                           (void *)(uintptr_t)stream)
                    : ft_codec_encode(ctx, (const void *)(uintptr_t)addr, nbytes, esize, block,
                                      flags, (void *)(uintptr_t)dst, (size_t)room);
    Py_END_ALLOW_THREADS
    return n < 0 ? raise_ft((int)n, "codec") : PyLong_FromLongLong(n);
}

/* codec_size(data) -> decoded bytes */
static PyObject *py_codec_size(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer in;
    if (!PyArg_ParseTuple(args, "y*", &in))
        return NULL;
    int64_t n = ft_codec_size(in.buf, (size_t)in.len);
    PyBuffer_Release(&in);
    return n < 0 ? raise_ft((int)n, "codec") : PyLong_FromLongLong(n);
}

/* codec_decode(ctx, data, address, capacity) -> decoded bytes */
static PyObject *py_codec_decode(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    Py_buffer in;
    unsigned long long addr, room;
    if (!PyArg_ParseTuple(args, "Oy*KK", &cap, &in, &addr, &room))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx) {
        PyBuffer_Release(&in);
        return NULL;
    }
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = ft_codec_decode(ctx, in.buf, (size_t)in.len, (void *)(uintptr_t)addr, (size_t)room);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    return n < 0 ? raise_ft((int)n, "codec") : PyLong_FromLongLong(n);
}

/* The items of @p list, each parsed by @p parse into a job of @p size bytes: an array to
 * PyMem_Free, their number in *n; or NULL with an exception. */
static void *parse_jobs(PyObject *list, const char *what, size_t size,
                        int (*parse)(PyObject *item, void *job), Py_ssize_t *n)
{
    PyObject *seq = PySequence_Fast(list, what);
    if (!seq)
        return NULL;
    *n = PySequence_Size(seq);
    char *jobs = PyMem_Malloc(size * (size_t)(*n ? *n : 1));
    if (!jobs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        int ok = item && parse(item, jobs + size * (size_t)i);
        Py_XDECREF(item);
        if (!ok) {
            PyMem_Free(jobs);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    return jobs;
}

/* The arguments (ctx, jobs, device, stream) of a GPU codec call: the context (NULL with an
 * exception), its jobs parsed as parse_jobs does. */
static ft_ctx *gpu_call_args(PyObject *args, const char *what, size_t size,
                             int (*parse)(PyObject *item, void *job), void **jobs,
                             Py_ssize_t *n, int *device, void **stream)
{
    PyObject *cap, *list;
    unsigned long long s;
    if (!PyArg_ParseTuple(args, "OOiK", &cap, &list, device, &s))
        return NULL;
    *stream = (void *)(uintptr_t)s;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    return ctx && (*jobs = parse_jobs(list, what, size, parse, n)) ? ctx : NULL;
}

/* (src_address, length, dst_address, capacity[, src_dev]) */
static int parse_decode_job(PyObject *item, void *job)
{
    unsigned long long src, len, dst, room, dev = 0;
    if (!PyArg_ParseTuple(item, "KKKK|K", &src, &len, &dst, &room, &dev))
        return 0;
    *(ft_codec_job *)job = (ft_codec_job){(const void *)(uintptr_t)src, (size_t)len,
                                          (const void *)(uintptr_t)dev, (void *)(uintptr_t)dst,
                                          (size_t)room};
    return 1;
}

/* codec_decode_cuda(ctx, [(src_address, length, dst_address, capacity[, src_dev]), ...],
 * device, stream) -> decoded bytes: the streams (host memory; src_dev: the same bytes already
 * in device memory) decoded into device memory on the GPU */
static PyObject *py_codec_decode_cuda(PyObject *self, PyObject *args)
{
    (void)self;
    ft_codec_job *jobs;
    Py_ssize_t n;
    int device;
    void *stream;
    ft_ctx *ctx = gpu_call_args(args, "codec_decode_cuda: a list of jobs", sizeof *jobs,
                                parse_decode_job, (void **)&jobs, &n, &device, &stream);
    if (!ctx)
        return NULL;
    int64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = ft_codec_decode_cuda(ctx, jobs, (size_t)n, device, stream);
    Py_END_ALLOW_THREADS
    PyMem_Free(jobs);
    return r < 0 ? raise_ft((int)r, "codec") : PyLong_FromLongLong(r);
}

/* (src_address, nbytes, elem_size, block_bytes, dst_address, capacity) */
static int parse_encode_job(PyObject *item, void *job)
{
    unsigned long long src, nbytes, dst, room;
    unsigned esize, block;
    if (!PyArg_ParseTuple(item, "KKIIKK", &src, &nbytes, &esize, &block, &dst, &room))
        return 0;
    *(ft_codec_enc_job *)job = (ft_codec_enc_job){(const void *)(uintptr_t)src, nbytes, esize,
                                                  block, (void *)(uintptr_t)dst, (size_t)room,
                                                  0};
    return 1;
}

/* codec_encode_cuda(ctx, [(src_address, nbytes, elem_size, block_bytes, dst_address,
 * capacity), ...], device, stream) -> [size, ...]: tensors in device memory coded on its GPU
 * in one batch into host or device memory */
static PyObject *py_codec_encode_cuda(PyObject *self, PyObject *args)
{
    (void)self;
    ft_codec_enc_job *jobs;
    Py_ssize_t n;
    int device;
    void *stream;
    ft_ctx *ctx = gpu_call_args(args, "codec_encode_cuda: a list of jobs", sizeof *jobs,
                                parse_encode_job, (void **)&jobs, &n, &device, &stream);
    if (!ctx)
        return NULL;
    int64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = ft_codec_encode_cuda_batch(ctx, jobs, (size_t)n, device, stream);
    Py_END_ALLOW_THREADS
    PyObject *sizes = r < 0 ? NULL : PyList_New(n);
    for (Py_ssize_t i = 0; sizes && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(jobs[i].size);
        if (!v || PyList_SetItem(sizes, i, v) < 0) /* (steals v) */
            Py_CLEAR(sizes);
    }
    PyMem_Free(jobs);
    return r < 0 ? raise_ft((int)r, "codec") : sizes;
}

static PyMethodDef codec_methods[] = {
    {"codec_bound", py_codec_bound, METH_VARARGS,
     "codec_bound(nbytes, elem_size, block_bytes) -> the most bytes an encoding takes"},
    {"codec_encode", py_codec_encode, METH_VARARGS,
     "codec_encode(ctx, address, nbytes, elem_size, block_bytes, flags, dst, capacity[, device, "
     "stream]) -> size"},
    {"codec_encode_cuda", py_codec_encode_cuda, METH_VARARGS,
     "codec_encode_cuda(ctx, [(src, nbytes, elem_size, block_bytes, dst, capacity)], device, "
     "stream) -> [size]"},
    {"codec_size", py_codec_size, METH_VARARGS, "codec_size(data) -> decoded bytes"},
    {"codec_decode", py_codec_decode, METH_VARARGS,
     "codec_decode(ctx, data, address, capacity) -> decoded bytes"},
    {"codec_decode_cuda", py_codec_decode_cuda, METH_VARARGS,
     "codec_decode_cuda(ctx, [(src, length, dst, capacity)], device, stream) -> decoded bytes"},
    {NULL, NULL, 0, NULL},
};

int codec_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, codec_methods);
}
