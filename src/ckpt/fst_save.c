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
 * one alone takes more (a batch is coded while the one before is written) */
#define BATCH_TENSORS 16u
#define BATCH_ROOM (64ull << 20)
/* the two batches' buffers a context keeps for its next saves: up to this many bytes each */
#define KEEP_ROOM (512ull << 20)
/* streams go out in pieces of at most this many bytes, this many at once, made durable every
 * SYNC_STEP bytes while the next batch is coded */
#define PIECE (16u << 20)
#define WRITES 4u
#define SYNC_STEP (64ull << 20)

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

typedef struct batch {
    coded *items;
    size_t n;
    uint8_t *room; /* the streams' buffer, from the save's pool */
} batch;

typedef struct writer {
    ft_ctx *ctx;
    ft__first_err failed; /* the writes' first failure, with its detail */
    ft_file *f;
    const char *path;
    const ft_save_opts *opts;
    ft__bufpool *rooms; /* the batches' buffers */
    bool code[9];     /* by element size: code floats of that size */
    bool code_dev[9]; /* the same for tensors in GPU memory (their GPU may code them) */
    uint64_t unsynced;
    /* the writer thread's batch and result */
    batch *writing;
    int rc;
    char detail[FT__DETAIL_MAX];
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

/* The end of the batch of tensors from @p first; the room its streams take in *room. */
static size_t batch_end(const writer *w, const ft_tensor *t, size_t n, size_t first,
                        uint64_t *room)
{
    size_t i = first;
    *room = 0;
    for (; i < n && i - first < BATCH_TENSORS; i++) {
        unsigned e;
        uint32_t block;
        size_t cap;
        coding(w, &t[i], &e, &block, &cap);
        if (i > first && *room + cap > BATCH_ROOM)
            break;
        *room += cap;
    }
    return i;
}

/* The save's pool of two batch buffers of @p room bytes (pinned where the process has
 * initialised CUDA: the GPU encoder copies coded bytes into them at DMA speed): the one the
 * context keeps where it is large enough, else a new one (kept after the save where no other
 * save took the context's meanwhile). Kept, they spare a training job's saves the first
 * touch of fresh memory: stored streams on the development VM ran at 0.76x of a plain save's
 * rate in fresh 4 KiB pages per tensor, 0.89x in kept buffers of huge pages (0.6x the first
 * time). */
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

static ft__bufpool *rooms_take(ft_ctx *ctx, uint64_t room)
{
    kept_rooms *k = ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms);
    ft__bufpool *p = NULL;
    if (k) {
        pthread_mutex_lock(&k->lock);
        p = k->pool;
        k->pool = NULL;
        pthread_mutex_unlock(&k->lock);
    }
    if (p && (ft__bufpool_size(p) < room || (!ft__bufpool_pinned(p) && ft__cuda_in_use()))) {
        ft__bufpool_destroy(p);
        p = NULL;
    }
    room = (room + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1); /* whole huge pages */
    if (!p && ft__bufpool_create_pinned(&p, (size_t)room, 2) < 0)
        p = NULL;
    return p;
}

static void rooms_give(ft_ctx *ctx, ft__bufpool *p)
{
    kept_rooms *k = p && ft__bufpool_size(p) <= KEEP_ROOM
                        ? ft__ctx_ext(ctx, &rooms_key, make_rooms, destroy_rooms)
                        : NULL;
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
 * copied into their buffers); where a call fails (its memory is full: the encoder takes
 * about 140 MiB), encode_one codes them on the host. */
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

typedef struct piece {
    writer *w;
    const coded *x;
    uint64_t from;
} piece;

static int64_t write_piece(void *arg, unsigned i)
{
    piece *p = &((piece *)arg)[i];
    uint64_t room = page_up(p->x->size), len = FT__MIN((uint64_t)PIECE, room - p->from);
    ft_buf b = ft_host_buf(p->x->buf + p->from, (size_t)len);
    ft_io_opts o = ft__save_io(p->w->opts);
    int64_t r = ft__transfer(p->w->f, &b, FT__FST_DATA + p->x->at + p->from, &o, true);
    if (r >= 0 && (uint64_t)r != len)
        r = ft__err(-EIO, "%s: a short write", p->w->path);
    if (r < 0)
        ft__first_err_note(&p->w->failed, i, (int)r);
    return r;
}

/* Write a batch's streams, WRITES pieces at a time, then make them durable every SYNC_STEP
 * bytes. */
