/*
 * The GPU encoder of codec streams (decode.c's format), written once for nvcc and for the C
 * compiler, as dev.h is for the decoder: kernel.cu wraps these functions in the encoder's
 * kernels, and gpu_enc.c runs the very same functions thread by thread on the CPU, so the
 * tests check that they write exactly the bytes of the CPU encoder (encode.c) on machines
 * without a GPU.
 *
 * A block's encoding, in steps (one kernel each on the GPU):
 * 1. count: the histogram of each byte plane (ftz_count_elem, every thread of the block's
 *    CUDA block over its elements);
 * 2. code: per plane, one thread: raw, constant or Huffman, the code lengths (the
 *    length-limited Huffman encode.c calls too: the same code), the canonical codes;
 * 3. streams: per plane a warp, lane j its stream: its bits counted, the streams laid out
 *    (and the plane stored raw where encode.c's bounds check would), then written; raw and
 *    constant planes copied;
 * 4. the block's checksum, xxh3-64 of its bytes (eight lanes, one accumulator each);
 * 5. place: the table (ends and checksums) and every block at its place after it.
 * The result is the stream encode.c writes, byte for byte.
 */
#ifndef FT_CODEC_ENC_DEV_H
#define FT_CODEC_ENC_DEV_H

#include "dev.h"

#ifdef __CUDACC__
#define FTZ_CONST_DATA static __constant__ const
#else
#define FTZ_CONST_DATA static const
#endif

#define FTZ_HUFF_HEAD (128 + 4 * FTZ_LANES) /* code lengths, stream sizes */

/* One block for the encoder's kernels (the host fills the first four fields). */
typedef struct ftz_eblock {
    uint64_t src;    /* address of its elements */
    uint64_t slot;   /* where its encoding is written first (room: block bytes + esize) */
    uint32_t n;      /* elements */
    uint32_t size;   /* its encoding's bytes (step 3) */
    uint64_t csum;   /* xxh3-64 of its bytes (step 4) */
    uint64_t at;     /* its offset after the table (step 5) */
} ftz_eblock;

/* One byte plane of a block. */
typedef struct ftz_eplane {
    uint32_t count[256]; /* step 1 */
    uint32_t cl[256];    /* code << 8 | length (step 2) */
    uint8_t lens[128];   /* the code lengths as written: symbol 2i in the low nibble of i */
    uint32_t n;          /* the block's elements */
    uint8_t mode;        /* FTZ_RAW, FTZ_CONST, FTZ_HUFF (step 3 may still store it raw) */
    uint8_t value;       /* FTZ_CONST: the byte */
    uint8_t pad[2];
    uint32_t size;       /* its bytes in the block (step 3) */
} ftz_eplane;

/* ---- step 1: counting ---- */

FTZ_FN void ftz_hist_add(uint32_t *h)
{
#ifdef __CUDACC__
    atomicAdd(h, 1u);
#else
    (*h)++;
#endif
}

/* Element @p i of the block at @p src (@p E bytes each) into @p hist ([E][256]). */
FTZ_FN void ftz_count_elem(uint64_t src, uint32_t i, unsigned E, uint32_t *hist)
{
    for (unsigned k = 0; k < E; k++)
        ftz_hist_add(&hist[256 * k + ftz_ld8(src + (uint64_t)i * E + k)]);
}

/* ---- step 2: the code ---- */

/*
 * Huffman code lengths (at most FTZ_MAXLEN) of the symbols counted in @p count (two or
 * more), for both encoders (encode.c's code_lengths calls this): leaves sorted by (count,
 * symbol), counts clamped to 2^23 - 1, two queues merged with leaves first on ties, depths
 * clamped, then the rarest symbols lengthened until the code fits.
 */
