/* fastensor inspect / verify: look into a checkpoint, check its checksums. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <string.h>
#include <unistd.h>

static void json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

static void shape_text(const ft_tensor_info *t, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (unsigned d = 0; d < t->ndim && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)t->shape[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

static void print_json(const ft_ckpt *c, const char *path)
{
    printf("{\"path\":");
    json_string(stdout, path);
    printf(",\"format\":\"%s\"", ft_ckpt_format(c) == FT_FORMAT_FST ? "fst" : "safetensors");
    printf(",\"checksums\":%s,\"shards\":[", ft_ckpt_has_checksums(c) ? "true" : "false");
    for (unsigned k = 0; k < ft_ckpt_shard_count(c); k++) {
        int64_t start = ft_ckpt_shard_data_start(c, k);
        printf("%s{\"path\":", k ? "," : "");
        json_string(stdout, ft_ckpt_shard_path(c, k));
        printf(",\"data_start\":%lld,\"data_size\":%lld,\"aligned\":%s}", (long long)start,
               (long long)ft_ckpt_shard_size(c, k), start % 4096 == 0 ? "true" : "false");
    }
    printf("],\"metadata\":{");
    for (size_t i = 0; i < ft_ckpt_metadata_count(c); i++) {
        const char *k, *v;
        ft_ckpt_metadata(c, i, &k, &v);
        printf("%s", i ? "," : "");
        json_string(stdout, k);
        putchar(':');
        json_string(stdout, v);
    }
    printf("},\"tensors\":[");
    for (size_t i = 0; i < ft_ckpt_count(c); i++) {
        ft_tensor_info t;
        ft_ckpt_info(c, i, &t);
        char shape[512];
        shape_text(&t, shape, sizeof shape);
        printf("%s{\"name\":", i ? "," : "");
        json_string(stdout, t.name);
        printf(",\"dtype\":\"%s\",\"shape\":%s,\"bytes\":%llu,\"shard\":%u,"
               "\"data_offsets\":[%llu,%llu],\"file_offset\":%llu",
               ft_dtype_name(t.dtype), shape, (unsigned long long)t.nbytes, t.shard,
               (unsigned long long)t.data_offset,
               (unsigned long long)(t.data_offset + t.nbytes),
               (unsigned long long)t.file_offset);
        uint64_t stored;
        int coded = ft_ckpt_stored(c, i, &stored);
        printf(",\"stored_bytes\":%llu,\"compressed\":%s}", (unsigned long long)stored,
               coded == 1 ? "true" : "false");
    }
    printf("]}\n");
}

/* "  metadata KEY = VALUE" lines (escaped). */
static void print_metadata(const ft_ckpt *c)
{
    char e1[4096], e2[4096];
    for (size_t i = 0; i < ft_ckpt_metadata_count(c); i++) {
        const char *k, *v;
        ft_ckpt_metadata(c, i, &k, &v);
        printf("  metadata %s = %s\n", cli_escape(k, e1, sizeof e1), cli_escape(v, e2, sizeof e2));
    }
}

/* A .fst container: its tensors' coded and stored bytes. */
static void print_container(const ft_ckpt *c, const char *path)
{
    uint64_t total = 0, stored = 0;
    char e1[4096];
    for (size_t i = 0; i < ft_ckpt_count(c); i++) {
        ft_tensor_info t;
        uint64_t s;
        ft_ckpt_info(c, i, &t);
        ft_ckpt_stored(c, i, &s);
        total += t.nbytes;
        stored += s;
    }
    printf("%s: fastensor container (.fst), %zu tensors, %llu bytes stored in %llu (%.3f), "
           "checksums: codec blocks (xxh3-64)\n", cli_escape(path, e1, sizeof e1),
           ft_ckpt_count(c), (unsigned long long)total, (unsigned long long)stored,
           total ? (double)stored / (double)total : 1.0);
    print_metadata(c);
    printf("\n%-40s %-8s %-20s %14s %14s %6s\n", "tensor", "dtype", "shape", "bytes", "stored",
           "coded");
    for (size_t i = 0; i < ft_ckpt_count(c); i++) {
        ft_tensor_info t;
        uint64_t s;
        ft_ckpt_info(c, i, &t);
        int coded = ft_ckpt_stored(c, i, &s);
        char shape[512];
        shape_text(&t, shape, sizeof shape);
        printf("%-40s %-8s %-20s %14llu %14llu %6s\n", cli_escape(t.name, e1, sizeof e1),
               ft_dtype_name(t.dtype), shape, (unsigned long long)t.nbytes,
               (unsigned long long)s, coded == 1 ? "yes" : "no");
    }
}

