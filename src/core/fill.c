/*
 * AUTO's fill arm (an arm whose engine has a fill op: it leaves what it reads cached) and
 * fills asked for by the layers above.
 *
 * The arm reads an uncached range ahead into the page cache with the engine's fill op (its
 * pieces all queued on the pool at once: the disk sees one sequential stream) on a thread of
 * its own, and copies it to the destination span by span as soon as a span's pieces are
 * cached. Each copy is a cached read, decided by AUTO as one (into device memory: cachedma or
 * pinned staging), its tasks queued ahead of the pieces still waiting, so the copies run
 * while the disk reads the spans after them. It is what cold loads into device memory with
 * engine auto always did before AUTO chose it (the checkpoint layer's prefetch path; as an
 * arm, 2 GiB cold into an H100 ran at 0.99x that path, its twin 0.90x:
 * docs/benchmarks/scenarios-h100-cuda-fill-paired.json).
 */
#include "internal.h"
#include "../engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Pieces of a fill: small ones keep the threads' reads near each other, one sequential
 * stream to the disk: on the development machine (virtio disk) 16 MiB pieces loaded 1 GiB
 * cold 1.8x as fast as 64 MiB ones, four processes at once 1.5x (4 and 8 MiB: between the
 * two). */
#define FILL_PIECE (16ull << 20)
/* The arm copies this much at once: four pieces. */
#define COPY_SPAN (4 * FILL_PIECE)

uint64_t ft__fill_piece(const ft_ctx *ctx, uint64_t len)
{
    return FT__MIN(ft__spread_piece(ctx, len), FILL_PIECE);
}

typedef struct fill_run {
    ft__fill_watch watch; /* (first: the engine tells it) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint8_t *done;        /* per piece: told by the engine */
    uint64_t start, piece;
    unsigned n;
    const ft__engine_ops *ops;
    ft__io io;            /* the fill's */
    int64_t rc;           /* its result */
    char detail[FT__DETAIL_MAX]; /* its failure's, told on the thread that ran it */
} fill_run;

static void mark(fill_run *fr, uint64_t off, uint64_t len)
{
    unsigned first = (unsigned)((off - fr->start) / fr->piece);
    unsigned last = (unsigned)((off + len - 1 - fr->start) / fr->piece);
    pthread_mutex_lock(&fr->lock);
    for (unsigned i = first; i <= last && i < fr->n; i++)
        fr->done[i] = 1;
    pthread_cond_broadcast(&fr->cond);
    pthread_mutex_unlock(&fr->lock);
}

static void told(ft__fill_watch *w, uint64_t off, uint64_t len)
{
    if (len)
        mark((fill_run *)w, off, len);
}

static void *run_fill(void *arg)
{
    fill_run *fr = arg;
    fr->rc = fr->ops->fill(&fr->io);
    if (fr->rc < 0)
        ft__detail_save(fr->detail);
    mark(fr, fr->start, fr->io.len); /* all of it, the pieces never queued too */
    return NULL;
}

/* Wait until the pieces of [off, off + len) are told. */
static void wait_for(fill_run *fr, uint64_t off, uint64_t len)
{
    unsigned first = (unsigned)((off - fr->start) / fr->piece);
    unsigned last = (unsigned)((off + len - 1 - fr->start) / fr->piece);
    pthread_mutex_lock(&fr->lock);
    for (unsigned i = first; i <= last; i++)
        while (!fr->done[i])
            pthread_cond_wait(&fr->cond, &fr->lock);
    pthread_mutex_unlock(&fr->lock);
}

/* Copy @p part (cached now) with a decision of AUTO for a cached read (never the fill arm:
 * it reads uncached data only), ahead of the pool's queue: otherwise the pool's workers
 * start it only after the last piece has started, and until then this thread copies alone. */
static int64_t copy_cached(const ft__io *part, int cache, void *ready)
{
    ft__decision d;
    ft__auto_decide(part->file, part->off, part->len, false, FT__CLS_CACHED, part->device,
                    cache, &d);
    ft__io run = *part;
    run.piece = d.piece;
    bool was = ft__pool_first(true);
    int64_t r = ft__dispatch(&run, d.engine, false, ready);
    ft__pool_first(was);
    ft__auto_done(part->file, &d, r, true);
    return r;
}

int64_t ft__fill_read(const ft__io *io, const ft__engine_ops *ops, int cache, void *ready)
{
    fill_run fr = {.start = io->off, .piece = ft__fill_piece(io->ctx, io->len), .ops = ops,
                   .io = *io};
    fr.watch.filled = told;
    fr.n = (unsigned)((io->len + fr.piece - 1) / fr.piece);
    fr.io.ptr = NULL;
    fr.io.device = -1;
    fr.io.piece = fr.piece;
    fr.io.watch = &fr.watch;
    fr.done = calloc(fr.n, 1);
    if (!fr.done)
        return ft__err(-ENOMEM, "%s: readahead", io->file->path);
    pthread_mutex_init(&fr.lock, NULL);
    pthread_cond_init(&fr.cond, NULL);
    pthread_t thread;
    bool threaded = pthread_create(&thread, NULL, run_fill, &fr) == 0;
    if (!threaded) /* no thread to spare: the whole fill first, then the copies */
        run_fill(&fr);
    int64_t r = 0;
    uint64_t span = FT__MAX(COPY_SPAN / fr.piece, 1) * fr.piece;
    for (uint64_t at = 0; r >= 0 && at < io->len; at += span) {
        ft__io part = *io;
        part.ptr += at;
        part.off += at;
        part.len = FT__MIN(span, io->len - at);
        wait_for(&fr, part.off, part.len);
        int64_t c = copy_cached(&part, cache, ready);
        r = c < 0 ? c : r + c;
        if (c >= 0 && (uint64_t)c < part.len)
            break; /* the file's end */
    }
    if (r < 0)
        atomic_store(&fr.watch.stop, true);
    if (threaded)
        pthread_join(thread, NULL);
    if (r >= 0 && fr.rc < 0) { /* the copies went well where the fill failed: its error */
        ft__detail_restore(fr.detail);
        r = fr.rc;
    }
    pthread_cond_destroy(&fr.cond);
    pthread_mutex_destroy(&fr.lock);
    free(fr.done);
    return r;
}

/* The engine of the fill arm AUTO offers for @p f (the first whose engine fills and is
 * usable), NULL when none is. */
static const ft__engine_ops *fill_engine(ft_file *f)
{
    for (unsigned i = 0; i < ft__narms; i++) {
        const ft__engine_ops *ops = ft__engine_get(ft__arms[i].engine);
        if (ft__arms[i].fill && ops->fill && ft_engine_available(f->ctx, ops->id, NULL))
            return ops;
    }
    return NULL;
}

int ft__file_fill(ft_file *f, uint64_t off, uint64_t len, const void *map, int cache)
{
    const ft__engine_ops *ops = fill_engine(f);
    if (!ops || !ft__auto_keeps(f, cache))
        return 0;
    if (!len)
        return 1;
    ft__io io = {.ctx = f->ctx, .file = f, .ptr = (uint8_t *)(uintptr_t)map, .len = len,
                 .off = off, .piece = ft__fill_piece(f->ctx, len), .device = -1};
    ft__auto_enter(f->ctx);
    int64_t r = ops->fill(&io);
    ft__auto_leave(f->ctx);
    return r < 0 ? (int)r : 1;
}

bool ft__file_cached(ft_file *f, uint64_t off, uint64_t len)
{
    return len && ft__probe_cache(f->fd, off, len) == FT__CLS_CACHED;
}
