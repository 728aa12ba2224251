/*
 * Codec streams encoded on the GPU (enc_dev.h describes the steps): the host lays out the
 * blocks and the device memory, launches the encoder's kernels of kernel.cu and copies the
 * finished stream back. The same steps also run here on the CPU, thread by thread, for the
 * tests (ft__codec_encode_lanes), which check them against encode.c byte for byte.
 */
#include "codec.h"
#include "enc_dev.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Step 1 on the CPU for block @p b (its bytes copied to @p tile, 8-byte aligned, as the
 * kernel stages them): its histograms into @p hist and its checksum. */
static void count_block_lanes(ftz_eblock *b, unsigned E, uint8_t *tile, uint32_t *hist)
{
    uint64_t len = (uint64_t)b->n * E;
    memcpy(tile, (const void *)(uintptr_t)b->src, len);
    memset(tile + len, 0, 8);
    for (uint64_t at = 0; at < len; at += 8) {
        uint64_t v;
        memcpy(&v, tile + at, 8);
        ftz_count_word(v, (unsigned)FT__MIN(8, len - at), E, hist);
    }
    if (len <= 240) {
        b->csum = ftz_xxh3_short(b->src, (uint32_t)len);
        return;
    }
    uint64_t acc[8], keys[17];
    for (unsigned i = 0; i < 8; i++) {
        acc[i] = ftz_xxh3_init(i, keys);
        acc[i] = ftz_xxh3_blocks(acc[i], (uint64_t)(uintptr_t)tile, (len - 1) / 1024, i, keys);
        acc[i] = ftz_xxh3_tail(acc[i], b->src, len, i);
    }
    b->csum = ftz_xxh3_merge(acc, len);
}

/* Steps 1-5 for block @p b on the CPU, as the kernels run them (enc_dev.h), its place at
 * b->out (zeroed). The chunks go last to first: their writes do not depend on the order. */
static int encode_block_lanes(ftz_eblock *b, ftz_eplane *planes, unsigned E, uint8_t *tile,
                              uint64_t out)
{
    uint32_t hist[8 * 256], tab[8 * 256], lastin[8 * FTZ_LANES] = {0};
    memset(hist, 0, sizeof hist);
    count_block_lanes(b, E, tile, hist);
    for (unsigned k = 0; k < E; k++) {
        memcpy(planes[k].count, hist + 256 * k, sizeof planes[k].count);
        planes[k].n = b->n;
        ftz_plane_code(&planes[k]);
        for (unsigned v = 0; v < 256; v++)
            tab[256 * k + v] = planes[k].mode == FTZ_HUFF ? planes[k].cl[v] : 0;
    }
    uint32_t C = ftz_chunks(b->n);
    uint32_t *cbits = calloc((size_t)FTZ_LANES * C * E, sizeof *cbits);
    if (!cbits)
        return -ENOMEM;
    for (uint32_t t = 0; t < FTZ_LANES * C; t++)
        ftz_chunk_bits(b, tab, E, t / C, t % C, cbits + (size_t)t * E, lastin);
    uint64_t bits[8][FTZ_LANES], last[8][FTZ_LANES];
    for (unsigned k = 0; k < E; k++) {
        for (unsigned lane = 0; lane < FTZ_LANES; lane++)
            ftz_stream_sum(cbits, b->n, E, k, lane, lastin, &bits[k][lane], &last[k][lane]);
        ftz_plane_finish(&planes[k], bits[k], last[k]);
    }
    ftz_block_finish(b, planes, E);
    b->out = out;
    for (unsigned k = 0; k < E; k++)
        for (unsigned v = 0; v < 256; v++)
            tab[256 * k + v] = ftz_write_code(&planes[k], v);
    for (uint32_t t = FTZ_LANES * C; t-- > 0;)
        ftz_chunk_write(b, planes, tab, cbits + (size_t)t * E, E, t / C, t % C);
    free(cbits);
    return 0;
}

