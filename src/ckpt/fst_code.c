/*
 * A .fst save's coding: its tensors coded in batches (fst_save.c writes each batch while the
 * next is coded), each float tensor by its GPU where that GPU codes them (fst_cost.c
 * measures), else on the host, a stream that saves too little stored instead. And
 * ft_fst_code: a save's tensors coded ahead of it, into host memory packed to the coded size
 * and kept for the next save (an asynchronous save's staging copy).
 */
#include "ckpt.h"
#include "../codec/codec.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096u
/* a kept stream saves at least this share of the tensor's bytes */
#define MIN_SAVING 0.05
/* tensors coded at once: up to this many, their streams' room up to this many bytes unless
 * one alone takes more (the first batches less: the disk starts sooner) */
#define BATCH_TENSORS 64u
#define BATCH_ROOM (64ull << 20)
#define FIRST_ROOM (16ull << 20)

static uint64_t page_up(uint64_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

/* Whether a stream of @p m bytes of a tensor of @p n is worth keeping coded. */
static bool saves_enough(int64_t m, uint64_t n)
{
    return (double)m <= (1 - MIN_SAVING) * (double)n + 64;
}

/* Tensor @p t's stream parameters: the element size it is coded by (1: stored), and the room
 * its stream takes (whole pages: coded, or stored where coding saves too little). */
static ft__fst_stream coding(const ft__fst_coder *c, const ft_tensor *t)
{
    unsigned el = ft__dtype_coded(t->dtype);
    bool want = el && (t->data.kind == FT_MEM_CUDA ? c->code_dev[el] : c->code[el]);
    unsigned e = want ? el : 1;
    size_t cap = page_up(FT__MAX(ft_codec_bound(t->data.len, e, ft__fst_block(e)),
                                 ft_codec_bound(t->data.len, 1, ft__fst_block(1))));
    return (ft__fst_stream){.t = t, .cap = cap, .elem = e, .want = want};
}

size_t ft__fst_batch_end(const ft__fst_coder *c, const ft_tensor *t, size_t n, size_t first,
                         unsigned k, uint64_t *room)
{
    size_t i = first;
    uint64_t most = FT__MIN(BATCH_ROOM, FIRST_ROOM << FT__MIN(k, 8u));
    *room = 0;
    for (; i < n && i - first < BATCH_TENSORS; i++) {
        size_t cap = coding(c, &t[i]).cap;
        if (i > first && *room + cap > most)
            break;
        *room += cap;
    }
    return i;
}

/* The save's pool of FT__FST_BUFFERS batch buffers of BATCH_ROOM bytes (pinned where the process
 * has initialised CUDA: the GPU encoder copies coded bytes into them at DMA speed): the one
 * the context keeps, else a new one (kept after the save where no other save took the
 * context's meanwhile). Kept, they spare a training job's saves the first touch of fresh
 * memory: stored streams on the development VM ran at 0.76x of a plain save's rate in fresh
 * 4 KiB pages per tensor, 0.89x in kept buffers of huge pages (0.6x the first time).
 * A tensor whose stream takes more than BATCH_ROOM (an embedding) is coded into a buffer of
 * its own, one of up to FT__FST_BUFFERS the context keeps as well (each up to BIG_KEPT
 * bytes; a larger need replaces the smallest): fresh, the 125 MB streams of a Llama-style
 * state dict's embedding and head took 0.25 s each to be stored on the development VM
 * (0.5 GB/s, their pages' first touch), and the GPU encoder copied into them at pageable
 * speed. */
#define BIG_KEPT (1ull << 30)

typedef struct kept_rooms {
    pthread_mutex_t lock;
    ft__bufpool *pool;
    ft__bufpool *big[FT__FST_BUFFERS]; /* of one buffer each */
} kept_rooms;

static const char rooms_key;

static void *make_rooms(ft_ctx *ctx)
{
    (void)ctx;
    kept_rooms *k = calloc(1, sizeof *k);
    if (k)
        pthread_mutex_init(&k->lock, NULL);
    return k;
}

static void destroy_rooms(void *obj)
{
    kept_rooms *k = obj;
    ft__bufpool_destroy(k->pool);
    for (unsigned i = 0; i < FT__FST_BUFFERS; i++)
        ft__bufpool_destroy(k->big[i]);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

static ft__bufpool *rooms_take(ft_ctx *ctx)
{
    kept_rooms *k = ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms);
    ft__bufpool *p = NULL;
    if (k) {
        pthread_mutex_lock(&k->lock);
        p = k->pool;
        k->pool = NULL;
        pthread_mutex_unlock(&k->lock);
    }
    if (p && !ft__bufpool_pinned(p) && ft__cuda_in_use()) {
        ft__bufpool_destroy(p);
        p = NULL;
    }
    if (!p && ft__bufpool_create_pinned(&p, BATCH_ROOM, FT__FST_BUFFERS) < 0)
        p = NULL;
    return p;
}

static void rooms_give(ft_ctx *ctx, ft__bufpool *p)
{
    kept_rooms *k = p ? ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms) : NULL;
    if (k) {
        pthread_mutex_lock(&k->lock);
        if (!k->pool) {
            k->pool = p;
            p = NULL;
        }
        pthread_mutex_unlock(&k->lock);
    }
    ft__bufpool_destroy(p);
}

