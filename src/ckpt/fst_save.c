/*
 * .fst containers, written (the layout is fst.c's): each tensor coded (ft_codec_encode; a
 * float type's byte planes, Huffman-coded where that pays) or stored, its stream placed at a
 * page boundary of the file and written in pieces, several at once, through the file API
 * while the next tensors are coded; the header last. save.c installs the file as it installs
 * a safetensors file (a locked temporary, fdatasync, rename, directory fsync).
 *
 * Whether coding pays is measured, per machine and disk: the codec on weights of each float
 * size, a probe file written and read with O_DIRECT (ft_fst_measure).
 */
#include "ckpt.h"
#include "../base/syscall.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u
/* codec blocks (the codec's default): a block's code table, and on the GPU its warp's
 * building of it, stay a small share of the block's work */
#define BLOCK (1u << 20)

/* The codec blocks of @p elem-byte floats. The GPU decoder gives each block one warp: 4-byte
 * floats decode fastest in 512 KiB blocks, bf16 in 1 MiB ones, the ratio the same (the block
 * sweeps in docs/benchmarks/codec-h200.json and codec-h100.json). */
static uint32_t block_of(unsigned elem)
{
    return elem == 4 ? 512u << 10 : BLOCK;
}
/* a kept stream saves at least this share of the tensor's bytes */
#define MIN_SAVING 0.05
/* tensors coded at once: up to this many, and this many bytes of them (a batch is coded
 * while the one before is written) */
#define BATCH_TENSORS 16u
#define BATCH_BYTES (256ull << 20)
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

unsigned ft__fst_probe_shift;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- what coding costs and saves here (measured once per context) ---- */

#define COST_DISKS 16
#define COST_GPUS 16

typedef struct costs {
    pthread_mutex_t lock;
    struct { dev_t dev; double decode, write, read; bool set; } disk[COST_DISKS];
    unsigned ndisk;
    struct { double encode, share; bool set; } elem[9]; /* by element size 1, 2, 4, 8 */
    /* per GPU and element size: its encoder checked (1: it writes the CPU encoder's bytes
     * and faster, -1: not used, 0: not checked yet) and its rate; and one tensor coded there
     * at a time
     * (one fills the GPU; at once, each would take its ~130 MiB of device memory) */
    struct { int state[9]; double encode[9]; pthread_mutex_t coding; } gpu[COST_GPUS];
} costs;

static void *make_costs(ft_ctx *ctx)
{
    (void)ctx;
    costs *c = calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return NULL;
    }
    for (unsigned g = 0; c && g < COST_GPUS; g++)
        pthread_mutex_init(&c->gpu[g].coding, NULL); /* (default attributes: cannot fail) */
    return c;
}

static void destroy_costs(void *p)
{
    costs *c = p;
    pthread_mutex_destroy(&c->lock);
    for (unsigned g = 0; g < COST_GPUS; g++)
        pthread_mutex_destroy(&c->gpu[g].coding);
    free(c);
}

static costs *costs_of(ft_ctx *ctx)
{
    static const char key;
    return ft__ctx_ext(ctx, &key, make_costs, destroy_costs);
}

/* @p n bytes of normal(0, 0.02) weights (a layer's initialisation) of @p elem-byte floats: 8
 * fp64, 4 fp32, 2 bf16, 1 fp8 e5m2 (fp16's high byte); a million values repeated (the
 * codec's blocks are coded apart: as compressible as that many fresh ones). */
static void weights(unsigned elem, uint8_t *out, size_t n)
{
    size_t count = FT__MIN(n / elem, (size_t)1 << 20);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < count; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u1 = ((double)(x >> 11) + 1) / 9007199254740993.0;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u2 = (double)(x >> 11) / 9007199254740992.0;
        double v = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2) * 0.02;
        float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, 4);
        uint8_t *p = out + i * elem;
        if (elem == 8) {
            memcpy(p, &v, 8);
        } else if (elem == 4) {
            memcpy(p, &f, 4);
        } else if (elem == 2) {
            uint16_t h = (uint16_t)(b >> 16);
            memcpy(p, &h, 2);
        } else { /* fp16's exponent (rebiased, flushed below its range) and top mantissa */
            int e = (int)((b >> 23) & 0xff) - 127 + 15;
            p[0] = (uint8_t)((b >> 24 & 0x80) | (e <= 0 ? 0 : (uint32_t)FT__MIN(e, 30) << 2 |
                                                              (b >> 21 & 3)));
        }
    }
    for (size_t at = count * elem; at < n; at += count * elem)
        memcpy(out + at, out, FT__MIN(count * elem, n - at));
}

