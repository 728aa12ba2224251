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

/* Steps 1-4 for block @p b on the CPU, as the kernels run them (enc_dev.h). */
static void encode_block_lanes(ftz_eblock *b, ftz_eplane *planes, unsigned E)
{
    uint32_t hist[8 * 256];
    memset(hist, 0, sizeof hist);
    for (uint32_t i = 0; i < b->n; i++)
        ftz_count_elem(b->src, i, E, hist);
    uint64_t bits[8][FTZ_LANES], last[8][FTZ_LANES];
    uint32_t start[8][FTZ_LANES], at = 0;
    for (unsigned k = 0; k < E; k++) {
        ftz_eplane *p = &planes[k];
        memcpy(p->count, hist + 256 * k, sizeof p->count);
        p->n = b->n;
        ftz_plane_code(p);
        for (unsigned lane = 0; lane < FTZ_LANES; lane++) {
            uint32_t from, to;
            ftz_lane_range(b->n, lane, &from, &to);
            bits[k][lane] = p->mode == FTZ_HUFF
                                ? ftz_stream_bits(b->src, E, k, from, to, p->cl, &last[k][lane])
                                : 0;
        }
        ftz_plane_finish(p, bits[k], last[k], start[k]);
    }
    for (unsigned k = 0; k < E; k++) {
        for (unsigned lane = 0; lane < FTZ_LANES; lane++)
            ftz_plane_write(&planes[k], b->src, E, k, b->slot + at, lane, bits[k][lane],
                            start[k][lane]);
        at += planes[k].size;
    }
    b->size = at;
    uint64_t len = (uint64_t)b->n * E;
    if (len <= 240) {
        b->csum = ftz_xxh3_short(b->src, (uint32_t)len);
    } else {
        uint64_t acc[8];
        for (unsigned i = 0; i < 8; i++)
            acc[i] = ftz_xxh3_lane(b->src, len, i);
        b->csum = ftz_xxh3_merge(acc, len);
    }
}

int64_t ft__codec_encode_lanes(const void *src, uint64_t nbytes, unsigned esize,
                               uint32_t block_bytes, void *dst, size_t cap)
{
    int rc = ft__codec_check_args(nbytes, esize, &block_bytes);
    if (rc < 0)
        return rc;
    uint32_t nblocks = (uint32_t)((nbytes + block_bytes - 1) / block_bytes);
    size_t room = (size_t)block_bytes + esize;
    /* as the kernels find them: the elements in memory allocated in whole aligned words */
    uint8_t *copy = aligned_alloc(256, (nbytes + 256) & ~(uint64_t)255);
    uint8_t *slots = malloc(room * (nblocks ? nblocks : 1));
    uint8_t *out = malloc(HEAD + ENTRY * (size_t)nblocks + room * (nblocks ? nblocks : 1));
    ftz_eblock *blocks = calloc(nblocks ? nblocks : 1, sizeof *blocks);
    ftz_eplane *planes = calloc(esize, sizeof *planes);
    int64_t r = -ENOMEM;
    if (!copy || !slots || !out || !blocks || !planes)
        goto done;
    memcpy(copy, src, nbytes);
    for (uint32_t b = 0; b < nblocks; b++) {
        uint64_t off = (uint64_t)b * block_bytes;
        blocks[b] = (ftz_eblock){.src = (uint64_t)(uintptr_t)(copy + off),
                                 .slot = (uint64_t)(uintptr_t)(slots + room * b),
                                 .n = (uint32_t)(FT__MIN(block_bytes, nbytes - off) / esize)};
        encode_block_lanes(&blocks[b], planes, esize);
    }
    uint64_t total = ftz_enc_table(blocks, nblocks, esize, nbytes, block_bytes,
                                   (uint64_t)(uintptr_t)out);
    uint64_t table = HEAD + ENTRY * (uint64_t)nblocks;
    for (uint32_t b = 0; b < nblocks; b++)
        ftz_copy_bytes(blocks[b].slot, (uint64_t)(uintptr_t)out + table + blocks[b].at,
                       blocks[b].size, 0, 1);
    r = total > cap ? -ENOSPC : (int64_t)total;
    if (r > 0)
        memcpy(dst, out, total);
done:
    free(copy);
    free(slots);
    free(out);
    free(blocks);
    free(planes);
    return r;
}

/* ---- on the GPU ---- */

extern const unsigned char ft__codec_fatbin[], ft__codec_fatbin_end[];

/* Codec blocks encoded per wave: the device memory an encode takes is two waves' worth of
 * blocks (their worst-case slots, then the compacted bytes), whatever the input's size. */
#define WAVE_BYTES (64ull << 20)
#define COUNT_THREADS 256 /* kernel.cu's FTZ_COUNT_THREADS */

typedef struct enc_kernels {
    CUfunction count, code, streams, csum, head, place;
} enc_kernels;

