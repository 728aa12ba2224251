/*
 * fastensor._C: the checkpoint functions (save, open, describe, loads and ranged reads,
 * verify, the page cache's state of a shard, garbage collection of a directory).
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

static void ckpt_free(PyObject *cap)
{
    ft_ckpt_close(PyCapsule_GetPointer(cap, CAP_CKPT));
    capsule_release_owner(cap);
}

/* The tensors of @p list, [(name, dtype, shape, address, nbytes[, kind, device])], into
 * *t and *shapes (PyMem; freed by the caller, also on failure). @return its length, or -1. */
static Py_ssize_t parse_tensors(PyObject *list, ft_tensor **t, uint64_t **shapes)
{
    *t = NULL;
    *shapes = NULL;
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "tensors must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_Size(list);
    *t = PyMem_Calloc((size_t)n + 1, sizeof **t);
    *shapes = PyMem_Calloc((size_t)n * FT_MAX_DIMS + 1, sizeof **shapes);
    if (!*t || !*shapes) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GetItem(list, i), *shape;
        const char *name, *dtype;
        unsigned long long addr, nbytes;
        int kind = 0, device = 0;
        if (!PyArg_ParseTuple(item, "ssOKK|ii", &name, &dtype, &shape, &addr, &nbytes, &kind,
                              &device))
            return -1;
        int d = ft_dtype_from_name(dtype);
        Py_ssize_t ndim = PyTuple_Check(shape) ? PyTuple_Size(shape) : -1;
        if (d < 0 || ndim < 0 || ndim > FT_MAX_DIMS) {
            PyErr_Format(ft_py_value_error, "tensor '%s': bad dtype '%s' or shape", name, dtype);
            return -1;
        }
        uint64_t *dims = &(*shapes)[i * FT_MAX_DIMS];
        for (Py_ssize_t k = 0; k < ndim; k++) {
            dims[k] = PyLong_AsUnsignedLongLong(PyTuple_GetItem(shape, k));
            if (PyErr_Occurred())
                return -1;
        }
        (*t)[i] = (ft_tensor){name, (ft_dtype)d, (unsigned)ndim, dims,
                              {(void *)(uintptr_t)addr, (size_t)nbytes,
                               kind ? FT_MEM_CUDA : FT_MEM_HOST, device}};
    }
    return n;
}

#define CAP_CODED "fastensor.fst_coded"

static void coded_free(PyObject *cap)
{
    ft_fst_coded_free(PyCapsule_GetPointer(cap, CAP_CODED));
}

/* The ft_fst_coded of capsule @p cap (None: NULL, *ok still 1). */
static ft_fst_coded *coded_of(PyObject *cap, int *ok)
{
    *ok = 1;
    if (cap == Py_None)
        return NULL;
    ft_fst_coded *c = PyCapsule_GetPointer(cap, CAP_CODED);
    *ok = c != NULL;
    return c;
}

/* (ctx, path, [tensors], {meta}, engine, shard_size, flags[, cache, compression, coded,
 * [coded index] or None]) -> the warning's text or None */
