/* Checkpoints: round trips for every dtype and edge shape, many small tensors, shards,
 * sparse > 4 GiB offsets, files written by hand (other writers), every validation failure,
 * a flipped bit found by verify, failed saves that keep the old file, crash atomicity. */
#include "testlib.h"

#include <dirent.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static ft_ctx *ctx;

typedef struct owned_tensor {
    char name[64];
    uint64_t shape[4];
    ft_tensor t;
} owned_tensor;

/* Make @p n tensors with random bytes; sizes from @p sizes (elements of dim 0). */
static owned_tensor *make_tensors(size_t n, ft_dtype dtype_or_all, uint64_t seed,
                                  uint64_t max_elems)
{
    owned_tensor *o = calloc(n, sizeof *o);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ft_dtype d = dtype_or_all == FT_DTYPE_COUNT ? (ft_dtype)(i % FT_DTYPE_COUNT)
                                                    : dtype_or_all;
        snprintf(o[i].name, sizeof o[i].name, "layer.%zu.weight", i);
        o[i].shape[0] = (s >> 33) % (max_elems + 1);
        o[i].shape[1] = ft_dtype_bits(d) % 8 ? 4 : 1 + (s >> 20) % 3; /* packed: whole bytes */
        size_t bytes = (size_t)(o[i].shape[0] * o[i].shape[1] * ft_dtype_bits(d) / 8);
        void *p = malloc(bytes + 1);
        t_fill_random(p, bytes, seed + i);
        o[i].t = (ft_tensor){o[i].name, d, 2, o[i].shape, ft_host_buf(p, bytes)};
    }
    return o;
}

/* The tensors of @p o as the list ft_ckpt_save takes (malloc'ed). */
static ft_tensor *list_of(const owned_tensor *o, size_t n)
{
    ft_tensor *list = malloc(n * sizeof *list);
    for (size_t i = 0; i < n; i++)
        list[i] = o[i].t;
    return list;
}

static void free_tensors(owned_tensor *o, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(o[i].t.data.ptr);
    free(o);
}

/* Open @p path and check it holds exactly @p o (by name), with every load path. */
static void check_ckpt(const char *path, const owned_tensor *o, size_t n, bool verify)
{
    ft_ckpt *c;
    int rc = ft_ckpt_open(ctx, &c, path);
    if (rc < 0)
        T_FAIL("open %s: %s", path, ft_strerror(rc));
    T_EQ(ft_ckpt_count(c), n);
    ft_load_opts lo = {.flags = verify ? FT_LOAD_VERIFY : 0};
    T_EQ(ft_ckpt_load_all(c, &lo), 0);
    for (size_t i = 0; i < n; i++) {
        int64_t k = ft_ckpt_find(c, o[i].name);
        if (k < 0)
            T_FAIL("tensor %s missing", o[i].name);
        ft_tensor_info info;
        T_EQ(ft_ckpt_info(c, (size_t)k, &info), 0);
        T_EQ(info.dtype, o[i].t.dtype);
        T_EQ(info.ndim, o[i].t.ndim);
        for (unsigned d = 0; d < info.ndim; d++)
            T_EQ(info.shape[d], o[i].t.shape[d]);
        T_EQ(info.nbytes, o[i].t.data.len);
        if (o[i].t.data.len)
            T_MEMEQ(ft_ckpt_data(c, (size_t)k), o[i].t.data.ptr, o[i].t.data.len);
        if (i % 7 == 0) { /* one-tensor loads, some verified */
            uint8_t *buf = malloc(info.nbytes + 1);
            ft_buf b = ft_host_buf(buf, (size_t)info.nbytes);
            T_EQ(ft_ckpt_load_tensor(c, (size_t)k, &b, &lo), info.nbytes);
            T_MEMEQ(buf, o[i].t.data.ptr, info.nbytes);
            free(buf);
        }
    }
    if (verify)
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), 0);
    ft_ckpt_close(c);
}

static void case_every_dtype(void)
{
    size_t n = 3 * FT_DTYPE_COUNT;
    owned_tensor *o = make_tensors(n, FT_DTYPE_COUNT, 1, 5000);
    /* edge shapes: a scalar, an empty vector, an empty matrix */
    o[0].t.ndim = 0;
    o[0].t.data.len = ft_dtype_size(o[0].t.dtype);
    o[1].shape[0] = 0;
    o[1].t.data.len = 0;
    o[2].shape[1] = 0;
    o[2].t.data.len = 0;
    const char *meta[] = {"format", "pt", "note", "caf\xc3\xa9", NULL};
    ft_save_opts so = {.metadata = meta};
    const char *path = t_path("dtypes.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, &o[0].t - 0, 0, &so), 0); /* empty checkpoint first */
    ft_tensor *list = list_of(o, n);
    T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
    check_ckpt(path, o, n, true);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_ckpt_metadata_count(c), 2);
    const char *k, *v;
    T_EQ(ft_ckpt_metadata(c, 1, &k, &v), 0);
    T_TRUE(!strcmp(k, "note") && !strcmp(v, "caf\xc3\xa9"));
    T_EQ(ft_ckpt_has_checksums(c), 1);
    ft_tensor_info info;
    T_EQ(ft_ckpt_info(c, 0, &info), 0);
    T_EQ(info.file_offset % 4096, 0); /* the data section is page-aligned */
    T_EQ(ft_ckpt_info(c, n, &info), -ERANGE);
    T_EQ(ft_ckpt_find(c, "nope"), -ENOENT);
    ft_ckpt_close(c);
    for (int d = 0; d < FT_DTYPE_COUNT; d++)
        T_EQ(ft_dtype_from_name(ft_dtype_name((ft_dtype)d)), d);
    T_EQ(ft_dtype_from_name("F5"), -EINVAL);
    T_EQ(ft_dtype_bits(FT_DTYPE_F4), 4);
    T_EQ(ft_dtype_size(FT_DTYPE_F6_E2M3), 0);
    T_EQ(ft_dtype_bits(FT_DTYPE_COUNT), 0);
    /* safetensors' layout ranks: each once; a higher rank never has smaller whole-byte
     * elements (so every tensor of a save sits aligned to its element); BF16 above F16 */
    unsigned seen = 0;
    for (int d = 0; d < FT_DTYPE_COUNT; d++) {
        unsigned r = ft_dtype_rank((ft_dtype)d);
        T_TRUE(r < FT_DTYPE_COUNT && !(seen >> r & 1));
        seen |= 1u << r;
        for (int e = 0; e < FT_DTYPE_COUNT; e++)
            if (ft_dtype_rank((ft_dtype)e) > r && ft_dtype_size((ft_dtype)e) &&
                ft_dtype_size((ft_dtype)d))
                T_TRUE(ft_dtype_size((ft_dtype)e) >= ft_dtype_size((ft_dtype)d));
    }
    T_TRUE(ft_dtype_rank(FT_DTYPE_BF16) == ft_dtype_rank(FT_DTYPE_F16) + 1);
    T_EQ(ft_dtype_rank(FT_DTYPE_COUNT), 0);
    /* packed elements that leave a partial byte are refused (nothing written) */
    uint64_t odd[1] = {3};
    uint8_t two[2] = {0};
    ft_tensor packed = {"odd", FT_DTYPE_F4, 1, odd, ft_host_buf(two, 2)};
    T_EQ(ft_ckpt_save(ctx, t_path("odd.safetensors"), &packed, 1, NULL), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "whole bytes") != NULL);
    free(list);
    free_tensors(o, n);
}

static void case_many_small(void)
{
    size_t n = 5000;
    owned_tensor *o = make_tensors(n, FT_DTYPE_COUNT, 2, 40);
    ft_tensor *list = list_of(o, n);
    ft_save_opts so = {.checksum_block = 4096};
    const char *path = t_path("small.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
    check_ckpt(path, o, n, true);
    free(list);
    free_tensors(o, n);
}

/* ft_ckpt_shard_cached: 0 once the file is evicted, 1 once it was read through the page
 * cache, -ERANGE past the last shard. */
static void case_shard_cached(void)
{
    size_t n = 64;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 1, 1 << 15);
    ft_tensor *list = list_of(o, n);
    const char *path = t_path("cached.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, NULL), 0);
    int fd = open(path, O_RDONLY);
    T_TRUE(fd >= 0);
    if (!t_evict(path)) {
        printf("  (eviction did not take here: not judged)\n");
        close(fd);
        free(list);
        free_tensors(o, n);
        return;
    }
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_ckpt_shard_cached(c, 0), 0);
    char buf[1 << 16];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    T_EQ(ft_ckpt_shard_cached(c, 0), 1);
    T_EQ(ft_ckpt_shard_cached(c, 1), -ERANGE);
    T_EQ(ft_ckpt_shard_cached(NULL, 0), -ERANGE);
    ft_ckpt_close(c);
    close(fd);
    free(list);
    free_tensors(o, n);
}

