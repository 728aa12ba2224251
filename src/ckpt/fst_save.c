/*
 * .fst containers, written (the layout is fst.c's): each tensor coded (fst_code.c: a float
 * type's byte planes, Huffman-coded where that pays) or stored, its stream placed at a page
 * boundary of the file and written in pieces, several at once, through the file API while
 * the next tensors are coded (or the streams ft_fst_code coded ahead); the header last.
 * save.c installs the file as it installs a safetensors file (a locked temporary, fdatasync,
 * rename, directory fsync).
 *
 * Whether coding pays, and which encoder codes tensors in GPU memory, is measured per machine,
 * disk and GPU (fst_cost.c).
 */
#include "ckpt.h"
#include "../base/syscall.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* streams go out in pieces of at most this many bytes, each a task of the context's pool
 * (as many at once as it has threads), the batches' writes one after another without a
 * pause between them; the file is made durable once, by the save (save.c) */
#define PIECE (16u << 20)
/* a batch's streams of fewer bytes are moved up to the one before them in its buffer (where
 * it is not there already), so that a run of them goes out in pieces of PIECE bytes, not a
 * write per stream: a GPT-2 state dict's 100 biases and norms of 3-9 KiB each took a write
 * of 2-4 ms each on the development VM while the larger streams were written */
#define SMALL (1u << 20)

bool ft__fst_path(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".fst") == 0;
}

/* ---- the writer ---- */

typedef struct piece piece;

/* A batch of streams (coded into its buffer, or coded ahead: ft_fst_code) and its writes in
 * flight: pieces, how many are not done, their first failure. */
typedef struct batch {
    ft__fst_batch b;
    piece *pieces;
    unsigned left;
    ft__first_err failed;
    bool writing;
} batch;

typedef struct writer {
    ft__fst_coder coder;
    ft_file *f;
    const char *path;
    const ft_save_opts *opts;
    pthread_mutex_t lock; /* batches' left */
    pthread_cond_t done;  /* a batch's writes done */
} writer;

struct piece {
    writer *w;
    batch *b;
    uint8_t *buf;
    uint64_t at, len; /* in the data section; whole pages */
    unsigned index;   /* in its batch */
};

/* Write piece @p arg (a task of the context's pool, or run here); its batch told when done. */
static void write_piece(void *arg)
{
    piece *p = arg;
    ft_buf buf = ft_host_buf(p->buf, (size_t)p->len);
    ft_io_opts o = ft__save_io(p->w->opts);
    int64_t r = ft__transfer(p->w->f, &buf, FT__FST_DATA + p->at, &o, true);
    if (r >= 0 && (uint64_t)r != p->len)
        r = ft__err(-EIO, "%s: a short write", p->w->path);
    if (r < 0)
        ft__first_err_note(&p->b->failed, p->index, (int)r);
    pthread_mutex_lock(&p->w->lock);
    if (--p->b->left == 0)
        pthread_cond_broadcast(&p->w->done);
    pthread_mutex_unlock(&p->w->lock);
}

/* Whether stream @p x of a batch follows @p prev in memory as in the file; where @p move and
 * it is small, it is moved there first (a buffer's stream has the room of its bound, from
 * where its predecessor's bound ends: it is never below where it moves to). */
static bool follows(const ft__fst_stream *prev, ft__fst_stream *x, bool move)
{
    uint8_t *end = prev->buf + ft__fst_page_up(prev->size);
    if (x->at != prev->at + ft__fst_page_up(prev->size))
        return false;
    if (x->buf != end && move && x->size < SMALL) {
        memmove(end, x->buf, (size_t)ft__fst_page_up(x->size));
        x->buf = end;
    }
    return x->buf == end;
}

/* Batch @p x's writes: runs of streams that follow each other (follows(), moving the small
 * ones of a batch's own buffer where @p move), in pieces of at most PIECE bytes, into @p out
 * where not NULL. @return how many. */
static size_t cut_pieces(writer *w, batch *b, bool move, piece *out)
{
    ft__fst_batch *x = &b->b;
    size_t k = 0;
    for (size_t i = 0, end; i < x->n; i = end) {
        uint64_t len = ft__fst_page_up(x->items[i].size);
        for (end = i + 1; end < x->n && follows(&x->items[end - 1], &x->items[end], move); end++)
            len += ft__fst_page_up(x->items[end].size);
        for (uint64_t from = 0; from < len; from += PIECE, k++)
            if (out)
                out[k] = (piece){.w = w, .b = b, .buf = x->items[i].buf + from,
                                 .at = x->items[i].at + from,
                                 .len = FT__MIN((uint64_t)PIECE, len - from),
                                 .index = (unsigned)k};
    }
    return k;
}

