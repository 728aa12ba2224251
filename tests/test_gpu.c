/* Device memory: round trips for every engine over the size x offset x alignment matrix,
 * host/device mixes, several threads and streams at once, and stream ordering (a kernel-free
 * check with cuMemsetD8Async). Skips (77) where there is no CUDA driver or device. */
#include "testlib.h"
#include "../src/gpu/cuda.h"
#include "../src/engine/engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

static ft_ctx *ctx;
static bool cufile_ok = true;
static const ft_engine engines[] = {FT_ENGINE_POSIX,  FT_ENGINE_DIRECT, FT_ENGINE_URING,
                                    FT_ENGINE_MMAP,   FT_ENGINE_CUFILE, FT_ENGINE_CACHEDMA,
                                    FT_ENGINE_AUTO};
#define N_ENGINES (sizeof engines / sizeof *engines)

/* Write from device memory with @p we, read back into device memory with @p re. */
static void device_round_trip(ft_engine we, ft_engine re, size_t size, uint64_t off,
                              size_t mis, uint64_t seed)
{
    if (!cufile_ok && (we == FT_ENGINE_CUFILE || re == FT_ENGINE_CUFILE))
        return;
    uint8_t *host = malloc(size + 1), *back = malloc(size + 1);
    uint8_t *dev = NULL;
    T_EQ(ft_cuda_alloc(0, size + mis + 1, (void **)&dev), 0);
    t_fill_random(host, size, seed);
    T_EQ(ft_cuda_copy(dev + mis, host, size), 0);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("gpu.bin"), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                      FT_OPEN_TRUNC, 0644), 0);
    ft_buf b = {dev + mis, size, FT_MEM_CUDA, 0};
    ft_io_opts wo = {.engine = we}, ro = {.engine = re};
    int64_t w = ft_write(f, &b, off, &wo);
    if (w == -EOPNOTSUPP && we == FT_ENGINE_CUFILE) {
        printf("  note: cuFile unusable here (%s): cufile cases skipped\n", ft_last_error());
        cufile_ok = false;
        ft_file_close(f);
        ft_cuda_free(dev);
        free(host);
        free(back);
        return;
    }
    /* clear the device buffer, then read into it */
    memset(back, 0x5A, size);
    if (size)
        T_EQ(ft_cuda_copy(dev + mis, back, size), 0);
    int64_t r = ft_read(f, &b, off, &ro);
    ft_file_close(f);
    char what[128];
    snprintf(what, sizeof what, "%s->%s size %zu off %llu mis %zu", ft_engine_name(we),
             ft_engine_name(re), size, (unsigned long long)off, mis);
    if (w != (int64_t)size || r != (int64_t)size)
        T_FAIL("%s: write %lld read %lld", what, (long long)w, (long long)r);
    if (size)
        T_EQ(ft_cuda_copy(back, dev + mis, size), 0);
    size_t at = t_first_diff(host, back, size);
    if (at != (size_t)-1)
        T_FAIL("%s: differs at byte %zu", what, at);
    ft_cuda_free(dev);
    free(host);
    free(back);
}

static void case_matrix(void)
{
    static const size_t sizes[] = {0, 1, 511, 4096, 4097, (1u << 20) + 3, (64u << 20) + 5};
    static const uint64_t offsets[] = {0, 1, 4095, 4096, (5ull << 30) + 7};
    static const size_t mis[] = {0, 1, 513};
    uint64_t seed = 1;
    int before = t_failures;
    for (size_t e = 0; e < N_ENGINES; e++)
        for (size_t s = 0; s < 7; s++)
            for (size_t o = 0; o < 5; o++)
                for (size_t m = 0; m < 3; m++) {
                    if (sizes[s] > (8u << 20) && m == 2)
                        continue;
                    device_round_trip(engines[e], engines[e], sizes[s], offsets[o], mis[m],
                                      seed++);
                    if (t_failures - before > 10)
                        return;
                }
}

static void case_cross_and_mixed(void)
{
    uint64_t seed = 500;
    for (size_t w = 0; w < N_ENGINES; w++)
        for (size_t r = 0; r < N_ENGINES; r++)
            device_round_trip(engines[w], engines[r], (3u << 20) + 7, 4095, 1, seed++);
    /* host -> file -> device and device -> file -> host */
    size_t n = (5u << 20) + 3;
    uint8_t *host = malloc(n), *back = malloc(n), *dev;
    T_EQ(ft_cuda_alloc(0, n, (void **)&dev), 0);
    t_fill_random(host, n, 77);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("mix.bin"), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                      0644), 0);
    ft_buf hb = ft_host_buf(host, n), db = {dev, n, FT_MEM_CUDA, 0};
    T_EQ(ft_write(f, &hb, 7, NULL), n);
    T_EQ(ft_read(f, &db, 7, NULL), n);
    T_EQ(ft_cuda_copy(back, dev, n), 0);
    T_MEMEQ(host, back, n);
    /* a device pointer passed as HOST memory is recognised, not memcpy'd */
    ft_buf lying = ft_host_buf(dev, n);
    T_EQ(ft_write(f, &lying, 9999, NULL), n);
    memset(back, 0, n);
    ft_buf bb = ft_host_buf(back, n);
    T_EQ(ft_read(f, &bb, 9999, NULL), n);
    T_MEMEQ(host, back, n);
    ft_file_close(f);
    ft_cuda_free(dev);
    free(host);
    free(back);
}

typedef struct worker {
    int id, failures;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    if (ft__cuda_enter(0) < 0) {
        w->failures++;
        return NULL;
    }
    CUstream s;
    ft__cu.StreamCreate(&s, FT_CU_STREAM_NON_BLOCKING);
    size_t n = (8u << 20) + (size_t)w->id;
    uint8_t *host = malloc(n), *back = malloc(n), *dev;
    ft_cuda_alloc(0, n, (void **)&dev);
    t_fill_random(host, n, (uint64_t)w->id + 900);
    ft_cuda_copy(dev, host, n);
    char name[32];
    snprintf(name, sizeof name, "thr-%d.bin", w->id);
    ft_file *f;
    if (ft_file_open(ctx, &f, t_path(name), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                     0644) < 0) {
        w->failures++;
        return NULL;
    }
    for (int round = 0; round < 4; round++) {
        ft_io_opts o = {.engine = engines[(w->id + round) % 4], .stream = s};
        ft_buf db = {dev, n, FT_MEM_CUDA, 0};
        ft_req *req;
        if (ft_submit_write(f, &db, (uint64_t)round * n, &o, &req) < 0 ||
            ft_req_wait(req) != (int64_t)n)
            w->failures++;
        ft_req_free(req);
        ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)dev, 0, n, s);
        if (ft_read(f, &db, (uint64_t)round * n, &o) != (int64_t)n)
            w->failures++;
        ft_cuda_copy(back, dev, n);
        if (memcmp(host, back, n))
            w->failures++;
    }
    ft_file_close(f);
    ft_cuda_free(dev);
    ft__cu.StreamDestroy(s);
    ft__cuda_leave();
    free(host);
    free(back);
    return NULL;
}

static void case_threads_and_streams(void)
{
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){.id = i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        T_EQ(w[i].failures, 0);
}

