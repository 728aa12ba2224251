/*
 * cuFile's driver, under the cufile engine (cufile.c), its batches (cufile_batch.c) and its
 * registered buffers (cufile_register.c): libcufile.so.0 opened once with dlopen, whether it
 * runs true GPUDirect Storage (nvidia-fs) or its compatibility mode, the files' registered
 * handles, and buffer registration.
 */
#include "cufile.h"
#include "../base/syscall.h"
#include "../gpu/cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

ft__cufile_api ft__cf;

static pthread_once_t cf_once = PTHREAD_ONCE_INIT;
static const char *cf_reason = "not loaded";
static char cf_reason_buf[160];
static bool cf_gds; /* nvidia-fs present: true GPUDirect, else compatibility mode */

static void cf_load(void)
{
    const char *why;
    if (ft__cuda_load(&why) < 0) {
        snprintf(cf_reason_buf, sizeof cf_reason_buf, "needs CUDA: %s", why);
        cf_reason = cf_reason_buf;
        return;
    }
    void *lib = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        cf_reason = "libcufile.so.0 not found";
        return;
    }
    *(void **)&ft__cf.DriverOpen = dlsym(lib, "cuFileDriverOpen");
    *(void **)&ft__cf.HandleRegister = dlsym(lib, "cuFileHandleRegister");
    *(void **)&ft__cf.HandleDeregister = dlsym(lib, "cuFileHandleDeregister");
    *(void **)&ft__cf.BufRegister = dlsym(lib, "cuFileBufRegister");
    *(void **)&ft__cf.BufDeregister = dlsym(lib, "cuFileBufDeregister");
    *(void **)&ft__cf.Read = dlsym(lib, "cuFileRead");
    *(void **)&ft__cf.Write = dlsym(lib, "cuFileWrite");
    *(void **)&ft__cf.DriverGetProperties = dlsym(lib, "cuFileDriverGetProperties");
    *(void **)&ft__cf.BatchSetUp = dlsym(lib, "cuFileBatchIOSetUp");
    *(void **)&ft__cf.BatchSubmit = dlsym(lib, "cuFileBatchIOSubmit");
    *(void **)&ft__cf.BatchGetStatus = dlsym(lib, "cuFileBatchIOGetStatus");
    *(void **)&ft__cf.BatchCancel = dlsym(lib, "cuFileBatchIOCancel");
    *(void **)&ft__cf.BatchDestroy = dlsym(lib, "cuFileBatchIODestroy");
    if (!ft__cf.DriverOpen || !ft__cf.HandleRegister || !ft__cf.HandleDeregister ||
        !ft__cf.Read || !ft__cf.Write) {
        cf_reason = "libcufile.so.0 lacks the cuFile API";
        return;
    }
    cufile_error e = ft__cf.DriverOpen();
    if (e.err != 0) {
        snprintf(cf_reason_buf, sizeof cf_reason_buf,
                 "cuFileDriverOpen failed (cuFile error %d, CUDA %d)", e.err, e.cu_err);
        cf_reason = cf_reason_buf;
        return;
    }
    struct stat st;
    const char *gds = "/proc/driver/nvidia-fs/version"; /* true GPUDirect Storage */
    cf_gds = ft__sys.stat(gds, &st) == 0; /* no fault test: runs once libcufile opened */
    cf_reason = NULL;
}

int ft__cufile_usable(const char **reason)
{
    pthread_once(&cf_once, cf_load);
    if (reason)
        *reason = cf_reason ? cf_reason : "";
    return cf_reason == NULL;
}

bool ft__cufile_gds(void)
{
    return ft__cufile_usable(NULL) && cf_gds;
}

const char *ft__cufile_mode(void)
{
    pthread_once(&cf_once, cf_load);
    return cf_reason ? NULL : cf_gds ? "GPUDirect Storage (nvidia-fs)" : "compatibility mode";
}

