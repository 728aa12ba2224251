/*
 * What the codec's encoder (codec_enc.c) and decoder (codec.c) share: the stream format's
 * constants (codec.c describes the format), byte order helpers, and the few functions both
 * sides call.
 */
#ifndef FT_CKPT_CODEC_H
#define FT_CKPT_CODEC_H

#include "ckpt.h"
#include "codec_dev.h"

#include <string.h>

#define MAGIC "FTZ1"
#define HEAD 24
#define MAXLEN FTZ_MAXLEN /* (codec_dev.h: what the GPU decoder shares) */
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
/* Canonical codes of @p len (by length, then symbol). @return 0, or -1 when the lengths
 * over-subscribe the code space (a corrupt table). */
int ft__codec_canonical(const uint8_t len[256], uint16_t code[256]);
/* The element ranges of the @p S streams of a plane of @p n elements: seg[j], seg[j + 1]. */
void ft__codec_split(size_t n, unsigned S, bool round8, size_t seg[STREAMS + 1]);
/* Checks an element size and byte count, and sets *block (0: the default). @return 0 or
 * -EINVAL (with the message). */
int ft__codec_check_args(uint64_t nbytes, unsigned esize, uint32_t *block);

#endif
