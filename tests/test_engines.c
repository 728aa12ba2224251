/* Every engine: random-data round trips over sizes x offsets x buffer alignments, cross-
 * engine reads, reads past the end, and one transfer above 2 GiB. */
#include "testlib.h"
#include "../src/base/syscall.h"
#include "../src/engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static ft_ctx *ctx;
static const ft_engine engines[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT,   FT_ENGINE_URING,
                                    FT_ENGINE_MMAP,  FT_ENGINE_CACHEDMA, FT_ENGINE_AUTO};
#define N_ENGINES (sizeof engines / sizeof engines[0])

static const size_t sizes[] = {0, 1, 511, 4096, 4097, (1u << 20) + 3, (64u << 20) + 5};
static const uint64_t offsets[] = {0, 1, 4095, 4096, (5ull << 30) + 7};
static const size_t misaligns[] = {0, 1, 513};

/* Write with @p we, read back with @p re; check with plain pread too. */
static void round_trip(ft_engine we, ft_engine re, size_t size, uint64_t off, size_t mis,
                       uint64_t seed)
{
    const char *path = t_path("rt.bin");
    ft_file *f;
    int rc = ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                             FT_OPEN_TRUNC, 0644);
    if (rc < 0)
        T_FAIL("open: %s", ft_strerror(rc));
    uint8_t *src = t_alloc_misaligned(size, mis), *dst = t_alloc_misaligned(size, mis);
    uint8_t *raw = malloc(size + 1);
    T_TRUE(src && dst && raw);
    t_fill_random(src, size, seed);
    memset(dst, 0xA5, size);
    ft_buf b = ft_host_buf(src, size);
    ft_io_opts wo = {.engine = we};
    int64_t n = ft_write(f, &b, off, &wo);
    if (n != (int64_t)size) {
        ft_file_close(f);
        T_FAIL("%s write of %zu at %llu (misalign %zu) returned %lld", ft_engine_name(we), size,
               (unsigned long long)off, mis, (long long)n);
    }
    int64_t fsize = ft_file_size(f);
    int64_t want_size = size ? (int64_t)(off + size) : 0;
    ft_buf d = ft_host_buf(dst, size);
    ft_io_opts ro = {.engine = re};
    int64_t m = ft_read(f, &d, off, &ro);
    int rfd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t plain = rfd >= 0 ? pread(rfd, raw, size, (off_t)off) : -1;
    if (rfd >= 0)
        close(rfd);
    ft_file_close(f);
    char what[160];
    snprintf(what, sizeof what, "%s->%s size %zu off %llu mis %zu", ft_engine_name(we),
             ft_engine_name(re), size, (unsigned long long)off, mis);
    if (fsize != want_size)
        T_FAIL("%s: file size %lld, expected %lld", what, (long long)fsize,
               (long long)want_size);
    if (m != (int64_t)size)
        T_FAIL("%s: read returned %lld", what, (long long)m);
    if (plain != (ssize_t)size)
        T_FAIL("%s: plain pread returned %zd", what, plain);
    size_t at = t_first_diff(src, dst, size);
    if (at != (size_t)-1)
        T_FAIL("%s: engine read differs at byte %zu", what, at);
    at = t_first_diff(src, raw, size);
    if (at != (size_t)-1)
        T_FAIL("%s: file content (plain pread) differs at byte %zu", what, at);
    t_free_misaligned(src, mis);
    t_free_misaligned(dst, mis);
    free(raw);
}

static void case_matrix(void)
{
    int before = t_failures;
    uint64_t seed = 1;
    for (size_t e = 0; e < N_ENGINES; e++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++)
                for (size_t m = 0; m < sizeof misaligns / sizeof *misaligns; m++) {
                    /* The 64 MiB size runs with one misalignment to bound the time. */
                    if (sizes[s] > (8u << 20) && m == 2)
                        continue;
                    round_trip(engines[e], engines[e], sizes[s], offsets[o], misaligns[m],
                               seed++);
                    if (t_failures - before > 10)
                        return;
                }
}

static void case_cross_engine(void)
{
    uint64_t seed = 1000;
    for (size_t w = 0; w < N_ENGINES; w++)
        for (size_t r = 0; r < N_ENGINES; r++) {
            round_trip(engines[w], engines[r], (1u << 20) + 3, 4095, 1, seed++);
            round_trip(engines[w], engines[r], 3 * 4096, 8192, 0, seed++);
        }
}

