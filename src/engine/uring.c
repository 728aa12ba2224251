/*
 * uring: io_uring over the O_DIRECT descriptor with a deep queue from one thread.
 * Block-aligned memory is read/written in place; other memory goes through buffers
 * registered with the ring (READ_FIXED/WRITE_FIXED). Rings are kept per context and reused.
 * Whether io_uring works here is probed once; when it does not (old kernel, seccomp), the
 * engine runs the direct engine instead, and ft_engine_available() says why.
 */
#include "engine.h"
#include "../base/syscall.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct uring_ring uring_ring;
struct uring_ring {
    uring_ring *next;
    struct io_uring ring;
    unsigned entries;
    uint8_t *bufs;      /* nbufs x buf_size registered bounce memory, NULL until needed */
    unsigned nbufs;
    size_t buf_size;
    bool fixed;         /* bufs registered with the ring */
};

typedef struct ft__uring_cache {
    pthread_mutex_t lock;
    uring_ring *free;
} ft__uring_cache;

/* ---- probe, decided once per process ---- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static const char *probe_reason; /* NULL: available */

static void probe_run(void)
{
    struct io_uring ring;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int rc = ft__sys.uring_init(4, &ring, &p);
    if (rc == -ENOSYS)
        probe_reason = "io_uring not available: the kernel lacks io_uring_setup (ENOSYS)";
    else if (rc == -EPERM || rc == -EACCES)
        probe_reason = "io_uring not available: denied (seccomp or kernel.io_uring_disabled)";
    else if (rc < 0)
        probe_reason = "io_uring not available: io_uring_setup failed";
    else {
        if (!(p.features & IORING_FEAT_RW_CUR_POS)) /* arrived with IORING_OP_READ (5.6) */
            probe_reason = "io_uring not available: kernel older than 5.6 (no IORING_OP_READ)";
        ft__sys.uring_exit(&ring);
    }
}

static int uring_available(ft_ctx *ctx, const char **reason)
{
    (void)ctx;
    pthread_once(&probe_once, probe_run);
    if (probe_reason && reason)
        *reason = probe_reason;
    return probe_reason == NULL;
}

/* ---- rings ---- */

static void ring_free(uring_ring *r)
{
    ft__sys.uring_exit(&r->ring);
    free(r->bufs);
    free(r);
}

static int ring_acquire(ft_ctx *ctx, uring_ring **out)
{
    ft__uring_cache *c = ctx->engine_state[FT_ENGINE_URING];
    pthread_mutex_lock(&c->lock);
    uring_ring *r = c->free;
    if (r)
        c->free = r->next;
    pthread_mutex_unlock(&c->lock);
    if (r) {
        *out = r;
        return 0;
    }
    r = calloc(1, sizeof *r);
    if (!r)
        return ft__err(-ENOMEM, "io_uring ring");
    r->entries = ctx->cfg.queue_depth;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int rc = ft__sys.uring_init(r->entries, &r->ring, &p);
    if (rc < 0) {
        free(r);
        return ft__err(rc, "io_uring_queue_init with %u entries", ctx->cfg.queue_depth);
    }
    *out = r;
    return 0;
}

static void ring_release(ft_ctx *ctx, uring_ring *r)
{
    ft__uring_cache *c = ctx->engine_state[FT_ENGINE_URING];
    pthread_mutex_lock(&c->lock);
    r->next = c->free;
    c->free = r;
    pthread_mutex_unlock(&c->lock);
}

/* Bounce buffers, registered with the ring when the kernel lets us pin them. */
static int ring_bounce_buffers(ft_ctx *ctx, uring_ring *r)
{
    if (r->bufs)
        return 0;
    r->nbufs = FT__MIN(r->entries, 8u);
    r->buf_size = ft__bufpool_size(ctx->bounce);
    void *mem;
    if (posix_memalign(&mem, FT__DIRECT_ALIGN, r->nbufs * r->buf_size) != 0)
        return ft__err(-ENOMEM, "io_uring bounce buffers (%u x %zu bytes)", r->nbufs,
                       r->buf_size);
    r->bufs = mem;
    struct iovec iov[8];
    for (unsigned i = 0; i < r->nbufs; i++)
        iov[i] = (struct iovec){r->bufs + (size_t)i * r->buf_size, r->buf_size};
    /* Failure (RLIMIT_MEMLOCK on old kernels) only costs the fixed-buffer fast path. */
    r->fixed = ft__sys.uring_register_buffers(&r->ring, iov, r->nbufs) == 0;
    return 0;
}

/* ---- one transfer ---- */

