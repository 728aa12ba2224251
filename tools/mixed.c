/*
 * fastensor bench --mixed: a fixed, seeded workload of the kind a training job issues:
 * transfers of 4 KiB .. 256 MiB (log-uniform sizes), 70% reads and 30% writes, over four
 * files: two of 512 MiB that start in the page cache and two of 4 GiB that start cold. Small transfers
 * (< 1 MiB: metadata, embeddings rows, optimizer shards) go to random places of the cached
 * files; large ones stream through the cold files in order (checkpoint shards, offloaded
 * activations), each region once per pass. Every file is fdatasync'ed at the end. The same operations, in the same order, for every engine; each engine first
 * runs the workload once untimed (AUTO learns there, as in a job's first iterations), then
 * the cache states are reset and the timed pass runs.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILES 4
#define FILE_SIZE (512ull << 20)  /* the cached files */
#define COLD_SIZE (4ull << 30)    /* the cold files: large enough that a pass never wraps */
#define OPS 240
#define MAX_OP (256u << 20)
#define WARMUP 3

typedef struct op {
    uint8_t file, write;
    uint64_t off, len;
} op;

static void make_ops(op *ops, uint64_t seed)
{
    uint64_t s = seed, cursor[2] = {0, 0};
    for (int i = 0; i < OPS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        unsigned shift = (unsigned)((s >> 33) % 17); /* 4K << 0..16 = 4K..256M */
        uint64_t len = 4096ull << shift;
        ops[i].len = len;
        ops[i].write = ((s >> 50) % 10) < 3;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        if (len < (1u << 20)) { /* small: anywhere in a cached file */
            ops[i].file = (uint8_t)((s >> 20) % 2);
            ops[i].off = ((s >> 16) % (FILE_SIZE - len + 1)) / 4096 * 4096;
        } else { /* large: the next region of a cold file, wrapping around */
            unsigned k = (unsigned)((s >> 20) % 2);
            if (cursor[k] + len > COLD_SIZE)
                cursor[k] = 0;
            ops[i].file = (uint8_t)(2 + k);
            ops[i].off = cursor[k];
            cursor[k] += len;
        }
    }
}

/* Files 0-1 cached, 2-3 cold. */
static int reset_cache(ft_file **files, char paths[][4200], uint8_t *buf)
{
    for (int k = 0; k < FILES; k++) {
        cli_evict(paths[k]);
        if (k < 2) {
            ft_buf b = ft_host_buf(buf, MAX_OP);
            ft_io_opts o = {.engine = FT_ENGINE_POSIX};
            for (uint64_t off = 0; off < FILE_SIZE; off += MAX_OP) {
                int64_t n = ft_read(files[k], &b, off, &o);
                if (n < 0)
                    return (int)n;
            }
        }
    }
    return 0;
}

