/* The explicit engine table: index = ft_engine value. */
#include "engine.h"

#include <errno.h>
#include <strings.h>

static const ft__engine_ops *const engines[FT_ENGINE_COUNT] = {
    [FT_ENGINE_AUTO] = NULL,
    [FT_ENGINE_POSIX] = &ft__engine_posix,
    [FT_ENGINE_DIRECT] = &ft__engine_direct,
    [FT_ENGINE_URING] = &ft__engine_uring,
    [FT_ENGINE_MMAP] = &ft__engine_mmap,
    [FT_ENGINE_CUFILE] = &ft__engine_cufile,
    [FT_ENGINE_CACHEDMA] = &ft__engine_cachedma,
};

/* The arms, in no order that matters (profiles name them by label). */
const ft__arm ft__arms[] = {
    {FT_ENGINE_POSIX, 0, "posix", false, 1},
    {FT_ENGINE_POSIX, UINT64_MAX, "posix/1thread", false, 0},
    {FT_ENGINE_DIRECT, 0, "direct", false, 3},
    {FT_ENGINE_DIRECT, 8u << 20, "direct/8M", false, 0},
    {FT_ENGINE_URING, 0, "uring", false, 2},
    {FT_ENGINE_URING, 8u << 20, "uring/8M", false, 0},
    {FT_ENGINE_MMAP, 0, "mmap", false, 0},
    {FT_ENGINE_MMAP, UINT64_MAX, "mmap/1thread", false, 0},
    {FT_ENGINE_CUFILE, 0, "cufile", false, 0},
    {FT_ENGINE_CACHEDMA, 0, "cachedma", false, 0},
    {FT_ENGINE_MMAP, 0, "fill", true, 0},
};
const unsigned ft__narms = sizeof ft__arms / sizeof *ft__arms;

const ft__engine_ops *ft__engine_get(ft_engine id)
{
    if ((unsigned)id >= FT_ENGINE_COUNT)
        return NULL;
    return engines[id];
}

const char *ft_engine_name(ft_engine id)
{
    if (id == FT_ENGINE_AUTO)
        return "auto";
    const ft__engine_ops *ops = ft__engine_get(id);
    return ops ? ops->name : "unknown";
}

int ft_engine_from_name(const char *name)
{
    if (!name)
        return -EINVAL;
    for (int id = 0; id < FT_ENGINE_COUNT; id++)
        if (strcasecmp(name, ft_engine_name((ft_engine)id)) == 0)
            return id;
    return -EINVAL;
}

int ft_engine_available(ft_ctx *ctx, ft_engine id, const char **reason)
{
    if (reason)
        *reason = "";
    if (id == FT_ENGINE_AUTO)
        return 1;
    const ft__engine_ops *ops = ft__engine_get(id);
    if (!ops) {
        if (reason)
            *reason = "unknown engine";
        return 0;
    }
    return ops->available ? ops->available(ctx, reason) : 1;
}
