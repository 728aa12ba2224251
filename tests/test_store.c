/* The spill store: round trips of every size and alignment through every engine, the ring
 * (small, so puts wait for it and large entries bypass it), the host tier, prefetch,
 * capacity limits, drop, the unlinked file (also after SIGKILL), injected I/O faults,
 * concurrent use, and the slot allocator. */
#include "testlib.h"
#include "../src/store/store.h" /* the store's file, and AUTO's state of it */

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ft_ctx *ctx;

/* A fresh empty directory for one store. */
static const char *store_dir(const char *name)
{
    const char *d = t_path(name);
    mkdir(d, 0755);
    return d;
}

static unsigned dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    unsigned n = 0;
    if (!d)
        return 9999;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.' || (de->d_name[1] && (de->d_name[1] != '.' || de->d_name[2]));
    closedir(d);
    return n;
}

static const size_t sizes[] = {0, 1, 17, 4095, 4096, 4097, 65536 + 3, (1u << 20) + 1,
                               3u << 20, (5u << 20) + 4093};
#define NSIZES (sizeof sizes / sizeof *sizes)

/* Put every size at misaligned addresses, wait, get back into other misaligned buffers:
 * first while the ring holds the written copies, then from the file. */
static void roundtrip(ft_engine engine, uint64_t staging, uint64_t tier)
{
    ft_store_opts o = {.dir = store_dir("rt"), .engine = engine, .staging_bytes = staging,
                       .host_cache_bytes = tier};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    T_EQ(dir_entries(o.dir), 0); /* the spill file has no name */
    uint8_t *src[NSIZES], *dst[NSIZES];
    uint64_t keys[NSIZES], total = 0;
    for (size_t i = 0; i < NSIZES; i++) {
        src[i] = t_alloc_misaligned(sizes[i] + 1, i * 7 % 4096);
        dst[i] = t_alloc_misaligned(sizes[i] + 1, i * 13 % 4096);
        t_fill_random(src[i], sizes[i], 100 + i);
        ft_buf b = ft_host_buf(src[i], sizes[i]);
        T_EQ(ft_store_put(s, &b, NULL, &keys[i]), 0);
        total += sizes[i];
    }
    T_EQ(ft_store_flush(s), 0);
    for (size_t i = 0; i < NSIZES; i++) {
        T_EQ(ft_store_poll(s, keys[i]), 1); /* flushed: every put has landed */
        T_EQ(ft_store_wait(s, keys[i]), 0);
        T_EQ(ft_store_released(s, keys[i]), 1);
        memset(src[i], 0xee, sizes[i]); /* the store must not read the source any more */
    }
    ft_store_stats st;
    for (size_t r = 0; r < 2; r++) { /* twice: a get does not consume the entry */
        if (r == 1) {
            T_EQ(ft_store_get_stats(s, &st), 0);
            uint64_t before = st.bytes_read;
            t_store_evict(s, staging + tier);
            T_EQ(ft_store_get_stats(s, &st), 0);
            T_EQ(st.bytes_read, before); /* evicting reads nothing */
        }
        for (size_t i = NSIZES; i-- > 0;) {
            ft_buf d = ft_host_buf(dst[i], sizes[i]);
            T_EQ(ft_store_get(s, keys[i], &d, NULL), 0);
        }
        for (size_t i = 0; i < NSIZES; i++) {
            T_EQ(ft_store_wait(s, keys[i]), 0);
            t_fill_random(src[i], sizes[i], 100 + i);
            T_MEMEQ(dst[i], src[i], sizes[i]);
            memset(dst[i], 0, sizes[i]);
        }
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.puts, NSIZES + (staging + tier) / (1u << 20));
    T_EQ(st.bytes_put, total + (staging + tier) / (1u << 20) * (1u << 20));
    T_EQ(st.bytes_got, 2 * total);
    T_EQ(st.entries, NSIZES);
    T_EQ(st.inflight_bytes, 0);
    T_TRUE(st.peak_inflight_bytes > 0);
    if (tier) { /* the fillers pushed every entry out of the tier, oldest first */
        T_EQ(st.host_resident, 0);
        T_TRUE(st.bytes_demoted > 0 && st.bytes_demoted <= st.bytes_written);
        T_TRUE(st.bytes_written <= st.bytes_put);
    } else {
        T_EQ(st.host_resident, 0);
        T_EQ(st.bytes_written, st.bytes_put); /* fillers included */
        T_TRUE(st.bytes_read >= total); /* the second round read every entry's slot */
    }
    for (size_t i = 0; i < NSIZES; i++) {
        T_EQ(ft_store_drop(s, keys[i]), 0);
        T_EQ(ft_store_drop(s, keys[i]), -ENOENT);
        t_free_misaligned(src[i], i * 7 % 4096);
        t_free_misaligned(dst[i], i * 13 % 4096);
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.entries, 0);
    T_EQ(st.file_used, 0);
    T_EQ(st.host_used, 0);
    ft_store_destroy(s);
    T_EQ(dir_entries(o.dir), 0);
}

