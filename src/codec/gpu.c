/*
 * Codec streams decoded on the GPU: the host checks and describes the blocks
 * (ft__codec_plan), copies the streams to device memory, and launches the kernel of
 * kernel.cu (embedded by fatbin.S) with one warp per block. The same lane code
 * (dev.h) also runs here on the CPU, lane by lane, for the tests.
 */
#include "codec.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const unsigned char ft__codec_fatbin[], ft__codec_fatbin_end[];

#define SHARED(max_huff) ((unsigned)(max_huff) * FTZ_TABLE * 2 + (unsigned)sizeof(ftz_canon))

int64_t ft__codec_decode_lanes(const void *src, size_t len, void *dst, size_t cap)
{
    unsigned max_huff = 0;
    int64_t nb = ft__codec_plan(src, len, 0, 0, cap, NULL, &max_huff);
    if (nb < 0)
        return nb;
    ftz_block *blocks = calloc(nb ? (size_t)nb : 1, sizeof *blocks);
    uint16_t *tables = NULL;
    ftz_canon *canon = malloc(sizeof *canon);
    /* the stream where the kernel finds it: device memory is allocated in whole aligned
     * words (and more), which the kernel's aligned loads rely on */
    uint8_t *copy = aligned_alloc(256, (len + 256) & ~(size_t)255);
    int64_t rc = -ENOMEM;
    if (!blocks || !canon || !copy)
        goto out;
    memcpy(copy, src, len);
    rc = ft__codec_plan(src, len, (uint64_t)(uintptr_t)copy, (uint64_t)(uintptr_t)dst, cap,
                        blocks, &max_huff);
    if (rc < 0)
        goto out;
    /* exactly the tables the kernel's shared memory has room for */
    rc = -ENOMEM;
    if (!(tables = malloc((size_t)(max_huff ? max_huff : 1) * FTZ_TABLE * sizeof *tables)))
        goto out;
    for (int64_t b = 0; b < nb; b++) {
        const ftz_block *d = &blocks[b];
        unsigned h = 0;
        for (unsigned k = 0; k < d->esize; k++) {
            if (d->mode[k] != FTZ_HUFF)
                continue;
            ftz_canon_build(d->src + d->off[k], canon);
            for (unsigned lane = 0; lane < FTZ_LANES; lane++)
                ftz_table_fill(canon, tables + (size_t)FTZ_TABLE * h, lane);
            h++;
        }
        for (unsigned lane = 0; lane < FTZ_LANES; lane++)
            ftz_lane(d, tables, lane, d->esize);
    }
    rc = ft_codec_size(src, len);
out:
    free(blocks);
    free(tables);
    free(canon);
    free(copy);
    return rc;
}

#define WIDTHS 4 /* element sizes 1, 2, 4, 8: one kernel each */

static unsigned width_index(unsigned esize)
{
    return esize == 1 ? 0 : esize == 2 ? 1 : esize == 4 ? 2 : 3;
}

/* The kernels in @p device's context (entered), their shared memory limits raised once. */
static int decode_kernels(int device, CUfunction fn[WIDTHS])
{
    static const char *const names[WIDTHS] = {"ftz_decode_1", "ftz_decode_2", "ftz_decode_4",
                                              "ftz_decode_8"};
    if (&ft__codec_fatbin_end[0] == &ft__codec_fatbin[0])
        return ft__err(-ENOSYS, "codec: this library was built without nvcc, so it has no GPU "
                       "decoder (decode on the host: ft_codec_decode)");
    for (unsigned w = 0; w < WIDTHS; w++) {
        int rc = ft__cuda_function(device, ft__codec_fatbin, names[w], &fn[w]);
        if (rc < 0)
            return rc;
        if (ft__cu.FuncSetAttribute) {
            CUresult r = ft__cu.FuncSetAttribute(
                fn[w], FT_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)SHARED(8));
            if (r != 0)
                return ft__cuda_err(r, "cuFuncSetAttribute (the codec kernel's shared memory)");
        }
    }
    return 0;
}

