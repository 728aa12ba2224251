/*
 * The tensor codec, a layer of its own above base and gpu (ckpt uses it; the public
 * ft_codec_* calls are ckpt's codec_api.c over these): what the encoder (encode.c), the
 * decoder (decode.c) and the GPU decoder (gpu.c, kernel.cu) share: the stream format's
 * constants (decode.c describes the format), byte order helpers, and the codec's calls, which
 * run their blocks on a thread pool.
 */
#ifndef FT_CODEC_CODEC_H
#define FT_CODEC_CODEC_H

#include "../base/base.h"
#include "dev.h"

#include <string.h>

#define MAGIC "FTZ1"
#define HEAD 24
#define MAXLEN FTZ_MAXLEN /* (dev.h: what the GPU decoder shares) */
#define TABLE FTZ_TABLE
#define DEFAULT_BLOCK (1u << 20)
#define MODE_RAW FTZ_RAW
#define MODE_CONST FTZ_CONST
#define MODE_HUFF FTZ_HUFF
#define STREAMS FTZ_LANES /* streams per coded plane, as written: one per lane of a warp */
#define HUFF_HEAD(S) (128 + 4 * (size_t)(S))
#define ENTRY 16 /* a block's entry in the table: end, checksum */

static inline void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static inline uint64_t load_be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

/* This thread's scratch of at least @p n bytes, or NULL (no memory). Valid until the next
 * call on this thread. */
uint8_t *ft__codec_scratch(size_t n);
/* The stream's header (its first HEAD bytes) at @p d. */
void ft__codec_head(uint8_t *d, unsigned esize, uint64_t nbytes, uint32_t block_bytes,
                    uint32_t nblocks);
/* Canonical codes of @p len (by length, then symbol). @return 0, or -1 when the lengths
 * over-subscribe the code space (a corrupt table). */
int ft__codec_canonical(const uint8_t len[256], uint16_t code[256]);
/* The element ranges of the @p S streams of a plane of @p n elements: seg[j], seg[j + 1]. */
void ft__codec_split(size_t n, unsigned S, bool round8, size_t seg[STREAMS + 1]);
/* Checks an element size and byte count, and sets *block (0: the default). @return 0 or
 * -EINVAL (with the message). */
int ft__codec_check_args(uint64_t nbytes, unsigned esize, uint32_t *block);

/** ft_codec_encode's work, its blocks on @p pool's threads. */
int64_t ft__codec_encode(ft__pool *pool, const void *src, uint64_t nbytes, unsigned elem_size,
                         uint32_t block_bytes, unsigned flags, void *dst, size_t cap);
/** ft_codec_decode's work, its blocks on @p pool's threads. */
int64_t ft__codec_decode(ft__pool *pool, const void *src, size_t len, void *dst, size_t cap);
/** ft_codec_decode_cuda's work; the host's part (checking the streams) on @p pool. */
int64_t ft__codec_decode_cuda(ft__pool *pool, const ft_codec_job *jobs, size_t n, int device,
                              void *stream);
/**
 * Where the GPU encoder puts the streams of jobs without a destination (dst NULL): host
 * memory the caller packs them into. place() gives room of @p cap bytes (ft_codec_bound) for
 * a job's stream as its first block is written (NULL: -ENOMEM); fit() says, once the stream
 * is whole, that it took @p size bytes of it (the rest of the room is the caller's again: no
 * copy of the call writes there). The jobs are placed one after another, in the order the
 * encoder takes them, each fitted before the next is placed; dst and cap are set in the job.
 */
typedef struct ft__codec_placer {
    void *(*place)(void *arg, uint64_t cap);
    void (*fit)(void *arg, void *dst, uint64_t cap, uint64_t size);
    void *arg;
} ft__codec_placer;

/** ft_codec_encode_cuda_batch's work; jobs without a destination placed by @p placer. */
int64_t ft__codec_encode_cuda_batch(ft_codec_enc_job *jobs, size_t n, int device,
                                    void *stream, const ft__codec_placer *placer);
/** ft_codec_encode_cuda's work (a batch of one). */
int64_t ft__codec_encode_cuda(const void *src, uint64_t nbytes, unsigned esize,
                              uint32_t block_bytes, void *dst, size_t cap, int device,
                              void *stream);
struct ftz_block;
/**
 * Check the codec stream @p src (@p len bytes) as a GPU decode reads it and describe its
 * blocks in @p out (NULL: only the header is checked and the blocks counted): block
 * addresses from @p src_addr (where the stream's bytes will be) and @p dst_addr (its decoded
 * bytes). *max_huff, with @p out: raised to the most coded planes of one of its blocks (the
 * caller starts it at 0; the kernel's shared memory holds that many tables). @return the
 * number of blocks, or -EBADMSG (with a message naming the block), -ENOSPC (@p cap below the
 * decoded size), -ENOTSUP.
 */
int64_t ft__codec_plan(const void *src, size_t len, uint64_t src_addr, uint64_t dst_addr,
                       size_t cap, struct ftz_block *out, unsigned *max_huff);
/** Decode the stream as the GPU kernel would, lane by lane, on the CPU (tests). */
int64_t ft__codec_decode_lanes(const void *src, size_t len, void *dst, size_t cap);
/** Encode as the GPU encoder's kernels would, thread by thread, on the CPU (tests): the
 * stream ft__codec_encode writes. @return its bytes, -ENOSPC (@p cap too small), -ENOMEM,
 * -EINVAL. */
int64_t ft__codec_encode_lanes(const void *src, uint64_t nbytes, unsigned esize,
                               uint32_t block_bytes, void *dst, size_t cap);

#endif