static void case_engines(void)
{
    const ft_engine engines[] = {FT_ENGINE_AUTO, FT_ENGINE_POSIX, FT_ENGINE_DIRECT,
                                 FT_ENGINE_URING, FT_ENGINE_MMAP};
    for (size_t i = 0; i < sizeof engines / sizeof *engines; i++) {
        if (!ft_engine_available(ctx, engines[i], NULL))
            continue; /* the engine's own tests report why */
        roundtrip(engines[i], 16u << 20, 0);
        if (t_failures)
            return;
    }
}

/* A 2 MiB ring: puts of 3 and 5 MiB bypass it, the rest wait for space in turn. */
static void case_small_ring(void)
{
    roundtrip(FT_ENGINE_AUTO, 2u << 20, 0);
}

static void case_host_tier(void)
{
    roundtrip(FT_ENGINE_AUTO, 4u << 20, 6u << 20);
}

/* The sequence of test_gpu's device case in host memory, per engine: one entry in the tier,
 * one through the ring, one around it; fillers push the tier's entry to the file (flush waits
 * for that write too), and then a prefetch finds ring space: flushed, nothing holds it. */
static void case_tier_then_prefetch(void)
{
    const ft_engine engines[] = {FT_ENGINE_AUTO, FT_ENGINE_POSIX, FT_ENGINE_DIRECT};
    const size_t len[] = {8u << 20, (32u << 20) + 5, 96u << 20, 4097, 1};
    enum { N = sizeof len / sizeof *len };
    for (size_t k = 0; k < sizeof engines / sizeof *engines; k++) {
        ft_store_opts o = {.dir = store_dir("tierpf"), .engine = engines[k],
                           .staging_bytes = 64u << 20, .host_cache_bytes = 8u << 20};
        ft_store *s;
        T_EQ(ft_store_create(ctx, &s, &o), 0);
        uint8_t *src[N], *back = malloc(96u << 20);
        uint64_t keys[N];
        for (int i = 0; i < N; i++) {
            src[i] = malloc(len[i]);
            t_fill_random(src[i], len[i], 300 + (uint64_t)i);
            ft_buf b = ft_host_buf(src[i], len[i]);
            T_EQ(ft_store_put(s, &b, NULL, &keys[i]), 0);
        }
        for (int i = 0; i < N; i++)
            T_EQ(ft_store_wait(s, keys[i]), 0);
        T_EQ(ft_store_flush(s), 0);
        ft_store_stats st;
        T_EQ(ft_store_get_stats(s, &st), 0);
        /* the first entry filled the tier; the two small ones put last pushed it out, and
         * flush returned after its write */
        T_EQ(st.host_resident, 8192 + 4096);
        T_EQ(st.bytes_demoted, len[0]);
        T_EQ(ft_store_prefetch(s, keys[1]), 0);     /* its written copy is still in the ring */
        t_store_evict(s, o.staging_bytes + o.host_cache_bytes);
        T_EQ(ft_store_get_stats(s, &st), 0);
        T_EQ(st.host_resident, 0); /* the fillers (tier entries too) pushed out the rest */
        T_TRUE(st.bytes_demoted >= len[0] + len[3] + len[4]);
        T_EQ(ft_store_prefetch(s, keys[1]), 1);     /* and nothing holds the ring */
        for (int i = N - 1; i >= 0; i--) {
            memset(back, 0xa5, len[i]);
            ft_buf d = ft_host_buf(back, len[i]);
            T_EQ(ft_store_get(s, keys[i], &d, NULL), 0);
            T_EQ(ft_store_wait(s, keys[i]), 0);
            T_MEMEQ(back, src[i], len[i]);
            T_EQ(ft_store_drop(s, keys[i]), 0);
            free(src[i]);
        }
        free(back);
        ft_store_destroy(s);
    }
}

/* The host tier keeps the entries put last: a put that finds it full sends the oldest to the
 * file (their copies stay cached until the ring needs the space). A failed write of one
 * keeps it in memory, reported by the next flush. The memory is reserved, not taken. */
