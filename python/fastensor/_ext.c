/*
 * fastensor._C: a thin CPython binding of libfastensor (stable ABI, Python >= 3.11).
 * Memory is passed as (address, length) integers: the Python layer takes them from torch
 * tensors or numpy arrays and keeps those objects alive. Every I/O call releases the GIL.
 * Handles are capsules whose destructors free them. Errors: OSError (errno, message with
 * the library's detail, path) for system errors; ValueError for invalid files or arguments.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>

#include "fastensor.h"
#include "_ext.h"

#define CAP_REQ "fastensor.req"

PyObject *ft_py_error, *ft_py_value_error, *ft_py_key_error;

PyObject *raise_ft(int err, const char *path)
{
    int e = err < 0 ? -err : err;
    const char *detail = ft_last_error();
    if (e == EBADMSG || e == EINVAL || e == ERANGE || e == ENODATA) {
        PyErr_Format(ft_py_value_error, "%s%s%s", detail && *detail ? detail : ft_strerror(err),
                     path && !strstr(detail, path) ? ": " : "",
                     path && !strstr(detail, path) ? path : "");
        return NULL;
    }
    PyObject *args = path ? Py_BuildValue("(iss)", e, *detail ? detail : ft_strerror(err), path)
                          : Py_BuildValue("(is)", e, *detail ? detail : ft_strerror(err));
    if (args) {
        PyObject *exc = PyObject_CallObject(PyExc_OSError, args);
        Py_DECREF(args);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    }
    return NULL;
}

static void ctx_free(PyObject *cap)
{
    ft_ctx_destroy(PyCapsule_GetPointer(cap, CAP_CTX));
}

PyObject *capsule_owning(void *ptr, const char *name, PyCapsule_Destructor free_fn,
                         PyObject *owner)
{
    PyObject *cap = PyCapsule_New(ptr, name, free_fn);
    if (cap && owner) {
        Py_INCREF(owner);
        PyCapsule_SetContext(cap, owner);
    }
    return cap;
}

void capsule_release_owner(PyObject *cap)
{
    PyObject *owner = PyCapsule_GetContext(cap);
    if (owner) {
        PyCapsule_SetContext(cap, NULL);
        Py_DECREF(owner);
    }
    PyErr_Clear();
}

static void file_free(PyObject *cap)
{
    ft_file *f = PyCapsule_GetPointer(cap, CAP_FILE);
    if (f)
        ft_file_close(f);
    capsule_release_owner(cap);
}

static void req_free(PyObject *cap)
{
    ft_req_free(PyCapsule_GetPointer(cap, CAP_REQ));
}

void *cap_get(PyObject *cap, const char *name)
{
    void *p = PyCapsule_GetPointer(cap, name);
    if (!p && !PyErr_Occurred())
        PyErr_Format(ft_py_value_error, "%s is closed", name);
    return p;
}

static PyObject *py_ctx_create(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned threads = 0, qd = 0;
    unsigned long long chunk = 0, bounce = 0;
    int engine = -1;
    if (!PyArg_ParseTuple(args, "|IKIKi", &threads, &chunk, &qd, &bounce, &engine))
        return NULL;
    ft_config cfg;
    int rc = ft_config_init(&cfg);
    if (rc < 0)
        return raise_ft(rc, NULL);
    if (threads)
        cfg.threads = threads;
    if (chunk)
        cfg.chunk_size = (size_t)chunk;
    if (qd)
        cfg.queue_depth = qd;
    if (bounce)
        cfg.bounce_size = (size_t)bounce;
    if (engine >= 0)
        cfg.engine = (ft_engine)engine;
    ft_ctx *ctx;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ctx_create(&ctx, &cfg);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_ft(rc, NULL);
    return PyCapsule_New(ctx, CAP_CTX, ctx_free);
}

static PyObject *py_engine_id(PyObject *self, PyObject *args)
{
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    int e = ft_engine_from_name(name);
    if (e < 0) {
        char names[256] = "";
        size_t at = 0;
        for (int i = 0; i < FT_ENGINE_COUNT && at < sizeof names; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                   ft_engine_name((ft_engine)i));
        return PyErr_Format(PyExc_ValueError, "unknown engine '%s' (%s)", name, names);
    }
    return PyLong_FromLong(e);
}

static PyObject *py_cache_id(PyObject *self, PyObject *args)
{
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    int m = ft_cache_from_name(name);
    if (m < 0)
        return PyErr_Format(PyExc_ValueError, "unknown cache mode '%s' (auto, keep, bypass)",
                            name);
    return PyLong_FromLong(m);
}

static PyObject *py_file_open(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *path;
    unsigned flags, mode = 0644;
    if (!PyArg_ParseTuple(args, "OsI|I", &cap, &path, &flags, &mode))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    ft_file *f;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_file_open(ctx, &f, path, flags, (mode_t)mode);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_ft(rc, path);
    return capsule_owning(f, CAP_FILE, file_free, cap);
}

static PyObject *py_file_close(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_file *f = PyCapsule_GetPointer(cap, CAP_FILE);
    if (!f) { /* already closed */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    /* Detach first so the destructor cannot close it again. */
    PyCapsule_SetDestructor(cap, NULL);
    PyCapsule_SetName(cap, "fastensor.file.closed");
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_file_close(f);
    Py_END_ALLOW_THREADS
    capsule_release_owner(cap);
    if (rc < 0)
        return raise_ft(rc, NULL);
    Py_RETURN_NONE;
}