typedef struct gpu_plan {
    uint64_t *stage;  /* per job: offset of its bytes in the staging area, or UINT64_MAX */
    int64_t *blocks;  /* per job: its first block, in the order of element sizes */
    int64_t *count;   /* per job: its blocks */
    ftz_block *desc;
    int64_t nblocks;
    int64_t width_start[WIDTHS + 1]; /* blocks of each element size: [start[w], start[w+1]) */
    uint64_t staged;  /* staging bytes */
    unsigned max_huff;
    uint64_t decoded;
} gpu_plan;

typedef struct describe_job {
    const ft_codec_job *jobs;
    gpu_plan *g;
    unsigned *max_huff; /* per job */
} describe_job;

/* Pool task: the blocks of job @p i, checked and described (their src still offsets). */
static int64_t describe_blocks(void *arg, unsigned i)
{
    describe_job *d = arg;
    const ft_codec_job *jb = &d->jobs[i];
    d->max_huff[i] = 0;
    return ft__codec_plan(jb->src, jb->len, 0, (uint64_t)(uintptr_t)jb->dst, jb->cap,
                          d->g->desc + d->g->blocks[i], &d->max_huff[i]);
}

/* Check every job on the host (everything but the device addresses of the streams' bytes:
 * their blocks' src are offsets until the staging area exists) and lay out the staging.
 * The blocks are checked and described on the context's threads, a job each (a few
 * microseconds a block: one thread took most of a large decode's time). */
static int plan_jobs(ft__pool *pool, const ft_codec_job *jobs, size_t n, int device,
                     gpu_plan *g)
{
    g->stage = calloc(n ? n : 1, sizeof *g->stage);
    g->blocks = calloc(n + 1, sizeof *g->blocks);
    g->count = calloc(n + 1, sizeof *g->count);
    if (!g->stage || !g->blocks || !g->count)
        return ft__err(-ENOMEM, "codec: %zu streams", n);
    unsigned ignored = 0;
    for (size_t i = 0; i < n; i++) {
        const ft_codec_job *jb = &jobs[i];
        if (!jb->src || (!jb->dst && jb->cap))
            return ft__err(-EINVAL, "codec: stream %zu: NULL argument", i);
        int dev = -1;
        bool pinned;
        if (jb->cap && (ft__cuda_pointer(jb->dst, &dev, &pinned) != 1 || dev != device))
            return ft__err(-EINVAL, "codec: stream %zu: the destination is not memory of CUDA "
                           "device %d", i, device);
        int64_t nb = ft__codec_plan(jb->src, jb->len, 0, 0, jb->cap, NULL, &ignored);
        if (nb < 0)
            return ft__err((int)nb, "codec: stream %zu: the stream's header is corrupt", i);
        g->count[i] = nb;
        g->width_start[width_index(((const uint8_t *)jb->src)[4]) + 1] += nb;
        g->nblocks += nb;
        if (jb->src_dev) {
            g->stage[i] = UINT64_MAX;
        } else {
            g->stage[i] = g->staged;
            g->staged += (jb->len + 255) & ~(uint64_t)255;
        }
        g->decoded += (uint64_t)ft_codec_size(jb->src, jb->len);
    }
    int64_t next[WIDTHS];
    for (unsigned w = 0; w < WIDTHS; w++) {
        g->width_start[w + 1] += g->width_start[w];
        next[w] = g->width_start[w];
    }
    for (size_t i = 0; i < n; i++) {
        unsigned w = width_index(((const uint8_t *)jobs[i].src)[4]);
        g->blocks[i] = next[w];
        next[w] += g->count[i];
    }
    g->desc = calloc(g->nblocks ? (size_t)g->nblocks : 1, sizeof *g->desc);
    if (!g->desc)
        return ft__err(-ENOMEM, "codec: %lld blocks", (long long)g->nblocks);
    if (n > UINT32_MAX)
        return ft__err(-E2BIG, "codec: %zu streams in one call", n);
    unsigned *huff = calloc(n ? n : 1, sizeof *huff);
    int64_t *results = calloc(n ? n : 1, sizeof *results);
    describe_job d = {.jobs = jobs, .g = g, .max_huff = huff};
    int rc = huff && results ? ft__pool_run(pool, (unsigned)n, describe_blocks, &d, results)
                             : ft__err(-ENOMEM, "codec: %zu streams", n);
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        if (results[i] < 0) { /* again here, for this thread's message */
            int64_t nb = describe_blocks(&d, (unsigned)i);
            char why[512];
            snprintf(why, sizeof why, "%s", ft_last_error());
            rc = ft__err((int)(nb < 0 ? nb : results[i]), "codec: stream %zu: %s", i, why);
        } else if (huff[i] > g->max_huff) {
            g->max_huff = huff[i];
        }
    }
    free(huff);
    free(results);
    return rc < 0 ? rc : 0;
}

