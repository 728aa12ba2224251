#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

const char *cli_escape(const char *s, char *buf, size_t len)
{
    size_t at = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && at + 5 < len; p++) {
        if (*p < 0x20 || *p == 0x7f || *p == '\\')
            at += (size_t)snprintf(buf + at, len - at, *p == '\\' ? "\\\\" : "\\x%02x", *p);
        else
            buf[at++] = (char)*p;
    }
    buf[at] = '\0';
    return buf;
}

void cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char raw[1024], safe[4096];
    vsnprintf(raw, sizeof raw, fmt, ap);
    fprintf(stderr, "fastensor %s: %s\n", cmd, cli_escape(raw, safe, sizeof safe));
    va_end(ap);
}

void cli_ft_error(const char *cmd, const char *what, int err)
{
    char safe[4096];
    const char *detail = cli_escape(ft_last_error(), safe, sizeof safe);
    fprintf(stderr, "fastensor %s: %s: %s%s%s\n", cmd, what, ft_strerror(err),
            *detail ? "\n  detail: " : "", detail);
}

int cli_parse_sizes(const char *list, uint64_t *sizes, int max)
{
    char *copy = strdup(list), *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max || ft_parse_size(tok, &sizes[n]) < 0 || sizes[n] == 0) {
            n = -1;
            break;
        }
        n++;
    }
    free(copy);
    return n;
}

int cli_parse_engines(const char *list, ft_engine *engines, int max)
{
    if (strcmp(list, "all") == 0) {
        int n = 0;
        for (int e = 1; e < FT_ENGINE_COUNT && n < max; e++)
            engines[n++] = (ft_engine)e;
        return n;
    }
    char *copy = strdup(list), *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int e = ft_engine_from_name(tok);
        if (n == max || e < 0) {
            n = -1;
            break;
        }
        engines[n++] = (ft_engine)e;
    }
    free(copy);
    return n;
}

const char *cli_fmt_size(uint64_t n, char *buf, size_t len)
{
    static const char units[] = "KMGT";
    int u = -1;
    uint64_t v = n;
    while (v >= 1024 && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%llu", (unsigned long long)n);
    else
        snprintf(buf, len, "%llu%c", (unsigned long long)v, units[u]);
    return buf;
}

int cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cli_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

bool cli_evict(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (geteuid() != 0)
        return false;
    sync();
    int dc = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (dc < 0)
        return false;
    bool ok = write(dc, "3\n", 2) == 2;
    close(dc);
    return ok;
}

void cli_fill_random(void *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        uint64_t v = s * 0x2545F4914F6CDD1Dull;
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)(i * 131u + seed);
}

void *cli_alloc(size_t n)
{
    void *p;
    return posix_memalign(&p, 4096, n ? n : 1) == 0 ? p : NULL;
}

void cli_window_init(cli_window *w, unsigned depth, uint64_t want)
{
    *w = (cli_window){.depth = depth < 1 ? 1 : depth > CLI_WINDOW_MAX ? CLI_WINDOW_MAX : depth,
                      .want = want};
}

/* Reap the oldest request in flight. */
static void window_reap(cli_window *w)
{
    int64_t n = ft_req_wait(w->req[w->head]);
    ft_req_free(w->req[w->head]);
    int rc = n < 0 ? (int)n : w->want && (uint64_t)n != w->want ? -EIO : 0;
    if (w->rc == 0)
        w->rc = rc;
    w->head = (w->head + 1) % w->depth;
    w->queued--;
}

unsigned cli_window_slot(cli_window *w)
{
    if (w->queued == w->depth)
        window_reap(w);
    return (w->head + w->queued) % w->depth;
}

int cli_window_add(cli_window *w, int submitted)
{
    if (submitted == 0)
        w->queued++;
    else if (w->rc == 0)
        w->rc = submitted;
    return submitted;
}

int cli_window_drain(cli_window *w)
{
    while (w->queued > 0)
        window_reap(w);
    return w->rc;
}