static PyObject *py_file_size(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_file *f = cap_get(cap, CAP_FILE);
    if (!f)
        return NULL;
    int64_t n = ft_file_size(f);
    return n < 0 ? raise_ft((int)n, ft_file_path(f)) : PyLong_FromLongLong(n);
}

static PyObject *py_file_sync(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_file *f = cap_get(cap, CAP_FILE);
    if (!f)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_file_sync(f);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, ft_file_path(f)) : (Py_INCREF(Py_None), Py_None);
}

/* A buffer and options from (address, length, kind, device) and (engine, flags, stream). */
static void make_io(unsigned long long addr, unsigned long long len, int kind, int device,
                    int engine, unsigned flags, unsigned long long stream, int cache, ft_buf *b,
                    ft_io_opts *o)
{
    *b = (ft_buf){(void *)(uintptr_t)addr, (size_t)len, kind ? FT_MEM_CUDA : FT_MEM_HOST,
                  device};
    *o = (ft_io_opts){.engine = (ft_engine)engine, .flags = flags,
                      .stream = (void *)(uintptr_t)stream, .cache = (ft_cache_mode)cache};
}

/* Parse (file, address, length, offset, engine, flags, is_write[, kind, device, stream, cache]).
 * @return the file, or NULL with an exception set. */
static ft_file *parse_io(PyObject *args, ft_buf *b, uint64_t *off, ft_io_opts *o, int *write)
{
    PyObject *cap;
    unsigned long long addr, len, offset, stream = 0;
    int engine, kind = 0, device = 0, cache = 0;
    unsigned flags;
    if (!PyArg_ParseTuple(args, "OKKKiIp|iiKi", &cap, &addr, &len, &offset, &engine, &flags,
                          write, &kind, &device, &stream, &cache))
        return NULL;
    ft_file *f = cap_get(cap, CAP_FILE);
    *off = offset;
    make_io(addr, len, kind, device, engine, flags, stream, cache, b, o);
    return f;
}

/* -> bytes transferred */
static PyObject *py_file_io(PyObject *self, PyObject *args)
{
    (void)self;
    ft_buf b;
    ft_io_opts o;
    uint64_t off;
    int write;
    ft_file *f = parse_io(args, &b, &off, &o, &write);
    if (!f)
        return NULL;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = write ? ft_write(f, &b, off, &o) : ft_read(f, &b, off, &o);
    Py_END_ALLOW_THREADS
    return n < 0 ? raise_ft((int)n, ft_file_path(f)) : PyLong_FromLongLong(n);
}

/* -> a request */
static PyObject *py_file_submit(PyObject *self, PyObject *args)
{
    (void)self;
    ft_buf b;
    ft_io_opts o;
    uint64_t off;
    int write;
    ft_file *f = parse_io(args, &b, &off, &o, &write);
    if (!f)
        return NULL;
    ft_req *req;
    int rc = write ? ft_submit_write(f, &b, off, &o, &req) : ft_submit_read(f, &b, off, &o, &req);
    if (rc < 0)
        return raise_ft(rc, ft_file_path(f));
    return PyCapsule_New(req, CAP_REQ, req_free);
}

static PyObject *py_req_wait(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_req *req = cap_get(cap, CAP_REQ);
    if (!req)
        return NULL;
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = ft_req_wait(req);
    Py_END_ALLOW_THREADS
    return n < 0 ? raise_ft((int)n, NULL) : PyLong_FromLongLong(n);
}

static PyObject *py_req_poll(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_req *req = cap_get(cap, CAP_REQ);
    if (!req)
        return NULL;
    return PyBool_FromLong(ft_req_poll(req));
}

/* (ctx, address, length): fault a mapping's pages in, in parallel */
static PyObject *py_map_populate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "OKK", &cap, &addr, &len))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_map_populate(ctx, (const void *)(uintptr_t)addr, (size_t)len);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : (Py_INCREF(Py_None), Py_None);
}