typedef struct slot {
    uint64_t off;   /* file offset of this request */
    uint64_t len;   /* bytes requested */
    uint64_t done;  /* bytes completed so far */
    unsigned buf;   /* bounce buffer index, when bounced */
    bool busy;
} slot;

typedef struct transfer {
    const ft__io *io;
    uring_ring *r;
    int fd;
    bool write;
    bool bounce;
    slot *slots;
    unsigned depth;
    uint64_t eof;   /* first file offset found past the end (reads), else UINT64_MAX */
    ft__first_err failed; /* the first failure, with its detail */
} transfer;

static uint8_t *slot_mem(const transfer *t, const slot *s)
{
    if (t->bounce)
        return t->r->bufs + (size_t)s->buf * t->r->buf_size + s->done;
    return t->io->ptr + (s->off - t->io->off) + s->done;
}

static int slot_queue(transfer *t, unsigned index)
{
    slot *s = &t->slots[index];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&t->r->ring);
    if (!sqe)
        return -EBUSY; /* cannot happen: at most depth requests in flight */
    uint8_t *mem = slot_mem(t, s);
    unsigned n = (unsigned)(s->len - s->done);
    off_t off = (off_t)(s->off + s->done);
    if (t->bounce && t->r->fixed) {
        if (t->write)
            io_uring_prep_write_fixed(sqe, t->fd, mem, n, off, (int)s->buf);
        else
            io_uring_prep_read_fixed(sqe, t->fd, mem, n, off, (int)s->buf);
    } else if (t->write) {
        io_uring_prep_write(sqe, t->fd, mem, n, off);
    } else {
        io_uring_prep_read(sqe, t->fd, mem, n, off);
    }
    io_uring_sqe_set_data64(sqe, index);
    return 0;
}

static void transfer_fail(transfer *t, int err)
{
    ft__first_err_note(&t->failed, 0, err); /* one index: the earliest stays */
}

/* Finish a slot whose remainder cannot go through O_DIRECT (unaligned after a short count). */
static void slot_finish_buffered(transfer *t, slot *s)
{
    uint8_t *mem = slot_mem(t, s);
    uint64_t left = s->len - s->done, at = s->off + s->done;
    int64_t r = t->write ? ft__pwrite_full(t->io->file->fd, mem, left, at)
                         : ft__pread_full(t->io->file->fd, mem, left, at);
    if (r < 0)
        transfer_fail(t, (int)r);
    else
        s->done += (uint64_t)r;
}

/* A completion for @p s with result @p res. @return true when the slot is finished. */
static bool slot_complete(transfer *t, slot *s, int res)
{
    if (res == -EINTR || res == -EAGAIN)
        return false; /* requeue as is */
    if (res < 0) {
        transfer_fail(t, ft__err(res, "io_uring %s of %llu bytes at offset %llu of %s",
                                 t->write ? "write" : "read",
                                 (unsigned long long)(s->len - s->done),
                                 (unsigned long long)(s->off + s->done), t->io->file->path));
        return true;
    }
    if (res == 0 && !t->write) {
        t->eof = FT__MIN(t->eof, s->off + s->done);
        return true;
    }
    if (res == 0) {
        transfer_fail(t, ft__err(-EIO, "io_uring write made no progress at offset %llu",
                                 (unsigned long long)(s->off + s->done)));
        return true;
    }
    s->done += (uint64_t)res;
    if (s->done < s->len && (s->done % FT__DIRECT_ALIGN) != 0) {
        /* O_DIRECT cannot go on from an unaligned offset: finish with buffered I/O. */
        slot_finish_buffered(t, s);
        if (!t->write && !t->failed.err && s->done < s->len)
            t->eof = FT__MIN(t->eof, s->off + s->done);
        return true;
    }
    return s->done >= s->len; /* else an aligned short count: queue the rest */
}

/* Copy a finished bounced read out of its buffer. */
static void slot_deliver(transfer *t, const slot *s)
{
    if (t->bounce && !t->write && s->done)
        memcpy(t->io->ptr + (s->off - t->io->off),
               t->r->bufs + (size_t)s->buf * t->r->buf_size, (size_t)s->done);
}

