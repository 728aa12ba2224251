/*
 * The tensor codec: lossless compression of floating-point weights by byte planes.
 *
 * The sign-and-exponent byte of bf16/fp16 (and the high bytes of fp32) carries a few bits of
 * information; the mantissa bytes are close to random. So each block of elements is split
 * into its byte planes (plane k: byte k of every element, little-endian) and each plane is
 * stored the cheapest of three ways: raw, as one repeated byte, or Huffman-coded (canonical
 * code, lengths at most 12 bits, S bit streams per plane: a CPU decoder keeps four table
 * lookups in flight, a GPU decoder gives each stream to one lane of a warp, and the streams
 * of the planes of one element range line up, so a lane assembles whole elements). Blocks
 * are independent: they encode and decode in parallel, and a reader can decode a block range
 * alone. The encoder is encode.c, the GPU decoder gpu.c and kernel.cu.
 *
 * Stream (little-endian):
 *   "FTZ1", u8 elem_size, u8 version (2; 1 is still read), u8 S (streams per coded plane:
 *   32; version 1: 0, meaning 4), u8 0, u64 decoded bytes, u32 block bytes, u32 blocks, per
 *   block u64 end (from the end of this table) and u64 xxh3-64 of its decoded bytes (checked
 *   by every host decode), then the blocks.
 * Block of n elements: per plane, u8 mode; raw: the plane's bytes; const: u8 value; huff: 128
 *   bytes of 4-bit code lengths (symbol 2i in the low nibble of byte i), u32 size of each of
 *   the S streams, the streams (MSB first, each padded to a byte). Stream j holds the symbols
 *   of elements [min(n, q j), min(n, q (j + 1))), q = ceil(n / S) rounded up to a multiple of
 *   8 (version 1: not rounded).
 */
#include "codec.h"

#include <errno.h>
#include <stdlib.h>

/* ---- per-thread scratch ----
 * A block's planes need a buffer of about the block's size. malloc gives buffers that large
 * straight from mmap and munmaps them on free, so each block would fault in fresh pages (and
 * in a VM that costs more than coding it): each thread keeps one buffer instead. */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

typedef struct scratch_buf {
    size_t cap;
    uint8_t data[];
} scratch_buf;

static void scratch_make_key(void)
{
    pthread_key_create(&scratch_key, free);
}

uint8_t *ft__codec_scratch(size_t n)
{
    pthread_once(&scratch_once, scratch_make_key);
    scratch_buf *s = pthread_getspecific(scratch_key);
    if (s && s->cap >= n)
        return s->data;
    scratch_buf *grown = malloc(sizeof *grown + n);
    if (!grown || pthread_setspecific(scratch_key, grown) != 0) {
        free(grown);
        return NULL;
    }
    free(s);
    grown->cap = n;
    return grown->data;
}

/* ---- what encoder and decoder share ---- */

int ft__codec_canonical(const uint8_t len[256], uint16_t code[256])
{
    unsigned nlen[MAXLEN + 1] = {0};
    for (unsigned s = 0; s < 256; s++)
        nlen[len[s]]++;
    nlen[0] = 0;
    uint32_t next[MAXLEN + 2], c = 0, kraft = 0;
    for (unsigned l = 1; l <= MAXLEN; l++) {
        c = (c + nlen[l - 1]) << 1;
        next[l] = c;
        kraft += nlen[l] * (TABLE >> l);
    }
    if (kraft > TABLE)
        return -1;
    for (unsigned s = 0; s < 256; s++)
        if (len[s])
            code[s] = (uint16_t)next[len[s]]++;
    return 0;
}

void ft__codec_split(size_t n, unsigned S, bool round8, size_t seg[STREAMS + 1])
{
    size_t q = (n + S - 1) / S;
    if (round8)
        q = (q + 7) & ~(size_t)7;
    for (unsigned i = 0; i < S; i++)
        seg[i] = FT__MIN(n, q * (size_t)i);
    seg[S] = n;
}