static PyMethodDef methods[] = {
    {"ctx_create", py_ctx_create, METH_VARARGS, "ctx_create(threads, chunk, qd, bounce, engine)"},
    {"engine_id", py_engine_id, METH_VARARGS, "engine_id(name) -> int"},
    {"cache_id", py_cache_id, METH_VARARGS, "cache_id(name) -> int"},
    {"file_open", py_file_open, METH_VARARGS, "file_open(ctx, path, flags, mode) -> file"},
    {"file_close", py_file_close, METH_VARARGS, "file_close(file)"},
    {"file_size", py_file_size, METH_VARARGS, "file_size(file) -> int"},
    {"file_sync", py_file_sync, METH_VARARGS, "file_sync(file)"},
    {"file_io", py_file_io, METH_VARARGS, "file_io(file, addr, len, off, engine, flags, write)"},
    {"file_submit", py_file_submit, METH_VARARGS, "file_submit(...) -> request"},
    {"req_wait", py_req_wait, METH_VARARGS, "req_wait(req) -> int"},
    {"req_poll", py_req_poll, METH_VARARGS, "req_poll(req) -> bool"},
    {"map_populate", py_map_populate, METH_VARARGS, "map_populate(ctx, address, length)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastensor._C", "Binding of libfastensor.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void);
/* The error classes, named as fastensor's (the package re-exports them). */
static int add_errors(PyObject *m)
{
    ft_py_error = PyErr_NewExceptionWithDoc(
        "fastensor.SafetensorError", "safetensors' error class: invalid files, arguments "
        "and names (as SafetensorValueError and SafetensorKeyError, which are also ValueError "
        "and KeyError).", PyExc_Exception, NULL);
    PyObject *vb = ft_py_error ? PyTuple_Pack(2, ft_py_error, PyExc_ValueError) : NULL;
    PyObject *kb = ft_py_error ? PyTuple_Pack(2, ft_py_error, PyExc_KeyError) : NULL;
    ft_py_value_error = vb ? PyErr_NewExceptionWithDoc(
        "fastensor.SafetensorValueError", "An invalid file or argument: a SafetensorError and "
        "a ValueError.", vb, NULL) : NULL;
    /* str() of it is its message, as SafetensorError's (KeyError's own quotes it) */
    PyObject *str = PyObject_GetAttrString(PyExc_Exception, "__str__");
    PyObject *kd = str ? Py_BuildValue("{sO}", "__str__", str) : NULL;
    Py_XDECREF(str);
    ft_py_key_error = kb && kd ? PyErr_NewExceptionWithDoc(
        "fastensor.SafetensorKeyError", "A tensor name the checkpoint lacks: a "
        "SafetensorError and a KeyError.", kb, kd) : NULL;
    Py_XDECREF(kd);
    Py_XDECREF(vb);
    Py_XDECREF(kb);
    if (!ft_py_value_error || !ft_py_key_error)
        return -1;
    Py_INCREF(ft_py_error);
    Py_INCREF(ft_py_value_error);
    Py_INCREF(ft_py_key_error);
    if (PyModule_AddObject(m, "SafetensorError", ft_py_error) < 0 ||
        PyModule_AddObject(m, "SafetensorValueError", ft_py_value_error) < 0 ||
        PyModule_AddObject(m, "SafetensorKeyError", ft_py_key_error) < 0)
        return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m || add_errors(m) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "OPEN_READ", FT_OPEN_READ);
    PyModule_AddIntConstant(m, "OPEN_WRITE", FT_OPEN_WRITE);
    PyModule_AddIntConstant(m, "OPEN_CREATE", FT_OPEN_CREATE);
    PyModule_AddIntConstant(m, "OPEN_TRUNC", FT_OPEN_TRUNC);
    PyModule_AddIntConstant(m, "OPEN_EXCL", FT_OPEN_EXCL);
    PyModule_AddIntConstant(m, "IO_SYNC", FT_IO_SYNC);
    PyModule_AddIntConstant(m, "IO_SYNC_LATER", FT_IO_SYNC_LATER);
    PyModule_AddIntConstant(m, "SAVE_NO_CHECKSUM", FT_SAVE_NO_CHECKSUM);
    PyModule_AddIntConstant(m, "SAVE_NO_SYNC", FT_SAVE_NO_SYNC);
    PyModule_AddIntConstant(m, "CODEC_STORE", FT_CODEC_STORE);
    PyModule_AddIntConstant(m, "FORMAT_FST", FT_FORMAT_FST);
    /* the library's engines, by number */
    PyObject *engines = PyTuple_New(FT_ENGINE_COUNT);
    for (int e = 0; engines && e < FT_ENGINE_COUNT; e++)
        PyTuple_SetItem(engines, e, PyUnicode_FromString(ft_engine_name((ft_engine)e)));
    if (!engines || PyModule_AddObject(m, "ENGINES", engines) < 0) {
        Py_XDECREF(engines);
        Py_DECREF(m);
        return NULL;
    }
    /* the library's dtypes, in its order: (safetensors name, bits of an element, rank in
     * safetensors' layout order) */
    PyObject *dtypes = PyTuple_New(FT_DTYPE_COUNT);
    for (int d = 0; dtypes && d < FT_DTYPE_COUNT; d++)
        PyTuple_SetItem(dtypes, d, Py_BuildValue("(sII)", ft_dtype_name((ft_dtype)d),
                                                 ft_dtype_bits((ft_dtype)d),
                                                 ft_dtype_rank((ft_dtype)d)));
    if (!dtypes || PyModule_AddObject(m, "DTYPES", dtypes) < 0) {
        Py_XDECREF(dtypes);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddStringConstant(m, "LIB_VERSION", ft_version());
    if (store_add_functions(m) < 0 || batch_add_functions(m) < 0 ||
        codec_add_functions(m) < 0 || checkpoint_add_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
