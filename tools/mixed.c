/*
 * fastensor bench --mixed: a fixed, seeded workload of the kind a training job issues:
 * transfers of 4 KiB .. 256 MiB (log-uniform sizes), 70% reads and 30% writes, over four
 * files: two "hot" ones of 1 GiB that start in the page cache (data written or read moments
 * ago: a checkpoint reloaded right after its save, activations prefetched while still
 * cached, an evaluation pass over data just used) and two of 4 GiB that start cold. Small
 * transfers (< 1 MiB: metadata, embedding rows, optimizer shards) go to random places of
 * the hot files; half of the large reads re-read random regions of the hot files, the other
 * half and all large writes stream through the cold files in order (checkpoint shards,
 * offloaded activations), each region once per pass. Every file is fdatasync'ed at the end.
 * So the right engine depends on the context, not only on the size: page-cache copies for
 * cached data, O_DIRECT for cold data and durable writes. (An earlier version sent only
 * sub-MiB transfers to the cached files: 0.3% of the bytes, where no choice can matter.)
 * The same operations, in the same order, for every engine; each engine first
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
#define FILE_SIZE (1ull << 30)    /* the hot (cached) files */
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
        bool hot_read = !ops[i].write && ((s >> 40) & 1);
        if (len < (1u << 20) || hot_read) { /* small, or a large re-read: in a hot file */
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

/* Files 0-1 cached, 2-3 cold. Every file is evicted first: as root, an eviction drops the
 * whole page cache, which would take the files warmed before it with it. */
static int reset_cache(ft_file **files, char paths[][4200], uint8_t *buf)
{
    for (int k = 0; k < FILES; k++)
        cli_evict(paths[k]);
    for (int k = 0; k < 2; k++) {
        ft_buf b = ft_host_buf(buf, MAX_OP);
        ft_io_opts o = {.engine = FT_ENGINE_POSIX};
        for (uint64_t off = 0; off < FILE_SIZE; off += MAX_OP) {
            int64_t n = ft_read(files[k], &b, off, &o);
            if (n < 0)
                return (int)n;
        }
    }
    return 0;
}

/* Where a pass's time goes: small transfers, large reads of cached / cold data, large
 * writes, the final syncs. */
enum { PART_SMALL, PART_HOT, PART_COLD, PART_WRITE, PART_SYNC, PARTS };
static const char *const part_name[PARTS] = {"small", "cached", "cold", "writes", "sync"};

static int part_of(const op *o)
{
    if (o->len < (1u << 20))
        return PART_SMALL;
    return o->write ? PART_WRITE : o->file < 2 ? PART_HOT : PART_COLD;
}

static int run_ops(ft_file **files, const op *ops, ft_engine e, uint8_t *buf, uint64_t *bytes,
                   double part[PARTS])
{
    ft_io_opts r = {.engine = e};
    ft_io_opts w = {.engine = e, .flags = FT_IO_SYNC_LATER}; /* synced at the end */
    *bytes = 0;
    for (int p = 0; p < PARTS; p++)
        part[p] = 0;
    for (int i = 0; i < OPS; i++) {
        ft_buf b = ft_host_buf(buf, (size_t)ops[i].len);
        double t0 = cli_now();
        int64_t n = ops[i].write ? ft_write(files[ops[i].file], &b, ops[i].off, &w)
                                 : ft_read(files[ops[i].file], &b, ops[i].off, &r);
        part[part_of(&ops[i])] += cli_now() - t0;
        if (n < 0)
            return (int)n;
        *bytes += (uint64_t)n;
    }
    double t0 = cli_now();
    for (int k = 0; k < FILES; k++) {
        int rc = ft_file_sync(files[k]);
        if (rc < 0)
            return rc;
    }
    part[PART_SYNC] = cli_now() - t0;
    return 0;
}

int bench_mixed(const ft_engine *engines, int nengines, int rounds, bool json, const char *dir)
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
    uint64_t total_ops_bytes = 0, part_bytes[PARTS] = {0};
    for (int i = 0; i < OPS; i++) {
        total_ops_bytes += ops[i].len;
        part_bytes[part_of(&ops[i])] += ops[i].len;
    }
    if (!json && status == EXIT_OK)
        printf("mixed workload: %d transfers (4K..256M, 70%% reads), %.2f GB, 2 x 1G cached + "
               "2 x 4G cold files (small ones and half the large reads in the cached files, the "
               "other large ones streaming through the cold files)\n",
               OPS, (double)total_ops_bytes / 1e9);
    if (!json && status == EXIT_OK) {
        printf("bytes:");
        for (int p = 0; p < PART_SYNC; p++)
            printf("%s %s %.2f GB", p ? "," : "", part_name[p], (double)part_bytes[p] / 1e9);
        printf("\n%-7s %9s %9s   seconds in:", "engine", "seconds", "GB/s");
        for (int p = 0; p < PARTS; p++)
            printf(" %7s", part_name[p]);
        printf("\n");
    }
    /* Untimed first: AUTO's learning passes (a job's first iterations), one warm-up pass for
     * every fixed engine. Then the timed rounds, every engine once per round, the order
     * rotated from round to round: this disk's speed wanders over minutes, and engines timed
     * back to back in one stretch each would compare the disk's moods, not the engines. */
    double *secs = calloc((size_t)nengines * (size_t)rounds, sizeof *secs);
    double *parts = calloc((size_t)nengines * (size_t)rounds * PARTS, sizeof *parts);
    uint64_t bytes = 0;
    if (!secs || !parts)
        rc = -ENOMEM;
    for (int e = 0; e < nengines && status == EXIT_OK && rc == 0; e++) {
        double scratch[PARTS];
        for (int pass = 0; pass < (engines[e] == FT_ENGINE_AUTO ? WARMUP : 1) && rc == 0; pass++)
            if ((rc = reset_cache(files, paths, buf)) == 0)
                rc = run_ops(files, ops, engines[e], buf, &bytes, scratch);
    }
    for (int r = 0; r < rounds && status == EXIT_OK && rc == 0; r++)
        for (int i = 0; i < nengines && rc == 0; i++) {
            int e = (i + r) % nengines;
            if ((rc = reset_cache(files, paths, buf)) < 0)
                break;
            double t0 = cli_now();
            rc = run_ops(files, ops, engines[e], buf, &bytes, &parts[(e * rounds + r) * PARTS]);
            secs[e * rounds + r] = cli_now() - t0;
        }
    if (rc < 0 && status == EXIT_OK) {
        cli_ft_error("bench", "mixed workload", rc);
        status = EXIT_ERR;
    }
    /* the fixed engines' least time in each part (of their median rounds), summed */
    double best_part[PART_SYNC];
    int fixed = 0;
    for (int p = 0; p < PART_SYNC; p++)
        best_part[p] = 1e30;
    for (int e = 0; e < nengines && status == EXIT_OK; e++) {
        /* the median round (by total time) and its breakdown */
        int med = 0;
        for (int r = 0; r < rounds; r++) {
            int below = 0;
            for (int q = 0; q < rounds; q++)
                below += secs[e * rounds + q] < secs[e * rounds + r] ||
                         (secs[e * rounds + q] == secs[e * rounds + r] && q < r);
            if (below == rounds / 2)
                med = r;
        }
        double t = secs[e * rounds + med], *part = &parts[(e * rounds + med) * PARTS];
        if (engines[e] != FT_ENGINE_AUTO) {
            fixed++;
            for (int p = 0; p < PART_WRITE; p++)
                if (part[p] < best_part[p])
                    best_part[p] = part[p];
            /* writes with the sync they leave to the end: posix's are quick until then */
            if (part[PART_WRITE] + part[PART_SYNC] < best_part[PART_WRITE])
                best_part[PART_WRITE] = part[PART_WRITE] + part[PART_SYNC];
        }
        if (json)
            printf("{\"engine\":\"%s\",\"op\":\"mixed\",\"block\":0,\"bytes\":%llu,"
                   "\"seconds\":%.6f,\"gbps\":%.4f,\"cache\":\"mixed\",\"memory\":\"host\"}\n",
                   ft_engine_name(engines[e]), (unsigned long long)bytes, t,
                   (double)bytes / t / 1e9);
        else
            printf("%-7s %9.3f %9.3f               %7.3f %7.3f %7.3f %7.3f %7.3f\n",
                   ft_engine_name(engines[e]), t, (double)bytes / t / 1e9, part[0], part[1],
                   part[2], part[3], part[4]);
    }
    if (!json && status == EXIT_OK && rounds > 1)
        printf("(median of %d rounds, engines interleaved)\n", rounds);
    if (!json && status == EXIT_OK && fixed > 1) {
        /* What a choice of engine per part reaches without being faster than the best engine
         * within any part: AUTO beats the best single engine by at most about this much,
         * unless it beats them within a part. */
        double sum = 0;
        for (int p = 0; p <= PART_WRITE; p++)
            sum += best_part[p];
        printf("%-7s %9.3f %9.3f              ", "by-part", sum, (double)bytes / sum / 1e9);
        for (int p = 0; p <= PART_WRITE; p++)
            printf(" %7.3f", best_part[p]);
        printf("       -\n(by-part: each part's least time among the fixed engines, the writes "
               "with their sync, summed: a choice of engine per part, none faster than the "
               "best engine within its part)\n");
    }
    fflush(stdout);
    free(secs);
    free(parts);
    for (int k = 0; k < FILES; k++) {
        ft_file_close(files[k]);
        unlink(paths[k]);
    }
    ft_ctx_destroy(ctx);
    free(ops);
    free(buf);
    return status;
}

