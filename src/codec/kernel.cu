/*
 * The codec's GPU kernels: the decoder (dev.h) and the encoder (enc_dev.h).
 *
 * The decoder: one warp per block. The warp builds the decode table
 * of each coded plane in shared memory (lane 0 sorts the code, all lanes fill), then each lane
 * decodes its element range. One kernel per element size (its loops unrolled, its registers
 * its own). Built by nvcc into a fatbin that fatbin.S embeds in the library; the
 * library loads it through the driver (cuModuleLoadData) when a decode asks.
 */
#include "dev.h"
#include "enc_dev.h"

template <unsigned E>
__device__ __forceinline__ void decode(const ftz_block *__restrict__ blocks, unsigned max_huff)
{
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *tables = (uint16_t *)smem;
    ftz_canon *canon = (ftz_canon *)(smem + (size_t)max_huff * FTZ_TABLE * 2);
    const ftz_block *d = &blocks[blockIdx.x];
    unsigned lane = threadIdx.x, h = 0;
#pragma unroll
    for (unsigned k = 0; k < E; k++) {
        if (d->mode[k] != FTZ_HUFF)
            continue;
        if (lane == 0)
            ftz_canon_build(d->src + d->off[k], canon);
        __syncwarp();
        ftz_table_fill(canon, tables + FTZ_TABLE * h++, lane);
        __syncwarp();
    }
    ftz_lane(d, tables, lane, E);
}

#define KERNEL(E)                                                                             \
    extern "C" __global__ void __launch_bounds__(FTZ_LANES)                                   \
    ftz_decode_##E(const ftz_block *__restrict__ blocks, unsigned max_huff)                   \
    {                                                                                         \
        decode<E>(blocks, max_huff);                                                          \
    }
KERNEL(1)
KERNEL(2)
KERNEL(4)
KERNEL(8)

/*
 * The encoder (enc_dev.h's steps): count (a CUDA block per codec block: the block through
 * shared memory in tiles, its warps into shared histograms, eight lanes hashing), code (a
 * CUDA block per plane), bits (a thread per chunk of a stream, every plane of it), layout
 * (a CUDA block per codec block, a warp per stream in turns), clear (the blocks' places
 * zeroed), write (a thread per chunk again). The code tables sit in shared memory.
 */
#define FTZ_COUNT_THREADS 256
#define FTZ_CHUNK_THREADS 256
#define FTZ_LAYOUT_THREADS 1024

/* Loader @p i's 64 bytes of tile @p t of the block at @p src (@p len bytes) in @p r (zero
 * past the end), through aligned words that hold them. @return how many are the block's. */
__device__ __forceinline__ unsigned tile_piece(uint64_t src, uint64_t len, uint64_t t,
                                               unsigned i, uint64_t r[8])
{
    uint64_t o = t * FTZ_TILE + 64ull * i;
    unsigned valid = o < len ? (unsigned)min(64ull, len - o) : 0;
    uint64_t at = src + o;
    if (valid == 64 && !(at & 15)) {
        const ulonglong2 *v = (const ulonglong2 *)(uintptr_t)at;
#pragma unroll
        for (unsigned j = 0; j < 4; j++) {
            ulonglong2 x = __ldg(v + j);
            r[2 * j] = x.x;
            r[2 * j + 1] = x.y;
        }
        return valid;
    }
#pragma unroll
    for (unsigned j = 0; j < 8; j++) {
        unsigned pv = valid > 8 * j ? min(8u, valid - 8 * j) : 0;
        if (pv == 8) {
            r[j] = ftz_ld64u(at + 8 * j);
        } else {
            r[j] = 0;
            for (unsigned b = 0; b < pv; b++)
                r[j] |= (uint64_t)ftz_ld8(at + 8 * j + b) << (8 * b);
        }
    }
    return valid;
}