/* Start writing batch @p b's streams (@p move: see cut_pieces): a pool task per piece, so
 * that the writes of the next batches queue behind them and the disk never waits for a
 * batch's last piece. (The save waits for them on its caller's thread, never on a worker of
 * that pool: a .fst container is one shard, which save.c writes there.) */
static int write_start(writer *w, batch *b, bool move)
{
    size_t n = cut_pieces(w, b, move, NULL);
    if (!(b->pieces = calloc(n + 1, sizeof *b->pieces)))
        return ft__err(-ENOMEM, "%s: pieces", w->path);
    ft__first_err_init(&b->failed);
    b->writing = true;
    b->left = (unsigned)n;
    cut_pieces(w, b, false, b->pieces);
    ft__pool *pool = w->coder.ctx->pool;
    bool pooled = ft__pool_workers(pool) > 0;
    for (size_t k = 0; k < n; k++)
        if (!pooled || ft__pool_post(pool, write_piece, &b->pieces[k]) < 0)
            write_piece(&b->pieces[k]); /* (no worker, or no memory for the task) */
    return 0;
}

/* Wait for batch @p b's writes (where started) and free it. @return their first failure
 * (its detail the thread's), or 0. */
static int write_wait(writer *w, batch *b)
{
    int rc = 0;
    if (b->writing) {
        pthread_mutex_lock(&w->lock);
        while (b->left)
            pthread_cond_wait(&w->done, &w->lock);
        pthread_mutex_unlock(&w->lock);
        rc = ft__first_err_take(&b->failed);
    }
    free(b->pieces);
    ft__fst_batch_free(&w->coder, &b->b);
    *b = (batch){0};
    return rc;
}

/* Reserve the extent of the streams of batch @p b (ending at data byte @p end) before its
 * writes, as a plain save reserves its file's (an early ENOSPC; writes that do not extend
 * the file: stored streams on the development VM went from 0.82x to 0.89x of a plain save's
 * rate with the writer of the time), then start them. */
static int write_batch(writer *w, batch *b, uint64_t end, bool move)
{
    uint64_t from = b->b.items[0].at ? FT__FST_DATA + b->b.items[0].at : 0;
    int rc = ft_file_allocate(w->f, from, FT__FST_DATA + end - from);
    if (rc == 0 || rc == -EOPNOTSUPP)
        rc = write_start(w, b, move);
    return rc;
}

/* Code and write the streams of tensors @p t in batches, batch k coded into the buffer of
 * batch k - FT__FST_BUFFERS once that is written; each stream's place in @p all. @return the data
 * section's end, or -errno. */
static int64_t write_coding(writer *w, const ft_tensor *t, size_t n, ft__fst_stream *all)
{
    batch b[FT__FST_BUFFERS];
    memset(b, 0, sizeof b);
    uint64_t at = 0;
    unsigned k = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; k++) {
        batch *cur = &b[k % FT__FST_BUFFERS];
        if ((rc = write_wait(w, cur)) < 0)
            break;
        size_t first = i;
        uint64_t room;
        i = ft__fst_batch_end(&w->coder, t, n, first, k, &room);
        if ((rc = ft__fst_batch_code(&w->coder, &cur->b, &t[first], i - first, room)) < 0)
            break;
        for (size_t j = 0; j < cur->b.n; j++) {
            cur->b.items[j].at = at;
            at += ft__fst_page_up(cur->b.items[j].size);
            all[first + j] = cur->b.items[j];
            all[first + j].buf = NULL;
        }
        rc = write_batch(w, cur, at, true);
    }
    /* every batch's writes done (the oldest first: its failure is the one reported) */
    for (unsigned j = 0; j < FT__FST_BUFFERS; j++) {
        batch *x = &b[(k + j) % FT__FST_BUFFERS];
        if (rc < 0)
            FT__KEEPING_DETAIL(write_wait(w, x));
        else
            rc = write_wait(w, x);
    }
    return rc < 0 ? rc : (int64_t)at;
}

/* Write the streams ft_fst_code made of the caller's tensors (@p order: which is tensor i's),
 * as one batch; each stream's place in @p all. @return the data section's end, or -errno. */
static int64_t write_coded(writer *w, const ft_tensor *t, size_t n, const size_t *order,
                           ft__fst_stream *all)
{
    batch b = {0};
    int rc = ft__fst_coded_streams(w->opts->coded, w->opts->coded_index, t, n, order,
                                   all);
    uint64_t at = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        all[i].at = at;
        at += ft__fst_page_up(all[i].size);
    }
    if (rc == 0 && n) {
        b.b = (ft__fst_batch){.items = malloc(n * sizeof *all), .n = n};
        rc = b.b.items ? 0 : ft__err(-ENOMEM, "%s: %zu streams", w->path, n);
    }
    if (rc == 0 && n) {
        memcpy(b.b.items, all, n * sizeof *all);
        rc = write_batch(w, &b, at, false);
    }
    if (rc < 0)
        FT__KEEPING_DETAIL(write_wait(w, &b));
    else
        rc = write_wait(w, &b);
    return rc < 0 ? rc : (int64_t)at;
}

