/* Small test helpers: typed asserts that print both values, random data, temp files,
 * skips (exit 77), and fault injection through the library's syscall table. */
#ifndef FT_TESTLIB_H
#define FT_TESTLIB_H

#include "fastensor.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_SKIP 77

extern const char *t_name; /* current case, for failure messages */
extern int t_failures;

#define T_FAIL(...)                                                                           \
    do {                                                                                      \
        fprintf(stderr, "FAIL %s:%d [%s]: ", __FILE__, __LINE__, t_name ? t_name : "");      \
        fprintf(stderr, __VA_ARGS__);                                                         \
        fprintf(stderr, " (last error: %s)\n", ft_last_error());                              \
        t_failures++;                                                                         \
        return;                                                                               \
    } while (0)

/* Compare two signed integers; on mismatch, print both and return from the void function. */
#define T_EQ(a, b)                                                                            \
    do {                                                                                      \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                              \
        if (t_a_ != t_b_)                                                                     \
            T_FAIL("%s == %s: %lld != %lld", #a, #b, t_a_, t_b_);                             \
    } while (0)

#define T_TRUE(c)                                                                             \
    do {                                                                                      \
        if (!(c))                                                                             \
            T_FAIL("%s is false", #c);                                                        \
    } while (0)

/* Byte-exact comparison: reports the first differing offset. */
#define T_MEMEQ(a, b, n)                                                                      \
    do {                                                                                      \
        size_t t_at_ = t_first_diff((a), (b), (n));                                           \
        if (t_at_ != (size_t)-1)                                                              \
            T_FAIL("%s and %s differ at byte %zu of %zu", #a, #b, t_at_, (size_t)(n));        \
    } while (0)

/* Outside a case: abort the binary when a call fails. */
#define T_ASSERT_OK(call)                                                                     \
    do {                                                                                      \
        long long t_rc_ = (long long)(call);                                                  \
        if (t_rc_ < 0) {                                                                      \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,          \
                    ft_strerror((int)t_rc_), ft_last_error());                                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

size_t t_first_diff(const void *a, const void *b, size_t n);
/* Whether files @p a and @p b hold the same bytes (both readable). */
bool t_same_files(const char *a, const char *b);
/* Create or truncate @p path and write @p text into it (aborts where it cannot). */
void t_write_text(const char *path, const char *text);

/* Fill with pseudo-random bytes from @p seed (xorshift64*, fast enough for GiBs). */
void t_fill_random(void *buf, size_t n, uint64_t seed);

/* Push every cached copy out of a spill store's ring of @p ring bytes (puts evict the least
 * recently used first): fill it with 1 MiB entries newer than all others, then drop them.
 * Later gets of the earlier entries read the spill file. */
void t_store_evict(ft_store *s, uint64_t ring);

/* A fresh directory for this test binary (under $FT_TEST_DIR or the build dir); removed at
 * exit together with its files. @return its path. */
const char *t_dir(void);
/* Path of a file in t_dir() (static buffer rotating over 8 slots). */
const char *t_path(const char *name);

/* Skip the whole binary with a reason: prints "SKIP: reason" and exits 77. */
void t_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Pages of [0, len) of @p path in the page cache (mincore over a shared mapping); 0 where
 * the file cannot be mapped. */
size_t t_cached_pages(const char *path, size_t len);
/* Push @p path out of the page cache: flush it, drop it (POSIX_FADV_DONTNEED), and retry for
 * up to 2 s while pages remain, since the kernel keeps pages that are under I/O (readahead
 * still in flight, writeback). @return whether no page of it is left cached. */
bool t_evict(const char *path);

/* Whether the filesystem holding t_dir() accepts O_DIRECT. */
bool t_have_odirect(void);
/* Whether a forked child may start threads: not under ThreadSanitizer, which kills such a
 * child ("starting new threads after multi-threaded fork is not supported"). Cases that
 * fork savers print why they skip when this is false. */
bool t_fork_threads_ok(void);
/* Whether large tests (> 1 GiB) should run: FT_TEST_QUICK unset. */
bool t_large_tests(void);

/* Memory with a chosen misalignment: returns a pointer p with p % 4096 == misalign. Free the
 * block with t_free_misaligned(p, misalign). */
void *t_alloc_misaligned(size_t n, size_t misalign);
void t_free_misaligned(void *p, size_t misalign);

/* ---- fault injection (testfault.c: wraps ft__sys entries) ---- */
/* One per entry of the library's syscall table; T_OP_URING_CQE rewrites completions. */
enum t_fault_op {
    T_OP_PREAD, T_OP_PWRITE, T_OP_URING_CQE, T_OP_FDATASYNC, T_OP_OPEN, T_OP_MMAP,
    T_OP_FALLOCATE, T_OP_CLOSE, T_OP_FSTAT, T_OP_FSTATFS, T_OP_FSYNC, T_OP_FTRUNCATE,
    T_OP_FADVISE, T_OP_MUNMAP, T_OP_MADVISE, T_OP_MINCORE, T_OP_CACHESTAT, T_OP_FCNTL,
    T_OP_FLOCK, T_OP_RENAME, T_OP_UNLINK, T_OP_STAT, T_OP_MKDIR, T_OP_OPENDIR, T_OP_READDIR,
    T_OP_KILL, T_OP_LOCK,
    T_OP_URING_INIT, T_OP_URING_REGISTER, T_OP_URING_SUBMIT, T_OP_URING_WAIT, T_OP_COUNT
};
enum t_fault_kind { T_FAULT_ERRNO, T_FAULT_SHORT, T_FAULT_EINTR };
/* The op's name ("pread", ...). */
const char *t_fault_op_name(enum t_fault_op op);
/* From the @p nth call of @p op on (1-based), for @p count calls (0: every later call),
 * inject the fault: an error (err, e.g. EIO), a short transfer (half, at least 1 byte) or
 * an EINTR. */
void t_fault_set(enum t_fault_op op, enum t_fault_kind kind, int err, unsigned nth,
                 unsigned count);
/* Once the armed op has failed, also fail every later call of the ops in the mask
 * (1ull << T_OP_...) with EIO: the error paths behind a first failure (cleanups failing). */
void t_fault_also(uint64_t ops);
/* Remove all faults and restore the real syscall table. @return how many the armed op got. */
unsigned t_fault_clear(void);
/* Calls of the armed op since t_fault_set (injected or not). */
unsigned t_fault_calls(void);
/* Write the sites now (a forked child that leaves with _exit, not running atexit). */
void t_fault_sites_flush(void);
/* With $FT_FAULT_SITES naming a file, every injected call's site (its return address, as
 * an offset in the binary) is appended there at exit, as "injected BINARY 0xOFFSET", so a
 * check can map sites to source lines (tests/check-fault-sites.sh). */

/* Run the cases (only those whose name contains $FT_TEST_CASE when set); prints a summary;
 * returns the exit code (0 pass, 1 fail). */
typedef void (*t_case_fn)(void);
typedef struct { const char *name; t_case_fn fn; } t_case;
int t_run(const t_case *cases, size_t n);

/* A context with the given thread count (0: default), aborting on failure. */
ft_ctx *t_ctx(unsigned threads);

#endif
