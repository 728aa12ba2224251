/*
 * fastensor bench: engines x direction x block sizes x cache state.
 * Each measurement moves --total bytes (default: 1024 blocks, between 64 MiB and 1 GiB,
 * at least one block) as block-sized requests in file order, several in flight through the
 * asynchronous API (like fio's iodepth). Writes are timed up to
 * and including fdatasync (durable bytes); cold reads follow a page-cache drop; warm reads
 * follow a drop and two untimed buffered (posix) reads of the range, the same cache for
 * every engine.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ITEMS 32

typedef struct bench_opts {
    ft_engine engines[MAX_ITEMS];
    int nengines;
    uint64_t sizes[MAX_ITEMS];
    int nsizes;
    bool do_read, do_write, cold, warm, json;
    uint64_t total;   /* 0: default per block size */
    const char *file; /* NULL: temporary file in the current directory */
    int repeat;
    int inflight;     /* 0: keep about 256 MiB in flight, 1..16 blocks */
    bool mixed;       /* the seeded mixed workload instead of the sweep */
    int device;       /* -1: host memory; else the CUDA device of the buffers */
    bool overhead;    /* measure AUTO's decision overhead */
    int batch;        /* 0: async requests; else blocks per ft_read_batch/ft_write_batch */
} bench_opts;

typedef struct result {
    double seconds, cpu;
    double gpu_j, cpu_j; /* energy spent, < 0 when not measurable */
} result;

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: fastensor bench [options]\n\n"
            "  --engine LIST   engines, comma-separated, or all (default: all)\n"
            "  --op OP         read, write or both (default: both)\n"
            "  --size LIST     block sizes, e.g. 4K,1M,64M,1G (default: 4K,1M,64M,1G)\n"
            "  --total BYTES   bytes per measurement (default: 1024 blocks within 64M..1G)\n"
            "  --file PATH     file to use (default: a temporary file here, removed at exit)\n"
            "  --cold          only cold reads (page cache dropped; global drop needs root)\n"
            "  --warm          only warm reads (file in the page cache)\n"
            "  --repeat N      repeat each measurement N times, report the median (1; with\n"
            "                  --mixed: timed rounds, engines interleaved, default 3)\n"
            "  --inflight N    requests in flight, 1..16 (default: 256 MiB worth, 1..16)\n"
            "  --batch N       N blocks per ft_read_batch/ft_write_batch call instead of\n"
            "                  asynchronous requests, 1..1024 (cuFile's batch API with cufile)\n"
            "  --json          one JSON object per measurement instead of the table\n"
            "  --mixed         a seeded mixed workload (4K..256M, reads and writes, cached and\n"
            "                  cold files) per engine: total time, GB/s (JSON block 0) and\n"
            "                  where the time goes\n"
            "  --overhead      AUTO's decision cost (probe + lookup) per call, cached keys\n"
            "  --memory M      host (default), cuda or cuda:N: buffers in that memory\n\n"
            "Writes are timed including fdatasync. Energy columns (joules per GB, GPU via NVML,\n"
            "CPU via RAPL) show '-' (JSON null) where not measurable. Settings: FASTENSOR_*.\n");
}

static uint64_t total_for(const bench_opts *o, uint64_t block)
{
    if (o->total)
        return o->total < block ? block : o->total / block * block;
    uint64_t t = block * 1024;
    if (t < (64u << 20))
        t = 64u << 20;
    if (t > (1u << 30))
        t = 1u << 30;
    return t < block ? block : t / block * block;
}

#define MAX_INFLIGHT CLI_WINDOW_MAX
#define MAX_BATCH 1024

/* Blocks with a buffer of their own: requests in flight, or the ops of one batch. */
static int inflight_for(const bench_opts *o, uint64_t block)
{
    if (o->batch)
        return o->batch;
    if (o->inflight)
        return o->inflight;
    uint64_t n = (256u << 20) / block;
    return n < 1 ? 1 : n > MAX_INFLIGHT ? MAX_INFLIGHT : (int)n;
}

static int g_device = -1; /* the CUDA device of the buffers, -1 for host memory */
static int g_batch;       /* blocks per batch call, 0 for asynchronous requests */