static void case_tier_demotes_oldest(void)
{
    enum { N = 8, MB = 1u << 20 };
    ft_store_opts o = {.dir = store_dir("tier"), .engine = FT_ENGINE_POSIX,
                       .staging_bytes = MB, .host_cache_bytes = 4 * MB};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    uint8_t *data = malloc((size_t)N * MB), *back = malloc(MB);
    t_fill_random(data, (size_t)N * MB, 21);
    uint64_t keys[N];
    ft_store_stats st;
    for (unsigned i = 0; i < N; i++) {
        ft_buf b = ft_host_buf(data + (size_t)i * MB, MB);
        T_EQ(ft_store_put(s, &b, NULL, &keys[i]), 0);
        T_EQ(ft_store_wait(s, keys[i]), 0);
    }
    T_EQ(ft_store_flush(s), 0); /* demotions are background writes: flush waits for them */
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.host_resident, 4ull * MB);
    T_EQ(st.host_budget, 4ull * MB);
    T_EQ(st.bytes_demoted, 4ull * MB);
    T_EQ(st.bytes_written, 4ull * MB); /* the first four, and only by demotion */
    T_EQ(st.host_pinned, 0);            /* no CUDA in this process: nothing pinned */
    for (unsigned i = N; i-- > 0;) {   /* newest first, as a backward pass */
        ft_buf d = ft_host_buf(back, MB);
        T_EQ(ft_store_get(s, keys[i], &d, NULL), 0);
        T_EQ(ft_store_wait(s, keys[i]), 0);
        T_MEMEQ(back, data + (size_t)i * MB, MB);
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    /* The ring (5 MiB) holds the tier's four and the copy of the last one demoted: only the
     * first three are read from the file. */
    T_EQ(st.bytes_read, 3ull * MB);
    /* A demotion whose write fails: the entry stays in memory, exact, and flush says so. */
    for (unsigned i = 0; i < N; i++)
        T_EQ(ft_store_drop(s, keys[i]), 0);
    t_fault_set(T_OP_PWRITE, T_FAULT_ERRNO, EIO, 1, 0);
    for (unsigned i = 0; i < 5; i++) {
        ft_buf b = ft_host_buf(data + (size_t)i * MB, MB);
        T_EQ(ft_store_put(s, &b, NULL, &keys[i]), 0);
        T_EQ(ft_store_wait(s, keys[i]), 0);
    }
    while (ft_store_get_stats(s, &st) == 0 && st.host_resident < 5ull * MB)
        usleep(1000);
    t_fault_clear();
    T_EQ(ft_store_flush(s), -EIO);
    for (unsigned i = 0; i < 5; i++) {
        ft_buf d = ft_host_buf(back, MB);
        T_EQ(ft_store_get(s, keys[i], &d, NULL), 0);
        T_EQ(ft_store_wait(s, keys[i]), 0);
        T_MEMEQ(back, data + (size_t)i * MB, MB);
        T_EQ(ft_store_drop(s, keys[i]), 0);
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.host_resident, 0);
    T_EQ(st.host_used, 0);
    ft_store_destroy(s);
    /* The default tier: a quarter of the memory available, reserved only. */
    o.host_cache_bytes = FT_STORE_HOST_AUTO;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_TRUE(st.host_budget >= (64ull << 20));
    T_EQ(st.host_used, 0);
    ft_store_destroy(s);
    /* No address space for the ring: a clear error, no file left. */
    t_fault_set(T_OP_MMAP, T_FAULT_ERRNO, ENOMEM, 1, 0);
    T_EQ(ft_store_create(ctx, &s, &o), -ENOMEM);
    T_TRUE(strstr(ft_last_error(), "cannot reserve") != NULL);
    t_fault_clear();
    T_EQ(dir_entries(o.dir), 0);
    o.host_cache_bytes = 1ull << 60;
    T_EQ(ft_store_create(ctx, &s, &o), -EINVAL);
    free(data);
    free(back);
}

static void case_prefetch(void)
{
    ft_store_opts o = {.dir = store_dir("pf"), .staging_bytes = 8u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    size_t n = (3u << 20) + 5;
    uint8_t *a = malloc(n), *b = malloc(n);
    t_fill_random(a, n, 7);
    ft_buf src = ft_host_buf(a, n), dst = ft_host_buf(b, n);
    uint64_t k;
    T_EQ(ft_store_put(s, &src, NULL, &k), 0);
    T_EQ(ft_store_wait(s, k), 0);
    T_EQ(ft_store_prefetch(s, k), 0); /* the written copy is still in the ring */
    t_store_evict(s, o.staging_bytes);
    T_EQ(ft_store_prefetch(s, k), 1);
    T_EQ(ft_store_wait(s, k), 0);
    ft_store_stats st;
    while (ft_store_get_stats(s, &st) == 0 && st.inflight_bytes)
        usleep(1000);
    T_EQ(st.bytes_prefetched, n);
    T_EQ(ft_store_prefetch(s, k), 0); /* already in memory */
    T_EQ(ft_store_get(s, k, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, k), 0);
    T_MEMEQ(a, b, n);
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.host_hits, 1);
    T_EQ(st.bytes_read, n); /* the prefetch's read only */
    /* A second entry fills the ring: the cached copy is evicted, the data stays right. */
    size_t big = 6u << 20;
    uint8_t *c = malloc(big);
    t_fill_random(c, big, 8);
    ft_buf cb = ft_host_buf(c, big);
    uint64_t k2;
    T_EQ(ft_store_put(s, &cb, NULL, &k2), 0);
    T_EQ(ft_store_wait(s, k2), 0);
    memset(b, 0, n);
    T_EQ(ft_store_get(s, k, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, k), 0);
    T_MEMEQ(a, b, n);
    ft_store_destroy(s);
    free(a);
    free(b);
    free(c);
}

/* Written copies stay in the ring: a get of a recent entry reads nothing from the file; a
 * put makes room by evicting the least recently used copy; a prefetch only evicts copies of
 * entries put before its own (read back newest first, later entries are wanted sooner). */