/*
 * Step 1 for block blockIdx.x: warp 0 hashes (eight lanes, one xxh3 accumulator each) while
 * the other warps load the next tile into the other half of a double buffer and count it
 * (each its 64 bytes, into per-warp histograms), the tile after it already on its way into
 * their registers.
 */
template <unsigned E>
__device__ __forceinline__ void enc_count(ftz_eblock *__restrict__ blocks,
                                          ftz_eplane *__restrict__ planes)
{
    constexpr unsigned COPIES = E >= 8 ? 2 : E == 4 ? 4 : 7;
    __shared__ uint32_t hist[COPIES][E * 256];
    __shared__ __align__(16) uint64_t tile[2][FTZ_TILE / 8];
    __shared__ uint64_t acc8[8];
    for (unsigned v = threadIdx.x; v < COPIES * E * 256; v += blockDim.x)
        (&hist[0][0])[v] = 0;
    ftz_eblock *b = &blocks[blockIdx.x];
    const uint64_t len = (uint64_t)b->n * E;
    const uint64_t nx = len > 240 ? (len - 1) / 1024 : 0, ntiles = (len + FTZ_TILE - 1) / FTZ_TILE;
    const unsigned warp = threadIdx.x / 32, loader = threadIdx.x - 32;
    const bool hash = threadIdx.x < 8 && len > 240;
    uint32_t *h = hist[(warp + COPIES - 1) % COPIES];
    uint64_t keys[17], acc = 0, r[8];
    unsigned valid = 0;
    if (hash)
        acc = ftz_xxh3_init(threadIdx.x, keys);
    if (warp)
        valid = tile_piece(b->src, len, 0, loader, r);
    __syncthreads(); /* (the histograms cleared) */
    for (uint64_t t = 0; t <= ntiles; t++) {
        /* tile t - 1 hashed by warp 0 while tile t is stored and counted */
        if (warp == 0) {
            if (hash && t && (FTZ_TILE / 1024) * (t - 1) < nx) {
                uint64_t nb = min((uint64_t)FTZ_TILE / 1024, nx - (FTZ_TILE / 1024) * (t - 1));
                acc = ftz_xxh3_blocks(acc, (uint64_t)(uintptr_t)tile[(t - 1) & 1], nb,
                                      threadIdx.x, keys);
            }
        } else if (t < ntiles) {
#pragma unroll
            for (unsigned i = 0; i < 8; i++) {
                tile[t & 1][8 * loader + i] = r[i];
                ftz_count_word(r[i], valid > 8 * i ? valid - 8 * i : 0, E, h);
            }
            if (t + 1 < ntiles)
                valid = tile_piece(b->src, len, t + 1, loader, r);
        }
        __syncthreads();
    }
    ftz_eplane *p = &planes[(size_t)blockIdx.x * E];
    for (unsigned v = threadIdx.x; v < E * 256; v += blockDim.x) {
        uint32_t c = 0;
#pragma unroll
        for (unsigned s = 0; s < COPIES; s++)
            c += hist[s][v];
        p[v / 256].count[v % 256] = c;
    }
    if (threadIdx.x < E)
        p[threadIdx.x].n = b->n;
    if (hash)
        acc8[threadIdx.x] = ftz_xxh3_tail(acc, b->src, len, threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0)
        b->csum = len > 240 ? ftz_xxh3_merge(acc8, len) : ftz_xxh3_short(b->src, (uint32_t)len);
}

/* The code tables of block blockIdx.x in shared memory: as counted (Huffman planes only)
 * for the bits, as written for the write. @return its chunk (thread) index, or -1. */
template <unsigned E>
__device__ __forceinline__ int chunk_setup(const ftz_eblock *b, const ftz_eplane *p,
                                           uint32_t *tab, bool write)
{
    for (unsigned v = threadIdx.x; v < E * 256; v += blockDim.x) {
        const ftz_eplane *q = &p[v / 256];
        tab[v] = write ? ftz_write_code(q, v % 256) : q->mode == FTZ_HUFF ? q->cl[v % 256] : 0;
    }
    __syncthreads();
    uint32_t t = blockIdx.y * blockDim.x + threadIdx.x;
    return t < FTZ_LANES * ftz_chunks(b->n) ? (int)t : -1;
}

