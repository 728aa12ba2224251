/*
 * The GPU decoder of codec streams (decode.c's format), written once for nvcc and for the C
 * compiler: kernel.cu wraps these functions in the kernel (one warp per block, one
 * lane per stream), and decode.c runs the very same functions lane by lane on the CPU, so the
 * tests check the kernel's logic byte for byte on machines without a GPU.
 *
 * The host parses and checks every block first (modes, sizes, code lengths) and hands the
 * kernel one ftz_block per block; the kernel trusts those and reads nothing outside them:
 * every load is of an aligned 4-byte word holding at least one byte of the block's data.
 * Block checksums are not computed here (the host decoder checks them).
 *
 * Lane j of a block owns the elements [q j, q (j + 1)) (clipped to n): its stream of every
 * coded plane, the same range of every raw plane. It decodes eight elements at a time, all
 * planes together, and stores whole elements (16 bytes for bf16) where the destination is
 * aligned; the last elements of its range (and unaligned destinations) one at a time.
 */
#ifndef FT_CKPT_CODEC_DEV_H
#define FT_CKPT_CODEC_DEV_H

#ifdef __CUDACC__
#define FTZ_FN static __device__ __forceinline__
#define FTZ_UNROLL _Pragma("unroll")
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <stdint.h>
#define FTZ_FN static inline
#define FTZ_UNROLL
#endif

#define FTZ_MAXLEN 12
#define FTZ_TABLE (1u << FTZ_MAXLEN)
#define FTZ_LANES 32
#define FTZ_RAW 0
#define FTZ_CONST 1
#define FTZ_HUFF 2

/* One block, as the host found it (the same layout for host and device code). */
typedef struct ftz_block {
    uint64_t src;      /* address of the block's encoded bytes */
    uint64_t dst;      /* address of its decoded bytes */
    uint32_t n;        /* elements */
    uint32_t q;        /* elements per lane */
    uint32_t off[8];   /* per plane: its bytes (raw) or its Huffman header, from src */
    uint8_t mode[8];   /* per plane: FTZ_RAW, FTZ_CONST, FTZ_HUFF */
    uint8_t value[8];  /* per plane, FTZ_CONST: the byte */
    uint8_t esize;     /* 1, 2, 4 or 8 */
    uint8_t streams;   /* streams per coded plane (at most FTZ_LANES) */
    uint8_t wide;      /* dst + q j esize is 16-byte aligned and q a multiple of 8 */
    uint8_t pad[5];
} ftz_block;

/* A canonical code, ready to fill a table: symbols by (length, symbol), per length the first
 * left-justified code, its end, and the index of its first symbol. */
typedef struct ftz_canon {
    uint32_t first[FTZ_MAXLEN + 1];
    uint32_t end[FTZ_MAXLEN + 1];
    uint32_t index[FTZ_MAXLEN + 1];
    uint8_t sorted[256];
} ftz_canon;

FTZ_FN uint32_t ftz_ld32(uint64_t addr) /* an aligned word */
{
#ifdef __CUDACC__
    return __ldg((const unsigned int *)(uintptr_t)addr);
#else
    return *(const uint32_t *)(uintptr_t)addr;
#endif
}

FTZ_FN uint8_t ftz_ld8(uint64_t addr)
{
#ifdef __CUDACC__
    return __ldg((const unsigned char *)(uintptr_t)addr);
#else
    return *(const uint8_t *)(uintptr_t)addr;
#endif
}

FTZ_FN uint32_t ftz_bswap(uint32_t x)
{
#ifdef __CUDACC__
    return __byte_perm(x, 0, 0x0123);
#else
    return __builtin_bswap32(x);
#endif
}

/* Bytes of x (0-3) and y (4-7) picked by the nibbles of s, as CUDA's __byte_perm. */
FTZ_FN uint32_t ftz_perm(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDACC__
    return __byte_perm(x, y, s);
#else
    uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)(uint8_t)(v >> (8 * ((s >> (4 * i)) & 7))) << (8 * i);
    return r;
#endif
}

/* The 8 bytes at @p addr (any alignment) through aligned words, each holding one of them. */
FTZ_FN uint64_t ftz_ld64u(uint64_t addr)
{
    uint64_t base = addr & ~(uint64_t)3;
    unsigned sh = (unsigned)(addr & 3) * 8;
    uint32_t w0 = ftz_ld32(base), w1 = ftz_ld32(base + 4);
    if (!sh)
        return (uint64_t)w1 << 32 | w0;
    uint32_t w2 = ftz_ld32(base + 8);
    uint32_t lo = (uint32_t)(((uint64_t)w1 << 32 | w0) >> sh);
    uint32_t hi = (uint32_t)(((uint64_t)w2 << 32 | w1) >> sh);
    return (uint64_t)hi << 32 | lo;
}

/* The code of the 128 length bytes at @p lens (checked by the host: lengths <= 12, a code
 * that does not over-subscribe). */
