/*
 * fastensor._C: the spill store (ft_store_*). Keys are integers; buffers are (address,
 * length, kind, device) as in _ext.c, with the producer's or consumer's CUstream as an
 * integer (0: the legacy default stream). Calls that may block release the GIL.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>

#include "fastensor.h"
#include "_ext.h"

#define CAP_STORE "fastensor.store"

/* The store's capsule holds a reference to its context's capsule (its capsule context), so
 * the context outlives the store even when the interpreter frees objects in any order. */
static void store_free(PyObject *cap)
{
    ft_store *s = PyCapsule_GetPointer(cap, CAP_STORE);
    if (s) {
        Py_BEGIN_ALLOW_THREADS
        ft_store_destroy(s);
        Py_END_ALLOW_THREADS
    }
    capsule_release_owner(cap);
}

/* store_create(ctx, dir|None, capacity, staging, host_cache, engine) -> store */
static PyObject *py_store_create(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ctxcap;
    const char *dir = NULL;
    unsigned long long capacity, staging, cache, page_cache;
    int engine;
    if (!PyArg_ParseTuple(args, "OzKKKiK", &ctxcap, &dir, &capacity, &staging, &cache, &engine,
                          &page_cache))
        return NULL;
    ft_ctx *ctx = cap_get(ctxcap, CAP_CTX);
    if (!ctx)
        return NULL;
    ft_store_opts o = {.dir = dir, .capacity = capacity, .staging_bytes = staging,
                       .host_cache_bytes = cache, .engine = (ft_engine)engine,
                       .page_cache_bytes = page_cache};
    ft_store *s;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_store_create(ctx, &s, &o);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return raise_ft(rc, dir);
    PyObject *cap = capsule_owning(s, CAP_STORE, store_free, ctxcap);
    if (!cap)
        ft_store_destroy(s);
    return cap;
}

static PyObject *py_store_close(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    ft_store *s = PyCapsule_GetPointer(cap, CAP_STORE);
    if (!s) { /* already closed */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyCapsule_SetDestructor(cap, NULL);
    PyCapsule_SetName(cap, "fastensor.store.closed");
    Py_BEGIN_ALLOW_THREADS
    ft_store_destroy(s);
    Py_END_ALLOW_THREADS
    capsule_release_owner(cap);
    Py_RETURN_NONE;
}

/* The store of a call whose only argument is the store, or NULL with an exception. */
static ft_store *store_only(PyObject *args)
{
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap))
        return NULL;
    return cap_get(cap, CAP_STORE);
}

/* (store, key-or-address..., ) helpers */
static ft_buf make_buf(unsigned long long addr, unsigned long long len, int kind, int device)
{
    return (ft_buf){(void *)(uintptr_t)addr, (size_t)len, kind ? FT_MEM_CUDA : FT_MEM_HOST,
                    device};
}

/* store_put(store, addr, len, kind, device, stream) -> key */
static PyObject *py_store_put(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned long long addr, len, stream;
    int kind, device;
    if (!PyArg_ParseTuple(args, "OKKiiK", &cap, &addr, &len, &kind, &device, &stream))
        return NULL;
    ft_store *s = cap_get(cap, CAP_STORE);
    if (!s)
        return NULL;
    ft_buf b = make_buf(addr, len, kind, device);
    uint64_t key = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_store_put(s, &b, (void *)(uintptr_t)stream, &key);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : PyLong_FromUnsignedLongLong(key);
}

/* store_get(store, key, addr, len, kind, device, stream) */
static PyObject *py_store_get(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    unsigned long long key, addr, len, stream;
    int kind, device;
    if (!PyArg_ParseTuple(args, "OKKKiiK", &cap, &key, &addr, &len, &kind, &device, &stream))
        return NULL;
    ft_store *s = cap_get(cap, CAP_STORE);
    if (!s)
        return NULL;
    ft_buf b = make_buf(addr, len, kind, device);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_store_get(s, key, &b, (void *)(uintptr_t)stream);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : (Py_INCREF(Py_None), Py_None);
}

/* Run fn(store, key) for a call taking (store, key). @return 0 with *rc, or -1 with an
 * exception (bad arguments or a closed store). */
static int key_run(PyObject *args, int (*fn)(ft_store *, uint64_t), int blocking, int *rc)
{
    PyObject *cap;
    unsigned long long key;
    if (!PyArg_ParseTuple(args, "OK", &cap, &key))
        return -1;
    ft_store *s = cap_get(cap, CAP_STORE);
    if (!s)
        return -1;
    if (blocking) {
        Py_BEGIN_ALLOW_THREADS
        *rc = fn(s, key);
        Py_END_ALLOW_THREADS
    } else {
        *rc = fn(s, key);
    }
    return 0;
}

/* The calls taking (store, key) and answering a bool: released, poll, wait, drop. */
static PyObject *key_call(PyObject *args, int (*fn)(ft_store *, uint64_t), int blocking)
{
    int rc;
    if (key_run(args, fn, blocking, &rc) < 0)
        return NULL;
    return rc < 0 ? raise_ft(rc, NULL) : PyBool_FromLong(rc);
}

