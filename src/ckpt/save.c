/*
 * Saving checkpoints: validate, lay out, then per shard a locked temporary file in the same
 * directory, the data gathered into aligned pieces written in parallel (checksummed as they
 * go), the header written last, fdatasync. Then one commit point (commit.c): the rename of
 * the single file, or of the index once every shard is durable under its generation's name.
 */
#include "ckpt.h"
#include "../base/syscall.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct save_shard {
    const ft_tensor *tensors; /* its tensors, consecutive in the caller's array */
    size_t count;
    uint64_t *begin;          /* data offset of each of its tensors */
    uint64_t data_size;
    uint64_t header_size;     /* 8 + padded JSON: where the data starts */
    char *path;               /* final name */
    char *tmp;                /* temporary name, while it exists */
    int lock_fd;              /* holds the temporary's flock until the save ends, or -1 */
    bool renamed;             /* path is ours, not yet listed by an installed index */
    uint64_t *csums;
    uint64_t ncsums;
    uint64_t *first_part;     /* per block: its first part checksum, or UINT64_MAX */
    uint64_t *parts;          /* part checksums (see ft__parts_layout) */
    uint64_t nparts;
} save_shard;

typedef struct save_job {
    ft_ctx *ctx;
    const ft_save_opts *opts;
    uint64_t block;           /* checksum block, 0 when not recording */
    save_shard *shards;
    unsigned nshards;
    const char *const *metadata;
    uint32_t gen;             /* the shards' generation (several shards) */
    bool fst;                 /* a .fst container (one file) */
    const char *dir;          /* the checkpoint's directory */
    const size_t *order;      /* a .fst save of coded streams: laid-out tensor i is the
                                 caller's order[i] */
    ft__first_err failed;     /* the first shard that failed */
} save_job;

/* One "key":"value" member of an object, after a comma unless @p first. */
static void member_str(ft__jw *w, bool first, const char *key, const char *value, size_t n)
{
    if (!first)
        ft__jw_raw(w, ",");
    ft__jw_str(w, key, strlen(key));
    ft__jw_raw(w, ":");
    ft__jw_str(w, value, n);
}

/* The header JSON for @p s (compact); checksums as given (zeros first, real ones later). */
static char *header_json(const save_job *job, const save_shard *s, size_t *len)
{
    ft__jw w = {0};
    bool first = true;
    ft__jw_raw(&w, "{");
    if ((job->metadata && job->metadata[0]) || job->block) {
        ft__jw_raw(&w, "\"__metadata__\":{");
        for (size_t i = 0; job->metadata && job->metadata[i]; i += 2, first = false)
            member_str(&w, first, job->metadata[i], job->metadata[i + 1],
                       strlen(job->metadata[i + 1]));
        if (job->block) {
            char blk[32];
            snprintf(blk, sizeof blk, "%llu", (unsigned long long)job->block);
            member_str(&w, first, FT__META_VERSION, "1", 1);
            member_str(&w, false, FT__META_CSUM_ALGO, FT__CSUM_ALGO, strlen(FT__CSUM_ALGO));
            member_str(&w, false, FT__META_CSUM_BLOCK, blk, strlen(blk));
            char *hex = malloc(FT__MAX(s->ncsums, s->nparts) * 16 + 1);
            if (!hex)
                w.failed = true;
            if (hex) {
                ft__csum_encode(s->csums, s->ncsums, hex);
                member_str(&w, false, FT__META_CSUMS, hex, s->ncsums * 16);
                ft__csum_encode(s->parts, s->nparts, hex);
                if (s->nparts)
                    member_str(&w, false, FT__META_PARTS, hex, s->nparts * 16);
                free(hex);
            }
        }
        ft__jw_raw(&w, "}");
        first = false;
    }
    for (size_t i = 0; i < s->count; i++, first = false) {
        const ft_tensor *t = &s->tensors[i];
        if (!first)
            ft__jw_raw(&w, ",");
        ft__jw_str(&w, t->name, strlen(t->name));
        ft__jw_raw(&w, ":{\"dtype\":");
        ft__jw_str(&w, ft_dtype_name(t->dtype), strlen(ft_dtype_name(t->dtype)));
        ft__jw_raw(&w, ",\"shape\":[");
        for (unsigned d = 0; d < t->ndim; d++) {
            if (d)
                ft__jw_raw(&w, ",");
            ft__jw_int(&w, (int64_t)t->shape[d]);
        }
        ft__jw_raw(&w, "],\"data_offsets\":[");
        ft__jw_int(&w, (int64_t)s->begin[i]);
        ft__jw_raw(&w, ",");
        ft__jw_int(&w, (int64_t)(s->begin[i] + t->data.len));
        ft__jw_raw(&w, "]}");
    }
    ft__jw_raw(&w, "}");
    char *out = ft__jw_done(&w, len);
    if (!out)
        *len = 0;
    return out;
}

