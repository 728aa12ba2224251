/* Synchronous transfers: checks, engine choice, dispatch, durability. */
#include "internal.h"
#include "../engine/engine.h"
#include "../gpu/cuda.h"

#include <errno.h>

int ft__io_check(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                 bool write)
{
    if (!f || !buf)
        return ft__err(-EINVAL, "%s: file or buffer is NULL", write ? "write" : "read");
    if (buf->kind != FT_MEM_HOST && buf->kind != FT_MEM_CUDA)
        return ft__err(-EINVAL, "%s: memory kind %d is not supported", f->path, (int)buf->kind);
    const char *why;
    if (buf->kind == FT_MEM_CUDA && !ft_cuda_available(&why))
        return ft__err(-ENODEV, "%s: device memory, but CUDA is not available: %s", f->path,
                       why);
    if (!buf->ptr && buf->len)
        return ft__err(-EFAULT, "%s: buffer pointer is NULL", f->path);
    if (offset > INT64_MAX || buf->len > INT64_MAX - offset)
        return ft__err(-EFBIG, "%s: range at %llu of %zu bytes is beyond the largest offset",
                       f->path, (unsigned long long)offset, buf->len);
    const unsigned known_flags = FT_IO_SYNC | FT_IO_SYNC_LATER;
    if (opts && ((unsigned)opts->engine >= FT_ENGINE_COUNT || (opts->flags & ~known_flags) ||
                 (unsigned)opts->cache >= FT_CACHE_COUNT))
        return ft__err(-EINVAL, "%s: bad options (engine %d, flags 0x%x, cache %d)", f->path,
                       (int)opts->engine, opts->flags, (int)opts->cache);
    if (write && !f->writable)
        return ft__err(-EBADF, "%s is not open for writing", f->path);
    if (!write && !f->readable)
        return ft__err(-EBADF, "%s is not open for reading", f->path);
    return 0;
}

static ft_engine requested_engine(const ft_file *f, const ft_io_opts *opts)
{
    ft_engine e = opts ? opts->engine : FT_ENGINE_AUTO;
    return e == FT_ENGINE_AUTO ? f->ctx->cfg.engine : e;
}

/* Run @p part through the arm of decision @p d. */
static int64_t run_arm(const ft__io *part, const ft__decision *d, bool write, int cache,
                       void *ready)
{
    if (d->fill)
        return ft__fill_read(part, ft__engine_get(d->engine), cache, ready);
    return ft__dispatch(part, d->engine, write, ready);
}

/* AUTO's decision for @p part of the call @p io (its bytes go into the trace). */
static void decide_part(ft_file *f, const ft__io *io, const ft__io *part, bool write,
                        unsigned durable, int cache, ft__decision *d)
{
    ft__auto_decide(f, part->off, part->len, write, durable, part->device, cache, d);
    d->call = io->len;
}

/* A trial of an arm on a large transfer covers this much of it. Not less: a slice pays the
 * call's fixed costs (staging pipeline fill and drain for device memory), and the arms pay
 * them unequally. H200 machine, warm reads into device memory: 64 MiB slices ran at 67%
 * (posix) and 75% (mmap) of those arms' speed on whole 1 GiB calls, which ranked mmap first
 * where posix was faster on whole calls. */
#define TRIAL_SLICE (256ull << 20)

/*
 * AUTO: the whole transfer goes through the arm the selector picks, unless that arm is on
 * trial (its key is still explored, or re-checked) and at least two slices are left: then
 * only a slice does, and the rest is decided again (the size bucket stays the top one). A
 * checkpoint shard is one multi-GB call; whole, each trial of a slow arm cost a whole load
 * (a cached 2.5 GB load by O_DIRECT: 0.4 against 16 GB/s on the development machine), and a
 * key took a few dozen loads to explore. Synchronous writes are not cut: they are measured
 * with their fdatasync. cuFile's failure to register the file (remembered, so AUTO stops
 * offering cuFile for it) sends the part through another arm.
 * The last decision is left in @p d, the bytes of its part in @p last, for ft__auto_done.
 */