static int write_batch(writer *w, const batch *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n; i++)
        n += (size_t)((page_up(b->items[i].size) + PIECE - 1) / PIECE);
    piece *ps = calloc(n + 1, sizeof *ps);
    int64_t *results = calloc(n + 1, sizeof *results);
    int rc = ps && results ? 0 : ft__err(-ENOMEM, "%s: pieces", w->path);
    size_t k = 0;
    for (size_t i = 0; rc == 0 && i < b->n; i++)
        for (uint64_t from = 0; from < page_up(b->items[i].size); from += PIECE)
            ps[k++] = (piece){.w = w, .x = &b->items[i], .from = from};
    for (size_t at = 0; rc == 0 && at < n; at += WRITES) {
        unsigned m = (unsigned)FT__MIN((size_t)WRITES, n - at);
        ft__first_err_init(&w->failed);
        rc = ft__pool_run(w->ctx->pool, m, write_piece, ps + at, results + at);
        int first = ft__first_err_take(&w->failed);
        rc = rc < 0 ? rc : first;
        for (unsigned j = 0; rc == 0 && j < m; j++) {
            rc = results[at + j] < 0 ? (int)results[at + j] : 0;
            w->unsynced += (uint64_t)results[at + j];
        }
    }
    if (rc == 0 && w->unsynced >= SYNC_STEP && !(w->opts && (w->opts->flags & FT_SAVE_NO_SYNC))) {
        w->unsynced = 0;
        rc = ft_file_sync(w->f);
    }
    free(ps);
    free(results);
    return rc;
}

static void *writer_thread(void *arg)
{
    writer *w = arg;
    w->rc = write_batch(w, w->writing);
    if (w->rc < 0)
        ft__detail_save(w->detail);
    return NULL;
}

static void free_batch(writer *w, batch *b)
{
    ft__bufpool_put(w->rooms, b->room);
    free(b->items);
    *b = (batch){0};
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
    uint64_t most = PAGE, room;
    for (size_t i = 0; i < n; most = FT__MAX(most, room))
        i = batch_end(&w, t, n, i, &room);
    if (rc == 0 && !(w.rooms = rooms_take(ctx, most)))
        rc = ft__err(-ENOMEM, "%s: two buffers of %llu bytes", path, (unsigned long long)most);
    batch b[2] = {{0}, {0}};
    pthread_t thread;
    bool running = false;
    uint64_t at = 0;
    for (size_t i = 0, k = 0; rc == 0 && i < n; k ^= 1) {
        batch *cur = &b[k];
        size_t first = i;
        i = batch_end(&w, t, n, first, &room);
        cur->n = i - first;
        cur->items = calloc(cur->n, sizeof *cur->items);
        cur->room = ft__bufpool_get(w.rooms);
        if (!cur->items || !cur->room) {
            rc = ft__err(-ENOMEM, "%s: batch", path);
            break;
        }
        for (size_t j = 0, off = 0; j < cur->n; j++) {
            unsigned e;
            uint32_t block;
            size_t cap;
            coding(&w, &t[first + j], &e, &block, &cap);
            cur->items[j] = (coded){.t = &t[first + j], .buf = cur->room + off};
            off += cap;
        }
        int64_t *results = calloc(cur->n, sizeof *results);
        ft__first_err coding; /* (the writer thread's tasks note theirs in w.failed) */
        void *arg[3] = {&w, cur, &coding};
        ft__first_err_init(&coding);
        code_on_gpus(&w, cur);
        rc = results ? ft__pool_run(ctx->pool, (unsigned)cur->n, encode_one, arg, results)
                     : ft__err(-ENOMEM, "%s: batch", path);
        int failed = ft__first_err_take(&coding);
        rc = rc < 0 ? rc : failed;
        free(results);
        if (running) { /* the batch before has been written meanwhile */
            pthread_join(thread, NULL);
            running = false;
            free_batch(&w, &b[k ^ 1]);
            if (rc == 0 && w.rc < 0) {
                rc = w.rc;
                ft__detail_restore(w.detail);
            }
        }
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
        if (rc < 0)
            break;
        w.writing = cur;
        if (pthread_create(&thread, NULL, writer_thread, &w) == 0) {
            running = true;
        } else if ((rc = write_batch(&w, cur)) == 0) {
            free_batch(&w, cur);
        }
    }
    if (running) {
        pthread_join(thread, NULL);
        if (rc == 0 && w.rc < 0) {
            rc = w.rc;
            ft__detail_restore(w.detail);
        }
    }
    free_batch(&w, &b[0]);
    free_batch(&w, &b[1]);
    rooms_give(ctx, w.rooms);
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
        for (int k = 0; k < 8; k++) {
            head[8 + k] = (uint8_t)(hoff >> (8 * k));
            head[16 + k] = (uint8_t)((uint64_t)jlen >> (8 * k));
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