/*
 * For AUTO, which must not make a transfer wait for cuFile's driver to open. On the H200
 * machine every bench process's first device-memory measurement (16 MiB calls) ran at
 * 0.46-0.62x of the best fixed engine under AUTO while the open happened inside it (and at
 * 1.0 GB/s against 1.6 in later rows for cuFile itself, while O_DIRECT and staged engines,
 * which never open it, did not lose); with the open moved here, 0.89-1.06x. The first call
 * that asks starts the open as a task on the context's pool and hears "not yet"; calls
 * after it finished get the answer.
 */
static _Atomic int cf_async; /* 0: nobody asked, 1: opening, 2: open (or failed: cf_reason) */

static void cf_open_task(void *arg)
{
    (void)arg;
    pthread_once(&cf_once, cf_load);
    atomic_store_explicit(&cf_async, 2, memory_order_release);
}

bool ft__cufile_usable_now(ft_ctx *ctx)
{
    int state = atomic_load_explicit(&cf_async, memory_order_acquire), idle = 0;
    if (state == 0 && atomic_compare_exchange_strong(&cf_async, &idle, 1) &&
        ft__pool_post(ctx->pool, cf_open_task, NULL) < 0)
        cf_open_task(NULL); /* no memory for a task: open it here */
    return atomic_load_explicit(&cf_async, memory_order_acquire) == 2 && cf_reason == NULL;
}

/* The file's registered handle (registered once; a failure is remembered). */
int ft__cufile_file_handle(ft_file *f, void **out)
{
    pthread_mutex_lock(&f->lock);
    ft__cufile_file *st = f->engine_state[FT_ENGINE_CUFILE];
    if (!st && (st = calloc(1, sizeof *st)))
        f->engine_state[FT_ENGINE_CUFILE] = st;
    if (!st) {
        pthread_mutex_unlock(&f->lock);
        return ft__err(-ENOMEM, "%s: cuFile state", f->path);
    }
    int rc = st->err;
    if (!st->handle && rc == 0) {
        pthread_mutex_unlock(&f->lock);
        int dfd = ft__file_direct_fd(f); /* takes the lock itself */
        pthread_mutex_lock(&f->lock);
        if (st->handle || st->err) {
            rc = st->err;
        } else if (dfd < 0) {
            rc = st->err = dfd;
        } else {
            cufile_descr d = {.type = 1, .handle.fd = dfd};
            void *fh = NULL;
            cufile_error e = ft__cf.HandleRegister(&fh, &d);
            if (e.err != 0) {
                rc = st->err = -EOPNOTSUPP;
                st->code = e.err;
            } else {
                st->handle = fh;
            }
        }
    }
    *out = st->handle;
    int code = st->code;
    pthread_mutex_unlock(&f->lock);
    if (rc == -EOPNOTSUPP)
        return ft__err(rc, "cuFileHandleRegister(%s) failed with cuFile error %d%s", f->path,
                       code, code == 5027 ? " (no udev data for the block device: common in "
                                            "VMs; see scripts/gpu-check.sh --udev)" : "");
    return rc;
}

int ft__cufile_buf_register(void *ptr, size_t len, int device)
{
    const char *why;
    if (!ft__cufile_usable(&why))
        return ft__err(-EOPNOTSUPP, "cuFile is not available: %s", why);
    if (!ft__cf.BufRegister || !ft__cf.BufDeregister)
        return ft__err(-EOPNOTSUPP, "libcufile.so.0 lacks cuFileBufRegister");
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    cufile_error e = ft__cf.BufRegister(ptr, len, 0);
    ft__cuda_leave();
    if (e.err != 0)
        return ft__err(-EIO, "cuFileBufRegister(%p, %zu) failed (cuFile error %d, CUDA %d)", ptr,
                       len, e.err, e.cu_err);
    return 0;
}

void ft__cufile_buf_deregister(void *ptr, int device)
{
    if (ft__cuda_enter(device) == 0) {
        ft__cf.BufDeregister(ptr);
        ft__cuda_leave();
    }
}