/* Encode GB/s and coded share of 32 MiB of @p elem-byte weights through the context's
 * threads, after a first call on a quarter of them that warms the threads and buffers; the
 * stream left in @p coded (its length in *len) for a decode. */
static int sample(ft_ctx *ctx, unsigned elem, double *encode, double *share, uint8_t **coded,
                  size_t *len)
{
    uint32_t block = block_of(elem);
    size_t n = (32u << 20) >> ft__fst_probe_shift, cap = ft_codec_bound(n, elem, block);
    uint8_t *w = malloc(n), *buf = malloc(cap);
    int64_t m = w && buf ? 0 : ft__err(-ENOMEM, "codec sample");
    if (m == 0) {
        weights(elem, w, n);
        m = ft_codec_encode(ctx, w, n / 4 / elem * elem, elem, block, 0, buf, cap);
    }
    double t0 = seconds();
    if (m >= 0)
        m = ft_codec_encode(ctx, w, n, elem, block, 0, buf, cap);
    double t = seconds() - t0;
    free(w);
    if (m < 0) {
        free(buf);
        return (int)m;
    }
    *encode = (double)n / FT__MAX(t, 1e-9) / 1e9;
    *share = (double)m / (double)n;
    *coded = buf;
    *len = (size_t)m;
    return 0;
}

/*
 * Whether GPU @p dev codes @p elem-byte floats for saves: the first time, 32 MiB of weights
 * are coded by both encoders (each after a call on a quarter of them that warms it); the GPU's
 * stream must be the very stream of the CPU's (else a kernel that misbehaves on some GPU or
 * driver would cost a checkpoint) and its rate, the copy of the coded bytes to the host
 * included, above the CPU encoder's (on the H100 machine the two ran at 2-6 GB/s, the GPU's
 * lower on small tensors: docs/benchmarks/codec-h100-gpu-encode.json). The GPU's rate in
 * *encode. Where the library has no GPU encoder (built without nvcc) or the driver cannot run
 * it: false.
 */
static bool gpu_codes(ft_ctx *ctx, int dev, unsigned elem, double *encode)
{
    costs *c = costs_of(ctx);
    if (!c || dev < 0 || dev >= COST_GPUS)
        return false;
    pthread_mutex_lock(&c->lock);
    int *state = &c->gpu[dev].state[elem];
    if (*state == 0) {
        uint32_t block = block_of(elem);
        size_t n = (32u << 20) >> ft__fst_probe_shift, cap = ft_codec_bound(n, elem, block);
        size_t quarter = n / 4 / elem * elem;
        uint8_t *w = malloc(n), *want = malloc(cap), *got = malloc(cap);
        void *d = NULL;
        int64_t a = -ENOMEM, b = -ENOMEM;
        double cpu = 0, gpu = 0;
        if (w && want && got && ft_cuda_alloc(dev, n, &d) == 0) {
            weights(elem, w, n);
            double t0 = seconds();
            if (ft_codec_encode(ctx, w, quarter, elem, block, 0, want, cap) >= 0) {
                t0 = seconds();
                a = ft_codec_encode(ctx, w, n, elem, block, 0, want, cap);
            }
            cpu = seconds() - t0;
            if (a >= 0 && ft_cuda_copy(d, w, n) == 0 &&
                ft_codec_encode_cuda(ctx, d, quarter, elem, block, got, cap, dev, NULL) >= 0) {
                t0 = seconds();
                b = ft_codec_encode_cuda(ctx, d, n, elem, block, got, cap, dev, NULL);
                gpu = seconds() - t0;
            }
        }
        bool same = a >= 0 && a == b && memcmp(want, got, (size_t)a) == 0;
        *state = same && gpu < cpu ? 1 : -1;
        c->gpu[dev].encode[elem] = (double)n / FT__MAX(gpu, 1e-9) / 1e9;
        if (d)
            ft_cuda_free(d);
        free(w);
        free(want);
        free(got);
    }
    bool ok = *state == 1;
    if (encode)
        *encode = c->gpu[dev].encode[elem];
    pthread_mutex_unlock(&c->lock);
    return ok;
}