static int64_t auto_transfer(ft_file *f, const ft__io *io, bool write, unsigned durable, bool sync,
                             int cache, void *ready, ft__decision *d, int64_t *last)
{
    ft__io part = *io;
    uint64_t left = io->len;
    int64_t total = 0;
    for (;;) {
        part.len = left;
        decide_part(f, io, &part, write, durable, cache, d);
        bool slice = d->trial && !sync && left >= 2 * TRIAL_SLICE;
        if (slice)
            part.len = TRIAL_SLICE;
        part.piece = d->piece;
        int64_t r = run_arm(&part, d, write, cache, ready);
        const ft__engine_ops *ops = ft__engine_get(d->engine);
        if (r < 0 && ops->ready && !ops->ready(f)) { /* it can no longer take the file */
            decide_part(f, io, &part, write, durable, cache, d);
            part.piece = d->piece;
            r = run_arm(&part, d, write, cache, ready);
        }
        *last = r;
        if (r < 0 || !slice || (uint64_t)r < part.len) /* failed, done, or the file's end */
            return r < 0 ? r : total + r;
        total += r;
        ft__auto_done(f, d, r, true);
        part.ptr += r;
        part.off += (uint64_t)r;
        left -= (uint64_t)r;
    }
}

int64_t ft__transfer(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                     bool write)
{
    return ft__transfer_after(f, buf, offset, opts, write, NULL);
}

int64_t ft__transfer_after(ft_file *f, const ft_buf *buf, uint64_t offset,
                           const ft_io_opts *opts, bool write, void *ready)
{
    ft__io io = {.ctx = f->ctx, .file = f, .ptr = buf->ptr, .len = buf->len, .off = offset};
    int rc = ft__buf_device(buf, &io.device);
    if (rc < 0)
        return rc;
    if (!write) {
        int64_t size = ft__file_size(f);
        if (size < 0)
            return size;
        io.len = (uint64_t)size <= offset ? 0 : FT__MIN(io.len, (uint64_t)size - offset);
    }
    int64_t r = 0;
    bool sync = write && opts && (opts->flags & FT_IO_SYNC);
    /* AUTO's write class: 0 plain, 1 synced by this call, 2 synced later by the caller */
    unsigned durable = sync ? 1 : write && opts && (opts->flags & FT_IO_SYNC_LATER) ? 2 : 0;
    ft_engine e = requested_engine(f, opts);
    ft__decision d;
    void *own = NULL;
    if (io.len > 0 && io.device >= 0 && !ready) {
        if ((rc = ft__cuda_event_after(io.device, opts ? opts->stream : NULL, &own)) < 0)
            return rc;
        ready = own;
    }
    int64_t last = 0; /* AUTO: bytes of the last decision's part */
    bool observed = false; /* a fixed engine's call, a sample of its arm */
    if (io.len > 0) {
        ft__auto_enter(f->ctx);
        int cache = opts && opts->cache != FT_CACHE_AUTO ? (int)opts->cache
                                                         : (int)f->ctx->cfg.cache;
        if (e == FT_ENGINE_AUTO) {
            r = auto_transfer(f, &io, write, durable, sync, cache, ready, &d, &last);
        } else {
            observed = ft__auto_observe(f, io.off, io.len, write, durable, io.device, e, &d);
            r = last = ft__dispatch(&io, e, write, ready);
        }
        ft__auto_leave(f->ctx);
    }
    ft__cuda_event_free(io.device, own);
    if (r >= 0 && sync && (rc = ft_file_sync(f)) < 0)
        return rc;
    if (io.len > 0 && (e == FT_ENGINE_AUTO || observed)) /* durable writes: with their sync */
        ft__auto_done(f, &d, r < 0 ? r : last, false);
    return r;
}

int64_t ft_read(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts)
{
    int rc = ft__io_check(f, buf, offset, opts, false);
    return rc < 0 ? rc : ft__transfer(f, buf, offset, opts, false);
}

int64_t ft_write(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts)
{
    int rc = ft__io_check(f, buf, offset, opts, true);
    return rc < 0 ? rc : ft__transfer(f, buf, offset, opts, true);
}
