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

PyObject *raise_ft(int err, const char *path)
{
    int e = err < 0 ? -err : err;
    const char *detail = ft_last_error();
    if (e == EBADMSG || e == EINVAL || e == ERANGE || e == ENODATA) {
        PyErr_Format(PyExc_ValueError, "%s%s%s", detail && *detail ? detail : ft_strerror(err),
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

static void ckpt_free(PyObject *cap)
{
    ft_ckpt_close(PyCapsule_GetPointer(cap, CAP_CKPT));
    capsule_release_owner(cap);
}

void *cap_get(PyObject *cap, const char *name)
{
    void *p = PyCapsule_GetPointer(cap, name);
    if (!p && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s is closed", name);
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
    if (e < 0)
        return PyErr_Format(PyExc_ValueError,
                            "unknown engine '%s' (auto, posix, direct, uring, mmap)", name);
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

/* (ctx, path, [(name, dtype, shape, address, nbytes)], {meta}, engine, shard_size, flags) */
static PyObject *py_ckpt_save(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *list, *meta;
    const char *path;
    int engine, cache = 0;
    unsigned long long shard_size;
    unsigned flags;
    if (!PyArg_ParseTuple(args, "OsOOiKI|i", &cap, &path, &list, &meta, &engine, &shard_size,
                          &flags, &cache))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    if (!PyList_Check(list) || !PyDict_Check(meta))
        return PyErr_Format(PyExc_TypeError, "tensors must be a list, metadata a dict");
    Py_ssize_t n = PyList_Size(list), nmeta = PyDict_Size(meta);
    ft_tensor *t = PyMem_Calloc((size_t)n + 1, sizeof *t);
    uint64_t *shapes = PyMem_Calloc((size_t)n * FT_MAX_DIMS + 1, sizeof *shapes);
    const char **kv = PyMem_Calloc((size_t)nmeta * 2 + 1, sizeof *kv);
    PyObject *result = NULL;
    if (!t || !shapes || !kv) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i), *shape;
        const char *name, *dtype;
        unsigned long long addr, nbytes;
        int kind = 0, device = 0;
        if (!PyArg_ParseTuple(item, "ssOKK|ii", &name, &dtype, &shape, &addr, &nbytes, &kind,
                              &device))
            goto out;
        int d = ft_dtype_from_name(dtype);
        Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_Size(shape) : -1;
        if (d < 0 || ndim < 0 || ndim > FT_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "tensor '%s': bad dtype '%s' or shape", name, dtype);
            goto out;
        }
        for (Py_ssize_t k = 0; k < ndim; k++) {
            shapes[i * FT_MAX_DIMS + k] = PyLong_AsUnsignedLongLong(PyTuple_GetItem(shape, k));
            if (PyErr_Occurred())
                goto out;
        }
        t[i] = (ft_tensor){name, (ft_dtype)d, (unsigned)ndim, &shapes[i * FT_MAX_DIMS],
                           {(void *)(uintptr_t)addr, (size_t)nbytes,
                            kind ? FT_MEM_CUDA : FT_MEM_HOST, device}};
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0, at = 0;
    while (PyDict_Next(meta, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyUnicode_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "metadata keys and values must be str");
            goto out;
        }
        kv[at++] = PyUnicode_AsUTF8AndSize(key, NULL);
        kv[at++] = PyUnicode_AsUTF8AndSize(value, NULL);
        if (!kv[at - 1] || !kv[at - 2])
            goto out;
    }
    ft_save_opts so = {.engine = (ft_engine)engine, .flags = flags, .shard_size = shard_size,
                       .cache = (ft_cache_mode)cache,
                       .metadata = kv};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ckpt_save(ctx, path, t, (size_t)n, &so);
    Py_END_ALLOW_THREADS
    /* the warning's text (the new checkpoint is installed), or None */
    if (rc < 0)
        raise_ft(rc, path);
    else if (rc == FT_SAVE_WARNING)
        result = PyUnicode_DecodeUTF8(ft_last_error(), (Py_ssize_t)strlen(ft_last_error()),
                                      "replace");
    else
        result = (Py_INCREF(Py_None), Py_None);
out:
    PyMem_Free(t);
    PyMem_Free(shapes);
    PyMem_Free(kv);
    return result;
}

static PyObject *py_ckpt_open(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *path;
    if (!PyArg_ParseTuple(args, "Os", &cap, &path))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    ft_ckpt *c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ckpt_open(ctx, &c, path);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_ft(rc, path);
    return capsule_owning(c, CAP_CKPT, ckpt_free, cap);
}

/* -> ([(name, dtype, shape, nbytes, shard, data_offset)], {meta}, [(path, data_size)]) */
static PyObject *py_ckpt_describe(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    size_t n = ft_ckpt_count(c);
    PyObject *tensors = PyList_New((Py_ssize_t)n), *meta = PyDict_New(),
             *shards = PyList_New(ft_ckpt_shard_count(c));
    if (!tensors || !meta || !shards)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        ft_tensor_info info;
        ft_ckpt_info(c, i, &info);
        PyObject *shape = PyTuple_New(info.ndim);
        if (!shape)
            goto fail;
        for (unsigned d = 0; d < info.ndim; d++)
            PyTuple_SetItem(shape, d, PyLong_FromUnsignedLongLong(info.shape[d]));
        PyObject *item = Py_BuildValue("(ssNKIK)", info.name, ft_dtype_name(info.dtype), shape,
                                       (unsigned long long)info.nbytes, info.shard,
                                       (unsigned long long)info.data_offset);
        if (!item)
            goto fail;
        PyList_SetItem(tensors, (Py_ssize_t)i, item);
    }
    for (size_t i = 0; i < ft_ckpt_metadata_count(c); i++) {
        const char *k, *v;
        ft_ckpt_metadata(c, i, &k, &v);
        PyObject *pv = PyUnicode_FromString(v);
        if (!pv || PyDict_SetItemString(meta, k, pv) < 0) {
            Py_XDECREF(pv);
            goto fail;
        }
        Py_DECREF(pv);
    }
    for (unsigned k = 0; k < ft_ckpt_shard_count(c); k++) {
        PyObject *item = Py_BuildValue("(sLL)", ft_ckpt_shard_path(c, k),
                                       (long long)ft_ckpt_shard_size(c, k),
                                       (long long)ft_ckpt_shard_data_start(c, k));
        if (!item)
            goto fail;
        PyList_SetItem(shards, k, item);
    }
    return Py_BuildValue("(NNNi)", tensors, meta, shards, ft_ckpt_has_checksums(c));
fail:
    Py_XDECREF(tensors);
    Py_XDECREF(meta);
    Py_XDECREF(shards);
    return NULL;
}

/* The destination and options the load calls share: memory at addr (kind 0 host, 1 CUDA
 * device), engine, verify, stream, cache. */
typedef struct load_args {
    unsigned long long addr, len, stream;
    int engine, verify, kind, device, cache;
} load_args;

static ft_buf load_buf(const load_args *a)
{
    return (ft_buf){(void *)(uintptr_t)a->addr, (size_t)a->len,
                    a->kind ? FT_MEM_CUDA : FT_MEM_HOST, a->device};
}

static ft_load_opts load_opts(const load_args *a)
{
    return (ft_load_opts){.engine = (ft_engine)a->engine,
                          .flags = a->verify ? FT_LOAD_VERIFY : 0,
                          .stream = (void *)(uintptr_t)a->stream,
                          .cache = (ft_cache_mode)a->cache};
}

/* ckpt_load_shard(ckpt, shard, address, length, engine, verify, kind, device, stream,
 * cache) -> bytes */
static PyObject *py_ckpt_load_shard(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned shard;
    load_args a = {0};
    if (!PyArg_ParseTuple(args, "OIKKip|iiKi", &cap, &shard, &a.addr, &a.len, &a.engine,
                          &a.verify, &a.kind, &a.device, &a.stream, &a.cache))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    ft_buf b = load_buf(&a);
    ft_load_opts o = load_opts(&a);
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = ft_ckpt_load_shard(c, shard, &b, &o);
    Py_END_ALLOW_THREADS
    return n < 0 ? raise_ft((int)n, ft_ckpt_shard_path(c, shard)) : PyLong_FromLongLong(n);
}

/* Bytes [offset, offset + nbytes) of one tensor (whole_shard false) or of one shard's data
 * section into memory at address; the arguments of ckpt_read and ckpt_read_shard. */
static PyObject *ckpt_read_part(PyObject *args, bool whole_shard)
{
    PyObject *cap;
    unsigned long long index, off;
    load_args a = {0};
    if (!PyArg_ParseTuple(args, "OKKKKip|iiKi", &cap, &index, &off, &a.addr, &a.len, &a.engine,
                          &a.verify, &a.kind, &a.device, &a.stream, &a.cache))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    if (whole_shard && index > UINT_MAX) {
        PyErr_Format(PyExc_ValueError, "shard %llu: the checkpoint has no such shard", index);
        return NULL;
    }
    ft_buf b = load_buf(&a);
    ft_load_opts o = load_opts(&a);
    int64_t n;
    Py_BEGIN_ALLOW_THREADS
    n = whole_shard ? ft_ckpt_read_shard_range(c, (unsigned)index, off, &b, &o)
                    : ft_ckpt_read_range(c, (size_t)index, off, &b, &o);
    Py_END_ALLOW_THREADS
    return n < 0 ? raise_ft((int)n, NULL) : PyLong_FromLongLong(n);
}

/* ckpt_read(ckpt, index, offset, address, nbytes, engine, verify, kind, device, stream,
 * cache): bytes [offset, offset + nbytes) of one tensor into memory at address. */
static PyObject *py_ckpt_read(PyObject *self, PyObject *args)
{
    (void)self;
    return ckpt_read_part(args, false);
}

/* ckpt_read_shard(ckpt, shard, offset, address, nbytes, ...): bytes of a shard's data
 * section (several neighbouring tensors in one read). */
static PyObject *py_ckpt_read_shard(PyObject *self, PyObject *args)
{
    (void)self;
    return ckpt_read_part(args, true);
}

static PyObject *py_ckpt_verify(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int engine;
    if (!PyArg_ParseTuple(args, "Oi", &cap, &engine))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    ft_load_opts o = {.engine = (ft_engine)engine};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ckpt_verify(c, &o, NULL, NULL);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : (Py_INCREF(Py_None), Py_None);
}

/* The (ckpt, shard) arguments. @return 1, or 0 with the exception set. */
static int ckpt_shard_args(PyObject *args, ft_ckpt **c, unsigned *shard)
{
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "OI", &cap, shard))
        return 0;
    *c = cap_get(cap, CAP_CKPT);
    return *c != NULL;
}