FTZ_FN void ftz_code_lengths(const uint32_t count[256], uint8_t len[256])
{
    uint64_t key[256]; /* count << 8 | symbol, sorted */
    uint64_t weight[511];
    uint16_t parent[511];
    uint8_t depth[511];
    unsigned n = 0;
    for (unsigned s = 0; s < 256; s++) {
        len[s] = 0;
        if (count[s]) {
            uint64_t c = count[s] < (0xffffffffu >> 9) ? count[s] : (0xffffffffu >> 9);
            key[n++] = c << 8 | s;
        }
    }
    const unsigned gaps[] = {57, 23, 10, 4, 1}; /* Shell sort (the keys are distinct) */
    for (unsigned g = 0; g < 5; g++)
        for (unsigned i = gaps[g]; i < n; i++) {
            uint64_t v = key[i];
            unsigned j = i;
            for (; j >= gaps[g] && key[j - gaps[g]] > v; j -= gaps[g])
                key[j] = key[j - gaps[g]];
            key[j] = v;
        }
    if (n < 2)
        return; /* (not called so: one symbol is a constant plane) */
    for (unsigned i = 0; i < n; i++)
        weight[i] = key[i] >> 8;
    unsigned next_leaf = 0, next_node = n, made = n;
    for (unsigned k = 0; k + 1 < n; k++) {
        unsigned pick[2];
        for (unsigned j = 0; j < 2; j++) {
            if (next_leaf < n && (next_node >= made || weight[next_leaf] <= weight[next_node]))
                pick[j] = next_leaf++;
            else
                pick[j] = next_node++;
        }
        weight[made] = weight[pick[0]] + weight[pick[1]];
        parent[pick[0]] = parent[pick[1]] = (uint16_t)made;
        made++;
    }
    depth[made - 1] = 0;
    for (int i = (int)made - 2; i >= 0; i--) {
        unsigned d = depth[parent[i]] + 1u;
        depth[i] = (uint8_t)(d < 255 ? d : 255);
    }
    uint32_t kraft = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned l = depth[i] < FTZ_MAXLEN ? depth[i] : FTZ_MAXLEN;
        len[key[i] & 255] = (uint8_t)l;
        kraft += FTZ_TABLE >> l;
    }
    while (kraft > FTZ_TABLE)
        for (unsigned i = 0; i < n && kraft > FTZ_TABLE; i++) {
            uint8_t *l = &len[key[i] & 255];
            if (*l < FTZ_MAXLEN) {
                kraft -= FTZ_TABLE >> (*l + 1);
                (*l)++;
            }
        }
}

/* Plane @p p's mode and code from its counts (encode.c's encode_plane, up to its streams):
 * constant where one byte value is used, raw where the plane is too short or the code's
 * estimate gains nothing, else Huffman with canonical codes. */
FTZ_FN void ftz_plane_code(ftz_eplane *p)
{
    unsigned used = 0, last = 0;
    for (unsigned v = 0; v < 256; v++)
        if (p->count[v]) {
            used++;
            last = v;
        }
    p->mode = FTZ_RAW;
    p->size = 1 + p->n;
    if (used == 1) {
        p->mode = FTZ_CONST;
        p->value = (uint8_t)last;
        p->size = 2;
        return;
    }
    if (used == 0 || p->n <= 1 + FTZ_HUFF_HEAD)
        return;
    uint8_t len[256];
    ftz_code_lengths(p->count, len);
    uint64_t bits = 0;
    for (unsigned v = 0; v < 256; v++)
        bits += (uint64_t)p->count[v] * len[v];
    if (1 + FTZ_HUFF_HEAD + bits / 8 + FTZ_LANES >= p->n)
        return;
    /* canonical codes: by length, then symbol (decode.c's ft__codec_canonical) */
    unsigned nlen[FTZ_MAXLEN + 1];
    for (unsigned l = 0; l <= FTZ_MAXLEN; l++)
        nlen[l] = 0;
    for (unsigned s = 0; s < 256; s++)
        nlen[len[s]]++;
    nlen[0] = 0;
    uint32_t next[FTZ_MAXLEN + 1], c = 0;
    next[0] = 0;
    for (unsigned l = 1; l <= FTZ_MAXLEN; l++) {
        c = (c + nlen[l - 1]) << 1;
        next[l] = c;
    }
    for (unsigned s = 0; s < 256; s++)
        p->cl[s] = len[s] ? (next[len[s]]++ << 8 | len[s]) : 0;
    for (unsigned i = 0; i < 128; i++)
        p->lens[i] = (uint8_t)(len[2 * i] | len[2 * i + 1] << 4);
    p->mode = FTZ_HUFF;
}