/* ft_ckpt_prefetch: keep reads an evicted shard into the page cache (cached when the call
 * returns), bypass leaves it out, auto keeps a checkpoint this small; bad arguments and
 * failed reads are refused; where the wait through a mapping fails, a read-through does the
 * work. */
static void case_prefetch(void)
{
    size_t n = 16;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 5, 1 << 16);
    ft_tensor *list = list_of(o, n);
    const char *path = t_path("prefetch.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, NULL), 0);
    int fd = open(path, O_RDONLY);
    static const struct { ft_cache_mode mode; int rc, cached; } runs[] = {
        {FT_CACHE_BYPASS, 0, 0}, {FT_CACHE_KEEP, 1, 1}, {FT_CACHE_AUTO, 1, 1}};
    for (unsigned i = 0; i < sizeof runs / sizeof *runs; i++) {
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        if (!t_evict(path)) { /* (after the open: its header read may read ahead) */
            printf("  (eviction did not take here: not judged)\n");
            ft_ckpt_close(c);
            break;
        }
        T_EQ(ft_ckpt_shard_cached(c, 0), 0);
        T_EQ(ft_ckpt_prefetch(c, 0, runs[i].mode), runs[i].rc);
        T_EQ(ft_ckpt_shard_cached(c, 0), runs[i].cached); /* in the cache when it returns */
        if (i == 1) { /* a mapping of it, its pages mapped in on the context's threads */
            off_t size = lseek(fd, 0, SEEK_END);
            void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
            T_TRUE(m != MAP_FAILED);
            T_EQ(ft_map_populate(ctx, m, (size_t)size), 0);
            uint8_t *back = malloc((size_t)size);
            T_EQ(pread(fd, back, (size_t)size, 0), (ssize_t)size);
            T_MEMEQ(m, back, (size_t)size);
            free(back);
            munmap(m, (size_t)size);
            T_EQ(ft_map_populate(NULL, m, 1), -EINVAL);
            T_EQ(ft_map_populate(ctx, NULL, 1), -EINVAL);
        }
        if (i == 0) {
            T_EQ(ft_ckpt_prefetch(c, 1, FT_CACHE_KEEP), -EINVAL);
            T_EQ(ft_ckpt_prefetch(c, 0, (ft_cache_mode)9), -EINVAL);
            T_EQ(ft_ckpt_prefetch(NULL, 0, FT_CACHE_KEEP), -EINVAL);
            t_fault_set(T_OP_FADVISE, T_FAULT_ERRNO, EIO, 1, 0);
            T_EQ(ft_ckpt_prefetch(c, 0, FT_CACHE_KEEP), -EIO);
            T_TRUE(strstr(ft_last_error(), "readahead") != NULL);
            T_TRUE(t_fault_clear() >= 1);
            /* the wait through a mapping failing (mapping, populating): read through
             * instead; then both ways failing */
            static const enum t_fault_op ways[] = {T_OP_MMAP, T_OP_MADVISE};
            for (unsigned w = 0; w < 2 && t_evict(path); w++) {
                t_fault_set(ways[w], T_FAULT_ERRNO, ways[w] == T_OP_MMAP ? ENOMEM : EIO, 1, 0);
                T_EQ(ft_ckpt_prefetch(c, 0, FT_CACHE_KEEP), 1);
                T_TRUE(t_fault_clear() >= 1);
                T_EQ(ft_ckpt_shard_cached(c, 0), 1);
            }
            if (t_evict(path)) {
                t_fault_set(T_OP_MADVISE, T_FAULT_ERRNO, EIO, 1, 0);
                t_fault_also(1ull << T_OP_PREAD); /* the read-through fails too */
                T_EQ(ft_ckpt_prefetch(c, 0, FT_CACHE_KEEP), -EIO);
                T_TRUE(strstr(ft_last_error(), "readahead") != NULL);
                T_TRUE(t_fault_clear() >= 1);
                /* its readahead may still be in flight: waited for, so that the next
                 * eviction takes */
                T_EQ(ft_ckpt_prefetch(c, 0, FT_CACHE_KEEP), 1);
            }
        }
        ft_ckpt_close(c);
    }
    close(fd);
    free(list);
    free_tensors(o, n);
}

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Read a byte of every page of [p, p+len): the minor faults that took (0 when mapped in). */
static long faults_to_touch(const uint8_t *p, size_t len)
{
    long before = minor_faults();
    unsigned sum = 0;
    for (size_t i = 0; i < len; i += 4096)
        sum += ((volatile const uint8_t *)p)[i];
    (void)sum;
    return minor_faults() - before;
}

/* ft_ckpt_prefetch_map: an evicted shard is read into the page cache and mapped into the
 * caller's mapping (touching it then faults no page in), byte-exact; a cached shard is mapped
 * in too; bypass leaves the mapping alone; a file shorter than its header says is left to
 * the read (0); bad arguments and a failed stat of the file are refused. */