/* (ckpt, shard) -> whether the shard's data section is in the page cache */
static PyObject *py_ckpt_shard_cached(PyObject *self, PyObject *args)
{
    (void)self;
    ft_ckpt *c;
    unsigned shard;
    if (!ckpt_shard_args(args, &c, &shard))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ckpt_shard_cached(c, shard);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : PyBool_FromLong(rc);
}

/* (ckpt, shard, cache) -> whether the shard is (being read) in the page cache */
static PyObject *py_ckpt_shard_prefetch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned shard;
    int cache;
    if (!PyArg_ParseTuple(args, "OIi", &cap, &shard, &cache))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_ckpt_prefetch(c, shard, (ft_cache_mode)cache);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : PyBool_FromLong(rc);
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

/* (ckpt, shard) -> the descriptor the shard was parsed through (owned by the checkpoint) */
static PyObject *py_ckpt_shard_fd(PyObject *self, PyObject *args)
{
    (void)self;
    ft_ckpt *c;
    unsigned shard;
    if (!ckpt_shard_args(args, &c, &shard))
        return NULL;
    int fd = ft_ckpt_shard_fd(c, shard);
    return fd < 0 ? raise_ft(fd, NULL) : PyLong_FromLong(fd);
}

static void gc_note(const char *path, void *arg)
{
    PyObject *list = arg, *s = PyUnicode_DecodeFSDefault(path);
    if (s) {
        PyList_Append(list, s);
        Py_DECREF(s);
    }
    PyErr_Clear();
}

