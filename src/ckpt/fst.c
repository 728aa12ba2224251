/*
 * .fst containers, read (docs/FORMAT.md): "FASTENSZ", u64 header offset H, u64 header length
 * L (little-endian), zeros to 4096; the tensors' codec streams in [4096, H); the header JSON
 * at H, after the data (a save writes each stream as soon as it is coded). The header is a
 * safetensors header whose entries also say where each tensor's stream is ("stored", within
 * the streams' section) and whether it codes its planes ("compressed"); "data_offsets" are
 * where a safetensors file would hold the tensor: the decoded layout, which the load calls
 * use as the data section of the checkpoint. Every read goes through the file API (an engine
 * chosen by AUTO unless the caller names one) and the codec (src/codec/).
 */
#include "ckpt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Streams are read in groups of about this many bytes, the next group read while one decodes
 * (smaller for the GPU: its decode of a group is quick, the copy to it is what overlaps). */
#define GROUP (256u << 20)
#define GROUP_GPU (64u << 20)

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

static int bad(const ft__shard *s, const char *what)
{
    return ft__err(-EBADMSG, "%s: invalid .fst container: %s", s->path, what);
}

/* One tensor's entry beyond what a safetensors entry says: its stream and whether coded. */
static int parse_stream(ft__shard *s, const char *name, const ft__json *v, ft__st_tensor *t)
{
    const ft__json *st = ft__json_get(v, "stored"), *coded = ft__json_get(v, "compressed");
    int64_t b, e;
    if (ft__json_len(st) != 2 || !ft__json_int(ft__json_item(st, 0), &b) ||
        !ft__json_int(ft__json_item(st, 1), &e) || b < 0 || e < b)
        return ft__err(-EBADMSG, "%s: tensor '%s': \"stored\" must be two offsets [begin, end)",
                       s->path, name);
    if ((uint64_t)e > s->stored_size)
        return ft__err(-EBADMSG, "%s: tensor '%s': its stream [%lld, %lld) is outside the data "
                                 "section (%llu bytes: truncated?)", s->path, name,
                       (long long)b, (long long)e, (unsigned long long)s->stored_size);
    int kind = ft__json_type(coded);
    if (coded && kind != FT__JSON_TRUE && kind != FT__JSON_FALSE)
        return ft__err(-EBADMSG, "%s: tensor '%s': \"compressed\" is not true or false",
                       s->path, name);
    t->stored_begin = (uint64_t)b;
    t->stored_end = (uint64_t)e;
    t->coded = !coded || kind == FT__JSON_TRUE;
    return 0;
}

static int parse_root(ft__shard *s, const ft__json *root)
{
    ft__st_header *h = &s->header;
    if (ft__json_type(root) != FT__JSON_OBJECT)
        return bad(s, "the header is not a JSON object");
    const ft__json *info = ft__json_get(root, "fastensor.container");
    int64_t version = 0;
    if (!ft__json_int(ft__json_get(info, "version"), &version) || version != FT__FST_VERSION)
        return ft__err(-EBADMSG, "%s: container version %lld (this fastensor reads %d)",
                       s->path, (long long)version, FT__FST_VERSION);
    const ft__json *meta = ft__json_get(root, "__metadata__");
    int rc = meta && ft__json_type(meta) != FT__JSON_NULL ? ft__st_meta_parse(meta, s->path, h)
                                                          : 0;
    if (rc < 0)
        return rc;
    h->tensors = calloc(ft__json_len(root) + 1, sizeof *h->tensors);
    if (!h->tensors)
        return ft__err(-ENOMEM, "%s: header", s->path);
    const char *key;
    const ft__json *v;
    for (size_t i = 0; (key = ft__json_member(root, i, &v)); i++) {
        if (!strcmp(key, "__metadata__") || !strcmp(key, "fastensor.container"))
            continue;
        ft__st_tensor *t = &h->tensors[h->ntensors];
        size_t keys = ft__json_get(v, "compressed") ? 5 : 4; /* "compressed" may be left out */
        if ((rc = ft__st_entry(key, v, keys, s->path, t)) < 0 ||
            (rc = parse_stream(s, key, v, t)) < 0)
            return rc;
        if (!(t->name = strdup(key)))
            return ft__err(-ENOMEM, "%s: header", s->path);
        h->ntensors++;
    }
    return ft__st_layout(h, ".fst", s->path, &s->data_size);
}