FTZ_FN void ftz_canon_build(uint64_t lens, ftz_canon *c)
{
    uint32_t count[FTZ_MAXLEN + 1];
    for (unsigned l = 0; l <= FTZ_MAXLEN; l++)
        count[l] = 0;
    for (unsigned i = 0; i < 128; i++) {
        uint8_t b = ftz_ld8(lens + i);
        count[b & 15]++;
        count[b >> 4]++;
    }
    count[0] = 0;
    uint32_t next[FTZ_MAXLEN + 1], code = 0, at = 0;
    for (unsigned l = 1; l <= FTZ_MAXLEN; l++) {
        code = (code + count[l - 1]) << 1;
        c->first[l] = code << (FTZ_MAXLEN - l);
        c->end[l] = c->first[l] + (count[l] << (FTZ_MAXLEN - l));
        c->index[l] = at;
        next[l] = at;
        at += count[l];
    }
    for (unsigned i = 0; i < 128; i++) {
        uint8_t b = ftz_ld8(lens + i);
        if (b & 15)
            c->sorted[next[b & 15]++] = (uint8_t)(2 * i);
        if (b >> 4)
            c->sorted[next[b >> 4]++] = (uint8_t)(2 * i + 1);
    }
}

/* Lane @p lane's entries of the decode table: entry t (the next 12 bits) = symbol | length
 * << 8; a code the table does not hold decodes as symbol 0 of 12 bits (corrupt input). */
FTZ_FN void ftz_table_fill(const ftz_canon *c, uint16_t *table, unsigned lane)
{
    for (unsigned t = lane; t < FTZ_TABLE; t += FTZ_LANES) {
        uint16_t e = (uint16_t)(FTZ_MAXLEN << 8);
        for (unsigned l = 1; l <= FTZ_MAXLEN; l++)
            if (t >= c->first[l] && t < c->end[l])
                e = (uint16_t)(c->sorted[c->index[l] + ((t - c->first[l]) >> (FTZ_MAXLEN - l))]
                               | l << 8);
        table[t] = e;
    }
}

/* A bit stream, MSB first; bits past its end read as zeros. */
typedef struct ftz_bits {
    uint64_t buf;
    unsigned cnt;
    uint64_t p, end;
} ftz_bits;

FTZ_FN void ftz_bits_init(ftz_bits *r, uint64_t p, uint64_t end)
{
    r->buf = 0;
    r->cnt = 0;
    r->p = p;
    r->end = end;
    while ((r->p & 3) && r->p < r->end) { /* up to the first aligned word */
        r->buf |= (uint64_t)ftz_ld8(r->p++) << (56 - r->cnt);
        r->cnt += 8;
    }
}

/* At least 24 bits in the buffer: two symbols. */
FTZ_FN void ftz_refill(ftz_bits *r)
{
    if (r->cnt > 32)
        return;
    if (r->p + 4 <= r->end) {
        r->buf |= (uint64_t)ftz_bswap(ftz_ld32(r->p)) << (32 - r->cnt);
        r->cnt += 32;
        r->p += 4;
        return;
    }
    while (r->cnt <= 56) {
        uint64_t b = r->p < r->end ? ftz_ld8(r->p++) : 0;
        r->buf |= b << (56 - r->cnt);
        r->cnt += 8;
    }
}

FTZ_FN uint32_t ftz_sym(ftz_bits *r, const uint16_t *table)
{
    uint32_t e = table[r->buf >> (64 - FTZ_MAXLEN)];
    unsigned l = e >> 8;
    r->buf <<= l;
    r->cnt -= l;
    return e & 255;
}

/* Eight symbols of @p r, byte i the i-th. */
FTZ_FN uint64_t ftz_sym8(ftz_bits *r, const uint16_t *table)
{
    uint64_t v = 0;
    FTZ_UNROLL
    for (unsigned i = 0; i < 8; i += 2) {
        ftz_refill(r);
        v |= (uint64_t)ftz_sym(r, table) << (8 * i);
        v |= (uint64_t)ftz_sym(r, table) << (8 * i + 8);
    }
    return v;
}

FTZ_FN void ftz_st128(uint64_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
#ifdef __CUDACC__
    *(uint4 *)(uintptr_t)addr = make_uint4(a, b, c, d);
#else
    uint32_t *p = (uint32_t *)(uintptr_t)addr;
    p[0] = a;
    p[1] = b;
    p[2] = c;
    p[3] = d;
#endif
}

/* Eight elements of @p E bytes at @p out (aligned to 16 for E >= 2, to 8 for E == 1), byte k
 * of element m being byte m of v[k]. */