static int run_ops(ft_file **files, const op *ops, ft_engine e, uint8_t *buf, uint64_t *bytes)
{
    ft_io_opts o = {.engine = e};
    *bytes = 0;
    for (int i = 0; i < OPS; i++) {
        ft_buf b = ft_host_buf(buf, (size_t)ops[i].len);
        int64_t n = ops[i].write ? ft_write(files[ops[i].file], &b, ops[i].off, &o)
                                 : ft_read(files[ops[i].file], &b, ops[i].off, &o);
        if (n < 0)
            return (int)n;
        *bytes += (uint64_t)n;
    }
    for (int k = 0; k < FILES; k++) {
        int rc = ft_file_sync(files[k]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int bench_mixed(const ft_engine *engines, int nengines, bool json, const char *dir)
{
    char paths[FILES][4200];
    ft_file *files[FILES] = {0};
    op *ops = calloc(OPS, sizeof *ops);
    uint8_t *buf = cli_alloc(MAX_OP);
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL), status = EXIT_OK;
    if (rc < 0 || !ops || !buf) {
        cli_ft_error("bench", "mixed workload setup", rc < 0 ? rc : -ENOMEM);
        return EXIT_ERR;
    }
    cli_fill_random(buf, MAX_OP, 99);
    make_ops(ops, 2023);
    for (int k = 0; k < FILES && rc == 0; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/fastensor-mixed-%d-%d.tmp", dir, (int)getpid(), k);
        rc = ft_file_open(ctx, &files[k], paths[k], FT_OPEN_READ | FT_OPEN_WRITE |
                                                         FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644);
        ft_buf b = ft_host_buf(buf, MAX_OP);
        ft_io_opts o = {.engine = FT_ENGINE_DIRECT};
        for (uint64_t off = 0; rc == 0 && off < (k < 2 ? FILE_SIZE : COLD_SIZE); off += MAX_OP) {
            int64_t n = ft_write(files[k], &b, off, &o);
            rc = n < 0 ? (int)n : 0;
        }
    }
    if (rc < 0) {
        cli_ft_error("bench", "creating the mixed workload's files", rc);
        status = EXIT_ERR;
    }
    uint64_t total_ops_bytes = 0;
    for (int i = 0; i < OPS; i++)
        total_ops_bytes += ops[i].len;
    if (!json && status == EXIT_OK)
        printf("mixed workload: %d transfers (4K..256M, 70%% reads), %.2f GB, 2 x 512M + 2 x 4G files "
               "(small ones random in 2 cached files, large ones streaming through 2 cold "
               "files)\n%-7s %9s %9s\n", OPS, (double)total_ops_bytes / 1e9, "engine",
               "seconds", "GB/s");
    for (int e = 0; e < nengines && status == EXIT_OK; e++) {
        uint64_t bytes = 0;
        double t0 = 0, secs = 0;
        for (int pass = 0; pass <= WARMUP && rc == 0; pass++) {
            if ((rc = reset_cache(files, paths, buf)) < 0)
                break;
            t0 = cli_now();
            rc = run_ops(files, ops, engines[e], buf, &bytes);
            secs = cli_now() - t0;
        }
        if (rc < 0) {
            cli_ft_error("bench", "mixed workload", rc);
            status = EXIT_ERR;
            break;
        }
        if (json)
            printf("{\"engine\":\"%s\",\"op\":\"mixed\",\"block\":0,\"bytes\":%llu,"
                   "\"seconds\":%.6f,\"gbps\":%.4f,\"cache\":\"mixed\",\"memory\":\"host\"}\n",
                   ft_engine_name(engines[e]), (unsigned long long)bytes, secs,
                   (double)bytes / secs / 1e9);
        else
            printf("%-7s %9.3f %9.3f\n", ft_engine_name(engines[e]), secs,
                   (double)bytes / secs / 1e9);
        fflush(stdout);
    }
    for (int k = 0; k < FILES; k++) {
        ft_file_close(files[k]);
        unlink(paths[k]);
    }
    ft_ctx_destroy(ctx);
    free(ops);
    free(buf);
    return status;
}

/*
 * AUTO's decision cost, measured through the public API: 1-byte reads of a cached file with
 * AUTO minus the same reads with posix (which AUTO picks there); the difference per call is
 * the probe (page-cache residency, CPU load) plus the dictionary lookup and update.
 */
int bench_overhead(bool json)
{
    char path[64];
    snprintf(path, sizeof path, "./fastensor-overhead-%d.tmp", (int)getpid());
    ft_ctx *ctx;
    ft_file *f;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc < 0 || (rc = ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE |
                                                        FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644)) < 0) {
        cli_ft_error("bench", path, rc);
        return EXIT_ERR;
    }
    char byte = 1;
    ft_buf b = ft_host_buf(&byte, 1);
    ft_write(f, &b, 0, NULL);
    const int n = 200000;
    double best[2] = {1e9, 1e9};
    for (int round = 0; round < 5; round++)
        for (int k = 0; k < 2; k++) {
            ft_io_opts o = {.engine = k ? FT_ENGINE_AUTO : FT_ENGINE_POSIX};
            double t0 = cli_now();
            for (int i = 0; i < n; i++)
                ft_read(f, &b, 0, &o);
            double per = (cli_now() - t0) / n;
            if (per < best[k])
                best[k] = per;
        }
    double overhead_ns = (best[1] - best[0]) * 1e9;
    if (json)
        printf("{\"what\":\"auto_decision_overhead\",\"ns_per_call\":%.1f,\"posix_call_ns\":%.1f}\n",
               overhead_ns, best[0] * 1e9);
    else
        printf("AUTO decision overhead (probe + lookup), cached key: %.0f ns per call "
               "(a 1-byte cached posix read costs %.0f ns)\n", overhead_ns, best[0] * 1e9);
    ft_file_close(f);
    unlink(path);
    ft_ctx_destroy(ctx);
    return EXIT_OK;
}
