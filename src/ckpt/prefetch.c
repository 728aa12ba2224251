/* Prefetching a shard into the page cache before a load: parallel readahead in pieces, each
 * waited for without a copy (ft_ckpt_prefetch), and mapped into the caller's mapping as it
 * arrives (ft_ckpt_prefetch_map). */
#include "ckpt.h"
#include <fcntl.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../base/syscall.h"

#define PREFETCH_PIECE (16u << 20)

typedef struct prefetch_job {
    ft_ctx *ctx;
    int fd;
    uint64_t start, len, piece;
    const uint8_t *map; /* ft_ckpt_prefetch_map's mapping of the file (offset 0), or NULL */
} prefetch_job;

/* Wait for bytes [at, end) of @p fd to be in the page cache without copying them: a
 * read-only mapping of them populated (MADV_POPULATE_READ, Linux 5.14), then unmapped.
 * @return 0 when they are cached, else 1 (no such advice, a file shorter than its header
 * says, an I/O error: the caller reads them, which reports what went wrong). */
static int populate_cached(int fd, uint64_t at, uint64_t end)
{
    uint64_t lo = at & ~(uint64_t)4095;
    void *m = ft__sys.mmap(NULL, (size_t)(end - lo), PROT_READ, MAP_SHARED, fd, (off_t)lo);
    if (m == MAP_FAILED)
        return 1;
    int r = ft__populate(m, end - lo);
    (void)ft__sys.munmap(m, (size_t)(end - lo)); /* no fault test: fails only for a bad range */
    return r == 0 ? 0 : 1;
}

/* One piece: readahead asked for all of it at once, then waited for, so it is in the page
 * cache when this returns: through a mapping (no copy; on the development machine a cold
 * 1 GiB load ran 2x faster than when the piece was read through a bounce buffer, four
 * processes at once 2.3x), else by reading it through a bounce buffer (where the kernel
 * ignores the advice, as some sandboxes do, the reads do the work). */
static int64_t prefetch_piece(void *arg, unsigned i)
{
    const prefetch_job *j = arg;
    uint64_t at = j->start + (uint64_t)i * j->piece;
    uint64_t end = FT__MIN(at + j->piece, j->start + j->len);
    int e = ft__sys.fadvise(j->fd, (off_t)at, (off_t)(end - at), POSIX_FADV_WILLNEED);
    if (e)
        return -e;
    if (populate_cached(j->fd, at, end) != 0) {
        uint8_t *buf = ft__bufpool_get(j->ctx->bounce);
        if (!buf)
            return -ENOMEM;
        uint64_t step = ft__bufpool_size(j->ctx->bounce);
        int64_t r = 0;
        for (uint64_t o = at; o < end && r >= 0; o += step) {
            r = ft__pread_full(j->fd, buf, FT__MIN(step, end - o), o);
            if (r >= 0 && (uint64_t)r < FT__MIN(step, end - o))
                break; /* the file ended early: the load reports it */
        }
        ft__bufpool_put(j->ctx->bounce, buf);
        if (r < 0)
            return r;
    }
    if (j->map) /* cached now: mapped in while the other pieces are still read */
        ft__touch_pages(j->map + at, end - at);
    return 0;
}

/* ft_ckpt_prefetch, and with @p map ft_ckpt_prefetch_map */
static int prefetch(ft_ckpt *c, unsigned k, ft_cache_mode cache, const uint8_t *map)
{
    ft__shard *s = &c->shards[k];
    if (!s->data_size)
        return 1;
    if (ft_ckpt_shard_cached(c, k) == 1) {
        if (map)
            ft_map_populate(c->ctx, map + s->data_start, (size_t)s->data_size);
        return 1;
    }
    if (!ft__auto_keeps(s->file, (int)cache))
        return 0;
    /* Pieces in parallel: one thread's readahead keeps a few requests in flight at most.
     * Small pieces keep the threads' reads near each other, one sequential stream to the
     * disk: on the development machine (virtio disk) 16 MiB pieces loaded 1 GiB cold 1.8x as
     * fast as 64 MiB ones, four processes at once 1.5x (4 and 8 MiB: between the two). */
    prefetch_job j = {.ctx = c->ctx, .fd = s->file->fd, .start = s->data_start,
                      .len = s->data_size,
                      .piece = FT__MIN(ft__spread_piece(c->ctx, s->data_size), PREFETCH_PIECE),
                      .map = map};
    unsigned n = (unsigned)((j.len + j.piece - 1) / j.piece);
    int64_t *results = calloc(n, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "prefetch");
    int rc = ft__pool_run(c->ctx->pool, n, prefetch_piece, &j, results);
    for (unsigned i = 0; rc == 0 && i < n; i++)
        if (results[i] < 0)
            rc = ft__err((int)results[i], "%s: readahead: %s", s->path,
                         ft_strerror((int)results[i]));
    free(results);
    return rc < 0 ? rc : 1;
}

int ft_ckpt_prefetch(ft_ckpt *c, unsigned k, ft_cache_mode cache)
{
    if (!c || k >= c->nshards || (unsigned)cache >= FT_CACHE_COUNT)
        return ft__err(-EINVAL, "ft_ckpt_prefetch: bad checkpoint, shard or cache mode");
    return prefetch(c, k, cache, NULL);
}

int ft_ckpt_prefetch_map(ft_ckpt *c, unsigned k, ft_cache_mode cache, const void *map)
{
    if (!c || k >= c->nshards || (unsigned)cache >= FT_CACHE_COUNT || !map)
        return ft__err(-EINVAL, "ft_ckpt_prefetch_map: bad checkpoint, shard, cache mode or "
                                "mapping");
    ft__shard *s = &c->shards[k];
    struct stat st;
    if (ft__sys.fstat(s->file->fd, &st) < 0)
        return ft__err(-errno, "%s: fstat: %s", s->path, strerror(errno));
    if ((uint64_t)st.st_size < s->data_start + s->data_size)
        return 0; /* shorter than its header says: read, which reports it */
    return prefetch(c, k, cache, map);
}