static void member(ft__jw *j, const char *key)
{
    ft__jw_str(j, key, strlen(key));
    ft__jw_raw(j, ":");
}

/* The header: metadata, the container's version and codec, each tensor's entry. */
static char *header_json(const ft_tensor *t, size_t n, const ft__fst_stream *all,
                         const char *const *meta, size_t *len)
{
    ft__jw j = {0};
    ft__jw_raw(&j, "{");
    member(&j, "__metadata__");
    ft__jw_raw(&j, "{");
    for (size_t i = 0; meta && meta[i]; i += 2) {
        if (i)
            ft__jw_raw(&j, ",");
        member(&j, meta[i]);
        ft__jw_str(&j, meta[i + 1], strlen(meta[i + 1]));
    }
    ft__jw_raw(&j, "},\"fastensor.container\":{\"version\":1,\"codec\":\"ftz1\"}");
    uint64_t virt = 0;
    for (size_t i = 0; i < n; i++) {
        ft__jw_raw(&j, ",");
        member(&j, t[i].name);
        ft__jw_raw(&j, "{\"dtype\":");
        ft__jw_str(&j, ft_dtype_name(t[i].dtype), strlen(ft_dtype_name(t[i].dtype)));
        ft__jw_raw(&j, ",\"shape\":[");
        for (unsigned d = 0; d < t[i].ndim; d++) {
            if (d)
                ft__jw_raw(&j, ",");
            ft__jw_int(&j, (int64_t)t[i].shape[d]);
        }
        ft__jw_raw(&j, "],\"data_offsets\":[");
        ft__jw_int(&j, (int64_t)virt);
        ft__jw_raw(&j, ",");
        ft__jw_int(&j, (int64_t)(virt + t[i].data.len));
        ft__jw_raw(&j, "],\"stored\":[");
        ft__jw_int(&j, (int64_t)all[i].at);
        ft__jw_raw(&j, ",");
        ft__jw_int(&j, (int64_t)(all[i].at + all[i].size));
        ft__jw_raw(&j, all[i].compressed ? "],\"compressed\":true}" : "],\"compressed\":false}");
        virt += t[i].data.len;
    }
    ft__jw_raw(&j, "}");
    return ft__jw_done(&j, len);
}

int ft__fst_write(ft_ctx *ctx, ft_file *f, const char *path, const char *dir,
                  const ft_tensor *t, size_t n, const ft_save_opts *opts, const size_t *order)
{
    writer w = {.f = f, .path = path, .opts = opts};
    ft__fst_stream *all = calloc(n + 1, sizeof *all);
    int rc = all ? 0 : ft__err(-ENOMEM, "%s: %zu tensors", path, n);
    bool coded = opts && opts->coded;
    w.coder.ctx = ctx;
    if (rc == 0 && !coded)
        rc = ft__fst_coder_init(&w.coder, ctx, path, dir, t, n,
                                opts ? opts->compression : FT_COMPRESS_AUTO);
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.done, NULL);
    int64_t at = rc;
    if (rc == 0)
        at = coded ? write_coded(&w, t, n, order, all) : write_coding(&w, t, n, all);
    rc = at < 0 ? (int)at : 0;
    if (w.coder.rooms)
        ft__fst_coder_done(&w.coder);
    pthread_cond_destroy(&w.done);
    pthread_mutex_destroy(&w.lock);
    size_t jlen = 0;
    char *json = rc == 0 ? header_json(t, n, all, opts ? opts->metadata : NULL, &jlen) : NULL;
    if (rc == 0 && !json)
        rc = ft__err(-ENOMEM, "%s: header", path);
    uint8_t *head = rc == 0 ? calloc(1, FT__FST_DATA) : NULL;
    if (rc == 0 && !head)
        rc = ft__err(-ENOMEM, "%s: header", path);
    if (rc == 0) { /* the header after the streams, then the head that points at it */
        uint64_t hoff = FT__FST_DATA + (uint64_t)at;
        memcpy(head, FT__FST_MAGIC, 8);
        for (int y = 0; y < 8; y++) {
            head[8 + y] = (uint8_t)(hoff >> (8 * y));
            head[16 + y] = (uint8_t)((uint64_t)jlen >> (8 * y));
        }
        ft_io_opts o = ft__save_io(opts);
        ft_buf hb = ft_host_buf(json, jlen);
        int64_t r = ft__transfer(f, &hb, hoff, &o, true);
        hb = ft_host_buf(head, FT__FST_DATA);
        if (r >= 0)
            r = ft__transfer(f, &hb, 0, &o, true);
        rc = r < 0 ? (int)r : 0;
    }
    free(head);
    free(json);
    free(all);
    return rc;
}
