/*
 * The tensor codec (ft_codec_*): byte-exact round trips of every float width with realistic
 * (normal) values, special values, incompressible and constant data, edge sizes and block
 * sizes; its ratio on weights; bad arguments; corrupt streams decoded without harm. Every
 * round trip is also decoded by the GPU decoder's lane code run on the CPU
 * (ft__codec_decode_lanes: the kernel's logic), at aligned and unaligned destinations, and
 * encoded by the GPU encoder's steps run on the CPU (ft__codec_encode_lanes), which must
 * write the very bytes of the CPU encoder; the encoder's xxh3 against libxxhash.
 */
#include "testlib.h"
#include "../src/codec/codec.h"
#include "../src/codec/enc_dev.h"

#include <errno.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

static ft_ctx *ctx;

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static double normal(void)
{
    double u = ((next() >> 11) + 1.0) / 9007199254740994.0;
    double v = (next() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

enum kind { BF16, F16, F32, F64, F8 };
static const unsigned esize_of[] = {2, 2, 4, 8, 1};

static uint16_t to_half(float f)
{
    /* round toward zero into IEEE half: enough for test data */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (exp <= 0)
        return (uint16_t)sign;
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | (uint32_t)exp << 10 | mant >> 13);
}

/* @p n elements of weights-like data (normal, std @p scale) of @p k. */
static void *weights(enum kind k, size_t n, double scale)
{
    unsigned e = esize_of[k];
    uint8_t *b = malloc(n * e + 1);
    for (size_t i = 0; i < n; i++) {
        float f = (float)(normal() * scale);
        uint32_t x;
        memcpy(&x, &f, 4);
        if (k == BF16) {
            uint16_t h = (uint16_t)(x >> 16);
            memcpy(b + 2 * i, &h, 2);
        } else if (k == F16) {
            uint16_t h = to_half(f);
            memcpy(b + 2 * i, &h, 2);
        } else if (k == F32) {
            memcpy(b + 4 * i, &f, 4);
        } else if (k == F64) {
            double d = normal() * scale;
            memcpy(b + 8 * i, &d, 8);
        } else {
            b[i] = (uint8_t)(x >> 24 | ((x >> 20) & 7)); /* an fp8-like sign/exponent byte */
        }
    }
    return b;
}

static double last_ratio;

/* Encode and decode; check the bytes; the ratio goes to last_ratio. */
static void round_trip(const void *src, size_t nbytes, unsigned e, uint32_t block)
{
    last_ratio = 9.0;
    size_t cap = ft_codec_bound(nbytes, e, block);
    uint8_t *enc = malloc(cap);
    int64_t n = ft_codec_encode(ctx, src, nbytes, e, block, 0, enc, cap);
    if (n < 0)
        T_FAIL("encode of %zu bytes (elements of %u, block %u): %s", nbytes, e, block,
               ft_last_error());
    T_TRUE((size_t)n <= cap);
    T_EQ(ft_codec_size(enc, (size_t)n), (int64_t)nbytes);
    /* the GPU encoder's steps: the same bytes */
    uint8_t *genc = malloc(cap);
    int64_t gn = ft__codec_encode_lanes(src, nbytes, e, block, genc, cap);
    T_EQ(gn, n);
    if (gn == n)
        T_MEMEQ(genc, enc, (size_t)n);
    free(genc);
    uint8_t *dec = malloc(nbytes + 1);
    memset(dec, 0xa5, nbytes + 1);
    T_EQ(ft_codec_decode(ctx, enc, (size_t)n, dec, nbytes), (int64_t)nbytes);
    T_MEMEQ(dec, src, nbytes);
    T_EQ(dec[nbytes], 0xa5); /* nothing past the end */
    /* the GPU decoder's lanes: 16-byte aligned (whole elements stored at once) and not */
    uint8_t *lanes = aligned_alloc(64, ((nbytes + 4 + 63) / 64) * 64);
    for (size_t shift = 0; shift < 4; shift += 3) {
        memset(lanes, 0x5a, nbytes + 4);
        T_EQ(ft__codec_decode_lanes(enc, (size_t)n, lanes + shift, nbytes), (int64_t)nbytes);
        T_MEMEQ(lanes + shift, src, nbytes);
        T_EQ(lanes[shift + nbytes], 0x5a);
        if (shift)
            T_EQ(lanes[0], 0x5a);
    }
    free(lanes);
    free(enc);
    free(dec);
    last_ratio = nbytes ? (double)n / (double)nbytes : 1.0;
}

/* round_trip, @return the ratio */
#define RT(src, nbytes, e, block) (round_trip(src, nbytes, e, block), last_ratio)

static void case_weights(void)
{
    const size_t counts[] = {0, 1, 2, 63, 64, 145, 146, 147, 1000, 65535, 65536, 65537,
                             (3u << 20) / 2 + 7};
    const uint32_t blocks[] = {0, 4096, 1u << 16};
    for (int k = BF16; k <= F8; k++) {
        unsigned e = esize_of[k];
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
            for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
                if (blocks[b] && blocks[b] < 64 * e)
                    continue;
                void *w = weights((enum kind)k, counts[c], 0.02);
                round_trip(w, counts[c] * e, e, blocks[b]);
                free(w);
            }
    }
}