int ft__codec_check_args(uint64_t nbytes, unsigned esize, uint32_t *block)
{
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
        return ft__err(-EINVAL, "codec: element size %u (1, 2, 4 or 8)", esize);
    if (nbytes % esize)
        return ft__err(-EINVAL, "codec: %llu bytes are not whole %u-byte elements",
                       (unsigned long long)nbytes, esize);
    if (*block == 0)
        *block = DEFAULT_BLOCK;
    if (*block % esize || *block < 64 * esize)
        return ft__err(-EINVAL, "codec: block of %u bytes (a multiple of the element size, "
                       "at least 64 elements)", *block);
    if ((nbytes + *block - 1) / *block > UINT32_MAX)
        return ft__err(-EINVAL, "codec: too many blocks");
    return 0;
}

/* ---- decoding ---- */

typedef struct {
    uint64_t buf;
    unsigned cnt;
    const uint8_t *p, *end;
} bitr;

static inline void br_refill(bitr *r)
{
    if (r->end - r->p >= 8) {
        r->buf |= load_be64(r->p) >> r->cnt;
        r->p += (63 - r->cnt) >> 3;
        r->cnt |= 56;
        return;
    }
    while (r->cnt <= 56) { /* the last bytes, then zeros */
        uint64_t byte = r->p < r->end ? *r->p++ : 0;
        r->buf |= byte << (56 - r->cnt);
        r->cnt += 8;
    }
}

static inline uint8_t br_sym(bitr *r, const uint16_t *table)
{
    uint16_t e = table[r->buf >> (64 - MAXLEN)];
    unsigned l = e >> 8;
    r->buf <<= l;
    r->cnt -= l;
    return (uint8_t)e;
}

/* The code of a Huffman plane's 128 length bytes at @p p: its lengths and canonical codes.
 * @return 0, or -EBADMSG (a length over 12, a code that over-subscribes). */
static int plane_code(const uint8_t *p, uint8_t len[256], uint16_t code[256])
{
    for (unsigned i = 0; i < 128; i++) {
        len[2 * i] = p[i] & 15;
        len[2 * i + 1] = p[i] >> 4;
    }
    for (unsigned s = 0; s < 256; s++)
        if (len[s] > MAXLEN)
            return -EBADMSG;
    return ft__codec_canonical(len, code) < 0 ? -EBADMSG : 0;
}

/* Decode a Huffman plane of @p n symbols (@p S streams) from [p, end) into @p out.
 * @return 0, -EBADMSG. */
static int decode_huff(const uint8_t *p, const uint8_t *end, size_t n, unsigned S, bool round8,
                       uint8_t *out)
{
    if ((size_t)(end - p) < HUFF_HEAD(S))
        return -EBADMSG;
    uint8_t len[256];
    uint16_t code[256];
    if (plane_code(p, len, code) < 0)
        return -EBADMSG;
    uint16_t table[TABLE];
    for (unsigned i = 0; i < TABLE; i++)
        table[i] = (uint16_t)(MAXLEN << 8); /* unused codes: a 12-bit zero (corrupt input) */
    for (unsigned s = 0; s < 256; s++)
        if (len[s]) {
            unsigned lo = (unsigned)code[s] << (MAXLEN - len[s]), hi = lo + (TABLE >> len[s]);
            for (unsigned i = lo; i < hi; i++)
                table[i] = (uint16_t)(s | len[s] << 8);
        }
    const uint8_t *at = p + HUFF_HEAD(S);
    bitr r[STREAMS];
    size_t seg[STREAMS + 1];
    ft__codec_split(n, S, round8, seg);
    for (unsigned k = 0; k < S; k++) {
        uint32_t sz = get32(p + 128 + 4 * k);
        if ((size_t)(end - at) < sz)
            return -EBADMSG;
        r[k] = (bitr){0, 0, at, at + sz};
        at += sz;
    }
    /* four streams in step while each of them has four symbols left (the last ones may be
     * shorter), then the rest of each */
    for (unsigned g = 0; g < S; g += 4) {
        size_t i = 0;
        if (g + 4 <= S) {
            size_t common = seg[g + 1] - seg[g];
            for (unsigned k = g + 1; k < g + 4; k++)
                common = FT__MIN(common, seg[k + 1] - seg[k]);
            bitr *r0 = &r[g], *r1 = &r[g + 1], *r2 = &r[g + 2], *r3 = &r[g + 3];
            uint8_t *o0 = out + seg[g], *o1 = out + seg[g + 1], *o2 = out + seg[g + 2],
                    *o3 = out + seg[g + 3];
            for (; i + 4 <= common; i += 4) {
                br_refill(r0);
                br_refill(r1);
                br_refill(r2);
                br_refill(r3);
                for (int t = 0; t < 4; t++) {
                    o0[i + t] = br_sym(r0, table);
                    o1[i + t] = br_sym(r1, table);
                    o2[i + t] = br_sym(r2, table);
                    o3[i + t] = br_sym(r3, table);
                }
            }
        }
        for (unsigned k = g; k < FT__MIN(g + 4, S); k++)
            for (size_t m = seg[k] + i; m < seg[k + 1]; m++) {
                br_refill(&r[k]);
                out[m] = br_sym(&r[k], table);
            }
    }
    return 0;
}