static int encode_kernels(int device, unsigned esize, enc_kernels *k)
{
    static const char *const count[4] = {"ftz_enc_count_1", "ftz_enc_count_2",
                                         "ftz_enc_count_4", "ftz_enc_count_8"};
    static const char *const streams[4] = {"ftz_enc_streams_1", "ftz_enc_streams_2",
                                           "ftz_enc_streams_4", "ftz_enc_streams_8"};
    if (&ft__codec_fatbin_end[0] == &ft__codec_fatbin[0])
        return ft__err(-ENOSYS, "codec: this library was built without nvcc, so it has no GPU "
                       "encoder (encode on the host: ft_codec_encode)");
    unsigned w = esize == 1 ? 0 : esize == 2 ? 1 : esize == 4 ? 2 : 3;
    struct { const char *name; CUfunction *fn; } want[] = {
        {count[w], &k->count}, {"ftz_enc_code", &k->code}, {streams[w], &k->streams},
        {"ftz_enc_csum", &k->csum}, {"ftz_enc_head", &k->head}, {"ftz_enc_place", &k->place}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int rc = ft__cuda_function(device, ft__codec_fatbin, want[i].name, want[i].fn);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int launch(CUfunction fn, unsigned grid, unsigned threads, CUstream s, void **params,
                  const char *what)
{
    CUresult r = ft__cu.LaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, s, params, NULL);
    return r ? ft__cuda_err(r, what) : 0;
}

/* A wave's device memory, from @p mem: its block descriptions, their planes, the blocks'
 * worst-case slots, the compacted blocks (where the destination is host memory), the layout
 * kernel's total and scratch (a wave's own header and table, which the host does not use: it
 * writes the stream's). */
typedef struct wave_mem {
    CUdeviceptr desc, planes, slots, out, total, scratch;
} wave_mem;

static uint64_t align256(uint64_t x)
{
    return (x + 255) & ~255ull;
}

/* The layout of a wave of @p n blocks at @p mem; @return its bytes. */
static uint64_t wave_layout(CUdeviceptr mem, uint32_t n, unsigned esize, uint64_t room,
                            wave_mem *w)
{
    w->desc = mem;
    w->planes = w->desc + align256(n * sizeof(ftz_eblock));
    w->slots = w->planes + align256((uint64_t)n * esize * sizeof(ftz_eplane));
    w->out = w->slots + room * n;
    w->total = align256(w->out + room * n);
    w->scratch = w->total + 256;
    return w->scratch + HEAD + ENTRY * (uint64_t)n - mem;
}

/* One wave: blocks [first, first + n) of the input at @p src (device), encoded in their
 * slots, their descriptions back in @p desc (host), each with its place from the wave's
 * start; the wave's bytes in *bytes. */
static int encode_wave(const enc_kernels *k, CUstream s, CUdeviceptr src, uint64_t nbytes,
                       unsigned esize, uint32_t block, uint32_t first, uint32_t n,
                       const wave_mem *w, ftz_eblock *desc, uint64_t *bytes)
{
    uint64_t room = (uint64_t)block + esize;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)(first + i) * block;
        desc[i] = (ftz_eblock){.src = src + off, .slot = w->slots + room * i,
                               .n = (uint32_t)(FT__MIN((uint64_t)block, nbytes - off) / esize)};
    }
    CUresult r = ft__cu.MemcpyHtoDAsync(w->desc, desc, n * sizeof *desc, s);
    if (r)
        return ft__cuda_err(r, "codec: the blocks to the GPU");
    unsigned nplanes = n * esize;
    CUdeviceptr d_desc = w->desc, d_planes = w->planes, scratch = w->scratch, total = w->total;
    void *blocks_planes[] = {&d_desc, &d_planes};
    void *planes[] = {&d_planes, &nplanes};
    void *csum[] = {&d_desc, &esize};
    void *head[] = {&d_desc, &n, &esize, &nbytes, &block, &scratch, &total};
    int rc;
    if ((rc = launch(k->count, n, COUNT_THREADS, s, blocks_planes, "codec: GPU encode (count)")) < 0 ||
        (rc = launch(k->code, (nplanes + 63) / 64, 64, s, planes, "codec: GPU encode (code)")) < 0 ||
        (rc = launch(k->streams, n, FTZ_LANES * esize, s, blocks_planes,
                     "codec: GPU encode (streams)")) < 0 ||
        (rc = launch(k->csum, n, FTZ_LANES, s, csum, "codec: GPU encode (checksums)")) < 0 ||
        (rc = launch(k->head, 1, 1, s, head, "codec: GPU encode (layout)")) < 0)
        return rc;
    if ((r = ft__cu.MemcpyDtoHAsync(desc, w->desc, n * sizeof *desc, s)) ||
        (r = ft__cu.StreamSynchronize(s)))
        return ft__cuda_err(r, "codec: the GPU encoder");
    *bytes = n ? desc[n - 1].at + desc[n - 1].size : 0;
    return 0;
}

/* The wave's blocks (described at w->desc) compacted at @p out (device memory). */
static int place_wave(const enc_kernels *k, CUstream s, const wave_mem *w, uint32_t n,
                      CUdeviceptr out)
{
    CUdeviceptr d_desc = w->desc;
    void *place[] = {&d_desc, &out};
    return launch(k->place, n, 256, s, place, "codec: GPU encode (place)");
}