static void case_prefetch_map(void)
{
    size_t n = 24;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 7, 1 << 17);
    ft_tensor *list = list_of(o, n);
    const char *path = t_path("prefetch-map.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, NULL), 0);
    int fd = open(path, O_RDONLY);
    size_t size = (size_t)lseek(fd, 0, SEEK_END);
    uint8_t *back = malloc(size);
    T_EQ(pread(fd, back, size, 0), (ssize_t)size);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    static const struct { ft_cache_mode mode; bool evict; int rc; } runs[] = {
        {FT_CACHE_KEEP, true, 1}, {FT_CACHE_AUTO, false, 1}, {FT_CACHE_BYPASS, true, 0}};
    for (unsigned i = 0; i < sizeof runs / sizeof *runs; i++) {
        uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        T_TRUE(m != MAP_FAILED);
        if (runs[i].evict && !t_evict(path)) {
            printf("  (eviction did not take here: not judged)\n");
            munmap(m, size);
            continue;
        }
        T_EQ(ft_ckpt_prefetch_map(c, 0, runs[i].mode, m), runs[i].rc);
        if (runs[i].rc == 1) {
            T_EQ(ft_ckpt_shard_cached(c, 0), 1);
            /* the data section's pages (the header's page may not be) */
            size_t from = 8192;
            long faults = faults_to_touch(m + from, size - from);
            T_TRUE(faults <= 2);
            if (faults > 2)
                printf("  %ld faults touching %zu pages\n", faults, (size - from) / 4096);
        } else {
            T_EQ(ft_ckpt_shard_cached(c, 0), 0);
        }
        T_MEMEQ(m, back, size);
        munmap(m, size);
    }
    uint8_t *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    T_TRUE(m != MAP_FAILED);
    T_EQ(ft_ckpt_prefetch_map(NULL, 0, FT_CACHE_KEEP, m), -EINVAL);
    T_EQ(ft_ckpt_prefetch_map(c, 1, FT_CACHE_KEEP, m), -EINVAL);
    T_EQ(ft_ckpt_prefetch_map(c, 0, (ft_cache_mode)9, m), -EINVAL);
    T_EQ(ft_ckpt_prefetch_map(c, 0, FT_CACHE_KEEP, NULL), -EINVAL);
    t_fault_set(T_OP_FSTAT, T_FAULT_ERRNO, EIO, 1, 0);
    T_EQ(ft_ckpt_prefetch_map(c, 0, FT_CACHE_KEEP, m), -EIO);
    T_TRUE(strstr(ft_last_error(), "stat") && strstr(ft_last_error(), "prefetch-map"));
    T_TRUE(t_fault_clear() >= 1);
    /* map or read: the library's choice, the caller's, a named engine, verify */
    ft_load_opts named = {.engine = FT_ENGINE_DIRECT}, verify = {.flags = FT_LOAD_VERIFY};
    T_EQ(ft_ckpt_shard_mappable(c, 0, NULL, -1), 1);
    T_EQ(ft_ckpt_shard_mappable(c, 0, NULL, 0), 0);
    T_EQ(ft_ckpt_shard_mappable(c, 0, &named, -1), 0);
    T_EQ(ft_ckpt_shard_mappable(c, 0, &named, 1), 1);
    T_EQ(ft_ckpt_shard_mappable(c, 0, &verify, 1), 0);
    T_EQ(ft_ckpt_shard_mappable(c, 1, NULL, -1), -EINVAL);
    T_EQ(ft_ckpt_shard_mappable(c, 0, NULL, 2), -EINVAL);
    t_fault_set(T_OP_FSTAT, T_FAULT_ERRNO, EIO, 1, 0);
    T_EQ(ft_ckpt_shard_mappable(c, 0, NULL, -1), -EIO);
    T_TRUE(t_fault_clear() >= 1);
    ft_ckpt_close(c);
    /* a copy cut short after it was opened: left to the read (which reports it) */
    const char *cut = t_path("prefetch-map-cut.safetensors");
    int cfd = open(cut, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    T_EQ(write(cfd, back, size), (ssize_t)size);
    T_EQ(ft_ckpt_open(ctx, &c, cut), 0);
    T_EQ(ftruncate(cfd, (off_t)(size - 4096)), 0);
    close(cfd);
    T_EQ(ft_ckpt_prefetch_map(c, 0, FT_CACHE_KEEP, m), 0);
    T_EQ(ft_ckpt_shard_mappable(c, 0, NULL, 1), 0);
    ft_ckpt_close(c);
    munmap(m, size);
    free(back);
    close(fd);
    free(list);
    free_tensors(o, n);
}

/* ft_ckpt_read_range: any byte range of a tensor (edges, odd lengths, unaligned buffers),
 * byte-exact, verified or not; ranges outside the tensor are refused; a failed read is the
 * call's error; a flipped byte is found by a verified read of a range near it. */
static bool flip_byte(const char *path, uint64_t at, uint8_t mask);

static void case_read_range(void)
{
    size_t n = 4;
    owned_tensor *o = make_tensors(n, FT_DTYPE_U8, 21, 700000);
    o[1].shape[0] = 0; /* an empty tensor */
    o[1].t.data.len = 0;
    free(o[2].t.data.ptr); /* one of a known size: five checksum blocks */
    o[2].shape[0] = 20000;
    o[2].shape[1] = 1;
    o[2].t.data = ft_host_buf(malloc(20000), 20000);
    t_fill_random(o[2].t.data.ptr, 20000, 77);
    ft_tensor *list = list_of(o, n);
    ft_save_opts so = {.checksum_block = 4096};
    const char *path = t_path("range.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    uint8_t *buf = t_alloc_misaligned(2u << 20, 3);
    uint64_t seed = 5;
    for (unsigned round = 0; round < 200; round++) {
        size_t k = round % n;
        uint64_t len = o[k].t.data.len;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t off = len ? (seed >> 33) % (len + 1) : 0;
        uint64_t part = round % 7 == 0 ? len - off : (seed >> 13) % (len - off + 1);
        if (round % 11 == 0)
            off = len - part; /* ends at the tensor's last byte */
        ft_buf b = ft_host_buf(buf, (size_t)part);
        ft_load_opts lo = {.flags = round % 2 ? FT_LOAD_VERIFY : 0};
        memset(buf, 0xa5, (size_t)part);
        T_EQ(ft_ckpt_read_range(c, k, off, &b, &lo), (int64_t)part);
        T_MEMEQ(buf, (uint8_t *)o[k].t.data.ptr + off, (size_t)part);
    }
    ft_buf one = ft_host_buf(buf, 1);
    uint64_t len0 = o[0].t.data.len;
    T_EQ(ft_ckpt_read_range(c, 0, len0, &one, NULL), -ERANGE);
    T_EQ(ft_ckpt_read_range(c, 0, UINT64_MAX, &one, NULL), -ERANGE);
    T_EQ(ft_ckpt_read_range(c, n, 0, &one, NULL), -EINVAL);
    T_EQ(ft_ckpt_read_range(c, 0, 0, NULL, NULL), -EINVAL);
    t_fault_set(T_OP_PREAD, T_FAULT_ERRNO, EIO, 1, 0);
    ft_buf some = ft_host_buf(buf, 100000);
    ft_load_opts posix = {.engine = FT_ENGINE_POSIX}; /* a pread, whatever AUTO would pick */
    T_EQ(ft_ckpt_read_range(c, 0, 12345, &some, &posix), -EIO);
    T_TRUE(t_fault_clear() >= 1);
    ft_tensor_info info;
    T_EQ(ft_ckpt_info(c, 2, &info), 0);
    ft_ckpt_close(c);
    T_TRUE(flip_byte(path, info.file_offset + 5000, 0x01)); /* in tensor 2's second block */
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    ft_load_opts verify = {.flags = FT_LOAD_VERIFY};
    ft_buf near = ft_host_buf(buf, 10);
    T_EQ(ft_ckpt_read_range(c, 2, 4995, &near, &verify), -EBADMSG); /* holds it */
    T_TRUE(strstr(ft_last_error(), o[2].name) != NULL);
    T_EQ(ft_ckpt_read_range(c, 2, 100, &near, &verify), 10); /* the block before is fine */
    T_EQ(ft_ckpt_read_range(c, 2, 4995, &near, NULL), 10);   /* unverified, it reads */
    ft_ckpt_close(c);
    t_free_misaligned(buf, 3);
    free(list);
    free_tensors(o, n);
}

/* ft_ckpt_read_ranges: sets of up to 64 ranges of a tensor (any offsets, lengths, overlapping
 * sources, unaligned destinations) byte-exact, verified or not; a range outside the tensor
 * and nothing is read; a failed read is the call's error; a flipped byte is found by a
 * verified range near it. */
static void case_read_ranges(void)
{
    owned_tensor *o = make_tensors(1, FT_DTYPE_U8, 23, 700000);
    uint64_t len = o[0].t.data.len;
    const uint8_t *src = o[0].t.data.ptr;
    ft_tensor *list = list_of(o, 1);
    ft_save_opts so = {.checksum_block = 4096};
    const char *path = t_path("ranges.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, 1, &so), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    enum { MAXR = 64 };
    uint8_t *buf = t_alloc_misaligned(MAXR * 8192 + 64, 5);
    ft_batch_op ops[MAXR];
    uint64_t seed = 9;
    for (unsigned round = 0; round < 60; round++) {
        size_t n = 1 + round % MAXR, at = 0;
        uint64_t total = 0;
        for (size_t k = 0; k < n; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t part = (seed >> 40) % 8193, off = (seed >> 13) % (len - part + 1);
            if (k == 0 && round % 5 == 0)
                off = len - part; /* up to the tensor's last byte */
            ops[k] = (ft_batch_op){ft_host_buf(buf + at + k % 3, (size_t)part), off, -1};
            at += part + 3;
            total += part;
        }
        memset(buf, 0xa5, at + 3);
        ft_load_opts lo = {.flags = round % 2 ? FT_LOAD_VERIFY : 0};
        T_EQ(ft_ckpt_read_ranges(c, 0, ops, n, &lo), (int64_t)total);
        for (size_t k = 0; k < n; k++) {
            T_EQ(ops[k].result, (int64_t)ops[k].buf.len);
            T_MEMEQ(ops[k].buf.ptr, src + ops[k].offset, ops[k].buf.len);
        }
    }
    T_EQ(ft_ckpt_read_ranges(c, 0, ops, 0, NULL), 0);
    T_EQ(ft_ckpt_read_ranges(c, 0, NULL, 1, NULL), -EINVAL);
    T_EQ(ft_ckpt_read_ranges(c, 1, ops, 1, NULL), -EINVAL);
    memset(buf, 0x5a, 200);
    ops[0] = (ft_batch_op){ft_host_buf(buf, 100), 0, 0};
    ops[1] = (ft_batch_op){ft_host_buf(buf + 100, 100), len - 99, 0}; /* one past the end */
    T_EQ(ft_ckpt_read_ranges(c, 0, ops, 2, NULL), -ERANGE);
    T_TRUE(strstr(ft_last_error(), "range 1") != NULL);
    for (int i = 0; i < 200; i++) /* none was read */
        T_EQ(buf[i], 0x5a);
    ops[1].offset = len - 100;
    t_fault_set(T_OP_PREAD, T_FAULT_ERRNO, EIO, 1, 0);
    ft_load_opts posix = {.engine = FT_ENGINE_POSIX}; /* a pread, whatever AUTO would pick */
    T_EQ(ft_ckpt_read_ranges(c, 0, ops, 2, &posix), -EIO);
    T_TRUE(t_fault_clear() >= 1);
    ft_tensor_info info;
    T_EQ(ft_ckpt_info(c, 0, &info), 0);
    ft_ckpt_close(c);
    T_TRUE(flip_byte(path, info.file_offset + 70000, 0x10));
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    ft_load_opts verify = {.flags = FT_LOAD_VERIFY};
    ops[1] = (ft_batch_op){ft_host_buf(buf + 100, 10), 69995, 0};
    T_EQ(ft_ckpt_read_ranges(c, 0, ops, 2, &verify), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), o[0].name) != NULL);
    T_EQ(ft_ckpt_read_ranges(c, 0, ops, 2, NULL), 110); /* unverified, it reads */
    T_EQ(buf[100 + 5], (uint8_t)(src[70000] ^ 0x10));
    ft_ckpt_close(c);
    t_free_misaligned(buf, 5);
    free(list);
    free_tensors(o, 1);
}

/* Saves lay tensors out as safetensors does (larger elements first, then by name, each aligned
 * to its element size), whatever order they are given in; ft_ckpt_read_shard_range reads any
 * byte range of a shard's data section (across tensors, edges, unaligned buffers), verified or
 * not, byte-exact, and refuses ranges outside it. */
static void case_layout_and_shard_ranges(void)
{
    size_t n = 60;
    owned_tensor *o = make_tensors(n, FT_DTYPE_COUNT, 9, 3000);
    ft_tensor *list = list_of(o, n);
    for (size_t i = 0; i + 1 < n; i += 2) { /* given in no particular order */
        ft_tensor t = list[i];
        list[i] = list[n - 1 - i];
        list[n - 1 - i] = t;
    }
    const char *path = t_path("layout.safetensors");
    uint8_t *buf = t_alloc_misaligned(1u << 20, 5);
    for (int sharded = 0; sharded < 2; sharded++) {
        ft_save_opts so = {.checksum_block = 4096, .shard_size = sharded ? 20000 : 0};
        T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        unsigned shards = ft_ckpt_shard_count(c);
        T_TRUE(sharded ? shards > 2 : shards == 1);
        for (unsigned k = 0; k < shards; k++) {
            uint64_t size = (uint64_t)ft_ckpt_shard_size(c, k);
            uint8_t *image = calloc(1, (size_t)size + 1);
            ft_tensor_info prev = {0};
            for (size_t i = 0; i < ft_ckpt_count(c); i++) { /* file order within a shard */
                ft_tensor_info info;
                T_EQ(ft_ckpt_info(c, i, &info), 0);
                if (info.shard != k)
                    continue;
                unsigned bits = ft_dtype_bits(info.dtype);
                T_EQ(info.data_offset % (bits >= 8 ? bits / 8 : 1), 0);
                if (prev.name) { /* safetensors' dtype rank down, then by name */
                    unsigned pr = ft_dtype_rank(prev.dtype), r = ft_dtype_rank(info.dtype);
                    T_TRUE(pr > r || (pr == r && strcmp(prev.name, info.name) < 0));
                }
                prev = info;
                int64_t at = ft_ckpt_find(c, info.name);
                T_TRUE(at >= 0);
                size_t j = 0;
                while (j < n && strcmp(o[j].name, info.name) != 0)
                    j++;
                T_TRUE(j < n);
                memcpy(image + info.data_offset, o[j].t.data.ptr, (size_t)info.nbytes);
            }
            uint64_t seed = 11 + k;
            for (unsigned round = 0; round < 60; round++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                uint64_t off = (seed >> 33) % (size + 1);
                uint64_t len = (seed >> 11) % (size - off + 1);
                len = len > (1u << 20) ? 1u << 20 : len;
                if (round % 9 == 0)
                    off = size - len; /* ends at the last byte */
                ft_buf b = ft_host_buf(buf, (size_t)len);
                ft_load_opts lo = {.flags = round % 2 ? FT_LOAD_VERIFY : 0};
                memset(buf, 0x5a, (size_t)len);
                T_EQ(ft_ckpt_read_shard_range(c, k, off, &b, &lo), (int64_t)len);
                T_MEMEQ(buf, image + off, (size_t)len);
            }
            ft_buf one = ft_host_buf(buf, 1);
            T_EQ(ft_ckpt_read_shard_range(c, k, size, &one, NULL), -ERANGE);
            T_EQ(ft_ckpt_read_shard_range(c, k, UINT64_MAX, &one, NULL), -ERANGE);
            free(image);
        }
        ft_buf one = ft_host_buf(buf, 1);
        T_EQ(ft_ckpt_read_shard_range(c, shards, 0, &one, NULL), -EINVAL);
        T_EQ(ft_ckpt_read_shard_range(NULL, 0, 0, &one, NULL), -EINVAL);
        T_EQ(ft_ckpt_read_shard_range(c, 0, 0, NULL, NULL), -EINVAL);
        ft_ckpt_close(c);
    }
    t_free_misaligned(buf, 5);
    free(list);
    free_tensors(o, n);
}

/* The recorded checksums are plain XXH3-64 of each block of the data section, whichever
 * SIMD path computed them (libxxhash's run-time dispatcher where it has one): any tool with
 * xxhash can check them. */
static void case_checksums_are_xxh3(void)
{
    size_t n = 5;
    owned_tensor *o = make_tensors(n, FT_DTYPE_U8, 7, 30000);
    ft_tensor *list = list_of(o, n);
    ft_save_opts so = {.checksum_block = 4096};
    const char *path = t_path("xxh3.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    uint64_t start = (uint64_t)ft_ckpt_shard_data_start(c, 0);
    uint64_t size = start + (uint64_t)ft_ckpt_shard_size(c, 0); /* the file's */
    ft_ckpt_close(c);
    uint8_t *file = malloc(size);
    int fd = open(path, O_RDONLY);
    T_EQ(pread(fd, file, size, 0), (ssize_t)size);
    close(fd);
    const char *key = "\"fastensor.checksums\":\"";
    char *hex = memmem(file, start, key, strlen(key));
    T_TRUE(hex != NULL);
    hex += strlen(key);
    uint64_t blocks = (size - start + 4095) / 4096;
    T_TRUE(blocks > 4);
    for (uint64_t b = 0; hex && b < blocks; b++) {
        char digits[17] = {0};
        memcpy(digits, hex + 16 * b, 16);
        uint64_t len = size - start - b * 4096 < 4096 ? size - start - b * 4096 : 4096;
        T_EQ(strtoull(digits, NULL, 16), XXH3_64bits(file + start + b * 4096, len));
    }
    free(file);
    free(list);
    free_tensors(o, n);
}

static void case_sharded(void)
{
    size_t n = 24;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 3, 200000);
    ft_tensor *list = list_of(o, n);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/sharded", t_dir());
    mkdir(dir, 0755);
    char path[4300], index[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s.index.json", path);
    ft_save_opts so = {.shard_size = 2u << 20};
    T_EQ(ft_ckpt_save(ctx, path, list, n, &so), 0);
    check_ckpt(index, o, n, true);
    check_ckpt(dir, o, n, true); /* a directory holding the index */
    check_ckpt(path, o, n, false); /* the name it was saved under opens the index */
    ft_ckpt *c;
    t_fault_set(T_OP_STAT, T_FAULT_ERRNO, EIO, 2, 1); /* the index's stat, after the name's */
    T_EQ(ft_ckpt_open(ctx, &c, path), -ENOENT);
    T_EQ(t_fault_clear(), 1);
    T_TRUE(strstr(ft_last_error(), "model.safetensors") != NULL);
    T_EQ(ft_ckpt_open(ctx, &c, index), 0);
    T_TRUE(ft_ckpt_shard_count(c) > 2);
    T_TRUE(strstr(ft_ckpt_shard_path(c, 0), "model-00001-of-") != NULL);
    for (unsigned k = 0; k < ft_ckpt_shard_count(c); k++) { /* each shard stands alone */
        ft_ckpt *one;
        T_EQ(ft_ckpt_open(ctx, &one, ft_ckpt_shard_path(c, k)), 0);
        T_EQ(ft_ckpt_verify(one, NULL, NULL, NULL), 0);
        ft_ckpt_close(one);
    }
    ft_ckpt_close(c);
    /* no temporary files remain */
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-"))
            T_FAIL("temporary file left behind: %s", e->d_name);
    closedir(d);
    free(list);
    free_tensors(o, n);
}

/* Write a safetensors file by hand: @p json as header (no padding), then @p data. */
static void write_raw(const char *path, const char *json, const void *data, size_t len,
                      uint64_t sparse_gap)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    uint64_t n = strlen(json);
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)(n >> (8 * k));
    if (write(fd, le, 8) != 8 || write(fd, json, n) != (ssize_t)n)
        abort();
    if (sparse_gap && ftruncate(fd, (off_t)(8 + n + sparse_gap)) != 0)
        abort();
    if (len && pwrite(fd, data, len, (off_t)(8 + n + sparse_gap)) != (ssize_t)len)
        abort();
    close(fd);
}

