/* libFuzzer target: the tensor codec's decoders. Input: a stream (ft_codec_encode's format,
 * or anything); decoded into a buffer of its declared size (capped at 64 MiB) by the host
 * decoder and by the GPU decoder's checks and lane code run on the CPU. */
#include "fastensor.h"
#include "../../src/codec/codec.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ft_ctx *ctx;
    if (!ctx && ft_ctx_create(&ctx, &(ft_config){.threads = 2}) < 0)
        return 0;
    int64_t n = ft_codec_size(data, size);
    if (n < 0 || n > (64 << 20))
        return 0;
    uint8_t *out = malloc(n ? (size_t)n : 1);
    if (!out)
        return 0;
    int64_t r = ft_codec_decode(ctx, data, size, out, (size_t)n);
    if (r >= 0 && r != n) /* a decode is all of it or an error */
        __builtin_trap();
    int64_t l = ft__codec_decode_lanes(data, size, out, (size_t)n);
    if ((l >= 0 && l != n) || (r >= 0 && l < 0)) /* what the host decodes, the lanes do */
        __builtin_trap();
    free(out);
    return 0;
}
