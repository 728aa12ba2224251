/*
 * fastensor._C: batches (ft_read_batch / ft_write_batch, ft_ckpt_read_ranges). The ops come
 * as a list of (address, length, offset, kind, device) tuples; file batches give back a list
 * of byte counts. The GIL is released while the batch runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "fastensor.h"
#include "_ext.h"

/* Fill @p ops from the list. @return 0, or -1 with an exception set. */
static int parse_ops(PyObject *list, ft_batch_op *ops, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i); /* borrowed */
        unsigned long long addr, len, off;
        int kind, device;
        if (!item || !PyArg_ParseTuple(item, "KKKii", &addr, &len, &off, &kind, &device))
            return -1;
        ops[i] = (ft_batch_op){.buf = {(void *)(uintptr_t)addr, (size_t)len,
                                       kind ? FT_MEM_CUDA : FT_MEM_HOST, device},
                               .offset = off};
    }
    return 0;
}

/* The ops of @p list (freed by the caller), their count in *n. @return them, or NULL with an
 * exception set. */
static ft_batch_op *ops_of(PyObject *list, Py_ssize_t *n)
{
    *n = PyList_Size(list);
    ft_batch_op *ops = calloc(*n ? (size_t)*n : 1, sizeof *ops);
    if (!ops)
        return (ft_batch_op *)PyErr_NoMemory();
    if (parse_ops(list, ops, *n) < 0) {
        free(ops);
        return NULL;
    }
    return ops;
}

/* file_batch(file, ops, engine, flags, write, stream) -> [bytes per op] */
static PyObject *py_file_batch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *list;
    int engine, write, cache = 0;
    unsigned flags;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OO!iIpK|i", &cap, &PyList_Type, &list, &engine, &flags, &write,
                          &stream, &cache))
        return NULL;
    ft_file *f = cap_get(cap, CAP_FILE);
    if (!f)
        return NULL;
    Py_ssize_t n;
    ft_batch_op *ops = ops_of(list, &n);
    if (!ops)
        return NULL;
    ft_io_opts o = {.engine = (ft_engine)engine, .flags = flags,
                    .stream = (void *)(uintptr_t)stream, .cache = (ft_cache_mode)cache};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = write ? ft_write_batch(f, ops, (size_t)n, &o) : ft_read_batch(f, ops, (size_t)n, &o);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (rc < 0) {
        raise_ft(rc, ft_file_path(f));
    } else if ((out = PyList_New(n))) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromLongLong(ops[i].result);
            if (!v || PyList_SetItem(out, i, v) < 0) { /* SetItem steals v */
                Py_CLEAR(out);
                break;
            }
        }
    }
    free(ops);
    return out;
}

/* ckpt_read_ranges(ckpt, index, ops, engine, verify, stream, cache) -> bytes: ranges of one
 * tensor (offsets inside its data) as one batch */
static PyObject *py_ckpt_read_ranges(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *list;
    unsigned long long index, stream;
    int engine, verify, cache;
    if (!PyArg_ParseTuple(args, "OKO!ipKi", &cap, &index, &PyList_Type, &list, &engine, &verify,
                          &stream, &cache))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    Py_ssize_t n;
    ft_batch_op *ops = ops_of(list, &n);
    if (!ops)
        return NULL;
    ft_load_opts o = {.engine = (ft_engine)engine, .flags = verify ? FT_LOAD_VERIFY : 0,
                      .stream = (void *)(uintptr_t)stream, .cache = (ft_cache_mode)cache};
    int64_t r;
    Py_BEGIN_ALLOW_THREADS
    r = ft_ckpt_read_ranges(c, (size_t)index, ops, (size_t)n, &o);
    Py_END_ALLOW_THREADS
    free(ops);
    return r < 0 ? raise_ft((int)r, NULL) : PyLong_FromLongLong(r);
}

static PyMethodDef batch_methods[] = {
    {"file_batch", py_file_batch, METH_VARARGS,
     "file_batch(file, [(addr, len, off, kind, device)], engine, flags, write, stream) -> list"},
    {"ckpt_read_ranges", py_ckpt_read_ranges, METH_VARARGS,
     "ckpt_read_ranges(ckpt, index, [(addr, len, off, kind, device)], engine, verify, stream, "
     "cache) -> int"},
    {NULL, NULL, 0, NULL},
};

int batch_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, batch_methods);
}