static void case_foreign_files(void)
{
    /* unaligned data start, no metadata, keys in any order */
    uint8_t data[4 * 3 + 2 * 5 + 1];
    t_fill_random(data, sizeof data, 9);
    const char *json = "{\"b\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[12,22]},"
                       "\"a\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                       "\"c\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[22,23]}}";
    const char *path = t_path("foreign.safetensors");
    write_raw(path, json, data, sizeof data, 0);
    for (int e = 0; e < FT_ENGINE_COUNT; e++) {
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_count(c), 3);
        T_EQ(ft_ckpt_has_checksums(c), 0);
        ft_load_opts lo = {.engine = (ft_engine)e, .flags = FT_LOAD_VERIFY};
        T_EQ(ft_ckpt_load_all(c, &lo), 0); /* no checksums: verify has nothing to check */
        T_MEMEQ(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, "a")), data, 12);
        T_MEMEQ(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, "b")), data + 12, 10);
        T_MEMEQ(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, "c")), data + 22, 1);
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), -ENODATA);
        ft_ckpt_close(c);
    }
    /* a tensor beyond 4 GiB in a sparse file */
    uint64_t gap = (4ull << 30) + 4093;
    char big[256];
    snprintf(big, sizeof big,
             "{\"hole\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]},"
             "\"far\":{\"dtype\":\"U8\",\"shape\":[23],\"data_offsets\":[%llu,%llu]}}",
             (unsigned long long)gap, (unsigned long long)gap, (unsigned long long)gap,
             (unsigned long long)gap + 23);
    const char *sparse = t_path("sparse.safetensors");
    write_raw(sparse, big, data, 23, gap);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, sparse), 0);
    int64_t k = ft_ckpt_find(c, "far");
    ft_tensor_info info;
    T_EQ(ft_ckpt_info(c, (size_t)k, &info), 0);
    T_TRUE(info.file_offset > (4ull << 30));
    uint8_t got[23];
    ft_buf b = ft_host_buf(got, sizeof got);
    T_EQ(ft_ckpt_load_tensor(c, (size_t)k, &b, NULL), 23);
    T_MEMEQ(got, data, 23);
    ft_ckpt_close(c);
    unlink(sparse);
}

