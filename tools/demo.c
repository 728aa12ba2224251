/*
 * fastensor demo: a synthetic checkpoint with the layer shapes of a real model (GPT-2 small,
 * 124M float32 parameters, by default): saved durably with checksums and timed against a
 * plain write()/read() path; then the workflow a user runs, per engine: a cold load in a
 * fresh process, a second load in another (a restarted job), and two processes loading it
 * at once from a cold cache (two ranks), every load's bytes checked; in rounds, the engines
 * interleaved, each engine's medians against the best fixed engine's own spread.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

/* ---- the workflow, each load in a fresh process ---- */

/* In a child: a context, the checkpoint loaded with @p e, its bytes compared with @p m's; what
 * AUTO learned kept for the next process where @p learn. Exits 0, 1 (the load failed) or 2
 * (bytes differ). */
static void child_load(const model *m, const char *path, ft_engine e, bool learn)
{
    if (!learn)
        setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *ctx;
    ft_ckpt *ck = NULL;
    ft_load_opts lo = {.engine = e};
    if (ft_ctx_create(&ctx, NULL) < 0 || ft_ckpt_open(ctx, &ck, path) < 0 ||
        ft_ckpt_load_all(ck, &lo) < 0) {
        fprintf(stderr, "fastensor demo: load with %s: %s\n", ft_engine_name(e), ft_last_error());
        _exit(1);
    }
    bool same = ft_ckpt_count(ck) == m->n;
    for (size_t i = 0; same && i < m->n; i++) {
        int64_t k = ft_ckpt_find(ck, m->t[i].name);
        same = k >= 0 && !memcmp(ft_ckpt_data(ck, (size_t)k), m->t[i].data.ptr,
                                 m->t[i].data.len);
    }
    /* as a user's process ends: the context saves what AUTO learned for the next one */
    ft_ckpt_close(ck);
    ft_ctx_destroy(ctx);
    _exit(same ? 0 : 2);
}

/* Seconds for @p procs fresh processes loading the checkpoint at once with @p e (from the
 * first fork to the last exit; AUTO's profile learning from them where @p learn), or -1 with
 * the failure said. */
