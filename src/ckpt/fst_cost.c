/*
 * What coding a .fst save costs and saves, measured once per context: the codec on weights
 * of each float size, a probe file written and read with O_DIRECT (ft_fst_measure), and per
 * GPU whether its encoder writes the CPU encoder's bytes faster than the CPU (the writer,
 * fst_save.c, reads these).
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

/* codec blocks (the codec's default): a block's code table, and on the GPU its warp's
 * building of it, stay a small share of the block's work */
#define BLOCK (1u << 20)


/* The codec blocks of @p elem-byte floats. The GPU decoder gives each block one warp: 4-byte
 * floats decode fastest in 512 KiB blocks, bf16 in 1 MiB ones, the ratio the same (the block
 * sweeps in docs/benchmarks/codec-h200.json and codec-h100.json). */
uint32_t ft__fst_block(unsigned elem)
{
    return elem == 4 ? 512u << 10 : BLOCK;
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

/* The seconds one encode of the @p n bytes at @p w into @p out takes on the CPU (@p dev < 0)
 * or GPU @p dev (@p w then in its memory), after a first call on a quarter of them that warms
 * the encoder; its stream's bytes (or -errno) in *m. */
static double timed_encode(ft_ctx *ctx, int dev, const uint8_t *w, size_t n, unsigned elem,
                           uint8_t *out, size_t cap, int64_t *m)
{
    uint32_t block = ft__fst_block(elem);
    for (size_t len = n / 4 / elem * elem;; len = n) {
        double t0 = seconds();
        *m = dev < 0 ? ft_codec_encode(ctx, w, len, elem, block, 0, out, cap)
                     : ft_codec_encode_cuda(ctx, w, len, elem, block, out, cap, dev, NULL);
        if (*m < 0 || len == n)
            return seconds() - t0;
    }
}

/* Encode GB/s and coded share of 32 MiB of @p elem-byte weights through the context's
 * threads (timed_encode); the stream left in @p coded (its length in *len) for a decode. */
static int sample(ft_ctx *ctx, unsigned elem, double *encode, double *share, uint8_t **coded,
                  size_t *len)
{
    size_t n = (32u << 20) >> ft__fst_probe_shift;
    size_t cap = ft_codec_bound(n, elem, ft__fst_block(elem));
    uint8_t *w = malloc(n), *buf = malloc(cap);
    int64_t m = w && buf ? 0 : ft__err(-ENOMEM, "codec sample");
    double t = 0;
    if (m == 0) {
        weights(elem, w, n);
        t = timed_encode(ctx, -1, w, n, elem, buf, cap, &m);
    }
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
 * ft__fst_gpu_codes: the first time, 32 MiB of weights are coded by both encoders
 * (timed_encode); the GPU's stream must be the very stream of the CPU's (else a kernel that
 * misbehaves on some GPU or driver would cost a checkpoint) and its rate, the copy of the
 * coded bytes to pinned host memory included (as a save's buffers are), above the CPU
 * encoder's.
 * Where the library has no GPU encoder (built without nvcc) or the driver cannot run it:
 * false.
 */
bool ft__fst_gpu_codes(ft_ctx *ctx, int dev, unsigned elem, double *encode)
{
    costs *c = costs_of(ctx);
    if (!c || dev < 0 || dev >= COST_GPUS)
        return false;
    pthread_mutex_lock(&c->lock);
    int *state = &c->gpu[dev].state[elem];
    if (*state == 0) {
        size_t n = (32u << 20) >> ft__fst_probe_shift;
        size_t cap = ft_codec_bound(n, elem, ft__fst_block(elem));
        uint8_t *w = malloc(n), *want = malloc(cap), *got = NULL;
        void *d = NULL;
        ft__bufpool *pinned = NULL; /* (made once the driver is up: pinned then) */
        if (w && want && ft_cuda_alloc(dev, n, &d) == 0 &&
            ft__bufpool_create_pinned(&pinned, cap, 1) == 0)
            got = ft__bufpool_get(pinned);
        int64_t a = -ENOMEM, b = -ENOMEM;
        double cpu = 0, gpu = 0;
        if (got) {
            weights(elem, w, n);
            cpu = timed_encode(ctx, -1, w, n, elem, want, cap, &a);
            if (a >= 0 && ft_cuda_copy(d, w, n) == 0)
                gpu = timed_encode(ctx, dev, d, n, elem, got, cap, &b);
        }
        bool same = a >= 0 && a == b && memcmp(want, got, (size_t)a) == 0;
        *state = same && gpu < cpu ? 1 : -1;
        c->gpu[dev].encode[elem] = b >= 0 ? (double)n / FT__MAX(gpu, 1e-9) / 1e9 : 0;
        if (d)
            ft_cuda_free(d);
        free(w);
        free(want);
        if (pinned) {
            ft__bufpool_put(pinned, got);
            ft__bufpool_destroy(pinned);
        }
    }
    bool ok = *state == 1;
    if (encode)
        *encode = c->gpu[dev].encode[elem];
    pthread_mutex_unlock(&c->lock);
    return ok;
}

pthread_mutex_t *ft__fst_gpu_lock(ft_ctx *ctx, int dev)
{
    costs *c = costs_of(ctx);
    return c && dev >= 0 && dev < COST_GPUS ? &c->gpu[dev].coding : NULL;
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

int ft_fst_gpu_codes(ft_ctx *ctx, int device, unsigned elem, double *encode)
{
    int rc = check_elem(elem);
    if (rc == 0 && (!ctx || elem < 2))
        rc = ft__err(-EINVAL, "ft_fst_gpu_codes: %s", ctx ? "floats are 2, 4 or 8 bytes"
                                                         : "missing context");
    if (rc == 0 && (device < 0 || device >= COST_GPUS))
        rc = ft__err(-EINVAL, "ft_fst_gpu_codes: device %d is not one of 0-%d", device,
                     COST_GPUS - 1);
    if (encode)
        *encode = 0;
    return rc < 0 ? rc : ft__fst_gpu_codes(ctx, device, elem, encode);
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