static void print_table(const ft_ckpt *c, const char *path)
{
    uint64_t total = 0;
    char e1[4096], e2[4096];
    if (ft_ckpt_format(c) == FT_FORMAT_FST) {
        print_container(c, path);
        return;
    }
    for (unsigned k = 0; k < ft_ckpt_shard_count(c); k++)
        total += (uint64_t)ft_ckpt_shard_size(c, k);
    path = cli_escape(path, e1, sizeof e1);
    printf("%s: %zu tensors, %.3f GB in %u shard(s), checksums: %s\n", path, ft_ckpt_count(c),
           (double)total / 1e9, ft_ckpt_shard_count(c),
           ft_ckpt_has_checksums(c) ? "xxh3-64 blocks" : "none");
    for (unsigned k = 0; k < ft_ckpt_shard_count(c); k++) {
        int64_t start = ft_ckpt_shard_data_start(c, k);
        printf("  shard %u: %s, data at %lld (%s), %lld bytes\n", k,
               cli_escape(ft_ckpt_shard_path(c, k), e2, sizeof e2),
               (long long)start, start % 4096 == 0 ? "4K-aligned" : "unaligned",
               (long long)ft_ckpt_shard_size(c, k));
    }
    print_metadata(c);
    printf("\n%-40s %-8s %-20s %14s %5s %14s\n", "tensor", "dtype", "shape", "bytes", "shard",
           "file offset");
    for (size_t i = 0; i < ft_ckpt_count(c); i++) {
        ft_tensor_info t;
        ft_ckpt_info(c, i, &t);
        char shape[512];
        shape_text(&t, shape, sizeof shape);
        printf("%-40s %-8s %-20s %14llu %5u %14llu\n", cli_escape(t.name, e1, sizeof e1),
               ft_dtype_name(t.dtype), shape,
               (unsigned long long)t.nbytes, t.shard, (unsigned long long)t.file_offset);
    }
}

static int open_ckpt(const char *cmd, const char *path, ft_ctx **ctx, ft_ckpt **c)
{
    int rc = ft_ctx_create(ctx, NULL);
    if (rc < 0) {
        cli_ft_error(cmd, "context", rc);
        return EXIT_ERR;
    }
    rc = ft_ckpt_open(*ctx, c, path);
    if (rc < 0) {
        cli_error(cmd, "%s", ft_last_error());
        ft_ctx_destroy(*ctx);
        return EXIT_ERR;
    }
    return EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    bool json = false;
    int c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        if (c == 'j')
            json = true;
        else {
            FILE *out = c == 'h' ? stdout : stderr;
            fprintf(out, "usage: fastensor inspect FILE|INDEX|DIR [--json]\n\n"
                         "Tensors (dtype, shape, bytes, offsets), metadata, shards, alignment and "
                         "checksums of a\nsafetensors checkpoint; of a .fst container, each "
                         "tensor's stored bytes and whether\nit is coded. The header is "
                         "validated strictly; an invalid file is an error.\n");
            return c == 'h' ? EXIT_OK : EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        cli_error("inspect", "expected one checkpoint path (see --help)");
        return EXIT_USAGE;
    }
    ft_ctx *ctx;
    ft_ckpt *ck;
    if (open_ckpt("inspect", argv[optind], &ctx, &ck) != EXIT_OK)
        return EXIT_ERR;
    if (json)
        print_json(ck, argv[optind]);
    else
        print_table(ck, argv[optind]);
    ft_ckpt_close(ck);
    ft_ctx_destroy(ctx);
    return EXIT_OK;
}