/* A background transfer kept in flight: a read of a 16 MiB file, submitted again whenever
 * it has finished, so that AUTO's calls meanwhile take its path for calls beside others
 * (for cached reads, the decision and the sample both in the key beside others). O_DIRECT
 * where the filesystem has it: a request that waits on the disk, not one that copies on a
 * CPU the timed loop needs (a posix re-read of the cached file moved the posix loop's figure
 * by up to 30%). */
typedef struct background {
    ft_file *f;
    ft_req *req;
    ft_buf buf;
} background;

static void background_keep(background *bg)
{
    if (bg->req && ft_req_poll(bg->req) == 0)
        return;
    ft_req_free(bg->req);
    bg->req = NULL;
    ft_io_opts o = {.engine = FT_ENGINE_DIRECT};
    if (ft_submit_read(bg->f, &bg->buf, 0, &o, &bg->req) < 0) {
        o.engine = FT_ENGINE_POSIX;
        if (ft_submit_read(bg->f, &bg->buf, 0, &o, &bg->req) < 0)
            bg->req = NULL;
    }
}

#define OVERHEAD_ROUNDS 41
#define OVERHEAD_CALLS 20000 /* per round and engine */

/* Time per 1-byte cached read for posix and AUTO in OVERHEAD_ROUNDS short rounds, the two
 * taking turns (which goes first alternates), with a background transfer in flight when
 * @p bg is not NULL. @p cost gets the posix read's median time; @p diff the quartiles and
 * median of AUTO's time over posix's within each round. The least time of each over a few
 * long rounds, its first method, came out at -147 ns on the H200 machine (posix's best
 * round 1681 ns there, 995 ns in another run): a difference of two minima taken minutes
 * apart measures the machine's drift, not the decision. */
