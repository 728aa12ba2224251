/* Context settings: sizes as written ("64M"), validation, cache mode names (the defaults and
 * the FASTENSOR_* variables are core/config.c's: they name engines). */
#include "base.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int ft_parse_size(const char *text, uint64_t *out)
{
    if (!text || !isdigit((unsigned char)*text))
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return -EINVAL;
    }
    if (shift) {
        end++;
        if (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0)
            end += strlen(end);
    } else if (strcasecmp(end, "B") == 0) {
        end++;
    }
    if (*end != '\0')
        return -EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *out = (uint64_t)v << shift;
    return 0;
}

static unsigned default_threads(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1)
        cpus = 1;
    /* Blocking disk I/O needs more threads in flight than there are CPUs. */
    return (unsigned)FT__MIN(FT__MAX(8, 2 * cpus), 256);
}

void ft__config_defaults(ft_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->threads = default_threads();
    cfg->chunk_size = 64u << 20;
    cfg->queue_depth = 16;
    cfg->bounce_size = 4u << 20;
    cfg->engine = FT_ENGINE_AUTO;
}

/* Fill zero fields with defaults and check the rest. */
int ft__config_resolve(ft_config *cfg)
{
    ft_config d;
    ft__config_defaults(&d);
    if (!cfg->threads)
        cfg->threads = d.threads;
    if (!cfg->chunk_size)
        cfg->chunk_size = d.chunk_size;
    if (!cfg->queue_depth)
        cfg->queue_depth = d.queue_depth;
    if (!cfg->bounce_size)
        cfg->bounce_size = d.bounce_size;
    if (cfg->threads > 4096)
        return ft__err(-EINVAL, "threads=%u is above 4096", cfg->threads);
    if (cfg->queue_depth > 4096)
        return ft__err(-EINVAL, "queue_depth=%u is above 4096", cfg->queue_depth);
    if (cfg->chunk_size % FT__DIRECT_ALIGN || cfg->bounce_size % FT__DIRECT_ALIGN)
        return ft__err(-EINVAL, "chunk_size (%zu) and bounce_size (%zu) must be multiples of %u",
                       cfg->chunk_size, cfg->bounce_size, FT__DIRECT_ALIGN);
    if (cfg->bounce_size > (1u << 30) || cfg->chunk_size > (1u << 30))
        return ft__err(-EINVAL, "chunk_size and bounce_size must be at most 1 GiB");
    if ((unsigned)cfg->engine >= FT_ENGINE_COUNT)
        return ft__err(-EINVAL, "engine %d is not an engine", (int)cfg->engine);
    if ((unsigned)cfg->cache >= FT_CACHE_COUNT)
        return ft__err(-EINVAL, "cache mode %d is not a cache mode", (int)cfg->cache);
    return 0;
}

static const char *const cache_names[FT_CACHE_COUNT] = {"auto", "keep", "bypass"};

const char *ft_cache_name(ft_cache_mode mode)
{
    return (unsigned)mode < FT_CACHE_COUNT ? cache_names[mode] : "unknown";
}

int ft_cache_from_name(const char *name)
{
    for (int m = 0; name && m < FT_CACHE_COUNT; m++)
        if (strcasecmp(name, cache_names[m]) == 0)
            return m;
    return -EINVAL;
}