/* The transfer must follow the work already queued on the caller's stream. */
static void case_stream_order(void)
{
    T_EQ(ft__cuda_enter(0), 0);
    CUstream s;
    T_EQ(ft__cu.StreamCreate(&s, FT_CU_STREAM_NON_BLOCKING), 0);
    size_t n = 512u << 20; /* long enough for a missing wait to show */
    uint8_t *dev, *host = malloc(n), *expect = malloc(n);
    T_EQ(ft_cuda_alloc(0, n, (void **)&dev), 0);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("order.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                        FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    /* every engine (cufile has no stream of its own: it waits on the host), then the
     * asynchronous API (the stream's order is taken at submit) */
    const ft_engine order[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT, FT_ENGINE_URING,
                               FT_ENGINE_CUFILE, FT_ENGINE_MMAP, FT_ENGINE_CACHEDMA,
                               FT_ENGINE_AUTO};
    const int rounds = (int)(sizeof order / sizeof *order);
    for (int round = 0; round < rounds; round++) {
        if (order[round] == FT_ENGINE_CUFILE && !cufile_ok)
            continue;
        unsigned char v = (unsigned char)(0x10 + round);
        /* write: the memset queued on s must land before the data leaves the device */
        T_EQ(ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)dev, v, n, s), 0);
        ft_buf db = {dev, n, FT_MEM_CUDA, 0};
        ft_io_opts o = {.engine = order[round], .stream = s};
        if (round < rounds - 1) {
            T_EQ(ft_write(f, &db, 0, &o), n);
        } else {
            ft_req *rq;
            T_EQ(ft_submit_write(f, &db, 0, &o, &rq), 0);
            T_EQ(ft_req_wait(rq), n);
            ft_req_free(rq);
        }
        ft_buf hb = ft_host_buf(host, n);
        T_EQ(ft_read(f, &hb, 0, NULL), n);
        memset(expect, v, n);
        T_MEMEQ(expect, host, n);
        /* read: a memset queued on s before the read must not overwrite what it brings */
        T_EQ(ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)dev, 0xEE, n, s), 0);
        T_EQ(ft_read(f, &db, 0, &o), n);
        T_EQ(ft__cu.StreamSynchronize(s), 0);
        T_EQ(ft_cuda_copy(host, dev, n), 0);
        T_MEMEQ(expect, host, n);
    }
    ft_file_close(f);
    ft_cuda_free(dev);
    ft__cu.StreamDestroy(s);
    ft__cuda_leave();
    free(host);
    free(expect);
}

static void case_checkpoint_on_device(void)
{
    size_t n = (3u << 20) + 4;
    uint8_t *host = malloc(n), *back = malloc(n), *dev, *ddst;
    t_fill_random(host, n, 4242);
    T_EQ(ft_cuda_alloc(0, n, (void **)&dev), 0);
    T_EQ(ft_cuda_copy(dev, host, n), 0);
    uint64_t shape[1] = {n / 4};
    ft_tensor t = {"w", FT_DTYPE_F32, 1, shape, {dev, n, FT_MEM_CUDA, 0}};
    const char *path = t_path("dev.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, &t, 1, NULL), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_cuda_alloc(0, n, (void **)&ddst), 0);
    for (int verify = 0; verify < 2; verify++) {
        ft_buf d = {ddst, n, FT_MEM_CUDA, 0};
        ft_load_opts lo = {.flags = verify ? FT_LOAD_VERIFY : 0};
        T_EQ(ft_ckpt_load_shard(c, 0, &d, &lo), n);
        T_EQ(ft_cuda_copy(back, ddst, n), 0);
        T_MEMEQ(host, back, n);
    }
    ft_ckpt_close(c);
    ft_cuda_free(dev);
    ft_cuda_free(ddst);
    free(host);
    free(back);
}

/* A cold load into device memory (engine AUTO): bytes exact over several parts and an odd
 * end, whichever arm AUTO takes, the shard cached afterwards where the cache mode keeps it
 * and left out where it bypasses the cache. A context that knows nothing (no profile) takes
 * the fill arm for it (read into the page cache in pieces, each part copied to the device
 * as it arrives), and a failed readahead is that load's error. */
static void case_checkpoint_cold_on_device(void)
{
    size_t n = (72u << 20) + 4; /* more than one part of 64 MiB */
    uint8_t *host = malloc(n), *back = malloc(n), *ddst;
    t_fill_random(host, n, 777);
    uint64_t shape[1] = {n};
    ft_tensor t = {"w", FT_DTYPE_U8, 1, shape, ft_host_buf(host, n)};
    const char *path = t_path("cold-dev.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, &t, 1, NULL), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_cuda_alloc(0, n, (void **)&ddst), 0);
    static const struct { ft_cache_mode mode; int cached; } runs[] = {
        {FT_CACHE_KEEP, 1}, {FT_CACHE_AUTO, 1}, {FT_CACHE_BYPASS, 0}};
    for (unsigned i = 0; i < sizeof runs / sizeof *runs; i++) {
        if (!t_evict(path)) {
            printf("  (eviction did not take here: not judged)\n");
            break;
        }
        memset(back, 0, n);
        T_EQ(ft_cuda_copy(ddst, back, n), 0);
        ft_buf d = {ddst, n, FT_MEM_CUDA, 0};
        ft_load_opts lo = {.cache = runs[i].mode};
        T_EQ(ft_ckpt_load_shard(c, 0, &d, &lo), n);
        T_EQ(ft_cuda_copy(back, ddst, n), 0);
        T_MEMEQ(host, back, n);
        if (runs[i].cached)
            T_EQ(ft_ckpt_shard_cached(c, 0), 1);
    }
    ft_ckpt_close(c);
    const char *profile = getenv("FASTENSOR_PROFILE");
    char *kept = profile ? strdup(profile) : NULL;
    setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *fresh = t_ctx(0);
    T_EQ(ft_ckpt_open(fresh, &c, path), 0);
    if (t_evict(path)) {
        t_fault_set(T_OP_FADVISE, T_FAULT_ERRNO, EIO, 3, 0);
        ft_buf d = {ddst, n, FT_MEM_CUDA, 0};
        ft_load_opts lo = {.cache = FT_CACHE_KEEP};
        T_EQ(ft_ckpt_load_shard(c, 0, &d, &lo), -EIO);
        T_TRUE(strstr(ft_last_error(), "readahead") != NULL);
        T_TRUE(t_fault_clear() >= 1);
    }
    ft_ckpt_close(c);
    ft_ctx_destroy(fresh);
    if (kept)
        setenv("FASTENSOR_PROFILE", kept, 1);
    else
        unsetenv("FASTENSOR_PROFILE");
    free(kept);
    ft_cuda_free(ddst);
    free(host);
    free(back);
}

/* The spill store with device memory: puts ordered after the producer's stream, gets ordered
 * after the consumer's queued work and before its later work; ring, oversize, prefetched and
 * host-tier entries. */
static void store_on_device(ft_engine engine)
{
    T_EQ(ft__cuda_enter(0), 0);
    CUstream s;
    T_EQ(ft__cu.StreamCreate(&s, FT_CU_STREAM_NON_BLOCKING), 0);
    ft_store_opts so = {.dir = t_dir(), .staging_bytes = 64u << 20,
                        .host_cache_bytes = 8u << 20, .engine = engine};
    ft_store *st;
    T_EQ(ft_store_create(ctx, &st, &so), 0);
    /* 8 MiB goes to the host tier (and to the file once the two small entries put after it
     * fill the tier), 32 MiB through the ring, 96 MiB around it. */
    const size_t sizes[] = {8u << 20, (32u << 20) + 5, 96u << 20, 4097, 1};
    enum { N = sizeof sizes / sizeof *sizes };
    uint8_t *dev[N], *dst, *host = malloc(96u << 20), *expect = malloc(96u << 20);
    uint64_t keys[N];
    T_EQ(ft_cuda_alloc(0, (96u << 20) + 64, (void **)&dst), 0);
    for (int i = 0; i < N; i++) {
        T_EQ(ft_cuda_alloc(0, sizes[i] + 64, (void **)&dev[i]), 0);
        uint8_t *p = dev[i] + (i * 3) % 64;
        /* the producer's work: a fill queued on s, not yet done when the put is called */
        T_EQ(ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)p, (unsigned char)(0x21 + i),
                                  sizes[i], s), 0);
        ft_buf b = {p, sizes[i], FT_MEM_CUDA, 0};
        T_EQ(ft_store_put(st, &b, s, &keys[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        while (ft_store_released(st, keys[i]) == 0)
            usleep(100);
        T_EQ(ft_store_released(st, keys[i]), 1);
        /* the source is free: overwriting it must not change the entry */
        T_EQ(ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)(dev[i] + (i * 3) % 64), 0xEE,
                                  sizes[i], s), 0);
    }
    for (int i = 0; i < N; i++)
        T_EQ(ft_store_wait(st, keys[i]), 0);
    T_EQ(ft_store_flush(st), 0);
    ft_store_stats stats;
    T_EQ(ft_store_get_stats(st, &stats), 0);
    T_EQ(stats.host_resident, 8192 + 4096); /* the small ones; the 8 MiB one was written */
    T_EQ(stats.bytes_demoted, sizes[0]);
    T_EQ(ft_store_prefetch(st, keys[1]), 0); /* its written copy is still in the ring */
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* now from the file, entry 1 prefetched back into the ring */
            t_store_evict(st, so.staging_bytes + so.host_cache_bytes);
            T_EQ(ft_store_prefetch(st, keys[1]), 1);
        }
        for (int i = N - 1; i >= 0; i--) {
            uint8_t *d = dst + (i * 5) % 64;
            /* a consumer's earlier use of the buffer, queued before the get */
            T_EQ(ft__cu.MemsetD8Async((CUdeviceptr)(uintptr_t)d, 0x55, sizes[i], s), 0);
            ft_buf b = {d, sizes[i], FT_MEM_CUDA, 0};
            T_EQ(ft_store_get(st, keys[i], &b, s), 0);
            T_EQ(ft_store_wait(st, keys[i]), 0);
            /* queued after the get: must see the data */
            T_EQ(ft__cu.MemcpyDtoHAsync(host, (CUdeviceptr)(uintptr_t)d, sizes[i], s), 0);
            T_EQ(ft__cu.StreamSynchronize(s), 0);
            memset(expect, 0x21 + i, sizes[i]);
            T_MEMEQ(expect, host, sizes[i]);
        }
    }
    T_EQ(ft_store_get_stats(st, &stats), 0);
    T_TRUE(stats.host_hits >= 5);
    T_TRUE(stats.bytes_read >= sizes[1] + sizes[2] + sizes[3] + sizes[4]);
    T_TRUE(stats.bytes_demoted >= sizes[0] + sizes[3] + sizes[4]); /* the fillers' work */
    for (int i = 0; i < N; i++) {
        T_EQ(ft_store_drop(st, keys[i]), 0);
        ft_cuda_free(dev[i]);
    }
    ft_store_destroy(st);
    ft_cuda_free(dst);
    ft__cu.StreamDestroy(s);
    ft__cuda_leave();
    free(host);
    free(expect);
}