static void case_ratio(void)
{
    size_t n = 4u << 20;
    void *w = weights(BF16, n, 0.02);
    double r = RT(w, n * 2, 2, 0);
    printf("  bf16 normal(0, 0.02): ratio %.3f\n", r);
    T_TRUE(r < 0.75); /* the sign/exponent byte carries ~2.5 bits */
    free(w);
    w = weights(F32, n / 2, 1.0);
    r = RT(w, n * 2, 4, 0);
    printf("  fp32 normal(0, 1): ratio %.3f\n", r);
    T_TRUE(r < 0.92);
    free(w);
    /* fp32 upcast from bf16: two constant zero planes */
    uint32_t *up = malloc(n * 4);
    uint16_t *bf = weights(BF16, n, 0.02);
    for (size_t i = 0; i < n; i++)
        up[i] = (uint32_t)bf[i] << 16;
    r = RT(up, n * 4, 4, 0);
    printf("  fp32 from bf16: ratio %.3f\n", r);
    T_TRUE(r < 0.40);
    free(up);
    free(bf);
}

static void case_incompressible_and_constant(void)
{
    size_t n = (2u << 20) + 12;
    uint8_t *b = malloc(n);
    t_fill_random(b, n, 7);
    for (unsigned e = 1; e <= 8; e *= 2) {
        double r = RT(b, n - n % e, e, 0);
        T_TRUE(r <= 1.0 + 64.0 / (1 << 20)); /* raw planes: a few header bytes per block */
    }
    memset(b, 0, n);
    T_TRUE(RT(b, n - n % 4, 4, 0) < 0.001);
    memset(b, 0x7f, n);
    T_TRUE(RT(b, n, 1, 4096) < 0.01);
    free(b);
}

static void case_special_values(void)
{
    const uint32_t f32[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                            0x7fa12345u, 0xffc00001u, 0x00000001u, 0x807fffffu, 0x00400000u,
                            0x7f7fffffu, 0xff7fffffu, 0x3f800000u};
    const uint16_t bf16[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7fa1, 0xffc1, 0x0001,
                             0x807f, 0x0040, 0x7f7f, 0x3f80};
    const uint16_t f16[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d23, 0x0001, 0x83ff,
                            0x7bff, 0x3c00};
    size_t n = 70000;
    uint32_t *a = weights(F32, n, 0.1);
    uint16_t *b = weights(BF16, n, 0.1), *h = weights(F16, n, 0.1);
    for (size_t i = 0; i < n; i += 1 + next() % 50) {
        a[i] = f32[next() % (sizeof f32 / 4)];
        b[i] = bf16[next() % (sizeof bf16 / 2)];
        h[i] = f16[next() % (sizeof f16 / 2)];
    }
    round_trip(a, n * 4, 4, 4096);
    round_trip(b, n * 2, 2, 0);
    round_trip(h, n * 2, 2, 65536);
    free(a);
    free(b);
    free(h);
}

static void case_skewed_symbols(void)
{
    /* frequencies 2^-k: Huffman lengths past 12 bits, which the codec limits */
    size_t n = 1u << 22;
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) {
        unsigned k = 0;
        uint64_t r = next();
        while (k < 40 && (r & 1)) {
            k++;
            r >>= 1;
            if (!r)
                r = next();
        }
        b[i] = (uint8_t)(k * 5 + (next() % 3 == 0));
    }
    T_TRUE(RT(b, n, 1, 0) < 0.5);
    free(b);
}