static void progress_bar(uint64_t done, uint64_t total, void *arg)
{
    (void)arg;
    int width = 40, filled = total ? (int)((double)done / (double)total * width) : width;
    fprintf(stderr, "\r[%.*s%*s] %5.1f%%", filled, "########################################",
            width - filled, "", total ? 100.0 * (double)done / (double)total : 100.0);
    if (done >= total)
        fprintf(stderr, "\r\033[K");
}

int cmd_verify(int argc, char **argv)
{
    static const struct option opts[] = {{"engine", required_argument, NULL, 'e'},
                                         {"require-checksums", no_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    ft_load_opts lo = {.engine = FT_ENGINE_AUTO};
    bool require = false;
    int c;
    while ((c = getopt_long(argc, argv, "e:rh", opts, NULL)) != -1) {
        int e;
        if (c == 'e' && (e = ft_engine_from_name(optarg)) >= 0) {
            lo.engine = (ft_engine)e;
            continue;
        }
        if (c == 'r') {
            require = true;
            continue;
        }
        FILE *out = c == 'h' ? stdout : stderr;
        fprintf(out, "usage: fastensor verify FILE|INDEX|DIR [--engine E] [--require-checksums]\n\n"
                     "Checks the structure of every shard (header, offsets, sizes), then reads "
                     "every shard\nand checks its xxh3 block checksums. Exit 0 when intact; 1 "
                     "naming the first\nproblem (bad block and its tensor). A checkpoint without "
                     "fastensor checksums (written\nby another tool) has its structure checked "
                     "and says so: exit 0, or 1 with\n--require-checksums.\n");
        return c == 'h' ? EXIT_OK : EXIT_USAGE;
    }
    if (optind != argc - 1) {
        cli_error("verify", "expected one checkpoint path (see --help)");
        return EXIT_USAGE;
    }
    ft_ctx *ctx;
    ft_ckpt *ck;
    if (open_ckpt("verify", argv[optind], &ctx, &ck) != EXIT_OK)
        return EXIT_ERR;
    uint64_t total = 0;
    for (unsigned k = 0; k < ft_ckpt_shard_count(ck); k++)
        total += (uint64_t)ft_ckpt_shard_size(ck, k);
    if (!ft_ckpt_has_checksums(ck)) {
        printf("%s: %s: structure valid (%zu tensors, %llu bytes in %u shard(s)), but it "
               "carries no fastensor checksums: its bytes cannot be checked (a save with "
               "fastensor adds them)\n", require ? "FAIL" : "NO CHECKSUMS", argv[optind],
               ft_ckpt_count(ck), (unsigned long long)total, ft_ckpt_shard_count(ck));
        ft_ckpt_close(ck);
        ft_ctx_destroy(ctx);
        return require ? EXIT_ERR : EXIT_OK;
    }
    double t0 = cli_now();
    int rc = ft_ckpt_verify(ck, &lo, isatty(2) ? progress_bar : NULL, NULL);
    double secs = cli_now() - t0;
    int status = EXIT_OK;
    if (rc == 0)
        printf("OK: %s: %zu tensors, %llu bytes in %u %s match their checksums "
               "(%.2f GB/s)\n", argv[optind], ft_ckpt_count(ck), (unsigned long long)total,
               ft_ckpt_shard_count(ck), ft_ckpt_format(ck) == FT_FORMAT_FST
                                            ? "container (every stream decoded)" : "shard(s)",
               (double)total / secs / 1e9);
    else {
        cli_error("verify", "%s", ft_last_error());
        status = EXIT_ERR;
    }
    ft_ckpt_close(ck);
    ft_ctx_destroy(ctx);
    return status;
}
