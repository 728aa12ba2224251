/*
 * The GPU encoder's block checksum (its step 1, enc_dev.h): xxh3-64 with seed 0 and the
 * default secret, the hash the CPU encoder takes through libxxhash, written once for nvcc and
 * the C compiler. Its eight accumulators are independent until the merge, so eight lanes
 * hash a block, each over whole 1 KiB blocks of the input staged in shared memory
 * (ftz_xxh3_blocks), then the rest from the input itself (ftz_xxh3_tail); inputs of at most
 * 240 bytes take ftz_xxh3_short. test_codec checks it against libxxhash.
 */
#ifndef FT_CODEC_ENC_XXH3_H
#define FT_CODEC_ENC_XXH3_H

#include "dev.h"

#ifdef __CUDACC__
#define FTZ_CONST_DATA static __constant__ const
#else
#define FTZ_CONST_DATA static const
#endif

FTZ_CONST_DATA uint64_t ftz_secret[24] = {
    0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull, 0x1f67b3b7a4a44072ull,
    0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull, 0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull,
    0xcb00c391bb52283cull, 0xa32e531b8b65d088ull, 0x4ef90da297486471ull, 0xd8acdea946ef1938ull,
    0x3f349ce33f76faa8ull, 0x1d4f0bc7c7bbdcf9ull, 0x3159b4cd4be0518aull, 0x647378d9c97e9fc8ull,
    0xc3ebd33483acc5eaull, 0xeb6313faffa081c5ull, 0x49daf0b751dd0d17ull, 0x9e68d429265516d3ull,
    0xfca1477d58be162bull, 0xce31d07ad1b8f88full, 0x280416958f3acb45ull, 0x7e404bbbcafbd7afull};

#define FTZ_P32_1 0x9E3779B1u
#define FTZ_P32_2 0x85EBCA77u
#define FTZ_P32_3 0xC2B2AE3Du
#define FTZ_P64_1 0x9E3779B185EBCA87ull
#define FTZ_P64_2 0xC2B2AE3D27D4EB4Full
#define FTZ_P64_3 0x165667B19E3779F9ull
#define FTZ_P64_4 0x85EBCA77C2B2AE63ull
#define FTZ_P64_5 0x27D4EB2F165667C5ull

/* The secret's 8 bytes at @p off (little-endian, any offset up to 184). */
FTZ_FN uint64_t ftz_sec64(unsigned off)
{
    unsigned w = off / 8, sh = off % 8;
    if (!sh)
        return ftz_secret[w];
    return ftz_secret[w] >> (8 * sh) | ftz_secret[w + 1] << (64 - 8 * sh);
}

FTZ_FN uint32_t ftz_sec32(unsigned off)
{
    return (uint32_t)ftz_sec64(off);
}

/* 8 (4) bytes of the input at @p a, little-endian, through aligned words that each hold at
 * least one of them (none past the input's end: dev.h's rule). */
FTZ_FN uint64_t ftz_rd64(uint64_t a)
{
    return ftz_ld64u(a);
}

FTZ_FN uint32_t ftz_rd32(uint64_t a)
{
    uint64_t base = a & ~(uint64_t)3;
    unsigned sh = (unsigned)(a & 3) * 8;
    uint32_t w0 = ftz_ld32(base);
    if (!sh)
        return w0;
    return (uint32_t)(((uint64_t)ftz_ld32(base + 4) << 32 | w0) >> sh);
}

FTZ_FN uint64_t ftz_mul_fold(uint64_t a, uint64_t b)
{
#ifdef __CUDACC__
    return a * b ^ __umul64hi(a, b);
#else
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#endif
}

FTZ_FN uint64_t ftz_avalanche(uint64_t h)
{
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}

FTZ_FN uint64_t ftz_avalanche64(uint64_t h)
{
    h ^= h >> 33;
    h *= FTZ_P64_2;
    h ^= h >> 29;
    h *= FTZ_P64_3;
    return h ^ (h >> 32);
}

FTZ_FN uint64_t ftz_rotl(uint64_t x, unsigned r)
{
    return x << r | x >> (64 - r);
}

FTZ_FN uint64_t ftz_mix16(uint64_t in, unsigned sec)
{
    return ftz_mul_fold(ftz_rd64(in) ^ ftz_sec64(sec), ftz_rd64(in + 8) ^ ftz_sec64(sec + 8));
}

