/* Prefetching a shard into the page cache before a load: parallel readahead in pieces, each
 * waited for without a copy (ft_ckpt_prefetch), mapped into the caller's mapping as it
 * arrives (ft_ckpt_prefetch_map), or copied to the load's destination as it arrives
 * (ft__ckpt_prefetch_read, for loads into device memory). */
#include "ckpt.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>

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
    /* ft__ckpt_prefetch_read: the pieces done (cached, or failed), told under lock by cond;
     * stop: the reader failed, the pieces not started are skipped */
    uint8_t *done;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool stop;
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

/* prefetch_piece, then the piece told done to the reader waiting for it */
static int64_t prefetch_piece_told(void *arg, unsigned i)
{
    prefetch_job *j = arg;
    int64_t r = atomic_load(&j->stop) ? 0 : prefetch_piece(arg, i);
    pthread_mutex_lock(&j->lock);
    j->done[i] = 1;
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->lock);
    return r;
}

/* Whether shard @p k is to be read into the page cache first: it has data, is not cached
 * already and @p cache keeps it. */
static bool worth_prefetching(ft_ckpt *c, unsigned k, ft_cache_mode cache)
{
    ft__shard *s = &c->shards[k];
    return s->data_size && ft_ckpt_shard_cached(c, k) != 1 &&
           ft__auto_keeps(s->file, (int)cache);
}

/* The job for shard @p k, and its number of pieces. Pieces in parallel: one thread's
 * readahead keeps a few requests in flight at most. Small pieces keep the threads' reads
 * near each other, one sequential stream to the disk: on the development machine (virtio
 * disk) 16 MiB pieces loaded 1 GiB cold 1.8x as fast as 64 MiB ones, four processes at once
 * 1.5x (4 and 8 MiB: between the two). */
static unsigned prefetch_job_of(ft_ckpt *c, unsigned k, const uint8_t *map, prefetch_job *j)
{
    ft__shard *s = &c->shards[k];
    *j = (prefetch_job){.ctx = c->ctx, .fd = s->file->fd, .start = s->data_start,
                        .len = s->data_size, .map = map,
                        .piece = FT__MIN(ft__spread_piece(c->ctx, s->data_size),
                                         PREFETCH_PIECE)};
    return (unsigned)((j->len + j->piece - 1) / j->piece);
}

/* Run the pieces of @p j (@p n) on the pool: 1, or the first failure. */
static int run_pieces(ft__shard *s, prefetch_job *j, unsigned n,
                      int64_t (*piece)(void *, unsigned))
{
    int64_t *results = calloc(n, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "prefetch");
    int rc = ft__pool_run(j->ctx->pool, n, piece, j, results);
    for (unsigned i = 0; rc == 0 && i < n; i++)
        if (results[i] < 0)
            rc = ft__err((int)results[i], "%s: readahead: %s", s->path,
                         ft_strerror((int)results[i]));
    free(results);
    return rc < 0 ? rc : 1;
}

/* ft_ckpt_prefetch, and with @p map ft_ckpt_prefetch_map */
static int prefetch(ft_ckpt *c, unsigned k, ft_cache_mode cache, const uint8_t *map)
{
    ft__shard *s = &c->shards[k];
    if (s->fst)
        return 0; /* its streams are decoded, never mapped: read it */
    if (!s->data_size)
        return 1;
    if (ft_ckpt_shard_cached(c, k) == 1) {
        if (map)
            ft_map_populate(c->ctx, map + s->data_start, (size_t)s->data_size);
        return 1;
    }
    if (!ft__auto_keeps(s->file, (int)cache))
        return 0;
    prefetch_job j;
    unsigned n = prefetch_job_of(c, k, map, &j);
    return run_pieces(s, &j, n, prefetch_piece);
}

typedef struct streamed {
    ft_ckpt *c;
    unsigned k, n;
    prefetch_job job;
    int rc; /* run_pieces' */
    char detail[FT__DETAIL_MAX]; /* its failure's, told on the thread that ran it */
} streamed;