/* (ctx, dir) -> [removed paths] */
static PyObject *py_ckpt_gc(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ctxcap;
    const char *dir;
    if (!PyArg_ParseTuple(args, "Os", &ctxcap, &dir))
        return NULL;
    ft_ctx *ctx = cap_get(ctxcap, CAP_CTX);
    PyObject *list = ctx ? PyList_New(0) : NULL;
    if (!list)
        return NULL;
    int64_t rc = ft_ckpt_gc(ctx, dir, gc_note, list); /* the GIL held: gc_note appends */
    if (rc < 0) {
        Py_DECREF(list);
        return raise_ft((int)rc, dir);
    }
    return list;
}

static PyMethodDef methods[] = {
    {"ckpt_shard_fd", py_ckpt_shard_fd, METH_VARARGS, "ckpt_shard_fd(ckpt, shard) -> int"},
    {"ckpt_gc", py_ckpt_gc, METH_VARARGS, "ckpt_gc(ctx, dir) -> [removed paths]"},
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
    {"ckpt_save", py_ckpt_save, METH_VARARGS, "ckpt_save(ctx, path, tensors, meta, ...)"},
    {"ckpt_open", py_ckpt_open, METH_VARARGS, "ckpt_open(ctx, path) -> ckpt"},
    {"ckpt_describe", py_ckpt_describe, METH_VARARGS, "ckpt_describe(ckpt) -> (...)"},
    {"ckpt_load_shard", py_ckpt_load_shard, METH_VARARGS, "ckpt_load_shard(...) -> int"},
    {"ckpt_read", py_ckpt_read, METH_VARARGS, "ckpt_read(ckpt, index, offset, ...) -> int"},
    {"ckpt_read_shard", py_ckpt_read_shard, METH_VARARGS,
     "ckpt_read_shard(ckpt, shard, offset, ...) -> int"},
    {"ckpt_verify", py_ckpt_verify, METH_VARARGS, "ckpt_verify(ckpt, engine)"},
    {"ckpt_shard_cached", py_ckpt_shard_cached, METH_VARARGS,
     "ckpt_shard_cached(ckpt, shard) -> bool"},
    {"map_populate", py_map_populate, METH_VARARGS, "map_populate(ctx, address, length)"},
    {"ckpt_shard_prefetch", py_ckpt_shard_prefetch, METH_VARARGS,
     "ckpt_shard_prefetch(ckpt, shard, cache) -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastensor._C", "Binding of libfastensor.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
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
    PyModule_AddStringConstant(m, "LIB_VERSION", ft_version());
    if (store_add_functions(m) < 0 || batch_add_functions(m) < 0 ||
        codec_add_functions(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