/* The spill store's file through the page cache (AUTO, small) and through O_DIRECT. */
static void case_store_on_device(void)
{
    store_on_device(FT_ENGINE_AUTO);
    if (t_have_odirect())
        store_on_device(FT_ENGINE_DIRECT);
}

/* Batches of small device-memory ops (one device allocation, ops at unaligned offsets in
 * it), written with each engine and read back with each, cuFile's batch API included; the
 * same with the allocation registered (cuFile then addresses it from the registered base). */
static void batch_round_trip(ft_engine we, ft_engine re, bool registered)
{
    enum { N = 96 };
    static const size_t edge[] = {0, 1, 4095, 4096, 4097, 65536 + 3, (1u << 20) + 1};
    size_t len[N], at[N], total = 0;
    uint64_t rnd = 0x1234567 + (uint64_t)we * 31 + (uint64_t)re;
    for (int i = 0; i < N; i++) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        len[i] = i < (int)(sizeof edge / sizeof *edge) ? edge[i] : (size_t)(rnd % (200u << 10));
        at[i] = total + (size_t)(rnd >> 40) % 4096; /* unaligned in memory and in the file */
        total = at[i] + len[i];
    }
    uint8_t *host = malloc(total), *back = malloc(total), *dev;
    t_fill_random(host, total, rnd);
    T_EQ(ft_cuda_alloc(0, total, (void **)&dev), 0);
    T_EQ(ft_cuda_copy(dev, host, total), 0);
    ft_buf whole = {dev, total, FT_MEM_CUDA, 0};
    if (registered)
        T_EQ(ft_buf_register(ctx, &whole), 0);
    ft_batch_op ops[N];
    for (int i = 0; i < N; i++) /* file offset = memory offset + 12345: both unaligned */
        ops[N - 1 - i] = (ft_batch_op){{dev + at[i], len[i], FT_MEM_CUDA, 0}, at[i] + 12345, 0};
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("batch.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                        FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    ft_io_opts wo = {.engine = we, .flags = FT_IO_SYNC}, ro = {.engine = re};
    T_EQ(ft_write_batch(f, ops, N, &wo), 0);
    memset(back, 0x5A, total);
    T_EQ(ft_cuda_copy(dev, back, total), 0);
    T_EQ(ft_read_batch(f, ops, N, &ro), 0);
    for (int i = 0; i < N; i++)
        T_EQ(ops[i].result, ops[i].buf.len);
    T_EQ(ft_cuda_copy(back, dev, total), 0);
    for (int i = 0; i < N; i++)
        if (t_first_diff(host + at[i], back + at[i], len[i]) != (size_t)-1)
            T_FAIL("%s->%s%s: op of %zu bytes at %zu differs", ft_engine_name(we),
                   ft_engine_name(re), registered ? " (registered)" : "", len[i], at[i]);
    ft_file_close(f);
    printf("  batch %s -> %s%s: %d ops, %zu bytes ok\n", ft_engine_name(we), ft_engine_name(re),
           registered ? " (registered)" : "", N, total);
    fflush(stdout);
    if (registered)
        T_EQ(ft_buf_unregister(ctx, &whole), 0);
    ft_cuda_free(dev);
    free(host);
    free(back);
}