int ft__fst_open(ft__shard *s, int64_t size)
{
    uint8_t head[24];
    ft_buf b = ft_host_buf(head, sizeof head);
    ft_io_opts o = ft__meta_io();
    if (size < (int64_t)sizeof head)
        return ft__err(-EBADMSG, "%s: a .fst container truncated to %lld bytes (its head "
                                 "needs 24)", s->path, (long long)size);
    int64_t r = ft_read(s->file, &b, 0, &o);
    if (r != (int64_t)sizeof head)
        return r < 0 ? (int)r : ft__err(-EIO, "%s: short read of the head", s->path);
    uint64_t hoff = le64(head + 8), hlen = le64(head + 16);
    if (hlen > FT__ST_HEADER_MAX)
        return ft__err(-EBADMSG, "%s: a .fst container whose header length %llu is over "
                                 "the limit (%llu)",
                       s->path, (unsigned long long)hlen, FT__ST_HEADER_MAX);
    if (hoff < FT__FST_DATA || hoff > (uint64_t)size || hlen != (uint64_t)size - hoff)
        return ft__err(-EBADMSG, "%s: a .fst container whose header should be at [%llu, %llu) "
                                 "but the file has %lld bytes (truncated?)", s->path,
                       (unsigned long long)hoff, (unsigned long long)(hoff + hlen),
                       (long long)size);
    char *json = malloc(hlen ? (size_t)hlen : 1);
    if (!json)
        return ft__err(-ENOMEM, "%s: header", s->path);
    b = ft_host_buf(json, (size_t)hlen);
    r = ft_read(s->file, &b, hoff, &o);
    int rc = r == (int64_t)hlen ? 0 : r < 0 ? (int)r : ft__err(-EIO, "%s: short header read",
                                                                s->path);
    char err[200] = "";
    ft__json_doc *doc = NULL;
    if (rc == 0 && !ft__utf8_valid(json, (size_t)hlen))
        rc = bad(s, "the header is not JSON (not UTF-8)");
    if (rc == 0 && (rc = ft__json_parse(json, (size_t)hlen, &doc, err, sizeof err)) < 0)
        rc = rc == -ENOMEM ? ft__err(rc, "%s: header", s->path)
                           : ft__err(-EBADMSG, "%s: the .fst header is not JSON (%s)", s->path,
                                     err);
    free(json);
    s->fst = true;
    s->data_start = FT__FST_DATA;
    s->stored_size = hoff - FT__FST_DATA;
    if (rc == 0)
        rc = parse_root(s, ft__json_root(doc));
    ft__json_free(doc);
    return rc;
}

/* ---- decoding reads ---- */

typedef struct group {
    size_t first, count;  /* tensors [first, first + count) of the shard's header */
    uint64_t lo, hi;      /* their streams' span in the data section */
} group;

typedef struct reading {
    ft__shard *s;
    const ft_io_opts *io;
    uint8_t *buf;
    const group *g;
    int rc;
    char detail[FT__DETAIL_MAX];
} reading;

static void *read_group(void *arg)
{
    reading *rd = arg;
    ft_buf b = ft_host_buf(rd->buf, (size_t)(rd->g->hi - rd->g->lo));
    int64_t r = b.len ? ft__shard_read(rd->s, &b, rd->g->lo, rd->io) : 0;
    rd->rc = r < 0 ? (int)r : 0;
    if (r < 0)
        ft__detail_save(rd->detail);
    return NULL;
}

/* "PATH: tensor 'NAME': " before the thread's detail (a codec message), same error. */
static int name_failure(const ft__shard *s, const ft__st_tensor *t, int rc, const char *why)
{
    char was[FT__DETAIL_MAX];
    snprintf(was, sizeof was, "%s", why ? why : ft_last_error());
    return ft__err(rc, "%s: tensor '%s': %s", s->path, t->name, was);
}

