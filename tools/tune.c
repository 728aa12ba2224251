/* fastensor tune / profile: build and show the AUTO selector's dictionary. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Bytes of plain writes per sync while tuning. */
#define SYNC_RUN (64u << 20)

static char temp_path[4096];
static void remove_temp(void)
{
    if (temp_path[0])
        unlink(temp_path);
}

static void tune_usage(FILE *out)
{
    fprintf(out, "usage: fastensor tune [--file PATH] [--memory host|cuda[:N]] [--seconds N] "
                 "[--max-size BYTES]\n\n"
                 "Builds the AUTO profile for the filesystem holding PATH (default: a temporary "
                 "file here):\ntransfers of 4K..max-size (256M; larger sizes are one key with "
                 "256M and only spread the\ncold reads wider), reads cold (scattered and "
                 "streaming, through the page cache and O_DIRECT in turn; streams of 64K..16M "
                 "also with calls\nin flight) and cached, writes "
                 "plain, synced later (FT_IO_SYNC_LATER) and synced per call,\neach repeated "
                 "until every engine setting is measured, within N seconds (60). Then\nsaves "
                 "the profile and prints it.\n");
}

/* Evict the range so the next read of it is cold (the file's pages only). */
static void evict(int fd, uint64_t off, uint64_t len)
{
    posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

/* Cold streams read with calls in flight, as a prefetch does: 256 MiB worth of requests, up
 * to 16, for BUSY_BYTES per size (the library measures such reads in stints of 32 MiB: this
 * is about three of each engine setting), through the file in order from an evicted start.
 * Their ranking is not the one of calls alone (development machine, cold 1 MiB reads, three
 * rounds: alone `mmap` 0.8-1.0 GB/s, `direct` 1.0-1.3, `posix` 1.3-1.8; 16 in flight `direct`
 * 1.2-1.5, `posix` 2.2-2.3, `mmap` 2.2-2.5), and a job that prefetches would otherwise
 * explore it in its first passes. */
#define BUSY_MIN (64u << 10)
#define BUSY_MAX (16u << 20)
#define BUSY_BYTES (768ull << 20)
#define BUSY_DEPTH 16
_Static_assert(BUSY_DEPTH <= CLI_WINDOW_MAX, "the window holds BUSY_DEPTH requests");

static int busy_stream(ft_file *f, int fd, uint8_t *buf, uint64_t size, uint64_t max_size,
                       int device, double deadline, unsigned *calls)
{
    uint64_t depth = (256u << 20) / size;
    depth = depth < BUSY_DEPTH ? depth : BUSY_DEPTH;
    depth = depth < max_size / size ? depth : max_size / size;
    if (size < BUSY_MIN || size > BUSY_MAX || depth < 2)
        return 0;
    uint64_t places = max_size / size, total = BUSY_BYTES / size;
    ft_io_opts o = {.engine = FT_ENGINE_AUTO};
    cli_window w;
    cli_window_init(&w, (unsigned)depth, 0);
    for (uint64_t i = 0; i < total && w.rc == 0 && cli_now() < deadline; i++) {
        unsigned slot = cli_window_slot(&w);
        uint64_t off = i % places * size;
        if (off == 0) /* a new pass: what is still in flight reads the end of the last one */
            evict(fd, 0, max_size);
        ft_buf part = {buf + (size_t)slot * size, (size_t)size,
                       device >= 0 ? FT_MEM_CUDA : FT_MEM_HOST, device >= 0 ? device : 0};
        if (cli_window_add(&w, ft_submit_read(f, &part, off, &o, &w.req[slot])) == 0)
            (*calls)++;
    }
    return cli_window_drain(&w);
}

int cmd_tune(int argc, char **argv)
{
    static const struct option opts[] = {{"file", required_argument, NULL, 'f'},
                                         {"memory", required_argument, NULL, 'm'},
                                         {"seconds", required_argument, NULL, 's'},
                                         {"max-size", required_argument, NULL, 'x'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *path = NULL;
    int device = -1;
    double budget = 60;
    uint64_t max_size = 256u << 20;
    int c;
    while ((c = getopt_long(argc, argv, "f:m:s:x:h", opts, NULL)) != -1) {
        if (c == 'f')
            path = optarg;
        else if (c == 'm' && !strcmp(optarg, "host"))
            device = -1;
        else if (c == 'm' && !strncmp(optarg, "cuda", 4) && (!optarg[4] || optarg[4] == ':'))
            device = optarg[4] ? atoi(optarg + 5) : 0;
        else if (c == 'm') {
            cli_error("tune", "bad --memory '%s' (host, cuda, cuda:N)", optarg);
            return EXIT_USAGE;
        } else if (c == 's' && (budget = atof(optarg)) <= 0) {
            cli_error("tune", "bad --seconds '%s'", optarg);
            return EXIT_USAGE;
        } else if (c == 'x' && (ft_parse_size(optarg, &max_size) < 0 || max_size < 4096)) {
            cli_error("tune", "bad --max-size '%s'", optarg);
            return EXIT_USAGE;
        } else if (c == 'h' || c == '?') {
            tune_usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? EXIT_OK : EXIT_USAGE;
        }
    }
    if (!path) {
        snprintf(temp_path, sizeof temp_path, "./fastensor-tune-%d.tmp", (int)getpid());
        atexit(remove_temp);
        path = temp_path;
    }
    ft_ctx *ctx;
    ft_file *f;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc < 0 || (rc = ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE |
                                                        FT_OPEN_CREATE, 0644)) < 0) {
        cli_ft_error("tune", path, rc);
        return EXIT_ERR;
    }
    uint8_t *buf = cli_alloc((size_t)max_size), *host = buf;
    cli_fill_random(buf, (size_t)max_size, 7);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ft_buf b = ft_host_buf(buf, (size_t)max_size);
    ft_io_opts posix = {.engine = FT_ENGINE_POSIX, .flags = FT_IO_SYNC};
    if ((rc = (int)ft_write(f, &b, 0, &posix)) < 0) {
        cli_ft_error("tune", path, rc);
        return EXIT_ERR;
    }
    if (device >= 0) { /* transfers to and from device memory from here on */
        if ((rc = ft_cuda_alloc(device, (size_t)max_size, (void **)&buf)) < 0) {
            cli_ft_error("tune", "device buffer", rc);
            return EXIT_ERR;
        }
    }
    /* every arm explored (3 each), each engine's first call (not a sample), then exploited */
    const unsigned rounds = 3 * 8 + 5 + 4;
    double start = cli_now();
    unsigned calls = 0;
    bool out_of_time = false;
    /* cached (first: page-cache copies cost little, and a budget that runs out in a large
     * size's disk-bound kinds would leave its cached key to be explored in use, one whole
     * call per sample); cold: random places, each evicted first; stream: through the file in
     * order from an evicted start (readahead at work); busy: the same with calls in flight;
     * plain writes and writes flagged FT_IO_SYNC_LATER (through the file in order, synced
     * once per run of SYNC_RUN bytes, as a job saves a file and syncs it); writes synced one
     * by one (FT_IO_SYNC) */
    enum { CACHED, COLD, STREAM, BUSY, WRITE, LATER, SYNC, KINDS };
    /* The selector keys every size from 256 MiB up alike (one bucket): larger calls here would
     * only repeat what 256 MiB ones measure at several times the cost (and run the budget out
     * before they were done); a larger --max-size still spreads the cold reads wider. */
    const uint64_t top_size = 256u << 20;
    for (uint64_t size = 4096; size <= max_size && size <= top_size && !out_of_time; size *= 4) {
        for (int kind = 0; kind < KINDS && !out_of_time; kind++) {
            ft_buf part = {buf, (size_t)size, device >= 0 ? FT_MEM_CUDA : FT_MEM_HOST,
                           device >= 0 ? device : 0};
            ft_io_opts o = {.engine = FT_ENGINE_AUTO,
                            .flags = kind == SYNC    ? FT_IO_SYNC
                                     : kind == LATER ? FT_IO_SYNC_LATER
                                                     : 0};
            bool runs = kind == WRITE || kind == LATER;
            if (kind == BUSY) {
                int n = busy_stream(f, fd, buf, size, max_size, device, start + budget, &calls);
                out_of_time = cli_now() - start > budget;
                if (n < 0) {
                    cli_ft_error("tune", path, n);
                    return EXIT_ERR;
                }
                continue;
            }
            if (kind == CACHED) /* make it cached */
                ft_read(f, &part, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX});
            uint64_t places = max_size / size;
            /* Plain writes: runs of SYNC_RUN bytes, one sync each, at least four runs. Synced
             * one by one, a 4 KiB buffered write carried a whole fdatasync (journal commit,
             * disk flush) and scored 0.02 GB/s against O_DIRECT's 0.07, where a 64 MiB pass of
             * them synced once runs at 0.48 against 0.32 (development machine): the profile
             * sent small writes to O_DIRECT at half the speed. */
            uint64_t run = 1;
            unsigned calls_here = rounds;
            if (runs) {
                run = (SYNC_RUN < max_size ? SYNC_RUN : max_size) / size;
                run = run ? run : 1;
                calls_here = 4 * run > rounds ? (unsigned)(4 * run) : rounds;
            }
            for (unsigned r = 0; r < calls_here; r++) {
                if (cli_now() - start > budget) {
                    out_of_time = true;
                    break;
                }
                /* cold: a scattered walk (a stride coprime to the number of places) */
                uint64_t off = (r * 7919u) % places * size;
                if (kind == CACHED)
                    off = 0;
                if (kind == STREAM) {
                    off = r % places * size;
                    if (off == 0)
                        evict(fd, 0, max_size);
                }
                if (kind == COLD)
                    evict(fd, off, size);
                if (runs)
                    off = r % places * size;
                /* uncached reads both ways, in turn: `fastensor info` and the cache policy
                 * compare the buffered and the O_DIRECT cold rates */
                if (kind == COLD || kind == STREAM)
                    o.cache = r % 2 ? FT_CACHE_BYPASS : FT_CACHE_KEEP;
                bool write = runs || kind == SYNC;
                int64_t n = write ? ft_write(f, &part, off, &o) : ft_read(f, &part, off, &o);
                /* a plain write is measured once durable (its share of the sync): without
                 * the sync a buffered write would look as fast as a memory copy */
                if (n >= 0 && runs && ((r + 1) % run == 0 || r + 1 == calls_here))
                    n = ft_file_sync(f);
                if (n < 0) {
                    cli_ft_error("tune", path, (int)n);
                    return EXIT_ERR;
                }
                calls++;
            }
        }
        if (isatty(2))
            fprintf(stderr, "\r\033[Ktuned up to %llu bytes (%u calls, %.0f s)",
                    (unsigned long long)size, calls, cli_now() - start);
    }
    if (isatty(2))
        fputc('\n', stderr);
    if (out_of_time)
        fprintf(stderr, "fastensor tune: time budget of %.0f s reached; larger sizes keep "
                        "learning in use\n", budget);
    close(fd);
    rc = ft_profile_save(ctx);
    if (rc < 0)
        cli_ft_error("tune", "saving the profile", rc);
    ft_profile_show(ctx, path, stdout);
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    if (device >= 0)
        ft_cuda_free(buf);
    free(host);
    return rc < 0 ? EXIT_ERR : EXIT_OK;
}

int cmd_profile(int argc, char **argv)
{
    static const struct option opts[] = {{"file", required_argument, NULL, 'f'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *path = ".";
    int c;
    while ((c = getopt_long(argc, argv, "f:h", opts, NULL)) != -1) {
        if (c == 'f')
            path = optarg;
        else {
            FILE *out = c == 'h' ? stdout : stderr;
            fprintf(out, "usage: fastensor profile show [--file PATH]\n\n"
                         "Prints the AUTO dictionary for the filesystem holding PATH (default .): "
                         "per key the\nchosen engine setting and every setting's median GB/s "
                         "and sample count.\n");
            return c == 'h' ? EXIT_OK : EXIT_USAGE;
        }
    }
    if (optind != argc - 1 || strcmp(argv[optind], "show") != 0) {
        cli_error("profile", "expected 'show' (see --help)");
        return EXIT_USAGE;
    }
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc == 0)
        rc = ft_profile_show(ctx, path, stdout);
    if (rc < 0)
        cli_ft_error("profile", path, rc);
    ft_ctx_destroy(ctx);
    return rc < 0 ? EXIT_ERR : EXIT_OK;
}