static void case_batches(void)
{
    static const ft_engine batch_engines[] = {FT_ENGINE_CUFILE, FT_ENGINE_POSIX,
                                              FT_ENGINE_DIRECT, FT_ENGINE_URING};
    for (size_t w = 0; w < 4; w++)
        for (size_t r = 0; r < 4; r++)
            if (cufile_ok || (batch_engines[w] != FT_ENGINE_CUFILE &&
                              batch_engines[r] != FT_ENGINE_CUFILE))
                batch_round_trip(batch_engines[w], batch_engines[r], false);
    if (cufile_ok) {
        batch_round_trip(FT_ENGINE_CUFILE, FT_ENGINE_CUFILE, true);
        char desc[2048];
        ft_gpu_describe(desc, sizeof desc);
        const char *line = strstr(desc, "cufile batch");
        printf("  after the batches: %.*s\n", line ? (int)strcspn(line, "\n") : 4,
               line ? line : "none");
    }
}

/* Registration: errors, overlap, and cuFile transfers into the middle of a registered range. */
static void case_registration(void)
{
    if (!cufile_ok)
        return;
    enum { LEN = 3 << 20 };
    uint8_t *dev, *host = malloc(LEN), *back = malloc(LEN);
    T_EQ(ft_cuda_alloc(0, LEN, (void **)&dev), 0);
    ft_buf whole = {dev, LEN, FT_MEM_CUDA, 0}, inner = {dev + 4096, 4096, FT_MEM_CUDA, 0};
    uint8_t hostbuf[16];
    ft_buf hb = ft_host_buf(hostbuf, sizeof hostbuf);
    T_EQ(ft_buf_register(ctx, &hb), -EINVAL);
    int rc = ft_buf_register(ctx, &whole);
    if (rc < 0) {
        printf("  note: cuFileBufRegister refused (%s)\n", ft_last_error());
        T_EQ(rc, -EIO);
        goto out;
    }
    T_EQ(ft_buf_register(ctx, &whole), -EEXIST);
    T_EQ(ft_buf_register(ctx, &inner), -EEXIST);
    t_fill_random(host, LEN, 99);
    T_EQ(ft_cuda_copy(dev, host, LEN), 0);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("reg.bin"), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                      FT_OPEN_TRUNC, 0644), 0);
    ft_io_opts o = {.engine = FT_ENGINE_CUFILE};
    ft_buf mid = {dev + 1000, LEN - 5000, FT_MEM_CUDA, 0};
    T_EQ(ft_write(f, &mid, 777, &o), LEN - 5000);
    memset(back, 0, LEN);
    T_EQ(ft_cuda_copy(dev, back, LEN), 0);
    T_EQ(ft_read(f, &mid, 777, &o), LEN - 5000);
    ft_file_close(f);
    T_EQ(ft_cuda_copy(back, dev, LEN), 0);
    T_MEMEQ(back + 1000, host + 1000, LEN - 5000);
    T_EQ(ft_buf_unregister(ctx, &whole), 0);
    T_EQ(ft_buf_unregister(ctx, &whole), -ENOENT);
    ft_ctx *other = t_ctx(0); /* left registered: ft_ctx_destroy releases it */
    T_EQ(ft_buf_register(other, &inner), 0);
    ft_ctx_destroy(other);
out:
    ft_cuda_free(dev);
    free(host);
    free(back);
}

/* Whether cuFile can register a file here (it cannot in a VM without udev data). */
static bool cufile_usable(void)
{
    ft_file *f;
    uint8_t *dev;
    T_ASSERT_OK(ft_file_open(ctx, &f, t_path("probe.bin"),
                             FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644));
    T_ASSERT_OK(ft_cuda_alloc(0, 4096, (void **)&dev));
    ft_buf b = {dev, 4096, FT_MEM_CUDA, 0};
    ft_io_opts o = {.engine = FT_ENGINE_CUFILE};
    int64_t r = ft_write(f, &b, 0, &o);
    if (r < 0)
        printf("note: cuFile unusable here (%s): cufile cases skipped\n", ft_last_error());
    ft_cuda_free(dev);
    ft_file_close(f);
    return r == 4096;
}

/* AUTO on device memory past two trial slices (512 MiB + an odd tail, 1 byte off alignment):
 * from the third call on a fresh context's arms are on trial, so each call moves a 256 MiB
 * slice with the arm on trial and decides again for the rest (test_select counts the
 * decisions on host memory); every slice must land at its own device address. */
/* *out: a file of @p n random bytes (seed), cached; its bytes in *data (malloc'd). */
static void dma_file(const char *name, size_t n, uint64_t seed, uint8_t **data, ft_file **out)
{
    *out = NULL;
    *data = malloc(n);
    T_TRUE(*data);
    t_fill_random(*data, n, seed);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path(name), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                 FT_OPEN_TRUNC, 0644), 0);
    ft_buf hb = ft_host_buf(*data, n);
    *out = f;
    T_EQ(ft_write(f, &hb, 0, NULL), (int64_t)n);
}

/* Read [off, off+len) of @p f into device memory at misalignment @p mis with @p e; compare
 * with @p want. The read's result in *r (INT64_MIN when the test could not run it). */
static void dma_read(ft_file *f, ft_engine e, uint64_t off, size_t len, size_t mis,
                     const uint8_t *want, const char *what, int64_t *r)
{
    *r = INT64_MIN;
    uint8_t *dev = NULL, *back = malloc(len + 1);
    T_TRUE(back);
    T_EQ(ft_cuda_alloc(0, len + mis + 1, (void **)&dev), 0);
    memset(back, 0x5A, len + 1);
    T_EQ(ft_cuda_copy(dev, back, len + 1), 0);
    ft_buf b = {dev + mis, len, FT_MEM_CUDA, 0};
    ft_io_opts o = {.engine = e};
    *r = ft_read(f, &b, off, &o);
    char detail[FT__DETAIL_MAX];
    ft__detail_save(detail);
    size_t at = (size_t)-1;
    if (*r > 0 && ft_cuda_copy(back, dev + mis, (size_t)*r) == 0)
        at = t_first_diff(want, back, (size_t)*r);
    ft_cuda_free(dev);
    free(back);
    if (at != (size_t)-1)
        T_FAIL("%s (%s, off %llu len %zu mis %zu): differs at byte %zu", what,
               ft_engine_name(e), (unsigned long long)off, len, mis, at);
    ft__detail_restore(detail); /* the read's detail, for the caller to look at */
}

/* dma_read into a value: `int64_t r; DMA_READ(r, ...)` */
#define DMA_READ(r, ...)                                                                      \
    do {                                                                                      \
        dma_read(__VA_ARGS__, &(r));                                                          \
        if ((r) == INT64_MIN)                                                                 \
            return;                                                                           \
    } while (0)