/* The elements of @p n bytes per plane back together: byte k of element i is plane[k][i]. */
static void interleave(uint8_t *restrict dst, const uint8_t *const plane[8], size_t n,
                       unsigned e)
{
    if (e == 1) {
        memcpy(dst, plane[0], n);
    } else if (e == 2) {
        const uint8_t *a = plane[0], *b = plane[1];
        for (size_t i = 0; i < n; i++) {
            dst[2 * i] = a[i];
            dst[2 * i + 1] = b[i];
        }
    } else if (e == 4) {
        const uint8_t *a = plane[0], *b = plane[1], *c = plane[2], *d = plane[3];
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = a[i];
            dst[4 * i + 1] = b[i];
            dst[4 * i + 2] = c[i];
            dst[4 * i + 3] = d[i];
        }
    } else {
        for (unsigned k = 0; k < e; k++)
            for (size_t i = 0; i < n; i++)
                dst[i * e + k] = plane[k][i];
    }
}

typedef struct {
    const uint8_t *blocks;   /* the first block */
    const uint8_t *ends;     /* the block end table */
    size_t data_len;         /* bytes from blocks to the stream's end */
    uint8_t *dst;
    uint64_t nbytes;
    unsigned esize;
    uint32_t block;
    unsigned streams; /* per coded plane */
    bool round8;      /* stream ranges rounded to 8 elements (version 2) */
} dec_job;

static int64_t decode_block(void *arg, unsigned b)
{
    dec_job *j = arg;
    uint64_t start = b ? get64(j->ends + ENTRY * ((size_t)b - 1)) : 0;
    uint64_t stop = get64(j->ends + ENTRY * (size_t)b);
    if (start > stop || stop > j->data_len)
        return -EBADMSG;
    const uint8_t *p = j->blocks + start, *end = j->blocks + stop;
    uint64_t off = (uint64_t)b * j->block;
    size_t len = (size_t)FT__MIN((uint64_t)j->block, j->nbytes - off);
    size_t n = len / j->esize;
    unsigned e = j->esize;
    uint8_t *dst = j->dst + off;
    const uint8_t *plane[8];
    int mode[8];
    uint8_t *scratch = NULL;
    int rc = 0;
    for (unsigned k = 0; k < e; k++) {
        if (p >= end) {
            rc = -EBADMSG;
            goto out;
        }
        mode[k] = *p++;
        if (mode[k] != MODE_RAW && !scratch && !(scratch = ft__codec_scratch(n * e + 1))) {
            rc = -ENOMEM;
            goto out;
        }
        if (mode[k] == MODE_CONST) {
            if (p >= end) {
                rc = -EBADMSG;
                goto out;
            }
            memset(scratch + n * k, *p++, n);
            plane[k] = scratch + n * k;
        } else if (mode[k] == MODE_RAW) {
            if ((size_t)(end - p) < n) {
                rc = -EBADMSG;
                goto out;
            }
            plane[k] = p;
            p += n;
        } else if (mode[k] == MODE_HUFF) {
            uint8_t *o = scratch + n * k;
            if ((rc = decode_huff(p, end, n, j->streams, j->round8, o)) < 0)
                goto out;
            uint64_t total = 0;
            for (unsigned s = 0; s < j->streams; s++)
                total += get32(p + 128 + 4 * s);
            p += HUFF_HEAD(j->streams) + total;
            plane[k] = o;
        } else {
            rc = -EBADMSG;
            goto out;
        }
    }
    if (p != end) {
        rc = -EBADMSG;
        goto out;
    }
    interleave(dst, plane, n, e);
    if (ft__csum(dst, len) != get64(j->ends + ENTRY * (size_t)b + 8))
        rc = -EILSEQ; /* decoded, but not the bytes that were encoded */
out:
    return rc;
}