static void case_deterministic_across_threads(void)
{
    size_t n = 3u << 20;
    void *w = weights(BF16, n / 2, 0.05);
    size_t cap = ft_codec_bound(n, 2, 0);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    ft_ctx *one = t_ctx(1);
    int64_t na = ft_codec_encode(ctx, w, n, 2, 0, 0, a, cap);
    int64_t nb = ft_codec_encode(one, w, n, 2, 0, 0, b, cap);
    T_TRUE(na > 0);
    T_EQ(na, nb);
    T_MEMEQ(a, b, (size_t)na);
    ft_ctx_destroy(one);
    free(a);
    free(b);
    free(w);
}

/* Encoding in place (the output has ft_codec_bound's room: blocks coded at their worst-case
 * offsets, then moved down in parallel waves) gives the bytes of encoding through buffers of
 * their own, whatever the blocks' sizes: runs of well-coded, constant and incompressible
 * blocks of 4 KiB, so waves of every length. */
static void case_in_place_equals_buffered(void)
{
    enum { BLOCK = 4096, N = 3000 };
    size_t n = (size_t)BLOCK * N - 1234;
    uint8_t *src = malloc(n);
    uint16_t *w = weights(BF16, n / 2, 0.02);
    for (size_t b = 0; b * BLOCK < n; b++) {
        size_t len = b * BLOCK + BLOCK <= n ? BLOCK : n - b * BLOCK;
        unsigned kind = (unsigned)(next() % 5) == 0 ? (unsigned)(next() % 3) : 0;
        for (size_t i = 0; i < len; i++)
            src[b * BLOCK + i] = kind == 0   ? ((uint8_t *)w)[b * BLOCK + i]
                                 : kind == 1 ? 0x3c
                                             : (uint8_t)next();
    }
    size_t cap = ft_codec_bound(n, 2, BLOCK);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    for (int rep = 0; rep < 3; rep++) {
        memset(a, 0xee, cap);
        int64_t na = ft_codec_encode(ctx, src, n, 2, BLOCK, 0, a, cap);     /* in place */
        int64_t nb = ft_codec_encode(ctx, src, n, 2, BLOCK, 0, b, cap - 1); /* buffers */
        T_TRUE(na > 0 && na < (int64_t)n);
        T_EQ(na, nb);
        T_MEMEQ(a, b, (size_t)na);
        uint8_t *back = malloc(n);
        T_EQ(ft_codec_decode(ctx, a, (size_t)na, back, n), (int64_t)n);
        T_MEMEQ(back, src, n);
        free(back);
    }
    free(a);
    free(b);
    free(w);
    free(src);
}

static void case_store(void)
{
    /* FT_CODEC_STORE: raw planes, still blocks and checksums */
    size_t n = 200000;
    uint8_t *b = malloc(n), *out = malloc(n);
    memset(b, 0, n);
    size_t cap = ft_codec_bound(n, 1, 0);
    uint8_t *enc = malloc(cap);
    int64_t len = ft_codec_encode(ctx, b, n, 1, 0, FT_CODEC_STORE, enc, cap);
    T_TRUE(len > (int64_t)n && len < (int64_t)n + 64);
    T_EQ(ft_codec_decode(ctx, enc, (size_t)len, out, n), (int64_t)n);
    T_MEMEQ(out, b, n);
    enc[len - 5] ^= 1;
    T_EQ(ft_codec_decode(ctx, enc, (size_t)len, out, n), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "checksum") != NULL);
    T_EQ(ft_codec_encode(ctx, b, n, 1, 0, 0x80, enc, cap), -EINVAL);
    free(b);
    free(out);
    free(enc);
    /* the layout, byte for byte: per block, each byte plane as mode 0 and its bytes; random
     * data of every element size, 4 KiB blocks and a short last one, in place (the bound's
     * room) and through buffers (less) */
    size_t m = 3 * 4096 + 8 * 37;
    uint8_t *src = malloc(m), *back = malloc(m);
    t_fill_random(src, m, 11);
    for (unsigned e = 1; e <= 8; e *= 2)
        for (int tight = 0; tight < 2; tight++) {
            size_t room = ft_codec_bound(m, e, 4096) - (size_t)tight;
            uint8_t *st = malloc(room);
            int64_t got = ft_codec_encode(ctx, src, m, e, 4096, FT_CODEC_STORE, st, room);
            size_t table = 24 + 16 * 4, at = table;
            T_EQ(got, (int64_t)(table + m + 4 * e));
            T_EQ(st[4], e);
            for (size_t blk = 0; blk < 4; blk++) {
                size_t cnt = (blk < 3 ? 4096 : m - 3 * 4096) / e;
                for (unsigned k = 0; k < e; k++) {
                    T_EQ(st[at], 0);
                    int same = 1;
                    for (size_t i = 0; i < cnt; i++)
                        same &= st[at + 1 + i] == src[blk * 4096 + i * e + k];
                    T_TRUE(same);
                    at += 1 + cnt;
                }
            }
            T_EQ(ft_codec_decode(ctx, st, (size_t)got, back, m), (int64_t)m);
            T_MEMEQ(back, src, m);
            free(st);
        }
    free(src);
    free(back);
}

