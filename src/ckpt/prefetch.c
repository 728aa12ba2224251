/* Prefetching a shard into the page cache before a load, through the file API's fill (the
 * engine of AUTO's fill arm, where the cache policy keeps the shard): waited for without a
 * copy (ft_ckpt_prefetch) or mapped into the caller's mapping as it arrives
 * (ft_ckpt_prefetch_map); and whether a shard is mapped or read (ft_ckpt_shard_mappable). */
#include "ckpt.h"

#include <errno.h>

/* ft_ckpt_prefetch, and with @p map ft_ckpt_prefetch_map */
static int prefetch(ft_ckpt *c, unsigned k, ft_cache_mode cache, const uint8_t *map)
{
    ft__shard *s = &c->shards[k];
    if (s->fst)
        return 0; /* its streams are decoded, never mapped: read it */
    if (!s->data_size)
        return 1;
    if (ft__file_cached(s->file, s->data_start, s->data_size)) {
        if (map)
            ft_map_populate(c->ctx, map + s->data_start, (size_t)s->data_size);
        return 1;
    }
    return ft__file_fill(s->file, s->data_start, s->data_size,
                         map ? map + s->data_start : NULL, (int)cache);
}

/* Whether the shard's file holds all its data (a shorter one is read: that reports it).
 * @return 1, 0, or -errno. */
static int whole(const ft__shard *s)
{
    int64_t size = ft_file_size(s->file);
    if (size < 0)
        return (int)size;
    return (uint64_t)size >= s->data_start + s->data_size;
}

int ft_ckpt_prefetch(ft_ckpt *c, unsigned k, ft_cache_mode cache)
{
    if (!c || k >= c->nshards || (unsigned)cache >= FT_CACHE_COUNT)
        return ft__err(-EINVAL, "ft_ckpt_prefetch: bad checkpoint, shard or cache mode");
    return prefetch(c, k, cache, NULL);
}

int ft_ckpt_prefetch_map(ft_ckpt *c, unsigned k, ft_cache_mode cache, const void *map)
{
    if (!c || k >= c->nshards || (unsigned)cache >= FT_CACHE_COUNT || !map)
        return ft__err(-EINVAL, "ft_ckpt_prefetch_map: bad checkpoint, shard, cache mode or "
                                "mapping");
    int w = whole(&c->shards[k]);
    return w <= 0 ? w : prefetch(c, k, cache, map);
}

int ft_ckpt_shard_mappable(const ft_ckpt *c, unsigned k, const ft_load_opts *o, int mmap)
{
    if (!c || k >= c->nshards || mmap < -1 || mmap > 1)
        return ft__err(-EINVAL, "ft_ckpt_shard_mappable: bad checkpoint, shard or mmap %d",
                       mmap);
    const ft__shard *s = &c->shards[k];
    ft_engine engine = o ? o->engine : FT_ENGINE_AUTO;
    if (mmap == 0 || (o && (o->flags & FT_LOAD_VERIFY)) || s->fst || !s->data_size ||
        s->data_start % 8 || (mmap < 0 && engine != FT_ENGINE_AUTO))
        return 0; /* checked while read, decoded, empty, misaligned views, a named engine */
    return whole(s);
}
