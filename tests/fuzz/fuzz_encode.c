/* libFuzzer target: the tensor codec's encoders. Input: byte 0 picks the element size (bits
 * 0-1: 1, 2, 4, 8) and the block size (bits 2-3: the default, 64 elements, 4 KiB, 65
 * elements); the rest, cut to whole elements, is the data. The CPU encoder's stream must
 * decode to the data, and the GPU encoder's steps run on the CPU (ft__codec_encode_lanes)
 * must write the very same stream. */
#include "fastensor.h"
#include "../../src/codec/codec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ft_ctx *ctx;
    if (size < 1 || (!ctx && ft_ctx_create(&ctx, &(ft_config){.threads = 2}) < 0))
        return 0;
    unsigned e = 1u << (data[0] & 3);
    const uint32_t blocks[4] = {0, 64 * e, 4096, 65 * e};
    uint32_t block = blocks[data[0] >> 2 & 3];
    size_t n = (size - 1) / e * e;
    const uint8_t *src = data + 1;
    size_t cap = ft_codec_bound(n, e, block);
    uint8_t *a = malloc(cap), *b = malloc(cap), *back = malloc(n + 1);
    if (!a || !b || !back)
        goto out;
    int64_t m = ft_codec_encode(ctx, src, n, e, block, 0, a, cap);
    if (m < 0) /* any bytes encode */
        __builtin_trap();
    if (ft_codec_decode(ctx, a, (size_t)m, back, n) != (int64_t)n || memcmp(back, src, n))
        __builtin_trap();
    int64_t l = ft__codec_encode_lanes(src, n, e, block, b, cap);
    if (l != m || memcmp(a, b, (size_t)m))
        __builtin_trap();
out:
    free(a);
    free(b);
    free(back);
    return 0;
}
