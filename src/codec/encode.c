/*
 * The tensor codec's encoder (decode.c describes the format and decodes): per block, each
 * byte plane gathered and counted, then stored raw, as one byte, or Huffman-coded, whichever
 * is smallest; blocks encoded in parallel at their worst-case offsets, then moved to their
 * places in parallel waves.
 */
#include "codec.h"
#include "enc_dev.h"

#include <errno.h>
#include <stdlib.h>

/* ---- code lengths ---- */

/* Huffman code lengths (at most MAXLEN) of the @p n >= 2 used symbols of @p count: the GPU
 * encoder's (enc_dev.h), so both write one code. */
static void code_lengths(const uint64_t count[256], uint8_t len[256])
{
    uint32_t c[256];
    for (unsigned s = 0; s < 256; s++)
        c[s] = (uint32_t)FT__MIN(count[s], (uint64_t)UINT32_MAX);
    ftz_code_lengths(c, len);
}

/* ---- encoding ---- */

/*
 * One stream: the codes of plane bytes s[from, to), most significant bit first, from the
 * table @p cl (code << 8 | length). Branch-free: up to four codes (at most 48 bits) join the
 * at most 7 bits pending, then all 8 bytes of the accumulator are stored and the pointer
 * moves on by the whole bytes among them; so each store writes up to 8 bytes past the
 * stream's end, which the next stream (or plane) overwrites. @return the stream's end, or
 * NULL where it would reach past @p end - 8.
 */
static uint8_t *put_stream(const uint8_t *s, size_t from, size_t to, const uint32_t cl[256],
                           uint8_t *p, const uint8_t *end)
{
    uint64_t buf = 0;
    unsigned cnt = 0;
    for (size_t i = from; i < to; i += 4) {
        if (end - p < 8)
            return NULL;
        if (to - i >= 4) {
#pragma GCC unroll 4
            for (unsigned j = 0; j < 4; j++) {
                uint32_t c = cl[s[i + j]];
                cnt += c & 0xff;
                buf |= (uint64_t)(c >> 8) << (64 - cnt);
            }
        } else {
            for (size_t j = i; j < to; j++) {
                uint32_t c = cl[s[j]];
                cnt += c & 0xff;
                buf |= (uint64_t)(c >> 8) << (64 - cnt);
            }
        }
        uint64_t be = __builtin_bswap64(buf);
        memcpy(p, &be, 8);
        p += cnt >> 3;
        buf <<= cnt & ~7u; /* (cnt <= 7 + 4 * MAXLEN = 55) */
        cnt &= 7;
    }
    if (cnt) { /* the last bits, zero-padded: stored by the last 8-byte store already */
        if (end - p < 1)
            return NULL;
        p++;
    }
    return p;
}

/*
 * Byte @p k of each of the @p n @p e-byte elements at @p src into @p plane, counted into
 * @p count. Eight tables, one per element of a group of eight: a plane of a few values (an
 * exponent byte) would otherwise chain each increment on the one before through memory.
 */
static inline __attribute__((always_inline)) void
gather_plane(const uint8_t *restrict src, size_t n, unsigned e, unsigned k,
             uint8_t *restrict plane, uint64_t count[256])
{
    uint32_t t[8][256 + 16]; /* (padded: tables 4 KiB apart would alias in the store buffer) */
    memset(t, 0, sizeof t);
    const uint8_t *x = src + k;
    size_t i = 0;
    for (; n - i >= 8; i += 8)
#pragma GCC unroll 8
        for (unsigned g = 0; g < 8; g++) {
            uint8_t v = x[(i + g) * e];
            plane[i + g] = v;
            t[g][v]++;
        }
    for (; i < n; i++) {
        plane[i] = x[i * e];
        t[0][plane[i]]++;
    }
    for (unsigned v = 0; v < 256; v++) {
        uint64_t c = 0;
        for (unsigned g = 0; g < 8; g++)
            c += t[g][v];
        count[v] = c;
    }
}

/* Encode plane @p s (@p n bytes, histogram @p count) into @p out (room for 1 + n bytes: it
 * is kept only when smaller than raw). @return the bytes written. */