typedef struct decode_job {
    ft_ctx *ctx;
    ft__shard *s;
    const group *g;
    const uint8_t *buf;   /* the group's streams, from g->lo */
    uint8_t **target;     /* per tensor of the group: where it decodes to, NULL to skip */
    ft__first_err failed;
} decode_job;

static int64_t decode_one(void *arg, unsigned i)
{
    decode_job *j = arg;
    const ft__st_tensor *t = &j->s->header.tensors[j->g->first + i];
    if (!j->target[i])
        return 0;
    int64_t r = ft_codec_decode(j->ctx, j->buf + (t->stored_begin - j->g->lo),
                                (size_t)(t->stored_end - t->stored_begin), j->target[i],
                                (size_t)(t->end - t->begin));
    if (r >= 0 && (uint64_t)r != t->end - t->begin)
        r = ft__err(-EBADMSG, "its stream decodes to %lld bytes, the entry says %llu",
                    (long long)r, (unsigned long long)(t->end - t->begin));
    if (r < 0) {
        r = name_failure(j->s, t, (int)r, NULL);
        ft__first_err_note(&j->failed, i, (int)r);
    }
    return r;
}

/* Decode a group's tensors on the host, several at once (a tensor of a few blocks does not
 * keep every thread busy alone). */
static int decode_host(ft_ctx *ctx, ft__shard *s, const group *g, const uint8_t *buf,
                       uint8_t **target)
{
    decode_job j = {.ctx = ctx, .s = s, .g = g, .buf = buf, .target = target};
    int64_t *results = calloc(g->count + 1, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "%s: decode", s->path);
    ft__first_err_init(&j.failed);
    int rc = ft__pool_run(ctx->pool, (unsigned)g->count, decode_one, &j, results);
    int first = ft__first_err_take(&j.failed);
    free(results);
    return rc < 0 ? rc : first;
}

/* What one group of a read does with its tensors. */
typedef struct plan {
    uint64_t at, len;     /* the decoded bytes asked for */
    uint8_t *dst;         /* where byte `at` goes */
    int device;           /* dst is memory of this CUDA device, or -1 */
    bool gpu;             /* the GPU decodes whole tensors into it */
    bool check;           /* verify: every stream decoded into scratch, nothing kept */
    void *stream;
} plan;

static bool whole(const plan *p, const ft__st_tensor *t)
{
    return t->begin >= p->at && t->end <= p->at + p->len;
}

/* Whether tensor @p t decodes straight into the destination (else through scratch). */
static bool direct(const plan *p, const ft__st_tensor *t)
{
    return !p->check && (p->device < 0 || p->gpu) && whole(p, t);
}

/* The GPU decodes the group's whole tensors straight into device memory. */
static int decode_gpu(ft_ctx *ctx, ft__shard *s, const group *g, const uint8_t *buf,
                      const plan *p)
{
    ft_codec_job *jobs = calloc(g->count + 1, sizeof *jobs);
    size_t *which = calloc(g->count + 1, sizeof *which);
    size_t n = 0;
    if (!jobs || !which) {
        free(jobs);
        free(which);
        return ft__err(-ENOMEM, "%s: decode", s->path);
    }
    for (size_t i = 0; i < g->count; i++) {
        const ft__st_tensor *t = &s->header.tensors[g->first + i];
        if (t->end == t->begin || !direct(p, t))
            continue;
        which[n] = g->first + i;
        jobs[n++] = (ft_codec_job){.src = buf + (t->stored_begin - g->lo),
                                   .len = (size_t)(t->stored_end - t->stored_begin),
                                   .dst = p->dst + (t->begin - p->at),
                                   .cap = (size_t)(t->end - t->begin)};
    }
    int64_t r = n ? ft_codec_decode_cuda(ctx, jobs, n, p->device, p->stream) : 0;
    size_t bad_one;
    int at = 0;
    if (r < 0 && sscanf(ft_last_error(), "codec: stream %zu: %n", &bad_one, &at) == 1 && at &&
        bad_one < n) {
        char why[FT__DETAIL_MAX];
        snprintf(why, sizeof why, "%s", ft_last_error() + at);
        r = name_failure(s, &s->header.tensors[which[bad_one]], (int)r, why);
    }
    free(jobs);
    free(which);
    return r < 0 ? (int)r : 0;
}

