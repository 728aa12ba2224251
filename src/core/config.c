/* A context's settings from their defaults and the FASTENSOR_* environment variables
 * (ft_config_init); sizes are parsed and settings checked in base/config.c. */
#include "internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int env_size(const char *name, size_t *field)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    uint64_t n;
    if (ft_parse_size(v, &n) < 0 || n == 0 || n > SIZE_MAX)
        return ft__err(-EINVAL, "%s=\"%s\" is not a byte count (e.g. 4M)", name, v);
    *field = (size_t)n;
    return 0;
}

static int env_count(const char *name, unsigned *field)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    uint64_t n;
    if (ft_parse_size(v, &n) < 0 || n == 0 || n > 65536)
        return ft__err(-EINVAL, "%s=\"%s\" is not a count between 1 and 65536", name, v);
    *field = (unsigned)n;
    return 0;
}

int ft_config_init(ft_config *cfg)
{
    ft__config_defaults(cfg);
    int rc;
    if ((rc = env_count("FASTENSOR_THREADS", &cfg->threads)) < 0 ||
        (rc = env_size("FASTENSOR_CHUNK_SIZE", &cfg->chunk_size)) < 0 ||
        (rc = env_count("FASTENSOR_QUEUE_DEPTH", &cfg->queue_depth)) < 0 ||
        (rc = env_size("FASTENSOR_BOUNCE_SIZE", &cfg->bounce_size)) < 0)
        return rc;
    const char *e = getenv("FASTENSOR_ENGINE");
    if (e && *e) {
        int id = ft_engine_from_name(e);
        if (id < 0)
            return ft__err(-EINVAL, "FASTENSOR_ENGINE=\"%s\" is not an engine name", e);
        cfg->engine = (ft_engine)id;
    }
    e = getenv("FASTENSOR_CACHE");
    if (e && *e) {
        int id = ft_cache_from_name(e);
        if (id < 0)
            return ft__err(-EINVAL, "FASTENSOR_CACHE=\"%s\" is not auto, keep or bypass", e);
        cfg->cache = (ft_cache_mode)id;
    }
    return 0;
}

