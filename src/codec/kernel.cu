/*
 * The codec's GPU decoder (dev.h): one warp per block. The warp builds the decode table
 * of each coded plane in shared memory (lane 0 sorts the code, all lanes fill), then each lane
 * decodes its element range. One kernel per element size (its loops unrolled, its registers
 * its own). Built by nvcc into a fatbin that fatbin.S embeds in the library; the
 * library loads it through the driver (cuModuleLoadData) when a decode asks.
 */
#include "dev.h"

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