static void *run_streamed(void *arg)
{
    streamed *st = arg;
    st->rc = run_pieces(&st->c->shards[st->k], &st->job, st->n, prefetch_piece_told);
    if (st->rc < 0)
        ft__detail_save(st->detail);
    return NULL;
}

/* How much of the shard the reader copies at once: four pieces. Each copy is one transfer
 * (a cached read into device memory: cachedma's workers or pinned staging, on the pool's
 * threads ahead of the pieces queued), after its pieces are in the cache and while the
 * pieces after them are still read from the disk. */
#define READ_SPAN (4 * PREFETCH_PIECE)

int64_t ft__ckpt_prefetch_read(ft_ckpt *c, unsigned k, const ft_buf *dst, const ft_io_opts *io)
{
    ft__shard *s = &c->shards[k];
    if (!worth_prefetching(c, k, io->cache))
        return 0;
    streamed st = {.c = c, .k = k};
    st.n = prefetch_job_of(c, k, NULL, &st.job);
    st.job.done = calloc(st.n, 1);
    if (!st.job.done)
        return ft__err(-ENOMEM, "prefetch");
    pthread_mutex_init(&st.job.lock, NULL);
    pthread_cond_init(&st.job.cond, NULL);
    pthread_t thread;
    int64_t r = 0;
    if (pthread_create(&thread, NULL, run_streamed, &st) != 0) {
        r = run_pieces(s, &st.job, st.n, prefetch_piece); /* no thread to spare: all first */
        r = r < 0 ? r : 0;                                 /* (the caller reads them) */
    } else {
        uint64_t span = FT__MAX(READ_SPAN / st.job.piece, 1) * st.job.piece;
        for (uint64_t at = 0; r >= 0 && at < s->data_size; at += span) {
            uint64_t len = FT__MIN(span, s->data_size - at);
            unsigned last = (unsigned)((at + len - 1) / st.job.piece);
            pthread_mutex_lock(&st.job.lock);
            for (unsigned i = (unsigned)(at / st.job.piece); i <= last; i++)
                while (!st.job.done[i])
                    pthread_cond_wait(&st.job.cond, &st.job.lock);
            pthread_mutex_unlock(&st.job.lock);
            ft_buf part = *dst;
            part.ptr = (uint8_t *)dst->ptr + at;
            part.len = (size_t)len;
            /* the copy's tasks ahead of the pieces still queued: otherwise the pool's
             * workers start it only after the last piece has started, and until then this
             * thread copies alone */
            bool was = ft__pool_first(true);
            r = ft__shard_read(s, &part, at, io);
            ft__pool_first(was);
        }
        if (r < 0)
            atomic_store(&st.job.stop, true);
        pthread_join(thread, NULL);
        if (r >= 0 && st.rc < 0)
            ft__detail_restore(st.detail);
        r = r < 0 ? r : st.rc < 0 ? st.rc : (int64_t)s->data_size;
    }
    pthread_cond_destroy(&st.job.cond);
    pthread_mutex_destroy(&st.job.lock);
    free(st.job.done);
    return r;
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

int ft_ckpt_shard_mappable(const ft_ckpt *c, unsigned k, const ft_load_opts *o, int mmap)
{
    if (!c || k >= c->nshards || mmap < -1 || mmap > 1)
        return ft__err(-EINVAL, "ft_ckpt_shard_mappable: bad checkpoint, shard or mmap %d",
                       mmap);
    const ft__shard *s = &c->shards[k];
    ft_engine engine = o ? o->engine : FT_ENGINE_AUTO;
    if (mmap == 0 || (o && (o->flags & FT_LOAD_VERIFY)) || s->fst || !s->data_size ||
        s->data_start % 8 || (mmap < 0 && engine != FT_ENGINE_AUTO))
        return 0; /* checked while read, decoded, empty, misaligned views, a named engine */
    struct stat st;
    if (ft__sys.fstat(s->file->fd, &st) < 0)
        return ft__err(-errno, "%s: fstat: %s", s->path, strerror(errno));
    return (uint64_t)st.st_size >= s->data_start + s->data_size; /* shorter: read, which
                                                                     reports it */
}