static void case_retained(void)
{
    enum { N = 5 };
    const size_t n = 2u << 20;
    ft_store_opts o = {.dir = store_dir("keep"), .staging_bytes = 4 * n};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    uint8_t *a[N], *b = malloc(n);
    uint64_t k[N];
    ft_buf dst = ft_host_buf(b, n);
    ft_store_stats st;
    for (int i = 0; i < 4; i++) {
        a[i] = malloc(n);
        t_fill_random(a[i], n, 40 + i);
        ft_buf src = ft_host_buf(a[i], n);
        T_EQ(ft_store_put(s, &src, NULL, &k[i]), 0);
    }
    T_EQ(ft_store_flush(s), 0);
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.bytes_written, 4 * n);
    T_EQ(st.host_used, 4 * n); /* all four copies kept */
    T_EQ(ft_store_get(s, k[3], &dst, NULL), 0);
    T_EQ(ft_store_wait(s, k[3]), 0);
    T_MEMEQ(a[3], b, n);
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.bytes_read, 0);
    T_EQ(st.host_hits, 1);
    /* A fifth put evicts the least recently used copy: entry 0's. */
    a[4] = malloc(n);
    t_fill_random(a[4], n, 44);
    ft_buf src4 = ft_host_buf(a[4], n);
    T_EQ(ft_store_put(s, &src4, NULL, &k[4]), 0);
    T_EQ(ft_store_flush(s), 0);
    T_EQ(ft_store_prefetch(s, k[1]), 0); /* still in memory */
    /* Entry 0 is on disk only; the ring holds copies of later entries: no room for it. */
    T_EQ(ft_store_prefetch(s, k[0]), -EBUSY);
    T_EQ(ft_store_drop(s, k[4]), 0); /* used and let go of, as a backward pass does */
    T_EQ(ft_store_prefetch(s, k[0]), 1);
    for (int i = 0; i < 4; i++) {
        memset(b, 0, n);
        T_EQ(ft_store_get(s, k[i], &dst, NULL), 0);
        T_EQ(ft_store_wait(s, k[i]), 0);
        T_MEMEQ(a[i], b, n);
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.bytes_read, n); /* entry 0's prefetch, nothing else */
    T_EQ(st.bytes_prefetched, n);
    T_EQ(st.host_hits, 5);
    ft_store_destroy(s);
    for (int i = 0; i < N; i++)
        free(a[i]);
    free(b);
}

/* Get entry @p key of @p s back into @p b (@p n bytes, zeroed first), waited for, and
 * compare it with @p want. */
static void get_back(ft_store *s, uint64_t key, uint8_t *b, size_t n, const uint8_t *want)
{
    memset(b, 0, n);
    ft_buf d = ft_host_buf(b, n);
    T_EQ(ft_store_get(s, key, &d, NULL), 0);
    T_EQ(ft_store_wait(s, key), 0);
    T_MEMEQ(want, b, n);
}

/* AUTO: the page cache while the file is within page_cache_bytes, then O_DIRECT for the
 * entries put from there on; slots of page-cache entries are reused by O_DIRECT ones while
 * neighbouring page-cache entries are read (readahead), and every entry reads back exact. */
static void case_page_cache_then_direct(void)
{
    if (!t_have_odirect()) {
        printf("  (skipped: no O_DIRECT on the test filesystem, AUTO stays on the page cache)\n");
        return;
    }
    enum { N = 40 };
    const size_t n = (3u << 20) + 5; /* larger than the ring: straight to and from the file */
    ft_store_opts o = {.dir = store_dir("pc"), .staging_bytes = 1u << 20,
                       .page_cache_bytes = 64u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    uint8_t *a[N], *b = malloc(n);
    uint64_t k[N];
    ft_cache_mode eng[N];
    ft_store_stats st;
    for (int i = 0; i < N; i++) {
        a[i] = malloc(n);
        t_fill_random(a[i], n, 60 + i);
        ft_buf src = ft_host_buf(a[i], n);
        T_EQ(ft_store_put(s, &src, NULL, &k[i]), 0);
        T_EQ(ft_store_get_stats(s, &st), 0);
        eng[i] = st.cache;
        T_EQ(st.engine, FT_ENGINE_AUTO);
        T_EQ(st.cache, st.file_size <= (64u << 20) ? FT_CACHE_KEEP : FT_CACHE_BYPASS);
    }
    T_EQ(eng[0], FT_CACHE_KEEP);
    T_EQ(eng[N - 1], FT_CACHE_BYPASS);
    T_EQ(ft_store_flush(s), 0);
    /* Even page-cache entries give their slots to new O_DIRECT entries, between reads of
     * their page-cache neighbours. */
    for (int round = 0; round < 3; round++) {
        for (int i = round % 2; i < N; i += 2) {
            if (eng[i] != FT_CACHE_KEEP)
                continue;
            T_EQ(ft_store_drop(s, k[i]), 0);
            t_fill_random(a[i], n, 1000 * (round + 1) + i);
            ft_buf src = ft_host_buf(a[i], n);
            T_EQ(ft_store_put(s, &src, NULL, &k[i]), 0);
            if (i + 1 < N)
                get_back(s, k[i + 1], b, n, a[i + 1]);
        }
        T_EQ(ft_store_flush(s), 0);
        for (int i = 0; i < N; i++)
            get_back(s, k[i], b, n, a[i]);
    }
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.cache, FT_CACHE_BYPASS);
    ft_store_destroy(s);
    for (int i = 0; i < N; i++)
        free(a[i]);
    free(b);
}