/* A pool of one buffer of at least @p size bytes for a batch larger than BATCH_ROOM: the
 * smallest of the context's kept ones that is large enough, else a new one. */
static ft__bufpool *big_take(ft_ctx *ctx, uint64_t size)
{
    kept_rooms *k = ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms);
    ft__bufpool *p = NULL;
    if (k) {
        pthread_mutex_lock(&k->lock);
        unsigned best = FT__FST_BUFFERS;
        for (unsigned i = 0; i < FT__FST_BUFFERS; i++)
            if (k->big[i] && ft__bufpool_size(k->big[i]) >= size &&
                (best == FT__FST_BUFFERS ||
                 ft__bufpool_size(k->big[i]) < ft__bufpool_size(k->big[best])))
                best = i;
        if (best < FT__FST_BUFFERS) {
            p = k->big[best];
            k->big[best] = NULL;
        }
        pthread_mutex_unlock(&k->lock);
    }
    if (p && !ft__bufpool_pinned(p) && ft__cuda_in_use()) {
        ft__bufpool_destroy(p);
        p = NULL;
    }
    if (!p && ft__bufpool_create_pinned(&p, (size_t)page_up(size), 1) < 0)
        p = NULL;
    return p;
}

/* Pool @p p of big_take back to the context (in an empty place, or the smallest's where it is
 * smaller; pools of more than BIG_KEPT bytes are not kept). */
static void big_give(ft_ctx *ctx, ft__bufpool *p)
{
    kept_rooms *k = p && ft__bufpool_size(p) <= BIG_KEPT
                        ? ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms) : NULL;
    if (k) {
        pthread_mutex_lock(&k->lock);
        unsigned at = 0; /* an empty place, else the smallest */
        for (unsigned i = 0; i < FT__FST_BUFFERS; i++) {
            if (!k->big[i]) {
                at = i;
                break;
            }
            if (ft__bufpool_size(k->big[i]) < ft__bufpool_size(k->big[at]))
                at = i;
        }
        if (!k->big[at] || ft__bufpool_size(k->big[at]) < ft__bufpool_size(p)) {
            ft__bufpool *old = k->big[at];
            k->big[at] = p;
            p = old;
        }
        pthread_mutex_unlock(&k->lock);
    }
    ft__bufpool_destroy(p);
}

/* Which float sizes this save codes, for tensors in host memory and in GPU memory (coded by
 * their GPU where it codes them, at its measured rate). */
static void decide(ft__fst_coder *c, const ft_tensor *t, size_t n, ft_compression mode,
                   const char *dir)
{
    for (size_t i = 0; i < n; i++) {
        unsigned e = ft__dtype_coded(t[i].dtype);
        bool on_dev = t[i].data.kind == FT_MEM_CUDA;
        bool *code = on_dev ? c->code_dev : c->code;
        if (!e || code[e] || mode == FT_COMPRESS_NONE)
            continue;
        ft_fst_cost cost;
        double gpu;
        if (mode == FT_COMPRESS_ALWAYS) {
            code[e] = true;
        } else if (ft_fst_measure(c->ctx, dir, e, &cost) == 0) {
            if (on_dev && ft__fst_gpu_codes(c->ctx, t[i].data.device, e, &gpu))
                cost.encode = gpu;
            code[e] = ft_fst_coding_pays(&cost);
        }
        /* a directory where O_DIRECT cannot be used (tmpfs): stored */
    }
}

