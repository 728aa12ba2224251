/*
 * ft_fst_code: a save's tensors coded ahead of it, into host memory packed to the coded size
 * and kept for the next save (an asynchronous save's staging copy). The tensors their GPU
 * codes are coded there in one encoder call per GPU, each stream placed straight into the
 * packed memory; the rest go through a save's batches (fst_code.c) and are copied in.
 */
#include "ckpt.h"
#include "../codec/codec.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* the memory of the streams: pieces of this many bytes (or one stream's, where larger) */
#define PIECE_ROOM (64ull << 20)
/* coded bytes copied out of a batch's buffer in tasks of at most this many */
#define COPY_TASK (8u << 20)

typedef struct piece_mem {
    ft__bufpool *pool; /* of one buffer (pinned where CUDA is in use) */
    uint8_t *mem;
    uint64_t size, used;
} piece_mem;

typedef struct kept_stream {
    ft_dtype dtype;
    unsigned ndim;
    uint64_t shape[FT_MAX_DIMS];
    uint64_t nbytes;  /* the tensor's */
    uint8_t *buf;
    uint64_t size;
    bool compressed;
} kept_stream;

struct ft_fst_coded {
    piece_mem *pieces;
    size_t npieces;
    kept_stream *s;   /* the streams of the last ft_fst_code, in its caller's order */
    size_t n;
};

static int add_piece(ft_fst_coded *c, uint64_t size)
{
    piece_mem *p = realloc(c->pieces, (c->npieces + 1) * sizeof *p);
    if (!p)
        return -ENOMEM;
    c->pieces = p;
    p = &c->pieces[c->npieces];
    *p = (piece_mem){.size = size};
    if (ft__bufpool_create_pinned(&p->pool, (size_t)size, 1) < 0)
        return -ENOMEM;
    if (!(p->mem = ft__bufpool_get(p->pool))) {
        ft__bufpool_destroy(p->pool);
        return -ENOMEM;
    }
    c->npieces++;
    return 0;
}

/* Room for @p len bytes (whole pages) after the streams placed so far: in the first piece
 * with room, else a new one. @return it, or NULL (ENOMEM). */
static uint8_t *place(ft_fst_coded *c, uint64_t len)
{
    size_t i = 0;
    while (i < c->npieces && c->pieces[i].size - c->pieces[i].used < len)
        i++;
    if (i == c->npieces && add_piece(c, FT__MAX(PIECE_ROOM, len)) < 0)
        return NULL;
    piece_mem *p = &c->pieces[i];
    p->used += len;
    return p->mem + p->used - len;
}

/* Free the pieces no stream uses (a smaller save's streams: memory to give back). */
static void trim(ft_fst_coded *c)
{
    size_t keep = 0;
    for (size_t i = 0; i < c->npieces; i++) {
        if (c->pieces[i].used) {
            c->pieces[keep++] = c->pieces[i];
        } else {
            ft__bufpool_put(c->pieces[i].pool, c->pieces[i].mem);
            ft__bufpool_destroy(c->pieces[i].pool);
        }
    }
    c->npieces = keep;
}

/* The GPU encoder's placer (ft__codec_placer) for @p arg, an ft_fst_coded: room in its
 * memory as place() gives it; what a stream does not take given back at once (the stream is
 * the last one placed in its piece). */
static void *place_room(void *arg, uint64_t cap)
{
    return place(arg, ft__fst_page_up(cap));
}

static void fit_room(void *arg, void *dst, uint64_t cap, uint64_t size)
{
    ft_fst_coded *c = arg;
    for (size_t i = 0; i < c->npieces; i++)
        if ((uint8_t *)dst >= c->pieces[i].mem &&
            (uint8_t *)dst < c->pieces[i].mem + c->pieces[i].size)
            c->pieces[i].used -= ft__fst_page_up(cap) - ft__fst_page_up(size);
}

/* The record of stream @p size at @p buf for tensor @p t, zeros after it to its page's end. */
static void keep_stream(kept_stream *s, const ft_tensor *t, uint8_t *buf, uint64_t size,
                        bool compressed)
{
    *s = (kept_stream){.dtype = t->dtype, .ndim = t->ndim, .nbytes = t->data.len, .buf = buf,
                       .size = size, .compressed = compressed};
    if (t->ndim)
        memcpy(s->shape, t->shape, t->ndim * sizeof *s->shape);
    memset(buf + size, 0, ft__fst_page_up(size) - size);
}

/*
 * ft_fst_code's tensors that their GPUs code (as code_on_gpus picks them), coded there straight
 * into @p c's memory: one call per GPU, the streams packed as the encoder writes them, with
 * no batch buffer and no copy on the host between (an asynchronous save's caller waits for
 * this). done[i] marks those kept. A stream that saves too little stays where it was written,
 * unused, and its tensor is left to the batches (which store it); a call that fails gives its
 * memory back and leaves its tensors to the batches (which try each alone).
 */