/* An AUTO store's transfers are AUTO's, among the arms of the kind its entries were put with
 * only (page-cache and O_DIRECT I/O of one slot are not coherent): a store within its page
 * cache share measures buffered arms alone, one past it O_DIRECT arms alone; every entry
 * reads back exact. */
static void case_auto_kinds(void)
{
    if (!t_have_odirect()) {
        printf("  (skipped: no O_DIRECT on the test filesystem, AUTO stays on the page cache)\n");
        return;
    }
    setenv("FASTENSOR_PROFILE", "off", 1);
    enum { N = 24 };
    const size_t n = (3u << 20) + 5; /* larger than the ring: straight to and from the file */
    uint8_t *a = malloc(N * n), *b = malloc(n);
    t_fill_random(a, N * n, 71);
    for (int kind = 0; kind < 2; kind++) {
        ft_ctx *own = t_ctx(2);
        ft_store_opts o = {.dir = store_dir(kind ? "kind-direct" : "kind-cache"),
                           .staging_bytes = 1u << 20,
                           .page_cache_bytes = kind ? 1u << 20 : 1u << 30,
                           .capacity = kind ? 128u << 20 : 0};
        ft_store *s;
        T_EQ(ft_store_create(own, &s, &o), 0);
        uint64_t k[N];
        for (int i = 0; i < N; i++) {
            ft_buf src = ft_host_buf(a + i * n, n);
            T_EQ(ft_store_put(s, &src, NULL, &k[i]), 0);
        }
        T_EQ(ft_store_flush(s), 0);
        for (int i = 0; i < N; i++)
            get_back(s, k[i], b, n, a + i * n);
        ft_store_stats st;
        T_EQ(ft_store_get_stats(s, &st), 0);
        T_EQ(st.engine, FT_ENGINE_AUTO);
        T_EQ(st.cache, kind ? FT_CACHE_BYPASS : FT_CACHE_KEEP);
        ft__selector *sel = atomic_load(&s->file->au->sel);
        ft_store_destroy(s); /* (its file's last samples recorded as it closes) */
        T_TRUE(sel != NULL);
        unsigned sampled = 0, wrong = 0;
        for (unsigned i = 0; sel && i < FT__SEL_KEYS; i++) {
            ft__sel_entry *e = ft__sel_entry_at(sel, i, false);
            for (unsigned arm = 0; e && arm < ft__narms; arm++) {
                if (!e->arm[arm].n)
                    continue;
                bool bypass = ft__engine_get(ft__arms[arm].engine)->caps & FT__CAP_BYPASS_CACHE;
                sampled++;
                if (bypass != (kind == 1)) {
                    wrong++;
                    printf("  %s store: arm %s sampled\n", kind ? "O_DIRECT" : "page-cache",
                           ft__arms[arm].label);
                }
            }
        }
        printf("  %s store: %u arms sampled, %u of the other kind\n",
               kind ? "O_DIRECT" : "page-cache", sampled, wrong);
        T_TRUE(sampled > 0);
        T_EQ(wrong, 0u);
        ft_ctx_destroy(own);
    }
    unsetenv("FASTENSOR_PROFILE");
    free(a);
    free(b);
}

/* A prefetch while the put is still writing keeps the ring copy: the get is a memory copy. */
static void case_prefetch_during_write(void)
{
    ft_store_opts o = {.dir = store_dir("pfw"), .staging_bytes = 16u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    size_t n = (8u << 20) + 3;
    uint8_t *a = malloc(n), *b = malloc(n);
    t_fill_random(a, n, 17);
    ft_buf src = ft_host_buf(a, n), dst = ft_host_buf(b, n);
    uint64_t k;
    t_fault_set(T_OP_PWRITE, T_FAULT_EINTR, 0, 1, 64); /* slow the write down a little */
    T_EQ(ft_store_put(s, &src, NULL, &k), 0);
    T_EQ(ft_store_prefetch(s, k), 1);
    T_EQ(ft_store_wait(s, k), 0);
    ft_store_stats st;
    while (ft_store_get_stats(s, &st) == 0 && st.inflight_bytes)
        usleep(1000); /* a prefetch, if it came to one, is done */
    t_fault_clear();
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.bytes_written, n);
    T_EQ(st.host_used, 8u << 20 | 4096); /* the copy stayed */
    T_EQ(ft_store_get(s, k, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, k), 0);
    T_MEMEQ(a, b, n);
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.host_hits, 1);
    /* Normally the copy was kept (nothing read back); if the write won the race, the
     * prefetch read it back instead. */
    T_TRUE(st.bytes_read == 0 || st.bytes_prefetched == n);
    ft_store_destroy(s);
    free(a);
    free(b);
}

