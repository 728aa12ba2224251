/*
 * Transfer engines: each is a static const ft__engine_ops in its own file, listed in the
 * explicit table of table.c. To add one, copy the shape of posix.c:
 *   required: name, id, read, write;
 *   optional (NULL when not needed): available, ctx_fini.
 * Engines receive a validated ft__io: host memory, any alignment, len > 0, reads clamped to
 * the file's size. They return bytes transferred or -errno with a detail message set.
 */
#ifndef FT_ENGINE_ENGINE_H
#define FT_ENGINE_ENGINE_H

#include "../core/internal.h"

enum {
    FT__CAP_BYPASS_CACHE = 1u << 0, /* uses O_DIRECT: does not fill the page cache */
    FT__CAP_PARALLEL = 1u << 1,     /* splits one transfer over several threads or queue slots */
};

typedef struct ft__engine_ops {
    const char *name;
    ft_engine id;
    unsigned caps;
    /** Optional: 1 when usable in this process, else 0 and *reason set. */
    int (*available)(ft_ctx *ctx, const char **reason);
    int64_t (*read)(const ft__io *io);
    int64_t (*write)(const ft__io *io);
    /** Optional: release the engine's per-context state. */
    void (*ctx_fini)(ft_ctx *ctx);
} ft__engine_ops;

extern const ft__engine_ops ft__engine_posix;
extern const ft__engine_ops ft__engine_direct;
extern const ft__engine_ops ft__engine_uring;
extern const ft__engine_ops ft__engine_mmap;
extern const ft__engine_ops ft__engine_cufile;

/** @return the ops of a concrete engine, or NULL for AUTO and unknown ids. */
const ft__engine_ops *ft__engine_get(ft_engine id);

#endif