static void case_read_past_eof(void)
{
    const char *path = t_path("eof.bin");
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                         FT_OPEN_TRUNC, 0644), 0);
    const size_t fsize = 3 * 4096 + 100;
    uint8_t *src = malloc(fsize), *dst = malloc(2 * fsize);
    t_fill_random(src, fsize, 7);
    ft_buf b = ft_host_buf(src, fsize);
    T_EQ(ft_write(f, &b, 0, NULL), fsize);
    for (size_t e = 0; e < N_ENGINES; e++) {
        ft_io_opts o = {.engine = engines[e]};
        ft_buf d = ft_host_buf(dst, 2 * fsize);
        T_EQ(ft_read(f, &d, 0, &o), fsize); /* whole file, asked for more */
        T_MEMEQ(src, dst, fsize);
        T_EQ(ft_read(f, &d, fsize - 10, &o), 10);
        T_MEMEQ(src + fsize - 10, dst, 10);
        T_EQ(ft_read(f, &d, 4096, &o), fsize - 4096); /* aligned start, unaligned end */
        T_MEMEQ(src + 4096, dst, fsize - 4096);
        T_EQ(ft_read(f, &d, fsize, &o), 0);
        T_EQ(ft_read(f, &d, fsize + 12345, &o), 0);
        T_EQ(ft_read(f, &d, 1ull << 40, &o), 0);
    }
    ft_file_close(f);
    free(src);
    free(dst);
}

/* One transfer longer than 2 GiB per engine (above a single syscall's limit). */
static void case_above_2gib(void)
{
    if (!t_large_tests()) {
        printf("  (skipped: FT_TEST_QUICK is set)\n");
        return;
    }
    size_t size = (2ull << 30) + 3;
    uint8_t *src = malloc(size), *dst = malloc(size);
    T_TRUE(src && dst);
    t_fill_random(src, size, 99);
    const ft_engine big[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT, FT_ENGINE_URING, FT_ENGINE_MMAP};
    for (size_t e = 0; e < 4; e++) {
        const char *path = t_path("big.bin");
        ft_file *f;
        T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                             FT_OPEN_TRUNC, 0644), 0);
        ft_io_opts o = {.engine = big[e]};
        ft_buf b = ft_host_buf(src, size), d = ft_host_buf(dst, size);
        memset(dst, 0, size);
        int64_t w = ft_write(f, &b, 4097, &o);
        int64_t r = ft_read(f, &d, 4097, &o);
        ft_file_close(f);
        unlink(path);
        if (w != (int64_t)size || r != (int64_t)size)
            T_FAIL("%s: write %lld read %lld of %zu", ft_engine_name(big[e]), (long long)w,
                   (long long)r, size);
        T_MEMEQ(src, dst, size);
    }
    free(src);
    free(dst);
}

/* The advice the mmap engine gives its read mappings, counted through the syscall table. */
static unsigned advised_huge, advised_willneed;
static int counting_madvise(void *addr, size_t len, int advice)
{
    if (advice == MADV_HUGEPAGE) /* (given by the calling thread; the workers populate) */
        advised_huge++;
    if (advice == MADV_WILLNEED)
        advised_willneed++;
    return madvise(addr, len, advice);
}

/* mmap reads of 1 MiB and more advise MADV_HUGEPAGE (faults read ahead in 2 MiB folios; the
 * 4 KiB ones WILLNEED's readahead leaves slow every later read), smaller ones MADV_WILLNEED
 * (a 2 MiB readahead per 4 KiB read), and so do all where THP is off. Bytes exact either way. */