static void time_calls(ft_file *f, background *bg, double *cost, double diff[3])
{
    char byte;
    ft_buf b = ft_host_buf(&byte, 1);
    double d[OVERHEAD_ROUNDS], posix[OVERHEAD_ROUNDS];
    for (int round = 0; round < OVERHEAD_ROUNDS; round++) {
        double per[2];
        for (int turn = 0; turn < 2; turn++) {
            int k = turn ^ (round & 1);
            ft_io_opts o = {.engine = k ? FT_ENGINE_AUTO : FT_ENGINE_POSIX};
            double t0 = cli_now();
            for (int i = 0; i < OVERHEAD_CALLS; i++) {
                if (bg && (i & 63) == 0)
                    background_keep(bg);
                ft_read(f, &b, 0, &o);
            }
            per[k] = (cli_now() - t0) / OVERHEAD_CALLS;
        }
        d[round] = per[1] - per[0];
        posix[round] = per[0];
    }
    qsort(d, OVERHEAD_ROUNDS, sizeof *d, cli_cmp_double);
    qsort(posix, OVERHEAD_ROUNDS, sizeof *posix, cli_cmp_double);
    *cost = posix[OVERHEAD_ROUNDS / 2];
    diff[0] = d[OVERHEAD_ROUNDS / 4];
    diff[1] = d[OVERHEAD_ROUNDS / 2];
    diff[2] = d[OVERHEAD_ROUNDS - 1 - OVERHEAD_ROUNDS / 4];
}