FTZ_FN void ftz_store8(uint64_t out, const uint64_t v[8], unsigned E)
{
    if (E == 1) {
        *(uint64_t *)(uintptr_t)out = v[0];
    } else if (E == 2) {
        uint32_t a0 = (uint32_t)v[0], a1 = (uint32_t)(v[0] >> 32);
        uint32_t b0 = (uint32_t)v[1], b1 = (uint32_t)(v[1] >> 32);
        ftz_st128(out, ftz_perm(a0, b0, 0x5140), ftz_perm(a0, b0, 0x7362),
                  ftz_perm(a1, b1, 0x5140), ftz_perm(a1, b1, 0x7362));
    } else if (E == 4) {
        FTZ_UNROLL
        for (unsigned half = 0; half < 2; half++) {
            uint32_t a = (uint32_t)(v[0] >> (32 * half)), b = (uint32_t)(v[1] >> (32 * half));
            uint32_t c = (uint32_t)(v[2] >> (32 * half)), e = (uint32_t)(v[3] >> (32 * half));
            uint32_t ab0 = ftz_perm(a, b, 0x5140), ab1 = ftz_perm(a, b, 0x7362);
            uint32_t ce0 = ftz_perm(c, e, 0x5140), ce1 = ftz_perm(c, e, 0x7362);
            ftz_st128(out + 16 * half, ftz_perm(ab0, ce0, 0x5410), ftz_perm(ab0, ce0, 0x7632),
                      ftz_perm(ab1, ce1, 0x5410), ftz_perm(ab1, ce1, 0x7632));
        }
    } else {
        for (unsigned m = 0; m < 8; m++)
            for (unsigned k = 0; k < E; k++)
                *(uint8_t *)(uintptr_t)(out + m * E + k) = (uint8_t)(v[k] >> (8 * m));
    }
}

/* Lane @p lane's elements of block @p d; @p tables: one table per coded plane, in plane
 * order. @p E is d->esize (a constant where the caller switches on it, so that the plane
 * loops unroll). */
FTZ_FN void ftz_lane(const ftz_block *d, const uint16_t *tables, unsigned lane, unsigned E)
{
    uint64_t lo = (uint64_t)d->q * lane, hi = lo + d->q;
    if (lane >= d->streams || lo >= d->n)
        return;
    if (hi > d->n)
        hi = d->n;
    /* the block in registers (the stores below may alias it as far as the compiler knows) */
    const uint64_t src = d->src, dst = d->dst;
    const unsigned streams = d->streams, wide = d->wide;
    uint32_t off[8];
    uint8_t mode[8], value[8];
    ftz_bits r[8];
    const uint16_t *tab[8];
    unsigned h = 0;
    FTZ_UNROLL
    for (unsigned k = 0; k < E; k++) {
        off[k] = d->off[k];
        mode[k] = d->mode[k];
        value[k] = d->value[k];
        tab[k] = tables;
        r[k].buf = 0;
        r[k].cnt = 0;
        r[k].p = r[k].end = 0;
        if (mode[k] != FTZ_HUFF)
            continue;
        uint64_t head = src + off[k], at = head + 128 + 4 * (uint64_t)streams;
        for (unsigned s = 0; s < lane; s++) {
            uint64_t w = head + 128 + 4 * s; /* (sizes are 4-byte values at any offset) */
            at += (uint32_t)ftz_ld8(w) | (uint32_t)ftz_ld8(w + 1) << 8 |
                  (uint32_t)ftz_ld8(w + 2) << 16 | (uint32_t)ftz_ld8(w + 3) << 24;
        }
        uint64_t w = head + 128 + 4 * (uint64_t)lane;
        uint32_t size = (uint32_t)ftz_ld8(w) | (uint32_t)ftz_ld8(w + 1) << 8 |
                        (uint32_t)ftz_ld8(w + 2) << 16 | (uint32_t)ftz_ld8(w + 3) << 24;
        ftz_bits_init(&r[k], at, at + size);
        tab[k] = tables + (uint64_t)FTZ_TABLE * h++;
    }
    uint64_t i = lo;
    if (wide) {
        for (; i + 8 <= hi; i += 8) {
            uint64_t v[8];
            FTZ_UNROLL
    for (unsigned k = 0; k < E; k++) {
                if (mode[k] == FTZ_RAW)
                    v[k] = ftz_ld64u(src + off[k] + i);
                else if (mode[k] == FTZ_CONST)
                    v[k] = 0x0101010101010101ull * value[k];
                else
                    v[k] = ftz_sym8(&r[k], tab[k]);
            }
            ftz_store8(dst + i * E, v, E);
        }
    }
    for (; i < hi; i++)
        FTZ_UNROLL
    for (unsigned k = 0; k < E; k++) {
            uint32_t b;
            if (mode[k] == FTZ_RAW) {
                b = ftz_ld8(src + off[k] + i);
            } else if (mode[k] == FTZ_CONST) {
                b = value[k];
            } else {
                ftz_refill(&r[k]);
                b = ftz_sym(&r[k], tab[k]);
            }
            *(uint8_t *)(uintptr_t)(dst + i * E + k) = (uint8_t)b;
        }
}

#endif
