/*
 * Loading checkpoints. The fast path reads a shard's whole data section with one large
 * parallel read. With verification, the section is read in pieces by the pool's threads,
 * each piece checked against its block checksums as soon as it lands (no second read).
 */
#include "ckpt.h"
#include "../gpu/cuda.h"
#include "../base/syscall.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct verify_job {
    ft__shard *s;
    const ft_io_opts *io;
    uint8_t *dst;          /* where the section goes; NULL: scratch per piece (verify only) */
    bool dst_device;       /* dst is device memory: read and check in scratch, then copy */
    uint64_t piece;
    uint64_t first_piece;  /* pieces [first_piece, first_piece + n) in this round */
    ft__bufpool *scratch;
    pthread_mutex_t lock;
    uint64_t bad_block;    /* lowest mismatching block, UINT64_MAX when none */
    ft__first_err failed;  /* the first piece that failed to read or copy */
} verify_job;

static int64_t verify_piece(void *arg, unsigned i)
{
    verify_job *j = arg;
    ft__shard *s = j->s;
    uint64_t at = (j->first_piece + i) * j->piece, len = FT__MIN(j->piece, s->data_size - at);
    bool scratch = !j->dst || j->dst_device;
    uint8_t *buf = scratch ? ft__bufpool_get(j->scratch) : j->dst + at;
    if (!buf)
        return ft__err(-ENOMEM, "verify buffer");
    ft_buf b = ft_host_buf(buf, (size_t)len);
    int64_t r = ft__shard_read(s, &b, at, j->io);
    uint64_t block = s->header.csum_block;
    for (uint64_t o = 0; r >= 0 && o < len; o += block) {
        uint64_t k = (at + o) / block;
        if (ft__csum(buf + o, (size_t)FT__MIN(block, len - o)) != s->header.csums[k]) {
            pthread_mutex_lock(&j->lock);
            if (k < j->bad_block)
                j->bad_block = k;
            pthread_mutex_unlock(&j->lock);
            break;
        }
    }
    if (r >= 0 && j->dst_device) {
        int crc = ft_cuda_copy(j->dst + at, buf, (size_t)len);
        r = crc < 0 ? crc : r;
    }
    if (r < 0)
        ft__first_err_note(&j->failed, i, (int)r);
    if (scratch)
        ft__bufpool_put(j->scratch, buf);
    return r;
}

/* Which tensors of shared block @p k hold the bad bytes, by its part checksums (the block
 * read again): their names into @p buf. @return false where that cannot be told. */
static bool bad_parts(ft__shard *s, uint64_t k, char *buf, size_t len)
{
    const ft__st_header *h = &s->header;
    uint64_t block = h->csum_block, from = k * block, to = FT__MIN(from + block, s->data_size);
    uint64_t *first = h->parts ? malloc((h->ncsums + 1) * sizeof *first) : NULL;
    ft__span *spans = first ? malloc((h->ntensors + 1) * sizeof *spans) : NULL;
    uint8_t *data = spans ? malloc((size_t)(to - from) + 1) : NULL;
    bool told = false;
    if (data) {
        for (size_t i = 0; i < h->ntensors; i++)
            spans[i] = (ft__span){h->tensors[i].begin, h->tensors[i].end};
        ft__parts_layout(spans, h->ntensors, block, h->ncsums, first);
        ft_buf b = ft_host_buf(data, (size_t)(to - from));
        ft_io_opts o = ft__meta_io();
        uint64_t part = first[k];
        if (part != UINT64_MAX &&
            ft__transfer(s->file, &b, s->data_start + from, &o, false) == (int64_t)(to - from)) {
            size_t at = 0, n = 0;
            buf[0] = '\0';
            for (size_t i = 0; i < h->ntensors && part < h->nparts; i++) {
                uint64_t tb = FT__MAX(spans[i].begin, from), te = FT__MIN(spans[i].end, to);
                if (te <= tb)
                    continue;
                if (ft__csum(data + (tb - from), (size_t)(te - tb)) != h->parts[part++] &&
                    at < len)
                    at += (size_t)snprintf(buf + at, len - at, "%stensor '%s'", n++ ? " and " : "",
                                           h->tensors[i].name);
            }
            told = n > 0;
        }
    }
    free(data);
    free(spans);
    free(first);
    return told;
}