/* ---- step 3: streams ---- */

/* Elements per stream of a plane of @p n elements (decode.c's split: rounded up to 8). */
FTZ_FN uint32_t ftz_stream_q(uint32_t n)
{
    uint32_t q = (uint32_t)(((uint64_t)n + FTZ_LANES - 1) / FTZ_LANES);
    return (q + 7) & ~7u;
}

/* The bits of the stream of plane @p k over elements [from, to) of @p src, and in *last the
 * bits before its last group of four symbols (where encode.c checks its room last). */
FTZ_FN uint64_t ftz_stream_bits(uint64_t src, unsigned E, unsigned k, uint32_t from,
                                uint32_t to, const uint32_t *cl, uint64_t *last)
{
    uint64_t bits = 0;
    uint32_t last_group = to > from ? from + (to - from - 1) / 4 * 4 : from;
    *last = 0;
    for (uint32_t i = from; i < to; i++) {
        if (i == last_group)
            *last = bits;
        bits += cl[ftz_ld8(src + (uint64_t)i * E + k)] & 255;
    }
    return bits;
}

/* Lane @p lane's elements [*from, *to) of a plane of @p n elements. */
FTZ_FN void ftz_lane_range(uint32_t n, unsigned lane, uint32_t *from, uint32_t *to)
{
    uint64_t q = ftz_stream_q(n), a = q * lane, b = q * (lane + 1);
    *from = (uint32_t)(a < n ? a : n);
    *to = lane + 1 < FTZ_LANES && b < n ? (uint32_t)b : n;
}

/*
 * The layout of a Huffman plane of @p n elements whose 32 streams have @p bits bits (the
 * bits before each one's last group in @p last): each stream's start from the plane's mode
 * byte in @p start, and the plane's bytes; or 0 where encode.c's put_stream would have run
 * out of room (its 8-byte stores need 8 bytes before the raw size's end): then the plane is
 * stored raw.
 */
FTZ_FN uint32_t ftz_plane_layout(uint32_t n, const uint64_t bits[FTZ_LANES],
                                 const uint64_t last[FTZ_LANES], uint32_t start[FTZ_LANES])
{
    uint64_t at = 1 + FTZ_HUFF_HEAD, end = 1 + (uint64_t)n;
    for (unsigned j = 0; j < FTZ_LANES; j++) {
        uint32_t from, to;
        ftz_lane_range(n, j, &from, &to);
        start[j] = (uint32_t)at;
        if (from < to && at + last[j] / 8 + 8 > end)
            return 0;
        if ((bits[j] & 7) && at + bits[j] / 8 + 1 > end)
            return 0;
        at += (bits[j] + 7) / 8;
    }
    return (uint32_t)at;
}

/* Plane @p p's final mode and bytes once its lanes counted their streams' bits (see
 * ftz_plane_layout): the streams' starts in @p start. */
FTZ_FN void ftz_plane_finish(ftz_eplane *p, const uint64_t bits[FTZ_LANES],
                             const uint64_t last[FTZ_LANES], uint32_t start[FTZ_LANES])
{
    if (p->mode != FTZ_HUFF)
        return;
    uint32_t size = ftz_plane_layout(p->n, bits, last, start);
    p->mode = size ? FTZ_HUFF : FTZ_RAW;
    p->size = size ? size : 1 + p->n;
}