/* xxh3-64 of the @p len <= 240 bytes at @p in. */
FTZ_FN uint64_t ftz_xxh3_short(uint64_t in, uint32_t len)
{
    if (len == 0)
        return ftz_avalanche64(ftz_sec64(56) ^ ftz_sec64(64));
    if (len <= 3) {
        uint32_t c = (uint32_t)ftz_ld8(in) << 16 | (uint32_t)ftz_ld8(in + (len >> 1)) << 24 |
                     ftz_ld8(in + len - 1) | len << 8;
        return ftz_avalanche64(c ^ (uint64_t)(ftz_sec32(0) ^ ftz_sec32(4)));
    }
    if (len <= 8) {
        uint64_t v = ftz_rd32(in + len - 4) + ((uint64_t)ftz_rd32(in) << 32);
        uint64_t h = v ^ (ftz_sec64(8) ^ ftz_sec64(16));
        h ^= ftz_rotl(h, 49) ^ ftz_rotl(h, 24);
        h *= 0x9FB21C651E98DF25ull;
        h ^= (h >> 35) + len;
        h *= 0x9FB21C651E98DF25ull;
        return h ^ (h >> 28);
    }
    if (len <= 16) {
        uint64_t lo = ftz_rd64(in) ^ (ftz_sec64(24) ^ ftz_sec64(32));
        uint64_t hi = ftz_rd64(in + len - 8) ^ (ftz_sec64(40) ^ ftz_sec64(48));
#ifdef __CUDACC__
        uint64_t sw = __byte_perm((unsigned)(lo >> 32), 0, 0x0123) |
                      (uint64_t)__byte_perm((unsigned)lo, 0, 0x0123) << 32;
#else
        uint64_t sw = __builtin_bswap64(lo);
#endif
        return ftz_avalanche(len + sw + hi + ftz_mul_fold(lo, hi));
    }
    uint64_t acc = len * FTZ_P64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += ftz_mix16(in + 48, 96);
                    acc += ftz_mix16(in + len - 64, 112);
                }
                acc += ftz_mix16(in + 32, 64);
                acc += ftz_mix16(in + len - 48, 80);
            }
            acc += ftz_mix16(in + 16, 32);
            acc += ftz_mix16(in + len - 32, 48);
        }
        acc += ftz_mix16(in, 0);
        acc += ftz_mix16(in + len - 16, 16);
        return ftz_avalanche(acc);
    }
    for (unsigned i = 0; i < 8; i++)
        acc += ftz_mix16(in + 16 * i, 16 * i);
    uint64_t tail = ftz_mix16(in + len - 16, 136 - 17);
    acc = ftz_avalanche(acc);
    for (unsigned i = 8; i < len / 16; i++)
        tail += ftz_mix16(in + 16 * i, 16 * (i - 8) + 3);
    return ftz_avalanche(acc + tail);
}

/* One stripe into accumulator @p i: @p d its 8 bytes at 8 i, @p e those at 8 (i ^ 1), @p key
 * the secret's 8 bytes for them. */
FTZ_FN uint64_t ftz_stripe(uint64_t acc, uint64_t d, uint64_t e, uint64_t key)
{
    key ^= d;
    return acc + e + (uint64_t)(uint32_t)key * (key >> 32);
}

/* Accumulator @p i's start, and its keys: the secret's words of its 16 stripes, then of its
 * scramble (in registers on the GPU: the lanes read different words). */
FTZ_FN uint64_t ftz_xxh3_init(unsigned i, uint64_t keys[17])
{
    const uint64_t init[8] = {FTZ_P32_3, FTZ_P64_1, FTZ_P64_2, FTZ_P64_3,
                              FTZ_P64_4, FTZ_P32_2, FTZ_P64_5, FTZ_P32_1};
    FTZ_UNROLL
    for (unsigned s = 0; s < 16; s++)
        keys[s] = ftz_sec64(8 * s + 8 * i);
    keys[16] = ftz_sec64(128 + 8 * i);
    return init[i];
}

/* Accumulator @p i over @p nb whole 1 KiB blocks of 16 stripes at @p in (8-byte aligned, any
 * memory: shared memory on the GPU), each followed by its scramble. */
FTZ_FN uint64_t ftz_xxh3_blocks(uint64_t acc, uint64_t in, uint64_t nb, unsigned i,
                                const uint64_t keys[17])
{
    for (uint64_t b = 0; b < nb; b++) {
        const uint64_t *x = (const uint64_t *)(uintptr_t)(in + 1024 * b);
        FTZ_UNROLL
        for (unsigned s = 0; s < 16; s++)
            acc = ftz_stripe(acc, x[8 * s + i], x[8 * s + (i ^ 1)], keys[s]);
        acc ^= acc >> 47;
        acc ^= keys[16];
        acc *= FTZ_P32_1;
    }
    return acc;
}

/* Accumulator @p i finished over the @p len > 240 bytes at @p in (any alignment) once its
 * whole blocks (the first (len - 1) / 1024) went through ftz_xxh3_blocks: the stripes left,
 * then the last 64 bytes. */
FTZ_FN uint64_t ftz_xxh3_tail(uint64_t acc, uint64_t in, uint64_t len, unsigned i)
{
    uint64_t done = (len - 1) / 1024 * 1024;
    unsigned stripes = (unsigned)((len - 1 - done) / 64);
    for (unsigned s = 0; s < stripes; s++) {
        uint64_t at = in + done + 64 * s;
        acc = ftz_stripe(acc, ftz_rd64(at + 8 * i), ftz_rd64(at + 8 * (i ^ 1)),
                         ftz_sec64(8 * s + 8 * i));
    }
    uint64_t at = in + len - 64;
    return ftz_stripe(acc, ftz_rd64(at + 8 * i), ftz_rd64(at + 8 * (i ^ 1)),
                      ftz_sec64(192 - 64 - 7 + 8 * i));
}

FTZ_FN uint64_t ftz_xxh3_merge(const uint64_t acc[8], uint64_t len)
{
    uint64_t h = len * FTZ_P64_1;
    for (unsigned i = 0; i < 4; i++)
        h += ftz_mul_fold(acc[2 * i] ^ ftz_sec64(11 + 16 * i), acc[2 * i + 1] ^
                          ftz_sec64(11 + 16 * i + 8));
    return ftz_avalanche(h);
}

#endif