static int bad_block_error(ft__shard *s, uint64_t k)
{
    uint64_t block = s->header.csum_block, from = k * block;
    uint64_t to = FT__MIN(from + block, s->data_size);
    char names[FT__DETAIL_MAX / 2];
    FT__KEEPING_DETAIL(if (!bad_parts(s, k, names, sizeof names))
                           ft__shard_tensors_in(s, from, to, names, sizeof names));
    return ft__err(-EBADMSG, "%s: block %llu (data bytes %llu..%llu, file offset %llu) does "
                             "not match its checksum; the bad bytes are in %s",
                   s->path, (unsigned long long)k, (unsigned long long)from,
                   (unsigned long long)to, (unsigned long long)(s->data_start + from), names);
}

/*
 * Read (into @p dst, or scratch memory when NULL) and check a shard's data, in rounds of
 * pieces; @p progress runs between rounds on the calling thread.
 */
static int verify_shard(ft_ctx *ctx, ft__shard *s, uint8_t *dst, bool dst_device,
                        const ft_io_opts *io, void (*progress)(uint64_t, uint64_t, void *),
                        void *arg, uint64_t *done, uint64_t total)
{
    uint64_t block = s->header.csum_block;
    verify_job j = {.s = s, .io = io, .dst = dst, .dst_device = dst_device,
                    .bad_block = UINT64_MAX};
    /* Reading into the caller's memory needs no staging: as large as one O_DIRECT request. */
    uint64_t want = dst && !dst_device
                        ? FT__MAX((uint64_t)ctx->cfg.chunk_size, (uint64_t)FT__CKPT_PIECE)
                        : (uint64_t)FT__CKPT_PIECE;
    j.piece = FT__MAX(want / block, 1) * block;
    uint64_t npieces = (s->data_size + j.piece - 1) / j.piece;
    unsigned per_round = progress ? ctx->cfg.threads + 1 : (unsigned)FT__MIN(npieces, 1u << 20);
    int rc = 0;
    if ((!dst || dst_device) &&
        ft__bufpool_create(&j.scratch, (size_t)j.piece, ctx->cfg.threads + 1) < 0)
        return ft__err(-ENOMEM, "verify buffers");
    int64_t *results = calloc(per_round ? per_round : 1, sizeof *results);
    if (!results)
        rc = ft__err(-ENOMEM, "verify");
    pthread_mutex_init(&j.lock, NULL);
    ft__first_err_init(&j.failed);
    for (uint64_t p = 0; rc == 0 && p < npieces; p += per_round) {
        unsigned n = (unsigned)FT__MIN(per_round, npieces - p);
        j.first_piece = p;
        if ((rc = ft__pool_run(ctx->pool, n, verify_piece, &j, results)) < 0)
            break;
        if (j.failed.err)
            break; /* taken below, with its detail */
        if (j.bad_block != UINT64_MAX)
            rc = bad_block_error(s, j.bad_block);
        *done += FT__MIN(n * j.piece, s->data_size - p * j.piece);
        if (progress)
            progress(*done, total, arg);
    }
    int first = ft__first_err_take(&j.failed);
    pthread_mutex_destroy(&j.lock);
    free(results);
    ft__bufpool_destroy(j.scratch);
    return rc ? rc : first;
}

static ft_io_opts io_opts(const ft_load_opts *o)
{
    return (ft_io_opts){.engine = o ? o->engine : FT_ENGINE_AUTO, .stream = o ? o->stream : NULL,
                        .cache = o ? o->cache : FT_CACHE_AUTO};
}

static int check_load_opts(const ft_load_opts *o)
{
    if (o && ((unsigned)o->engine >= FT_ENGINE_COUNT || (o->flags & ~FT_LOAD_VERIFY) ||
              (unsigned)o->cache >= FT_CACHE_COUNT))
        return ft__err(-EINVAL, "bad load options (engine %d, flags 0x%x, cache %d)",
                       (int)o->engine, o->flags, (int)o->cache);
    return 0;
}

/*
 * A large host destination is advised MADV_HUGEPAGE: its first touch, the read's, faults in
 * 2 MiB at a time (in a VM the first touch of fresh memory was 0.2 GB/s per thread with 4 KiB
 * pages, 0.67 with huge pages). It is no longer faulted in before the read
 * (MADV_POPULATE_WRITE in parallel slices, which a uring load once needed): the engines'
 * reads fault it in as they copy, in parallel and under the I/O, where the populate was a
 * phase of its own before it. Development machine, cold loads (ms, C API, 3 and 2 runs):
 * 498 MB posix 259-322 with the populate, 228-265 without; direct 240-316 / 228-250; uring
 * 250-279 / 227-255; 2.4 GB posix 1282-1332 / 1104-1159, direct 1184-1220 / 1046-1087,
 * uring 1258-1308 / 1069-1213. A hint: errors are ignored.
 */
