/* What loads and the prefetch share: a shard's data read in full, and the pages of a mapping
 * faulted in by the pool's threads. */
#include "ckpt.h"
#include "../base/syscall.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

int64_t ft__shard_read(ft__shard *s, const ft_buf *dst, uint64_t at, const ft_io_opts *io)
{
    int64_t r = ft__transfer(s->file, dst, s->data_start + at, io, false);
    if (r >= 0 && (uint64_t)r < dst->len)
        r = ft__err(-EIO, "%s: the file ended early (at data byte %llu)", s->path,
                    (unsigned long long)(at + (uint64_t)r));
    return r;
}

#define POPULATE_SLICE (64u << 20)

typedef struct populate_job {
    const uint8_t *base;
    uint64_t len;
} populate_job;

static int64_t populate_slice(void *arg, unsigned i)
{
    const populate_job *j = arg;
    uint64_t at = (uint64_t)i * POPULATE_SLICE;
    ft__touch_pages(j->base + at, FT__MIN((uint64_t)POPULATE_SLICE, j->len - at));
    return 0;
}

int ft_map_populate(ft_ctx *ctx, const void *addr, size_t len)
{
    if (!ctx || (!addr && len))
        return ft__err(-EINVAL, "ft_map_populate: bad context or range");
    /* the mapping's pages read once, in slices on the pool */
    const uintptr_t page = 4096;
    populate_job j = {.base = (const uint8_t *)((uintptr_t)addr & ~(page - 1))};
    j.len = (uint64_t)((uintptr_t)addr + len - (uintptr_t)j.base);
    unsigned n = (unsigned)((j.len + POPULATE_SLICE - 1) / POPULATE_SLICE);
    int64_t *results = n ? calloc(n, sizeof *results) : NULL;
    if (results)
        ft__pool_run(ctx->pool, n, populate_slice, &j, results);
    free(results);
    return 0;
}