typedef struct bad_case {
    const char *json;   /* header; NULL: raw bytes below */
    size_t data_len;
    const char *expect; /* substring of the message */
} bad_case;

static void case_validation(void)
{
    static const bad_case cases[] = {
        {"[1]", 0, "does not start with '{'"},
        {"{\"a\":", 0, "JSON error"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate"},
        {"{\"a\":{\"dtype\":\"F5\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "whole bytes"},
        {"{\"a\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
         "does not match"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
         4, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "does not match"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "end before"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "cover 4 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlaps"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a hole"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
         "exactly dtype"},
        {"{\"a\":[1,2]}", 0, "not an object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "two non-negative"},
        {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "must be a string"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "is not a string"},
        {"{\"__metadata__\":[]}", 0, "__metadata__ is not an object"},
        {"{\"__metadata__\":{\"fastensor.checksum\":\"md5\"}}", 0, "fastensor.checksum"},
        {"{\"__metadata__\":{\"fastensor.checksum\":\"xxh3-64\",\"fastensor.block_size\":"
         "\"4096\",\"fastensor.checksums\":\"12\"}}", 0, "one 16-digit"},
        {"{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "UTF-8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
         "\"data_offsets\":[0,4]}}", 4, "more than 16"},
    };
    uint8_t zeros[16] = {0};
    const char *path = t_path("bad.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_raw(path, cases[i].json, zeros, cases[i].data_len, 0);
        ft_ckpt *c = NULL;
        int rc = ft_ckpt_open(ctx, &c, path);
        if (rc != -EBADMSG || !strstr(ft_last_error(), cases[i].expect))
            T_FAIL("case %zu (%s): rc %d, message '%s'", i, cases[i].expect, rc,
                   ft_last_error());
        T_TRUE(c == NULL);
    }
    /* framing errors */
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    T_EQ(write(fd, "abc", 3), 3);
    close(fd);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "shorter than") != NULL);
    uint8_t hdr[8] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    T_EQ(write(fd, hdr, 8), 8);
    close(fd);
    T_EQ(ft_ckpt_open(ctx, &c, path), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "limit") != NULL);
    hdr[0] = 100;
    hdr[1] = hdr[2] = hdr[3] = 0;
    fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    T_EQ(write(fd, hdr, 8), 8);
    T_EQ(write(fd, "{}", 2), 2);
    close(fd);
    T_EQ(ft_ckpt_open(ctx, &c, path), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "truncated: its header needs 108 bytes, the file holds 10"));
    static const struct { const char *head; const char *says; } foreign[] = {
        {"PK\x03\x04\x14\0\0\0", "zip archive"}, {"\x80\x02}q\0(X\x01", "pickle"},
        {"\x93NUMPY\x01\0", ".npy"}, {"GGUF\x03\0\0\0", "GGUF"},
        {"FASTENSZ", ".fst container"}};
    for (unsigned i = 0; i < sizeof foreign / sizeof *foreign; i++) {
        fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        T_EQ(write(fd, foreign[i].head, 8), 8);
        T_EQ(write(fd, "0123456789abcdef", 16), 16);
        close(fd);
        T_EQ(ft_ckpt_open(ctx, &c, path), -EBADMSG);
        T_TRUE(strstr(ft_last_error(), foreign[i].says) != NULL);
    }
    T_EQ(ft_ckpt_open(ctx, &c, t_path("absent.safetensors")), -ENOENT);
}

static void case_index_paths(void)
{
    char dir[4200], inner[4300], path[4400], outside[4400], link[4400];
    snprintf(dir, sizeof dir, "%s/idx", t_dir());
    mkdir(dir, 0755);
    snprintf(inner, sizeof inner, "%s/a..b.safetensors", dir); /* a plain name, dots and all */
    uint32_t v = 7;
    ft_tensor t = {"w", FT_DTYPE_U32, 0, NULL, ft_host_buf(&v, 4)};
    T_EQ(ft_ckpt_save(ctx, inner, &t, 1, NULL), 0);
    snprintf(outside, sizeof outside, "%s/outside.safetensors", t_dir());
    T_EQ(ft_ckpt_save(ctx, outside, &t, 1, NULL), 0);
    snprintf(link, sizeof link, "%s/link.safetensors", dir);
    T_EQ(symlink(outside, link), 0);
    snprintf(path, sizeof path, "%s/m.safetensors.index.json", dir);
    static const struct { const char *json; int rc; const char *expect; } cases[] = {
        {"{\"weight_map\":{\"w\":\"../outside.safetensors\"}}", -EINVAL, "not a plain"},
        {"{\"weight_map\":{\"w\":\"/etc/passwd\"}}", -EINVAL, "not a plain"},
        {"{\"weight_map\":{\"w\":\"..\"}}", -EINVAL, "not a plain"},
        {"{\"weight_map\":{\"w\":\"a\\u0000b\"}}", -EBADMSG, "u0000"},
        {"{\"metadata\":{\"total_size\":8},\"weight_map\":{\"w\":\"a..b.safetensors\"}}",
         -EBADMSG, "total_size says 8 bytes, the shards' tensors hold 4 "},
        {"{\"metadata\":{\"total_size\":\"abc\"},\"weight_map\":{\"w\":\"a..b.safetensors\"}}",
         -EBADMSG, "total_size is not a byte count (a non-negative integer): Bad message"},
        {"{\"metadata\":{\"total_size\":-4},\"weight_map\":{\"w\":\"a..b.safetensors\"}}",
         -EBADMSG, "total_size is not a byte count (a non-negative integer): Bad message"},
        {"{\"weight_map\":{\"w\":\"link.safetensors\"}}", -EINVAL, "outside"},
        {"{\"weight_map\":{\"w\":\"missing.safetensors\"}}", -ENOENT, "missing"},
        {"{\"weight_map\":{\"x\":\"a..b.safetensors\"}}", -EBADMSG, "not in the weight map"},
        {"{\"weight_map\":{}}", -EBADMSG, "non-empty"},
        {"{\"weight_map\":{\"w\":3}}", -EBADMSG, "not a file name"},
        {"[]", -EBADMSG, "weight_map"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        t_write_text(path, cases[i].json);
        ft_ckpt *c = NULL;
        int rc = ft_ckpt_open(ctx, &c, path);
        if (rc != cases[i].rc || !strstr(ft_last_error(), cases[i].expect))
            T_FAIL("index case %zu: rc %d, message '%s'", i, rc, ft_last_error());
    }
    t_write_text(path,
               "{\"metadata\":{\"total_size\":4},\"weight_map\":{\"w\":\"a..b.safetensors\"}}");
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    ft_ckpt_close(c);
    unlink(link);
}

/* XOR the byte at file offset @p at with @p mask. @return whether it was done. */
static bool flip_byte(const char *path, uint64_t at, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    uint8_t byte = 0;
    bool ok = fd >= 0 && pread(fd, &byte, 1, (off_t)at) == 1;
    byte ^= mask;
    ok = ok && pwrite(fd, &byte, 1, (off_t)at) == 1;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Flip one bit in the data section: verify names the block and tensor; load+verify fails. */
static void case_flipped_bit(void)
{
    size_t n = 6;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 4, 300000);
    ft_tensor *list = list_of(o, n);
    const char *path = t_path("flip.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, NULL), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    ft_tensor_info info;
    T_EQ(ft_ckpt_info(c, 3, &info), 0);
    ft_ckpt_close(c);
    uint64_t at = info.file_offset + info.nbytes / 2;
    T_TRUE(flip_byte(path, at, 0x10));
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), -EBADMSG);
    char want[96];
    snprintf(want, sizeof want, "block %llu ", (unsigned long long)((at - (info.file_offset -
                                                 info.data_offset)) >> 20));
    T_TRUE(strstr(ft_last_error(), want) != NULL);
    T_TRUE(strstr(ft_last_error(), o[3].name) != NULL);
    ft_load_opts lo = {.flags = FT_LOAD_VERIFY};
    T_EQ(ft_ckpt_load_all(c, &lo), -EBADMSG);
    uint8_t *buf = malloc(info.nbytes);
    ft_buf b = ft_host_buf(buf, (size_t)info.nbytes);
    T_EQ(ft_ckpt_load_tensor(c, 3, &b, &lo), -EBADMSG);
    uint8_t *buf2 = malloc(o[2].t.data.len);
    ft_buf b2 = ft_host_buf(buf2, o[2].t.data.len);
    T_EQ(ft_ckpt_load_tensor(c, (size_t)ft_ckpt_find(c, o[2].name), &b2, &lo),
         o[2].t.data.len); /* blocks elsewhere are fine */
    T_MEMEQ(buf2, o[2].t.data.ptr, o[2].t.data.len);
    free(buf2);
    T_EQ(ft_ckpt_load_all(c, NULL), 0); /* without verification it loads */
    ft_ckpt_close(c);
    free(buf);
    free(list);
    free_tensors(o, n);
}

