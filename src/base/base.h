/*
 * The base layer: what every other layer uses, depending on nothing of the library but the
 * public header. Errors and the first-failure collector, settings, the thread and buffer
 * pools, full-count reads and writes, page-cache probes; the syscall table is syscall.h.
 */
#ifndef FT_BASE_BASE_H
#define FT_BASE_BASE_H

#include "fastensor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

/* O_DIRECT alignment for offsets, lengths and memory. 4096 is at least the logical block
 * size of every device we target, and the page size, so it is always safe. */
#define FT__DIRECT_ALIGN 4096u
/* Largest count one read/write system call is asked for (Linux's MAX_RW_COUNT). */
#define FT__MAX_RW 0x7ffff000u
#define FT__DETAIL_MAX 512

#define FT__MIN(a, b) ((a) < (b) ? (a) : (b))
#define FT__MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors (error.c) ---- */

/** Set the thread's detail message (printf-style) and return @p err (a -errno). */
int ft__err(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Copy the thread's detail message into @p dst (FT__DETAIL_MAX bytes). */
void ft__detail_save(char *dst);
/** Make @p src the thread's detail message. */
void ft__detail_restore(const char *src);
/** Run the statements (clean-up after a failure) without disturbing the thread's detail. */
#define FT__KEEPING_DETAIL(...)                                                              \
    do {                                                                                     \
        char ft__kept_[FT__DETAIL_MAX];                                                      \
        ft__detail_save(ft__kept_);                                                          \
        __VA_ARGS__;                                                                         \
        ft__detail_restore(ft__kept_);                                                       \
    } while (0)

/** The first failure of parallel tasks (the lowest task index), with its detail. */
typedef struct ft__first_err {
    pthread_mutex_t lock;
    unsigned index; /* UINT32_MAX: none yet */
    int err;
    char detail[FT__DETAIL_MAX];
} ft__first_err;

void ft__first_err_init(ft__first_err *c);
/** From task @p index that failed with @p err (its thread's detail set): kept if first. */
void ft__first_err_note(ft__first_err *c, unsigned index, int err);
/** @return the kept -errno (its detail made the thread's), or 0; then frees the lock. */
int ft__first_err_take(ft__first_err *c);

/* ---- settings (config.c) ---- */

/** The built-in settings, before any FASTENSOR_* variable (core/config.c reads those). */
void ft__config_defaults(ft_config *cfg);
/** Fill zero fields of @p cfg with defaults and check the rest. @return 0 or -EINVAL. */
int ft__config_resolve(ft_config *cfg);

/* ---- thread pool (pool.c) ---- */

typedef struct ft__pool ft__pool;
typedef struct ft__task ft__task;

int ft__pool_create(ft__pool **out, unsigned threads);
void ft__pool_destroy(ft__pool *pool);

/**
 * Run fn(arg, i) for i in [0, n) on the pool and the calling thread; return when all are
 * done. Results land in results[i]. The caller only ever helps with its own tasks, so a
 * worker that calls this cannot deadlock the pool. @return 0, or -ENOMEM (nothing ran).
 */
int ft__pool_run(ft__pool *pool, unsigned n, int64_t (*fn)(void *arg, unsigned i), void *arg,
                 int64_t *results);

/** Whether the calling thread's groups (ft__pool_run) are queued ahead of the work already
 * queued (@p on) or behind it (the default). @return the previous setting. */
bool ft__pool_first(bool on);
/** The pool's worker threads (0: tasks run on their callers only). */
unsigned ft__pool_workers(const ft__pool *pool);
/** Queue a detached task: fn(arg) runs once on a worker (before the pool is destroyed).
 * @return 0 or -ENOMEM. */
int ft__pool_post(ft__pool *pool, void (*fn)(void *arg), void *arg);

/* ---- aligned buffer pool (bufpool.c) ---- */

typedef struct ft__bufpool ft__bufpool;

int ft__bufpool_create(ft__bufpool **out, size_t buf_size, unsigned max_cached);
/** What a pool does to each buffer it makes (page-lock it for a device) and undoes before
 * freeing it. */
typedef struct ft__buf_hooks {
    void (*made)(void *buf, size_t len);
    void (*unmade)(void *buf);
} ft__buf_hooks;
/** A pool whose buffers go through @p hooks (static storage; NULL: plain buffers). */
int ft__bufpool_create_with(ft__bufpool **out, size_t buf_size, unsigned max_cached,
                            const ft__buf_hooks *hooks);
void ft__bufpool_destroy(ft__bufpool *pool);
/** @return a FT__DIRECT_ALIGN-aligned buffer of the pool's size, or NULL (ENOMEM). */
void *ft__bufpool_get(ft__bufpool *pool);
void ft__bufpool_put(ft__bufpool *pool, void *buf);
size_t ft__bufpool_size(const ft__bufpool *pool);
/** Whether the pool's buffers go through hooks (pinned ones: see gpu/cuda.h). */
bool ft__bufpool_hooked(const ft__bufpool *pool);

/* ---- page-cache probes (probe.c) ---- */

/* Page-cache residency classes of a range (ft__probe_cache); the selector's read classes
 * share their values. */
enum { FT__CLS_COLD = 0, FT__CLS_CACHED = 1, FT__CLS_STREAM = 2 };
/** FT__CLS_CACHED when (nearly) all of [off, off+len) of @p fd is in the page cache, else
 * FT__CLS_COLD. */
unsigned ft__probe_cache(int fd, uint64_t off, uint64_t len);
/** Bytes of file data the page cache can keep now: MemAvailable, and under a cgroup memory
 * limit what is left below it (read at most every 0.5 s). */
uint64_t ft__probe_cache_room(void);
/** Make the next ft__probe_cache_room read /proc again (tests). */
void ft__probe_forget(void);

/* ---- full transfers (rw.c): loop on short counts and EINTR, cap at FT__MAX_RW ---- */

/**
 * Read or write all of [off, off+len) on @p fd. When @p unaligned_fd >= 0, @p fd is an
 * O_DIRECT descriptor and the part left unaligned by a short count goes to unaligned_fd.
 * @return bytes done (< len only for a read at EOF) or -errno.
 */
int64_t ft__rw_full(int fd, int unaligned_fd, void *buf, uint64_t len, uint64_t off, bool write);
/** @return bytes read (< len only at EOF) or -errno. */
int64_t ft__pread_full(int fd, void *buf, uint64_t len, uint64_t off);
/** open(2) through the syscall table, again while it fails with EINTR. */
int ft__open_retry(const char *path, int flags, mode_t mode);
/** @return len or -errno (a write making no progress gives -EIO). */
int64_t ft__pwrite_full(int fd, const void *buf, uint64_t len, uint64_t off);
/**
 * Map the pages of a mapped range [from, from+len) in one call (MADV_POPULATE_READ, Linux
 * 5.14) instead of a fault per few pages, reading those not cached.
 * @return 0, or -errno (-EINVAL where the kernel or the build has no such advice, -EFAULT
 * for pages beyond the file's end, -EIO).
 */
int ft__populate(const void *from, uint64_t len);
/** Read a byte of every page of a mapped range (and its last byte): faults map them in. */
void ft__touch_pages(const void *from, uint64_t len);


/** xxh3-64 of a block (csum.c): checkpoint and codec block checksums. */
uint64_t ft__csum(const void *data, size_t len);

#endif