static PyObject *py_store_released(PyObject *self, PyObject *args)
{
    (void)self;
    return key_call(args, ft_store_released, 0);
}

/* -> 1 started, 0 nothing to do, -1 no ring space now */
static PyObject *py_store_prefetch(PyObject *self, PyObject *args)
{
    (void)self;
    int rc;
    if (key_run(args, ft_store_prefetch, 0, &rc) < 0)
        return NULL;
    if (rc == -EBUSY)
        return PyLong_FromLong(-1);
    return rc < 0 ? raise_ft(rc, NULL) : PyLong_FromLong(rc);
}

static PyObject *py_store_poll(PyObject *self, PyObject *args)
{
    (void)self;
    return key_call(args, ft_store_poll, 0);
}

static PyObject *py_store_wait(PyObject *self, PyObject *args)
{
    (void)self;
    return key_call(args, ft_store_wait, 1);
}

static PyObject *py_store_flush(PyObject *self, PyObject *args)
{
    (void)self;
    ft_store *s = store_only(args);
    if (!s)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ft_store_flush(s);
    Py_END_ALLOW_THREADS
    return rc < 0 ? raise_ft(rc, NULL) : (Py_INCREF(Py_None), Py_None);
}

static PyObject *py_store_drop(PyObject *self, PyObject *args)
{
    (void)self;
    return key_call(args, ft_store_drop, 0);
}

/* store_stats(store) -> dict of the counters */
static PyObject *py_store_stats(PyObject *self, PyObject *args)
{
    (void)self;
    ft_store *s = store_only(args);
    if (!s)
        return NULL;
    ft_store_stats st;
    int rc = ft_store_get_stats(s, &st);
    if (rc < 0)
        return raise_ft(rc, NULL);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKssss}", "puts", st.puts, "gets", st.gets, "bytes_put",
        st.bytes_put, "bytes_written", st.bytes_written, "writes_skipped", st.writes_skipped,
        "bytes_read", st.bytes_read,
        "bytes_got", st.bytes_got, "bytes_prefetched", st.bytes_prefetched, "host_hits",
        st.host_hits, "stall_ns", st.stall_ns, "inflight_bytes", st.inflight_bytes,
        "peak_inflight_bytes", st.peak_inflight_bytes, "entries", st.entries, "file_used",
        st.file_used, "file_size", st.file_size, "host_resident", st.host_resident,
        "host_used", st.host_used, "host_budget", st.host_budget, "host_pinned",
        st.host_pinned, "bytes_demoted", st.bytes_demoted, "engine", ft_engine_name(st.engine), "cache",
        ft_cache_name(st.cache));
}

/* store_stream(store, device) -> the CUstream of device-to-host copies, as an int */
static PyObject *py_store_stream(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    int device;
    if (!PyArg_ParseTuple(args, "Oi", &cap, &device))
        return NULL;
    ft_store *s = cap_get(cap, CAP_STORE);
    if (!s)
        return NULL;
    void *stream = NULL;
    int rc = ft_store_stream(s, device, &stream);
    return rc < 0 ? raise_ft(rc, NULL) : PyLong_FromUnsignedLongLong((uintptr_t)stream);
}

/* store_ring_limit(store) -> bytes */
static PyObject *py_store_ring_limit(PyObject *self, PyObject *args)
{
    (void)self;
    ft_store *s = store_only(args);
    return s ? PyLong_FromUnsignedLongLong(ft_store_ring_limit(s)) : NULL;
}

static PyMethodDef store_methods[] = {
    {"store_stream", py_store_stream, METH_VARARGS, "store_stream(store, device) -> CUstream"},
    {"store_ring_limit", py_store_ring_limit, METH_VARARGS, "store_ring_limit(store) -> int"},
    {"store_create", py_store_create, METH_VARARGS,
     "store_create(ctx, dir, capacity, staging, host_cache, engine, page_cache) -> store"},
    {"store_close", py_store_close, METH_VARARGS, "store_close(store)"},
    {"store_put", py_store_put, METH_VARARGS,
     "store_put(store, addr, len, kind, device, stream) -> key"},
    {"store_get", py_store_get, METH_VARARGS,
     "store_get(store, key, addr, len, kind, device, stream)"},
    {"store_released", py_store_released, METH_VARARGS, "store_released(store, key) -> bool"},
    {"store_prefetch", py_store_prefetch, METH_VARARGS,
     "store_prefetch(store, key) -> 1, 0 or -1 (busy)"},
    {"store_poll", py_store_poll, METH_VARARGS, "store_poll(store, key) -> bool"},
    {"store_wait", py_store_wait, METH_VARARGS, "store_wait(store, key)"},
    {"store_flush", py_store_flush, METH_VARARGS, "store_flush(store)"},
    {"store_drop", py_store_drop, METH_VARARGS, "store_drop(store, key)"},
    {"store_stats", py_store_stats, METH_VARARGS, "store_stats(store) -> dict"},
    {NULL, NULL, 0, NULL},
};

int store_add_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, store_methods);
}
