/* Shared helpers of the fastensor CLI (which uses only the public header). */
#ifndef FT_CLI_H
#define FT_CLI_H

#include "fastensor.h"

#include <stdbool.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2 };

int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int bench_mixed(const ft_engine *engines, int nengines, int rounds, bool json, const char *dir);
int bench_overhead(bool json);
int cmd_profile(int argc, char **argv);
int cmd_gc(int argc, char **argv);

/** Print "fastensor <cmd>: message" to stderr (printf-style). */
/* Messages to stderr; control characters (from file contents: tensor names, metadata) are
 * written as \xNN, never raw. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* @p s with control characters and backslashes escaped (\xNN, \\) into @p buf. @return buf. */
const char *cli_escape(const char *s, char *buf, size_t len);
/** Report a failed library call: the error and the library's detail message. */
void cli_ft_error(const char *cmd, const char *what, int err);

/** Parse "4K,64M,1G" into sizes[] (at most max). @return count, or -1 on a bad item. */
int cli_parse_sizes(const char *list, uint64_t *sizes, int max);
/** Parse "posix,uring" (or "all") into engines[]. @return count, or -1 on a bad name. */
int cli_parse_engines(const char *list, ft_engine *engines, int max);
/** Format a byte count as 4K / 64M / 1G when exact, else bytes. */
const char *cli_fmt_size(uint64_t n, char *buf, size_t len);

/** qsort's comparison of doubles, ascending. */
int cli_cmp_double(const void *a, const void *b);
/** Monotonic seconds. */
double cli_now(void);
/** User + system CPU seconds of the process. */
double cli_cpu_seconds(void);

/**
 * Drop @p path from the page cache: fdatasync + fadvise(DONTNEED) always, and the whole
 * page cache (drop_caches) when running as root. @return true when the global drop worked.
 */
bool cli_evict(const char *path);

/** Fill with pseudo-random bytes from @p seed. */
void cli_fill_random(void *buf, size_t n, uint64_t seed);

/** Allocate @p n bytes aligned to 4096 (for fair O_DIRECT comparisons). NULL on failure. */
void *cli_alloc(size_t n);

/**
 * Asynchronous requests kept in flight, up to depth of them, reaped oldest first (fio's
 * iodepth, a prefetch's window). Per request: take a slot (which reaps the oldest when the
 * window is full), submit into req[slot] with that slot's buffer, add the result; drain at
 * the end.
 */
#define CLI_WINDOW_MAX 16
typedef struct cli_window {
    ft_req *req[CLI_WINDOW_MAX];
    unsigned depth, head, queued;
    uint64_t want; /* bytes each request must move (short: -EIO), 0 for any count */
    int rc;        /* the first error, 0 while none */
} cli_window;

/** An empty window of @p depth (1..CLI_WINDOW_MAX) requests of @p want bytes each. */
void cli_window_init(cli_window *w, unsigned depth, uint64_t want);
/** The slot for the next request (0..depth-1), after reaping the oldest if the window is
 * full. */
unsigned cli_window_slot(cli_window *w);
/** Count the request just submitted into the slot: @p submitted is what ft_submit_* returned
 * (an error is kept in rc and nothing is queued). @return @p submitted. */
int cli_window_add(cli_window *w, int submitted);
/** Reap every request in flight. @return the window's first error, or 0. */
int cli_window_drain(cli_window *w);

#endif