/*
 * AUTO's decision cost, measured through the public API: 1-byte reads of a cached file with
 * AUTO minus the same reads with posix (which AUTO picks there), the two in turns; the
 * difference per call is the probe (page-cache residency, CPU load) plus the dictionary
 * lookup and update. Once alone, once beside a background transfer (calls in flight take
 * another path).
 */
int bench_overhead(bool json)
{
    char path[64], bpath[64];
    snprintf(path, sizeof path, "./fastensor-overhead-%d.tmp", (int)getpid());
    snprintf(bpath, sizeof bpath, "./fastensor-overhead-bg-%d.tmp", (int)getpid());
    const uint64_t bg_len = 16u << 20;
    ft_ctx *ctx = NULL;
    ft_file *f = NULL;
    background bg = {0};
    void *bg_mem = calloc(1, bg_len);
    int flags = FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC;
    int rc = bg_mem ? ft_ctx_create(&ctx, NULL) : -ENOMEM;
    const char *failed = path;
    if (rc >= 0 && (rc = ft_file_open(ctx, &f, path, flags, 0644)) >= 0) {
        failed = bpath;
        rc = ft_file_open(ctx, &bg.f, bpath, flags, 0644);
    }
    if (rc >= 0) {
        bg.buf = ft_host_buf(bg_mem, bg_len);
        rc = (int)ft_write(bg.f, &bg.buf, 0, NULL); /* in the page cache from here on */
    }
    if (rc < 0) {
        cli_ft_error("bench", failed, rc);
        if (f)
            unlink(path);
        if (bg.f)
            unlink(bpath);
        ft_file_close(f);
        ft_file_close(bg.f);
        free(bg_mem);
        ft_ctx_destroy(ctx);
        return EXIT_ERR;
    }
    char byte = 1;
    ft_buf b = ft_host_buf(&byte, 1);
    ft_write(f, &b, 0, NULL);
    double alone[3], beside[3], posix_ns, busy_posix_ns;
    time_calls(f, NULL, &posix_ns, alone);
    time_calls(f, &bg, &busy_posix_ns, beside);
    ft_req_free(bg.req);
    if (json)
        printf("{\"what\":\"auto_decision_overhead\",\"ns_per_call\":%.1f,"
               "\"ns_per_call_quartiles\":[%.1f,%.1f],\"posix_call_ns\":%.1f,"
               "\"busy_ns_per_call\":%.1f,\"busy_ns_per_call_quartiles\":[%.1f,%.1f],"
               "\"busy_posix_call_ns\":%.1f,\"rounds\":%d}\n",
               alone[1] * 1e9, alone[0] * 1e9, alone[2] * 1e9, posix_ns * 1e9,
               beside[1] * 1e9, beside[0] * 1e9, beside[2] * 1e9, busy_posix_ns * 1e9,
               OVERHEAD_ROUNDS);
    else
        printf("AUTO decision overhead (probe + lookup), cached key: %.0f ns per call "
               "(quartiles %.0f to %.0f; a 1-byte cached posix read costs %.0f ns);\n"
               "with another transfer in flight (the decision and the sample in the key "
               "beside others): %.0f ns per call (quartiles %.0f to %.0f; posix read %.0f ns)\n"
               "(medians over %d rounds of %d calls each, AUTO and posix taking turns)\n",
               alone[1] * 1e9, alone[0] * 1e9, alone[2] * 1e9, posix_ns * 1e9,
               beside[1] * 1e9, beside[0] * 1e9, beside[2] * 1e9, busy_posix_ns * 1e9,
               OVERHEAD_ROUNDS, OVERHEAD_CALLS);
    ft_file_close(f);
    ft_file_close(bg.f);
    unlink(path);
    unlink(bpath);
    free(bg_mem);
    ft_ctx_destroy(ctx);
    return EXIT_OK;
}