static void prepare_host_dst(const ft_buf *dst, uint64_t len)
{
    const uintptr_t huge = 2u << 20;
    int device;
    if (len < 2 * huge || ft__buf_device(dst, &device) < 0 || device >= 0)
        return;
    uintptr_t lo = ((uintptr_t)dst->ptr + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)dst->ptr + len) & ~(huge - 1);
    if (hi > lo)
        ft__sys.madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

int64_t ft_ckpt_load_shard(ft_ckpt *c, unsigned k, const ft_buf *dst, const ft_load_opts *o)
{
    if (!c || k >= c->nshards || !dst)
        return ft__err(-EINVAL, "ft_ckpt_load_shard: bad checkpoint, shard or buffer");
    int rc = check_load_opts(o);
    if (rc < 0)
        return rc;
    ft__shard *s = &c->shards[k];
    if (dst->len < s->data_size)
        return ft__err(-EINVAL, "%s: buffer of %zu bytes is smaller than the data (%llu)",
                       s->path, dst->len, (unsigned long long)s->data_size);
    if (dst->kind != FT_MEM_HOST && dst->kind != FT_MEM_CUDA)
        return ft__err(-EINVAL, "%s: memory kind %d is not supported", s->path,
                       (int)dst->kind);
    ft_io_opts io = io_opts(o);
    prepare_host_dst(dst, s->data_size);
    if (s->fst) { /* streams decoded into the layout; FT_LOAD_VERIFY: on the host */
        ft_buf part = *dst;
        part.len = (size_t)s->data_size;
        return ft__fst_read(c->ctx, s, 0, &part, &io, o && (o->flags & FT_LOAD_VERIFY));
    }
    if (o && (o->flags & FT_LOAD_VERIFY) && s->header.csum_block) {
        uint64_t done = 0;
        int dev = dst->device;
        bool pinned, device = dst->kind == FT_MEM_CUDA ||
                              ft__cuda_pointer(dst->ptr, &dev, &pinned) == 1;
        rc = verify_shard(c->ctx, s, dst->ptr, device, &io, NULL, NULL, &done, s->data_size);
        return rc < 0 ? rc : (int64_t)s->data_size;
    }
    ft_buf part = *dst;
    part.len = (size_t)s->data_size;
    return ft__shard_read(s, &part, 0, &io);
}

typedef struct load_all_job {
    ft_ckpt *c;
    const ft_load_opts *o;
    ft__first_err failed; /* the first shard that failed */
} load_all_job;

static int64_t load_all_shard(void *arg, unsigned k)
{
    load_all_job *j = arg;
    ft__shard *s = &j->c->shards[k];
    if (!s->owned) {
        /* Memory in the same alignment phase as the file: O_DIRECT goes in place. */
        size_t phase = (size_t)(s->data_start % FT__DIRECT_ALIGN);
        size_t align = s->data_size >= (4u << 20) ? (2u << 20) : FT__DIRECT_ALIGN;
        if (posix_memalign(&s->owned_base, align, (size_t)s->data_size + phase + 1))
            return ft__err(-ENOMEM, "%s: %llu bytes for the data", s->path,
                           (unsigned long long)s->data_size);
        s->owned = (uint8_t *)s->owned_base + phase;
    }
    ft_buf b = ft_host_buf(s->owned, (size_t)s->data_size);
    int64_t r = ft_ckpt_load_shard(j->c, k, &b, j->o);
    if (r < 0) {
        ft__first_err_note(&j->failed, k, (int)r);
        free(s->owned_base);
        s->owned_base = NULL;
        s->owned = NULL;
    }
    return r;
}

int ft_ckpt_load_all(ft_ckpt *c, const ft_load_opts *o)
{
    if (!c)
        return ft__err(-EINVAL, "ft_ckpt_load_all: checkpoint is NULL");
    int rc = check_load_opts(o);
    if (rc < 0)
        return rc;
    int64_t *results = calloc(c->nshards, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "load");
    load_all_job j = {.c = c, .o = o};
    ft__first_err_init(&j.failed);
    rc = ft__pool_run(c->ctx->pool, c->nshards, load_all_shard, &j, results);
    int first = ft__first_err_take(&j.failed);
    rc = rc ? rc : first;
    free(results);
    return rc;
}

const void *ft_ckpt_data(const ft_ckpt *c, size_t i)
{
    if (!c || i >= c->ntensors)
        return NULL;
    const ft__st_tensor *t = c->tensors[i];
    const ft__shard *s = &c->shards[t->shard];
    return s->owned ? s->owned + t->begin : NULL;
}

/* Read bytes [begin, begin + dst->len) of shard @p s's data section into @p dst (host or
 * device memory). With FT_LOAD_VERIFY, the whole checksum blocks around them are read and
 * checked first. */
