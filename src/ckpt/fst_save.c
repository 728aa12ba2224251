/*
 * .fst containers, written (the layout is fst.c's): each tensor coded (ft_codec_encode; a
 * float type's byte planes, Huffman-coded where that pays) or stored, its stream placed at a
 * page boundary of the file and written in pieces, several at once, through the file API
 * while the next tensors are coded; the header last. save.c installs the file as it installs
 * a safetensors file (a locked temporary, fdatasync, rename, directory fsync).
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

#define PAGE 4096u
/* a kept stream saves at least this share of the tensor's bytes */
#define MIN_SAVING 0.05
/* tensors coded at once: up to this many, their streams' room up to this many bytes unless
 * one alone takes more (the first batches less: the disk starts sooner); a batch is coded
 * while the BUFFERS - 1 before it are written */
#define BATCH_TENSORS 64u
#define BATCH_ROOM (64ull << 20)
#define FIRST_ROOM (16ull << 20)
#define BUFFERS 3u
/* streams go out in pieces of at most this many bytes, each a task of the context's pool
 * (as many at once as it has threads), the batches' writes one after another without a
 * pause between them; the file is made durable once, by the save (save.c) */
#define PIECE (16u << 20)

bool ft__fst_path(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".fst") == 0;
}

static uint64_t page_up(uint64_t n)
{
    return (n + PAGE - 1) / PAGE * PAGE;
}

/* ---- the writer ---- */

/* What a batch's GPU pass (code_on_gpus) left for a tensor. */
enum { GPU_NOT, GPU_CODED, GPU_TOO_LITTLE, GPU_FAILED };

typedef struct coded {
    const ft_tensor *t;
    uint8_t *buf;     /* page-aligned, a whole number of pages, in its batch's buffer */
    uint64_t size;    /* the stream's bytes */
    bool compressed;
    int gpu;          /* GPU_* */
    uint64_t at;      /* where it goes in the data section */
} coded;

typedef struct piece piece;

typedef struct batch {
    coded *items;
    size_t n;
    uint8_t *room;     /* the streams' buffer: from the save's pool, or own's (a larger one) */
    ft__bufpool *own;
    /* its writes in flight: pieces, how many are not done, their first failure */
    piece *pieces;
    unsigned left;
    ft__first_err failed;
    bool writing;
} batch;

typedef struct writer {
    ft_ctx *ctx;
    ft_file *f;
    const char *path;
    const ft_save_opts *opts;
    ft__bufpool *rooms; /* the batches' buffers */
    bool code[9];     /* by element size: code floats of that size */
    bool code_dev[9]; /* the same for tensors in GPU memory (their GPU may code them) */
    pthread_mutex_t lock; /* batches' left */
    pthread_cond_t done;  /* a batch's writes done */
} writer;

/* Whether a stream of @p m bytes of a tensor of @p n is worth keeping coded. */
static bool saves_enough(int64_t m, uint64_t n)
{
    return (double)m <= (1 - MIN_SAVING) * (double)n + 64;
}

/* Tensor @p t's codec parameters: its element size as coded (1: stored), its block, and the
 * room its stream takes (a whole number of pages). @return whether it is coded. */
static bool coding(const writer *w, const ft_tensor *t, unsigned *e, uint32_t *block,
                   size_t *cap)
{
    unsigned el = ft__dtype_coded(t->dtype);
    bool compress = el && (t->data.kind == FT_MEM_CUDA ? w->code_dev[el] : w->code[el]);
    *e = compress ? el : 1;
    *block = ft__fst_block(*e);
    *cap = page_up(FT__MAX(ft_codec_bound(t->data.len, *e, *block),
                           ft_codec_bound(t->data.len, 1, ft__fst_block(1))));
    return compress;
}

/* The end of batch @p k, of the tensors from @p first; the room its streams take in *room. */
static size_t batch_end(const writer *w, const ft_tensor *t, size_t n, size_t first,
                        unsigned k, uint64_t *room)
{
    size_t i = first;
    uint64_t most = FT__MIN(BATCH_ROOM, FIRST_ROOM << FT__MIN(k, 8u));
    *room = 0;
    for (; i < n && i - first < BATCH_TENSORS; i++) {
        unsigned e;
        uint32_t block;
        size_t cap;
        coding(w, &t[i], &e, &block, &cap);
        if (i > first && *room + cap > most)
            break;
        *room += cap;
    }
    return i;
}

