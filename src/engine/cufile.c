/*
 * cufile: NVIDIA cuFile (GPUDirect Storage) through dlopen("libcufile.so.0"). Real GDS where
 * the nvidia-fs driver is loaded, cuFile's compatibility mode otherwise. The driver is
 * opened once; each file's O_DIRECT descriptor is registered once and the handle cached;
 * a transfer is cut into pieces read or written in parallel (cuFile is thread-safe per
 * handle). Host memory goes through the posix engine. When registration fails (e.g. error
 * 5027 in a VM without udev data), the call fails with the reason and AUTO stops offering
 * this engine for the file.
 */
#include "cufile.h"
#include "../base/syscall.h"
#include "../gpu/cuda.h"

#include <dlfcn.h>
#include <errno.h>
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
    ft__cufile_batch_init(cf_gds);
}

int ft__cufile_usable(const char **reason)
{
    pthread_once(&cf_once, cf_load);
    if (reason)
        *reason = cf_reason ? cf_reason : "";
    return cf_reason == NULL;
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
    int rc = f->cufile_err;
    if (!f->cufile_handle && rc == 0) {
        pthread_mutex_unlock(&f->lock);
        int dfd = ft__file_direct_fd(f); /* takes the lock itself */
        pthread_mutex_lock(&f->lock);
        if (f->cufile_handle || f->cufile_err) {
            rc = f->cufile_err;
        } else if (dfd < 0) {
            rc = f->cufile_err = dfd;
        } else {
            cufile_descr d = {.type = 1, .handle.fd = dfd};
            void *fh = NULL;
            cufile_error e = ft__cf.HandleRegister(&fh, &d);
            if (e.err != 0) {
                rc = f->cufile_err = -EOPNOTSUPP;
                f->cufile_code = e.err;
            } else {
                f->cufile_handle = fh;
            }
        }
    }
    *out = f->cufile_handle;
    int code = f->cufile_code;
    pthread_mutex_unlock(&f->lock);
    if (rc == -EOPNOTSUPP)
        return ft__err(rc, "cuFileHandleRegister(%s) failed with cuFile error %d%s", f->path,
                       code, code == 5027 ? " (no udev data for the block device: common in "
                                            "VMs; see scripts/gpu-check.sh --udev)" : "");
    return rc;
}

static void cufile_file_close(ft_file *f)
{
    if (f->cufile_handle)
        ft__cf.HandleDeregister(f->cufile_handle);
    f->cufile_handle = NULL;
}

/* What a transfer's pieces share: the file's handle and the base cuFile addresses memory
 * from (the registered buffer holding it, else the transfer's own start). */
typedef struct cufile_job {
    void *fh;
    uint8_t *base;
} cufile_job;

uint8_t *ft__cufile_base(ft_ctx *ctx, uint8_t *ptr, uint64_t len)
{
    uint8_t *base;
    return ft__reg_base(ctx, ptr, len, &base) ? base : ptr;
}

static int64_t piece(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len, bool write)
{
    const cufile_job *job = io->aux;
    void *fh = job->fh;
    int rc = ft__cuda_enter(io->device);
    if (rc < 0)
        return rc;
    uint64_t done = 0;
    int64_t result = 0;
    while (done < len) {
        size_t n = (size_t)FT__MIN(len - done, (uint64_t)FT__MAX_RW);
        /* base + offset addressing: cuFile resolves the allocation from the base */
        off_t buf_off = (off_t)(ptr - job->base + (ptrdiff_t)done);
        ssize_t r = write ? ft__cf.Write(fh, job->base, n, (off_t)(off + done), buf_off)
                          : ft__cf.Read(fh, job->base, n, (off_t)(off + done), buf_off);
        if (r < 0) {
            int e = r == -1 ? errno : EIO;
            result = ft__err(-e, "cuFile%s of %zu bytes at offset %llu of %s failed (%zd)",
                             write ? "Write" : "Read", n, (unsigned long long)(off + done),
                             io->file->path, r);
            break;
        }
        if (r == 0) {
            if (write)
                result = ft__err(-EIO, "cuFileWrite made no progress");
            break;
        }
        done += (uint64_t)r;
    }
    ft__cuda_leave();
    return result < 0 ? result : (int64_t)done;
}

static int64_t read_piece(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return piece(io, ptr, off, len, false);
}

static int64_t write_piece(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return piece(io, ptr, off, len, true);
}

static int64_t cufile_transfer(const ft__io *io, bool write)
{
    if (io->device < 0) /* cuFile is for device memory; host memory takes the posix path */
        return write ? ft__engine_posix.write(io) : ft__engine_posix.read(io);
    const char *why;
    if (!ft__cufile_usable(&why))
        return ft__err(-EOPNOTSUPP, "cuFile is not available: %s", why);
    void *fh;
    int rc = ft__cufile_file_handle(io->file, &fh);
    if (rc < 0)
        return rc;
    cufile_job shared = {.fh = fh, .base = ft__cufile_base(io->ctx, io->ptr, io->len)};
    ft__io job = *io;
    job.aux = &shared;
    uint64_t p = io->piece && io->piece != UINT64_MAX ? io->piece
               : io->piece == UINT64_MAX             ? io->len
                                                     : (uint64_t)io->ctx->cfg.chunk_size;
    return ft__io_parallel(&job, p, write ? write_piece : read_piece);
}

static int64_t cufile_read(const ft__io *io)
{
    return cufile_transfer(io, false);
}

static int64_t cufile_write(const ft__io *io)
{
    return cufile_transfer(io, true);
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
static int cufile_available(ft_ctx *ctx, const char **reason)
{
    (void)ctx;
    return ft__cufile_usable(reason);
}

/* The driver is open (no call waits for that) and the file's registration has not failed. */
static bool cufile_ready(ft_file *f)
{
    return !f->cufile_err && ft__cufile_usable_now(f->ctx);
}

const ft__engine_ops ft__engine_cufile = {
    .name = "cufile",
    .id = FT_ENGINE_CUFILE,
    .caps = FT__CAP_BYPASS_CACHE | FT__CAP_NEEDS_DIRECT | FT__CAP_DEVICE_MEMORY,
    .available = cufile_available,
    .ready = cufile_ready,
    .read = cufile_read,
    .write = cufile_write,
    .batch = ft__cufile_batch,
    .file_close = cufile_file_close,
};