int64_t ft__codec_encode_lanes(const void *src, uint64_t nbytes, unsigned esize,
                               uint32_t block_bytes, void *dst, size_t cap)
{
    int rc = ft__codec_check_args(nbytes, esize, &block_bytes);
    if (rc < 0)
        return rc;
    uint32_t nblocks = (uint32_t)((nbytes + block_bytes - 1) / block_bytes);
    uint64_t table = HEAD + ENTRY * (uint64_t)nblocks, at = 0;
    /* as the kernels find them: the elements in memory allocated in whole aligned words; the
     * output with room for the words its last byte shares */
    uint8_t *copy = aligned_alloc(256, (nbytes + 256) & ~(uint64_t)255);
    uint8_t *tile = aligned_alloc(256, ((uint64_t)block_bytes + 264) & ~(uint64_t)255);
    uint8_t *out = calloc(1, table + ((uint64_t)block_bytes + esize) * nblocks + 8);
    ftz_eplane *planes = calloc(esize, sizeof *planes);
    int64_t r = -ENOMEM;
    if (!copy || !tile || !out || !planes)
        goto done;
    memcpy(copy, src, nbytes);
    for (uint32_t i = 0; i < nblocks; i++) {
        uint64_t off = (uint64_t)i * block_bytes;
        ftz_eblock b = {.src = (uint64_t)(uintptr_t)(copy + off),
                        .n = (uint32_t)(FT__MIN(block_bytes, nbytes - off) / esize)};
        uint64_t place = (uint64_t)(uintptr_t)(out + table + at);
        if (encode_block_lanes(&b, planes, esize, tile, place) < 0)
            goto done;
        at += b.size;
        put64(out + HEAD + ENTRY * (size_t)i, at);
        put64(out + HEAD + ENTRY * (size_t)i + 8, b.csum);
    }
    ft__codec_head(out, esize, nbytes, block_bytes, nblocks);
    r = table + at > cap ? -ENOSPC : (int64_t)(table + at);
    if (r > 0)
        memcpy(dst, out, table + at);
done:
    free(copy);
    free(tile);
    free(out);
    free(planes);
    return r;
}

/* ---- on the GPU ---- */

extern const unsigned char ft__codec_fatbin[], ft__codec_fatbin_end[];

/* A wave: the blocks encoded together, of one element size, up to WAVE_BYTES of input (the
 * device memory an encode takes is about that, for the coded bytes of host destinations)
 * and WAVE_PLANES planes (their descriptions, 2.7 KiB each); a call whose jobs are smaller
 * takes memory for them alone (enc_mem). */
#define WAVE_BYTES (128ull << 20)
#define WAVE_PLANES 4096u
#define COUNT_THREADS 256 /* kernel.cu's FTZ_COUNT_THREADS */
#define CHUNK_THREADS 256 /* kernel.cu's FTZ_CHUNK_THREADS */
#define LAYOUT_THREADS 1024 /* kernel.cu's FTZ_LAYOUT_THREADS */

typedef struct enc_kernels {
    CUfunction count, code, bits, layout, clear, write;
} enc_kernels;

