/*
 * The handles the engines work on: a context and a file, as far as moving bytes goes, and
 * the description of one transfer. core/ makes them, wires AUTO to them and hangs its state
 * off them through opaque pointers; nothing here knows the selector, checkpoints or the store.
 */
#ifndef FT_ENGINE_HANDLE_H
#define FT_ENGINE_HANDLE_H

#include "../base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct ft__stage ft__stage;
int ft__stage_create(ft__stage **out, size_t chunk);
void ft__stage_destroy(ft__stage *s);

/* State a layer above hangs on a context by a key of its own: made on first use, destroyed
 * with the context (core/ctx.c, ft__ctx_ext). */
typedef struct ft__ext_slot {
    const void *key;
    void *obj;
    void (*destroy)(void *obj);
} ft__ext_slot;
enum { FT__CTX_EXTS = 4 };

struct ft_ctx {
    ft_config cfg;
    ft__pool *pool;
    ft__bufpool *bounce;
    ft__stage *stage;         /* pinned staging buffers: device memory over the host engines */
    void *engine_state[FT_ENGINE_COUNT]; /* each engine's own (its ctx_init / ctx_fini) */
    struct ft__auto *autosel; /* core's AUTO selector (opaque here) */
    _Atomic unsigned inflight; /* transfers running now (a selector context probe) */
    pthread_mutex_t ext_lock;  /* guards ext */
    ft__ext_slot ext[FT__CTX_EXTS];
    pthread_mutex_t reg_lock;  /* guards the registered buffers below */
    struct ft__reg *regs;      /* buffers registered with ft_buf_register, sorted by ptr */
    unsigned nregs, capregs;
};

struct ft_file {
    ft_ctx *ctx;
    char *path;
    int fd;            /* buffered descriptor */
    int open_flags;    /* the O_* flags of fd, reused for the O_DIRECT descriptor */
    bool readable;     /* opened with FT_OPEN_READ */
    bool writable;     /* opened with FT_OPEN_WRITE */
    bool fd_readable;  /* fd may be read (O_RDWR or O_RDONLY) */
    pthread_mutex_t lock;   /* guards the lazily opened state below and file growth */
    int direct_fd;          /* O_DIRECT descriptor, -1 until first use */
    int direct_err;         /* cached -errno when O_DIRECT cannot be opened, else 0 */
    struct ft__file_auto *au; /* core's AUTO state of this file (opaque here) */
    void *engine_state[FT_ENGINE_COUNT]; /* each engine's own, made by it under lock on first
                                            use, freed by its file_close hook */
};

/** @return the O_DIRECT descriptor (opened once, on first use) or -errno (cached). */
int ft__file_direct_fd(ft_file *file);

/** @return the file's size or -errno. */
int64_t ft__file_size(ft_file *file);

/* ---- transfer description shared by the engines ---- */

typedef struct ft__io {
    ft_ctx *ctx;
    ft_file *file;
    uint8_t *ptr;  /* memory side */
    uint64_t len;  /* bytes; for reads already clamped to the file's end */
    uint64_t off;  /* file offset */
    void *aux;     /* engine's own data for its piece functions */
    uint64_t piece; /* selector's setting: piece size (0 default, UINT64_MAX unsplit) */
    int device;     /* -1: ptr is host memory; else the CUDA device of ptr */
    void *ready;    /* device memory: a CUevent on the caller's stream, the work queued
                       there before the call (NULL: none) */
    struct ft__fill_watch *watch; /* a fill: told of each piece (NULL: nobody watches) */
} ft__io;

/* Who watches a fill (ft__engine_ops.fill): told of each piece once it is cached (or its
 * read failed: the copy that reads it again reports that), in any order; pieces not started
 * once stop is set are told at once, unread. */
typedef struct ft__fill_watch {
    void (*filled)(struct ft__fill_watch *w, uint64_t off, uint64_t len);
    atomic_bool stop;
} ft__fill_watch;

/** One piece of a transfer: [off, off+len) of the file <-> ptr (NULL where io->ptr is). */
typedef int64_t (*ft__piece_fn)(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len);

/**
 * Split @p io into pieces of @p piece bytes, run @p fn on each in parallel over the context's
 * pool, and combine: the first failing piece's -errno (with its detail), else the bytes done
 * up to the first short piece.
 */
int64_t ft__io_parallel(const ft__io *io, uint64_t piece, ft__piece_fn fn);

/**
 * Piece size for spreading a buffered transfer of @p len bytes over the pool: an even share
 * per thread (the workers and the caller), at least 1 MiB, at most chunk_size, 4096-aligned.
 */
uint64_t ft__spread_piece(const ft_ctx *ctx, uint64_t len);

/** The piece size for splitting @p io: the selector's setting, else ft__spread_piece. */
static inline uint64_t ft__io_piece(const ft__io *io)
{
    if (io->piece == UINT64_MAX)
        return io->len;
    return io->piece ? io->piece : ft__spread_piece(io->ctx, io->len);
}

/** @return whether [off, off+len) is whole O_DIRECT blocks and ptr is aligned for it. */
static inline bool ft__is_direct_aligned(const void *ptr, uint64_t off, uint64_t len)
{
    return ((uintptr_t)ptr % FT__DIRECT_ALIGN) == 0 && off % FT__DIRECT_ALIGN == 0 &&
           len % FT__DIRECT_ALIGN == 0;
}

/**
 * Run an O_DIRECT transfer: the block-aligned middle of [off, off+len) goes to @p mid (with
 * an ft__io for just that part), the unaligned head and tail go through buffered I/O on the
 * ordinary descriptor, which stays coherent with O_DIRECT and needs no read-modify-write of
 * blocks shared with neighbouring writes. Transfers smaller than one block are all buffered.
 * @return what ft_read/ft_write return.
 */
int64_t ft__direct_transfer(const ft__io *io, bool write, int64_t (*mid)(const ft__io *part,
                                                                         bool write, int fd));

#endif