/* Entries dropped at once: each is either written or skipped, never both, never lost. */
static void case_drop_before_write(void)
{
    ft_store_opts o = {.dir = store_dir("dbw"), .staging_bytes = 64u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    enum { N = 32 };
    size_t n = 1u << 20;
    uint8_t *a = malloc(n);
    t_fill_random(a, n, 23);
    ft_buf src = ft_host_buf(a, n);
    uint64_t keep;
    T_EQ(ft_store_put(s, &src, NULL, &keep), 0);
    for (int i = 0; i < N; i++) {
        uint64_t k;
        T_EQ(ft_store_put(s, &src, NULL, &k), 0);
        T_EQ(ft_store_drop(s, k), 0);
    }
    T_EQ(ft_store_flush(s), 0);
    ft_store_stats st;
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.writes_skipped + st.bytes_written / n, N + 1);
    T_TRUE(st.bytes_written >= n); /* the kept entry was written */
    T_EQ(st.entries, 1);
    uint8_t *b = calloc(1, n);
    ft_buf dst = ft_host_buf(b, n);
    T_EQ(ft_store_get(s, keep, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, keep), 0);
    T_MEMEQ(a, b, n);
    ft_store_destroy(s);
    free(a);
    free(b);
}

static void case_capacity(void)
{
    ft_store_opts o = {.dir = store_dir("cap"), .capacity = 1u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    uint8_t *a = malloc(1u << 20), *b = malloc(1u << 20);
    t_fill_random(a, 1u << 20, 9);
    ft_buf half = ft_host_buf(a, 512u << 10), whole = ft_host_buf(a, 1u << 20);
    uint64_t k1, k2, k3;
    T_EQ(ft_store_put(s, &half, NULL, &k1), 0);
    T_EQ(ft_store_put(s, &whole, NULL, &k2), -ENOSPC);
    T_TRUE(strstr(ft_last_error(), "spill store full") != NULL);
    ft_buf got = ft_host_buf(b, 512u << 10);
    T_EQ(ft_store_get(s, k1, &got, NULL), 0); /* what was there is intact */
    T_EQ(ft_store_wait(s, k1), 0);
    T_MEMEQ(a, b, 512u << 10);
    T_EQ(ft_store_drop(s, k1), 0);
    T_EQ(ft_store_put(s, &whole, NULL, &k3), 0); /* the dropped slot is free again */
    T_EQ(ft_store_wait(s, k3), 0);
    ft_store_stats st;
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.file_used, 1u << 20);
    T_EQ(st.file_size, 1u << 20);
    ft_store_destroy(s);
    free(a);
    free(b);
}

static void case_bad_input(void)
{
    ft_store *s;
    ft_store_opts bad = {.engine = (ft_engine)99};
    T_EQ(ft_store_create(ctx, &s, &bad), -EINVAL);
    ft_store_opts nodir = {.dir = "/nonexistent/fastensor"};
    T_EQ(ft_store_create(ctx, &s, &nodir), -ENOENT);
    T_TRUE(strstr(ft_last_error(), "/nonexistent/fastensor") != NULL);
    ft_store_opts o = {.dir = store_dir("bad")};
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    T_EQ(ft_store_ring_limit(s), 256u << 20); /* the default ring */
    ft_store_stats st0;
    T_EQ(ft_store_get_stats(s, &st0), 0); /* AUTO: the page cache while the file is small */
    T_EQ(st0.engine, FT_ENGINE_AUTO);
    T_EQ(st0.cache, FT_CACHE_KEEP);
    void *stream = NULL;
    if (ft_cuda_available(NULL)) {
        T_EQ(ft_store_stream(s, 0, &stream), 0);
        T_TRUE(stream != NULL);
        T_EQ(ft_store_stream(s, 999, &stream), -ENODEV);
    } else {
        T_EQ(ft_store_stream(s, 0, &stream), -ENODEV);
    }
    char buf[64] = "0123456789";
    ft_buf b = ft_host_buf(buf, 10), wrong = ft_host_buf(buf, 11), null = ft_host_buf(NULL, 5);
    uint64_t k;
    T_EQ(ft_store_put(s, &null, NULL, &k), -EFAULT);
    T_EQ(ft_store_put(s, &b, NULL, NULL), -EINVAL);
    T_EQ(ft_store_put(s, &b, NULL, &k), 0);
    T_EQ(ft_store_get(s, k, &wrong, NULL), -EINVAL);
    T_EQ(ft_store_get(s, k + 1, &b, NULL), -ENOENT);
    T_EQ(ft_store_wait(s, 12345), -ENOENT);
    T_EQ(ft_store_prefetch(s, 12345), -ENOENT);
    T_EQ(ft_store_poll(s, 12345), -ENOENT);
    T_EQ(ft_store_released(s, 12345), -ENOENT);
    T_EQ(ft_store_wait(s, k), 0);
    T_EQ(ft_store_poll(s, k), 1);
    ft_buf empty = ft_host_buf(buf, 0);
    uint64_t k0;
    T_EQ(ft_store_put(s, &empty, NULL, &k0), 0);
    T_EQ(ft_store_get(s, k0, &empty, NULL), 0);
    T_EQ(ft_store_wait(s, k0), 0);
    ft_store_destroy(s);
    ft_store_destroy(NULL);
}