/* Parse the header of @p src. @return 0, or -EBADMSG with a message. */
static int parse_head(const uint8_t *s, size_t len, dec_job *j, uint32_t *nblocks)
{
    if (len < HEAD || memcmp(s, MAGIC, 4) != 0)
        return ft__err(-EBADMSG, "codec: not a fastensor codec stream (no FTZ1 magic)");
    if (!((s[5] == 1 && s[6] == 0) || (s[5] == 2 && s[6] >= 1 && s[6] <= STREAMS)) || s[7])
        return ft__err(-EBADMSG, "codec: stream version %u, %u streams, flags %u (this library "
                       "reads versions 1 and 2 with at most %u streams)", s[5], s[6], s[7],
                       STREAMS);
    j->streams = s[5] == 1 ? 4 : s[6];
    j->round8 = s[5] == 2;
    j->esize = s[4];
    j->nbytes = get64(s + 8);
    j->block = get32(s + 16);
    *nblocks = get32(s + 20);
    uint32_t block = j->block;
    if (ft__codec_check_args(j->nbytes, j->esize, &block) < 0 || block != j->block ||
        (j->nbytes + block - 1) / block != *nblocks)
        return ft__err(-EBADMSG, "codec: inconsistent stream header");
    size_t table = HEAD + ENTRY * (size_t)*nblocks;
    if (len < table)
        return ft__err(-EBADMSG, "codec: stream truncated in its block table");
    j->ends = s + HEAD;
    j->blocks = s + table;
    j->data_len = len - table;
    return 0;
}

int64_t ft_codec_size(const void *src, size_t len)
{
    dec_job j;
    uint32_t nblocks;
    if (!src)
        return ft__err(-EINVAL, "codec: NULL argument");
    int rc = parse_head(src, len, &j, &nblocks);
    return rc < 0 ? rc : (int64_t)j.nbytes;
}

/* parse_head, and room for the decoded bytes. */
static int open_stream(const void *src, size_t len, size_t cap, dec_job *j, uint32_t *nblocks)
{
    int rc = parse_head(src, len, j, nblocks);
    if (rc < 0)
        return rc;
    if (cap < j->nbytes)
        return ft__err(-ENOSPC, "codec: %zu bytes of room for %llu decoded bytes", cap,
                       (unsigned long long)j->nbytes);
    return 0;
}

