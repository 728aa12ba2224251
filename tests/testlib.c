#include "testlib.h"
#include "../src/base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

const char *t_name;
int t_failures;

size_t t_first_diff(const void *a, const void *b, size_t n)
{
    if (memcmp(a, b, n) == 0)
        return (size_t)-1;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return i;
    return (size_t)-1;
}

bool t_same_files(const char *a, const char *b)
{
    int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
    struct stat sa, sb;
    bool same = fa >= 0 && fb >= 0 && !fstat(fa, &sa) && !fstat(fb, &sb) &&
                sa.st_size == sb.st_size;
    static uint8_t x[1 << 20], y[1 << 20];
    for (off_t at = 0; same && at < sa.st_size; at += (off_t)sizeof x) {
        ssize_t n = pread(fa, x, sizeof x, at);
        same = n > 0 && pread(fb, y, sizeof y, at) == n && !memcmp(x, y, (size_t)n);
    }
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    return same;
}

void t_write_text(const char *path, const char *text)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        abort();
    close(fd);
}

void t_store_evict(ft_store *s, uint64_t ring)
{
    enum { MAXN = 512 };
    uint64_t keys[MAXN], n = ring >> 20;
    T_TRUE(n <= MAXN);
    uint8_t *fill = calloc(1, 1u << 20);
    ft_buf b = ft_host_buf(fill, 1u << 20);
    for (uint64_t i = 0; i < n && i < MAXN; i++)
        T_EQ(ft_store_put(s, &b, NULL, &keys[i]), 0);
    T_EQ(ft_store_flush(s), 0);
    for (uint64_t i = 0; i < n && i < MAXN; i++)
        T_EQ(ft_store_drop(s, keys[i]), 0);
    free(fill);
}

void t_fill_random(void *buf, size_t n, uint64_t seed)
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
    for (; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        p[i] = (uint8_t)((s * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

static char dir_path[4096];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void dir_cleanup(void)
{
    if (dir_path[0] && !getenv("FT_TEST_KEEP"))
        nftw(dir_path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *t_dir(void)
{
    if (dir_path[0])
        return dir_path;
    const char *base = getenv("FT_TEST_DIR");
    char cwd[2048] = ".";
    if ((!base || *base != '/') && !getcwd(cwd, sizeof cwd)) /* absolute: symlink cases */
        snprintf(cwd, sizeof cwd, ".");
    if (base && *base == '/')
        snprintf(dir_path, sizeof dir_path, "%s/fastensor-test-XXXXXX", base);
    else
        snprintf(dir_path, sizeof dir_path, "%s/%s/fastensor-test-XXXXXX", cwd,
                 base && *base ? base : ".");
    if (!mkdtemp(dir_path)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(dir_cleanup);
    return dir_path;
}

const char *t_path(const char *name)
{
    static char slots[8][4200];
    static atomic_uint next;
    char *p = slots[atomic_fetch_add(&next, 1) % 8];
    snprintf(p, 4200, "%s/%s", t_dir(), name);
    return p;
}

void t_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    exit(T_SKIP);
}

size_t t_cached_pages(const char *path, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    void *m = fd >= 0 && len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    size_t pages = (len + 4095) / 4096, n = 0;
    unsigned char *vec = malloc(pages ? pages : 1);
    if (m != MAP_FAILED && vec && mincore(m, len, vec) == 0)
        for (size_t i = 0; i < pages; i++)
            n += vec[i] & 1;
    if (m != MAP_FAILED)
        munmap(m, len);
    if (fd >= 0)
        close(fd);
    free(vec);
    return n;
}

bool t_evict(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    off_t len = lseek(fd, 0, SEEK_END);
    bool gone = false;
    for (int i = 0; i < 200 && !gone; i++) {
        if (i)
            usleep(10000);
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        gone = len <= 0 || t_cached_pages(path, (size_t)len) == 0;
    }
    close(fd);
    return gone;
}

bool t_have_odirect(void)
{
    const char *p = t_path("odirect-probe");
    int fd = open(p, O_CREAT | O_RDWR | O_DIRECT, 0600);
    if (fd >= 0)
        close(fd);
    unlink(p);
    return fd >= 0;
}

bool t_large_tests(void)
{
    const char *q = getenv("FT_TEST_QUICK");
    return !(q && *q && strcmp(q, "0") != 0);
}

void *t_alloc_misaligned(size_t n, size_t misalign)
{
    void *p;
    if (posix_memalign(&p, 4096, n + misalign + 1) != 0)
        return NULL;
    return (uint8_t *)p + misalign;
}

void t_free_misaligned(void *p, size_t misalign)
{
    if (p)
        free((uint8_t *)p - misalign);
}

#if defined(__SANITIZE_THREAD__)
#define T_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif

bool t_fork_threads_ok(void)
{
#ifdef T_TSAN
    printf("  skipped: ThreadSanitizer cannot run forked children that start threads\n");
    return false;
#else
    return true;
#endif
}

int t_run(const t_case *cases, size_t n)
{
    int failed_cases = 0;
    size_t ran = 0;
    const char *only = getenv("FT_TEST_CASE"); /* run only the cases whose name holds this */
    for (size_t i = 0; i < n; i++) {
        if (only && *only && !strstr(cases[i].name, only))
            continue;
        t_name = cases[i].name;
        ran++;
        int before = t_failures;
        cases[i].fn();
        t_fault_clear();
        if (t_failures != before)
            failed_cases++;
        printf("%s %s\n", t_failures != before ? "  fail" : "  ok  ", cases[i].name);
        fflush(stdout);
    }
    printf("%zu cases, %d failed\n", ran, failed_cases);
    return failed_cases ? 1 : 0;
}

ft_ctx *t_ctx(unsigned threads)
{
    ft_config cfg;
    ft_config_init(&cfg);
    if (threads)
        cfg.threads = threads;
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, &cfg);
    if (rc < 0) {
        fprintf(stderr, "ft_ctx_create: %s (%s)\n", ft_strerror(rc), ft_last_error());
        exit(1);
    }
    return ctx;
}
