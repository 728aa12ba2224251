/* Batches (ft_read_batch / ft_write_batch) on host memory: random sizes and offsets with
 * every edge, unaligned buffers, every engine writing and every engine reading back,
 * reads past the end, invalid ops (nothing runs), injected faults (the failed op is named,
 * the others complete), and registration refused without a GPU. */
#include "testlib.h"

#include <errno.h>

static ft_ctx *ctx;
static const ft_engine engines[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT, FT_ENGINE_URING,
                                    FT_ENGINE_MMAP, FT_ENGINE_AUTO};
#define NENGINES (sizeof engines / sizeof engines[0])

/* Sizes every op cycles through: empty, tiny, around a block, a few pieces. */
static const size_t edge_sizes[] = {0, 1, 511, 4095, 4096, 4097, 65536 + 3, (1u << 20) + 3,
                                    (5u << 20) + 1};
#define NOPS 40

typedef struct layout {
    ft_batch_op ops[NOPS];
    uint8_t *src[NOPS], *dst[NOPS];
    size_t misalign[NOPS];
    uint64_t end; /* file bytes the layout covers */
} layout;

/* Ops of edge and random sizes at gapped, shuffled, mostly unaligned offsets. */
static void layout_make(layout *l, uint64_t seed)
{
    uint64_t rnd = seed * 0x9e3779b97f4a7c15ull + 1, off = 0;
    for (int i = 0; i < NOPS; i++) {
        rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
        size_t len = i < (int)(sizeof edge_sizes / sizeof edge_sizes[0])
                         ? edge_sizes[i]
                         : (size_t)(rnd % (300u << 10));
        off += (i % 3 == 0) ? 4096 - off % 4096 : rnd % 9000; /* some aligned, some not */
        l->misalign[i] = (size_t)(rnd >> 20) % 4096;
        l->src[i] = t_alloc_misaligned(len + 1, l->misalign[i]);
        l->dst[i] = t_alloc_misaligned(len + 1, (l->misalign[i] * 7) % 4096);
        t_fill_random(l->src[i], len, seed * 1000 + (uint64_t)i);
        memset(l->dst[i], 0, len + 1);
        l->ops[i] = (ft_batch_op){.buf = ft_host_buf(l->src[i], len), .offset = off};
        off += len;
    }
    l->end = off;
    /* Reverse the order of the second half: a batch need not be in file order. */
    for (int i = NOPS / 2, j = NOPS - 1; i < j; i++, j--) {
        ft_batch_op t = l->ops[i];
        l->ops[i] = l->ops[j];
        l->ops[j] = t;
        uint8_t *s = l->src[i], *d = l->dst[i];
        size_t m = l->misalign[i];
        l->src[i] = l->src[j], l->dst[i] = l->dst[j], l->misalign[i] = l->misalign[j];
        l->src[j] = s, l->dst[j] = d, l->misalign[j] = m;
    }
}

static void layout_free(layout *l)
{
    for (int i = 0; i < NOPS; i++) {
        t_free_misaligned(l->src[i], l->misalign[i]);
        t_free_misaligned(l->dst[i], (l->misalign[i] * 7) % 4096);
    }
}

static void read_ops(layout *l)
{
    for (int i = 0; i < NOPS; i++)
        l->ops[i].buf = ft_host_buf(l->dst[i], l->ops[i].buf.len);
}

static void case_round_trip(void)
{
    for (size_t w = 0; w < NENGINES; w++) {
        layout l;
        layout_make(&l, w + 1);
        ft_file *f;
        T_EQ(ft_file_open(ctx, &f, t_path("batch.bin"),
                          FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644),
             0);
        ft_io_opts wo = {.engine = engines[w], .flags = FT_IO_SYNC};
        T_EQ(ft_write_batch(f, l.ops, NOPS, &wo), 0);
        for (int i = 0; i < NOPS; i++)
            T_EQ(l.ops[i].result, l.ops[i].buf.len);
        for (size_t r = 0; r < NENGINES; r++) {
            read_ops(&l);
            ft_io_opts ro = {.engine = engines[r]};
            T_EQ(ft_read_batch(f, l.ops, NOPS, &ro), 0);
            for (int i = 0; i < NOPS; i++) {
                T_EQ(l.ops[i].result, l.ops[i].buf.len);
                T_MEMEQ(l.src[i], l.dst[i], l.ops[i].buf.len);
                T_EQ(l.dst[i][l.ops[i].buf.len], 0); /* nothing past the op's end */
                memset(l.dst[i], 0, l.ops[i].buf.len);
            }
        }
        ft_file_close(f);
        layout_free(&l);
    }
}