static size_t encode_plane(const uint8_t *s, size_t n, const uint64_t count[256], uint8_t *out)
{
    unsigned used = 0;
    for (unsigned v = 0; v < 256; v++)
        used += count[v] != 0;
    if (used == 1) {
        out[0] = MODE_CONST;
        out[1] = s[0];
        return 2;
    }
    if (used == 0 || n <= 1 + HUFF_HEAD(STREAMS)) {
        out[0] = MODE_RAW;
        memcpy(out + 1, s, n);
        return 1 + n;
    }
    uint8_t len[256];
    uint16_t code[256];
    code_lengths(count, len);
    ft__codec_canonical(len, code);
    uint64_t bits = 0;
    for (unsigned v = 0; v < 256; v++)
        bits += count[v] * len[v];
    if (1 + HUFF_HEAD(STREAMS) + bits / 8 + STREAMS >= n) { /* no gain: raw */
        out[0] = MODE_RAW;
        memcpy(out + 1, s, n);
        return 1 + n;
    }
    out[0] = MODE_HUFF;
    for (unsigned i = 0; i < 128; i++)
        out[1 + i] = (uint8_t)(len[2 * i] | len[2 * i + 1] << 4);
    uint8_t *sizes = out + 1 + 128, *at = out + 1 + HUFF_HEAD(STREAMS), *end = out + 1 + n;
    uint32_t cl[256];
    for (unsigned v = 0; v < 256; v++)
        cl[v] = (uint32_t)code[v] << 8 | len[v];
    size_t seg[STREAMS + 1];
    ft__codec_split(n, STREAMS, true, seg);
    for (int k = 0; k < STREAMS; k++) {
        uint8_t *next = put_stream(s, seg[k], seg[k + 1], cl, at, end);
        if (!next) { /* (the estimate above leaves this to the last few bytes; stay safe) */
            out[0] = MODE_RAW;
            memcpy(out + 1, s, n);
            return 1 + n;
        }
        put32(sizes + 4 * k, (uint32_t)(next - at));
        at = next;
    }
    return (size_t)(at - out);
}

typedef struct {
    const uint8_t *src;
    uint64_t nbytes;
    unsigned esize;
    uint32_t block;
    uint32_t nblocks;
    bool store;      /* FT_CODEC_STORE: every plane raw */
    uint8_t *room;   /* the caller's buffer after the table, when it has ft_codec_bound's
                        room: block b is encoded in place at its worst-case offset */
    uint8_t **bufs;  /* else per block, its encoding */
    size_t *sizes;
    uint64_t *csums; /* per block, the checksum of its bytes */
    uint64_t *at;    /* per block, its offset in the output after the table */
    uint8_t *out;    /* the output after the table */
    uint32_t wave;   /* the first block of the wave being placed */
} enc_job;

/* The most bytes block @p b's encoding takes (each plane: a mode byte and at most raw). */
static uint64_t block_room(const enc_job *j, uint32_t b)
{
    (void)b;
    return (uint64_t)j->block + j->esize;
}

static int64_t encode_block(void *arg, unsigned b)
{
    enc_job *j = arg;
    uint64_t off = (uint64_t)b * j->block;
    size_t len = (size_t)FT__MIN((uint64_t)j->block, j->nbytes - off);
    size_t n = len / j->esize;
    const uint8_t *src = j->src + off;
    uint8_t *plane = j->store ? NULL : ft__codec_scratch(n ? n : 1);
    uint8_t *out = j->room ? j->room + (uint64_t)b * block_room(j, b)
                           : malloc(j->esize * (n + 1) + 1);
    if ((!plane && !j->store) || !out) {
        if (!j->room)
            free(out);
        return -ENOMEM;
    }
    size_t at = 0;
    unsigned e = j->esize;
    for (unsigned k = 0; k < e && j->store; k++) { /* raw planes: no counting, no scratch */
        out[at] = MODE_RAW;
        if (e == 1)
            memcpy(out + at + 1, src, n);
        else
            for (size_t i = 0; i < n; i++)
                out[at + 1 + i] = src[i * e + k];
        at += 1 + n;
    }
    for (unsigned k = 0; k < e && !j->store; k++) {
        uint64_t count[256];
        switch (e) { /* constant element sizes: the gather's strides are immediates */
        case 1: gather_plane(src, n, 1, k, plane, count); break;
        case 2: gather_plane(src, n, 2, k, plane, count); break;
        case 4: gather_plane(src, n, 4, k, plane, count); break;
        default: gather_plane(src, n, 8, k, plane, count); break;
        }
        at += encode_plane(plane, n, count, out + at);
    }
    if (!j->room)
        j->bufs[b] = out;
    j->sizes[b] = at;
    j->csums[b] = ft__csum(src, len);
    return 0;
}

void ft__codec_head(uint8_t *d, unsigned esize, uint64_t nbytes, uint32_t block_bytes,
                    uint32_t nblocks)
{
    memcpy(d, MAGIC, 4);
    d[4] = (uint8_t)esize;
    d[5] = 2;
    d[6] = STREAMS;
    d[7] = 0;
    put64(d + 8, nbytes);
    put32(d + 16, block_bytes);
    put32(d + 20, nblocks);
}

size_t ft_codec_bound(uint64_t nbytes, unsigned elem_size, uint32_t block_bytes)
{
    if (elem_size == 0)
        return 0;
    uint64_t block = block_bytes ? block_bytes : DEFAULT_BLOCK;
    uint64_t nblocks = (nbytes + block - 1) / block;
    return (size_t)(HEAD + ENTRY * nblocks + nbytes + (uint64_t)elem_size * 2 * nblocks);
}

/* Block wave + @p i to its place in the output: down from its worst-case offset (in place),
 * or from its own buffer. */
