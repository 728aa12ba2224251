/* Internal declarations shared by the library's files (ft__ prefix, never exported). */
#ifndef FT_CORE_INTERNAL_H
#define FT_CORE_INTERNAL_H

#include "../base/base.h"
#include "../engine/engine.h"
#include "../gpu/cuda.h"
#include "../select/select.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* ---- context (ctx.c) ---- */

typedef struct ft__auto ft__auto;
int ft__auto_create(ft__auto **out);
void ft__auto_destroy(ft__auto *a);
/** A transfer of @p ctx begins (ctx->inflight counts it) / ends; the context's first one in
 * flight marks it busy for other contexts on its profile (company.c). */
void ft__auto_enter(ft_ctx *ctx);
void ft__auto_leave(ft_ctx *ctx);

/** The profiles' directory in @p dir, or (FASTENSOR_PROFILE naming one) the profile file in
 * @p file; both "" where profiles are not kept. @p make: create the default directory
 * (profiles.c). */
void ft__profile_place(char *dir, char *file, size_t len, bool make);

/* ---- company from outside the context (company.c) ---- */

/** A context's view of other contexts' transfers on its profile: the profile's ".active"
 * file, opened at the context's first transfer (-1: none), its own transfers in flight. */
typedef struct ft__company {
    pthread_mutex_t lock;
    _Atomic int fd;
    bool tried;
    unsigned calls;
    uint64_t since;               /* when calls last left 0 (ns) */
    uint64_t token;               /* this context's mark in the ended record */
    _Atomic uint64_t other_ended; /* the latest end of another's transfers seen (ns) */
} ft__company;

/** @p c of a context whose @p token is distinct from every other's. */
void ft__company_init(ft__company *c, uint64_t token);
void ft__company_destroy(ft__company *c);
/** Open the ".active" file again at the next transfer where it is not open (its directory
 * may be new). */
void ft__company_retry(ft__company *c);
/** A transfer begins / ends (the first in flight locks, the last unlocks and records). */
void ft__company_enter(ft__company *c);
void ft__company_leave(ft__company *c);
/** Whether another context has transfers in flight on this profile. */
bool ft__company_now(ft__company *c);
/** Whether another context's transfers ended after @p t0 (ns, CLOCK_MONOTONIC): seen when
 * this context's own ended, or recorded since. */
bool ft__company_since(ft__company *c, uint64_t t0);

/**
 * The object a layer above core keeps on @p ctx under @p key (the address of something of
 * its own): made by @p make on first use, destroyed by @p destroy with the context. NULL when
 * @p make fails or every slot is taken (the caller then does without).
 */
void *ft__ctx_ext(ft_ctx *ctx, const void *key, void *(*make)(ft_ctx *ctx),
                  void (*destroy)(void *obj));

/* ---- files (file.c) ---- */

/* AUTO's state of one file, hung on ft_file.au (allocated with the file). */
struct ft__file_auto {
    struct ft__selector *_Atomic sel; /* the selector for this file's filesystem */
    _Atomic unsigned caps;       /* 1 | 2 O_DIRECT works | 4 io_uring works; 0 unknown */
    _Atomic uint64_t cache_memo; /* last cache probe, (ns << 2) | class */
    _Atomic uint64_t ws_hint;    /* bytes read together with this file (a checkpoint's
                                    shards), 0: the file alone */
    _Atomic uint64_t read_end;   /* where the latest read decided on this file ends */
    _Atomic bool stream_cold;    /* the current run of sequential reads started uncached */
    struct ft__win_set *_Atomic wins; /* open sample windows (select/window.c) */
};

/**
 * Make an ft_file of an open descriptor (taken over: closed on failure too). @p path names
 * it in messages; @p access is its O_ACCMODE. @return 0 or -errno.
 */
int ft__file_adopt(ft_ctx *ctx, ft_file **out, int fd, const char *path, unsigned flags,
                   int access);

/* ---- transfers (io.c) ---- */

/** Check a transfer's arguments. @return 0 or -errno with a detail. */
int ft__io_check(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                 bool write);
/** Run a checked transfer on the calling thread (what ft_read/ft_write do). Device memory
 * is touched only after the work queued now on opts->stream. */
int64_t ft__transfer(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                     bool write);
/** ft__transfer ordered after @p ready (a CUevent recorded on the caller's stream when the
 * transfer was asked for; NULL: record one now). */