int ft__fst_coder_init(ft__fst_coder *c, ft_ctx *ctx, const char *path, const char *dir,
                       const ft_tensor *t, size_t n, ft_compression mode)
{
    *c = (ft__fst_coder){.ctx = ctx, .path = path};
    decide(c, t, n, mode, dir);
    if (!(c->rooms = rooms_take(ctx)))
        return ft__err(-ENOMEM, "%s: %u buffers of %llu bytes", path, FT__FST_BUFFERS,
                       (unsigned long long)BATCH_ROOM);
    return 0;
}

void ft__fst_coder_done(ft__fst_coder *c)
{
    rooms_give(c->ctx, c->rooms);
    c->rooms = NULL;
}

/* The batch's tensors that their GPU codes, coded there in one call per GPU (the coded bytes
 * copied into their buffers); where a call fails (its memory is full: the encoder takes about
 * as much as the batch's bytes), each is tried alone, and encode_one codes the rest on the
 * host. */
static void code_on_gpus(ft__fst_coder *c, ft__fst_batch *b)
{
    ft_codec_enc_job *jobs = calloc(b->n + 1, sizeof *jobs);
    size_t *which = calloc(b->n + 1, sizeof *which);
    for (size_t first = 0; jobs && which && first < b->n; first++) {
        int dev = b->items[first].t->data.device;
        size_t n = 0;
        /* the tensors of the first device not yet seen, from here on */
        for (size_t i = first; i < b->n; i++) {
            ft__fst_stream *y = &b->items[i];
            const ft_tensor *t = y->t;
            if (y->gpu != FT__GPU_NOT || t->data.kind != FT_MEM_CUDA || t->data.device != dev ||
                !y->want || !ft__fst_gpu_codes(c->ctx, dev, y->elem, NULL))
                continue;
            jobs[n] = (ft_codec_enc_job){t->data.ptr, t->data.len, y->elem, ft__fst_block(y->elem),
                                         y->buf, y->cap, 0};
            which[n++] = i;
            y->gpu = FT__GPU_FAILED; /* until coded */
        }
        if (!n)
            continue;
        pthread_mutex_t *one = ft__fst_gpu_lock(c->ctx, dev);
        pthread_mutex_lock(one);
        int64_t r = ft_codec_encode_cuda_batch(c->ctx, jobs, n, dev, NULL);
        /* where the batch fails, each alone: one tensor's failure leaves the others coded */
        for (size_t j = 0; r < 0 && n > 1 && j < n; j++)
            jobs[j].size = ft_codec_encode_cuda_batch(c->ctx, &jobs[j], 1, dev, NULL) < 0
                               ? -1 : jobs[j].size;
        pthread_mutex_unlock(one);
        for (size_t j = 0; (r >= 0 || n > 1) && j < n; j++) {
            ft__fst_stream *y = &b->items[which[j]];
            if (jobs[j].size < 0)
                continue; /* (FT__GPU_FAILED: coded on the host) */
            y->size = (uint64_t)jobs[j].size;
            y->gpu = saves_enough(jobs[j].size, y->t->data.len) ? FT__GPU_CODED
                                                                 : FT__GPU_TOO_LITTLE;
        }
    }
    free(jobs);
    free(which);
}

static int64_t encode_one(void *arg, unsigned i)
{
    void **a = arg;
    ft__fst_coder *c = a[0];
    ft__fst_stream *x = &((ft__fst_batch *)a[1])->items[i];
    const ft_tensor *t = x->t;
    bool compress = x->want && x->gpu != FT__GPU_TOO_LITTLE;
    unsigned e = compress ? x->elem : 1;
    uint64_t n = t->data.len;
    const void *src = t->data.ptr;
    void *host = NULL;
    int64_t m = 0;
    if (x->gpu == FT__GPU_CODED) {
        m = (int64_t)x->size;
    } else {
        /* coded or stored from a host copy (an empty tensor has none, nor an address) */
        if (t->data.kind == FT_MEM_CUDA && n) {
            if (!(host = malloc((size_t)n)))
                m = ft__err(-ENOMEM, "tensor '%s': %llu bytes", t->name, (unsigned long long)n);
            else if ((m = ft_cuda_copy(host, src, (size_t)n)) == 0)
                src = host;
        }
        if (m == 0) {
            m = ft_codec_encode(c->ctx, src, n, e, ft__fst_block(e), compress ? 0 : FT_CODEC_STORE,
                                x->buf, x->cap);
            if (m >= 0 && compress && !saves_enough(m, n)) {
                m = ft_codec_encode(c->ctx, src, n, 1, ft__fst_block(1), FT_CODEC_STORE, x->buf,
                                    x->cap);
                compress = false;
            }
        }
    }
    free(host);
    if (m < 0) {
        ft__first_err_note(a[2], i, (int)m);
        return m;
    }
    x->size = (uint64_t)m;
    x->compressed = compress && (uint64_t)m < n;
    memset(x->buf + m, 0, page_up((uint64_t)m) - (uint64_t)m); /* to the next page: zeros */
    return m;
}

