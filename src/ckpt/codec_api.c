/* The public codec calls (ft_codec_*): the codec layer's work on the context's threads. */
#include "ckpt.h"
#include "../codec/codec.h"

#include <errno.h>

int64_t ft_codec_encode(ft_ctx *ctx, const void *src, uint64_t nbytes, unsigned elem_size,
                        uint32_t block_bytes, unsigned flags, void *dst, size_t cap)
{
    if (!ctx)
        return ft__err(-EINVAL, "codec: NULL argument");
    return ft__codec_encode(ctx->pool, src, nbytes, elem_size, block_bytes, flags, dst, cap);
}

int64_t ft_codec_encode_cuda(ft_ctx *ctx, const void *src, uint64_t nbytes, unsigned elem_size,
                             uint32_t block_bytes, void *dst, size_t cap, int device,
                             void *stream)
{
    if (!ctx)
        return ft__err(-EINVAL, "codec: NULL argument");
    return ft__codec_encode_cuda(src, nbytes, elem_size, block_bytes, dst, cap, device, stream);
}

int64_t ft_codec_encode_cuda_batch(ft_ctx *ctx, ft_codec_enc_job *jobs, size_t n, int device,
                                   void *stream)
{
    if (!ctx)
        return ft__err(-EINVAL, "codec: NULL argument");
    return ft__codec_encode_cuda_batch(jobs, n, device, stream, NULL);
}

int64_t ft_codec_decode(ft_ctx *ctx, const void *src, size_t len, void *dst, size_t cap)
{
    if (!ctx)
        return ft__err(-EINVAL, "codec: NULL argument");
    return ft__codec_decode(ctx->pool, src, len, dst, cap);
}

int64_t ft_codec_decode_cuda(ft_ctx *ctx, const ft_codec_job *jobs, size_t n, int device,
                             void *stream)
{
    if (!ctx)
        return ft__err(-EINVAL, "codec: NULL argument");
    return ft__codec_decode_cuda(ctx->pool, jobs, n, device, stream);
}