static void code_ahead_on_gpus(ft__fst_coder *coder, ft_fst_coded *c, const ft_tensor *t,
                               size_t n, bool *done)
{
    ft_codec_enc_job *jobs = calloc(n + 1, sizeof *jobs);
    size_t *which = calloc(n + 1, sizeof *which);
    bool *tried = calloc(n + 1, sizeof *tried);
    ft__codec_placer placer = {place_room, fit_room, c};
    for (size_t first = 0; jobs && which && tried && first < n; first++) {
        if (tried[first] || t[first].data.kind != FT_MEM_CUDA)
            continue; /* (a device's tensors are gathered once: at its first) */
        int dev = t[first].data.device;
        size_t k = 0;
        for (size_t i = first; i < n; i++) {
            if (tried[i] || t[i].data.kind != FT_MEM_CUDA || t[i].data.device != dev)
                continue;
            tried[i] = true;
            ft__fst_stream y = ft__fst_coding(coder, &t[i]);
            if (!y.want || !ft__fst_gpu_codes(coder->ctx, dev, y.elem, NULL))
                continue;
            jobs[k] = (ft_codec_enc_job){t[i].data.ptr, t[i].data.len, y.elem,
                                         ft__fst_block(y.elem), NULL, 0, 0};
            which[k++] = i;
        }
        if (!k)
            continue;
        size_t had = c->npieces;
        uint64_t *used = calloc(had + 1, sizeof *used);
        if (!used)
            break;
        for (size_t i = 0; i < had; i++)
            used[i] = c->pieces[i].used;
        pthread_mutex_t *one = ft__fst_gpu_lock(coder->ctx, dev);
        pthread_mutex_lock(one);
        int64_t r = ft__codec_encode_cuda_batch(jobs, k, dev, NULL, &placer);
        pthread_mutex_unlock(one);
        for (size_t i = 0; i < c->npieces; i++) /* a failed call's memory given back */
            c->pieces[i].used = r < 0 ? i < had ? used[i] : 0 : c->pieces[i].used;
        for (size_t j = 0; r >= 0 && j < k; j++) {
            size_t i = which[j];
            uint64_t m = (uint64_t)jobs[j].size;
            /* (as a save's batch keeps it) */
            if ((done[i] = ft__fst_saves_enough(jobs[j].size, t[i].data.len)))
                keep_stream(&c->s[i], &t[i], jobs[j].dst, m, m < t[i].data.len);
        }
        free(used);
    }
    free(jobs);
    free(which);
    free(tried);
}

typedef struct copy_task {
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
} copy_task;

static int64_t copy_one(void *arg, unsigned i)
{
    copy_task *t = &((copy_task *)arg)[i];
    memcpy(t->dst, t->src, t->len);
    return 0;
}

/* Batch @p b's streams (of the caller's tensors @p index[first...]) into @p c's memory, copied
 * out of the batch's buffer on the context's threads. */
static int keep_batch(ft_ctx *ctx, ft_fst_coded *c, const ft__fst_batch *b, const size_t *index,
                      size_t first)
{
    size_t ntasks = 0;
    for (size_t j = 0; j < b->n; j++)
        ntasks += (size_t)((ft__fst_page_up(b->items[j].size) + COPY_TASK - 1) / COPY_TASK);
    copy_task *tasks = calloc(ntasks + 1, sizeof *tasks);
    int64_t *results = calloc(ntasks + 1, sizeof *results);
    int rc = tasks && results ? 0 : -ENOMEM;
    size_t k = 0;
    for (size_t j = 0; rc == 0 && j < b->n; j++) {
        const ft__fst_stream *x = &b->items[j];
        uint64_t len = ft__fst_page_up(x->size);
        uint8_t *dst = place(c, len);
        if (!dst) {
            rc = -ENOMEM;
            break;
        }
        for (uint64_t at = 0; at < len; at += COPY_TASK)
            tasks[k++] = (copy_task){dst + at, x->buf + at, (size_t)FT__MIN(COPY_TASK, len - at)};
        kept_stream *s = &c->s[index[first + j]];
        *s = (kept_stream){.dtype = x->t->dtype, .ndim = x->t->ndim, .nbytes = x->t->data.len,
                           .buf = dst, .size = x->size, .compressed = x->compressed};
        if (x->t->ndim)
            memcpy(s->shape, x->t->shape, x->t->ndim * sizeof *s->shape);
    }
    if (rc == 0 && k)
        rc = (int)ft__pool_run(ctx->pool, (unsigned)k, copy_one, tasks, results);
    free(tasks);
    free(results);
    return rc;
}

