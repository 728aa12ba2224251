/*
 * Transfer engines: each is a static const ft__engine_ops in its own file, listed in the
 * explicit table of table.c with the arms AUTO offers of it (ft__arms: its default, and the
 * settings worth measuring), its id in the public header's ft_engine. To add one, copy the
 * shape of posix.c:
 *   required: name, id, read, write;
 *   optional (NULL when not needed): available, ready, fill, batch, file_close, ctx_init,
 *   ctx_fini, describe.
 * An engine's state of a context or a file hangs at engine_state[its id] (handle.h), read by
 * its own file only.
 * Engines receive a validated ft__io: host memory, any alignment, len > 0, reads clamped to
 * the file's size. They return bytes transferred or -errno with a detail message set.
 */
#ifndef FT_ENGINE_ENGINE_H
#define FT_ENGINE_ENGINE_H

#include "handle.h"
#include "../gpu/cuda.h"

/* What an engine is, for the code that chooses and runs engines: it tests these, never an
 * engine's identity. */
enum {
    FT__CAP_BYPASS_CACHE = 1u << 0,  /* does not go through (or fill) the page cache */
    FT__CAP_NEEDS_DIRECT = 1u << 1,  /* needs an O_DIRECT descriptor of the file */
    FT__CAP_DEVICE_MEMORY = 1u << 2, /* moves device memory itself (no pinned staging); AUTO
                                        offers it for device memory only */
    FT__CAP_STREAM_ORDER = 1u << 3,  /* orders its device work after io->ready on streams of
                                        its own (else the caller's stream is waited for on
                                        the host first) */
    FT__CAP_CACHED_READS = 1u << 4,  /* AUTO offers it for reads of cached data only */
    FT__CAP_SETS_UP = 1u << 5,       /* its first transfer of host memory in a context sets
                                        up what it keeps (a ring, bounce buffers, a driver's
                                        state); device memory's pinned staging is set up by
                                        every engine that stages */
};

typedef struct ft__engine_ops {
    const char *name;
    ft_engine id;
    unsigned caps;
    /** Optional: 1 when usable in this process, else 0 and *reason set. */
    int (*available)(ft_ctx *ctx, const char **reason);
    /** Optional: whether a transfer of @p f can run now, without waiting for anything (a
     * driver still opening, a registration of the file that failed). NULL: whenever
     * available() says so, which then holds for the process's life. */
    bool (*ready)(ft_file *f);
    int64_t (*read)(const ft__io *io);
    int64_t (*write)(const ft__io *io);
    /** Optional: bring [io->off, io->off + io->len) of the file into the page cache without
     * copying it anywhere, in pieces of ft__io_piece(io) run on the pool, telling io->watch
     * (if any) of each. io->ptr: NULL, or the caller's readable mapping of the file at
     * io->off, whose pages are mapped in as each piece arrives. An engine with it leaves
     * what it reads cached: AUTO's fill arm reads ahead with it and copies behind (core/
     * fill.c). @return io->len or -errno (a file shorter than the range: the bytes that
     * are there are cached, the copy reports the rest). */
    int64_t (*fill)(const ft__io *io);
    /** Optional: run a checked batch of device-memory ops of one @p device in one go.
     * @return 1 when it cannot take them (nothing ran), else 0 or the first failed op's
     * -errno with every op's result set. */
    int (*batch)(ft_file *f, ft_batch_op *ops, size_t n, bool write, int device, void *stream);
    /** Optional: release the engine's per-file state (the file is being closed). */
    void (*file_close)(ft_file *f);
    /** Optional: make the engine's per-context state (ctx->engine_state[id]) as the context
     * is made. @return 0 or -errno (the context is not made). */
    int (*ctx_init)(ft_ctx *ctx);
    /** Optional: release the engine's per-context state. */
    void (*ctx_fini)(ft_ctx *ctx);
    /** Optional: its lines of `fastensor info` (ft_gpu_describe) into @p buf (@p len
     * bytes, NUL-terminated): @p devices CUDA devices, -1 where CUDA cannot be used.
     * @return the characters written. */
    size_t (*describe)(int devices, char *buf, size_t len);
} ft__engine_ops;

