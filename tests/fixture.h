/* Checkpoint fixtures shared by the commit, kill and sweep tests: versions of one state dict
 * whose every byte says which version it is, and directory listings to compare. */
#ifndef FT_TEST_FIXTURE_H
#define FT_TEST_FIXTURE_H

#include "testlib.h"

#include <dirent.h>
#include <errno.h>

#define FX_TENSORS 12
#define FX_VERSIONS 3

typedef struct fx_state {
    char names[FX_TENSORS][32];
    uint64_t shapes[FX_TENSORS][2];
    ft_tensor t[FX_VERSIONS][FX_TENSORS];
} fx_state;

/* FX_VERSIONS versions of FX_TENSORS tensors (sizes 0 .. ~@p max_bytes, odd ones small),
 * random bytes seeded by version and tensor. */
static inline fx_state *fx_make(size_t max_bytes)
{
    fx_state *s = calloc(1, sizeof *s);
    for (size_t i = 0; i < FX_TENSORS; i++) {
        snprintf(s->names[i], sizeof s->names[i], "model.layer%zu.w", i);
        s->shapes[i][0] = i % 2 ? 1 + i : (max_bytes / 4) * (i + 1) / FX_TENSORS;
        s->shapes[i][1] = i == 4 ? 0 : 1;
        size_t bytes = (size_t)(s->shapes[i][0] * s->shapes[i][1] * 4);
        for (size_t v = 0; v < FX_VERSIONS; v++) {
            void *p = malloc(bytes + 1);
            t_fill_random(p, bytes, 1000 * (v + 1) + i);
            s->t[v][i] = (ft_tensor){s->names[i], FT_DTYPE_F32, 2, s->shapes[i],
                                     ft_host_buf(p, bytes)};
        }
    }
    return s;
}

static inline void fx_free(fx_state *s)
{
    for (size_t v = 0; s && v < FX_VERSIONS; v++)
        for (size_t i = 0; i < FX_TENSORS; i++)
            free(s->t[v][i].data.ptr);
    free(s);
}

/* Save version @p v at @p path (sharded when @p shard_size). @return ft_ckpt_save's. */
static inline int fx_save(ft_ctx *ctx, const fx_state *s, const char *path, int v,
                          uint64_t shard_size)
{
    ft_save_opts so = {.shard_size = shard_size};
    return ft_ckpt_save(ctx, path, s->t[v], FX_TENSORS, &so);
}

/* Which version @p path holds, every tensor read and checked: 0..FX_VERSIONS-1; -100 when
 * its tensors come from different versions (a mixed checkpoint) or match none; else the
 * open or load's -errno. */
static inline int fx_which(ft_ctx *ctx, const fx_state *s, const char *path)
{
    ft_ckpt *c;
    int rc = ft_ckpt_open(ctx, &c, path);
    if (rc < 0)
        return rc;
    if (ft_ckpt_count(c) != FX_TENSORS) {
        ft_ckpt_close(c);
        return -100;
    }
    ft_load_opts lo = {.flags = ft_ckpt_has_checksums(c) ? FT_LOAD_VERIFY : 0};
    if ((rc = ft_ckpt_load_all(c, &lo)) < 0) {
        ft_ckpt_close(c);
        return rc;
    }
    int version = -1;
    for (size_t i = 0; i < FX_TENSORS && version != -100; i++) {
        int64_t k = ft_ckpt_find(c, s->names[i]);
        ft_tensor_info info;
        if (k < 0 || ft_ckpt_info(c, (size_t)k, &info) < 0) {
            version = -100;
            break;
        }
        int match = -1;
        for (int v = 0; v < FX_VERSIONS && match < 0; v++)
            if (info.nbytes == s->t[v][i].data.len &&
                (!info.nbytes ||
                 !memcmp(ft_ckpt_data(c, (size_t)k), s->t[v][i].data.ptr, info.nbytes)))
                match = v;
        /* empty tensors belong to every version */
        if (info.nbytes == 0)
            continue;
        if (match < 0 || (version >= 0 && match != version))
            version = -100;
        else
            version = match;
    }
    ft_ckpt_close(c);
    return version;
}

static inline int fx_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* @p n names (freed here) sorted, one a line, in @p len bytes (malloc'ed). */
static inline char *fx_join(char **names, size_t n, size_t len)
{
    qsort(names, n, sizeof *names, fx_cmp);
    char *out = malloc(len);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(out, names[i]);
        strcat(out, "\n");
        free(names[i]);
    }
    return out;
}

/* The names in @p dir, sorted, one a line (malloc'ed). */
static inline char *fx_listing(const char *dir)
{
    char *names[4096];
    size_t n = 0, len = 1;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 4096)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            names[n++] = strdup(e->d_name);
            len += strlen(e->d_name) + 1;
        }
    if (d)
        closedir(d);
    return fx_join(names, n, len);
}

/* The listing a directory holding only the checkpoint at @p path (a file or an index)
 * would have (malloc'ed), or NULL when it does not open. */
static inline char *fx_expected(ft_ctx *ctx, const char *path)
{
    ft_ckpt *c;
    if (ft_ckpt_open(ctx, &c, path) < 0)
        return NULL;
    char *names[1024];
    size_t n = 0, len = 1;
    const char *slash = strrchr(path, '/');
    names[n++] = strdup(slash ? slash + 1 : path);
    for (unsigned k = 0; k < ft_ckpt_shard_count(c) && n < 1024; k++) {
        const char *p = ft_ckpt_shard_path(c, k), *b = strrchr(p, '/');
        if (strcmp(b ? b + 1 : p, names[0]) != 0)
            names[n++] = strdup(b ? b + 1 : p);
    }
    ft_ckpt_close(c);
    for (size_t i = 0; i < n; i++)
        len += strlen(names[i]) + 1;
    return fx_join(names, n, len);
}

/* Whether @p dir holds exactly the checkpoint at @p path and nothing else. */
static inline bool fx_only(ft_ctx *ctx, const char *dir, const char *path)
{
    char *have = fx_listing(dir), *want = fx_expected(ctx, path);
    bool same = want && strcmp(have, want) == 0;
    if (!same)
        fprintf(stderr, "  directory %s holds:\n%s  expected:\n%s", dir, have,
                want ? want : "(checkpoint does not open)\n");
    free(have);
    free(want);
    return same;
}

#endif