static int64_t place_block(void *arg, unsigned i)
{
    enc_job *j = arg;
    uint32_t b = j->wave + i;
    uint8_t *from = j->room ? j->room + (uint64_t)b * block_room(j, b) : NULL;
    if (from == j->out + j->at[b]) /* already there (a stored block, every one before too) */
        return 0;
    if (j->room)
        memmove(j->out + j->at[b], from, j->sizes[b]);
    else
        memcpy(j->out + j->at[b], j->bufs[b], j->sizes[b]);
    return 0;
}

/*
 * Every block to its place, in parallel. From their own buffers, all at once. In place, each
 * block moves down (its place is at most its worst-case offset) and may land on the
 * worst-case room of blocks before it: so in waves. Once the blocks before block w have
 * moved, every block whose place ends at or below w's worst-case offset can move together
 * (with w itself, which only overlaps its own room): with coded blocks of ratio r, each wave
 * is about 1/r times the blocks placed before it, a few dozen waves for a million blocks.
 * @p results: room for the block count. @return 0 or -ENOMEM.
 */
static int place_blocks(ft__pool *pool, enc_job *j, int64_t *results)
{
    int rc = 0;
    for (uint32_t w = 0; w < j->nblocks && rc == 0;) {
        uint32_t e = w + 1;
        if (!j->room)
            e = j->nblocks;
        else
            while (e < j->nblocks && j->at[e] + j->sizes[e] <= (uint64_t)w * block_room(j, w))
                e++;
        j->wave = w;
        rc = e - w == 1 ? (int)place_block(j, 0)
                        : ft__pool_run(pool, e - w, place_block, j, results);
        w = e;
    }
    return rc;
}

int64_t ft__codec_encode(ft__pool *pool, const void *src, uint64_t nbytes, unsigned elem_size,
                         uint32_t block_bytes, unsigned flags, void *dst, size_t cap)
{
    if ((!src && nbytes) || !dst)
        return ft__err(-EINVAL, "codec: NULL argument");
    int rc = ft__codec_check_args(nbytes, elem_size, &block_bytes);
    if (rc < 0)
        return rc;
    uint32_t nblocks = (uint32_t)((nbytes + block_bytes - 1) / block_bytes);
    size_t table = HEAD + ENTRY * (size_t)nblocks;
    uint64_t at = 0;
    if (cap < table)
        return ft__err(-ENOSPC, "codec: %zu bytes of room, the header alone needs %zu", cap,
                       table);
    bool in_place = cap >= ft_codec_bound(nbytes, elem_size, block_bytes);
    if (flags & ~(unsigned)FT_CODEC_STORE)
        return ft__err(-EINVAL, "codec: unknown flags 0x%x", flags);
    enc_job j = {src, nbytes, elem_size, block_bytes, nblocks, (flags & FT_CODEC_STORE) != 0,
                 in_place ? (uint8_t *)dst + table : NULL,
                 calloc(nblocks ? nblocks : 1, sizeof(uint8_t *)),
                 calloc(nblocks ? nblocks : 1, sizeof(size_t)),
                 calloc(nblocks ? nblocks : 1, sizeof(uint64_t)),
                 calloc(nblocks ? nblocks : 1, sizeof(uint64_t)), NULL, 0};
    int64_t *results = calloc(nblocks ? nblocks : 1, sizeof *results);
    if (!j.bufs || !j.sizes || !j.csums || !j.at || !results) {
        rc = ft__err(-ENOMEM, "codec: %u blocks", nblocks);
        goto out;
    }
    if ((rc = ft__pool_run(pool, nblocks, encode_block, &j, results)) < 0) {
        ft__err(rc, "codec: encoding");
        goto out;
    }
    for (uint32_t b = 0; b < nblocks; b++)
        if (results[b] < 0) {
            rc = ft__err((int)results[b], "codec: encoding block %u", b);
            goto out;
        }
    uint8_t *d = dst;
    ft__codec_head(d, elem_size, nbytes, block_bytes, nblocks);
    for (uint32_t b = 0; b < nblocks; b++) {
        if (table + at + j.sizes[b] > cap) {
            rc = ft__err(-ENOSPC, "codec: %zu bytes of room are too few", cap);
            goto out;
        }
        j.at[b] = at; /* where the block goes, after the table */
        at += j.sizes[b];
        put64(d + HEAD + ENTRY * (size_t)b, at);
        put64(d + HEAD + ENTRY * (size_t)b + 8, j.csums[b]);
    }
    j.out = d + table;
    if ((rc = place_blocks(pool, &j, results)) < 0)
        ft__err(rc, "codec: placing the blocks");

out:
    if (j.bufs)
        for (uint32_t b = 0; b < nblocks; b++)
            free(j.bufs[b]);
    free(j.bufs);
    free(j.sizes);
    free(j.csums);
    free(j.at);
    free(results);
    return rc < 0 ? rc : (int64_t)(table + at);
}