static PyObject *py_ckpt_save(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *list, *meta, *coded_cap = Py_None, *index_list = Py_None;
    const char *path;
    int engine, cache = 0, compression = 0, ok;
    unsigned long long shard_size;
    unsigned flags;
    if (!PyArg_ParseTuple(args, "OsOOiKI|iiOO", &cap, &path, &list, &meta, &engine, &shard_size,
                          &flags, &cache, &compression, &coded_cap, &index_list))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    ft_fst_coded *coded = coded_of(coded_cap, &ok);
    if (!ctx || !ok)
        return NULL;
    if (!PyDict_Check(meta))
        return PyErr_Format(PyExc_TypeError, "metadata must be a dict");
    ft_tensor *t;
    uint64_t *shapes;
    Py_ssize_t nmeta = PyDict_Size(meta), n = parse_tensors(list, &t, &shapes);
    const char **kv = PyMem_Calloc((size_t)nmeta * 2 + 1, sizeof *kv);
    size_t *index = NULL;
    PyObject *result = NULL;
    if (n < 0)
        goto out;
    if (!kv) {
        PyErr_NoMemory();
        goto out;
    }
    if (index_list != Py_None) {
        if (!PyList_Check(index_list) || PyList_Size(index_list) != n) {
            PyErr_SetString(PyExc_TypeError, "the coded index must be a list, one per tensor");
            goto out;
        }
        if (!(index = PyMem_Calloc((size_t)n + 1, sizeof *index))) {
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if ((index[i] = PyLong_AsSize_t(PyList_GetItem(index_list, i))) == (size_t)-1 &&
                PyErr_Occurred())
                goto out;
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
                       .compression = (ft_compression)compression, .metadata = kv,
                       .coded = coded, .coded_index = index};
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
    PyMem_Free(index);
    return result;
}

/* fst_code(ctx, dir, [tensors], compression, coded or None) -> (coded, stream bytes): the
 * tensors coded for a .fst save into @p coded's memory (a new object where None) */
static PyObject *py_fst_code(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *list, *coded_cap;
    const char *dir;
    int compression, ok;
    if (!PyArg_ParseTuple(args, "OsOiO", &cap, &dir, &list, &compression, &coded_cap))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    ft_fst_coded *coded = coded_of(coded_cap, &ok);
    if (!ctx || !ok)
        return NULL;
    ft_tensor *t;
    uint64_t *shapes;
    Py_ssize_t n = parse_tensors(list, &t, &shapes);
    PyObject *result = NULL;
    if (n >= 0) {
        ft_save_opts so = {.compression = (ft_compression)compression};
        ft_fst_coded *made = coded;
        int64_t total;
        Py_BEGIN_ALLOW_THREADS
        total = ft_fst_code(ctx, dir, t, (size_t)n, &so, &made);
        Py_END_ALLOW_THREADS
        PyObject *obj = made == coded ? (Py_INCREF(coded_cap), coded_cap)
                                      : PyCapsule_New(made, CAP_CODED, coded_free);
        if (!obj)
            ft_fst_coded_free(made);
        else if (total < 0)
            raise_ft((int)total, dir);
        else
            result = Py_BuildValue("(OL)", obj, (long long)total);
        Py_XDECREF(obj);
    }
    PyMem_Free(t);
    PyMem_Free(shapes);
    return result;
}

/* fst_coded_memory(coded) -> the host memory it holds, in bytes */
static PyObject *py_fst_coded_memory(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int ok;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_fst_coded *coded = coded_of(cap, &ok);
    return ok ? PyLong_FromUnsignedLongLong(ft_fst_coded_memory(coded)) : NULL;
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

/* The checkpoint of a call's one argument, or NULL with the exception set. */
static ft_ckpt *ckpt_arg(PyObject *args)
{
    PyObject *cap;
    return PyArg_ParseTuple(args, "O", &cap) ? cap_get(cap, CAP_CKPT) : NULL;
}

/* -> ([(name, dtype, shape, nbytes, shard, data_offset)], {meta}, [(path, data_size)]) */
static PyObject *py_ckpt_describe(PyObject *self, PyObject *args)
{
    (void)self;
    ft_ckpt *c = ckpt_arg(args);
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

/* ckpt_format(ckpt) -> FORMAT_FST or 0 (safetensors): what the library found the file to be */
static PyObject *py_ckpt_format(PyObject *self, PyObject *args)
{
    (void)self;
    ft_ckpt *c = ckpt_arg(args);
    return c ? PyLong_FromLong(ft_ckpt_format(c)) : NULL;
}

/* ckpt_stored(ckpt) -> (format, [(file offset, stored bytes, coded)]): a .fst container's
 * streams (FT_FORMAT_FST), or a safetensors checkpoint's tensors as they are */
static PyObject *py_ckpt_stored(PyObject *self, PyObject *args)
{
    (void)self;
    ft_ckpt *c = ckpt_arg(args);
    if (!c)
        return NULL;
    size_t n = ft_ckpt_count(c);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        ft_tensor_info info;
        uint64_t stored = 0;
        ft_ckpt_info(c, i, &info);
        int coded = ft_ckpt_stored(c, i, &stored);
        PyObject *item = Py_BuildValue("(KKO)", (unsigned long long)info.file_offset,
                                       (unsigned long long)stored,
                                       coded == 1 ? Py_True : Py_False);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, item);
    }
    return list ? Py_BuildValue("(iN)", ft_ckpt_format(c), list) : NULL;
}

static PyObject *cost_tuple(const ft_fst_cost *c)
{
    return Py_BuildValue("(ddddd)", c->encode, c->share, c->decode, c->write, c->read);
}

/* fst_measure(ctx, dir or None, elem) -> (encode, share, decode, write, read) GB/s */
static PyObject *py_fst_measure(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *dir;
    unsigned elem;
    if (!PyArg_ParseTuple(args, "OzI", &cap, &dir, &elem))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    ft_fst_cost c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_fst_measure(ctx, dir, elem, &c);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, dir) : cost_tuple(&c);
}