/* Decode what group @p g holds of the read @p p: whole tensors straight to the destination
 * (the GPU's decode, or the host's into host memory), the rest through @p scratch. */
static int decode_group(ft_ctx *ctx, ft__shard *s, const group *g, const uint8_t *buf,
                        const plan *p, uint8_t *scratch)
{
    int rc = p->gpu ? decode_gpu(ctx, s, g, buf, p) : 0;
    uint8_t **target = calloc(g->count + 1, sizeof *target);
    if (!target)
        return ft__err(-ENOMEM, "%s: decode", s->path);
    uint64_t room = 0; /* scratch: the tensors the destination cannot take whole, end to end */
    for (size_t i = 0; rc == 0 && i < g->count; i++) {
        const ft__st_tensor *t = &s->header.tensors[g->first + i];
        if ((t->end == t->begin && !p->check) || (p->gpu && direct(p, t)))
            continue;
        if (direct(p, t)) {
            target[i] = p->dst + (t->begin - p->at);
        } else {
            target[i] = scratch + room;
            room += t->end - t->begin;
        }
    }
    if (rc == 0)
        rc = decode_host(ctx, s, g, buf, target);
    for (size_t i = 0; rc == 0 && i < g->count; i++) {
        const ft__st_tensor *t = &s->header.tensors[g->first + i];
        if (!target[i] || p->check || direct(p, t))
            continue;
        uint64_t from = FT__MAX(t->begin, p->at), to = FT__MIN(t->end, p->at + p->len);
        uint8_t *out = p->dst + (from - p->at);
        const uint8_t *in = target[i] + (from - t->begin);
        if (p->device >= 0)
            rc = ft_cuda_copy(out, in, (size_t)(to - from));
        else
            memcpy(out, in, (size_t)(to - from));
    }
    free(target);
    return rc;
}

/* Split the tensors [first, last) into groups of about @p limit stored bytes. */
static size_t make_groups(const ft__shard *s, size_t first, size_t last, uint64_t limit,
                          group *out)
{
    size_t n = 0;
    for (size_t i = first; i < last; i++) {
        const ft__st_tensor *t = &s->header.tensors[i];
        group *g = n ? &out[n - 1] : NULL;
        uint64_t lo = g ? FT__MIN(g->lo, t->stored_begin) : 0;
        uint64_t hi = g ? FT__MAX(g->hi, t->stored_end) : 0;
        if (!g || hi - lo > limit) {
            out[n++] = (group){.first = i, .count = 1, .lo = t->stored_begin,
                               .hi = t->stored_end};
            continue;
        }
        g->count++;
        g->lo = lo;
        g->hi = hi;
    }
    return n;
}

/* Decoded bytes the host needs beside the destination for group @p g of read @p p. */
static uint64_t scratch_of(const ft__shard *s, const group *g, const plan *p)
{
    uint64_t n = 0;
    for (size_t i = 0; i < g->count; i++) {
        const ft__st_tensor *t = &s->header.tensors[g->first + i];
        if (!direct(p, t))
            n += t->end - t->begin;
    }
    return n;
}

