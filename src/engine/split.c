/* Helpers shared by engines: parallel piecewise transfers and O_DIRECT head/middle/tail. */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct parallel_job {
    const ft__io *io;
    uint64_t piece;
    ft__piece_fn fn;
    ft__first_err failed; /* the lowest failing piece, with its worker's detail */
} parallel_job;

static uint64_t piece_len(const parallel_job *job, unsigned i)
{
    uint64_t start = (uint64_t)i * job->piece;
    return FT__MIN(job->piece, job->io->len - start);
}

static int64_t parallel_piece(void *arg, unsigned i)
{
    parallel_job *job = arg;
    uint64_t start = (uint64_t)i * job->piece;
    uint8_t *ptr = job->io->ptr ? job->io->ptr + start : NULL; /* (a fill may have none) */
    int64_t r = job->fn(job->io, ptr, job->io->off + start, piece_len(job, i));
    if (r < 0)
        ft__first_err_note(&job->failed, i, (int)r);
    return r;
}

int64_t ft__io_parallel(const ft__io *io, uint64_t piece, ft__piece_fn fn)
{
    uint64_t n64 = (io->len + piece - 1) / piece;
    if (n64 <= 1)
        return fn(io, io->ptr, io->off, io->len);
    if (n64 > UINT32_MAX / 2)
        return ft__err(-EINVAL, "a %llu-byte transfer in %llu-byte pieces is too many pieces",
                       (unsigned long long)io->len, (unsigned long long)piece);
    unsigned n = (unsigned)n64;
    int64_t *results = malloc(n * sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "cannot split a %llu-byte transfer",
                       (unsigned long long)io->len);
    parallel_job job = {.io = io, .piece = piece, .fn = fn};
    ft__first_err_init(&job.failed);
    int rc = ft__pool_run(io->ctx->pool, n, parallel_piece, &job, results);
    ft__first_err_take(&job.failed); /* the first failing piece's detail, if one failed */
    int64_t total = 0;
    for (unsigned i = 0; rc == 0 && i < n; i++) {
        if (results[i] < 0) {
            total = results[i];
            break;
        }
        total += results[i];
        if ((uint64_t)results[i] < piece_len(&job, i))
            break; /* end of file: later pieces may have read bytes past a hole in ours */
    }
    free(results);
    return rc < 0 ? ft__err(rc, "cannot queue a parallel transfer") : total;
}

uint64_t ft__spread_piece(const ft_ctx *ctx, uint64_t len)
{
    uint64_t share = len / (ctx->cfg.threads + 1u) + 1;
    share = (share + FT__DIRECT_ALIGN - 1) / FT__DIRECT_ALIGN * FT__DIRECT_ALIGN;
    return FT__MIN(FT__MAX(share, (uint64_t)1 << 20), (uint64_t)ctx->cfg.chunk_size);
}

int64_t ft__direct_transfer(const ft__io *io, bool write,
                            int64_t (*mid)(const ft__io *part, bool write, int fd))
{
    int dfd = ft__file_direct_fd(io->file);
    if (dfd < 0)
        return dfd;
    const uint64_t a = FT__DIRECT_ALIGN;
    uint64_t mid_start = (io->off + a - 1) / a * a;
    uint64_t end = io->off + io->len;
    uint64_t mid_end = end / a * a;
    int fd = io->file->fd;
    if (mid_end <= mid_start) /* less than one whole block: nothing to gain from O_DIRECT */
        return write ? ft__pwrite_full(fd, io->ptr, io->len, io->off)
                     : ft__pread_full(fd, io->ptr, io->len, io->off);

    uint64_t head = mid_start - io->off, body = mid_end - mid_start, tail = end - mid_end;
    int64_t r;
    if (head) {
        r = write ? ft__pwrite_full(fd, io->ptr, head, io->off)
                  : ft__pread_full(fd, io->ptr, head, io->off);
        if (r < 0 || (uint64_t)r < head)
            return r;
    }
    ft__io part = *io;
    part.ptr = io->ptr + head;
    part.off = mid_start;
    part.len = body;
    r = mid(&part, write, dfd);
    if (r < 0 || (uint64_t)r < body)
        return r < 0 ? r : (int64_t)head + r;
    if (tail) {
        uint8_t *p = io->ptr + head + body;
        r = write ? ft__pwrite_full(fd, p, tail, mid_end) : ft__pread_full(fd, p, tail, mid_end);
        if (r < 0)
            return r;
    } else {
        r = 0;
    }
    return (int64_t)(head + body) + r;
}