static int cost_args(PyObject *t, ft_fst_cost *c)
{
    return PyArg_ParseTuple(t, "ddddd", &c->encode, &c->share, &c->decode, &c->write, &c->read);
}

/* fst_cost_set(ctx, dir or None, elem, (encode, share, decode, write, read)) */
static PyObject *py_fst_cost_set(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *t;
    const char *dir;
    unsigned elem;
    ft_fst_cost c;
    if (!PyArg_ParseTuple(args, "OzIO", &cap, &dir, &elem, &t) || !cost_args(t, &c))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    int rc = ft_fst_cost_set(ctx, dir, elem, &c);
    return rc < 0 ? raise_ft(rc, dir) : (Py_INCREF(Py_None), Py_None);
}

/* fst_gpu_codes(ctx, device, elem) -> (codes, encode GB/s) */
static PyObject *py_fst_gpu_codes(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int device;
    unsigned elem;
    if (!PyArg_ParseTuple(args, "OiI", &cap, &device, &elem))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    double rate;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_fst_gpu_codes(ctx, device, elem, &rate);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : Py_BuildValue("(Od)", rc ? Py_True : Py_False, rate);
}

/* fst_coding_pays((encode, share, decode, write, read)) -> bool */
static PyObject *py_fst_coding_pays(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *t;
    ft_fst_cost c;
    if (!PyArg_ParseTuple(args, "O", &t) || !cost_args(t, &c))
        return NULL;
    return PyBool_FromLong(ft_fst_coding_pays(&c));
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
        PyErr_Format(ft_py_value_error, "shard %llu: the checkpoint has no such shard", index);
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

/* (ckpt, shard, cache[, address]) -> whether the shard is (being read) in the page cache;
 * with the address of a mapping of the shard's file, its pages are mapped in too */
static PyObject *py_ckpt_shard_prefetch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned shard;
    int cache;
    unsigned long long addr = 0;
    if (!PyArg_ParseTuple(args, "OIi|K", &cap, &shard, &cache, &addr))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    const void *map = (const void *)(uintptr_t)addr;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = map ? ft_ckpt_prefetch_map(c, shard, (ft_cache_mode)cache, map)
             : ft_ckpt_prefetch(c, shard, (ft_cache_mode)cache);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : PyBool_FromLong(rc);
}

/* file_install(ctx, path, bytes, sync) -> None, or the warning's text (installed, the
 * directory fsync failed) */
static PyObject *py_file_install(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *path;
    Py_buffer data;
    int sync;
    if (!PyArg_ParseTuple(args, "Osy*p", &cap, &path, &data, &sync))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_file_install(ctx, path, data.buf, (size_t)data.len, sync ? 0 : FT_SAVE_NO_SYNC);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (rc < 0)
        return raise_ft(rc, path);
    if (rc == FT_SAVE_WARNING)
        return PyUnicode_DecodeUTF8(ft_last_error(), (Py_ssize_t)strlen(ft_last_error()),
                                    "replace");
    Py_RETURN_NONE;
}

/* file_remove(ctx, path): unlinked, its blocks freed off the caller's path */
static PyObject *py_file_remove(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    const char *path;
    if (!PyArg_ParseTuple(args, "Os", &cap, &path))
        return NULL;
    ft_ctx *ctx = cap_get(cap, CAP_CTX);
    if (!ctx)
        return NULL;
    int rc = ft_file_remove(ctx, path);
    return rc < 0 ? raise_ft(rc, path) : (Py_INCREF(Py_None), Py_None);
}

