/* Internal declarations shared by the library's files (ft__ prefix, never exported). */
#ifndef FT_CORE_INTERNAL_H
#define FT_CORE_INTERNAL_H

#include "../base/base.h"
#include "../select/select.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* ---- context (ctx.c) ---- */

typedef struct ft__uring_cache ft__uring_cache;
int ft__uring_cache_create(ft__uring_cache **out);
typedef struct ft__stage ft__stage;
int ft__stage_create(ft__stage **out, size_t chunk);
void ft__stage_destroy(ft__stage *s);
typedef struct ft__auto ft__auto;
int ft__auto_create(ft__auto **out);
void ft__auto_destroy(ft__auto *a);

struct ft_ctx {
    ft_config cfg;
    ft__pool *pool;
    ft__bufpool *bounce;
    ft__uring_cache *uring; /* rings kept for reuse by the uring engine */
    ft__auto *autosel;      /* the AUTO selector, one per filesystem device */
    ft__stage *stage;       /* pinned staging buffers for device memory */
    _Atomic unsigned inflight; /* transfers running now (a selector context probe) */
    ft__bufpool *_Atomic ckpt_stage; /* checkpoint saves' staging buffers, made on first use
                                        and kept: fresh memory is slow to touch in a VM */
    pthread_mutex_t reg_lock;  /* guards the registered buffers below */
    struct ft__reg *regs;      /* buffers registered with ft_buf_register, sorted by ptr */
    unsigned nregs, capregs;
};

/* ---- files (file.c) ---- */

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
    struct ft__selector *_Atomic sel; /* AUTO's selector for this file's filesystem */
    _Atomic unsigned auto_caps;  /* AUTO: 1 | 2 O_DIRECT works | 4 io_uring works; 0 unknown */
    _Atomic uint64_t cache_memo; /* AUTO: last cache probe, (ns << 2) | class */
    _Atomic uint64_t ws_hint;    /* AUTO: bytes read together with this file (a checkpoint's
                                    shards), 0: the file alone */
    _Atomic uint64_t read_end;   /* AUTO: where the latest read decided on this file ends */
    _Atomic bool stream_cold;    /* AUTO: the current run of sequential reads started uncached */
    struct ft__win_set *_Atomic wins; /* AUTO: open sample windows (select/window.c) */
    void *cufile_handle;    /* registered cuFile handle (under lock), NULL until first use */
    int cufile_err;         /* cached -errno when registration failed */
    int cufile_code;        /* cuFile's error code of that failure */
};

/**
 * Make an ft_file of an open descriptor (taken over: closed on failure too). @p path names
 * it in messages; @p access is its O_ACCMODE. @return 0 or -errno.
 */
int ft__file_adopt(ft_ctx *ctx, ft_file **out, int fd, const char *path, unsigned flags,
                   int access);

/** @return the O_DIRECT descriptor (opened once, on first use) or -errno (cached). */
int ft__file_direct_fd(ft_file *file);

/** @return the file's size or -errno. */
int64_t ft__file_size(ft_file *file);

/* ---- transfers (io.c) ---- */

/** Check a transfer's arguments. @return 0 or -errno with a detail. */
int ft__io_check(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                 bool write);
/** *device = the CUDA device holding @p buf's memory (whatever kind it claims), -1 for
 * host memory. @return 0 or -errno. */
int ft__buf_device(const ft_buf *buf, int *device);
/** Run a checked transfer on the calling thread (what ft_read/ft_write do). Device memory
 * is touched only after the work queued now on opts->stream. */
int64_t ft__transfer(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                     bool write);
/** ft__transfer ordered after @p ready (a CUevent recorded on the caller's stream when the
 * transfer was asked for; NULL: record one now). */
int64_t ft__transfer_after(ft_file *f, const ft_buf *buf, uint64_t offset,
                           const ft_io_opts *opts, bool write, void *ready);

/* ---- engine AUTO (select/auto.c) ---- */


typedef struct ft__arm {
    ft_engine engine;
    uint64_t piece; /* 0: the engine's default; UINT64_MAX: one piece */
    const char *label;
} ft__arm;
extern const ft__arm ft__arms[];
extern const unsigned ft__narms;

typedef struct ft__decision {
    struct ft__selector *sel;
    unsigned arm;
    ft_engine engine;
    uint64_t piece;
    uint64_t t0;        /* when the call started (0: untimed) */
    unsigned inflight;  /* transfers of the context in flight then, this one included */
    bool trial;         /* the policy is trying the arm: ends with its sample or release */
    bool joined;        /* the call joined an open sample window (which owns the trial) */
    bool shared;        /* an uncached read through the page cache: others may want it too */
    uint64_t call;      /* bytes the caller asked for (a trial slice is a part of them) */
    ft__sel_key key;
} ft__decision;

/* @p durable (writes): 0 plain, 1 synced by the call itself (FT_IO_SYNC), 2 synced later by
 * the caller (FT_IO_SYNC_LATER): the write key's class. @p cache: the call's ft_cache_mode. */
/** Whether @p cache (an ft_cache_mode, FT_CACHE_AUTO resolved with the context's setting and
 * the cache policy) sends uncached reads of @p f through the page cache. */
bool ft__auto_keeps(ft_file *f, int cache);
void ft__auto_decide(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned durable,
                     int device, int cache, ft__decision *d);
/** Record what the decision @p d did: @p result bytes (or -errno), in the time since it was
 * made. @p counted: its transfer is still counted in the context's transfers in flight. */
void ft__auto_done(ft_file *f, const ft__decision *d, int64_t result, bool counted);
/** The file was just fdatasync'ed in @p ns: charge that to its buffered writes since the last
 * sync and record them (a buffered write is only cheap until it must become durable). */
void ft__auto_synced(ft_file *f, uint64_t ns);
/** Record the file's pending write measurements as they are (at close). */
void ft__auto_file_close(ft_file *f);

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
} ft__io;

/** One piece of a transfer: [off, off+len) of the file <-> ptr. */
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