static void case_bad_arguments(void)
{
    uint8_t src[256] = {0}, dst[1024];
    T_EQ(ft_codec_encode(ctx, src, 256, 3, 0, 0, dst, sizeof dst), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "element size") != NULL);
    T_EQ(ft_codec_encode(ctx, src, 255, 2, 0, 0, dst, sizeof dst), -EINVAL);
    T_EQ(ft_codec_encode(ctx, src, 256, 4, 100, 0, dst, sizeof dst), -EINVAL);
    T_EQ(ft_codec_encode(ctx, src, 256, 4, 0, 0, dst, 10), -ENOSPC);
    T_EQ(ft_codec_encode(ctx, NULL, 256, 4, 0, 0, dst, sizeof dst), -EINVAL);
    int64_t n = ft_codec_encode(ctx, src, 256, 4, 0, 0, dst, sizeof dst);
    T_TRUE(n > 0);
    uint8_t out[256];
    T_EQ(ft_codec_decode(ctx, dst, (size_t)n, out, 255), -ENOSPC);
    T_EQ(ft_codec_decode(ctx, src, sizeof src, out, sizeof out), -EBADMSG);
    T_TRUE(strstr(ft_last_error(), "magic") != NULL);
    T_EQ(ft_codec_size(src, 10), -EBADMSG);
    for (int64_t cut = 0; cut < n; cut++) /* every truncation is refused */
        T_EQ(ft_codec_decode(ctx, dst, (size_t)cut, out, sizeof out), -EBADMSG);
}

static void case_corrupt_streams(void)
{
    /* flipped bytes anywhere: -EBADMSG (the structure or the block checksums show it),
     * never a read or write out of bounds (the sanitizer builds watch) */
    size_t n = 300000;
    void *w = weights(BF16, n / 2, 0.02);
    size_t cap = ft_codec_bound(n, 2, 4096);
    uint8_t *enc = malloc(cap), *bad = malloc(cap), *out = malloc(n);
    int64_t len = ft_codec_encode(ctx, w, n, 2, 4096, 0, enc, cap);
    T_TRUE(len > 0);
    unsigned refused = 0;
    for (int trial = 0; trial < 400; trial++) {
        memcpy(bad, enc, (size_t)len);
        for (int f = 0; f < 1 + trial % 4; f++)
            bad[next() % (uint64_t)len] ^= (uint8_t)(1u << (next() % 8));
        int64_t r = ft_codec_decode(ctx, bad, (size_t)len, out, n);
        if (r == (int64_t)n) /* a flip the decode does not see must change nothing */
            T_MEMEQ(out, w, n);
        else
            T_EQ(r, -EBADMSG);
        refused += r < 0;
        /* the GPU decoder's host checks and lanes: refused, or decoded (its checksums are
         * not checked on the GPU), never out of bounds */
        r = ft__codec_decode_lanes(bad, (size_t)len, out, n);
        T_TRUE(r == (int64_t)n || r == -EBADMSG);
    }
    printf("  %u of 400 corrupted streams refused\n", refused);
    free(enc);
    free(bad);
    free(out);
    free(w);
}