/* (ckpt, shard, engine, verify, mmap 1 / 0 / -1) -> whether to map the shard (else read) */
static PyObject *py_ckpt_shard_mappable(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned shard;
    int engine, verify, mmap;
    if (!PyArg_ParseTuple(args, "OIipi", &cap, &shard, &engine, &verify, &mmap))
        return NULL;
    ft_ckpt *c = cap_get(cap, CAP_CKPT);
    if (!c)
        return NULL;
    ft_load_opts o = {.engine = (ft_engine)engine, .flags = verify ? FT_LOAD_VERIFY : 0};
    int rc = ft_ckpt_shard_mappable(c, shard, &o, mmap);
    return rc < 0 ? raise_ft(rc, NULL) : PyBool_FromLong(rc);
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

static PyMethodDef checkpoint_methods[] = {
    {"ckpt_shard_fd", py_ckpt_shard_fd, METH_VARARGS, "ckpt_shard_fd(ckpt, shard) -> int"},
    {"ckpt_shard_mappable", py_ckpt_shard_mappable, METH_VARARGS,
     "ckpt_shard_mappable(ckpt, shard, engine, verify, mmap) -> bool"},
    {"ckpt_gc", py_ckpt_gc, METH_VARARGS, "ckpt_gc(ctx, dir) -> [removed paths]"},
    {"ckpt_save", py_ckpt_save, METH_VARARGS, "ckpt_save(ctx, path, tensors, meta, ...)"},
    {"ckpt_open", py_ckpt_open, METH_VARARGS, "ckpt_open(ctx, path) -> ckpt"},
    {"ckpt_describe", py_ckpt_describe, METH_VARARGS, "ckpt_describe(ckpt) -> (...)"},
    {"ckpt_stored", py_ckpt_stored, METH_VARARGS, "ckpt_stored(ckpt) -> (format, [...])"},
    {"ckpt_format", py_ckpt_format, METH_VARARGS, "ckpt_format(ckpt) -> format"},
    {"file_install", py_file_install, METH_VARARGS, "file_install(ctx, path, data, sync)"},
    {"file_remove", py_file_remove, METH_VARARGS, "file_remove(ctx, path)"},
    {"fst_measure", py_fst_measure, METH_VARARGS, "fst_measure(ctx, dir, elem) -> (...)"},
    {"fst_cost_set", py_fst_cost_set, METH_VARARGS, "fst_cost_set(ctx, dir, elem, cost)"},
    {"fst_gpu_codes", py_fst_gpu_codes, METH_VARARGS, "fst_gpu_codes(ctx, dev, elem) -> (...)"},
    {"fst_coding_pays", py_fst_coding_pays, METH_VARARGS, "fst_coding_pays(cost) -> bool"},
    {"fst_code", py_fst_code, METH_VARARGS, "fst_code(ctx, dir, tensors, mode, coded) -> (...)"},
    {"fst_coded_memory", py_fst_coded_memory, METH_VARARGS, "fst_coded_memory(coded) -> int"},
    {"ckpt_load_shard", py_ckpt_load_shard, METH_VARARGS, "ckpt_load_shard(...) -> int"},
    {"ckpt_read", py_ckpt_read, METH_VARARGS, "ckpt_read(ckpt, index, offset, ...) -> int"},
    {"ckpt_read_shard", py_ckpt_read_shard, METH_VARARGS,
     "ckpt_read_shard(ckpt, shard, offset, ...) -> int"},
    {"ckpt_verify", py_ckpt_verify, METH_VARARGS, "ckpt_verify(ckpt, engine)"},
    {"ckpt_shard_cached", py_ckpt_shard_cached, METH_VARARGS,
     "ckpt_shard_cached(ckpt, shard) -> bool"},
    {"ckpt_shard_prefetch", py_ckpt_shard_prefetch, METH_VARARGS,
     "ckpt_shard_prefetch(ckpt, shard, cache[, map_address]) -> bool"},
    {NULL, NULL, 0, NULL},
};

int checkpoint_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, checkpoint_methods);
}
