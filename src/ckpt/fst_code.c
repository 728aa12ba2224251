/*
 * A .fst save's coding: its tensors coded in batches (fst_save.c writes each batch while the
 * next is coded), each float tensor by its GPU where that GPU codes them (fst_cost.c
 * measures), else on the host, a stream that saves too little stored instead. (fst_ahead.c
 * codes a save's tensors ahead of it, partly through these batches.)
 */
#include "ckpt.h"
#include "../codec/codec.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* a kept stream saves at least this share of the tensor's bytes */
#define MIN_SAVING 0.05
/* tensors coded at once: up to this many, their streams' room up to this many bytes unless
 * one alone takes more (the first batches less: the disk starts sooner) */
#define BATCH_TENSORS 64u
#define BATCH_ROOM (64ull << 20)
#define FIRST_ROOM (16ull << 20)

bool ft__fst_saves_enough(int64_t m, uint64_t n)
{
    return (double)m <= (1 - MIN_SAVING) * (double)n + 64;
}

/* (the room: a coded stream's bound, or a stored one's where coding saves too little) */
ft__fst_stream ft__fst_coding(const ft__fst_coder *c, const ft_tensor *t)
{
    unsigned el = ft__dtype_coded(t->dtype);
    bool want = el && (t->data.kind == FT_MEM_CUDA ? c->code_dev[el] : c->code[el]);
    unsigned e = want ? el : 1;
    size_t cap = ft__fst_page_up(FT__MAX(ft_codec_bound(t->data.len, e, ft__fst_block(e)),
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
        size_t cap = ft__fst_coding(c, &t[i]).cap;
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

/* Kept pool @p p, or NULL (destroyed) where it was made unpinned before CUDA was in use and
 * now it is (the GPU encoder would copy into it at pageable speed). */
static ft__bufpool *still_usable(ft__bufpool *p)
{
    if (p && !ft__bufpool_pinned(p) && ft__cuda_in_use()) {
        ft__bufpool_destroy(p);
        return NULL;
    }
    return p;
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
    if (!(p = still_usable(p)) && ft__bufpool_create_pinned(&p, BATCH_ROOM, FT__FST_BUFFERS) < 0)
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
    if (!(p = still_usable(p)) &&
        ft__bufpool_create_pinned(&p, (size_t)ft__fst_page_up(size), 1) < 0)
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
            y->gpu = ft__fst_saves_enough(jobs[j].size, y->t->data.len) ? FT__GPU_CODED
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
            if (m >= 0 && compress && !ft__fst_saves_enough(m, n)) {
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
    memset(x->buf + m, 0, ft__fst_page_up((uint64_t)m) - (uint64_t)m); /* to the next page: zeros */
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
        b->items[j] = ft__fst_coding(c, &t[j]);
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
