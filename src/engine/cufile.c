/*
 * cufile: NVIDIA cuFile (GPUDirect Storage) through dlopen("libcufile.so.0"): the engine.
 * Real GDS where the nvidia-fs driver is loaded, cuFile's compatibility mode otherwise. The
 * driver (cufile_driver.c) is opened once; each file's O_DIRECT descriptor is registered
 * once and the handle cached;
 * a transfer is cut into pieces read or written in parallel (cuFile is thread-safe per
 * handle). Host memory goes through the posix engine. When registration fails (e.g. error
 * 5027 in a VM without udev data), the call fails with the reason and AUTO stops offering
 * this engine for the file.
 */
#include "cufile.h"
#include "../base/syscall.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void cufile_file_close(ft_file *f)
{
    ft__cufile_file *st = f->engine_state[FT_ENGINE_CUFILE];
    if (st && st->handle)
        ft__cf.HandleDeregister(st->handle);
    free(st);
    f->engine_state[FT_ENGINE_CUFILE] = NULL;
}

/* What a transfer's pieces share: the file's handle and the base cuFile addresses memory
 * from (the registered buffer holding it, else the transfer's own start). */
typedef struct cufile_job {
    void *fh;
    uint8_t *base;
} cufile_job;

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
static int cufile_available(ft_ctx *ctx, const char **reason)
{
    (void)ctx;
    return ft__cufile_usable(reason);
}

/* The driver is open (no call waits for that) and the file's registration has not failed. */
static bool cufile_ready(ft_file *f)
{
    pthread_mutex_lock(&f->lock);
    const ft__cufile_file *st = f->engine_state[FT_ENGINE_CUFILE];
    bool failed = st && st->err;
    pthread_mutex_unlock(&f->lock);
    return !failed && ft__cufile_usable_now(f->ctx);
}

/* fastensor info: its mode, and its batch API's state where it is open. */
static size_t cufile_describe(int devices, char *buf, size_t len)
{
    const char *mode = devices < 0 ? NULL : ft__cufile_mode(), *why = "needs CUDA";
    if (devices >= 0)
        cufile_available(NULL, &why);
    size_t at = (size_t)snprintf(buf, len, "cufile      %s%s\n", mode ? mode : "not available: ",
                                 mode ? "" : why);
    if (mode && at < len) {
        char batch[200];
        ft__cufile_batch_describe(batch, sizeof batch);
        at += (size_t)snprintf(buf + at, len - at, "cufile batch %s\n", batch);
    }
    return FT__MIN(at, len);
}

const ft__engine_ops ft__engine_cufile = {
    .name = "cufile",
    .id = FT_ENGINE_CUFILE,
    .caps = FT__CAP_BYPASS_CACHE | FT__CAP_NEEDS_DIRECT | FT__CAP_DEVICE_MEMORY |
            FT__CAP_SETS_UP,
    .available = cufile_available,
    .ready = cufile_ready,
    .read = cufile_read,
    .write = cufile_write,
    .batch = ft__cufile_batch,
    .file_close = cufile_file_close,
    .describe = cufile_describe,
};