/* The stream of plane @p k over elements [from, to) of @p src at @p out, MSB first, its
 * last byte zero-padded. */
FTZ_FN void ftz_stream_write(uint64_t src, unsigned E, unsigned k, uint32_t from, uint32_t to,
                             const uint32_t *cl, uint64_t out)
{
    uint64_t buf = 0;
    unsigned cnt = 0;
    for (uint32_t i = from; i < to; i++) {
        uint32_t c = cl[ftz_ld8(src + (uint64_t)i * E + k)];
        cnt += c & 255;
        buf |= (uint64_t)(c >> 8) << (64 - cnt);
        while (cnt >= 8) {
            *(uint8_t *)(uintptr_t)out++ = (uint8_t)(buf >> 56);
            buf <<= 8;
            cnt -= 8;
        }
    }
    if (cnt)
        *(uint8_t *)(uintptr_t)out = (uint8_t)(buf >> 56);
}

FTZ_FN void ftz_st8(uint64_t out, uint32_t v)
{
    *(uint8_t *)(uintptr_t)out = (uint8_t)v;
}

/* Lane @p lane's share of plane @p k's header at @p out (laid out with @p start, its
 * streams' @p bits): the mode byte and the code lengths (four bytes a lane), its stream's
 * size. */
FTZ_FN void ftz_huff_head(const ftz_eplane *p, uint64_t out, unsigned lane, uint64_t bits)
{
    if (lane == 0)
        ftz_st8(out, FTZ_HUFF);
    for (unsigned i = 4 * lane; i < 4 * lane + 4; i++)
        ftz_st8(out + 1 + i, p->lens[i]);
    uint32_t size = (uint32_t)((bits + 7) / 8);
    for (unsigned b = 0; b < 4; b++)
        ftz_st8(out + 1 + 128 + 4 * lane + b, size >> (8 * b));
}

/* Bytes [from, to) of raw plane @p k at @p out (after its mode byte, which lane 0 writes). */
FTZ_FN void ftz_raw_write(uint64_t src, unsigned E, unsigned k, uint32_t from, uint32_t to,
                          uint32_t step, uint64_t out)
{
    for (uint32_t i = from; i < to; i += step)
        ftz_st8(out + 1 + i, ftz_ld8(src + (uint64_t)i * E + k));
}

/* Lane @p lane's part of plane @p k (@p p, finished) at @p out: for a Huffman plane its
 * stream (of @p bits bits, at @p start) and its share of the header. */
FTZ_FN void ftz_plane_write(const ftz_eplane *p, uint64_t src, unsigned E, unsigned k,
                            uint64_t out, unsigned lane, uint64_t bits, uint32_t start)
{
    if (p->mode == FTZ_CONST) {
        if (lane == 0) {
            ftz_st8(out, FTZ_CONST);
            ftz_st8(out + 1, p->value);
        }
        return;
    }
    if (p->mode == FTZ_RAW) {
        if (lane == 0)
            ftz_st8(out, FTZ_RAW);
        ftz_raw_write(src, E, k, lane, p->n, FTZ_LANES, out);
        return;
    }
    ftz_huff_head(p, out, lane, bits);
    uint32_t from, to;
    ftz_lane_range(p->n, lane, &from, &to);
    ftz_stream_write(src, E, k, from, to, p->cl, out + start);
}

/* ---- step 4: the checksum, xxh3-64 (seed 0, the default secret) ---- */

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

/* One stripe (64 bytes at @p in, secret from @p sec) into accumulator @p i. */
FTZ_FN uint64_t ftz_stripe(uint64_t acc, uint64_t in, unsigned sec, unsigned i)
{
    uint64_t key = ftz_rd64(in + 8 * i) ^ ftz_sec64(sec + 8 * i);
    return acc + ftz_rd64(in + 8 * (i ^ 1)) + (uint64_t)(uint32_t)key * (key >> 32);
}