/* xxh3-64 of @p len bytes at @p p as the GPU encoder's count step computes it: its whole
 * 1 KiB blocks from aligned copies of 14 KiB tiles (shared memory there), the rest from
 * @p p */
static uint64_t xxh3_dev(const uint8_t *p, size_t len)
{
    uint64_t a = (uint64_t)(uintptr_t)p, acc[8], keys[17];
    if (len <= 240)
        return ftz_xxh3_short(a, (uint32_t)len);
    static uint64_t tile[FTZ_TILE / 8];
    uint64_t nx = (len - 1) / 1024;
    for (unsigned l = 0; l < 8; l++) {
        acc[l] = ftz_xxh3_init(l, keys);
        for (uint64_t t = 0; FTZ_TILE / 1024 * t < nx; t++) {
            uint64_t nb = FT__MIN(FTZ_TILE / 1024, nx - FTZ_TILE / 1024 * t);
            memcpy(tile, p + t * FTZ_TILE, nb * 1024);
            acc[l] = ftz_xxh3_blocks(acc[l], (uint64_t)(uintptr_t)tile, nb, l, keys);
        }
        acc[l] = ftz_xxh3_tail(acc[l], a, len, l);
    }
    return ftz_xxh3_merge(acc, len);
}

/* The GPU encoder's block checksum: xxh3-64 as libxxhash computes it, every length to 1100
 * (each of the short, middle and long forms, the long one's partial last stripes), lengths
 * about the 1 KiB stripe blocks, large ones, at odd addresses. */