#define PROBE_PIECES 4u

typedef struct probe {
    ft_file *f;
    uint8_t *data;
    size_t piece;
    ft__first_err failed;
} probe;

static int64_t probe_write(void *arg, unsigned i)
{
    probe *p = arg;
    ft_buf b = ft_host_buf(p->data + (size_t)i * p->piece, p->piece);
    ft_io_opts o = {.engine = FT_ENGINE_DIRECT, .flags = FT_IO_SYNC_LATER};
    int64_t r = ft_write(p->f, &b, (uint64_t)i * p->piece, &o);
    if (r < 0)
        ft__first_err_note(&p->failed, i, (int)r);
    return r;
}

/* Write and read GB/s of the disk of @p dir: 64 MiB written with O_DIRECT as a save writes
 * (pieces, several at once) and fdatasync'ed, read back with O_DIRECT (the device, not the
 * page cache), under a temporary name that ft_ckpt_gc removes where this dies. */
static int disk_rates(ft_ctx *ctx, const char *dir, double *write, double *read)
{
    const size_t n = (64u << 20) >> ft__fst_probe_shift;
    char *path = NULL;
    if (asprintf(&path, "%s/.fst-probe.fastensor-tmp-%d-0", dir, (int)getpid()) < 0)
        return ft__err(-ENOMEM, "probe");
    probe p = {.piece = n / PROBE_PIECES};
    int rc = posix_memalign((void **)&p.data, 1u << 21, n) ? ft__err(-ENOMEM, "probe") : 0;
    if (rc == 0) {
        memset(p.data, 1, n);
        rc = ft_file_open(ctx, &p.f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                FT_OPEN_TRUNC, 0600);
    }
    if (rc == 0) {
        int64_t results[PROBE_PIECES];
        ft__first_err_init(&p.failed);
        double t0 = seconds();
        rc = ft__pool_run(ctx->pool, PROBE_PIECES, probe_write, &p, results);
        int first = ft__first_err_take(&p.failed);
        rc = rc < 0 ? rc : first;
        for (unsigned i = 0; rc == 0 && i < PROBE_PIECES; i++)
            if ((size_t)results[i] != p.piece)
                rc = ft__err(-EIO, "%s: a short write", path);
        if (rc == 0)
            rc = ft_file_sync(p.f);
        double t1 = seconds();
        ft_buf b = ft_host_buf(p.data, n);
        ft_io_opts o = {.engine = FT_ENGINE_DIRECT};
        int64_t r = rc == 0 ? ft_read(p.f, &b, 0, &o) : 0;
        double t2 = seconds();
        rc = rc < 0 ? rc : r < 0 ? (int)r
                         : (size_t)r != n ? ft__err(-EIO, "%s: a short read", path) : 0;
        *write = (double)n / FT__MAX(t1 - t0, 1e-9) / 1e9;
        *read = (double)n / FT__MAX(t2 - t1, 1e-9) / 1e9;
        FT__KEEPING_DETAIL(ft_file_close(p.f));
    }
    FT__KEEPING_DETAIL(ft__sys.unlink(path));
    free(p.data);
    free(path);
    return rc;
}

static int stat_dir(const char *dir, dev_t *dev)
{
    struct stat st;
    if (ft__sys.stat(dir, &st) != 0)
        return ft__err(-errno, "cannot stat %s", dir);
    *dev = st.st_dev;
    return 0;
}