static void case_mmap_read_advice(void)
{
    char text[128] = "";
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (thp) {
        if (!fgets(text, sizeof text, thp))
            text[0] = '\0';
        fclose(thp);
    }
    bool huge = text[0] && !strstr(text, "[never]");
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("advice.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    size_t n = (4u << 20) + 3;
    uint8_t *src = malloc(n), *dst = malloc(n);
    T_TRUE(src && dst);
    t_fill_random(src, n, 77);
    ft_buf b = ft_host_buf(src, n);
    T_EQ(ft_write(f, &b, 4095, &(ft_io_opts){.engine = FT_ENGINE_POSIX}), (int64_t)n);
    int (*keep)(void *, size_t, int) = ft__sys.madvise;
    ft__sys.madvise = counting_madvise;
    const size_t lens[] = {4096, (1u << 20) - 1, 1u << 20, n};
    for (unsigned i = 0; i < sizeof lens / sizeof *lens; i++) {
        advised_huge = advised_willneed = 0;
        memset(dst, 0, n);
        ft_buf d = ft_host_buf(dst, lens[i]);
        T_EQ(ft_read(f, &d, 4095, &(ft_io_opts){.engine = FT_ENGINE_MMAP}), (int64_t)lens[i]);
        T_MEMEQ(src, dst, lens[i]);
        bool want_huge = huge && lens[i] >= (1u << 20);
        printf("  %zu bytes: MADV_HUGEPAGE %u, MADV_WILLNEED %u (THP %s)\n", lens[i],
               advised_huge, advised_willneed, huge ? "usable" : "off");
        T_EQ(advised_huge, want_huge ? 1u : 0u);
        T_EQ(advised_willneed, want_huge ? 0u : 1u);
    }
    ft__sys.madvise = keep;
    ft_file_close(f);
    free(src);
    free(dst);
}

/* The capabilities are what the code that picks and runs engines reads, so they must be
 * true: an engine that says it bypasses the page cache leaves an evicted file uncached after
 * a read and a write, the others leave it cached; one that needs O_DIRECT says so exactly
 * when it bypasses the cache; only cuFile moves device memory itself. */
static void case_caps_are_true(void)
{
    const char *path = t_path("caps.bin");
    size_t len = 8u << 20, pages = len / 4096;
    uint8_t *buf = t_alloc_misaligned(len, 0);
    T_TRUE(buf != NULL);
    t_fill_random(buf, len, 5);
    for (int e = FT_ENGINE_POSIX; e < FT_ENGINE_COUNT; e++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)e);
        T_TRUE(ops != NULL && ops->id == (ft_engine)e);
        bool bypass = ops->caps & FT__CAP_BYPASS_CACHE;
        T_EQ(!!(ops->caps & FT__CAP_NEEDS_DIRECT), bypass);
        T_EQ(!!(ops->caps & FT__CAP_DEVICE_MEMORY),
             e == FT_ENGINE_CUFILE || e == FT_ENGINE_CACHEDMA);
        const char *why;
        /* cuFile moves device memory only; cachedma moves host memory as mmap and posix */
        if (e == FT_ENGINE_CUFILE || !ft_engine_available(ctx, (ft_engine)e, &why)) {
            printf("  %s: not tried on host memory here\n", ops->name);
            continue;
        }
        for (int write = 0; write < 2; write++) {
            ft_file *f;
            T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                              0644), 0);
            ft_buf b = ft_host_buf(buf, len);
            ft_io_opts plain = {.engine = FT_ENGINE_POSIX};
            T_EQ(ft_write(f, &b, 0, &plain), (int64_t)len);
            T_EQ(ft_file_sync(f), 0);
            t_evict(path);
            size_t before = t_cached_pages(path, len);
            ft_io_opts o = {.engine = (ft_engine)e, .flags = write ? FT_IO_SYNC : 0};
            T_EQ(write ? ft_write(f, &b, 0, &o) : ft_read(f, &b, 0, &o), (int64_t)len);
            size_t after = t_cached_pages(path, len);
            T_EQ(ft_file_close(f), 0);
            printf("  %s %s: %zu of %zu pages cached (%zu before)\n", ops->name,
                   write ? "write" : "read", after, pages, before);
            if (before > pages / 10) {
                printf("  (eviction did not take here: not judged)\n");
                continue;
            }
            if (bypass)
                T_TRUE(after <= pages / 10);
            else
                T_TRUE(after >= pages * 9 / 10);
        }
    }
    t_free_misaligned(buf, 0);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(0);
    const t_case cases[] = {
        {"matrix: sizes x offsets x alignments, every engine", case_matrix},
        {"cross-engine: write with one, read with every other", case_cross_engine},
        {"reads at and past the end of the file", case_read_past_eof},
        {"one transfer above 2 GiB, every engine", case_above_2gib},
        {"mmap reads: MADV_HUGEPAGE from 1 MiB, MADV_WILLNEED below", case_mmap_read_advice},
        {"engine capabilities tell the truth (page cache, O_DIRECT, device memory)",
         case_caps_are_true},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