/* Read and decode the groups in turn, the next group's read running while one decodes. */
static int run_groups(ft_ctx *ctx, ft__shard *s, const group *gs, size_t ng, const plan *p,
                      const ft_io_opts *io, void (*progress)(uint64_t, uint64_t, void *),
                      void *arg, uint64_t *done, uint64_t total)
{
    uint64_t most = 1, scratch_len = 1;
    for (size_t k = 0; k < ng; k++) {
        most = FT__MAX(most, gs[k].hi - gs[k].lo);
        scratch_len = FT__MAX(scratch_len, scratch_of(s, &gs[k], p));
    }
    uint8_t *bufs[2] = {NULL, NULL}, *scratch = NULL;
    int rc = 0;
    for (int b = 0; b < (ng > 1 ? 2 : 1); b++)
        if (posix_memalign((void **)&bufs[b], FT__DIRECT_ALIGN, (size_t)most))
            rc = ft__err(-ENOMEM, "%s: %llu bytes of streams", s->path,
                         (unsigned long long)most);
    if (rc == 0 && !(scratch = malloc((size_t)scratch_len)))
        rc = ft__err(-ENOMEM, "%s: %llu bytes to decode into", s->path,
                     (unsigned long long)scratch_len);
    reading rd[2] = {{.s = s, .io = io}, {.s = s, .io = io}};
    pthread_t reader;
    bool running = false;
    if (rc == 0 && ng) {
        rd[0].buf = bufs[0];
        rd[0].g = &gs[0];
        read_group(&rd[0]);
        rc = rd[0].rc;
        if (rc < 0)
            ft__detail_restore(rd[0].detail);
    }
    for (size_t k = 0; rc == 0 && k < ng; k++) {
        reading *next = &rd[(k + 1) % 2];
        if (k + 1 < ng) {
            next->buf = bufs[(k + 1) % 2];
            next->g = &gs[k + 1];
            if (pthread_create(&reader, NULL, read_group, next) == 0)
                running = true;
            else
                read_group(next);
        }
        rc = decode_group(ctx, s, &gs[k], bufs[k % 2], p, scratch);
        if (running) {
            pthread_join(reader, NULL);
            running = false;
        }
        if (rc == 0 && k + 1 < ng && next->rc < 0) {
            rc = next->rc;
            ft__detail_restore(next->detail);
        }
        if (rc == 0 && done) {
            for (size_t i = 0; i < gs[k].count; i++)
                *done += s->header.tensors[gs[k].first + i].end -
                         s->header.tensors[gs[k].first + i].begin;
            if (progress)
                progress(*done, total, arg);
        }
    }
    free(bufs[0]);
    free(bufs[1]);
    free(scratch);
    return rc;
}

/* The first tensor ending after decoded byte @p at. */
static size_t first_after(const ft__shard *s, uint64_t at)
{
    size_t lo = 0, hi = s->header.ntensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->header.tensors[mid].end <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int64_t ft__fst_read(ft_ctx *ctx, ft__shard *s, uint64_t at, const ft_buf *dst,
                     const ft_io_opts *io, bool host_decode)
{
    plan p = {.at = at, .len = dst->len, .dst = dst->ptr, .stream = io->stream};
    int64_t r = ft__buf_device(dst, &p.device);
    if (r < 0)
        return r;
    if (p.len == 0)
        return 0;
    /* The GPU decodes where the library has its decoder there (asked with no stream). */
    p.gpu = p.device >= 0 && !host_decode && ft_codec_decode_cuda(ctx, NULL, 0, p.device,
                                                                  NULL) == 0;
    size_t first = first_after(s, at), last = first;
    while (last < s->header.ntensors && s->header.tensors[last].begin < at + p.len)
        last++;
    group *gs = calloc(last - first + 1, sizeof *gs);
    if (!gs)
        return ft__err(-ENOMEM, "%s: read plan", s->path);
    size_t ng = make_groups(s, first, last, p.gpu ? GROUP_GPU : GROUP, gs);
    int rc = run_groups(ctx, s, gs, ng, &p, io, NULL, NULL, NULL, 0);
    free(gs);
    return rc < 0 ? rc : (int64_t)dst->len;
}

int ft__fst_verify(ft_ctx *ctx, ft__shard *s, const ft_io_opts *io,
                   void (*progress)(uint64_t, uint64_t, void *), void *arg, uint64_t *done,
                   uint64_t total)
{
    /* Every stream decoded into scratch, empty tensors' streams too (their structure and
     * checksums are checked as well): a read of no destination. */
    plan p = {.at = 0, .len = s->data_size, .device = -1, .check = true};
    size_t n = s->header.ntensors;
    group *gs = calloc(n + 1, sizeof *gs);
    if (!gs)
        return ft__err(-ENOMEM, "%s: verify plan", s->path);
    size_t ng = make_groups(s, 0, n, GROUP, gs);
    int rc = run_groups(ctx, s, gs, ng, &p, io, progress, arg, done, total);
    free(gs);
    return rc;
}