/* Accumulator @p i (0-7) of xxh3-64 over the @p len > 240 bytes at @p in, after every stripe
 * (the eight are independent until ftz_xxh3_merge). */
FTZ_FN uint64_t ftz_xxh3_lane(uint64_t in, uint64_t len, unsigned i)
{
    const uint64_t init[8] = {FTZ_P32_3, FTZ_P64_1, FTZ_P64_2, FTZ_P64_3,
                              FTZ_P64_4, FTZ_P32_2, FTZ_P64_5, FTZ_P32_1};
    uint64_t acc = init[i];
    const uint64_t block = 64 * 16; /* 16 stripes between scrambles (192-byte secret) */
    uint64_t nblocks = (len - 1) / block;
    for (uint64_t b = 0; b < nblocks; b++) {
        for (unsigned s = 0; s < 16; s++)
            acc = ftz_stripe(acc, in + b * block + 64 * s, 8 * s, i);
        acc ^= acc >> 47;
        acc ^= ftz_sec64(128 + 8 * i);
        acc *= FTZ_P32_1;
    }
    unsigned stripes = (unsigned)(((len - 1) - block * nblocks) / 64);
    for (unsigned s = 0; s < stripes; s++)
        acc = ftz_stripe(acc, in + nblocks * block + 64 * s, 8 * s, i);
    return ftz_stripe(acc, in + len - 64, 192 - 64 - 7, i);
}

FTZ_FN uint64_t ftz_xxh3_merge(const uint64_t acc[8], uint64_t len)
{
    uint64_t h = len * FTZ_P64_1;
    for (unsigned i = 0; i < 4; i++)
        h += ftz_mul_fold(acc[2 * i] ^ ftz_sec64(11 + 16 * i), acc[2 * i + 1] ^
                          ftz_sec64(11 + 16 * i + 8));
    return ftz_avalanche(h);
}

/* ---- step 5: the table, the blocks in place ---- */

FTZ_FN void ftz_st_le(uint64_t out, uint64_t v, unsigned bytes)
{
    for (unsigned b = 0; b < bytes; b++)
        ftz_st8(out + b, (uint32_t)(v >> (8 * b)));
}

/* The stream's header and table at @p out (one thread): each block's place after the table
 * in its at, its end and checksum in the table. @return the stream's bytes. */
FTZ_FN uint64_t ftz_enc_table(ftz_eblock *blocks, uint32_t nblocks, unsigned E, uint64_t nbytes,
                              uint32_t block_bytes, uint64_t out)
{
    ftz_st8(out, 'F');
    ftz_st8(out + 1, 'T');
    ftz_st8(out + 2, 'Z');
    ftz_st8(out + 3, '1');
    ftz_st8(out + 4, E);
    ftz_st8(out + 5, 2);
    ftz_st8(out + 6, FTZ_LANES);
    ftz_st8(out + 7, 0);
    ftz_st_le(out + 8, nbytes, 8);
    ftz_st_le(out + 16, block_bytes, 4);
    ftz_st_le(out + 20, nblocks, 4);
    uint64_t at = 0;
    for (uint32_t b = 0; b < nblocks; b++) {
        blocks[b].at = at;
        at += blocks[b].size;
        ftz_st_le(out + 24 + 16 * (uint64_t)b, at, 8);
        ftz_st_le(out + 24 + 16 * (uint64_t)b + 8, blocks[b].csum, 8);
    }
    return 24 + 16 * (uint64_t)nblocks + at;
}

/* Bytes [i, size) of @p from to @p to, @p step apart (one thread of many). */
FTZ_FN void ftz_copy_bytes(uint64_t from, uint64_t to, uint32_t size, uint32_t i, uint32_t step)
{
    for (; i < size; i += step)
        ftz_st8(to + i, *(const uint8_t *)(uintptr_t)(from + i));
}

#endif