int64_t ft__codec_decode(ft__pool *pool, const void *src, size_t len, void *dst, size_t cap)
{
    if (!src || (!dst && cap))
        return ft__err(-EINVAL, "codec: NULL argument");
    dec_job j;
    uint32_t nblocks;
    int rc = open_stream(src, len, cap, &j, &nblocks);
    if (rc < 0)
        return rc;
    j.dst = dst;
    int64_t *results = calloc(nblocks ? nblocks : 1, sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "codec: %u blocks", nblocks);
    if ((rc = ft__pool_run(pool, nblocks, decode_block, &j, results)) < 0) {
        free(results);
        return ft__err(rc, "codec: decoding");
    }
    for (uint32_t b = 0; b < nblocks; b++)
        if (results[b] < 0) {
            rc = (int)results[b];
            free(results);
            if (rc == -EILSEQ)
                return ft__err(-EBADMSG, "codec: block %u of %u (bytes %llu+%u): checksum "
                               "mismatch, the stream is corrupt", b, nblocks,
                               (unsigned long long)b * j.block, j.block);
            return rc == -EBADMSG ? ft__err(rc, "codec: block %u of %u is corrupt", b, nblocks)
                                  : ft__err(rc, "codec: decoding block %u", b);
        }
    free(results);
    return (int64_t)j.nbytes;
}

/* ---- the GPU decoder's view (dev.h, gpu.c) ---- */

int64_t ft__codec_plan(const void *src, size_t len, uint64_t src_addr, uint64_t dst_addr,
                       size_t cap, ftz_block *out, unsigned *max_huff)
{
    dec_job j;
    uint32_t nblocks;
    int rc = open_stream(src, len, cap, &j, &nblocks);
    if (rc < 0)
        return rc;
    if (j.streams > FTZ_LANES)
        return ft__err(-ENOTSUP, "codec: %u streams per plane (the GPU decoder takes %u)",
                       j.streams, FTZ_LANES);
    if (!out)
        return nblocks;
    uint64_t table = (uint64_t)(j.blocks - (const uint8_t *)src);
    for (uint32_t b = 0; b < nblocks; b++) {
        uint64_t start = b ? get64(j.ends + ENTRY * ((size_t)b - 1)) : 0;
        uint64_t stop = get64(j.ends + ENTRY * (size_t)b);
        if (start > stop || stop > j.data_len)
            return ft__err(-EBADMSG, "codec: block %u of %u is corrupt (its end)", b, nblocks);
        const uint8_t *base = j.blocks + start, *p = base, *end = j.blocks + stop;
        uint64_t off = (uint64_t)b * j.block;
        size_t n = (size_t)FT__MIN((uint64_t)j.block, j.nbytes - off) / j.esize;
        size_t seg[STREAMS + 1];
        ft__codec_split(n, j.streams, j.round8, seg);
        ftz_block *d = &out[b];
        memset(d, 0, sizeof *d);
        d->src = src_addr + table + start;
        d->dst = dst_addr + off;
        d->n = (uint32_t)n;
        d->q = (uint32_t)(j.streams > 1 ? seg[1] : n);
        d->esize = (uint8_t)j.esize;
        d->streams = (uint8_t)j.streams;
        d->wide = j.round8 && d->dst % 16 == 0;
        unsigned huff = 0;
        for (unsigned k = 0; k < j.esize; k++) {
            if (p >= end)
                goto bad;
            d->mode[k] = *p++;
            d->off[k] = (uint32_t)(p - base);
            if (d->mode[k] == MODE_CONST) {
                if (p >= end)
                    goto bad;
                d->value[k] = *p++;
            } else if (d->mode[k] == MODE_RAW) {
                if ((size_t)(end - p) < n)
                    goto bad;
                p += n;
            } else if (d->mode[k] == MODE_HUFF) {
                if ((size_t)(end - p) < HUFF_HEAD(j.streams))
                    goto bad;
                uint8_t len8[256];
                uint16_t code[256];
                if (plane_code(p, len8, code) < 0)
                    goto bad;
                uint64_t total = 0;
                for (unsigned s = 0; s < j.streams; s++)
                    total += get32(p + 128 + 4 * s);
                if ((uint64_t)(end - p) - HUFF_HEAD(j.streams) < total)
                    goto bad;
                p += HUFF_HEAD(j.streams) + total;
                huff++;
            } else {
                goto bad;
            }
        }
        if (p != end)
            goto bad;
        if (huff > *max_huff)
            *max_huff = huff;
        continue;
bad:
        return ft__err(-EBADMSG, "codec: block %u of %u is corrupt", b, nblocks);
    }
    return nblocks;
}