template <unsigned E>
__device__ __forceinline__ void enc_bits(const ftz_eblock *__restrict__ blocks,
                                         const ftz_eplane *__restrict__ planes,
                                         uint32_t *__restrict__ cbits,
                                         uint32_t *__restrict__ lastin)
{
    __shared__ uint32_t tab[E * 256];
    const ftz_eblock *b = &blocks[blockIdx.x];
    int t = chunk_setup<E>(b, &planes[(size_t)blockIdx.x * E], tab, false);
    uint32_t C = ftz_chunks(b->n);
    if (t >= 0)
        ftz_chunk_bits(b, tab, E, t / C, t % C, &cbits[b->chunk0 + (uint64_t)t * E],
                       &lastin[(size_t)blockIdx.x * E * FTZ_LANES]);
}

/* Step 4 for block blockIdx.x: a warp per stream (in turns), its chunks' bits turned into
 * their offsets 32 at a time (a warp scan; ftz_stream_sum's result), then each plane's
 * layout and the block's. */
template <unsigned E>
__device__ __forceinline__ void enc_layout(ftz_eblock *__restrict__ blocks,
                                           ftz_eplane *__restrict__ planes,
                                           uint32_t *__restrict__ cbits,
                                           const uint32_t *__restrict__ lastin)
{
    __shared__ uint64_t bits[E][FTZ_LANES], last[E][FTZ_LANES];
    ftz_eblock *b = &blocks[blockIdx.x];
    ftz_eplane *p = &planes[(size_t)blockIdx.x * E];
    const uint32_t C = ftz_chunks(b->n);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (unsigned st = warp; st < E * FTZ_LANES; st += warps) {
        unsigned k = st / FTZ_LANES, j = st % FTZ_LANES;
        uint32_t from, to;
        ftz_lane_range(b->n, j, &from, &to);
        uint32_t cl = (ftz_last_group(from, to) - from) / FTZ_CHUNK;
        uint32_t *x = &cbits[b->chunk0 + (uint64_t)j * C * E + k];
        uint64_t base = 0;
        for (uint32_t c0 = 0; c0 < C; c0 += 32) {
            uint32_t c = c0 + lane, t = c < C ? x[(uint64_t)c * E] : 0, sum = t;
#pragma unroll
            for (unsigned d = 1; d < 32; d *= 2) {
                uint32_t v = __shfl_up_sync(0xffffffffu, sum, d);
                sum += lane >= d ? v : 0;
            }
            uint64_t at = base + sum - t; /* (exclusive) */
            if (c < C)
                x[(uint64_t)c * E] = (uint32_t)at;
            if (c == cl && from < to)
                last[k][j] = at + lastin[((size_t)blockIdx.x * E + k) * FTZ_LANES + j];
            base += __shfl_sync(0xffffffffu, sum, 31);
        }
        if (lane == 0) {
            bits[k][j] = base;
            if (from >= to)
                last[k][j] = 0;
        }
    }
    __syncthreads();
    if (threadIdx.x < E)
        ftz_plane_finish(&p[threadIdx.x], bits[threadIdx.x], last[threadIdx.x]);
    __syncthreads();
    if (threadIdx.x == 0)
        ftz_block_finish(b, p, E);
}

template <unsigned E>
__device__ __forceinline__ void enc_write(const ftz_eblock *__restrict__ blocks,
                                          const ftz_eplane *__restrict__ planes,
                                          const uint32_t *__restrict__ cbits)
{
    __shared__ uint32_t tab[E * 256];
    const ftz_eblock *b = &blocks[blockIdx.x];
    const ftz_eplane *p = &planes[(size_t)blockIdx.x * E];
    int t = chunk_setup<E>(b, p, tab, true);
    uint32_t C = ftz_chunks(b->n);
    if (t >= 0)
        ftz_chunk_write(b, p, tab, &cbits[b->chunk0 + (uint64_t)t * E], E, t / C, t % C);
}

