/* Synchronous transfers: checks, engine choice, dispatch, durability. */
#include "internal.h"
#include "../engine/engine.h"
#include "../base/syscall.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <sys/file.h>
#include <time.h>

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

/*
 * Several processes reading one file's uncached data through the page cache at once (the
 * ranks of a node loading one checkpoint) each start their own readahead among the others'
 * and break the disk's requests up: four processes loading a 1 GiB checkpoint at once took
 * over three times as long each as one alone. So such a read first tries the file's flock:
 * free, it takes it and reads the data from the disk; held by another reader, it follows that
 * reader: each piece of its range is copied out of the page cache as soon as the other
 * reader has brought it there, while that reader goes on with the rest (waiting for the
 * whole read instead cost the second of 2 processes its copy time on top: the workflow
 * demo's 2-process cold load, 0.62-0.69 s against 0.46-0.51 for processes that do not wait).
 * Once the other reader is gone (it read another range), the follower takes the lock and
 * reads what is still uncached. A lock that cannot be had for another reason is no lock.
 */
static bool share_lock(ft_file *f, bool *busy)
{
    *busy = false;
    if (ft__sys.flock(f->fd, LOCK_EX | LOCK_NB) == 0)
        return true;
    *busy = errno == EWOULDBLOCK;
    return false;
}

/* A follower copies this much at once, each piece once it is cached. */
#define FOLLOW_PIECE (16ull << 20)
/* and looks again this often while it is not */
#define FOLLOW_POLL_NS 500000L

/* Wait until bytes [off, off + len) of @p f are in the page cache (@return true: go on
 * following), or the other reader is gone: then this reader takes the lock and reads the
 * rest (*locked), or the lock cannot be asked about (@return false both ways). */
static bool follow(ft_file *f, uint64_t off, uint64_t len, bool *locked)
{
    while (ft__probe_cache(f->fd, off, len) != FT__CLS_CACHED) {
        bool busy;
        if ((*locked = share_lock(f, &busy)) || !busy)
            return false;
        struct timespec ts = {0, FOLLOW_POLL_NS};
        nanosleep(&ts, NULL);
    }
    return true;
}

/* Make @p part the next piece of the @p left bytes to go and follow() it (its decision then
 * probes the cache again). @return whether to go on following; where not, @p part is all
 * that is left again. */
static bool follow_piece(ft_file *f, ft__io *part, uint64_t left, bool *locked)
{
    part->len = FT__MIN(left, FOLLOW_PIECE);
    bool on = follow(f, part->off, part->len, locked);
    atomic_store_explicit(&f->au->cache_memo, 0, memory_order_relaxed);
    if (!on)
        part->len = left;
    return on;
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
    bool locked = false, first = true, following = false;
    for (;;) {
        part.len = left;
        if (following) /* the next piece, once the other reader has brought it in */
            following = follow_piece(f, &part, left, &locked);
        decide_part(f, io, &part, write, durable, cache, d);
        if (first && d->shared && !(locked = share_lock(f, &following)) && following) {
            ft__auto_done(f, d, 0, true); /* (no sample: decided again piece by piece) */
            following = follow_piece(f, &part, left, &locked);
            decide_part(f, io, &part, write, durable, cache, d);
        }
        first = false;
        bool slice = (d->trial && !sync && left >= 2 * TRIAL_SLICE) ||
                     (following && part.len < left);
        if (slice && !following)
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
        if (r < 0 || !slice || (uint64_t)r < part.len) { /* failed, done, or the file's end */
            if (locked)
                ft__sys.flock(f->fd, LOCK_UN);
            return r < 0 ? r : total + r;
        }
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
    if (io.len > 0) {
        atomic_fetch_add_explicit(&f->ctx->inflight, 1, memory_order_relaxed);
        int cache = opts && opts->cache != FT_CACHE_AUTO ? (int)opts->cache
                                                         : (int)f->ctx->cfg.cache;
        r = e == FT_ENGINE_AUTO
                ? auto_transfer(f, &io, write, durable, sync, cache, ready, &d, &last)
                : ft__dispatch(&io, e, write, ready);
        atomic_fetch_sub_explicit(&f->ctx->inflight, 1, memory_order_relaxed);
    }
    ft__cuda_event_free(io.device, own);
    if (r >= 0 && sync && (rc = ft_file_sync(f)) < 0)
        return rc;
    if (io.len > 0 && e == FT_ENGINE_AUTO) /* durable writes are measured with their sync */
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
