/*
 * Buffers registered with cuFile for a context (ft_buf_register). The context keeps them
 * sorted by address so the cuFile engine can find, per transfer, the registered base that
 * cuFile wants as bufPtr_base (it addresses registered memory as base + offset).
 */
#include "cufile.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdlib.h>

struct ft__reg {
    uint8_t *ptr;
    size_t len;
    int device;
};

/* Index of the first registration ending after @p p (the only one that can hold p). */
static unsigned reg_find(const ft_ctx *ctx, const uint8_t *p)
{
    unsigned lo = 0, hi = ctx->nregs;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (ctx->regs[mid].ptr + ctx->regs[mid].len <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool ft__reg_base(ft_ctx *ctx, const void *ptr, uint64_t len, uint8_t **base)
{
    const uint8_t *p = ptr;
    bool found = false;
    pthread_mutex_lock(&ctx->reg_lock);
    unsigned i = reg_find(ctx, p);
    if (i < ctx->nregs && ctx->regs[i].ptr <= p &&
        len <= ctx->regs[i].len - (size_t)(p - ctx->regs[i].ptr)) {
        *base = ctx->regs[i].ptr;
        found = true;
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return found;
}

uint8_t *ft__cufile_base(ft_ctx *ctx, uint8_t *ptr, uint64_t len)
{
    uint8_t *base;
    return ft__reg_base(ctx, ptr, len, &base) ? base : ptr;
}

int ft_buf_register(ft_ctx *ctx, const ft_buf *buf)
{
    if (!ctx || !buf || !buf->ptr || !buf->len)
        return ft__err(-EINVAL, "ft_buf_register: no context, or an empty buffer");
    int device;
    const char *why;
    if (ft__cuda_load(&why) < 0)
        return ft__err(-ENODEV, "ft_buf_register: CUDA is not available: %s", why);
    int rc = ft__buf_device(buf, &device);
    if (rc < 0)
        return rc;
    if (device < 0)
        return ft__err(-EINVAL, "ft_buf_register: %p is host memory; only device memory is "
                                "registered with cuFile", buf->ptr);
    uint8_t *p = buf->ptr;
    pthread_mutex_lock(&ctx->reg_lock);
    unsigned i = reg_find(ctx, p);
    if (i < ctx->nregs && ctx->regs[i].ptr < p + buf->len) {
        pthread_mutex_unlock(&ctx->reg_lock);
        return ft__err(-EEXIST, "ft_buf_register: [%p, +%zu) overlaps the registered [%p, +%zu)",
                       buf->ptr, buf->len, (void *)ctx->regs[i].ptr, ctx->regs[i].len);
    }
    if (ctx->nregs == ctx->capregs) {
        unsigned cap = ctx->capregs ? 2 * ctx->capregs : 8;
        struct ft__reg *grown = realloc(ctx->regs, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&ctx->reg_lock);
            return ft__err(-ENOMEM, "ft_buf_register: registration table");
        }
        ctx->regs = grown;
        ctx->capregs = cap;
    }
    /* Registered under the lock: a concurrent overlapping registration cannot slip in. */
    if ((rc = ft__cufile_buf_register(p, buf->len, device)) == 0) {
        for (unsigned j = ctx->nregs; j > i; j--)
            ctx->regs[j] = ctx->regs[j - 1];
        ctx->regs[i] = (struct ft__reg){.ptr = p, .len = buf->len, .device = device};
        ctx->nregs++;
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    return rc;
}

int ft_buf_unregister(ft_ctx *ctx, const ft_buf *buf)
{
    if (!ctx || !buf)
        return ft__err(-EINVAL, "ft_buf_unregister: context or buffer is NULL");
    pthread_mutex_lock(&ctx->reg_lock);
    unsigned i = reg_find(ctx, buf->ptr);
    if (i >= ctx->nregs || ctx->regs[i].ptr != (uint8_t *)buf->ptr) {
        pthread_mutex_unlock(&ctx->reg_lock);
        return ft__err(-ENOENT, "ft_buf_unregister: no buffer registered at %p", buf->ptr);
    }
    struct ft__reg r = ctx->regs[i];
    for (unsigned j = i; j + 1 < ctx->nregs; j++)
        ctx->regs[j] = ctx->regs[j + 1];
    ctx->nregs--;
    ft__cufile_buf_deregister(r.ptr, r.device);
    pthread_mutex_unlock(&ctx->reg_lock);
    return 0;
}

void ft__reg_release_all(ft_ctx *ctx)
{
    for (unsigned i = 0; i < ctx->nregs; i++)
        ft__cufile_buf_deregister(ctx->regs[i].ptr, ctx->regs[i].device);
    free(ctx->regs);
    ctx->regs = NULL;
    ctx->nregs = ctx->capregs = 0;
}