static void case_gpu_xxh3(void)
{
    size_t max = 3u << 20;
    uint8_t *buf = aligned_alloc(256, max + 512);
    for (size_t i = 0; i < max + 512; i++)
        buf[i] = (uint8_t)next();
    size_t lens[] = {1023, 1024, 1025, 2047, 2048, 2049, 4096, 65536 + 63, 1u << 20, max};
    unsigned bad = 0, checked = 0;
    for (size_t shift = 0; shift < 8; shift += 3)
        for (size_t i = 0; i < 1100 + sizeof lens / sizeof *lens; i++) {
            size_t len = i < 1100 ? i : lens[i - 1100];
            const uint8_t *p = buf + shift;
            uint64_t h = xxh3_dev(p, len);
            checked++;
            if (h != XXH3_64bits(p, len) && bad++ < 5)
                T_FAIL("xxh3 of %zu bytes at +%zu: %016llx, libxxhash %016llx", len, shift,
                       (unsigned long long)h, (unsigned long long)XXH3_64bits(p, len));
        }
    printf("  %u lengths and offsets checked\n", checked);
    T_EQ(bad, 0u);
    free(buf);
    /* no load past the aligned word that holds the input's last byte (device memory is
     * allocated in whole words; the next may be unmapped): each input ends at a guard page */
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *map = mmap(NULL, 3 * (size_t)page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T_TRUE(map != MAP_FAILED);
    if (map == MAP_FAILED)
        return;
    T_EQ(mprotect(map + 2 * page, (size_t)page, PROT_NONE), 0);
    for (size_t i = 0; i < 2 * (size_t)page; i++)
        map[i] = (uint8_t)next();
    for (size_t len = 0; len <= 1100; len++)
        for (size_t tail = 0; tail < 4; tail++) { /* bytes of the last word past the input */
            const uint8_t *p = map + 2 * (size_t)page - tail - len;
            uint64_t h = xxh3_dev(p, len);
            if (h != XXH3_64bits(p, len) && bad++ < 5)
                T_FAIL("xxh3 of %zu bytes before a guard page: %016llx", len,
                       (unsigned long long)h);
        }
    munmap(map, 3 * (size_t)page);
}

/* The GPU encoder's stream layout keeps encode.c's bounds exactly: put_stream stores 8
 * bytes at a time, so a plane is stored raw where a group of four symbols would start less
 * than 8 bytes before the raw plane's end, or a last partial byte would pass it (margins the
 * code's estimate leaves so wide that data reaches them only in contrived cases; here the
 * stream sizes are set to either side of each bound). Empty streams check nothing. */
static void case_gpu_layout_bounds(void)
{
    uint64_t bits[FTZ_LANES], last[FTZ_LANES];
    uint32_t start[FTZ_LANES];
    const uint32_t n = 1000; /* 32 elements a stream: stream 31 holds 992..999 */
    const uint64_t at31 = 1 + FTZ_HUFF_HEAD + 31 * 20, end = 1 + n;
    for (unsigned j = 0; j < FTZ_LANES; j++)
        bits[j] = 8 * 20, last[j] = 0;
    /* the last group's start: at most end - 8 */
    bits[31] = 8 * 118;
    last[31] = 8 * (end - 8 - at31);
    T_EQ(ftz_plane_layout(n, bits, last, start), (uint32_t)(at31 + 118));
    T_EQ(start[31], (uint32_t)at31);
    last[31] += 8;
    T_EQ(ftz_plane_layout(n, bits, last, start), 0u);
    /* a last partial byte: at most end - 1 */
    last[31] = 0;
    bits[31] = 8 * (end - 1 - at31) + 1;
    T_EQ(ftz_plane_layout(n, bits, last, start), (uint32_t)end);
    bits[31] += 8;
    T_EQ(ftz_plane_layout(n, bits, last, start), 0u);
    bits[31] = 8 * (end - at31); /* whole bytes to the very end: no partial byte to check */
    T_EQ(ftz_plane_layout(n, bits, last, start), (uint32_t)end);
    /* empty streams: 300 elements, 16 a stream, streams 19 to 31 empty */
    const uint32_t m = 300;
    for (unsigned j = 0; j < FTZ_LANES; j++)
        bits[j] = j < 19 ? 8 : 0, last[j] = 0;
    uint32_t from, to;
    ftz_lane_range(m, 19, &from, &to);
    T_EQ(from, to);
    ftz_lane_range(m, 18, &from, &to);
    T_EQ(to - from, 12u);
    T_EQ(ftz_plane_layout(m, bits, last, start), 1u + FTZ_HUFF_HEAD + 19);
}

/* Without a CUDA driver, ft_codec_decode_cuda and ft_codec_encode_cuda say why (test_gpu.c
 * decodes and encodes on the GPU). */
static void case_gpu_decode_without_cuda(void)
{
    const char *why;
    if (ft_cuda_available(&why)) {
        printf("  CUDA is here: test_gpu decodes on the GPU\n");
        return;
    }
    uint8_t src[256] = {0}, enc[1024], out[256];
    int64_t n = ft_codec_encode(ctx, src, sizeof src, 2, 0, 0, enc, sizeof enc);
    T_TRUE(n > 0);
    ft_codec_job job = {enc, (size_t)n, NULL, out, sizeof out};
    T_EQ(ft_codec_decode_cuda(ctx, &job, 1, 0, NULL), -ENODEV);
    T_TRUE(strstr(ft_last_error(), "GPU") != NULL);
    T_EQ(ft_codec_encode_cuda(ctx, src, sizeof src, 2, 0, enc, sizeof enc, 0, NULL), -ENODEV);
    T_TRUE(strstr(ft_last_error(), "GPU encode") != NULL);
    T_EQ(ft_codec_encode_cuda(ctx, src, sizeof src, 3, 0, enc, sizeof enc, 0, NULL), -EINVAL);
}

int main(void)
{
    ctx = t_ctx(4);
    const t_case cases[] = {
        {"weights of every width, edge sizes and block sizes", case_weights},
        {"compression ratio of weights", case_ratio},
        {"incompressible and constant data", case_incompressible_and_constant},
        {"NaN payloads, -0, infinities, subnormals", case_special_values},
        {"skewed symbols: code lengths limited", case_skewed_symbols},
        {"the same stream from 1 thread and many", case_deterministic_across_threads},
        {"in place (moved in waves) equals through buffers", case_in_place_equals_buffered},
        {"FT_CODEC_STORE: raw planes, checksummed", case_store},
        {"bad arguments, truncated and foreign streams", case_bad_arguments},
        {"corrupt streams decode without harm", case_corrupt_streams},
        {"GPU decoding and encoding without CUDA", case_gpu_decode_without_cuda},
        {"the GPU encoder's checksum is xxh3-64", case_gpu_xxh3},
        {"the GPU encoder's stream layout keeps encode.c's bounds", case_gpu_layout_bounds},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