static int check_elem(unsigned elem)
{
    return elem == 1 || elem == 2 || elem == 4 || elem == 8
               ? 0 : ft__err(-EINVAL, "element size %u (1, 2, 4 or 8)", elem);
}

/* The context's costs (*out) and the device of @p dir's filesystem (*dev, where @p dir),
 * for @p who's arguments. @return 0 or -errno. */
static int costs_args(ft_ctx *ctx, const char *dir, unsigned elem, const char *who, costs **out,
                      dev_t *dev)
{
    int rc = check_elem(elem);
    *dev = 0;
    if (rc == 0 && dir)
        rc = stat_dir(dir, dev);
    if (rc == 0 && !(*out = costs_of(ctx)))
        rc = ft__err(-ENOMEM, "%s", who);
    return rc;
}

/* The slot of filesystem @p dev among @p c's (c->ndisk where none is kept; with @p add, a
 * new one while there is room). */
static unsigned disk_slot(costs *c, dev_t dev, bool add)
{
    unsigned d = 0;
    while (d < c->ndisk && c->disk[d].dev != dev)
        d++;
    if (add && d == c->ndisk && c->ndisk < COST_DISKS)
        c->disk[c->ndisk++].dev = dev;
    return d;
}

int ft_fst_measure(ft_ctx *ctx, const char *dir, unsigned elem, ft_fst_cost *out)
{
    if (!ctx || !out)
        return ft__err(-EINVAL, "ft_fst_measure: missing context or output");
    costs *c;
    dev_t dev;
    int rc = costs_args(ctx, dir, elem, "ft_fst_measure", &c, &dev);
    if (rc < 0)
        return rc;
    /* measured under the lock: two saves at once measure once (and not beside each other) */
    pthread_mutex_lock(&c->lock);
    *out = (ft_fst_cost){0};
    uint8_t *coded = NULL;
    size_t len = 0;
    if (!c->elem[elem].set || (dir && elem != 2 && !c->elem[2].set)) {
        for (unsigned e = 2;; e = elem) { /* bf16's stream is what the decode is timed on */
            free(coded);
            coded = NULL;
            if (!c->elem[e].set &&
                (rc = sample(ctx, e, &c->elem[e].encode, &c->elem[e].share, &coded, &len)) == 0)
                c->elem[e].set = true;
            if (rc < 0 || e == elem || !dir)
                break;
        }
        if (rc == 0 && !c->elem[elem].set)
            rc = sample(ctx, elem, &c->elem[elem].encode, &c->elem[elem].share, &coded, &len);
        c->elem[elem].set = rc == 0;
    }
    unsigned d = dir ? disk_slot(c, dev, false) : 0;
    if (rc == 0 && dir && (d == c->ndisk || !c->disk[d].set)) {
        double dec = 0, w = 0, r = 0;
        if (!coded || elem != 2) { /* a bf16 stream to time the decode on */
            double e2, s2;
            free(coded);
            coded = NULL;
            rc = sample(ctx, 2, &e2, &s2, &coded, &len);
        }
        size_t n = (32u << 20) >> ft__fst_probe_shift;
        uint8_t *back = rc == 0 ? malloc(n) : NULL;
        if (rc == 0 && !back)
            rc = ft__err(-ENOMEM, "codec sample");
        double t0 = seconds();
        int64_t m = rc == 0 ? ft_codec_decode(ctx, coded, len, back, n) : 0;
        dec = (double)n / FT__MAX(seconds() - t0, 1e-9) / 1e9;
        free(back);
        rc = rc < 0 ? rc : m < 0 ? (int)m : 0;
        if (rc == 0)
            rc = disk_rates(ctx, dir, &w, &r);
        if (rc == 0)
            d = disk_slot(c, dev, true);
        if (rc == 0 && d < c->ndisk) {
            c->disk[d].decode = dec;
            c->disk[d].write = w;
            c->disk[d].read = r;
            c->disk[d].set = true;
        } else if (rc == 0) { /* more filesystems than kept: this answer only */
            *out = (ft_fst_cost){.decode = dec, .write = w, .read = r};
        }
    }
    free(coded);
    if (rc == 0) {
        out->encode = c->elem[elem].encode;
        out->share = c->elem[elem].share;
        if (dir && d < c->ndisk) {
            out->decode = c->disk[d].decode;
            out->write = c->disk[d].write;
            out->read = c->disk[d].read;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int ft_fst_cost_set(ft_ctx *ctx, const char *dir, unsigned elem, const ft_fst_cost *cost)
{
    if (!ctx || !cost)
        return ft__err(-EINVAL, "ft_fst_cost_set: missing context or cost");
    costs *c;
    dev_t dev;
    int rc = costs_args(ctx, dir, elem, "ft_fst_cost_set", &c, &dev);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->lock);
    c->elem[elem].encode = cost->encode;
    c->elem[elem].share = cost->share;
    c->elem[elem].set = true;
    unsigned d = dir ? disk_slot(c, dev, true) : 0;
    if (dir && d < c->ndisk) {
        c->disk[d].decode = cost->decode;
        c->disk[d].write = cost->write;
        c->disk[d].read = cost->read;
        c->disk[d].set = true;
    }
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/*
 * A save codes a float type only where the write time coding saves, (1 - coded share) of the
 * bytes at the disk's write rate, is at least this share of the time encoding them takes:
 * encode x (1 - share) >= SAVE_GAIN x write. Encodes overlap the writes of the streams
 * before them, so the saving need not pay for the whole encode. The figure is the earlier
 * bf16 rule's, encode >= 2.3 x write at bf16's share 0.67 (2.3 x 0.33), which the H200 runs
 * in docs/benchmarks/codec-h200.json set (encode / write 1.49 gave 0.64x the uncompressed
 * save with one write at a time: 2.3 breaks even; the development machine, 2 cores: 1.93 gave
 * 0.6x). fp32 codes to about 0.83: it saves half of bf16's bytes for the same encode work,
 * and coded fp32 saves ran 0.54x and 0.76x the uncompressed save on the H200 machine where
 * bf16's ran 0.78x and 1.29x. And the codec must decode at least as fast as the disk reads
 * (a load then takes about the coded bytes' read time).
 */
#define SAVE_GAIN 0.76

int ft_fst_coding_pays(const ft_fst_cost *c)
{
    return c && c->encode * (1 - c->share) >= SAVE_GAIN * c->write && c->decode >= c->read &&
           c->write > 0;
}

/* ---- the writer ---- */

typedef struct coded {
    const ft_tensor *t;
    uint8_t *buf;     /* page-aligned, a whole number of pages */
    size_t cap;
    uint64_t size;    /* the stream's bytes */
    bool compressed;
    uint64_t at;      /* where it goes in the data section */
} coded;

typedef struct batch {
    coded *items;
    size_t n;
} batch;

typedef struct writer {
    ft_ctx *ctx;
    ft__first_err failed; /* the writes' first failure, with its detail */
    ft_file *f;
    const char *path;
    const ft_save_opts *opts;
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

static int64_t encode_one(void *arg, unsigned i)
{
    void **a = arg;
    writer *w = a[0];
    coded *x = &((batch *)a[1])->items[i];
    const ft_tensor *t = x->t;
    bool on_dev = t->data.kind == FT_MEM_CUDA;
    unsigned e = ft__dtype_coded(t->dtype);
    bool compress = e && (on_dev ? w->code_dev[e] : w->code[e]);
    uint64_t n = t->data.len;
    uint32_t block = compress ? block_of(e) : BLOCK;
    size_t cap = page_up(FT__MAX(ft_codec_bound(n, compress ? e : 1, block),
                                 ft_codec_bound(n, 1, BLOCK)));
    const void *src = t->data.ptr;
    void *host = NULL;
    int64_t m = posix_memalign((void **)&x->buf, PAGE, cap)
                    ? ft__err(-ENOMEM, "tensor '%s': %zu bytes", t->name, cap) : 0;
    bool done = false; /* x->buf holds the tensor's stream, m bytes */
    if (m == 0 && on_dev && compress && gpu_codes(w->ctx, t->data.device, e, NULL)) {
        /* coded on its GPU, the coded bytes copied here; where that fails (its memory is
         * full: the encoder takes about 130 MiB), coded on the host */
        pthread_mutex_t *one = &costs_of(w->ctx)->gpu[t->data.device].coding;
        pthread_mutex_lock(one);
        int64_t r = ft_codec_encode_cuda(w->ctx, src, n, e, block, x->buf, cap,
                                         t->data.device, NULL);
        pthread_mutex_unlock(one);
        done = r >= 0 && saves_enough(r, n);
        compress = r < 0 || done; /* (a stream that saves too little: stored) */
        m = done ? r : 0;
    }
    if (m == 0 && !done && on_dev) { /* coded or stored from a host copy */
        if (!(host = malloc(n ? (size_t)n : 1)))
            m = ft__err(-ENOMEM, "tensor '%s': %llu bytes", t->name, (unsigned long long)n);
        else if ((m = ft_cuda_copy(host, src, (size_t)n)) == 0)
            src = host;
    }
    if (m == 0 && !done) {
        m = ft_codec_encode(w->ctx, src, n, compress ? e : 1, block,
                            compress ? 0 : FT_CODEC_STORE, x->buf, cap);
        if (m >= 0 && compress && !saves_enough(m, n)) {
            m = ft_codec_encode(w->ctx, src, n, 1, BLOCK, FT_CODEC_STORE, x->buf, cap);
            compress = false;
        }
    }
    free(host);
    if (m < 0) {
        free(x->buf);
        x->buf = NULL;
        ft__first_err_note(a[2], i, (int)m);
        return m;
    }
    x->cap = cap;
    x->size = (uint64_t)m;
    x->compressed = compress && (uint64_t)m < n;
    memset(x->buf + m, 0, cap - (size_t)m); /* the gap to the next page: zeros */
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

static void free_batch(batch *b)
{
    for (size_t i = 0; b && i < b->n; i++)
        free(b->items[i].buf);
    if (b) {
        free(b->items);
        b->items = NULL;
        b->n = 0;
    }
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
            if (on_dev && gpu_codes(w->ctx, t[i].data.device, e, &gpu))
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
    batch b[2] = {{0}, {0}};
    pthread_t thread;
    bool running = false;
    uint64_t at = 0;
    for (size_t i = 0, k = 0; rc == 0 && i < n; k ^= 1) {
        batch *cur = &b[k];
        size_t first = i;
        uint64_t bytes = 0;
        while (i < n && i - first < BATCH_TENSORS && (i == first || bytes < BATCH_BYTES))
            bytes += t[i++].data.len;
        cur->n = i - first;
        if (!(cur->items = calloc(cur->n, sizeof *cur->items))) {
            rc = ft__err(-ENOMEM, "%s: batch", path);
            break;
        }
        for (size_t j = 0; j < cur->n; j++)
            cur->items[j].t = &t[first + j];
        int64_t *results = calloc(cur->n, sizeof *results);
        ft__first_err coding; /* (the writer thread's tasks note theirs in w.failed) */
        void *arg[3] = {&w, cur, &coding};
        ft__first_err_init(&coding);
        rc = results ? ft__pool_run(ctx->pool, (unsigned)cur->n, encode_one, arg, results)
                     : ft__err(-ENOMEM, "%s: batch", path);
        int failed = ft__first_err_take(&coding);
        rc = rc < 0 ? rc : failed;
        free(results);
        if (running) { /* the batch before has been written meanwhile */
            pthread_join(thread, NULL);
            running = false;
            free_batch(&b[k ^ 1]);
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
        w.writing = cur;
        if (pthread_create(&thread, NULL, writer_thread, &w) == 0) {
            running = true;
        } else if ((rc = write_batch(&w, cur)) == 0) {
            free_batch(cur);
        }
    }
    if (running) {
        pthread_join(thread, NULL);
        if (rc == 0 && w.rc < 0) {
            rc = w.rc;
            ft__detail_restore(w.detail);
        }
    }
    free_batch(&b[0]);
    free_batch(&b[1]);
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