/* The arguments of ft__codec_encode_cuda checked (*block set where 0), CUDA loaded; *kind: 1
 * where @p dst is device memory, 0 host memory. */
static int encode_args(const void *src, uint64_t nbytes, unsigned esize, uint32_t *block,
                       const void *dst, int device, int *kind)
{
    if ((!src && nbytes) || !dst)
        return ft__err(-EINVAL, "codec: NULL argument");
    int rc = ft__codec_check_args(nbytes, esize, block);
    if (rc < 0)
        return rc;
    const char *why;
    if (ft__cuda_load(&why) < 0)
        return ft__err(-ENODEV, "codec: no GPU encode: %s", why);
    int dev = -1;
    bool pinned;
    if (nbytes && (ft__cuda_pointer(src, &dev, &pinned) != 1 || dev != device))
        return ft__err(-EINVAL, "codec: the source is not memory of CUDA device %d", device);
    *kind = ft__cuda_pointer(dst, &dev, &pinned);
    if (*kind < 0 || (*kind == 1 && dev != device))
        return ft__err(-EINVAL, "codec: the destination is neither host memory nor memory of "
                       "CUDA device %d", device);
    return 0;
}

int64_t ft__codec_encode_cuda(const void *src, uint64_t nbytes, unsigned esize,
                              uint32_t block_bytes, void *dst, size_t cap, int device,
                              void *stream)
{
    int kind = 0;
    int rc = encode_args(src, nbytes, esize, &block_bytes, dst, device, &kind);
    if (rc < 0)
        return rc;
    uint32_t nblocks = (uint32_t)((nbytes + block_bytes - 1) / block_bytes);
    uint64_t table = HEAD + ENTRY * (uint64_t)nblocks;
    if (cap < table)
        return ft__err(-ENOSPC, "codec: %zu bytes of room, the header alone needs %llu", cap,
                       (unsigned long long)table);
    if ((rc = ft__cuda_enter(device)) < 0)
        return rc;
    enc_kernels k;
    CUstream s = (CUstream)stream;
    CUdeviceptr mem = 0, ddst = (CUdeviceptr)(uintptr_t)dst;
    uint64_t room = (uint64_t)block_bytes + esize;
    uint32_t wave = (uint32_t)FT__MAX(1ull, FT__MIN((uint64_t)nblocks, WAVE_BYTES / room));
    ftz_eblock *desc = calloc(wave, sizeof *desc);
    /* the header and table: at the destination, or built here for a device destination */
    uint8_t *d = kind == 1 ? malloc(table) : dst;
    uint64_t at = 0;
    if (!desc || !d) {
        rc = ft__err(-ENOMEM, "codec: %u blocks", nblocks);
        goto out;
    }
    wave_mem w;
    uint64_t scratch = wave_layout(0, wave, esize, room, &w);
    if ((rc = encode_kernels(device, esize, &k)) < 0 ||
        (nblocks && (rc = ft__cuda_alloc(&mem, scratch, s)) < 0))
        goto out;
    ft__codec_head(d, esize, nbytes, block_bytes, nblocks);
    for (uint32_t first = 0; first < nblocks; first += wave) {
        uint32_t n = FT__MIN(wave, nblocks - first);
        uint64_t bytes = 0;
        wave_layout(mem, n, esize, room, &w);
        if ((rc = encode_wave(&k, s, (CUdeviceptr)(uintptr_t)src, nbytes, esize, block_bytes,
                              first, n, &w, desc, &bytes)) < 0)
            goto out;
        if (table + at + bytes > cap) {
            rc = ft__err(-ENOSPC, "codec: %zu bytes of room are too few", cap);
            goto out;
        }
        for (uint32_t i = 0; i < n; i++) {
            put64(d + HEAD + ENTRY * (size_t)(first + i), at + desc[i].at + desc[i].size);
            put64(d + HEAD + ENTRY * (size_t)(first + i) + 8, desc[i].csum);
        }
        /* placed at the device destination, or compacted and copied to the host */
        if ((rc = place_wave(&k, s, &w, n, kind == 1 ? ddst + table + at : w.out)) < 0)
            goto out;
        CUresult r = kind == 1 ? 0 : ft__cu.MemcpyDtoHAsync(d + table + at, w.out, bytes, s);
        if (r) {
            rc = ft__cuda_err(r, "codec: the coded bytes to the host");
            goto out;
        }
        at += bytes;
    }
    CUresult r = kind == 1 ? ft__cu.MemcpyHtoDAsync(ddst, d, table, s) : 0;
    if (!r)
        r = ft__cu.StreamSynchronize(s);
    if (r)
        rc = ft__cuda_err(r, "codec: the coded stream");
out:
    if (mem) {
        ft__cuda_free(mem, s);
        CUresult fr = ft__cu.StreamSynchronize(s);
        if (fr && rc >= 0)
            rc = ft__cuda_err(fr, "codec: the GPU encoder");
    }
    if (kind == 1)
        free(d);
    free(desc);
    ft__cuda_leave();
    return rc < 0 ? rc : (int64_t)(table + at);
}