extern const ft__engine_ops ft__engine_posix;
extern const ft__engine_ops ft__engine_direct;
extern const ft__engine_ops ft__engine_uring;
extern const ft__engine_ops ft__engine_mmap;
extern const ft__engine_ops ft__engine_cufile;
extern const ft__engine_ops ft__engine_cachedma;

/** @return the ops of a concrete engine, or NULL for AUTO and unknown ids. */
const ft__engine_ops *ft__engine_get(ft_engine id);

/*
 * The arms AUTO chooses among (table.c): engines, and settings that change how they run a
 * transfer. Profiles name arms by label, so arms may be added anywhere in the table.
 */
typedef struct ft__arm {
    ft_engine engine;
    uint64_t piece; /* 0: the engine's default; UINT64_MAX: one piece */
    const char *label;
    bool fill;      /* the engine's fill op reads ahead, cached reads copy behind (core/
                       fill.c): offered for uncached reads only, explored first for those
                       into device memory */
    uint8_t first;  /* where nothing is known, the eligible arm of the lowest rank is
                       explored first (1 a page-cache copy, 2 and 3 O_DIRECT reads of 1 MiB
                       and more; 0: never first) */
} ft__arm;
extern const ft__arm ft__arms[];
extern const unsigned ft__narms;

/* ---- device memory: staging over host engines (staging.c), cuFile (cufile*.c) ---- */

/** Move a device-memory transfer through pinned staging with a host engine, after the
 * event @p caller_ready (a CUevent on the caller's stream). */
int64_t ft__stage_transfer(const ft__io *io, const struct ft__engine_ops *ops, bool write,
                           int device, void *caller_ready);
/* A lane of the staging pool: a stream of one device and two events, with two pinned
 * buffers of the pool's chunk size, or none (a bare lane). */
typedef struct ft__lane {
    struct ft__lane *next;
    int device;
    uint8_t *buf[2]; /* NULL in a bare lane */
    bool registered; /* buf[0] (both buffers) is our memory, registered; else cuMemHostAlloc's */
    CUstream stream;
    CUevent done[2];
} ft__lane;
/** A lane for @p device (its context current), reused or made; waits while 8 of the kind
 * are out. @return 0 or -errno. */
int ft__lane_get(ft__stage *s, int device, bool buffers, ft__lane **out);
void ft__lane_put(ft__stage *s, ft__lane *lane);
/** How cachedma fares in this process: "works", "not tried yet", or why it is refused. */
void ft__cachedma_describe(char *buf, size_t len);
/** Forget the driver's answer (tests: after injecting a refusal). */
void ft__cachedma_forget(void);

/** Whether cuFile is open and usable, without waiting: the first call starts opening it on
 * @p ctx's pool and answers false until that is done. */
bool ft__cufile_usable_now(ft_ctx *ctx);
/** cuFileBufRegister / cuFileBufDeregister in @p device's context. @return 0 or -errno. */
int ft__cufile_buf_register(void *ptr, size_t len, int device);
void ft__cufile_buf_deregister(void *ptr, int device);
/**
 * Run a checked batch of device-memory ops of one @p device through cuFile's batch API.
 * @return 1 when the batch API cannot take them (nothing ran: the caller runs them another
 * way), else 0 or the first failed op's -errno with every op's result set.
 */
int ft__cufile_batch(ft_file *f, ft_batch_op *ops, size_t n, bool write, int device,
                     void *stream);

/* ---- buffers registered with cuFile (cufile_register.c) ---- */

/** If [ptr, ptr+len) lies in a registered buffer, *base = its start. @return whether. */
bool ft__reg_base(ft_ctx *ctx, const void *ptr, uint64_t len, uint8_t **base);
/** Deregister every buffer still registered with @p ctx (context teardown). */
void ft__reg_release_all(ft_ctx *ctx);

#endif