/* Flip a byte of each tensor of a block that 40 small tensors share: each time, exactly the
 * tensor whose byte was flipped is named (by its part checksum). */
static void case_flipped_shared_block(void)
{
    size_t n = 40;
    owned_tensor *o = make_tensors(n, FT_DTYPE_F32, 5, 2000);
    ft_tensor *list = list_of(o, n);
    const char *path = t_path("shared.safetensors");
    T_EQ(ft_ckpt_save(ctx, path, list, n, NULL), 0);
    for (size_t victim = 0; victim < n; victim += 7) {
        if (!o[victim].t.data.len)
            continue;
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        ft_tensor_info info;
        T_EQ(ft_ckpt_info(c, (size_t)ft_ckpt_find(c, o[victim].name), &info), 0);
        ft_ckpt_close(c);
        uint64_t at = info.file_offset + info.nbytes / 3;
        T_TRUE(flip_byte(path, at, 0x41));
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), -EBADMSG);
        char want[128];
        snprintf(want, sizeof want, "bad bytes are in tensor '%s'", o[victim].name);
        if (!strstr(ft_last_error(), want))
            T_FAIL("flipped a byte of %s, the error says: %s", o[victim].name, ft_last_error());
        ft_ckpt_close(c);
        T_TRUE(flip_byte(path, at, 0x41)); /* mend it for the next round */
    }
    free(list);
    free_tensors(o, n);
}

static bool file_equals(const char *path, const char *content)
{
    char buf[64] = {0};
    int fd = open(path, O_RDONLY);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n == (ssize_t)strlen(content) && memcmp(buf, content, (size_t)n) == 0;
}

/* Bad input and failing disks never destroy the file already there, nor leave temporaries. */
static void case_failed_saves(void)
{
    const char *path = t_path("keep.safetensors");
    t_write_text(path, "previous contents");
    uint8_t data[4096];
    uint64_t shape[1] = {1024};
    ft_tensor good = {"x", FT_DTYPE_F32, 1, shape, ft_host_buf(data, sizeof data)};
    ft_tensor two[2] = {good, good};
    T_EQ(ft_ckpt_save(ctx, path, two, 2, NULL), -EINVAL); /* duplicate name */
    T_TRUE(strstr(ft_last_error(), "twice") != NULL);
    ft_tensor wrong = good;
    wrong.data.len = 100;
    T_EQ(ft_ckpt_save(ctx, path, &wrong, 1, NULL), -EINVAL);
    wrong = good;
    wrong.dtype = (ft_dtype)99;
    T_EQ(ft_ckpt_save(ctx, path, &wrong, 1, NULL), -EINVAL);
    wrong = good;
    wrong.name = "__metadata__";
    T_EQ(ft_ckpt_save(ctx, path, &wrong, 1, NULL), -EINVAL);
    ft_save_opts bad_block = {.checksum_block = 1000};
    T_EQ(ft_ckpt_save(ctx, path, &good, 1, &bad_block), -EINVAL);
    t_fault_set(T_OP_PWRITE, T_FAULT_ERRNO, ENOSPC, 1, 0);
    int rc = ft_ckpt_save(ctx, path, &good, 1, NULL);
    t_fault_clear();
    T_EQ(rc, -ENOSPC);
    t_fault_set(T_OP_FDATASYNC, T_FAULT_ERRNO, EIO, 1, 0);
    rc = ft_ckpt_save(ctx, path, &good, 1, NULL);
    t_fault_clear();
    T_EQ(rc, -EIO);
    T_TRUE(file_equals(path, "previous contents"));
    DIR *d = opendir(t_dir());
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, "keep.safetensors.tmp"))
            T_FAIL("temporary file left behind: %s", e->d_name);
    closedir(d);
    T_EQ(ft_ckpt_save(ctx, path, &good, 1, NULL), 0);
    T_TRUE(!file_equals(path, "previous contents"));
}

/* A .fst save of many batches (more than the writer's three buffers, writes of several in
 * flight) whose Nth write or allocation fails, coded and stored: the error, the previous
 * file intact, no temporary; then a save that succeeds reads back byte-exactly. */
static void case_fst_failed_writes(void)
{
    const char *path = t_path("many.fst");
    t_write_text(path, "previous contents");
    enum { N = 24, ELEMS = 3 << 20 }; /* 24 bf16 tensors of 6 MiB: about 7 batches */
    uint16_t *w = malloc(sizeof *w * (size_t)N * ELEMS);
    for (size_t i = 0; i < (size_t)N * ELEMS; i++)
        w[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 64) ^ (i & 1 ? 0x8000 : 0);
    uint64_t shape[1] = {ELEMS};
    char names[N][16];
    ft_tensor t[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "w%d", i);
        t[i] = (ft_tensor){names[i], FT_DTYPE_BF16, 1, shape,
                           ft_host_buf(w + (size_t)i * ELEMS, sizeof *w * ELEMS)};
    }
    static const struct { enum t_fault_op op; unsigned nth; } faults[] = {
        {T_OP_PWRITE, 1}, {T_OP_PWRITE, 5}, {T_OP_PWRITE, 11}, {T_OP_FALLOCATE, 3}};
    for (int mode = FT_COMPRESS_ALWAYS; mode <= FT_COMPRESS_NONE; mode++) {
        ft_save_opts so = {.engine = FT_ENGINE_DIRECT, .compression = (ft_compression)mode};
        unsigned hit = 0;
        for (size_t f = 0; f < sizeof faults / sizeof *faults; f++) {
            t_fault_set(faults[f].op, T_FAULT_ERRNO, EIO, faults[f].nth, 0);
            int rc = ft_ckpt_save(ctx, path, t, N, &so);
            unsigned got = t_fault_clear();
            if (got == 0) { /* (a filesystem that does not reserve: no such call) */
                T_EQ(rc, 0);
                t_write_text(path, "previous contents");
                continue;
            }
            T_EQ(rc, -EIO);
            T_TRUE(file_equals(path, "previous contents"));
            hit++;
        }
        T_TRUE(hit >= 3); /* the writes' faults at least */
        DIR *d = opendir(t_dir());
        struct dirent *e;
        while ((e = readdir(d)))
            if (strstr(e->d_name, "many.fst") && strcmp(e->d_name, "many.fst"))
                T_FAIL("temporary file left behind: %s", e->d_name);
        closedir(d);
        T_EQ(ft_ckpt_save(ctx, path, t, N, &so), 0);
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_load_all(c, NULL), 0);
        for (int i = 0; i < N; i++)
            T_TRUE(!memcmp(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, names[i])), t[i].data.ptr,
                           t[i].data.len));
        ft_ckpt_close(c);
        t_write_text(path, "previous contents");
    }
    free(w);
}