static void case_past_end(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("short.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    uint8_t data[10000], out[3][8192];
    t_fill_random(data, sizeof data, 7);
    ft_buf b = ft_host_buf(data, sizeof data);
    T_EQ(ft_write(f, &b, 0, NULL), sizeof data);
    ft_batch_op ops[3] = {
        {.buf = ft_host_buf(out[0], 8192), .offset = 0},     /* whole */
        {.buf = ft_host_buf(out[1], 8192), .offset = 6000},  /* runs past the end */
        {.buf = ft_host_buf(out[2], 8192), .offset = 20000}, /* starts past the end */
    };
    for (size_t e = 0; e < NENGINES; e++) {
        ft_io_opts o = {.engine = engines[e]};
        T_EQ(ft_read_batch(f, ops, 3, &o), 0);
        T_EQ(ops[0].result, 8192);
        T_EQ(ops[1].result, 4000);
        T_EQ(ops[2].result, 0);
        T_MEMEQ(out[0], data, 8192);
        T_MEMEQ(out[1], data + 6000, 4000);
    }
    T_EQ(ft_read_batch(f, ops, 0, NULL), 0);
    ft_file_close(f);
}

/* One invalid op: the call fails naming it, and nothing was written. */
static void case_invalid_op_runs_nothing(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("keep.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    uint8_t before[8192], now[8192], junk[4096];
    t_fill_random(before, sizeof before, 3);
    t_fill_random(junk, sizeof junk, 4);
    ft_buf b = ft_host_buf(before, sizeof before);
    T_EQ(ft_write(f, &b, 0, NULL), sizeof before);
    ft_batch_op ops[3] = {
        {.buf = ft_host_buf(junk, 4096), .offset = 0},
        {.buf = {.ptr = NULL, .len = 10, .kind = FT_MEM_HOST}, .offset = 4096},
        {.buf = ft_host_buf(junk, 4096), .offset = 4096},
    };
    T_EQ(ft_write_batch(f, ops, 3, NULL), -EFAULT);
    T_TRUE(strstr(ft_last_error(), "op 1 of 3") != NULL);
    T_EQ(ops[0].result, 0);
    T_EQ(ops[1].result, -EFAULT);
    ft_buf n = ft_host_buf(now, sizeof now);
    T_EQ(ft_read(f, &n, 0, NULL), sizeof now);
    T_MEMEQ(before, now, sizeof now);
    T_EQ(ft_write_batch(NULL, ops, 1, NULL), -EINVAL);
    T_EQ(ft_read_batch(f, NULL, 2, NULL), -EINVAL);
    ft_file_close(f);
    /* Read-only file: writes refused before anything runs. */
    T_EQ(ft_file_open(ctx, &f, t_path("keep.bin"), FT_OPEN_READ, 0), 0);
    T_EQ(ft_write_batch(f, ops, 1, NULL), -EBADF);
    ft_file_close(f);
}

/* An injected EIO fails one op: the batch returns -EIO, the others still complete. */
static void case_fault_in_one_op(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("fault.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    enum { N = 8, LEN = 4096 };
    uint8_t src[N][LEN], dst[N][LEN];
    ft_batch_op ops[N];
    for (int i = 0; i < N; i++) {
        t_fill_random(src[i], LEN, 100 + (uint64_t)i);
        ops[i] = (ft_batch_op){.buf = ft_host_buf(src[i], LEN), .offset = (uint64_t)i * LEN};
    }
    ft_io_opts o = {.engine = FT_ENGINE_POSIX};
    T_EQ(ft_write_batch(f, ops, N, &o), 0);
    for (int i = 0; i < N; i++)
        ops[i].buf = ft_host_buf(dst[i], LEN);
    t_fault_set(T_OP_PREAD, T_FAULT_ERRNO, EIO, 3, 1);
    int rc = ft_read_batch(f, ops, N, &o);
    T_EQ(t_fault_clear(), 1);
    T_EQ(rc, -EIO);
    int failed = 0;
    for (int i = 0; i < N; i++) {
        if (ops[i].result == -EIO) {
            failed++;
            continue;
        }
        T_EQ(ops[i].result, LEN);
        T_MEMEQ(src[i], dst[i], LEN);
    }
    T_EQ(failed, 1);
    T_TRUE(*ft_last_error() != '\0');
    /* A sync failure after successful writes is reported too. */
    for (int i = 0; i < N; i++)
        ops[i].buf = ft_host_buf(src[i], LEN);
    t_fault_set(T_OP_FDATASYNC, T_FAULT_ERRNO, EIO, 1, 1);
    o.flags = FT_IO_SYNC;
    rc = ft_write_batch(f, ops, N, &o);
    T_EQ(t_fault_clear(), 1);
    T_EQ(rc, -EIO);
    ft_file_close(f);
}

static void case_register_without_gpu(void)
{
    const char *why;
    if (ft_cuda_available(&why)) {
        printf("  (CUDA present: registration is covered by test_gpu)\n");
        return;
    }
    uint8_t host[64];
    ft_buf b = ft_host_buf(host, sizeof host);
    T_EQ(ft_buf_register(ctx, &b), -ENODEV);
    T_TRUE(strstr(ft_last_error(), "CUDA is not available") != NULL);
    T_EQ(ft_buf_unregister(ctx, &b), -ENOENT);
    T_EQ(ft_buf_register(ctx, NULL), -EINVAL);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(0);
    static const t_case cases[] = {
        {"round trip, every engine pair", case_round_trip},
        {"reads past the end", case_past_end},
        {"an invalid op runs nothing", case_invalid_op_runs_nothing},
        {"a fault fails one op", case_fault_in_one_op},
        {"registration without a GPU", case_register_without_gpu},
    };
    int rc = t_run(cases, sizeof cases / sizeof cases[0]);
    ft_ctx_destroy(ctx);
    return rc;
}