static int64_t transfer_run(transfer *t)
{
    const ft__io *io = t->io;
    uint64_t piece = t->bounce ? t->r->buf_size
                               : io->piece && io->piece != UINT64_MAX ? io->piece
                                                                     : io->ctx->cfg.chunk_size;
    uint64_t next = 0;  /* bytes of io handed to slots */
    unsigned inflight = 0, stalls = 0;
    bool ring_broken = false;
    for (;;) {
        for (unsigned i = 0; i < t->depth && next < io->len && !t->failed.err; i++) {
            slot *s = &t->slots[i];
            if (s->busy)
                continue;
            *s = (slot){.off = io->off + next, .len = FT__MIN(piece, io->len - next),
                        .buf = i, .busy = true};
            if (t->write && t->bounce)
                memcpy(t->r->bufs + (size_t)i * t->r->buf_size, io->ptr + next, (size_t)s->len);
            next += s->len;
            slot_queue(t, i);
            inflight++;
        }
        if (inflight == 0)
            break;
        int rc = ft__sys.uring_submit(&t->r->ring);
        if (rc == -EINTR)
            continue; /* the requests are still queued: submit them again */
        /* Out of resources: wait for a completion, unless the kernel holds none of ours,
         * in which case nothing would ever complete; then try again shortly. */
        if ((rc == -EAGAIN || rc == -EBUSY) && inflight == io_uring_sq_ready(&t->r->ring)) {
            if (++stalls <= 1000) {
                usleep(100);
                continue;
            }
        } else if (rc == -EAGAIN || rc == -EBUSY) {
            rc = 0;
        }
        if (rc < 0) {
            transfer_fail(t, ft__err(rc, "io_uring_submit"));
            ring_broken = true;
            break;
        }
        struct io_uring_cqe *cqe;
        rc = ft__sys.uring_wait_cqe(&t->r->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0) {
            transfer_fail(t, ft__err(rc, "io_uring_wait_cqe"));
            ring_broken = true;
            break;
        }
        unsigned index = (unsigned)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&t->r->ring, cqe);
        slot *s = &t->slots[index];
        if (slot_complete(t, s, res)) {
            slot_deliver(t, s);
            s->busy = false;
            inflight--;
        } else {
            slot_queue(t, index);
        }
    }
    if (ring_broken)
        return INT64_MIN; /* the caller must drop the ring: requests may still be queued */
    if (t->failed.err)
        return t->failed.err; /* its detail: the caller takes it */
    if (t->eof != UINT64_MAX)
        return (int64_t)(t->eof - io->off);
    return (int64_t)io->len;
}

static int64_t uring_middle(const ft__io *part, bool write, int fd)
{
    ft_ctx *ctx = part->ctx;
    uring_ring *r = NULL;
    int rc = ring_acquire(ctx, &r);
    if (rc < 0)
        return rc;
    transfer t = {.io = part, .r = r, .fd = fd, .write = write, .eof = UINT64_MAX};
    t.bounce = !ft__is_direct_aligned(part->ptr, part->off, part->len);
    if (t.bounce && (rc = ring_bounce_buffers(ctx, r)) < 0) {
        ring_release(ctx, r);
        return rc;
    }
    t.depth = t.bounce ? r->nbufs : r->entries;
    t.slots = calloc(t.depth, sizeof *t.slots);
    if (!t.slots) {
        ring_release(ctx, r);
        return ft__err(-ENOMEM, "io_uring slots");
    }
    ft__first_err_init(&t.failed);
    int64_t result = transfer_run(&t);
    int err = ft__first_err_take(&t.failed);
    free(t.slots);
    if (result == INT64_MIN) {
        result = err;
        ring_free(r);
    } else {
        ring_release(ctx, r);
    }
    return result;
}

static int64_t uring_read(const ft__io *io)
{
    if (!uring_available(io->ctx, NULL))
        return ft__engine_direct.read(io);
    return ft__direct_transfer(io, false, uring_middle);
}

static int64_t uring_write(const ft__io *io)
{
    if (!uring_available(io->ctx, NULL))
        return ft__engine_direct.write(io);
    return ft__direct_transfer(io, true, uring_middle);
}

static int uring_ctx_init(ft_ctx *ctx)
{
    ft__uring_cache *c = calloc(1, sizeof *c);
    if (!c)
        return ft__err(-ENOMEM, "context: io_uring rings");
    pthread_mutex_init(&c->lock, NULL);
    ctx->engine_state[FT_ENGINE_URING] = c;
    return 0;
}

static void uring_ctx_fini(ft_ctx *ctx)
{
    ft__uring_cache *c = ctx->engine_state[FT_ENGINE_URING];
    if (!c)
        return;
    while (c->free) {
        uring_ring *r = c->free;
        c->free = r->next;
        ring_free(r);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
    ctx->engine_state[FT_ENGINE_URING] = NULL;
}

const ft__engine_ops ft__engine_uring = {
    .name = "uring",
    .id = FT_ENGINE_URING,
    .caps = FT__CAP_BYPASS_CACHE | FT__CAP_NEEDS_DIRECT | FT__CAP_SETS_UP,
    .available = uring_available,
    .read = uring_read,
    .write = uring_write,
    .ctx_init = uring_ctx_init,
    .ctx_fini = uring_ctx_fini,
};