static ft_buf block_buf(uint8_t *bufs, int slot, uint64_t block)
{
    ft_buf b = ft_host_buf(bufs + (size_t)slot * block, (size_t)block);
    if (g_device >= 0) {
        b.kind = FT_MEM_CUDA;
        b.device = g_device;
    }
    return b;
}

/* The blocks of [0, total) in calls of g_batch ops. @return 0 or -errno. */
static int run_batches(ft_file *f, const ft_io_opts *o, bool write, uint8_t *bufs,
                       uint64_t block, uint64_t total)
{
    ft_batch_op ops[MAX_BATCH];
    for (uint64_t off = 0; off < total;) {
        int n = 0;
        for (; n < g_batch && off < total; n++, off += block)
            ops[n] = (ft_batch_op){.buf = block_buf(bufs, n, block), .offset = off};
        int rc = write ? ft_write_batch(f, ops, (size_t)n, o) : ft_read_batch(f, ops, (size_t)n, o);
        if (rc < 0)
            return rc;
        for (int i = 0; i < n; i++)
            if ((uint64_t)ops[i].result != block)
                return -EIO;
    }
    return 0;
}

/* Block-sized requests over [0, total) in file order, @p depth of them in flight (each with
 * its own buffer), like fio's iodepth, or in batches (g_batch). @return 0 or -errno. */
static int run_pass(ft_file *f, ft_engine e, bool write, uint8_t *bufs, uint64_t block,
                    uint64_t total, int depth, result *res)
{
    /* the pass ends in fdatasync: AUTO weighs its writes with their share of it */
    ft_io_opts o = {.engine = e, .flags = write ? FT_IO_SYNC_LATER : 0};
    ft_energy e0, e1;
    ft_energy_sample(&e0);
    cli_window w;
    cli_window_init(&w, (unsigned)depth, block);
    double c0 = cli_cpu_seconds(), t0 = cli_now();
    for (uint64_t off = 0; off < total && w.rc == 0 && !g_batch; off += block) {
        unsigned slot = cli_window_slot(&w);
        ft_buf b = block_buf(bufs, (int)slot, block);
        cli_window_add(&w, write ? ft_submit_write(f, &b, off, &o, &w.req[slot])
                                 : ft_submit_read(f, &b, off, &o, &w.req[slot]));
    }
    int rc = g_batch ? run_batches(f, &o, write, bufs, block, total) : cli_window_drain(&w);
    if (rc < 0)
        return rc;
    if (write) {
        int sync_rc = ft_file_sync(f);
        if (sync_rc < 0)
            return sync_rc;
    }
    res->seconds = cli_now() - t0;
    res->cpu = cli_cpu_seconds() - c0;
    ft_energy_sample(&e1);
    res->gpu_j = e0.gpu_valid && e1.gpu_valid ? e1.gpu_joules - e0.gpu_joules : -1;
    res->cpu_j = e0.cpu_valid && e1.cpu_valid ? e1.cpu_joules - e0.cpu_joules : -1;
    return 0;
}

static void report(const bench_opts *o, ft_engine e, const char *op, uint64_t block,
                   uint64_t total, const char *cache, const result *r)
{
    double gbps = (double)total / r->seconds / 1e9, gb = (double)total / 1e9;
    char gj[32] = "null", cj[32] = "null", gjt[16] = "-", cjt[16] = "-";
    if (r->gpu_j >= 0) {
        snprintf(gj, sizeof gj, "%.3f", r->gpu_j);
        snprintf(gjt, sizeof gjt, "%.2f", r->gpu_j / gb);
    }
    if (r->cpu_j >= 0) {
        snprintf(cj, sizeof cj, "%.3f", r->cpu_j);
        snprintf(cjt, sizeof cjt, "%.2f", r->cpu_j / gb);
    }
    const char *mem = o->device >= 0 ? "cuda" : "host";
    if (o->json) {
        printf("{\"engine\":\"%s\",\"op\":\"%s\",\"block\":%llu,\"bytes\":%llu,"
               "\"seconds\":%.6f,\"gbps\":%.4f,\"cache\":\"%s\",\"memory\":\"%s\","
               "\"gpu_j\":%s,\"cpu_j\":%s}\n",
               ft_engine_name(e), op, (unsigned long long)block, (unsigned long long)total,
               r->seconds, gbps, cache, mem, gj, cj);
    } else {
        char bs[32], ts[32];
        printf("%-7s %-5s %6s %6s %-5s %-4s %9.3f %11.0f %8.2f %8s %8s\n", ft_engine_name(e),
               op, cli_fmt_size(block, bs, sizeof bs), cli_fmt_size(total, ts, sizeof ts), cache,
               mem, gbps, (double)total / (double)block / r->seconds, r->cpu, gjt, cjt);
    }
    fflush(stdout);
}

