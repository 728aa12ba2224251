/*
 * fastensor demo: write a checkpoint-sized file with every engine, read it back cold, verify
 * every byte, and print a table. (Checkpoint files proper arrive with the checkpoint layer.)
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void demo_usage(FILE *out)
{
    fprintf(out, "usage: fastensor demo [--size BYTES] [--dir DIR]\n\n"
                 "Writes a synthetic checkpoint of --size bytes (default 512M) in DIR (default .)\n"
                 "with each engine (durably), reads it back from a cold cache, verifies the bytes\n"
                 "and prints the speeds. The file is removed afterwards.\n");
}

int cmd_demo(int argc, char **argv)
{
    static const struct option opts[] = {{"size", required_argument, NULL, 's'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    uint64_t size = 512u << 20;
    const char *dir = ".";
    int c;
    while ((c = getopt_long(argc, argv, "s:d:h", opts, NULL)) != -1) {
        if (c == 's' && ft_parse_size(optarg, &size) == 0 && size > 0)
            continue;
        if (c == 'd') {
            dir = optarg;
            continue;
        }
        if (c == 'h') {
            demo_usage(stdout);
            return EXIT_OK;
        }
        if (c == 's')
            cli_error("demo", "bad --size '%s'", optarg);
        demo_usage(stderr);
        return EXIT_USAGE;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/fastensor-demo-%d.bin", dir, (int)getpid());
    uint8_t *src = cli_alloc((size_t)size), *dst = cli_alloc((size_t)size);
    if (!src || !dst) {
        cli_error("demo", "cannot allocate 2 x %llu bytes", (unsigned long long)size);
        return EXIT_ERR;
    }
    cli_fill_random(src, (size_t)size, 2023);
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc < 0) {
        cli_ft_error("demo", "context", rc);
        return EXIT_ERR;
    }
    char sz[32];
    printf("fastensor demo: %s synthetic checkpoint in %s, one call per direction\n\n",
           cli_fmt_size(size, sz, sizeof sz), dir);
    printf("%-7s %16s %16s  %s\n", "engine", "write GB/s (sync)", "cold read GB/s", "bytes");
    int status = EXIT_OK;
    for (int e = 0; e < FT_ENGINE_COUNT && status == EXIT_OK; e++) {
        ft_file *f;
        if ((rc = ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                  FT_OPEN_TRUNC, 0644)) < 0) {
            cli_ft_error("demo", path, rc);
            status = EXIT_ERR;
            break;
        }
        ft_io_opts wo = {.engine = (ft_engine)e, .flags = FT_IO_SYNC};
        ft_io_opts ro = {.engine = (ft_engine)e};
        ft_buf b = ft_host_buf(src, (size_t)size), d = ft_host_buf(dst, (size_t)size);
        memset(dst, 0, (size_t)size);
        double t0 = cli_now();
        int64_t w = ft_write(f, &b, 0, &wo);
        double t1 = cli_now();
        cli_evict(path);
        double t2 = cli_now();
        int64_t r = w < 0 ? 0 : ft_read(f, &d, 0, &ro);
        double t3 = cli_now();
        if (w < 0 || r < 0) {
            cli_ft_error("demo", ft_engine_name((ft_engine)e), (int)(w < 0 ? w : r));
            status = EXIT_ERR;
        } else {
            bool same = (uint64_t)r == size && memcmp(src, dst, (size_t)size) == 0;
            printf("%-7s %16.2f %16.2f  %s\n", ft_engine_name((ft_engine)e),
                   (double)size / (t1 - t0) / 1e9, (double)size / (t3 - t2) / 1e9,
                   same ? "verified" : "MISMATCH");
            if (!same)
                status = EXIT_ERR;
        }
        ft_file_close(f);
    }
    unlink(path);
    ft_ctx_destroy(ctx);
    free(src);
    free(dst);
    if (status == EXIT_OK)
        printf("\nall engines wrote and read back identical bytes%s\n",
               geteuid() == 0 ? "" : " (not root: cold reads evicted only the file)");
    return status;
}