/* .fst saves of streams larger than a batch's buffer (kept by the context between saves,
 * a larger need replacing the smallest) between runs of small ones (written together), their
 * sizes and bytes changing from save to save: each loads byte-exactly, and its file is the
 * one a fresh context writes. */
static void case_fst_large(void)
{
    enum { BIG = 3, SMALLS = 5 };
    static const size_t big_elems[3][BIG] = {{36u << 20, 40u << 20, 1u << 20},
                                             {34u << 20, 33u << 20, 45u << 20},
                                             {50u << 20, 35u << 20, 37u << 20}};
    uint16_t *w = malloc(sizeof *w * (50u << 20));
    uint16_t *r = malloc(sizeof *r * (45u << 20));
    uint8_t *s = malloc(SMALLS * 9000);
    ft_ctx *fresh;
    T_EQ(ft_ctx_create(&fresh, NULL), 0);
    for (int save = 0; save < 3; save++) {
        for (size_t i = 0; i < (50u << 20); i++) /* bf16 weights: coded */
            w[i] = (uint16_t)(0x3c00 + ((i + (size_t)save) * 2654435761u >> 20) % 64) ^
                   (i & 1 ? 0x8000 : 0);
        t_fill_random(r, sizeof *r * (45u << 20), 90 + (uint64_t)save); /* stored */
        t_fill_random(s, SMALLS * 9000, 190 + (uint64_t)save);
        char names[BIG + 2 * SMALLS][16];
        uint64_t shapes[BIG + 2 * SMALLS][1];
        ft_tensor t[BIG + 2 * SMALLS];
        size_t n = 0;
        for (int k = 0; k < BIG; k++) {
            for (int j = 0; j < (k == 1 ? SMALLS : 0); j++, n++) { /* 1 to 9 KiB, odd sizes */
                snprintf(names[n], sizeof names[n], "small%d", j);
                shapes[n][0] = 1000u + 1999u * (unsigned)j + (unsigned)save;
                t[n] = (ft_tensor){names[n], FT_DTYPE_U8, 1, shapes[n],
                                   ft_host_buf(s + 9000 * j, (size_t)shapes[n][0])};
            }
            snprintf(names[n], sizeof names[n], "big%d", k);
            shapes[n][0] = big_elems[save][k];
            t[n] = (ft_tensor){names[n], FT_DTYPE_BF16, 1, shapes[n],
                               ft_host_buf(k == 1 ? (void *)r : (void *)w,
                                           sizeof *w * big_elems[save][k])};
            n++;
        }
        for (int j = 0; j < SMALLS; j++, n++) { /* bf16 norms: coded, 2-8 KiB */
            snprintf(names[n], sizeof names[n], "norm%d", j);
            shapes[n][0] = 1024u + 1000u * (unsigned)j;
            t[n] = (ft_tensor){names[n], FT_DTYPE_BF16, 1, shapes[n],
                               ft_host_buf(w + 4096 * j, 2 * (size_t)shapes[n][0])};
        }
        ft_save_opts so = {.compression = FT_COMPRESS_ALWAYS};
        const char *path = t_path("large.fst"), *other = t_path("large-fresh.fst");
        T_EQ(ft_ckpt_save(ctx, path, t, n, &so), 0);
        T_EQ(ft_ckpt_save(fresh, other, t, n, &so), 0);
        T_TRUE(t_same_files(path, other));
        ft_ctx_destroy(fresh);
        T_EQ(ft_ctx_create(&fresh, NULL), 0);
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_load_all(c, NULL), 0);
        for (size_t i = 0; i < n; i++) {
            int64_t at = ft_ckpt_find(c, t[i].name);
            T_TRUE(at >= 0 && !memcmp(ft_ckpt_data(c, (size_t)at), t[i].data.ptr,
                                      t[i].data.len));
        }
        uint64_t stored;
        T_EQ(ft_ckpt_stored(c, (size_t)ft_ckpt_find(c, "big0"), &stored), 1);
        T_EQ(ft_ckpt_stored(c, (size_t)ft_ckpt_find(c, "big1"), &stored), 0);
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), 0);
        ft_ckpt_close(c);
    }
    ft_ctx_destroy(fresh);
    free(w);
    free(r);
    free(s);
}

/* Kill a saving child at random moments: the final name always holds a whole checkpoint,
 * the old one or the new one. */
static void case_crash_atomicity(void)
{
    if (!t_fork_threads_ok())
        return;
    const char *path = t_path("crash.safetensors");
    size_t n = 8, rounds = 30;
    owned_tensor *a = make_tensors(n, FT_DTYPE_F32, 10, 400000);
    owned_tensor *b = make_tensors(n, FT_DTYPE_F32, 11, 400000);
    ft_tensor la[8], lb[8];
    for (size_t i = 0; i < n; i++) {
        la[i] = a[i].t;
        lb[i] = b[i].t;
    }
    T_EQ(ft_ckpt_save(ctx, path, la, n, NULL), 0);
    srand((unsigned)time(NULL));
    unsigned saw_a = 0, saw_b = 0;
    for (size_t r = 0; r < rounds; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            ft_ctx *cc = t_ctx(2);
            for (unsigned i = 0;; i++)
                ft_ckpt_save(cc, path, i % 2 ? la : lb, n, NULL);
        }
        usleep((useconds_t)(rand() % 400000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        ft_ckpt *c;
        int rc = ft_ckpt_open(ctx, &c, path);
        if (rc < 0)
            T_FAIL("round %zu: the checkpoint does not open: %s", r, ft_last_error());
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), 0);
        T_EQ(ft_ckpt_load_all(c, NULL), 0);
        const void *first = ft_ckpt_data(c, (size_t)ft_ckpt_find(c, a[0].name));
        bool is_a = !memcmp(first, a[0].t.data.ptr, a[0].t.data.len);
        bool is_b = !memcmp(first, b[0].t.data.ptr, b[0].t.data.len);
        T_TRUE(is_a || is_b);
        saw_a += is_a;
        saw_b += is_b;
        ft_ckpt_close(c);
    }
    printf("  %zu kills: old/new version seen %u/%u times, never a torn file\n", rounds, saw_a,
           saw_b);
    free_tensors(a, n);
    free_tensors(b, n);
}

/* Descriptors of this process open on files of the test directory (deleted ones too). */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char link[300], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        n += len > 0 && strncmp(target, t_dir(), strlen(t_dir())) == 0;
    }
    if (d)
        closedir(d);
    return d ? n : -1;
}

/* Wait (up to 10 s) for the references a save held to its replaced files to be dropped:
 * back to the @p base descriptors open before it (an earlier case that failed may have left
 * some). */
static void wait_fds(int base)
{
    for (int i = 0; i < 1000 && count_fds() != base; i++)
        usleep(10000);
    T_EQ(count_fds(), base);
}

/* A save that replaces a file, or removes an earlier save's shards, frees them off its own
 * path: afterwards every reference it held is dropped (no descriptor leaks), the name holds
 * the new checkpoint only, and a FIFO at the name is replaced without being opened. */
static void case_replace_reclaims(void)
{
    size_t n = 6;
    owned_tensor *a = make_tensors(n, FT_DTYPE_F32, 11, 1 << 18);
    owned_tensor *b = make_tensors(n, FT_DTYPE_U8, 12, 1 << 18);
    ft_tensor *la = list_of(a, n), *lb = list_of(b, n);
    const char *path = t_path("replace.safetensors");
    int base = count_fds();
    T_EQ(ft_ckpt_save(ctx, path, la, n, NULL), 0);
    T_EQ(ft_ckpt_save(ctx, path, lb, n, NULL), 0); /* over a single file */
    wait_fds(base);
    check_ckpt(path, b, n, true);
    ft_save_opts sharded = {.shard_size = 1 << 18};
    const char *index = t_path("replace.safetensors.index.json");
    T_EQ(ft_ckpt_save(ctx, path, la, n, &sharded), 0); /* removes the single file */
    wait_fds(base);
    check_ckpt(index, a, n, true);
    T_EQ(ft_ckpt_save(ctx, path, lb, n, &sharded), 0); /* removes the earlier shards */
    wait_fds(base);
    check_ckpt(index, b, n, true);
    T_EQ(ft_ckpt_save(ctx, path, la, n, NULL), 0); /* removes the index and its shards */
    wait_fds(base);
    check_ckpt(path, a, n, true);
    struct stat st;
    T_TRUE(stat(index, &st) != 0 && errno == ENOENT);
    const char *fifo = t_path("fifo.safetensors");
    unlink(fifo);
    T_EQ(mkfifo(fifo, 0600), 0);
    T_EQ(ft_ckpt_save(ctx, fifo, lb, n, NULL), 0);
    wait_fds(base);
    check_ckpt(fifo, b, n, false);
    free(la);
    free(lb);
    free_tensors(a, n);
    free_tensors(b, n);
}

