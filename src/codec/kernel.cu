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
 * The encoder (enc_dev.h's steps): count (a CUDA block per codec block, its warps into four
 * shared histograms per plane), code (a thread per plane), streams (a warp per plane, a lane
 * per stream), checksum (eight lanes per block), table (one thread), place (a CUDA block per
 * codec block).
 */
#define FTZ_COUNT_THREADS 256
#define FTZ_SUBHIST 4

template <unsigned E>
__device__ __forceinline__ void enc_count(const ftz_eblock *__restrict__ blocks,
                                          ftz_eplane *__restrict__ planes)
{
    __shared__ uint32_t hist[FTZ_SUBHIST][E * 256];
    for (unsigned v = threadIdx.x; v < FTZ_SUBHIST * E * 256; v += blockDim.x)
        (&hist[0][0])[v] = 0;
    __syncthreads();
    const ftz_eblock *b = &blocks[blockIdx.x];
    uint32_t *h = hist[(threadIdx.x / 32) % FTZ_SUBHIST];
    for (uint32_t i = threadIdx.x; i < b->n; i += blockDim.x)
        ftz_count_elem(b->src, i, E, h);
    __syncthreads();
    ftz_eplane *p = &planes[(size_t)blockIdx.x * E];
    for (unsigned v = threadIdx.x; v < E * 256; v += blockDim.x) {
        uint32_t c = 0;
        for (unsigned s = 0; s < FTZ_SUBHIST; s++)
            c += hist[s][v];
        p[v / 256].count[v % 256] = c;
    }
    if (threadIdx.x < E)
        p[threadIdx.x].n = b->n;
}

template <unsigned E>
__device__ __forceinline__ void enc_streams(ftz_eblock *__restrict__ blocks,
                                            ftz_eplane *__restrict__ planes)
{
    __shared__ uint64_t bits[E][FTZ_LANES], last[E][FTZ_LANES];
    __shared__ uint32_t start[E][FTZ_LANES], off[E];
    unsigned k = threadIdx.x / FTZ_LANES, lane = threadIdx.x % FTZ_LANES;
    ftz_eblock *b = &blocks[blockIdx.x];
    ftz_eplane *p = &planes[(size_t)blockIdx.x * E + k];
    uint32_t from, to;
    ftz_lane_range(b->n, lane, &from, &to);
    uint64_t l = 0;
    bits[k][lane] = p->mode == FTZ_HUFF ? ftz_stream_bits(b->src, E, k, from, to, p->cl, &l) : 0;
    last[k][lane] = l;
    __syncthreads();
    if (lane == 0)
        ftz_plane_finish(p, bits[k], last[k], start[k]);
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t at = 0;
        for (unsigned j = 0; j < E; j++) {
            off[j] = at;
            at += planes[(size_t)blockIdx.x * E + j].size;
        }
        b->size = at;
    }
    __syncthreads();
    ftz_plane_write(p, b->src, E, k, b->slot + off[k], lane, bits[k][lane], start[k][lane]);
}

#define ENC_KERNELS(E)                                                                        \
    extern "C" __global__ void __launch_bounds__(FTZ_COUNT_THREADS)                           \
    ftz_enc_count_##E(const ftz_eblock *__restrict__ blocks, ftz_eplane *__restrict__ planes) \
    {                                                                                         \
        enc_count<E>(blocks, planes);                                                         \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(FTZ_LANES * E)                               \
    ftz_enc_streams_##E(ftz_eblock *__restrict__ blocks, ftz_eplane *__restrict__ planes)     \
    {                                                                                         \
        enc_streams<E>(blocks, planes);                                                       \
    }
ENC_KERNELS(1)
ENC_KERNELS(2)
ENC_KERNELS(4)
ENC_KERNELS(8)

extern "C" __global__ void ftz_enc_code(ftz_eplane *__restrict__ planes, unsigned nplanes)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nplanes)
        ftz_plane_code(&planes[i]);
}

extern "C" __global__ void __launch_bounds__(FTZ_LANES)
ftz_enc_csum(ftz_eblock *__restrict__ blocks, unsigned E)
{
    __shared__ uint64_t acc[8];
    ftz_eblock *b = &blocks[blockIdx.x];
    uint64_t len = (uint64_t)b->n * E;
    if (len <= 240) {
        if (threadIdx.x == 0)
            b->csum = ftz_xxh3_short(b->src, (uint32_t)len);
        return;
    }
    if (threadIdx.x < 8)
        acc[threadIdx.x] = ftz_xxh3_lane(b->src, len, threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0)
        b->csum = ftz_xxh3_merge(acc, len);
}

/* The header and table at @p out, the stream's bytes at @p total. */
extern "C" __global__ void ftz_enc_head(ftz_eblock *__restrict__ blocks, unsigned nblocks,
                                         unsigned E, uint64_t nbytes, unsigned block_bytes,
                                         uint64_t out, uint64_t *total)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *total = ftz_enc_table(blocks, nblocks, E, nbytes, block_bytes, out);
}

extern "C" __global__ void ftz_enc_place(const ftz_eblock *__restrict__ blocks, uint64_t out)
{
    const ftz_eblock *b = &blocks[blockIdx.x];
    ftz_copy_bytes(b->slot, out + b->at, b->size, threadIdx.x, blockDim.x);
}