static void progress(int done, int all, ft_engine e, const char *what, uint64_t block)
{
    static int tty = -1;
    if (tty < 0)
        tty = isatty(2);
    if (!tty)
        return;
    char bs[32];
    fprintf(stderr, "\r\033[K[%d/%d] %s %s %s", done, all, ft_engine_name(e), what,
            cli_fmt_size(block, bs, sizeof bs));
    if (done == all)
        fprintf(stderr, "\r\033[K");
}

/* Median of --repeat runs of one measurement. */
static int measure(ft_file *f, const char *path, ft_engine e, bool write, const char *cache,
                   uint8_t *buf, uint64_t block, uint64_t total, int depth, int repeat,
                   result *out)
{
    double secs[64], cpus[64], gj[64], cj[64];
    for (int i = 0; i < repeat; i++) {
        /* Warm: the page cache emptied, then filled, untimed, by two posix passes, so that
         * every engine reads the same cache. What filled it decides how fast it reads: the
         * mmap engine's own cold pass (huge-page advice) left 2 MiB folios, and its warm
         * 256 MiB and 1 GiB reads ran 10-20% faster than those of the engines reading what
         * buffered reads had cached (H200 machine, host memory), AUTO included, whose cold
         * pass was O_DIRECT. Two fills: the kernel activates a cached page on its second
         * read (LRU work per page); the timed pass is every page's third read. */
        if (!write)
            cli_evict(path);
        for (int fill = 0; !write && !strcmp(cache, "warm") && fill < 2; fill++) {
            result ignore;
            int rc = run_pass(f, FT_ENGINE_POSIX, false, buf, block, total, depth, &ignore);
            if (rc < 0)
                return rc;
        }
        if (write && !strcmp(cache, "cold"))
            cli_evict(path);
        result r;
        int rc = run_pass(f, e, write, buf, block, total, depth, &r);
        if (rc < 0)
            return rc;
        secs[i] = r.seconds;
        cpus[i] = r.cpu;
        gj[i] = r.gpu_j;
        cj[i] = r.cpu_j;
    }
    qsort(secs, (size_t)repeat, sizeof *secs, cli_cmp_double);
    qsort(cpus, (size_t)repeat, sizeof *cpus, cli_cmp_double);
    qsort(gj, (size_t)repeat, sizeof *gj, cli_cmp_double);
    qsort(cj, (size_t)repeat, sizeof *cj, cli_cmp_double);
    out->seconds = secs[repeat / 2];
    out->cpu = cpus[repeat / 2];
    out->gpu_j = gj[repeat / 2];
    out->cpu_j = cj[repeat / 2];
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option opts[] = {
        {"engine", required_argument, NULL, 'e'}, {"op", required_argument, NULL, 'o'},
        {"size", required_argument, NULL, 's'},   {"total", required_argument, NULL, 't'},
        {"file", required_argument, NULL, 'f'},   {"cold", no_argument, NULL, 'c'},
        {"warm", no_argument, NULL, 'w'},         {"repeat", required_argument, NULL, 'r'},
        {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
        {"inflight", required_argument, NULL, 'i'},
        {"mixed", no_argument, NULL, 'M'},
        {"overhead", no_argument, NULL, 'O'},
        {"memory", required_argument, NULL, 'm'},
        {"batch", required_argument, NULL, 'b'},
        {0}};
    *o = (bench_opts){.do_read = true, .do_write = true, .repeat = 0, .device = -1};
    o->nengines = cli_parse_engines("all", o->engines, MAX_ITEMS);
    o->nsizes = cli_parse_sizes("4K,1M,64M,1G", o->sizes, MAX_ITEMS);
    bool cold = false, warm = false;
    int c;
    while ((c = getopt_long(argc, argv, "e:o:s:t:f:cwr:jhi:m:b:", opts, NULL)) != -1) {
        switch (c) {
        case 'e':
            if ((o->nengines = cli_parse_engines(optarg, o->engines, MAX_ITEMS)) <= 0) {
                cli_error("bench", "bad --engine '%s' (posix,direct,uring,mmap,auto,all)",
                          optarg);
                return EXIT_USAGE;
            }
            break;
        case 'o':
            o->do_read = !strcmp(optarg, "read") || !strcmp(optarg, "both");
            o->do_write = !strcmp(optarg, "write") || !strcmp(optarg, "both");
            if (!o->do_read && !o->do_write) {
                cli_error("bench", "bad --op '%s' (read, write or both)", optarg);
                return EXIT_USAGE;
            }
            break;
        case 's':
            if ((o->nsizes = cli_parse_sizes(optarg, o->sizes, MAX_ITEMS)) <= 0) {
                cli_error("bench", "bad --size '%s' (e.g. 4K,64M,1G)", optarg);
                return EXIT_USAGE;
            }
            break;
        case 't':
            if (ft_parse_size(optarg, &o->total) < 0 || o->total == 0) {
                cli_error("bench", "bad --total '%s'", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'f': o->file = optarg; break;
        case 'c': cold = true; break;
        case 'w': warm = true; break;
        case 'r':
            o->repeat = atoi(optarg);
            if (o->repeat < 1 || o->repeat > 64) {
                cli_error("bench", "bad --repeat '%s' (1..64)", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'j': o->json = true; break;
        case 'M': o->mixed = true; break;
        case 'm':
            if (!strcmp(optarg, "host")) {
                o->device = -1;
            } else if (!strncmp(optarg, "cuda", 4) &&
                       (optarg[4] == '\0' || (optarg[4] == ':' && optarg[5]))) {
                o->device = optarg[4] ? atoi(optarg + 5) : 0;
            } else {
                cli_error("bench", "bad --memory '%s' (host, cuda, cuda:N)", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'O': o->overhead = true; break;
        case 'i':
            o->inflight = atoi(optarg);
            if (o->inflight < 1 || o->inflight > MAX_INFLIGHT) {
                cli_error("bench", "bad --inflight '%s' (1..%d)", optarg, MAX_INFLIGHT);
                return EXIT_USAGE;
            }
            break;
        case 'b':
            o->batch = atoi(optarg);
            if (o->batch < 1 || o->batch > MAX_BATCH) {
                cli_error("bench", "bad --batch '%s' (1..%d)", optarg, MAX_BATCH);
                return EXIT_USAGE;
            }
            break;
        case 'h': bench_usage(stdout); return EXIT_OK;
        default: bench_usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        cli_error("bench", "unexpected argument '%s'", argv[optind]);
        return EXIT_USAGE;
    }
    o->cold = cold || !warm;
    o->warm = warm || !cold;
    return -1;
}

static char temp_path[4096];
static void remove_temp(void)
{
    if (temp_path[0])
        unlink(temp_path);
}

int cmd_bench(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.mixed && o.device >= 0) {
        cli_error("bench", "--mixed runs on host memory");
        return EXIT_USAGE;
    }
    if (o.mixed)
        return bench_mixed(o.engines, o.nengines, o.repeat ? o.repeat : 3, o.json, ".");
    if (!o.repeat)
        o.repeat = 1;
    if (o.overhead)
        return bench_overhead(o.json);
    const char *path = o.file;
    if (!path) {
        snprintf(temp_path, sizeof temp_path, "./fastensor-bench-%d.tmp", (int)getpid());
        atexit(remove_temp);
        path = temp_path;
    }
    if (o.cold && geteuid() != 0)
        fprintf(stderr, "fastensor bench: not root, so the global page cache cannot be "
                        "dropped; cold reads evict only the file (fadvise DONTNEED)\n");
    uint64_t max_block = 0;
    for (int i = 0; i < o.nsizes; i++)
        if (o.sizes[i] > max_block)
            max_block = o.sizes[i];
    uint64_t buf_bytes = 0; /* each request in flight has its own buffer */
    for (int i = 0; i < o.nsizes; i++) {
        uint64_t need = o.sizes[i] * (uint64_t)inflight_for(&o, o.sizes[i]);
        if (need > buf_bytes)
            buf_bytes = need;
    }
    uint8_t *buf = cli_alloc((size_t)buf_bytes), *dbuf = NULL;
    ft_ctx *ctx = NULL;
    ft_file *f = NULL;
    if (!buf) {
        cli_error("bench", "cannot allocate %llu bytes of buffers", (unsigned long long)buf_bytes);
        return EXIT_ERR;
    }
    cli_fill_random(buf, (size_t)buf_bytes, 42);
    g_device = o.device;
    g_batch = o.batch;
    if (o.device >= 0) { /* device buffers, filled from the host ones */
        int crc = ft_cuda_alloc(o.device, (size_t)buf_bytes, (void **)&dbuf);
        if (crc == 0)
            crc = ft_cuda_copy(dbuf, buf, (size_t)buf_bytes);
        if (crc < 0) {
            cli_ft_error("bench", "device buffers", crc);
            free(buf);
            return EXIT_ERR;
        }
        free(buf);
        buf = dbuf;
    }
    if ((rc = ft_ctx_create(&ctx, NULL)) < 0 ||
        (rc = ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644)) <
            0) {
        cli_ft_error("bench", path, rc);
        ft_ctx_destroy(ctx);
        free(buf);
        return EXIT_ERR;
    }
    if (!o.json)
        printf("%-7s %-5s %6s %6s %-5s %-4s %9s %11s %8s %8s %8s\n", "engine", "op", "block",
               "total", "cache", "mem", "GB/s", "IOPS", "cpu_s", "GPU J/GB", "CPU J/GB");
    int all = o.nengines * o.nsizes * ((o.do_write ? 1 : 0) + (o.do_read ? o.cold + o.warm : 0));
    int done = 0, status = EXIT_OK;
    for (int s = 0; s < o.nsizes && status == EXIT_OK; s++) {
        uint64_t block = o.sizes[s], total = total_for(&o, block);
        int depth = inflight_for(&o, block);
        for (int e = 0; e < o.nengines && status == EXIT_OK; e++) {
            ft_engine eng = o.engines[e];
            result r;
            const char *wcache = o.cold ? "cold" : "warm";
            if (o.do_write) {
                progress(done, all, eng, "write", block);
                rc = measure(f, path, eng, true, wcache, buf, block, total, depth, o.repeat,
                             &r);
                if (rc < 0)
                    break;
                report(&o, eng, "write", block, total, wcache, &r);
                done++;
            } else if (ft_file_size(f) < (int64_t)total) { /* reads need the bytes there */
                if ((rc = run_pass(f, FT_ENGINE_AUTO, true, buf, block, total, depth, &r)) < 0)
                    break;
            }
            for (int w = 0; w < 2 && o.do_read; w++) {
                const char *cache = w == 0 ? "cold" : "warm";
                if ((w == 0 && !o.cold) || (w == 1 && !o.warm))
                    continue;
                progress(done, all, eng, cache, block);
                if ((rc = measure(f, path, eng, false, cache, buf, block, total, depth,
                                  o.repeat, &r)) < 0)
                    break;
                report(&o, eng, "read", block, total, cache, &r);
                done++;
            }
            if (rc < 0)
                break;
        }
        if (rc < 0) {
            cli_ft_error("bench", path, rc);
            status = EXIT_ERR;
        }
    }
    progress(all, all, FT_ENGINE_AUTO, "", 0);
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    if (dbuf)
        ft_cuda_free(dbuf);
    else
        free(buf);
    return status;
}