int64_t ft__transfer_after(ft_file *f, const ft_buf *buf, uint64_t offset,
                           const ft_io_opts *opts, bool write, void *ready);
/** Run @p io through @p engine (device memory through pinned staging where the engine does
 * not move it itself), after @p ready. */
int64_t ft__dispatch(const ft__io *io, ft_engine engine, bool write, void *ready);

/* ---- filling the page cache (fill.c) ---- */

/** The piece size of a fill of @p len bytes. */
uint64_t ft__fill_piece(const ft_ctx *ctx, uint64_t len);
/** AUTO's fill arm: read @p io's uncached range into the page cache with @p ops->fill and
 * copy it to io->ptr span by span as each is cached (cached reads decided by AUTO under
 * @p cache, after @p ready). @return what ft_read returns. */
int64_t ft__fill_read(const ft__io *io, const ft__engine_ops *ops, int cache, void *ready);
/**
 * Bring [off, off + len) of @p f into the page cache where the cache policy keeps its
 * uncached reads (@p cache, an ft_cache_mode), through the fill arm's engine; @p map (NULL,
 * or the caller's readable mapping of the file at @p off) has its pages mapped in as they
 * arrive. @return 1 (cached, or being read: a touch of a page waits for it), 0 (the policy
 * reads such data around the cache, or no engine fills), or -errno.
 */
int ft__file_fill(ft_file *f, uint64_t off, uint64_t len, const void *map, int cache);
/** Whether all of [off, off + len) of @p f (len > 0) is in the page cache. */
bool ft__file_cached(ft_file *f, uint64_t off, uint64_t len);

/* ---- engine AUTO (auto.c) ---- */



typedef struct ft__decision {
    struct ft__selector *sel;
    unsigned arm;
    ft_engine engine;
    uint64_t piece;
    uint64_t t0;        /* when the call started (0: untimed) */
    unsigned inflight;  /* transfers of the context in flight then, this one included */
    bool trial;         /* the policy is trying the arm: ends with its sample or release */
    bool joined;        /* the call joined an open sample window (which owns the trial) */
    bool fill;          /* the arm is a fill arm (ft__fill_read runs it) */
    bool fixed;         /* a fixed engine's call, observed (ft__auto_observe) */
    uint64_t call;      /* bytes the caller asked for (a trial slice is a part of them) */
    ft__sel_key key;
} ft__decision;

/* @p cls: for writes, 0 plain, 1 synced by the call itself (FT_IO_SYNC), 2 synced later by
 * the caller (FT_IO_SYNC_LATER): the write key's class; for reads, FT__CLS_CACHED where the
 * caller knows the range is cached (the fill arm's copies), else 0 (the cache is probed).
 * @p cache: the call's ft_cache_mode. */
/** Whether @p cache (an ft_cache_mode, FT_CACHE_AUTO resolved with the context's setting and
 * the cache policy) sends uncached reads of @p f through the page cache. */
bool ft__auto_keeps(ft_file *f, int cache);
/** Where a spill file @p f of @p data bytes goes, @p limit the bytes of it the page cache
 * may hold (0: unknown): FT_CACHE_KEEP or FT_CACHE_BYPASS, its transfers then AUTO's among
 * that kind's arms (select/objective.c). */
int ft__auto_spill_goal(ft_file *f, uint64_t data, uint64_t limit);
void ft__auto_decide(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned cls,
                     int device, int cache, ft__decision *d);
/** A call of fixed engine @p engine as a sample of its arm: true and @p d set (for
 * ft__auto_done) where it is one (large enough, an arm AUTO offers, a profile in use). */
extern bool ft__auto_observes; /* tests: false where fixed calls drive the selector by hand */
bool ft__auto_observe(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned cls,
                      int device, ft_engine engine, ft__decision *d);
/** Record what the decision @p d did: @p result bytes (or -errno), in the time since it was
 * made. @p counted: its transfer is still counted in the context's transfers in flight. */
void ft__auto_done(ft_file *f, const ft__decision *d, int64_t result, bool counted);
/** The file was just fdatasync'ed in @p ns: charge that to its buffered writes since the last
 * sync and record them (a buffered write is only cheap until it must become durable). */
void ft__auto_synced(ft_file *f, uint64_t ns);
/** Record the file's pending write measurements as they are (at close). */
void ft__auto_file_close(ft_file *f);

#endif