static int64_t read_part(ft__shard *s, uint64_t begin, const ft_buf *dst, const ft_load_opts *o)
{
    uint64_t n = dst->len;
    ft_io_opts io = io_opts(o);
    uint64_t block = s->header.csum_block;
    prepare_host_dst(dst, n); /* a fresh tensor's pages */
    if (s->fst)
        return ft__fst_read(s->file->ctx, s, begin, dst, &io,
                            o && (o->flags & FT_LOAD_VERIFY));
    if (!(o && (o->flags & FT_LOAD_VERIFY)) || !block || n == 0) {
        return ft__shard_read(s, dst, begin, &io);
    }
    int device;
    int64_t r = ft__buf_device(dst, &device);
    if (r < 0)
        return r;
    uint64_t from = begin / block * block;
    uint64_t to = FT__MIN((begin + n + block - 1) / block * block, s->data_size);
    uint8_t *tmp = malloc((size_t)(to - from));
    if (!tmp)
        return ft__err(-ENOMEM, "%s: %llu bytes to verify", s->path,
                       (unsigned long long)(to - from));
    ft_buf part = ft_host_buf(tmp, (size_t)(to - from));
    r = ft__shard_read(s, &part, from, &io);
    for (uint64_t at = from; r >= 0 && at < to; at += block)
        if (ft__csum(tmp + (at - from), (size_t)FT__MIN(block, to - at)) !=
            s->header.csums[at / block])
            r = bad_block_error(s, at / block);
    if (r >= 0 && device >= 0) {
        int crc = ft_cuda_copy(dst->ptr, tmp + (begin - from), (size_t)n);
        r = crc < 0 ? crc : (int64_t)n;
    } else if (r >= 0) {
        memcpy(dst->ptr, tmp + (begin - from), (size_t)n);
        r = (int64_t)n;
    }
    free(tmp);
    return r;
}

int64_t ft_ckpt_load_tensor(ft_ckpt *c, size_t i, const ft_buf *dst, const ft_load_opts *o)
{
    if (!c || i >= c->ntensors || !dst)
        return ft__err(-EINVAL, "ft_ckpt_load_tensor: bad checkpoint, index or buffer");
    const ft__st_tensor *t = c->tensors[i];
    uint64_t n = t->end - t->begin;
    if (dst->len < n)
        return ft__err(-EINVAL, "tensor '%s': buffer of %zu bytes, needs %llu", t->name,
                       dst->len, (unsigned long long)n);
    ft_buf whole = *dst;
    whole.len = (size_t)n;
    return ft_ckpt_read_range(c, i, 0, &whole, o);
}

/* read_part of bytes [offset, offset + dst->len) of a span [base, base + size) of shard
 * @p s's data section (a tensor's, or the whole section), refused when outside it; @p what
 * names the span in the message. */
static int64_t read_inside(ft__shard *s, uint64_t base, uint64_t size, uint64_t offset,
                           const ft_buf *dst, const ft_load_opts *o, const char *what)
{
    int rc = check_load_opts(o);
    if (rc < 0)
        return rc;
    if (offset > size || dst->len > size - offset)
        return ft__err(-ERANGE, "%s: bytes %llu..%llu asked of %llu", what,
                       (unsigned long long)offset, (unsigned long long)(offset + dst->len),
                       (unsigned long long)size);
    return read_part(s, base + offset, dst, o);
}

int64_t ft_ckpt_read_range(ft_ckpt *c, size_t i, uint64_t offset, const ft_buf *dst,
                           const ft_load_opts *o)
{
    if (!c || i >= c->ntensors || !dst)
        return ft__err(-EINVAL, "ft_ckpt_read_range: bad checkpoint, index or buffer");
    const ft__st_tensor *t = c->tensors[i];
    char what[FT__DETAIL_MAX / 4];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    return read_inside(&c->shards[t->shard], t->begin, t->end - t->begin, offset, dst, o, what);
}