/* Faults: a failed write is reported at wait and at get; a failed read at wait; a full
 * filesystem at put; the store keeps working for other entries. */
static void case_faults(void)
{
    ft_store_opts o = {.dir = store_dir("fault"), .engine = FT_ENGINE_POSIX,
                       .staging_bytes = 1u << 20};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    size_t n = 256u << 10;
    uint8_t *a = malloc(n), *b = malloc(n);
    t_fill_random(a, n, 11);
    ft_buf src = ft_host_buf(a, n), dst = ft_host_buf(b, n);
    uint64_t bad, good;
    t_fault_set(T_OP_PWRITE, T_FAULT_ERRNO, EIO, 1, 0);
    T_EQ(ft_store_put(s, &src, NULL, &bad), 0);
    T_EQ(ft_store_flush(s), -EIO); /* reported once by flush, and at the entry */
    T_EQ(ft_store_flush(s), 0);
    T_EQ(ft_store_wait(s, bad), -EIO);
    t_fault_clear();
    T_EQ(ft_store_get(s, bad, &dst, NULL), -EIO);
    T_EQ(ft_store_put(s, &src, NULL, &good), 0);
    T_EQ(ft_store_wait(s, good), 0);
    t_store_evict(s, o.staging_bytes); /* gets read the file */
    t_fault_set(T_OP_PREAD, T_FAULT_ERRNO, EIO, 1, 0);
    T_EQ(ft_store_get(s, good, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, good), -EIO);
    t_fault_clear();
    T_EQ(ft_store_get(s, good, &dst, NULL), 0); /* the next get works */
    T_EQ(ft_store_wait(s, good), 0);
    T_MEMEQ(a, b, n);
    /* Short transfers and EINTR are retried, not errors. */
    t_fault_set(T_OP_PWRITE, T_FAULT_SHORT, 0, 1, 3);
    t_fault_set(T_OP_PREAD, T_FAULT_EINTR, 0, 1, 3);
    uint64_t k;
    T_EQ(ft_store_put(s, &src, NULL, &k), 0);
    T_EQ(ft_store_wait(s, k), 0);
    t_store_evict(s, o.staging_bytes);
    memset(b, 0, n);
    T_EQ(ft_store_get(s, k, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, k), 0);
    T_TRUE(t_fault_clear() > 0);
    T_MEMEQ(a, b, n);
    /* The filesystem is full when the file must grow: a clear error, nothing lost. */
    uint8_t *big = malloc(80u << 20);
    memset(big, 1, 80u << 20);
    ft_buf bb = ft_host_buf(big, 80u << 20);
    t_fault_set(T_OP_FALLOCATE, T_FAULT_ERRNO, ENOSPC, 1, 0);
    T_EQ(ft_store_put(s, &bb, NULL, &k), -ENOSPC);
    T_TRUE(strstr(ft_last_error(), "cannot grow the spill file") != NULL);
    t_fault_clear();
    memset(b, 0, n);
    T_EQ(ft_store_get(s, good, &dst, NULL), 0);
    T_EQ(ft_store_wait(s, good), 0);
    T_MEMEQ(a, b, n);
    ft_store_destroy(s);
    free(a);
    free(b);
    free(big);
}

/* The child of case_sigkill (this binary run again, so no threads cross a fork): make a
 * store holding data, say so on stdout, wait to be killed. */
static int sigkill_child(const char *dir)
{
    ft_ctx *c = t_ctx(2);
    ft_store *s;
    ft_store_opts o = {.dir = dir};
    static uint8_t data[1u << 20];
    ft_buf b = ft_host_buf(data, sizeof data);
    uint64_t k;
    if (ft_store_create(c, &s, &o) < 0 || ft_store_put(s, &b, NULL, &k) < 0 ||
        ft_store_wait(s, k) < 0)
        return 3;
    if (write(1, "r", 1) != 1)
        return 4;
    for (;;)
        pause();
}

/* A process killed while its store holds data leaves no file behind. */
static void case_sigkill(void)
{
    const char *dir = store_dir("kill");
    int pipefd[2];
    T_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 1);
        execl("/proc/self/exe", "test_store", "--sigkill-child", dir, (char *)NULL);
        _exit(5);
    }
    close(pipefd[1]);
    char c = 0;
    ssize_t got = read(pipefd[0], &c, 1);
    close(pipefd[0]);
    if (got != 1) {
        int status = 0;
        waitpid(pid, &status, 0);
        T_FAIL("the child did not get ready (exit status %d)", WEXITSTATUS(status));
    }
    T_EQ(dir_entries(dir), 0);
    kill(pid, SIGKILL);
    int status;
    T_EQ(waitpid(pid, &status, 0), pid);
    T_TRUE(WIFSIGNALED(status));
    T_EQ(dir_entries(dir), 0);
}