#define ENC_KERNELS(E)                                                                        \
    extern "C" __global__ void __launch_bounds__(FTZ_COUNT_THREADS)                           \
    ftz_enc_count_##E(ftz_eblock *__restrict__ blocks, ftz_eplane *__restrict__ planes)       \
    {                                                                                         \
        enc_count<E>(blocks, planes);                                                         \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(FTZ_CHUNK_THREADS)                           \
    ftz_enc_bits_##E(const ftz_eblock *__restrict__ blocks,                                   \
                     const ftz_eplane *__restrict__ planes, uint32_t *__restrict__ cbits,     \
                     uint32_t *__restrict__ lastin)                                           \
    {                                                                                         \
        enc_bits<E>(blocks, planes, cbits, lastin);                                           \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(FTZ_LAYOUT_THREADS)                          \
    ftz_enc_layout_##E(ftz_eblock *__restrict__ blocks, ftz_eplane *__restrict__ planes,      \
                       uint32_t *__restrict__ cbits, const uint32_t *__restrict__ lastin)     \
    {                                                                                         \
        enc_layout<E>(blocks, planes, cbits, lastin);                                         \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(FTZ_CHUNK_THREADS)                           \
    ftz_enc_write_##E(const ftz_eblock *__restrict__ blocks,                                  \
                      const ftz_eplane *__restrict__ planes,                                  \
                      const uint32_t *__restrict__ cbits)                                     \
    {                                                                                         \
        enc_write<E>(blocks, planes, cbits);                                                  \
    }
ENC_KERNELS(1)
ENC_KERNELS(2)
ENC_KERNELS(4)
ENC_KERNELS(8)

/* A plane's code, a CUDA block per plane: its used symbols' keys sorted by rank (a thread
 * each), then one thread builds the code in shared memory. */
extern "C" __global__ void __launch_bounds__(256) ftz_enc_code(ftz_eplane *__restrict__ planes)
{
    __shared__ uint64_t keys[256], key[256], weight[511];
    __shared__ uint16_t parent[511];
    __shared__ uint8_t depth[511], len[256];
    __shared__ int go;
    ftz_eplane *p = &planes[blockIdx.x];
    unsigned s = threadIdx.x;
    if (s == 0)
        go = ftz_plane_start(p);
    uint32_t c = p->count[s];
    uint64_t k = c ? ftz_key(c, s) : ~0ull;
    keys[s] = k;
    len[s] = 0;
    __syncthreads();
    if (!go)
        return;
    unsigned rank = 0;
    for (unsigned j = 0; j < 256; j++)
        rank += keys[j] < k;
    if (c)
        key[rank] = k;
    unsigned n = __syncthreads_count(c != 0);
    if (s == 0) {
        ftz_lengths(key, n, len, weight, parent, depth);
        ftz_plane_huff(p, len);
    }
}

/* Each block's place [out, out + size) zeroed (the write ORs the words it shares). */
extern "C" __global__ void ftz_enc_clear(const ftz_eblock *__restrict__ blocks)
{
    const ftz_eblock *b = &blocks[blockIdx.x];
    uint64_t lo = b->out, hi = b->out + b->size;
    uint64_t a = (lo + 15) & ~15ull, z = hi & ~15ull;
    if (z <= a)
        a = z = hi;
    for (uint64_t i = lo + threadIdx.x; i < a; i += blockDim.x)
        *(uint8_t *)(uintptr_t)i = 0;
    for (uint64_t i = a + 16ull * threadIdx.x; i < z; i += 16ull * blockDim.x)
        *(ulonglong2 *)(uintptr_t)i = make_ulonglong2(0, 0);
    for (uint64_t i = (z > lo ? z : lo) + threadIdx.x; i < hi; i += blockDim.x)
        *(uint8_t *)(uintptr_t)i = 0;
}