int64_t ft_fst_code(ft_ctx *ctx, const char *dir, const ft_tensor *tensors, size_t count,
                    const ft_save_opts *opts, ft_fst_coded **coded)
{
    if (!ctx || !coded || (count && !tensors))
        return ft__err(-EINVAL, "ft_fst_code: missing context, tensors or object");
    if (*coded)
        (*coded)->n = 0; /* (until the new streams are all there) */
    ft_compression mode = opts ? opts->compression : FT_COMPRESS_AUTO;
    if ((unsigned)mode >= FT_COMPRESS_COUNT)
        return ft__err(-EINVAL, "ft_fst_code: compression %d", (int)mode);
    int rc = ft__tensors_check(tensors, count, NULL, true, false);
    if (rc < 0)
        return rc;
    if (!*coded && !(*coded = calloc(1, sizeof **coded)))
        return ft__err(-ENOMEM, "ft_fst_code: the object");
    ft_fst_coded *c = *coded;
    for (size_t i = 0; i < c->npieces; i++)
        c->pieces[i].used = 0;
    kept_stream *s = realloc(c->s, (count + 1) * sizeof *s);
    if (!s)
        return ft__err(-ENOMEM, "ft_fst_code: %zu tensors", count);
    c->s = s;
    ft__fst_coder coder;
    const char *where = dir && *dir ? dir : ".";
    rc = ft__fst_coder_init(&coder, ctx, where, where, tensors, count, mode);
    /* the GPUs' tensors first, into the memory at once; the rest (rest[j], tensor index[j])
     * in batches, copied in */
    bool *done = calloc(count + 1, sizeof *done);
    ft_tensor *rest = calloc(count + 1, sizeof *rest);
    size_t *index = calloc(count + 1, sizeof *index), nrest = 0;
    if (rc == 0 && (!done || !rest || !index))
        rc = ft__err(-ENOMEM, "ft_fst_code: %zu tensors", count);
    if (rc == 0 && ft__cuda_in_use())
        code_ahead_on_gpus(&coder, c, tensors, count, done);
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (!done[i]) {
            rest[nrest] = tensors[i];
            index[nrest++] = i;
        }
    for (size_t i = 0; rc == 0 && i < nrest;) {
        size_t first = i;
        uint64_t room;
        ft__fst_batch b;
        i = ft__fst_batch_end(&coder, rest, nrest, first, 8, &room);
        rc = ft__fst_batch_code(&coder, &b, &rest[first], i - first, room);
        if (rc == 0 && (rc = keep_batch(ctx, c, &b, index, first)) == -ENOMEM)
            rc = ft__err(-ENOMEM, "ft_fst_code: memory for the coded streams");
        ft__fst_batch_free(&coder, &b);
    }
    free(done);
    free(rest);
    free(index);
    if (coder.rooms)
        ft__fst_coder_done(&coder);
    trim(c);
    if (rc < 0)
        return rc;
    c->n = count;
    int64_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += (int64_t)c->s[i].size;
    return total;
}

uint64_t ft_fst_coded_memory(const ft_fst_coded *coded)
{
    uint64_t n = 0;
    for (size_t i = 0; coded && i < coded->npieces; i++)
        n += coded->pieces[i].size;
    return n;
}

void ft_fst_coded_free(ft_fst_coded *coded)
{
    if (!coded)
        return;
    for (size_t i = 0; i < coded->npieces; i++)
        coded->pieces[i].used = 0;
    trim(coded);
    free(coded->pieces);
    free(coded->s);
    free(coded);
}

int ft__fst_coded_streams(const ft_fst_coded *coded, const size_t *index, const ft_tensor *t,
                          size_t n, const size_t *order, ft__fst_stream *out)
{
    if (!index && coded->n != n)
        return ft__err(-EINVAL, "the coded streams are of %zu tensors, the save has %zu",
                       coded->n, n);
    for (size_t i = 0; i < n; i++) {
        size_t k = index ? index[order[i]] : order[i];
        if (k >= coded->n)
            return ft__err(-EINVAL, "tensor '%s': coded stream %zu of %zu", t[i].name, k,
                           coded->n);
        const kept_stream *s = &coded->s[k];
        if (s->dtype != t[i].dtype || s->ndim != t[i].ndim || s->nbytes != t[i].data.len ||
            (t[i].ndim && memcmp(s->shape, t[i].shape, t[i].ndim * sizeof *s->shape)))
            return ft__err(-EINVAL, "tensor '%s': not the dtype and shape of coded stream %zu",
                           t[i].name, k);
        out[i] = (ft__fst_stream){.t = &t[i], .buf = s->buf, .size = s->size,
                                  .cap = ft__fst_page_up(s->size), .compressed = s->compressed};
    }
    return 0;
}