typedef struct {
    ft_store *s;
    unsigned id;
    int failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    enum { N = 24 };
    uint64_t keys[N];
    size_t len[N];
    uint8_t *data[N];
    for (unsigned i = 0; i < N; i++) {
        len[i] = 4096 * (i % 7) + 1000 * w->id + i;
        data[i] = malloc(len[i] + 1);
        t_fill_random(data[i], len[i], w->id * 1000 + i);
        ft_buf b = ft_host_buf(data[i], len[i]);
        if (ft_store_put(w->s, &b, NULL, &keys[i]) < 0)
            w->failures++;
    }
    for (unsigned i = N; i-- > 0;) { /* reverse order, like a backward pass */
        uint8_t *got = malloc(len[i] + 1);
        ft_buf d = ft_host_buf(got, len[i]);
        ft_store_prefetch(w->s, keys[i ? i - 1 : 0]);
        if (ft_store_get(w->s, keys[i], &d, NULL) < 0 || ft_store_wait(w->s, keys[i]) < 0 ||
            memcmp(got, data[i], len[i]) != 0 || ft_store_drop(w->s, keys[i]) < 0)
            w->failures++;
        free(got);
        free(data[i]);
    }
    return NULL;
}

static void case_threads(void)
{
    ft_store_opts o = {.dir = store_dir("mt"), .staging_bytes = 256u << 10,
                       .host_cache_bytes = 128u << 10};
    ft_store *s;
    T_EQ(ft_store_create(ctx, &s, &o), 0);
    worker w[4];
    pthread_t th[4];
    for (unsigned i = 0; i < 4; i++) {
        w[i] = (worker){s, i, 0};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (unsigned i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        T_EQ(w[i].failures, 0);
    }
    /* a demotion a put started may still be writing an entry its worker has dropped since:
     * its copy is held until the write ends (a flush waits for demotions) */
    T_EQ(ft_store_flush(s), 0);
    ft_store_stats st;
    T_EQ(ft_store_get_stats(s, &st), 0);
    T_EQ(st.entries, 0);
    T_EQ(st.host_used, 0);
    ft_store_destroy(s);
}

/* The slot allocator against a bitmap model: no overlap, everything merges back. */
static void case_extents(void)
{
    enum { UNITS = 512, OPS = 20000 };
    ft__extents e;
    T_EQ(ft__extents_init(&e, UNITS), 0);
    unsigned char used[UNITS] = {0};
    struct { int64_t off; uint64_t len; } live[UNITS];
    unsigned nlive = 0;
    uint64_t seed = 42;
    for (unsigned op = 0; op < OPS; op++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        if ((seed >> 33) % 3 && nlive < UNITS) {
            uint64_t len = 1 + (seed >> 40) % 24;
            int64_t off = ft__extents_alloc(&e, len);
            if (off == -ENOSPC) {
                T_TRUE(ft__extents_largest(&e) < len);
                continue;
            }
            T_TRUE(off >= 0 && (uint64_t)off + len <= UNITS);
            for (uint64_t u = 0; u < len; u++) {
                T_EQ(used[off + u], 0);
                used[off + u] = 1;
            }
            live[nlive].off = off;
            live[nlive++].len = len;
        } else if (nlive) {
            unsigned i = (unsigned)((seed >> 20) % nlive);
            for (uint64_t u = 0; u < live[i].len; u++)
                used[live[i].off + u] = 0;
            ft__extents_free(&e, (uint64_t)live[i].off, live[i].len);
            live[i] = live[--nlive];
        }
    }
    while (nlive) {
        nlive--;
        ft__extents_free(&e, (uint64_t)live[nlive].off, live[nlive].len);
    }
    T_EQ(e.used, 0);
    T_EQ(e.n, 1);
    T_EQ(ft__extents_largest(&e), UNITS);
    T_EQ(ft__extents_grow_need(&e, 10), 10);
    T_EQ(ft__extents_grow(&e, UNITS * 2), 0);
    T_EQ(e.n, 1);
    T_EQ(ft__extents_largest(&e), UNITS * 2);
    ft__extents_fini(&e);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--sigkill-child") == 0)
        return sigkill_child(argv[2]);
    ctx = t_ctx(4);
    const t_case cases[] = {
        {"slot allocator against a model", case_extents},
        {"every size and alignment through every engine", case_engines},
        {"AUTO's transfers stay within their entries' kind", case_auto_kinds},
        {"small ring: puts wait, large entries bypass it", case_small_ring},
        {"host tier keeps entries in memory", case_host_tier},
        {"a full host tier sends its oldest entries to the file", case_tier_demotes_oldest},
        {"tier, ring and file entries, eviction, then prefetch", case_tier_then_prefetch},
        {"prefetch into memory, eviction", case_prefetch},
        {"prefetch while the put writes keeps the copy", case_prefetch_during_write},
        {"written copies stay in the ring; eviction order", case_retained},
        {"AUTO: page cache, then O_DIRECT past page_cache_bytes", case_page_cache_then_direct},
        {"entries dropped before their write are not written", case_drop_before_write},
        {"capacity limit and drop", case_capacity},
        {"bad input gets clear errors", case_bad_input},
        {"injected faults", case_faults},
        {"no file left after SIGKILL", case_sigkill},
        {"4 threads put, prefetch, get, drop", case_threads},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