static CUresult (*real_register)(void *, size_t, unsigned);
static CUresult refuse_register(void *p, size_t n, unsigned flags)
{
    (void)p, (void)n, (void)flags;
    return 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
static int shrink_fd = -1;
static CUresult shrinking_register(void *p, size_t n, unsigned flags)
{
    if (shrink_fd >= 0 && ftruncate(shrink_fd, 0) == 0)
        shrink_fd = -1;
    return real_register(p, n, flags);
}

static void case_cachedma(void)
{
    /* byte-exact against the staging path (posix) at piece and page edges */
    const size_t n = (300u << 20) + 12345;
    uint8_t *data;
    ft_file *f;
    int64_t r;
    dma_file("dma.bin", n, 901, &data, &f);
    T_TRUE(f);
    static const uint64_t offs[] = {0, 1, 4095, 4096, 4097, (2u << 20) - 1};
    static const size_t lens[] = {1, 4095, 4096, 4097, (2u << 20) + 1, (16u << 20) - 1,
                                  (16u << 20) + 4096, (256u << 20) + 3};
    static const size_t mis[] = {0, 1, 4095};
    char desc[400];
    for (size_t o = 0; o < 6; o++)
        for (size_t l = 0; l < 8; l++)
            for (size_t m = 0; m < 3; m++) {
                if (lens[l] > (32u << 20) && (m || o % 2))
                    continue;
                DMA_READ(r, f, FT_ENGINE_CACHEDMA, offs[o], lens[l], mis[m], data + offs[o],
                         "cachedma");
                T_EQ(r, (int64_t)lens[l]);
                DMA_READ(r, f, FT_ENGINE_POSIX, offs[o], lens[l], mis[m], data + offs[o],
                         "staging");
                T_EQ(r, (int64_t)lens[l]);
            }
    /* the file's last bytes, and a read past its end (clamped) */
    DMA_READ(r, f, FT_ENGINE_CACHEDMA, n - 5, 5, 1, data + n - 5, "tail");
    T_EQ(r, 5);
    DMA_READ(r, f, FT_ENGINE_CACHEDMA, n - 5, 4096, 0, data + n - 5, "past end");
    T_EQ(r, 5);
    ft__cachedma_describe(desc, sizeof desc);
    T_TRUE(strstr(desc, "works") != NULL);

    /* injected faults at its syscall sites: errors, and the next read is fine */
    static const enum t_fault_op ops[] = {T_OP_MMAP, T_OP_MADVISE, T_OP_MUNMAP};
    for (size_t i = 0; i < 3; i++) {
        t_fault_set(ops[i], T_FAULT_ERRNO, EIO, 1, 1);
        dma_read(f, FT_ENGINE_CACHEDMA, 4096, 64u << 20, 0, data + 4096, "fault", &r);
        unsigned hit = t_fault_clear();
        if (!hit || r != -EIO)
            T_FAIL("injected %s failure: read gave %lld (%u injected)",
                   t_fault_op_name(ops[i]), (long long)r, hit);
        DMA_READ(r, f, FT_ENGINE_CACHEDMA, 4096, 64u << 20, 0, data + 4096, "after fault");
        T_EQ(r, 64 << 20);
    }

    /* the file shrinks under the read: an error, no crash */
    uint8_t *shrunk;
    ft_file *g;
    dma_file("dma-shrink.bin", 64u << 20, 902, &shrunk, &g);
    T_TRUE(g);
    real_register = ft__cu.MemHostRegister;
    shrink_fd = g->fd;
    ft__cu.MemHostRegister = shrinking_register;
    dma_read(g, FT_ENGINE_CACHEDMA, 0, 64u << 20, 0, shrunk, "shrinking", &r);
    ft__cu.MemHostRegister = real_register;
    shrink_fd = -1;
    T_EQ(r, -EIO);
    T_TRUE(strstr(ft_last_error(), "changed under a read") != NULL);
    ft_file_close(g);
    free(shrunk);

    /* a driver that refuses: the staging path gives the same bytes, AUTO stops offering it */
    uint8_t *again;
    ft_file *h;
    dma_file("dma-refused.bin", (8u << 20) + 7, 903, &again, &h);
    T_TRUE(h);
    ft__cu.MemHostRegister = refuse_register;
    dma_read(h, FT_ENGINE_CACHEDMA, 3, 8u << 20, 1, again + 3, "refused", &r);
    ft__cu.MemHostRegister = real_register;
    T_EQ(r, 8 << 20);
    ft__cachedma_describe(desc, sizeof desc);
    T_TRUE(strstr(desc, "refused") != NULL && strstr(desc, "801") != NULL);
    T_TRUE(!ft__engine_cachedma.ready(h));
    DMA_READ(r, h, FT_ENGINE_CACHEDMA, 0, 4096, 0, again, "after refusal");
    T_EQ(r, 4096);
    ft__cachedma_forget();
    T_TRUE(ft__engine_cachedma.ready(h));
    ft_file_close(h);
    free(again);
    ft_file_close(f);
    free(data);
}

static unsigned lane_registrations;
static CUresult counting_register(void *p, size_t n, unsigned flags)
{
    ft_config cfg;
    ft_ctx_config(ctx, &cfg);
    lane_registrations += n == 2 * cfg.bounce_size; /* a staging lane's two buffers */
    return real_register(p, n, flags);
}

/* A staging lane's buffers: our memory registered with the driver, cuMemHostAlloc's where it
 * refuses; the same bytes either way, and a context's end frees whichever it made. */
static void case_staging_buffers(void)
{
    const size_t n = (40u << 20) + 3;
    uint8_t *data;
    ft_file *w;
    dma_file("lanes.bin", n, 904, &data, &w);
    T_TRUE(w);
    ft_file_close(w);
    real_register = ft__cu.MemHostRegister;
    CUresult (*const how[2])(void *, size_t, unsigned) = {counting_register, refuse_register};
    for (int k = 0; k < 2; k++) {
        ft_ctx *own = t_ctx(0);
        ft_file *f;
        T_EQ(ft_file_open(own, &f, t_path("lanes.bin"), FT_OPEN_READ, 0), 0);
        lane_registrations = 0;
        ft__cu.MemHostRegister = how[k];
        int64_t r;
        dma_read(f, FT_ENGINE_POSIX, 1, n - 1, 1, data + 1,
                 k ? "lanes of cuMemHostAlloc" : "lanes registered", &r);
        ft__cu.MemHostRegister = real_register;
        T_EQ(r, (int64_t)(n - 1));
        if (k == 0) {
            printf("  lanes registered: %u\n", lane_registrations);
            T_TRUE(lane_registrations >= 1);
        }
        ft_file_close(f);
        ft_ctx_destroy(own);
    }
    free(data);
}

static void case_auto_slices(void)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *own = t_ctx(0);
    size_t size = (512u << 20) + 4097, mis = 1;
    uint8_t *host = malloc(size), *back = malloc(size), *dev = NULL;
    T_TRUE(host && back && own);
    T_EQ(ft_cuda_alloc(0, size + mis, (void **)&dev), 0);
    t_fill_random(host, size, 77);
    T_EQ(ft_cuda_copy(dev + mis, host, size), 0);
    ft_file *f;
    T_EQ(ft_file_open(own, &f, t_path("gpu-slices.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    ft_buf b = {dev + mis, size, FT_MEM_CUDA, 0};
    for (unsigned i = 0; i < 4; i++) {
        T_EQ(ft_write(f, &b, 4096, NULL), (int64_t)size);
        T_EQ(ft_file_sync(f), 0);
    }
    for (unsigned i = 0; i < 5; i++) {
        memset(back, 0x5A, size); /* clear the device buffer, then read into it */
        T_EQ(ft_cuda_copy(dev + mis, back, size), 0);
        T_EQ(ft_read(f, &b, 4096, NULL), (int64_t)size);
        T_EQ(ft_cuda_copy(back, dev + mis, size), 0);
        size_t at = t_first_diff(host, back, size);
        if (at != (size_t)-1)
            T_FAIL("AUTO read %u into device memory differs at byte %zu", i + 1, at);
    }
    ft_file_close(f);
    ft_cuda_free(dev);
    ft_ctx_destroy(own);
    unsetenv("FASTENSOR_PROFILE");
    free(host);
    free(back);
}

/* Host-only work (AUTO transfers, a checkpoint saved and loaded), run before anything here
 * initialises CUDA; main then checks that it stayed uninitialised (cuInit costs host-only
 * users a tenth of a second or more per process in some VMs). */
static void host_only_work(void)
{
    ft_ctx *c = t_ctx(0);
    size_t n = (8u << 20) + 4096;
    uint8_t *a = malloc(n), *b = malloc(n);
    t_fill_random(a, n, 7);
    ft_file *f;
    T_EQ(ft_file_open(c, &f, t_path("host-only.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                      FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    ft_buf ha = ft_host_buf(a, n), hb = ft_host_buf(b, n);
    ft_io_opts o = {.flags = FT_IO_SYNC};
    T_EQ(ft_write(f, &ha, 0, &o), (int64_t)n);
    T_EQ(ft_read(f, &hb, 0, NULL), (int64_t)n);
    T_EQ(ft_file_close(f), 0);
    uint64_t shape[1] = {n};
    ft_tensor t = {.name = "w", .dtype = FT_DTYPE_U8, .ndim = 1, .shape = shape, .data = ha};
    T_EQ(ft_ckpt_save(c, t_path("host-only.safetensors"), &t, 1, NULL), 0);
    ft_ckpt *ck;
    T_EQ(ft_ckpt_open(c, &ck, t_path("host-only.safetensors")), 0);
    memset(b, 0, n);
    T_EQ(ft_ckpt_load_shard(ck, 0, &hb, NULL), (int64_t)n);
    T_EQ(memcmp(a, b, n), 0);
    ft_ckpt_close(ck);
    ft_ctx_destroy(c);
    free(a);
    free(b);
}

/* @p n bytes of weight-like elements of @p e bytes: normal values, their top bytes skewed */
static void *codec_weights(size_t n, unsigned e, uint64_t seed)
{
    uint8_t *b = malloc(n + 1);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i += e) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float f = (float)((double)(int64_t)(x >> 1) / 9.2e18 * 0.05);
        double d = f;
        uint32_t u;
        memcpy(&u, &f, 4);
        uint8_t el[8];
        if (e == 8)
            memcpy(el, &d, 8);
        else if (e == 4)
            memcpy(el, &u, 4);
        else if (e == 2)
            el[0] = (uint8_t)(u >> 16), el[1] = (uint8_t)(u >> 24);
        else
            el[0] = (uint8_t)(u >> 24 | ((u >> 20) & 7));
        memcpy(b + i, el, FT__MIN((size_t)e, n - i));
    }
    return b;
}

/* One ft_codec_encode_cuda_batch of many tensors (every element size, small and large,
 * sources not aligned to their elements, destinations in host and device memory packed
 * back to back at odd offsets): every stream the CPU encoder's, no byte around them
 * touched. */
static void codec_encode_batch(uint8_t *dev)
{
    enum { JOBS = 24 };
    ft_codec_enc_job jobs[JOBS];
    uint8_t *src[JOBS], *want[JOBS];
    int64_t wn[JOBS];
    size_t at = 0, out_at = 0, room = 0;
    for (unsigned i = 0; i < JOBS; i++) {
        unsigned e = 1u << (i % 4);
        size_t n = i % 5 == 0 ? (3u << 20) + 8 * i : 1000 * i + 64;
        n -= n % e;
        src[i] = codec_weights(n, e, 100 + i);
        at += i % 3 == 1 ? 1 : 0; /* this source off its element alignment */
        T_EQ(ft_cuda_copy(dev + at, src[i], n), 0);
        uint32_t block = i % 2 ? 65536 : 0;
        size_t cap = ft_codec_bound(n, e, block);
        want[i] = malloc(cap);
        wn[i] = ft_codec_encode(ctx, src[i], n, e, block, 0, want[i], cap);
        jobs[i] = (ft_codec_enc_job){dev + at, n, e, block, NULL, cap, 0};
        at = (at + n + 15) & ~(size_t)15;
        room += cap + 3;
    }
    uint8_t *host = malloc(room), *ddst, *back = malloc(room);
    T_EQ(ft_cuda_alloc(0, room, (void **)&ddst), 0);
    memset(host, 0x5a, room);
    T_EQ(ft_cuda_copy(ddst, host, room), 0);
    for (unsigned i = 0; i < JOBS; i++) { /* each stream right after the last, 3 bytes on */
        jobs[i].dst = (i % 2 ? ddst : host) + out_at + 3;
        jobs[i].cap = (size_t)wn[i];
        out_at += 3 + (size_t)wn[i];
    }
    int64_t total = ft_codec_encode_cuda_batch(ctx, jobs, JOBS, 0, NULL);
    if (total < 0)
        T_FAIL("ft_codec_encode_cuda_batch: %lld: %s", (long long)total, ft_last_error());
    T_EQ(ft_cuda_copy(back, ddst, room), 0);
    out_at = 0;
    for (unsigned i = 0; i < JOBS; i++) {
        const uint8_t *got = (i % 2 ? back : host) + out_at;
        T_EQ(jobs[i].size, wn[i]);
        T_TRUE(got[0] == 0x5a && got[1] == 0x5a && got[2] == 0x5a);
        T_MEMEQ(got + 3, want[i], (size_t)wn[i]);
        out_at += 3 + (size_t)wn[i];
        free(src[i]);
        free(want[i]);
    }
    T_TRUE(host[out_at] == 0x5a && back[out_at] == 0x5a);
    printf("  a batch of %d streams the same as the CPU encoder's\n", JOBS);
    ft_cuda_free(ddst);
    free(host);
    free(back);
}

/* ft_codec_encode_cuda writes exactly ft_codec_encode's stream, into host memory and into
 * device memory: element widths, sizes around the lane, block and wave edges (block sizes
 * 4 KiB, 64 KiB and the default; 130 MiB of bf16 go through in two waves), constant
 * planes, incompressible bytes, sources at unaligned device addresses; bad input. */
static void case_codec_encode(void)
{
    const size_t sizes[] = {0, 2, 64, 1000, 4096 * 8 + 8, (1u << 20) + 24, (5u << 20) / 2};
    const uint32_t blocks[] = {0, 4096, 65536};
    uint8_t *dev;
    const size_t big = 130u << 20;
    T_EQ(ft_cuda_alloc(0, big + 64, (void **)&dev), 0);
    unsigned checked = 0;
    for (unsigned e = 1; e <= 8; e *= 2)
        for (unsigned si = 0; si <= sizeof sizes / sizeof *sizes; si++)
            for (unsigned bi = 0; bi < 3; bi++) {
                size_t n = si < sizeof sizes / sizeof *sizes ? sizes[si] : e == 2 ? big : 0;
                n -= n % e;
                if ((si == sizeof sizes / sizeof *sizes && (e != 2 || bi)) ||
                    (blocks[bi] && blocks[bi] < 64 * e))
                    continue;
                uint8_t *src = codec_weights(n, e, 7 * si + bi + e);
                if (si == 3)
                    memset(src, 0x3c, n); /* constant planes */
                if (si == 4)
                    for (size_t i = 0; i < n; i++) /* incompressible */
                        src[i] = (uint8_t)(i * 2654435761u >> 13);
                size_t mis = (si + bi) % 3 == 0 ? 0 : e; /* (elements stay aligned: torch's) */
                T_EQ(ft_cuda_copy(dev + mis, src, n), 0);
                size_t cap = ft_codec_bound(n, e, blocks[bi]);
                uint8_t *want = malloc(cap), *got = malloc(cap);
                int64_t wn = ft_codec_encode(ctx, src, n, e, blocks[bi], 0, want, cap);
                int64_t gn = ft_codec_encode_cuda(ctx, dev + mis, n, e, blocks[bi], got, cap, 0,
                                                  NULL);
                if (gn != wn)
                    T_FAIL("ft_codec_encode_cuda of %zu bytes (elements of %u, block %u): "
                           "%lld, the CPU encoder %lld: %s", n, e, blocks[bi], (long long)gn,
                           (long long)wn, ft_last_error());
                else
                    T_MEMEQ(got, want, (size_t)wn);
                if (bi == 0 && si % 2 == 0) { /* into device memory */
                    uint8_t *ddst;
                    T_EQ(ft_cuda_alloc(0, cap, (void **)&ddst), 0);
                    memset(got, 0, cap);
                    T_EQ(ft_codec_encode_cuda(ctx, dev + mis, n, e, 0, ddst, cap, 0, NULL), wn);
                    T_EQ(ft_cuda_copy(got, ddst, (size_t)wn), 0);
                    T_MEMEQ(got, want, (size_t)wn);
                    ft_cuda_free(ddst);
                }
                checked++;
                free(want);
                free(got);
                free(src);
            }
    printf("  %u streams the same as the CPU encoder's\n", checked);
    codec_encode_batch(dev);
    /* bad input: host memory as the source, too little room, a bad element size */
    uint8_t host[256] = {0}, out[1024];
    T_EQ(ft_codec_encode_cuda(ctx, host, sizeof host, 2, 0, out, sizeof out, 0, NULL), -EINVAL);
    T_EQ(ft_codec_encode_cuda(ctx, dev, 4096, 2, 0, out, 20, 0, NULL), -ENOSPC);
    T_EQ(ft_codec_encode_cuda(ctx, dev, 4096, 3, 0, out, sizeof out, 0, NULL), -EINVAL);
    ft_cuda_free(dev);
    /* which encoder a save takes for GPU tensors (a measured choice: printed, not asserted) */
    for (unsigned e = 2; e <= 8; e *= 2) {
        double rate = 0;
        int codes = ft_fst_gpu_codes(ctx, 0, e, &rate);
        printf("  saves code %u-byte floats on the %s (GPU encoder %.1f GB/s on 32 MiB)\n", e,
               codes == 1 ? "GPU" : "host", rate);
        T_TRUE(codes >= 0 && rate > 0);
    }
}

/* ft_fst_code of tensors in GPU memory: the streams its GPU codes are packed straight into the
 * coded memory (no batch buffer), the rest go through the batches (host tensors, integers on
 * the GPU, a stream that saves too little: stored); a save of those streams is the very file
 * a coding save writes, on a first call, a repeat, and a smaller set after (trimmed). */
static void case_fst_code_on_device(void)
{
    enum { N = 9 };
    /* bf16 weights of assorted sizes (empty, one element, over a 64 MiB piece), fp32 and f64
     * weights, random bf16 (saves too little), int64 on the GPU, bf16 weights on the host */
    static const ft_dtype types[N] = {FT_DTYPE_BF16, FT_DTYPE_BF16, FT_DTYPE_BF16, FT_DTYPE_BF16,
                                      FT_DTYPE_F32,  FT_DTYPE_F64,  FT_DTYPE_BF16, FT_DTYPE_I64,
                                      FT_DTYPE_BF16};
    static const uint64_t bytes[N] = {0, 2, 3000, 70u << 20, 6u << 20, 1u << 20, 2u << 20,
                                      40000, 5u << 20};
    char names[N][16];
    uint64_t shapes[N];
    void *host[N], *dev[N];
    ft_tensor t[N];
    for (int i = 0; i < N; i++) {
        unsigned e = ft_dtype_bits(types[i]) / 8;
        host[i] = codec_weights(bytes[i], e, 40 + (uint64_t)i);
        if (i == 6 || i == 7)
            t_fill_random(host[i], bytes[i], 77 + (uint64_t)i);
        dev[i] = NULL;
        bool on_dev = i != 8;
        if (on_dev && bytes[i]) {
            T_EQ(ft_cuda_alloc(0, bytes[i], &dev[i]), 0);
            T_EQ(ft_cuda_copy(dev[i], host[i], bytes[i]), 0);
        }
        snprintf(names[i], sizeof names[i], "t%d", i);
        shapes[i] = bytes[i] / e;
        t[i] = (ft_tensor){names[i], types[i], 1, &shapes[i],
                           on_dev ? (ft_buf){dev[i], bytes[i], FT_MEM_CUDA, 0}
                                  : ft_host_buf(host[i], bytes[i])};
    }
    char plain[4200], ahead[4200];
    snprintf(plain, sizeof plain, "%s", t_path("gpu-plain.fst"));
    snprintf(ahead, sizeof ahead, "%s", t_path("gpu-ahead.fst"));
    ft_fst_coded *coded = NULL;
    const size_t counts[] = {N, N, 4};
    for (int k = 0; k < 3; k++) {
        size_t n = counts[k];
        ft_save_opts so = {.compression = FT_COMPRESS_ALWAYS};
        int64_t total = ft_fst_code(ctx, t_dir(), t, n, &so, &coded);
        T_TRUE(total > 0);
        uint64_t raw = 0;
        for (size_t i = 0; i < n; i++)
            raw += bytes[i];
        /* packed: the coded bytes, the random tensor's unused stream, a piece's slack, and
         * the piece of the stream larger than a piece, of its bound (the tensor's bytes, its
         * table and its last page: 70 MiB + 8 KiB, more than the tensor's bytes alone, which
         * the smaller set's third call showed) */
        uint64_t memory = ft_fst_coded_memory(coded);
        if (memory > raw + (64u << 20) + 16384 * n)
            T_FAIL("call %d: %llu bytes of coded memory for %llu bytes of %zu tensors", k + 1,
                   (unsigned long long)memory, (unsigned long long)raw, n);
        T_TRUE((uint64_t)total < raw);
        ft_save_opts ao = so;
        ao.coded = coded;
        T_EQ(ft_ckpt_save(ctx, ahead, t, n, &ao), 0);
        T_EQ(ft_ckpt_save(ctx, plain, t, n, &so), 0);
        if (!t_same_files(plain, ahead))
            T_FAIL("a save of %zu tensors coded ahead on the GPU is not the coding save's file "
                   "(call %d)", n, k + 1);
        ft_ckpt *c; /* and it holds the tensors' bytes */
        T_EQ(ft_ckpt_open(ctx, &c, ahead), 0);
        T_EQ(ft_ckpt_load_all(c, NULL), 0);
        for (size_t i = 0; i < n; i++)
            if (bytes[i] && memcmp(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, names[i])), host[i],
                                   bytes[i]))
                T_FAIL("tensor %zu of a save coded ahead on the GPU reads back other bytes", i);
        ft_ckpt_close(c);
    }
    printf("  coded memory after a smaller set: %llu bytes\n",
           (unsigned long long)ft_fst_coded_memory(coded));
    ft_fst_coded_free(coded);
    for (int i = 0; i < N; i++) {
        free(host[i]);
        if (dev[i])
            ft_cuda_free(dev[i]);
    }
}

/* ft_codec_decode_cuda byte for byte against the source (and so against the host decoder):
 * element widths, sizes around the block and lane edges, stored and constant planes, several
 * streams in one call, destinations unaligned, streams already on the device; bad input. */
static void case_codec_decode(void)
{
    const size_t sizes[] = {0, 2, 64, 1000, 4096 * 8 + 8, (1u << 20) + 24, (5u << 20) / 2};
    const unsigned widths[] = {1, 2, 4, 8};
    enum { JOBS = 4 * 7 };
    ft_codec_job jobs[JOBS];
    void *srcs[JOBS], *encs[JOBS];
    size_t total = 0, nj = 0;
    for (unsigned w = 0; w < 4; w++)
        for (unsigned s = 0; s < 7; s++)
            total += sizes[s] + 64;
    uint8_t *dev;
    T_EQ(ft_cuda_alloc(0, total, (void **)&dev), 0);
    size_t at = 0;
    for (unsigned w = 0; w < 4; w++)
        for (unsigned s = 0; s < 7; s++, nj++) {
            unsigned e = widths[w];
            size_t n = sizes[s] - sizes[s] % e;
            srcs[nj] = codec_weights(n, e, nj);
            if (s == 3)
                memset(srcs[nj], 0x3c, n); /* constant planes */
            size_t cap = ft_codec_bound(n, e, s == 4 ? 4096 : 0);
            encs[nj] = malloc(cap);
            int64_t len = ft_codec_encode(ctx, srcs[nj], n, e, s == 4 ? 4096 : 0,
                                          s == 5 && e == 2 ? FT_CODEC_STORE : 0, encs[nj], cap);
            T_TRUE(len >= 0);
            size_t mis = nj % 3 == 0 ? 0 : nj % 3 == 1 ? 2 : 33; /* 16-aligned and not */
            jobs[nj] = (ft_codec_job){encs[nj], (size_t)len, NULL, dev + at + mis, n};
            at += sizes[s] + 64;
        }
    int64_t want = 0;
    for (size_t j = 0; j < nj; j++)
        want += (int64_t)jobs[j].cap;
    int64_t got = ft_codec_decode_cuda(ctx, jobs, nj, 0, NULL);
    if (got != want)
        T_FAIL("ft_codec_decode_cuda: %lld (want %lld): %s", (long long)got, (long long)want,
               ft_last_error());
    for (size_t j = 0; j < nj; j++) {
        uint8_t *back = malloc(jobs[j].cap + 1);
        T_EQ(ft_cuda_copy(back, jobs[j].dst, jobs[j].cap), 0);
        T_MEMEQ(back, srcs[j], jobs[j].cap);
        free(back);
    }
    /* a stream already on the device */
    uint8_t *sdev;
    T_EQ(ft_cuda_alloc(0, jobs[26].len, (void **)&sdev), 0);
    T_EQ(ft_cuda_copy(sdev, jobs[26].src, jobs[26].len), 0);
    ft_codec_job one = jobs[26];
    one.src_dev = sdev;
    T_EQ(ft_codec_decode_cuda(ctx, &one, 1, 0, NULL), (int64_t)one.cap);
    uint8_t *back = malloc(one.cap);
    T_EQ(ft_cuda_copy(back, one.dst, one.cap), 0);
    T_MEMEQ(back, srcs[26], one.cap);
    free(back);
    ft_cuda_free(sdev);
    /* bad input: host memory as the destination, a corrupt block table, too little room */
    uint8_t host[64];
    ft_codec_job bad = jobs[9];
    bad.dst = host;
    T_EQ(ft_codec_decode_cuda(ctx, &bad, 1, 0, NULL), -EINVAL);
    bad = jobs[27];
    uint8_t *copy = malloc(bad.len);
    memcpy(copy, bad.src, bad.len);
    copy[24] ^= 0xff; /* the first block's end */
    bad.src = copy;
    T_EQ(ft_codec_decode_cuda(ctx, &bad, 1, 0, NULL), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "stream 0: codec: block 0") != NULL);
    bad = jobs[27];
    bad.cap--;
    T_EQ(ft_codec_decode_cuda(ctx, &bad, 1, 0, NULL), -ENOSPC);
    free(copy);
    for (size_t j = 0; j < nj; j++) {
        free(srcs[j]);
        free(encs[j]);
    }
    ft_cuda_free(dev);
}

int main(void)
{
    t_name = "host-only work leaves CUDA uninitialised";
    /* loaded but not initialised, as `import torch` leaves it */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    host_only_work();
    if (lib) {
        int (*count)(int *) = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
        int n = 0, r = count ? count(&n) : -1;
        if (r != 3) { /* CUDA_ERROR_NOT_INITIALIZED */
            fprintf(stderr, "FAIL [%s]: cuDeviceGetCount gave %d after host-only work, not "
                            "3 (not initialised)\n", t_name, r);
            return 1;
        }
    }
    if (t_failures)
        return 1;
    setenv("FASTENSOR_CUFILE_BATCH", "1", 0); /* exercise cuFile's batch API even without GDS */
    const char *why;
    if (!ft_cuda_available(&why))
        t_skip("no GPU: %s", why);
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s", t_dir());
    ctx = t_ctx(0);
    cufile_ok = cufile_usable();
    char desc[2048];
    ft_gpu_describe(desc, sizeof desc);
    printf("%s", desc);
    const t_case cases[] = {
        {"device round trips: sizes x offsets x alignments, every engine", case_matrix},
        {"cross-engine and host/device mixes", case_cross_and_mixed},
        {"4 threads with their own streams, async requests", case_threads_and_streams},
        {"stream ordering (cuMemsetD8Async, no kernels)", case_stream_order},
        {"checkpoint save from and load into device memory", case_checkpoint_on_device},
        {"cold checkpoint load into device memory, copied as it is cached",
         case_checkpoint_cold_on_device},
        {"spill store: device puts and gets, stream ordering", case_store_on_device},
        {"batches of small device ops, every engine pair, registered memory", case_batches},
        {"buffer registration", case_registration},
        {"AUTO in trial slices into device memory", case_auto_slices},
        {"cachedma: page-cache DMA against staging, faults, shrinking file, refusal",
         case_cachedma},
        {"staging lanes: registered memory, cuMemHostAlloc's where refused",
         case_staging_buffers},
        {"codec streams decoded on the GPU", case_codec_decode},
        {"codec streams encoded on the GPU, the CPU encoder's bytes", case_codec_encode},
        {".fst streams coded ahead on the GPU, packed: the coding save's file",
         case_fst_code_on_device},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