/* The save's pool of BUFFERS batch buffers of BATCH_ROOM bytes (pinned where the process
 * has initialised CUDA: the GPU encoder copies coded bytes into them at DMA speed): the one
 * the context keeps, else a new one (kept after the save where no other save took the
 * context's meanwhile). Kept, they spare a training job's saves the first touch of fresh
 * memory: stored streams on the development VM ran at 0.76x of a plain save's rate in fresh
 * 4 KiB pages per tensor, 0.89x in kept buffers of huge pages (0.6x the first time). */
typedef struct kept_rooms {
    pthread_mutex_t lock;
    ft__bufpool *pool;
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
    if (!p && ft__bufpool_create_pinned(&p, BATCH_ROOM, BUFFERS) < 0)
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

/* The batch's tensors that their GPU codes, coded there in one call per GPU (the coded bytes
 * copied into their buffers); where a call fails (its memory is full: the encoder takes about
 * as much as the batch's bytes), each is tried alone, and encode_one codes the rest on the
 * host. */
static void code_on_gpus(writer *w, batch *b)
{
    ft_codec_enc_job *jobs = calloc(b->n + 1, sizeof *jobs);
    size_t *which = calloc(b->n + 1, sizeof *which);
    for (size_t first = 0; jobs && which && first < b->n; first++) {
        coded *x = &b->items[first];
        int dev = x->t->data.device;
        size_t n = 0;
        unsigned e;
        uint32_t block;
        size_t cap;
        /* the tensors of the first device not yet seen, from here on */
        for (size_t i = first; i < b->n; i++) {
            coded *y = &b->items[i];
            if (y->gpu != GPU_NOT || y->t->data.kind != FT_MEM_CUDA || y->t->data.device != dev ||
                !coding(w, y->t, &e, &block, &cap) || !ft__fst_gpu_codes(w->ctx, dev, e, NULL))
                continue;
            jobs[n] = (ft_codec_enc_job){y->t->data.ptr, y->t->data.len, e, block, y->buf, cap, 0};
            which[n++] = i;
            y->gpu = GPU_FAILED; /* until coded */
        }
        if (!n)
            continue;
        pthread_mutex_t *one = ft__fst_gpu_lock(w->ctx, dev);
        pthread_mutex_lock(one);
        int64_t r = ft_codec_encode_cuda_batch(w->ctx, jobs, n, dev, NULL);
        /* where the batch fails, each alone: one tensor's failure leaves the others coded */
        for (size_t j = 0; r < 0 && n > 1 && j < n; j++)
            jobs[j].size = ft_codec_encode_cuda_batch(w->ctx, &jobs[j], 1, dev, NULL) < 0
                               ? -1 : jobs[j].size;
        pthread_mutex_unlock(one);
        for (size_t j = 0; (r >= 0 || n > 1) && j < n; j++) {
            coded *y = &b->items[which[j]];
            if (jobs[j].size < 0)
                continue; /* (GPU_FAILED: coded on the host) */
            y->size = (uint64_t)jobs[j].size;
            y->gpu = saves_enough(jobs[j].size, y->t->data.len) ? GPU_CODED : GPU_TOO_LITTLE;
        }
    }
    free(jobs);
    free(which);
}

static int64_t encode_one(void *arg, unsigned i)
{
    void **a = arg;
    writer *w = a[0];
    coded *x = &((batch *)a[1])->items[i];
    const ft_tensor *t = x->t;
    unsigned e;
    uint32_t block;
    size_t cap;
    bool compress = coding(w, t, &e, &block, &cap) && x->gpu != GPU_TOO_LITTLE;
    uint64_t n = t->data.len;
    const void *src = t->data.ptr;
    void *host = NULL;
    int64_t m = 0;
    if (x->gpu == GPU_CODED) {
        m = (int64_t)x->size;
    } else {
        if (x->gpu == GPU_TOO_LITTLE) { /* (a stream that saves too little: stored) */
            e = 1;
            block = ft__fst_block(1);
        }
        /* coded or stored from a host copy (an empty tensor has none, nor an address) */
        if (m == 0 && t->data.kind == FT_MEM_CUDA && n) {
            if (!(host = malloc(n ? (size_t)n : 1)))
                m = ft__err(-ENOMEM, "tensor '%s': %llu bytes", t->name, (unsigned long long)n);
            else if ((m = ft_cuda_copy(host, src, (size_t)n)) == 0)
                src = host;
        }
        if (m == 0) {
            m = ft_codec_encode(w->ctx, src, n, e, block, compress ? 0 : FT_CODEC_STORE, x->buf,
                                cap);
            if (m >= 0 && compress && !saves_enough(m, n)) {
                m = ft_codec_encode(w->ctx, src, n, 1, ft__fst_block(1), FT_CODEC_STORE, x->buf,
                                    cap);
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

struct piece {
    writer *w;
    batch *b;
    const coded *x;
    uint64_t from;
    unsigned index; /* in its batch */
};

/* Write piece @p arg (a task of the context's pool, or run here); its batch told when done. */
static void write_piece(void *arg)
{
    piece *p = arg;
    uint64_t room = page_up(p->x->size), len = FT__MIN((uint64_t)PIECE, room - p->from);
    ft_buf buf = ft_host_buf(p->x->buf + p->from, (size_t)len);
    ft_io_opts o = ft__save_io(p->w->opts);
    int64_t r = ft__transfer(p->w->f, &buf, FT__FST_DATA + p->x->at + p->from, &o, true);
    if (r >= 0 && (uint64_t)r != len)
        r = ft__err(-EIO, "%s: a short write", p->w->path);
    if (r < 0)
        ft__first_err_note(&p->b->failed, p->index, (int)r);
    pthread_mutex_lock(&p->w->lock);
    if (--p->b->left == 0)
        pthread_cond_broadcast(&p->w->done);
    pthread_mutex_unlock(&p->w->lock);
}

/* Start writing batch @p b's streams: a pool task per piece, so that the writes of the next
 * batches queue behind them and the disk never waits for a batch's last piece. (The save
 * waits for them on its caller's thread, never on a worker of that pool: a .fst container
 * is one shard, which save.c writes there.) */
static int write_start(writer *w, batch *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n; i++)
        n += (size_t)((page_up(b->items[i].size) + PIECE - 1) / PIECE);
    if (!(b->pieces = calloc(n + 1, sizeof *b->pieces)))
        return ft__err(-ENOMEM, "%s: pieces", w->path);
    ft__first_err_init(&b->failed);
    b->writing = true;
    b->left = (unsigned)n;
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++)
        for (uint64_t from = 0; from < page_up(b->items[i].size); from += PIECE, k++)
            b->pieces[k] = (piece){.w = w, .b = b, .x = &b->items[i], .from = from,
                                   .index = (unsigned)k};
    bool pooled = ft__pool_workers(w->ctx->pool) > 0;
    for (k = 0; k < n; k++)
        if (!pooled || ft__pool_post(w->ctx->pool, write_piece, &b->pieces[k]) < 0)
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
    if (b->own) {
        ft__bufpool_put(b->own, b->room);
        ft__bufpool_destroy(b->own);
    } else {
        ft__bufpool_put(w->rooms, b->room);
    }
    free(b->items);
    *b = (batch){0};
    return rc;
}

/* Batch @p b: tensors @p t (@p n), their places in its buffer (BATCH_ROOM from the pool, or
 * @p room of its own where a lone tensor takes more). */
static int batch_make(writer *w, batch *b, const ft_tensor *t, size_t n, uint64_t room)
{
    b->n = n;
    b->items = calloc(n + 1, sizeof *b->items);
    if (room > BATCH_ROOM) {
        if (ft__bufpool_create(&b->own, (size_t)room, 1) == 0)
            b->room = ft__bufpool_get(b->own);
    } else {
        b->room = ft__bufpool_get(w->rooms);
    }
    if (!b->items || !b->room)
        return ft__err(-ENOMEM, "%s: a batch of %llu bytes", w->path, (unsigned long long)room);
    for (size_t j = 0, off = 0; j < n; j++) {
        unsigned e;
        uint32_t block;
        size_t cap;
        coding(w, &t[j], &e, &block, &cap);
        b->items[j] = (coded){.t = &t[j], .buf = b->room + off};
        off += cap;
    }
    return 0;
}

static void member(ft__jw *j, const char *key)
{
    ft__jw_str(j, key, strlen(key));
    ft__jw_raw(j, ":");
}

/* The header: metadata, the container's version and codec, each tensor's entry. */
static char *header_json(const ft_tensor *t, size_t n, const coded *all,
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

/* Which float sizes this save codes, for tensors in host memory and in GPU memory (coded by
 * their GPU where it codes them, at its measured rate). */
static void decide(writer *w, const ft_tensor *t, size_t n, ft_compression mode,
                   const char *dir)
{
    for (size_t i = 0; i < n; i++) {
        unsigned e = ft__dtype_coded(t[i].dtype);
        bool on_dev = t[i].data.kind == FT_MEM_CUDA;
        bool *code = on_dev ? w->code_dev : w->code;
        if (!e || code[e] || mode == FT_COMPRESS_NONE)
            continue;
        ft_fst_cost c;
        double gpu;
        if (mode == FT_COMPRESS_ALWAYS) {
            code[e] = true;
        } else if (ft_fst_measure(w->ctx, dir, e, &c) == 0) {
            if (on_dev && ft__fst_gpu_codes(w->ctx, t[i].data.device, e, &gpu))
                c.encode = gpu;
            code[e] = ft_fst_coding_pays(&c);
        }
        /* a directory where O_DIRECT cannot be used (tmpfs): stored */
    }
}

int ft__fst_write(ft_ctx *ctx, ft_file *f, const char *path, const char *dir,
                  const ft_tensor *t, size_t n, const ft_save_opts *opts)
{
    writer w = {.ctx = ctx, .f = f, .path = path, .opts = opts};
    decide(&w, t, n, opts ? opts->compression : FT_COMPRESS_AUTO, dir);
    coded *all = calloc(n + 1, sizeof *all);
    int rc = all ? 0 : ft__err(-ENOMEM, "%s: %zu tensors", path, n);
    if (rc == 0 && !(w.rooms = rooms_take(ctx)))
        rc = ft__err(-ENOMEM, "%s: %u buffers of %llu bytes", path, BUFFERS,
                     (unsigned long long)BATCH_ROOM);
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.done, NULL);
    batch b[BUFFERS];
    memset(b, 0, sizeof b);
    uint64_t at = 0;
    unsigned k = 0;
    /* batch k coded into the buffer of batch k - BUFFERS, once that is written */
    for (size_t i = 0; rc == 0 && i < n; k++) {
        batch *cur = &b[k % BUFFERS];
        if ((rc = write_wait(&w, cur)) < 0)
            break;
        size_t first = i;
        uint64_t room;
        i = batch_end(&w, t, n, first, k, &room);
        if ((rc = batch_make(&w, cur, &t[first], i - first, room)) < 0)
            break;
        int64_t *results = calloc(cur->n, sizeof *results);
        ft__first_err coding;
        void *arg[3] = {&w, cur, &coding};
        ft__first_err_init(&coding);
        code_on_gpus(&w, cur);
        rc = results ? ft__pool_run(ctx->pool, (unsigned)cur->n, encode_one, arg, results)
                     : ft__err(-ENOMEM, "%s: batch", path);
        int failed = ft__first_err_take(&coding);
        rc = rc < 0 ? rc : failed;
        free(results);
        for (size_t j = 0; rc == 0 && j < cur->n; j++) {
            cur->items[j].at = at;
            at += page_up(cur->items[j].size);
            all[first + j] = cur->items[j];
            all[first + j].buf = NULL;
        }
        if (rc < 0)
            break;
        /* the batch's extent reserved before its writes, as a plain save reserves its file's
         * (an early ENOSPC; writes that do not extend the file: stored streams on the
         * development VM went from 0.82x to 0.89x of a plain save's rate) */
        uint64_t from = first ? FT__FST_DATA + cur->items[0].at : 0;
        if ((rc = ft_file_allocate(f, from, FT__FST_DATA + at - from)) == -EOPNOTSUPP)
            rc = 0;
        if (rc == 0)
            rc = write_start(&w, cur);
    }
    /* every batch's writes done (the oldest first: its failure is the one reported) */
    for (unsigned j = 0; j < BUFFERS; j++) {
        batch *x = &b[(k + j) % BUFFERS];
        if (rc < 0)
            FT__KEEPING_DETAIL(write_wait(&w, x));
        else
            rc = write_wait(&w, x);
    }
    rooms_give(ctx, w.rooms);
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
        uint64_t hoff = FT__FST_DATA + at;
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