static int encode_kernels(int device, unsigned esize, enc_kernels *k)
{
    if (&ft__codec_fatbin_end[0] == &ft__codec_fatbin[0])
        return ft__err(-ENOSYS, "codec: this library was built without nvcc, so it has no GPU "
                       "encoder (encode on the host: ft_codec_encode)");
    /* (names that last: the kernel cache keeps them) */
    static const char *const names[4][4] = {
        {"ftz_enc_count_1", "ftz_enc_bits_1", "ftz_enc_layout_1", "ftz_enc_write_1"},
        {"ftz_enc_count_2", "ftz_enc_bits_2", "ftz_enc_layout_2", "ftz_enc_write_2"},
        {"ftz_enc_count_4", "ftz_enc_bits_4", "ftz_enc_layout_4", "ftz_enc_write_4"},
        {"ftz_enc_count_8", "ftz_enc_bits_8", "ftz_enc_layout_8", "ftz_enc_write_8"}};
    const char *const *n = names[esize == 1 ? 0 : esize == 2 ? 1 : esize == 4 ? 2 : 3];
    struct { const char *name; CUfunction *fn; } want[] = {
        {n[0], &k->count}, {"ftz_enc_code", &k->code}, {n[1], &k->bits},
        {n[2], &k->layout}, {"ftz_enc_clear", &k->clear}, {n[3], &k->write}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int rc = ft__cuda_function(device, ft__codec_fatbin, want[i].name, want[i].fn);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int launch(CUfunction fn, unsigned grid, unsigned grid_y, unsigned threads, CUstream s,
                  void **params, const char *what)
{
    CUresult r = ft__cu.LaunchKernel(fn, grid, grid_y, 1, threads, 1, 1, 0, s, params, NULL);
    return r ? ft__cuda_err(r, what) : 0;
}

/* A job as the encoder goes through it. */
typedef struct ejob {
    ft_codec_enc_job *job;
    uint32_t block, nblocks, next; /* block bytes; blocks; the next block to encode */
    uint64_t table, at;            /* its header and table's bytes; its coded bytes so far */
    int device_dst;                /* dst is device memory */
    bool placed;                   /* dst comes from the call's placer */
    uint8_t *head;                 /* header and table: dst (host), or built here */
} ejob;

/* The device memory of a call: block descriptions, planes, chunk bits, the bits before each
 * stream's last group, the coded bytes of host destinations (stage), element-aligned copies
 * of sources that are not (copy). */
typedef struct enc_mem {
    CUdeviceptr base, desc, planes, cbits, lastin, stage, copy;
    /* a wave's most: input bytes (each block's room, its bytes and an element), planes and
     * chunk bits entries */
    uint64_t wave_bytes, wave_chunks;
    uint32_t wave_planes;
    /* where the stage is used: the stream its copies to the host go on, so that they overlap
     * the next wave's steps 1-4; events: a wave written, its copies done */
    CUstream out;
    CUevent written, copied;
} enc_mem;

static uint64_t align256(uint64_t x)
{
    return (x + 255) & ~255ull;
}

/* Chunk bits entries of a block of @p n elements. */
static uint64_t block_chunks(uint32_t n, unsigned esize)
{
    return (uint64_t)FTZ_LANES * ftz_chunks(n) * esize;
}

/* The waves' limits for a call whose blocks take @p room, @p planes and @p chunks in all, the
 * largest @p most of room: the WAVE_ ones, or less where the jobs need less (a 32 MiB call
 * takes about 40 MiB of device memory, not 140; a wave always takes one block). */
static void mem_limits(enc_mem *m, uint64_t room, uint64_t planes, uint64_t chunks,
                       uint64_t most)
{
    m->wave_bytes = FT__MAX(FT__MIN(WAVE_BYTES, room), most);
    m->wave_planes = (uint32_t)FT__MIN((uint64_t)WAVE_PLANES, planes);
    m->wave_chunks = FT__MIN(WAVE_BYTES / FTZ_CHUNK + (uint64_t)WAVE_PLANES * (FTZ_LANES + 1) * 8,
                             chunks);
}

/* The layout of the call's device memory from @p base (its limits set); @return its bytes. */
static uint64_t mem_layout(CUdeviceptr base, bool stage, bool copy, enc_mem *m)
{
    uint64_t wave = m->wave_bytes + 64;
    m->base = base;
    m->desc = base;
    m->planes = m->desc + align256(m->wave_planes * sizeof(ftz_eblock));
    m->cbits = m->planes + align256(m->wave_planes * sizeof(ftz_eplane));
    m->lastin = m->cbits + align256(m->wave_chunks * 4);
    m->stage = m->lastin + align256((uint64_t)m->wave_planes * FTZ_LANES * 4);
    m->copy = m->stage + (stage ? align256(wave) : 0);
    return m->copy + (copy ? align256(wave + 16ull * m->wave_planes) : 0) - base;
}

/* A wave's blocks: their descriptions (host), the job and block number of each. */
typedef struct wave {
    ftz_eblock *desc;
    uint32_t *job, *num;
    uint32_t n, parts;
    uint64_t chunks, room, copied;
} wave;

/* Block @p i of job @p j into wave @p w if it has room; its source copied to element
 * alignment where it is not. @return 1 added, 0 full, or -errno. */
static int wave_add(wave *w, ejob *jobs, uint32_t j, const enc_mem *m, CUstream s)
{
    ejob *J = &jobs[j];
    unsigned e = J->job->elem_size;
    uint64_t off = (uint64_t)J->next * J->block;
    uint64_t bytes = FT__MIN((uint64_t)J->block, J->job->nbytes - off);
    uint32_t n = (uint32_t)(bytes / e);
    uint64_t room = (uint64_t)J->block + e, chunks = block_chunks(n, e);
    if (w->n && (w->room + room > m->wave_bytes || (w->n + 1) * e > m->wave_planes ||
                 w->chunks + chunks > m->wave_chunks))
        return 0;
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)J->job->src + off;
    if (src % e) { /* (torch's tensors never are) */
        CUresult r = ft__cu.MemcpyDtoDAsync(m->copy + w->copied, src, bytes, s);
        if (r)
            return ft__cuda_err(r, "codec: an element-aligned copy of the source");
        src = m->copy + w->copied;
        w->copied += (bytes + 15) & ~15ull;
    }
    w->desc[w->n] = (ftz_eblock){.src = src, .n = n, .chunk0 = (uint32_t)w->chunks};
    w->job[w->n] = j;
    w->num[w->n] = J->next++;
    uint32_t parts = (uint32_t)((FTZ_LANES * ftz_chunks(n) + CHUNK_THREADS - 1) / CHUNK_THREADS);
    w->parts = FT__MAX(w->parts, parts);
    w->chunks += chunks;
    w->room += room;
    w->n++;
    return 1;
}

/* Steps 1-4 of wave @p w: its blocks' sizes and checksums back in w->desc. */
static int wave_measure(const enc_kernels *k, CUstream s, const enc_mem *m, wave *w,
                        unsigned esize)
{
    CUresult r = ft__cu.MemcpyHtoDAsync(m->desc, w->desc, w->n * sizeof *w->desc, s);
    if (r)
        return ft__cuda_err(r, "codec: the blocks to the GPU");
    unsigned nplanes = w->n * esize;
    CUdeviceptr desc = m->desc, planes = m->planes, cbits = m->cbits, lastin = m->lastin;
    void *dp[] = {&desc, &planes}, *pn[] = {&planes};
    void *bits[] = {&desc, &planes, &cbits, &lastin};
    int rc;
    if ((rc = launch(k->count, w->n, 1, COUNT_THREADS, s, dp, "codec: GPU encode (count)")) < 0 ||
        (rc = launch(k->code, nplanes, 1, 256, s, pn, "codec: GPU encode (code)")) < 0 ||
        (rc = launch(k->bits, w->n, w->parts, CHUNK_THREADS, s, bits,
                     "codec: GPU encode (bits)")) < 0 ||
        (rc = launch(k->layout, w->n, 1, LAYOUT_THREADS, s, bits,
                     "codec: GPU encode (layout)")) < 0)
        return rc;
    if ((r = ft__cu.MemcpyDtoHAsync(w->desc, m->desc, w->n * sizeof *w->desc, s)) ||
        (r = ft__cu.StreamSynchronize(s)))
        return ft__cuda_err(r, "codec: the GPU encoder");
    return 0;
}

/* Room for job @p J's stream from @p p (its destination until now none). */
static int place_job(ejob *J, const ft__codec_placer *p)
{
    size_t cap = ft_codec_bound(J->job->nbytes, J->job->elem_size, J->block);
    if (!(J->job->dst = p->place(p->arg, cap)))
        return ft__err(-ENOMEM, "codec: %zu bytes of host memory for a coded stream", cap);
    J->job->cap = cap;
    J->head = J->job->dst;
    return 0;
}

/* Step 5 of wave @p w: each block placed (at its job's device destination, or in the stage
 * and from there copied to its job's host destination), its table entry written; a job
 * without a destination placed by @p placer at its first block, fitted at its last. */
static int wave_write(const enc_kernels *k, CUstream s, const enc_mem *m, wave *w,
                      ejob *jobs, const ft__codec_placer *placer)
{
    uint64_t staged = 0;
    for (uint32_t i = 0; i < w->n; i++) {
        ejob *J = &jobs[w->job[i]];
        ftz_eblock *b = &w->desc[i];
        int rc = J->placed && !J->head ? place_job(J, placer) : 0;
        if (rc < 0)
            return rc;
        if (J->table + J->at + b->size > J->job->cap)
            return ft__err(-ENOSPC, "codec: %zu bytes of room are too few for job %u",
                           J->job->cap, w->job[i]);
        b->out = J->device_dst ? (uint64_t)(uintptr_t)J->job->dst + J->table + J->at
                               : m->stage + staged;
        staged += J->device_dst ? 0 : b->size;
        J->at += b->size;
        put64(J->head + HEAD + ENTRY * (size_t)w->num[i], J->at);
        put64(J->head + HEAD + ENTRY * (size_t)w->num[i] + 8, b->csum);
        if (J->placed && w->num[i] + 1 == J->nblocks)
            placer->fit(placer->arg, J->job->dst, J->job->cap, J->table + J->at);
    }
    CUresult r = ft__cu.MemcpyHtoDAsync(m->desc, w->desc, w->n * sizeof *w->desc, s);
    if (r)
        return ft__cuda_err(r, "codec: the blocks to the GPU");
    CUdeviceptr desc = m->desc, planes = m->planes, cbits = m->cbits;
    void *d[] = {&desc}, *write[] = {&desc, &planes, &cbits};
    int rc;
    if (m->out && (r = ft__cu.StreamWaitEvent(s, m->copied, 0))) /* the stage copied out */
        return ft__cuda_err(r, "codec: the GPU encoder");
    if ((rc = launch(k->clear, w->n, 1, 256, s, d, "codec: GPU encode (clear)")) < 0 ||
        (rc = launch(k->write, w->n, w->parts, CHUNK_THREADS, s, write,
                     "codec: GPU encode (write)")) < 0)
        return rc;
    if (m->out && ((r = ft__cu.EventRecord(m->written, s)) ||
                   (r = ft__cu.StreamWaitEvent(m->out, m->written, 0))))
        return ft__cuda_err(r, "codec: the GPU encoder");
    /* the staged blocks to their host destinations, a run of one job's blocks a copy */
    for (uint32_t i = 0; i < w->n;) {
        ejob *J = &jobs[w->job[i]];
        uint32_t e = i;
        uint64_t bytes = 0;
        for (; e < w->n && w->job[e] == w->job[i]; e++)
            bytes += w->desc[e].size;
        if (!J->device_dst && bytes) {
            uint8_t *to = (uint8_t *)J->job->dst + J->table + J->at - bytes;
            if ((r = ft__cu.MemcpyDtoHAsync(to, w->desc[i].out, bytes, m->out)))
                return ft__cuda_err(r, "codec: the coded bytes to the host");
        }
        i = e;
    }
    r = m->out ? ft__cu.EventRecord(m->copied, m->out) : 0;
    return r ? ft__cuda_err(r, "codec: the GPU encoder") : 0;
}

/* The copy stream and its events, where the stage is used (@p stage). */
static int copy_stream(enc_mem *m, bool stage)
{
    if (!stage)
        return 0;
    CUresult r = ft__cu.StreamCreate(&m->out, FT_CU_STREAM_NON_BLOCKING);
    if (!r && !(r = ft__cu.EventCreate(&m->written, FT_CU_EVENT_DISABLE_TIMING)))
        r = ft__cu.EventCreate(&m->copied, FT_CU_EVENT_DISABLE_TIMING);
    if (!r)
        r = ft__cu.EventRecord(m->copied, m->out); /* (nothing to wait for yet) */
    return r ? ft__cuda_err(r, "codec: a stream for the GPU encoder's copies") : 0;
}

/* The copies done (into @p s's order), the copy stream and events gone. */
static int copy_stream_end(enc_mem *m, CUstream s)
{
    CUresult r = m->out ? ft__cu.StreamWaitEvent(s, m->copied, 0) : 0;
    if (m->out) {
        CUresult q = ft__cu.StreamSynchronize(m->out);
        r = r ? r : q;
        ft__cu.StreamDestroy(m->out);
    }
    if (m->written)
        ft__cu.EventDestroy(m->written);
    if (m->copied)
        ft__cu.EventDestroy(m->copied);
    m->out = NULL;
    return r ? ft__cuda_err(r, "codec: the coded bytes to the host") : 0;
}

/* Job @p i's arguments checked (its block size set where 0); without a destination, its
 * stream is placed by @p placer (where there is one). */
static int job_args(ejob *J, ft_codec_enc_job *job, size_t i, const ft__codec_placer *placer)
{
    uint32_t block = job->block_bytes;
    if ((!job->src && job->nbytes) || (!job->dst && !placer))
        return ft__err(-EINVAL, "codec: NULL argument (job %zu)", i);
    int rc = ft__codec_check_args(job->nbytes, job->elem_size, &block);
    if (rc < 0)
        return rc;
    *J = (ejob){.job = job, .block = block,
                .nblocks = (uint32_t)((job->nbytes + block - 1) / block)};
    J->table = HEAD + ENTRY * (uint64_t)J->nblocks;
    J->placed = !job->dst;
    if (!J->placed && job->cap < J->table)
        return ft__err(-ENOSPC, "codec: %zu bytes of room for job %zu, its header alone needs "
                       "%llu", job->cap, i, (unsigned long long)J->table);
    return 0;
}

/* Job @p i's memory: its source of @p device, its destination host memory or of it. */
static int job_memory(ejob *J, size_t i, int device)
{
    const ft_codec_enc_job *job = J->job;
    int dev = -1;
    bool pinned;
    if (J->placed) /* host memory, placed as its first block is written */
        return 0;
    if (job->nbytes && (ft__cuda_pointer(job->src, &dev, &pinned) != 1 || dev != device))
        return ft__err(-EINVAL, "codec: the source of job %zu is not memory of CUDA device %d",
                       i, device);
    int kind = ft__cuda_pointer(job->dst, &dev, &pinned);
    if (kind < 0 || (kind == 1 && dev != device))
        return ft__err(-EINVAL, "codec: the destination of job %zu is neither host memory nor "
                       "memory of CUDA device %d", i, device);
    J->device_dst = kind == 1;
    J->head = J->device_dst ? malloc(J->table) : job->dst;
    return J->head ? 0 : ft__err(-ENOMEM, "codec: a table of %u blocks", J->nblocks);
}

/* Every job of element size @p esize through waves. */
static int encode_size(ejob *jobs, size_t n, unsigned esize, const enc_mem *m, wave *w,
                       int device, CUstream s, const ft__codec_placer *placer)
{
    enc_kernels k;
    bool any = false;
    for (size_t j = 0; j < n; j++)
        any = any || (jobs[j].job->elem_size == esize && jobs[j].nblocks);
    if (!any)
        return 0;
    int rc = encode_kernels(device, esize, &k);
    size_t j = 0;
    while (rc >= 0) {
        w->n = w->parts = 0;
        w->chunks = w->room = w->copied = 0;
        for (; j < n; j++) {
            ejob *J = &jobs[j];
            if (J->job->elem_size != esize)
                continue;
            while (J->next < J->nblocks && (rc = wave_add(w, jobs, (uint32_t)j, m, s)) == 1)
                ;
            if (rc < 0 || J->next < J->nblocks)
                break;
        }
        if (rc < 0 || !w->n)
            break;
        if ((rc = wave_measure(&k, s, m, w, esize)) < 0 ||
            (rc = wave_write(&k, s, m, w, jobs, placer)) < 0)
            break;
    }
    return rc < 0 ? rc : 0;
}

int64_t ft__codec_encode_cuda_batch(ft_codec_enc_job *jobs, size_t n, int device, void *stream,
                                    const ft__codec_placer *placer)
{
    if (!jobs && n)
        return ft__err(-EINVAL, "codec: NULL argument");
    ejob *ej = calloc(n ? n : 1, sizeof *ej);
    if (!ej)
        return ft__err(-ENOMEM, "codec: %zu jobs", n);
    int rc = 0;
    for (size_t i = 0; i < n && rc >= 0; i++)
        rc = job_args(&ej[i], &jobs[i], i, placer);
    const char *why;
    if (rc >= 0 && ft__cuda_load(&why) < 0)
        rc = ft__err(-ENODEV, "codec: no GPU encode: %s", why);
    bool stage = false, copy = false;
    uint64_t most = 0, room = 0, planes = 0, chunks = 0, blocks = 0;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        if ((rc = job_memory(&ej[i], i, device)) < 0)
            break;
        ejob *J = &ej[i];
        unsigned e = jobs[i].elem_size;
        stage = stage || (!J->device_dst && J->nblocks);
        copy = copy || (J->nblocks && (uintptr_t)jobs[i].src % e);
        most = FT__MAX(most, (uint64_t)J->block + e);
        room += ((uint64_t)J->block + e) * J->nblocks;
        planes += (uint64_t)e * J->nblocks;
        if (J->nblocks) { /* the full blocks and the last */
            uint64_t last = jobs[i].nbytes - (uint64_t)(J->nblocks - 1) * J->block;
            chunks += (J->nblocks - 1) * block_chunks(J->block / e, e) +
                      block_chunks((uint32_t)(last / e), e);
        }
        blocks += J->nblocks;
    }
    wave w = {.desc = calloc(WAVE_PLANES, sizeof *w.desc),
              .job = calloc(WAVE_PLANES, sizeof *w.job), .num = calloc(WAVE_PLANES, 4)};
    if (rc >= 0 && (!w.desc || !w.job || !w.num))
        rc = ft__err(-ENOMEM, "codec: %zu jobs", n);
    CUstream s = (CUstream)stream;
    enc_mem m = {0};
    mem_limits(&m, room, planes, chunks, most);
    bool entered = false;
    if (rc >= 0 && (rc = ft__cuda_enter(device)) >= 0)
        entered = true;
    if (rc >= 0 && blocks)
        rc = ft__cuda_alloc(&m.base, mem_layout(0, stage, copy, &m), s);
    if (rc >= 0 && blocks) {
        mem_layout(m.base, stage, copy, &m);
        rc = copy_stream(&m, stage);
        for (unsigned e = 1; e <= 8 && rc >= 0; e *= 2)
            rc = encode_size(ej, n, e, &m, &w, device, s, placer);
    }
    if (entered) {
        int cr = copy_stream_end(&m, s);
        rc = rc < 0 ? rc : cr;
    }
    int64_t total = 0;
    for (size_t i = 0; i < n && rc >= 0; i++) {
        ejob *J = &ej[i];
        if (J->placed && !J->nblocks) { /* (an empty tensor: its header alone) */
            if ((rc = place_job(J, placer)) < 0)
                break;
            placer->fit(placer->arg, jobs[i].dst, jobs[i].cap, J->table);
        }
        ft__codec_head(J->head, jobs[i].elem_size, jobs[i].nbytes, J->block, J->nblocks);
        CUresult r = J->device_dst ? ft__cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)jobs[i].dst,
                                                             J->head, J->table, s) : 0;
        if (r)
            rc = ft__cuda_err(r, "codec: the coded stream's table");
        jobs[i].size = (int64_t)(J->table + J->at);
        total += jobs[i].size;
    }
    if (entered) {
        if (m.base)
            ft__cuda_free(m.base, s);
        CUresult r = ft__cu.StreamSynchronize(s);
        if (r && rc >= 0)
            rc = ft__cuda_err(r, "codec: the GPU encoder");
        ft__cuda_leave();
    }
    for (size_t i = 0; i < n; i++)
        if (ej[i].device_dst)
            free(ej[i].head); /* (NULL where its check did not get there) */
    free(ej);
    free(w.desc);
    free(w.job);
    free(w.num);
    return rc < 0 ? rc : total;
}

int64_t ft__codec_encode_cuda(const void *src, uint64_t nbytes, unsigned esize,
                              uint32_t block_bytes, void *dst, size_t cap, int device,
                              void *stream)
{
    ft_codec_enc_job job = {src, nbytes, esize, block_bytes, dst, cap, 0};
    int64_t r = ft__codec_encode_cuda_batch(&job, 1, device, stream, NULL);
    return r < 0 ? r : job.size;
}