static double fresh_loads(const model *m, const char *path, ft_engine e, int procs, bool learn)
{
    pid_t pid[8];
    double t0 = cli_now();
    for (int i = 0; i < procs; i++) {
        fflush(NULL);
        if ((pid[i] = fork()) == 0)
            child_load(m, path, e, learn);
        if (pid[i] < 0) {
            cli_error("demo", "fork: %s", strerror(errno));
            procs = i;
            t0 = -1;
        }
    }
    bool ok = t0 >= 0;
    for (int i = 0; i < procs; i++) {
        int st;
        if (waitpid(pid[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (ok && WIFEXITED(st) && WEXITSTATUS(st) == 2)
                cli_error("demo", "a load with %s returned other bytes", ft_engine_name(e));
            ok = false;
        }
    }
    return ok ? cli_now() - t0 : -1;
}

/* The workflow with engine @p e: cold, second, 2 processes cold, and their total in t[3].
 * @return 0 or -1. */
static int workflow_one(const model *m, const char *path, ft_engine e, double t[4])
{
    cli_evict(path);
    t[0] = fresh_loads(m, path, e, 1, true);
    t[1] = t[0] < 0 ? -1 : fresh_loads(m, path, e, 1, true);
    if (t[1] >= 0)
        cli_evict(path);
    t[2] = t[1] < 0 ? -1 : fresh_loads(m, path, e, 2, true);
    t[3] = t[0] + t[1] + t[2];
    return t[2] < 0 ? -1 : 0;
}

/* The median of @p n values (sorted in place). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cli_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void workflow_row(const model *m, const char *label, int round, const double t[4],
                         bool json)
{
    double gb = (double)m->bytes / 1e9;
    printf("%-14s %5d %8.3f %8.2f %8.3f %8.2f %8.3f %8.2f %9.3f\n", label, round + 1, t[0],
           gb / t[0], t[1], gb / t[1], t[2], 2 * gb / t[2], t[3]);
    if (json)
        printf("{\"what\":\"workflow\",\"engine\":\"%s\",\"round\":%d,\"bytes\":%llu,"
               "\"cold\":%.6f,\"second\":%.6f,\"two_procs_cold\":%.6f}\n", label, round + 1,
               (unsigned long long)m->bytes, t[0], t[1], t[2]);
}

#define DEMO_MAX_ENGINES 8
#define DEMO_MAX_ROUNDS 15

/* The median of column @p c (cold, 2nd, 2 procs, total) of @p rounds workflows @p t, its
 * range in @p lo and @p hi. */
static double column_median(double (*t)[4], int rounds, int c, double *lo, double *hi)
{
    double v[DEMO_MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        v[r] = t[r][c];
    double med = median(v, rounds);
    *lo = v[0];
    *hi = v[rounds - 1];
    return med;
}

/* The medians of @p rounds workflows @p t, the totals' range in @p lo and @p hi; prints the
 * row (and its JSON line). */
static void median_row(const model *m, const char *label, double (*t)[4], int rounds,
                       double med[4], double *lo, double *hi, bool json)
{
    for (int c = 0; c < 4; c++)
        med[c] = column_median(t, rounds, c, lo, hi); /* the total last: its range stays */
    double gb = (double)m->bytes / 1e9;
    printf("%-14s %8.3f %8.2f %8.3f %8.2f %8.3f %8.2f %9.3f (%.3f-%.3f)\n", label, med[0],
           gb / med[0], med[1], gb / med[1], med[2], 2 * gb / med[2], med[3], *lo, *hi);
    if (json)
        printf("{\"what\":\"workflow-median\",\"engine\":\"%s\",\"rounds\":%d,\"cold\":%.6f,"
               "\"second\":%.6f,\"two_procs_cold\":%.6f,\"total\":%.6f,\"total_min\":%.6f,"
               "\"total_max\":%.6f}\n", label, rounds, med[0], med[1], med[2], med[3], *lo, *hi);
}

/* Every engine of the comma list @p engines through the workflow, @p rounds times, the
 * engines' order rotated each round (interleaved: a slow minute of the disk falls on all of
 * them); then as many runs of the best fixed engine again (its twin: the noise floor, which
 * also shows how much of the best engine's lead was luck in being picked as the best), each
 * engine's medians and which line to pick. */
static int workflow(const model *m, const char *path, const char *engines, int rounds,
                    bool json)
{
    ft_engine e[DEMO_MAX_ENGINES];
    int n = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", engines);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        int k = ft_engine_from_name(name);
        if (k < 0 || n == DEMO_MAX_ENGINES) {
            cli_error("demo", k < 0 ? "unknown engine '%s'" : "more than 8 engines at '%s'",
                      name);
            return -1;
        }
        e[n++] = (ft_engine)k;
    }
    printf("\nworkflow, every load in a fresh process: a cold load, a second load (a restarted "
           "job),\n2 processes loading it at once from a cold cache (2 ranks); GB/s of 2 "
           "procs: together;\n%d round%s after an untimed first load, the engines' order rotated "
           "each round, then the best\nfixed engine's twin\n%-14s %5s %8s %8s %8s %8s %8s %8s %9s\n",
           rounds,
           rounds > 1 ? "s" : "", "engine", "round", "cold s", "GB/s", "2nd s", "GB/s",
           "2proc s", "GB/s", "total s");
    /* An untimed first load of the new file, kept out of AUTO's profile. Whichever engine
     * went first would pay what a first read costs apart from any engine: on the development
     * VM a parallel read of a 498 MB file just written took 0.35-0.67 s against 0.26-0.44 for
     * the next ones, two processes at once 1.5-2.0 s against 0.27-0.57 (the host's cache
     * below the VM; memory the VM gave back); as a sample, posix's 0.67 s sent auto's first
     * cold load to mmap (0.57 s). */
    cli_evict(path);
    if (fresh_loads(m, path, FT_ENGINE_POSIX, 1, false) < 0)
        return -1;
    /* rows: the engines, then the twin */
    static double t[DEMO_MAX_ENGINES + 1][DEMO_MAX_ROUNDS][4];
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            int k = (i + r) % n;
            if (workflow_one(m, path, e[k], t[k][r]) < 0)
                return -1;
            workflow_row(m, ft_engine_name(e[k]), r, t[k][r], json);
        }
    double med[DEMO_MAX_ENGINES + 1][4], lo[DEMO_MAX_ENGINES + 1], hi[DEMO_MAX_ENGINES + 1];
    int best = -1, autok = -1;
    for (int k = 0; k < n; k++) {
        med[k][3] = column_median(t[k], rounds, 3, &lo[k], &hi[k]);
        if (e[k] == FT_ENGINE_AUTO)
            autok = k;
        else if (best < 0 || med[k][3] < med[best][3])
            best = k;
    }
    char twin[64] = "";
    if (best >= 0 && autok >= 0) {
        snprintf(twin, sizeof twin, "%s (twin)", ft_engine_name(e[best]));
        for (int r = 0; r < rounds; r++) {
            if (workflow_one(m, path, e[best], t[n][r]) < 0)
                return -1;
            workflow_row(m, twin, r, t[n][r], json);
        }
    }
    printf("\nmedian of %d round%s (total: its range)\n%-14s %8s %8s %8s %8s %8s %8s %9s\n",
           rounds, rounds > 1 ? "s" : "", "engine", "cold s", "GB/s", "2nd s", "GB/s",
           "2proc s", "GB/s", "total s");
    for (int k = 0; k < n + (*twin != 0); k++)
        median_row(m, k < n ? ft_engine_name(e[k]) : twin, t[k], rounds, med[k], &lo[k],
                   &hi[k], json);
    if (!*twin)
        return 0;
    double a = med[autok][3], b = med[best][3], w = med[n][3];
    double low = b < w ? b : w, high = b < w ? w : b;
    printf("\nauto %.3f s against the best fixed engine, %s, %.3f s (its twin %.3f s): %s.\n",
           a, ft_engine_name(e[best]), b, w,
           a <= low ? "auto is the fastest line"
           : a <= high ? "auto is within that engine's own run-to-run spread"
                       : "a fixed engine was faster here");
    printf("%s it measures the engines on this machine as it\ngoes, the named engines' "
           "loads above included (the profile keeps what it learned;\n`fastensor tune` "
           "measures them all up front), reads a checkpoint that fits in the page\ncache "
           "through it so the next load, in any process, finds it there, and reads larger\n"
           "ones around it.\n",
           a <= high ? "auto is the line to pick:" : "What auto does:");
    return 0;
}

static void demo_usage(FILE *out)
{
    fprintf(out, "usage: fastensor demo [--model gpt2|gpt2-medium|tiny | --size BYTES] [--dir DIR] "
                 "[--engines LIST] [--rounds N] [--json]\n\n"
                 "Builds a synthetic float32 checkpoint with the model's layer shapes, saves it "
                 "durably\nwith checksums against plain write(), then runs a user's workflow "
                 "with each engine:\na cold load, a second load and 2 processes loading at once "
                 "(cold), each in a fresh\nprocess, every byte checked, in N rounds (3) with "
                 "the engines interleaved; prints\neach engine's medians and whether auto is "
                 "the line to pick; then verifies the\nchecksums. Files go to DIR (default .) "
                 "and are removed. --size builds a width-1024\ndecoder of about that size; "
                 "--engines: a comma list (default\nauto,posix,direct,uring,mmap, at most 8); "
                 "--rounds: 1 to 15; --json adds one JSON line\nper measurement.\n");
}

int cmd_demo(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, NULL, 'm'},
                                         {"dir", required_argument, NULL, 'd'},
                                         {"size", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"engines", required_argument, NULL, 'e'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *dir = ".", *name = "gpt2", *engines = "auto,posix,direct,uring,mmap";
    uint64_t size = 0;
    bool json = false;
    int c, rounds = 3;
    while ((c = getopt_long(argc, argv, "m:d:s:je:r:h", opts, NULL)) != -1) {
        if (c == 'm')
            name = optarg;
        else if (c == 'e')
            engines = optarg;
        else if (c == 'd')
            dir = optarg;
        else if (c == 'j')
            json = true;
        else if (c == 'r' && (rounds = atoi(optarg)) >= 1 && rounds <= DEMO_MAX_ROUNDS)
            continue;
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
    /* the workflow's loads run in fresh processes: this one keeps no threads across forks */
    ft_ctx_destroy(ctx);
    ctx = NULL;
    if (status == EXIT_OK && workflow(&m, path, engines, rounds, json) < 0)
        status = EXIT_ERR;
    if (status == EXIT_OK && (rc = ft_ctx_create(&ctx, NULL)) < 0) {
        cli_ft_error("demo", "context", rc);
        status = EXIT_ERR;
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
    if (ctx)
        ft_ctx_destroy(ctx);
    for (size_t i = 0; i < m.n; i++)
        free(m.t[i].data.ptr);
    free(m.t);
    free(m.shapes);
    free(m.names);
    return status;
}