int ft__fst_batch_code(ft__fst_coder *c, ft__fst_batch *b, const ft_tensor *t, size_t n,
                       uint64_t room)
{
    *b = (ft__fst_batch){.n = n, .items = calloc(n + 1, sizeof *b->items)};
    if (room > BATCH_ROOM) {
        if ((b->own = big_take(c->ctx, room)))
            b->room = ft__bufpool_get(b->own);
    } else {
        b->room = ft__bufpool_get(c->rooms);
    }
    if (!b->items || !b->room)
        return ft__err(-ENOMEM, "%s: a batch of %llu bytes", c->path, (unsigned long long)room);
    for (size_t j = 0, off = 0; j < n; j++) {
        b->items[j] = coding(c, &t[j]);
        b->items[j].buf = b->room + off;
        off += b->items[j].cap;
    }
    int64_t *results = calloc(n + 1, sizeof *results);
    ft__first_err failed;
    void *arg[3] = {c, b, &failed};
    ft__first_err_init(&failed);
    code_on_gpus(c, b);
    int rc = results ? ft__pool_run(c->ctx->pool, (unsigned)n, encode_one, arg, results)
                     : ft__err(-ENOMEM, "%s: batch", c->path);
    int first = ft__first_err_take(&failed);
    free(results);
    return rc < 0 ? rc : first;
}

void ft__fst_batch_free(ft__fst_coder *c, ft__fst_batch *b)
{
    if (b->own) {
        ft__bufpool_put(b->own, b->room);
        big_give(c->ctx, b->own);
    } else if (b->room) {
        ft__bufpool_put(c->rooms, b->room);
    }
    free(b->items);
    *b = (ft__fst_batch){0};
}

/* ---- streams coded ahead of their save ---- */

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
    return place(arg, page_up(cap));
}

static void fit_room(void *arg, void *dst, uint64_t cap, uint64_t size)
{
    ft_fst_coded *c = arg;
    for (size_t i = 0; i < c->npieces; i++)
        if ((uint8_t *)dst >= c->pieces[i].mem &&
            (uint8_t *)dst < c->pieces[i].mem + c->pieces[i].size)
            c->pieces[i].used -= page_up(cap) - page_up(size);
}

/* The record of stream @p size at @p buf for tensor @p t, zeros after it to its page's end. */
static void keep_stream(kept_stream *s, const ft_tensor *t, uint8_t *buf, uint64_t size,
                        bool compressed)
{
    *s = (kept_stream){.dtype = t->dtype, .ndim = t->ndim, .nbytes = t->data.len, .buf = buf,
                       .size = size, .compressed = compressed};
    if (t->ndim)
        memcpy(s->shape, t->shape, t->ndim * sizeof *s->shape);
    memset(buf + size, 0, page_up(size) - size);
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
            ft__fst_stream y = coding(coder, &t[i]);
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
            if ((done[i] = saves_enough(jobs[j].size, t[i].data.len))) /* (as encode_one) */
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
        ntasks += (size_t)((page_up(b->items[j].size) + COPY_TASK - 1) / COPY_TASK);
    copy_task *tasks = calloc(ntasks + 1, sizeof *tasks);
    int64_t *results = calloc(ntasks + 1, sizeof *results);
    int rc = tasks && results ? 0 : -ENOMEM;
    size_t k = 0;
    for (size_t j = 0; rc == 0 && j < b->n; j++) {
        const ft__fst_stream *x = &b->items[j];
        uint64_t len = page_up(x->size);
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
                                  .cap = page_up(s->size), .compressed = s->compressed};
    }
    return 0;
}