/* .fst containers through the C API: every dtype and edge shape, coded and stored; loads,
 * ranges and verify decode them byte-exactly; a flipped byte names its tensor; bad options. */
static void case_fst(void)
{
    owned_tensor *o = make_tensors(40, FT_DTYPE_COUNT, 77, 3000);
    ft_tensor *list = list_of(o, 40);
    uint64_t wshape[1] = {300000}; /* bf16 weights: coded */
    uint16_t *w = malloc(sizeof *w * wshape[0]);
    for (size_t i = 0; i < wshape[0]; i++)
        w[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 64) ^ (i & 1 ? 0x8000 : 0);
    ft_tensor all[41];
    memcpy(all, list, sizeof *list * 40);
    all[40] = (ft_tensor){"weights", FT_DTYPE_BF16, 1, wshape,
                          ft_host_buf(w, sizeof *w * wshape[0])};
    const char *meta[] = {"step", "7", NULL};
    const char *path = t_path("m.fst");
    for (int mode = FT_COMPRESS_ALWAYS; mode <= FT_COMPRESS_NONE; mode++) {
        ft_save_opts so = {.compression = (ft_compression)mode, .metadata = meta};
        T_EQ(ft_ckpt_save(ctx, path, all, 41, &so), 0);
        ft_ckpt *c;
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_format(c), FT_FORMAT_FST);
        T_EQ(ft_ckpt_count(c), 41);
        T_EQ(ft_ckpt_has_checksums(c), 1);
        const char *k, *v;
        T_EQ(ft_ckpt_metadata(c, 0, &k, &v), 0);
        T_TRUE(!strcmp(k, "step") && !strcmp(v, "7"));
        uint64_t stored;
        int64_t wi = ft_ckpt_find(c, "weights");
        T_EQ(ft_ckpt_stored(c, (size_t)wi, &stored), mode == FT_COMPRESS_ALWAYS);
        T_TRUE(mode == FT_COMPRESS_NONE || stored < all[40].data.len * 3 / 4);
        T_EQ(ft_ckpt_load_all(c, NULL), 0);
        for (size_t i = 0; i < 41; i++) {
            int64_t at = ft_ckpt_find(c, all[i].name);
            T_TRUE(at >= 0);
            T_TRUE(!all[i].data.len ||
                   !memcmp(ft_ckpt_data(c, (size_t)at), all[i].data.ptr, all[i].data.len));
        }
        uint8_t part[1000]; /* a range across the middle of the coded tensor */
        ft_buf b = ft_host_buf(part, sizeof part);
        T_EQ(ft_ckpt_read_range(c, (size_t)wi, 4001, &b, NULL), (int64_t)sizeof part);
        T_TRUE(!memcmp(part, (uint8_t *)w + 4001, sizeof part));
        ft_batch_op ops[2] = {{ft_host_buf(part, 10), 7, 0}, {ft_host_buf(part + 10, 20), 90, 0}};
        T_EQ(ft_ckpt_read_ranges(c, (size_t)wi, ops, 2, NULL), 30);
        T_TRUE(!memcmp(part, (uint8_t *)w + 7, 10) && !memcmp(part + 10, (uint8_t *)w + 90, 20));
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), 0);
        ft_tensor_info info;
        T_EQ(ft_ckpt_info(c, (size_t)wi, &info), 0);
        ft_ckpt_close(c);
        if (mode != FT_COMPRESS_ALWAYS)
            continue;
        int fd = open(path, O_RDWR); /* a flipped byte inside the coded stream */
        uint8_t byte;
        off_t at = (off_t)(info.file_offset + stored / 2);
        T_EQ(pread(fd, &byte, 1, at), 1);
        byte ^= 0x10;
        T_EQ(pwrite(fd, &byte, 1, at), 1);
        close(fd);
        T_EQ(ft_ckpt_open(ctx, &c, path), 0);
        T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), -EBADMSG);
        T_TRUE(strstr(ft_last_error(), "tensor 'weights'") != NULL);
        T_EQ(ft_ckpt_load_all(c, NULL), -EBADMSG);
        uint8_t *one = malloc(o[3].t.data.len + 1);
        b = ft_host_buf(one, o[3].t.data.len);
        T_EQ(ft_ckpt_load_tensor(c, (size_t)ft_ckpt_find(c, o[3].t.name), &b, NULL),
             (int64_t)o[3].t.data.len); /* the others still read */
        T_TRUE(!memcmp(one, o[3].t.data.ptr, o[3].t.data.len));
        free(one);
        ft_ckpt_close(c);
    }
    ft_save_opts bad = {.shard_size = 1 << 20};
    T_EQ(ft_ckpt_save(ctx, path, all, 41, &bad), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "one file") != NULL);
    bad = (ft_save_opts){.compression = FT_COMPRESS_ALWAYS};
    T_EQ(ft_ckpt_save(ctx, t_path("x.safetensors"), all, 41, &bad), -EINVAL);
    bad = (ft_save_opts){.compression = FT_COMPRESS_COUNT};
    T_EQ(ft_ckpt_save(ctx, path, all, 41, &bad), -EINVAL);
    ft_tensor reserved = {"fastensor.container", FT_DTYPE_U8, 0, NULL, ft_host_buf(w, 1)};
    T_EQ(ft_ckpt_save(ctx, path, &reserved, 1, NULL), -EINVAL);
    ft_fst_cost cost;
    T_EQ(ft_fst_measure(ctx, t_dir(), 2, &cost), 0);
    T_TRUE(cost.encode > 0 && cost.share > 0.3 && cost.share < 1 && cost.write > 0);
    T_EQ(ft_fst_coding_pays(&cost), cost.encode * (1 - cost.share) >= 0.76 * cost.write &&
                                        cost.decode >= cost.read);
    /* which encoder codes GPU tensors: bad arguments, and the host's without a driver */
    double rate = -1;
    T_EQ(ft_fst_gpu_codes(ctx, 0, 3, &rate), -EINVAL);
    T_EQ(ft_fst_gpu_codes(ctx, 0, 1, &rate), -EINVAL);
    T_EQ(ft_fst_gpu_codes(ctx, -1, 2, &rate), -EINVAL);
    T_EQ(ft_fst_gpu_codes(NULL, 0, 2, &rate), -EINVAL);
    if (ft_cuda_available(NULL) != 1) {
        T_EQ(ft_fst_gpu_codes(ctx, 0, 2, &rate), 0);
        T_TRUE(rate == 0);
    }
    free(w);
    free(list);
    free_tensors(o, 40);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(4);
    const t_case cases[] = {
        {"every dtype, scalars, empty tensors, metadata", case_every_dtype},
        {"5000 small tensors, 4K checksum blocks", case_many_small},
        {"whether a shard is in the page cache", case_shard_cached},
        {"prefetch: keep reads a shard into the page cache, bypass does not", case_prefetch},
        {"prefetch_map: pieces mapped into the caller's mapping as they arrive", case_prefetch_map},
        {"checksums are plain XXH3-64 of each block", case_checksums_are_xxh3},
        {"sharded save, load by index and directory", case_sharded},
        {"hand-built files: unaligned data, no metadata, > 4 GiB offsets", case_foreign_files},
        {"every header validation failure", case_validation},
        {"byte ranges of tensors, verified or not", case_read_range},
        {"several ranges of a tensor as one batch", case_read_ranges},
        {"safetensors' layout order; byte ranges of shards", case_layout_and_shard_ranges},
        {"index paths that escape, mismatched weight maps", case_index_paths},
        {"a flipped bit is found by verify and verified loads", case_flipped_bit},
        {"a flipped byte in a shared block names its tensor", case_flipped_shared_block},
        {"failed saves keep the old file and leave no temporaries", case_failed_saves},
        {"crash atomicity: SIGKILL during saves", case_crash_atomicity},
        {"replaced and removed files are freed off the save's path", case_replace_reclaims},
        {".fst containers: save, load, ranges, verify, a flipped byte", case_fst},
        {".fst saves of many batches whose writes fail keep the old file", case_fst_failed_writes},
        {".fst streams larger than a batch's buffer and runs of small ones", case_fst_large},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