/* The first of @p s's tensors that ends after data byte @p at (its count when none). */
static size_t first_ending_after(const save_shard *s, uint64_t at)
{
    size_t lo = 0, hi = s->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->begin[mid] + s->tensors[mid].data.len <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Gather data bytes [at, at+len) of @p s from its tensors (host or device) into @p dst.
 * @return 0 or -errno. */
static int gather(const save_shard *s, uint64_t at, uint64_t len, uint8_t *dst)
{
    for (size_t i = first_ending_after(s, at); i < s->count && s->begin[i] < at + len; i++) {
        uint64_t tb = s->begin[i], te = tb + s->tensors[i].data.len;
        uint64_t from = FT__MAX(tb, at), to = FT__MIN(te, at + len);
        if (to <= from)
            continue;
        const uint8_t *src = (const uint8_t *)s->tensors[i].data.ptr + (from - tb);
        if (s->tensors[i].data.kind == FT_MEM_CUDA) {
            int rc = ft_cuda_copy(dst + (from - at), src, (size_t)(to - from));
            if (rc < 0)
                return rc;
        } else {
            memcpy(dst + (from - at), src, (size_t)(to - from));
        }
    }
    return 0;
}

/* The part checksums of block @p k (its bytes at @p data, data offset @p from), if shared. */
static void part_sums(save_shard *s, uint64_t k, uint64_t block, const uint8_t *data,
                      uint64_t from)
{
    uint64_t part = s->first_part[k], to = FT__MIN(from + block, s->data_size);
    if (part == UINT64_MAX)
        return;
    for (size_t i = first_ending_after(s, from); i < s->count && s->begin[i] < to; i++) {
        uint64_t tb = FT__MAX(s->begin[i], from);
        uint64_t te = FT__MIN(s->begin[i] + s->tensors[i].data.len, to);
        if (te > tb)
            s->parts[part++] = ft__csum(data + (tb - from), (size_t)(te - tb));
    }
}

typedef struct piece_job {
    save_job *job;
    save_shard *s;
    ft_file *f;
    uint64_t piece;
    ft__bufpool *staging;
} piece_job;

static int64_t write_piece(void *arg, unsigned i)
{
    piece_job *pj = arg;
    save_shard *s = pj->s;
    uint64_t at = (uint64_t)i * pj->piece, len = FT__MIN(pj->piece, s->data_size - at);
    uint8_t *buf = ft__bufpool_get(pj->staging);
    if (!buf)
        return ft__err(-ENOMEM, "staging buffer");
    int grc = gather(s, at, len, buf);
    if (grc < 0) {
        ft__bufpool_put(pj->staging, buf);
        return grc;
    }
    uint64_t block = pj->job->block;
    for (uint64_t b = 0; block && b < len; b += block) {
        s->csums[(at + b) / block] = ft__csum(buf + b, (size_t)FT__MIN(block, len - b));
        part_sums(s, (at + b) / block, block, buf + b, at + b);
    }
    ft_buf fb = ft_host_buf(buf, (size_t)len);
    ft_io_opts o = ft__save_io(pj->job->opts);
    int64_t r = ft__transfer(pj->f, &fb, s->header_size + at, &o, true);
    ft__bufpool_put(pj->staging, buf);
    return r;
}

static void *make_stage(ft_ctx *ctx)
{
    ft__bufpool *p;
    return ft__bufpool_create_pinned(&p, (size_t)FT__CKPT_PIECE, ctx->cfg.threads + 1) < 0
               ? NULL
               : p;
}

static void destroy_stage(void *p)
{
    ft__bufpool_destroy(p);
}

/* Staging buffers of @p piece bytes (pinned where the process has initialised CUDA: device
 * tensors are copied into them at DMA speed): the context's kept pool for the usual piece
 * size (made on first use), else a pool of this save's own, returned in *own for
 * destruction (other sizes, and a kept pool left unpinned from before CUDA was in use). */
static ft__bufpool *save_staging(ft_ctx *ctx, uint64_t piece, ft__bufpool **own)
{
    static const char key; /* the context's kept pool, made on first use */
    *own = NULL;
    ft__bufpool *p = piece == FT__CKPT_PIECE ? ft__ctx_ext(ctx, &key, make_stage, destroy_stage)
                                             : NULL;
    if (!p || (!ft__bufpool_pinned(p) && ft__cuda_in_use())) {
        int rc = ft__bufpool_create_pinned(own, (size_t)piece, ctx->cfg.threads + 1);
        return rc < 0 ? NULL : *own;
    }
    return p;
}

/* Write shard @p s's data and header into its temporary file @p f (a safetensors file). */
static int write_data(save_job *job, save_shard *s, ft_file *f)
{
    size_t jlen;
    char *json = header_json(job, s, &jlen);
    if (!json)
        return ft__err(-ENOMEM, "%s: header", s->path);
    s->header_size = (8 + jlen + FT__ST_ALIGN - 1) / FT__ST_ALIGN * FT__ST_ALIGN;
    free(json);
    if (s->header_size - 8 > FT__ST_HEADER_MAX)
        return ft__err(-EINVAL, "%s: header of %llu bytes exceeds safetensors' 100 MB limit",
                       s->path, (unsigned long long)s->header_size);
    int rc;
    if ((rc = ft_file_allocate(f, 0, s->header_size + s->data_size)) == -EOPNOTSUPP)
        rc = 0; /* reserving is an optimisation (and an early ENOSPC), not a need */
    uint64_t piece = job->block ? FT__MAX((uint64_t)FT__CKPT_PIECE, job->block)
                                : (uint64_t)FT__CKPT_PIECE;
    unsigned npieces = (unsigned)((s->data_size + piece - 1) / piece);
    ft__bufpool *staging = NULL, *own = NULL;
    int64_t *results = calloc(npieces ? npieces : 1, sizeof *results);
    if (rc == 0 && (!results || !(staging = save_staging(job->ctx, piece, &own))))
        rc = ft__err(-ENOMEM, "%s: staging", s->path);
    if (rc == 0) {
        piece_job pj = {.job = job, .s = s, .f = f, .piece = piece, .staging = staging};
        rc = ft__pool_run(job->ctx->pool, npieces, write_piece, &pj, results);
        for (unsigned i = 0; rc == 0 && i < npieces; i++)
            if (results[i] < 0)
                rc = (int)results[i];
    }
    ft__bufpool_destroy(own);
    free(results);
    if (rc == 0) { /* the header last, with the real checksums */
        char *hdr = header_json(job, s, &jlen);
        uint8_t *buf = hdr ? calloc(1, (size_t)s->header_size) : NULL;
        if (!buf) {
            rc = ft__err(-ENOMEM, "%s: header", s->path);
        } else {
            uint64_t n = s->header_size - 8;
            for (int k = 0; k < 8; k++)
                buf[k] = (uint8_t)(n >> (8 * k));
            memcpy(buf + 8, hdr, jlen);
            memset(buf + 8 + jlen, ' ', (size_t)(n - jlen));
            ft_buf hb = ft_host_buf(buf, (size_t)s->header_size);
            ft_io_opts o = ft__save_io(job->opts);
            int64_t w = ft__transfer(f, &hb, 0, &o, true);
            rc = w < 0 ? (int)w : 0;
        }
        free(buf);
        free(hdr);
    }
    return rc;
}

/* Write shard @p s into its locked temporary file, durably: a safetensors file, or a .fst
 * container (fst_save.c). */
static int write_shard(save_job *job, save_shard *s)
{
    ft_file *f;
    int rc = s->lock_fd = ft__tmp_lock(s->tmp);
    if (rc < 0)
        return rc;
    if ((rc = ft_file_open(job->ctx, &f, s->tmp, FT_OPEN_READ | FT_OPEN_WRITE, 0)) < 0)
        return rc;
    rc = job->fst ? ft__fst_write(job->ctx, f, s->path, job->dir, s->tensors, s->count,
                                   job->opts, job->order)
                  : write_data(job, s, f);
    if (rc == 0 && !(job->opts && (job->opts->flags & FT_SAVE_NO_SYNC)))
        rc = ft_file_sync(f);
    int crc = ft_file_close(f);
    return rc ? rc : crc;
}

static int64_t write_shard_task(void *arg, unsigned i)
{
    save_job *job = arg;
    int rc = write_shard(job, &job->shards[i]);
    if (rc < 0)
        ft__first_err_note(&job->failed, i, rc);
    return rc;
}

static char *strdupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

/* Split into shards (each at most shard_size unless one tensor is larger) and name them:
 * the name itself for one, the names of a fresh generation for several. */
static int plan_shards(save_job *job, ft__ckpt_name *nm, const ft_tensor *t, size_t n,
                       uint64_t shard_size)
{
    job->shards = calloc(n + 1, sizeof *job->shards);
    if (!job->shards)
        return ft__err(-ENOMEM, "shards");
    for (size_t k = 0; k <= n; k++)
        job->shards[k].lock_fd = -1;
    save_shard *cur = &job->shards[0];
    cur->tensors = t;
    job->nshards = 1;
    for (size_t i = 0; i < n; i++) {
        if (shard_size && cur->count && cur->data_size + t[i].data.len > shard_size) {
            cur = &job->shards[job->nshards++];
            cur->tensors = &t[i];
        }
        cur->count++;
        cur->data_size += t[i].data.len;
    }
    job->gen = job->nshards > 1 ? ft__generation(nm, job->nshards) : 0;
    for (unsigned k = 0; k < job->nshards; k++) {
        save_shard *s = &job->shards[k];
        s->begin = calloc(s->count + 1, sizeof *s->begin);
        for (size_t i = 1; s->begin && i < s->count; i++)
            s->begin[i] = s->begin[i - 1] + s->tensors[i - 1].data.len;
        s->ncsums = job->block ? (s->data_size + job->block - 1) / job->block : 0;
        s->csums = calloc(s->ncsums + 1, sizeof *s->csums);
        s->first_part = calloc(s->ncsums + 1, sizeof *s->first_part);
        ft__span *spans = calloc(s->count + 1, sizeof *spans);
        if (!spans || !s->begin)
            return ft__err(-ENOMEM, "shards");
        for (size_t i = 0; i < s->count; i++)
            spans[i] = (ft__span){s->begin[i], s->begin[i] + s->tensors[i].data.len};
        if (job->block && s->first_part)
            s->nparts = ft__parts_layout(spans, s->count, job->block, s->ncsums, s->first_part);
        free(spans);
        s->parts = calloc(s->nparts + 1, sizeof *s->parts);
        if (!s->first_part || !s->parts)
            return ft__err(-ENOMEM, "shards");
        s->path = job->nshards == 1 ? strdupf("%s", nm->path)
                                    : ft__shard_name(nm, k, job->nshards, job->gen);
        s->tmp = s->path ? ft__tmp_name(s->path) : NULL;
        if (!s->begin || !s->csums || !s->tmp)
            return ft__err(-ENOMEM, "shards");
    }
    return 0;
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Write the index under a locked temporary name, durably, and rename it into place: the
 * commit point of a sharded save. */
static int write_index(save_job *job, const ft__ckpt_name *nm)
{
    uint64_t total = 0;
    for (unsigned k = 0; k < job->nshards; k++)
        total += job->shards[k].data_size;
    char gen[16];
    snprintf(gen, sizeof gen, "%08x", job->gen);
    ft__jw w = {0};
    ft__jw_raw(&w, "{\n  \"metadata\": {\n    \"total_size\": ");
    ft__jw_int(&w, (int64_t)total);
    ft__jw_raw(&w, ",\n    \"fastensor.generation\": ");
    ft__jw_str(&w, gen, strlen(gen));
    ft__jw_raw(&w, "\n  },\n  \"weight_map\": {");
    bool first = true;
    for (unsigned k = 0; k < job->nshards; k++) {
        const save_shard *s = &job->shards[k];
        const char *file = base_of(s->path);
        for (size_t i = 0; i < s->count; i++, first = false) {
            ft__jw_raw(&w, first ? "\n    " : ",\n    ");
            ft__jw_str(&w, s->tensors[i].name, strlen(s->tensors[i].name));
            ft__jw_raw(&w, ": ");
            ft__jw_str(&w, file, strlen(file));
        }
    }
    ft__jw_raw(&w, "\n  }\n}\n");
    size_t text_len = 0;
    char *text = ft__jw_done(&w, &text_len);
    char *tmp = ft__tmp_name(nm->index);
    int rc = text && tmp ? 0 : ft__err(-ENOMEM, "index");
    int lock = rc == 0 ? ft__tmp_lock(tmp) : -1;
    ft_file *f = NULL;
    if (rc == 0 && lock < 0)
        rc = lock;
    if (rc == 0 && (rc = ft_file_open(job->ctx, &f, tmp, FT_OPEN_WRITE, 0)) == 0) {
        ft_buf b = ft_host_buf(text, text_len);
        ft_io_opts o = ft__save_io(job->opts);
        int64_t wrote = ft_write(f, &b, 0, &o);
        rc = wrote < 0 ? (int)wrote : 0;
        if (rc == 0 && !(job->opts && (job->opts->flags & FT_SAVE_NO_SYNC)))
            rc = ft_file_sync(f);
        int crc = ft_file_close(f);
        rc = rc ? rc : crc;
    }
    if (rc == 0 && ft__sys.rename(tmp, nm->index) != 0)
        rc = ft__err(-errno, "cannot rename %s to %s", tmp, nm->index);
    if (rc < 0 && lock >= 0)
        ft__sys.unlink(tmp);
    if (lock >= 0)
        ft__sys.close(lock);
    free(text);
    free(tmp);
    return rc;
}

static int write_shards(save_job *job)
{
    int64_t *results = calloc(job->nshards, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "shards");
    ft__first_err_init(&job->failed);
    int rc = ft__pool_run(job->ctx->pool, job->nshards, write_shard_task, job, results);
    int first = ft__first_err_take(&job->failed);
    free(results);
    return rc < 0 ? rc : first;
}

/* Everything durable under temporary names: install the new checkpoint by one rename.
 * @return 0 once installed, else -errno (nothing installed). */
static int commit(save_job *job, ft__ckpt_name *nm, bool sync)
{
    if (job->nshards == 1) {
        save_shard *s = &job->shards[0];
        ft__name_hold(nm, s->path);
        if (ft__sys.rename(s->tmp, s->path) != 0)
            return ft__err(-errno, "cannot rename %s to %s", s->tmp, s->path);
        free(s->tmp);
        s->tmp = NULL;
        return 0;
    }
    for (unsigned k = 0; k < job->nshards; k++) {
        save_shard *s = &job->shards[k];
        if (ft__sys.rename(s->tmp, s->path) != 0)
            return ft__err(-errno, "cannot rename %s to %s", s->tmp, s->path);
        free(s->tmp);
        s->tmp = NULL;
        s->renamed = true;
    }
    int rc = sync ? ft__fsync_dir(nm->dir) : 0; /* the shards' names before the index's */
    if (rc == 0)
        rc = write_index(job, nm);
    if (rc == 0)
        for (unsigned k = 0; k < job->nshards; k++)
            job->shards[k].renamed = false;
    return rc;
}

static int after_commit(save_job *job, ft__ckpt_name *nm, bool sync)
{
    const char **keep = calloc(job->nshards, sizeof *keep);
    if (!keep)
        return ft__err(-ENOMEM, "shards");
    for (unsigned k = 0; k < job->nshards; k++)
        keep[k] = base_of(job->shards[k].path);
    int rc = ft__after_commit(job->ctx, nm, job->nshards > 1, keep, job->nshards, sync);
    free(keep);
    return rc;
}

static void free_job(save_job *job)
{
    for (unsigned k = 0; job->shards && k < job->nshards; k++) {
        save_shard *s = &job->shards[k];
        if (s->tmp && s->lock_fd >= 0)
            ft__sys.unlink(s->tmp); /* a failed save leaves no file of its own behind */
        if (s->renamed)
            ft__sys.unlink(s->path);
        if (s->lock_fd >= 0)
            ft__sys.close(s->lock_fd);
        free(s->tmp);
        free(s->path);
        free(s->begin);
        free(s->csums);
        free(s->first_part);
        free(s->parts);
    }
    free(job->shards);
}

/* ft_ckpt_save of checked tensors in layout order. */
static int save_laid_out(ft_ctx *ctx, const char *path, const ft_tensor *tensors, size_t count,
                         const ft_save_opts *opts, uint64_t block, const size_t *order)
{
    int rc;
    bool sync = !(opts && (opts->flags & FT_SAVE_NO_SYNC));
    ft__ckpt_name nm;
    if ((rc = ft__name_init(&nm, path)) < 0)
        return rc;
    if ((rc = ft__name_installed(ctx, &nm)) < 0) {
        ft__name_free(&nm);
        return rc;
    }
    save_job job = {.ctx = ctx, .opts = opts, .block = block, .fst = ft__fst_path(path),
                    .dir = nm.dir, .metadata = opts ? opts->metadata : NULL,
                    .order = order};
    rc = plan_shards(&job, &nm, tensors, count, opts ? opts->shard_size : 0);
    if (rc == 0)
        rc = write_shards(&job);
    int lock = -1;
    if (rc == 0)
        rc = ft__commit_lock(nm.dir, false, &lock);
    if (rc == 0) /* what is installed now: a concurrent save may have committed meanwhile */
        rc = ft__name_installed(ctx, &nm);
    if (rc == 0)
        rc = commit(&job, &nm, sync);
    if (rc == 0 && after_commit(&job, &nm, sync) < 0)
        rc = FT_SAVE_WARNING; /* installed; the detail says which step after it failed */
    /* The shards' locks go before the directory's: the next commit removes them once no
     * installed index lists them. */
    FT__KEEPING_DETAIL(free_job(&job); ft__commit_unlock(lock);
                       ft__name_release(&nm, ctx->pool); ft__name_free(&nm));
    return rc;
}

int ft_ckpt_save(ft_ctx *ctx, const char *path, const ft_tensor *tensors, size_t count,
                 const ft_save_opts *opts)
{
    if (!ctx || !path || !*path || (count && !tensors))
        return ft__err(-EINVAL, "ft_ckpt_save: missing context, path or tensors");
    uint64_t block = FT__CSUM_BLOCK;
    if (opts && opts->checksum_block)
        block = opts->checksum_block;
    if (block < 4096 || (block & (block - 1)) || block > (1u << 30))
        return ft__err(-EINVAL, "%s: checksum block %llu is not a power of 2 in 4K..1G", path,
                       (unsigned long long)block);
    if (opts && (opts->flags & FT_SAVE_NO_CHECKSUM))
        block = 0;
    if (opts && (opts->flags & ~(unsigned)(FT_SAVE_NO_CHECKSUM | FT_SAVE_NO_SYNC)))
        return ft__err(-EINVAL, "%s: unknown save flags 0x%x", path, opts->flags);
    if (opts && ((unsigned)opts->engine >= FT_ENGINE_COUNT ||
                 (unsigned)opts->cache >= FT_CACHE_COUNT ||
                 (unsigned)opts->compression >= FT_COMPRESS_COUNT))
        return ft__err(-EINVAL, "%s: bad save options (engine %d, cache %d, compression %d)",
                       path, (int)opts->engine, (int)opts->cache, (int)opts->compression);
    bool fst = ft__fst_path(path);
    if (fst && opts && opts->shard_size)
        return ft__err(-EINVAL, "%s: a .fst container is one file (shard_size is for "
                                "safetensors checkpoints)", path);
    if (!fst && opts && opts->compression != FT_COMPRESS_AUTO)
        return ft__err(-EINVAL, "%s: compression is for .fst containers (a safetensors file "
                                "stores its tensors as they are)", path);
    if (fst)
        block = 0; /* the codec's blocks carry checksums */
    if (!fst && opts && opts->coded)
        return ft__err(-EINVAL, "%s: coded streams are for .fst containers", path);
    bool coded = fst && opts && opts->coded;
    int rc = ft__tensors_check(tensors, count, opts ? opts->metadata : NULL, fst, coded);
    if (rc < 0)
        return rc;
    /* laid out, each remembering its place in the caller's array (its coded stream's) */
    ft__placed *placed = malloc((count ? count : 1) * sizeof *placed);
    ft_tensor *laid = malloc((count ? count : 1) * sizeof *laid);
    size_t *order = malloc((count ? count : 1) * sizeof *order);
    if (!placed || !laid || !order)
        rc = ft__err(-ENOMEM, "%s: %zu tensors", path, count);
    for (size_t i = 0; rc == 0 && i < count; i++)
        placed[i] = (ft__placed){tensors[i], i};
    if (rc == 0)
        qsort(placed, count, sizeof *placed, ft__tensor_layout_cmp);
    for (size_t i = 0; rc == 0 && i < count; i++) {
        laid[i] = placed[i].t;
        order[i] = placed[i].index;
    }
    if (rc == 0)
        rc = save_laid_out(ctx, path, laid, count, opts, block, coded ? order : NULL);
    free(placed);
    free(laid);
    free(order);
    return rc;
}
