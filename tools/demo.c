/*
 * fastensor demo: a synthetic checkpoint with the layer shapes of a real model (GPT-2 small,
 * 124M float32 parameters, by default): saved durably with checksums, loaded back cold with
 * each engine, verified, and timed against a plain write()/read() path.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct model {
    ft_tensor *t;
    uint64_t (*shapes)[2];
    char (*names)[64];
    size_t n, cap;
    uint64_t bytes;
} model;

static void add(model *m, const char *name, uint64_t d0, uint64_t d1)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 64;
        m->t = realloc(m->t, m->cap * sizeof *m->t);
        m->shapes = realloc(m->shapes, m->cap * sizeof *m->shapes);
        m->names = realloc(m->names, m->cap * sizeof *m->names);
    }
    size_t i = m->n++;
    snprintf(m->names[i], sizeof m->names[i], "%s", name);
    m->shapes[i][0] = d0;
    m->shapes[i][1] = d1;
    uint64_t bytes = d0 * (d1 ? d1 : 1) * 4;
    m->t[i] = (ft_tensor){NULL, FT_DTYPE_F32, d1 ? 2 : 1, NULL,
                          {NULL, (size_t)bytes, FT_MEM_HOST, 0}};
    m->bytes += bytes;
}

/* GPT-2 style decoder: embeddings, @p layers blocks of width @p d, vocabulary @p vocab. */
static void build_gpt2(model *m, unsigned layers, uint64_t d, uint64_t vocab)
{
    char name[64];
    add(m, "wte.weight", vocab, d);
    add(m, "wpe.weight", 1024, d);
    for (unsigned l = 0; l < layers; l++) {
        static const struct { const char *n; unsigned a, b; } p[] = {
            {"ln_1.weight", 1, 0}, {"ln_1.bias", 1, 0}, {"attn.c_attn.weight", 1, 3},
            {"attn.c_attn.bias", 3, 0}, {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
            {"ln_2.weight", 1, 0}, {"ln_2.bias", 1, 0}, {"mlp.c_fc.weight", 1, 4},
            {"mlp.c_fc.bias", 4, 0}, {"mlp.c_proj.weight", 4, 1}, {"mlp.c_proj.bias", 1, 0}};
        for (size_t i = 0; i < sizeof p / sizeof *p; i++) {
            snprintf(name, sizeof name, "h.%u.%s", l, p[i].n);
            add(m, name, p[i].a * d, p[i].b * d);
        }
    }
    add(m, "ln_f.weight", d, 0);
    add(m, "ln_f.bias", d, 0);
}

static void finish(model *m)
{
    for (size_t i = 0; i < m->n; i++) {
        m->t[i].name = m->names[i];
        m->t[i].shape = m->shapes[i];
        m->t[i].data.ptr = malloc(m->t[i].data.len);
        cli_fill_random(m->t[i].data.ptr, m->t[i].data.len, i + 1);
    }
}

/* The plain path: one write() per tensor, fsync; then one read() per tensor. */
static int plain_path(const model *m, const char *path, double *wsec, double *rsec)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    double t0 = cli_now();
    for (size_t i = 0; i < m->n; i++)
        if (write(fd, m->t[i].data.ptr, m->t[i].data.len) != (ssize_t)m->t[i].data.len) {
            close(fd);
            return -EIO;
        }
    fsync(fd);
    *wsec = cli_now() - t0;
    close(fd);
    cli_evict(path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* Into fresh memory for every tensor, as a loader must (and as fastensor's load does). */
    uint8_t *buf = malloc((size_t)m->bytes);
    t0 = cli_now();
    for (size_t i = 0, at = 0; i < m->n; at += m->t[i].data.len, i++)
        if (read(fd, buf + at, m->t[i].data.len) != (ssize_t)m->t[i].data.len)
            break;
    *rsec = cli_now() - t0;
    free(buf);
    close(fd);
    unlink(path);
    return 0;
}

/* Layers of width 1024 (12 x 1024^2 float32 each) after the embeddings, for @p bytes. */
#define FT_MAX_LAYERS(bytes)                                                                  \
    ((bytes) > 210000000ull ? ((bytes) - 210000000ull) / (12ull << 22) + 1 : 1)

static void demo_usage(FILE *out)
{
    fprintf(out, "usage: fastensor demo [--model gpt2|gpt2-medium|tiny | --size BYTES] [--dir DIR] "
                 "[--json]\n\n"
                 "Builds a synthetic float32 checkpoint with the model's layer shapes, saves it "
                 "durably\nwith checksums, loads it back from a cold cache with each engine, "
                 "verifies it, and\ncompares with plain write()/read(). Files go to DIR "
                 "(default .) and are removed. --size builds a width-1024 decoder of about that\n"
                 "size; --json adds one JSON line per measurement.\n");
}

int cmd_demo(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"size", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *dir = ".", *name = "gpt2";
    uint64_t size = 0;
    bool json = false;
    int c;
    while ((c = getopt_long(argc, argv, "m:d:s:jh", opts, NULL)) != -1) {
        if (c == 'm')
            name = optarg;
        else if (c == 'd')
            dir = optarg;
        else if (c == 'j')
            json = true;
        else if (c == 's' && ft_parse_size(optarg, &size) == 0 && size > 0)
            name = "sized";
        else {
            demo_usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? EXIT_OK : EXIT_USAGE;
        }
    }
    model m = {0};
    if (!strcmp(name, "gpt2"))
        build_gpt2(&m, 12, 768, 50257);
    else if (!strcmp(name, "gpt2-medium"))
        build_gpt2(&m, 24, 1024, 50257);
    else if (!strcmp(name, "tiny"))
        build_gpt2(&m, 2, 64, 1000);
    else if (!strcmp(name, "sized")) /* width 1024, as many layers as --size needs */
        build_gpt2(&m, (unsigned)FT_MAX_LAYERS(size), 1024, 50257);
    else {
        cli_error("demo", "unknown --model '%s' (gpt2, gpt2-medium, tiny)", name);
        return EXIT_USAGE;
    }
    finish(&m);
    char path[4200], plain[4200];
    snprintf(path, sizeof path, "%s/fastensor-demo-%d.safetensors", dir, (int)getpid());
    snprintf(plain, sizeof plain, "%s/fastensor-demo-%d.plain", dir, (int)getpid());
    printf("fastensor demo: %s-shaped checkpoint, %zu tensors, %.1f MB float32, in %s\n\n", name,
           m.n, (double)m.bytes / 1e6, dir);
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL), status = EXIT_OK;
    if (rc < 0) {
        cli_ft_error("demo", "context", rc);
        return EXIT_ERR;
    }
    double pw = 0, pr = 0;
    if ((rc = plain_path(&m, plain, &pw, &pr)) < 0)
        cli_error("demo", "plain write/read path failed: %s", ft_strerror(rc));
    printf("%-34s %8s %10s\n", "path", "seconds", "GB/s");
    printf("%-34s %8.3f %10.2f\n", "plain write() per tensor + fsync", pw,
           (double)m.bytes / pw / 1e9);
    if (json)
        printf("{\"what\":\"plain\",\"op\":\"write\",\"bytes\":%llu,\"seconds\":%.6f}\n"
               "{\"what\":\"plain\",\"op\":\"read\",\"bytes\":%llu,\"seconds\":%.6f}\n",
               (unsigned long long)m.bytes, pw, (unsigned long long)m.bytes, pr);
    double t0 = cli_now();
    rc = ft_ckpt_save(ctx, path, m.t, m.n, NULL);
    double ws = cli_now() - t0;
    if (rc < 0) {
        cli_ft_error("demo", "save", rc);
        status = EXIT_ERR;
    } else {
        printf("%-34s %8.3f %10.2f  (%.1fx)\n", "fastensor save (durable, xxh3)", ws,
               (double)m.bytes / ws / 1e9, pw / ws);
        if (json)
            printf("{\"what\":\"fastensor\",\"op\":\"save\",\"engine\":\"auto\",\"bytes\":%llu,"
                   "\"seconds\":%.6f}\n", (unsigned long long)m.bytes, ws);
        printf("%-34s %8.3f %10.2f\n", "plain read() per tensor, cold", pr,
               (double)m.bytes / pr / 1e9);
    }
    for (int e = 0; e < FT_ENGINE_COUNT && status == EXIT_OK; e++) {
        for (int verify = 0; verify < 2 && status == EXIT_OK; verify++) {
            if (verify && e != FT_ENGINE_AUTO)
                continue;
            cli_evict(path);
            ft_ckpt *ck;
            ft_load_opts lo = {.engine = (ft_engine)e, .flags = verify ? FT_LOAD_VERIFY : 0};
            t0 = cli_now();
            if ((rc = ft_ckpt_open(ctx, &ck, path)) == 0)
                rc = ft_ckpt_load_all(ck, &lo);
            double ls = cli_now() - t0;
            if (rc < 0) {
                cli_ft_error("demo", "load", rc);
                status = EXIT_ERR;
                break;
            }
            bool same = ft_ckpt_count(ck) == m.n;
            for (size_t i = 0; same && i < m.n; i++) {
                int64_t k = ft_ckpt_find(ck, m.t[i].name);
                same = k >= 0 && !memcmp(ft_ckpt_data(ck, (size_t)k), m.t[i].data.ptr,
                                         m.t[i].data.len);
            }
            char label[64];
            snprintf(label, sizeof label, "fastensor load, cold, %s%s",
                     ft_engine_name((ft_engine)e), verify ? " + verify" : "");
            printf("%-34s %8.3f %10.2f  (%.1fx)  %s\n", label, ls, (double)m.bytes / ls / 1e9,
                   pr / ls, same ? "bytes identical" : "MISMATCH");
            if (json)
                printf("{\"what\":\"fastensor\",\"op\":\"load\",\"engine\":\"%s\",\"verify\":%s,"
                       "\"bytes\":%llu,\"seconds\":%.6f}\n", ft_engine_name((ft_engine)e),
                       verify ? "true" : "false", (unsigned long long)m.bytes, ls);
            if (!same)
                status = EXIT_ERR;
            ft_ckpt_close(ck);
        }
    }
    if (status == EXIT_OK) {
        ft_ckpt *ck;
        if (ft_ckpt_open(ctx, &ck, path) == 0) {
            rc = ft_ckpt_verify(ck, NULL, NULL, NULL);
            printf("\nverify: %s\n", rc == 0 ? "all checksums match" : ft_last_error());
            ft_ckpt_close(ck);
        }
        if (geteuid() != 0)
            printf("(not root: cold loads evicted only the file from the page cache)\n");
    }
    unlink(path);
    ft_ctx_destroy(ctx);
    for (size_t i = 0; i < m.n; i++)
        free(m.t[i].data.ptr);
    free(m.t);
    free(m.shapes);
    free(m.names);
    return status;
}