int64_t ft__codec_decode_cuda(ft__pool *pool, const ft_codec_job *jobs, size_t n, int device,
                              void *stream)
{
    if (!jobs && n)
        return ft__err(-EINVAL, "codec: NULL argument");
    const char *why;
    if (ft__cuda_load(&why) < 0)
        return ft__err(-ENODEV, "codec: no GPU decode: %s", why);
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUfunction fn[WIDTHS];
    gpu_plan g = {0};
    CUdeviceptr mem = 0;
    CUstream s = (CUstream)stream;
    if ((rc = decode_kernels(device, fn)) < 0 || (rc = plan_jobs(pool, jobs, n, device, &g)) < 0)
        goto out;
    if (g.nblocks == 0)
        goto out;
    uint64_t desc_at = g.staged, total = desc_at + (uint64_t)g.nblocks * sizeof(ftz_block);
    if ((rc = ft__cuda_alloc(&mem, total, s)) < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const ft_codec_job *jb = &jobs[i];
        uint64_t at = jb->src_dev ? (uint64_t)(uintptr_t)jb->src_dev : mem + g.stage[i];
        if (!jb->src_dev && jb->len) {
            CUresult r = ft__cu.MemcpyHtoDAsync(mem + g.stage[i], jb->src, jb->len, s);
            if (r != 0) {
                rc = ft__cuda_err(r, "codec: copying a stream to the GPU");
                goto out;
            }
        }
        for (int64_t b = 0; b < g.count[i]; b++) /* offsets become device addresses */
            g.desc[g.blocks[i] + b].src += at;
    }
    CUresult r = ft__cu.MemcpyHtoDAsync(mem + desc_at, g.desc,
                                        (size_t)g.nblocks * sizeof(ftz_block), s);
    if (r != 0) {
        rc = ft__cuda_err(r, "codec: copying the block table to the GPU");
        goto out;
    }
    CUdeviceptr desc = mem + desc_at;
    unsigned max_huff = g.max_huff;
    for (unsigned w = 0; w < WIDTHS; w++)
        for (int64_t b = g.width_start[w]; b < g.width_start[w + 1]; b += 1 << 30) {
            CUdeviceptr part = desc + (uint64_t)b * sizeof(ftz_block);
            void *params[] = {&part, &max_huff};
            unsigned count = (unsigned)FT__MIN(g.width_start[w + 1] - b, (int64_t)1 << 30);
            r = ft__cu.LaunchKernel(fn[w], count, 1, 1, FTZ_LANES, 1, 1, SHARED(max_huff), s,
                                    params, NULL);
            if (r != 0) {
                rc = ft__cuda_err(r, "codec: launching the GPU decoder");
                goto out;
            }
        }
    r = ft__cu.StreamSynchronize(s);
    if (r != 0)
        rc = ft__cuda_err(r, "codec: the GPU decoder");
out:
    if (mem) {
        ft__cuda_free(mem, s);
        CUresult fr = ft__cu.StreamSynchronize(s); /* (the host's block table is freed next) */
        if (fr != 0 && rc >= 0)
            rc = ft__cuda_err(fr, "codec: the GPU decoder");
    }
    free(g.stage);
    free(g.blocks);
    free(g.count);
    free(g.desc);
    ft__cuda_leave();
    return rc < 0 ? rc : (int64_t)g.decoded;
}