/* Ranges of a .fst tensor: its stream decoded once (on the host), each range copied out. */
static int64_t fst_ranges(ft_ckpt *c, const ft__st_tensor *t, ft_batch_op *ops, size_t n,
                          const ft_load_opts *o, uint64_t total)
{
    uint64_t size = t->end - t->begin;
    uint8_t *tmp = malloc(size ? (size_t)size : 1);
    if (!tmp)
        return ft__err(-ENOMEM, "tensor '%s': %llu bytes", t->name, (unsigned long long)size);
    ft_buf b = ft_host_buf(tmp, (size_t)size);
    ft_io_opts io = io_opts(o);
    int64_t r = ft__fst_read(c->ctx, &c->shards[t->shard], t->begin, &b, &io, true);
    for (size_t k = 0; r >= 0 && k < n; k++) {
        int device;
        int rc = ft__buf_device(&ops[k].buf, &device);
        if (rc == 0 && device >= 0)
            rc = ft_cuda_copy(ops[k].buf.ptr, tmp + ops[k].offset, ops[k].buf.len);
        else if (rc == 0 && ops[k].buf.len)
            memcpy(ops[k].buf.ptr, tmp + ops[k].offset, ops[k].buf.len);
        r = rc < 0 ? rc : r;
        ops[k].result = rc < 0 ? rc : (int64_t)ops[k].buf.len;
    }
    free(tmp);
    return r < 0 ? r : (int64_t)total;
}

int64_t ft_ckpt_read_ranges(ft_ckpt *c, size_t i, ft_batch_op *ops, size_t n,
                            const ft_load_opts *o)
{
    if (!c || i >= c->ntensors || (!ops && n))
        return ft__err(-EINVAL, "ft_ckpt_read_ranges: bad checkpoint, index or ranges");
    int rc = check_load_opts(o);
    if (rc < 0)
        return rc;
    const ft__st_tensor *t = c->tensors[i];
    ft__shard *s = &c->shards[t->shard];
    uint64_t size = t->end - t->begin, total = 0;
    for (size_t k = 0; k < n; k++) {
        ops[k].result = 0;
        if (ops[k].offset > size || ops[k].buf.len > size - ops[k].offset)
            return ft__err(-ERANGE, "tensor '%s': range %zu, bytes %llu..%llu asked of %llu",
                           t->name, k, (unsigned long long)ops[k].offset,
                           (unsigned long long)(ops[k].offset + ops[k].buf.len),
                           (unsigned long long)size);
        total += ops[k].buf.len;
    }
    if (s->fst)
        return fst_ranges(c, t, ops, n, o, total);
    if (o && (o->flags & FT_LOAD_VERIFY) && s->header.csum_block) {
        for (size_t k = 0; k < n; k++) /* each with the checksum blocks it overlaps */
            if ((ops[k].result = read_part(s, t->begin + ops[k].offset, &ops[k].buf, o)) < 0)
                return ops[k].result;
        return (int64_t)total;
    }
    ft_batch_op *abs = malloc((n ? n : 1) * sizeof *abs);
    if (!abs)
        return ft__err(-ENOMEM, "tensor '%s': %zu ranges", t->name, n);
    for (size_t k = 0; k < n; k++)
        abs[k] = (ft_batch_op){ops[k].buf, s->data_start + t->begin + ops[k].offset, 0};
    ft_io_opts io = io_opts(o);
    rc = ft_read_batch(s->file, abs, n, &io);
    for (size_t k = 0; k < n; k++) {
        ops[k].result = abs[k].result;
        if (rc == 0 && (uint64_t)abs[k].result != ops[k].buf.len)
            rc = ft__err(-EIO, "%s: the file ended early (tensor '%s')", s->path, t->name);
    }
    free(abs);
    return rc < 0 ? rc : (int64_t)total;
}

int64_t ft_ckpt_read_shard_range(ft_ckpt *c, unsigned k, uint64_t offset, const ft_buf *dst,
                                 const ft_load_opts *o)
{
    if (!c || k >= c->nshards || !dst)
        return ft__err(-EINVAL, "ft_ckpt_read_shard_range: bad checkpoint, shard or buffer");
    ft__shard *s = &c->shards[k];
    return read_inside(s, 0, s->data_size, offset, dst, o, s->path);
}

int ft_ckpt_verify(ft_ckpt *c, const ft_load_opts *o,
                   void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
    if (!c)
        return ft__err(-EINVAL, "ft_ckpt_verify: checkpoint is NULL");
    int rc = check_load_opts(o);
    if (rc < 0)
        return rc;
    if (!ft_ckpt_has_checksums(c))
        return ft__err(-ENODATA, "%s carries no fastensor checksums", c->shards[0].path);
    uint64_t total = 0, done = 0;
    for (unsigned k = 0; k < c->nshards; k++)
        total += c->shards[k].data_size;
    ft_io_opts io = io_opts(o);
    for (unsigned k = 0; rc == 0 && k < c->nshards; k++)
        rc = c->shards[k].fst ? ft__fst_verify(c->ctx, &c->shards[k], &io, progress, arg, &done,
                                               total)
                              : verify_shard(c->ctx, &c->shards[k], NULL, false, &io, progress,
                                             arg, &done, total);
    return rc;
}
