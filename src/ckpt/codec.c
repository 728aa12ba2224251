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
 * alone.
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
#include "ckpt.h"
#include "codec_dev.h"

#include <errno.h>
#include <stdlib.h>
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

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

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

/* This thread's scratch of at least @p n bytes, or NULL (no memory). Valid until the next
 * call on this thread. */
static uint8_t *scratch_get(size_t n)
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

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static uint64_t load_be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

/* ---- code lengths ---- */

typedef struct {
    uint32_t freq;
    uint16_t sym;
} leaf;

static int by_freq(const void *a, const void *b)
{
    const leaf *x = a, *y = b;
    return x->freq != y->freq ? (x->freq < y->freq ? -1 : 1) : (int)x->sym - (int)y->sym;
}

/* Huffman code lengths (at most MAXLEN) of the @p n >= 2 used symbols of @p count. */
static void code_lengths(const uint64_t count[256], uint8_t len[256])
{
    leaf leaves[256];
    unsigned n = 0;
    memset(len, 0, 256);
    for (unsigned s = 0; s < 256; s++)
        if (count[s])
            leaves[n++] = (leaf){(uint32_t)FT__MIN(count[s], UINT32_MAX >> 9), (uint16_t)s};
    qsort(leaves, n, sizeof *leaves, by_freq);
    /* two queues: the sorted leaves, then the internal nodes in the order they are made */
    uint64_t weight[512];
    int parent[512];
    for (unsigned i = 0; i < n; i++)
        weight[i] = leaves[i].freq;
    unsigned next_leaf = 0, next_node = n, made = n;
    for (unsigned k = 0; k + 1 < n; k++) {
        unsigned pick[2];
        for (int j = 0; j < 2; j++) {
            if (next_leaf < n && (next_node >= made || weight[next_leaf] <= weight[next_node]))
                pick[j] = next_leaf++;
            else
                pick[j] = next_node++;
        }
        weight[made] = weight[pick[0]] + weight[pick[1]];
        parent[pick[0]] = parent[pick[1]] = (int)made;
        made++;
    }
    unsigned depth[512];
    depth[made - 1] = 0;
    for (int i = (int)made - 2; i >= 0; i--)
        depth[i] = depth[parent[i]] + 1;
    /* limit to MAXLEN: clamp, then lengthen the rarest symbols until the code fits */
    uint32_t kraft = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned l = FT__MIN(depth[i], MAXLEN);
        len[leaves[i].sym] = (uint8_t)l;
        kraft += TABLE >> l;
    }
    while (kraft > TABLE) {
        for (unsigned i = 0; i < n && kraft > TABLE; i++) {
            uint8_t *l = &len[leaves[i].sym];
            if (*l < MAXLEN) {
                kraft -= TABLE >> (*l + 1);
                (*l)++;
            }
        }
    }
}

/* Canonical codes of @p len (by length, then symbol). @return 0, or -1 when the lengths
 * over-subscribe the code space (a corrupt table). */
static int canonical(const uint8_t len[256], uint16_t code[256])
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

/* The element ranges of the @p S streams of a plane of @p n elements: seg[j], seg[j + 1]. */
static void split(size_t n, unsigned S, bool round8, size_t seg[STREAMS + 1])
{
    size_t q = (n + S - 1) / S;
    if (round8)
        q = (q + 7) & ~(size_t)7;
    for (unsigned i = 0; i < S; i++)
        seg[i] = FT__MIN(n, q * (size_t)i);
    seg[S] = n;
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
static size_t encode_plane(const uint8_t *s, size_t n, const uint64_t count[256], uint8_t *out,
                           bool store)
{
    if (store) {
        out[0] = MODE_RAW;
        memcpy(out + 1, s, n);
        return 1 + n;
    }
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
    canonical(len, code);
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
    split(n, STREAMS, true, seg);
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
    uint8_t *plane = scratch_get(n ? n : 1);
    uint8_t *out = j->room ? j->room + (uint64_t)b * block_room(j, b)
                           : malloc(j->esize * (n + 1) + 1);
    if (!plane || !out) {
        if (!j->room)
            free(out);
        return -ENOMEM;
    }
    size_t at = 0;
    unsigned e = j->esize;
    for (unsigned k = 0; k < e; k++) {
        uint64_t count[256];
        switch (e) { /* constant element sizes: the gather's strides are immediates */
        case 1: gather_plane(src, n, 1, k, plane, count); break;
        case 2: gather_plane(src, n, 2, k, plane, count); break;
        case 4: gather_plane(src, n, 4, k, plane, count); break;
        default: gather_plane(src, n, 8, k, plane, count); break;
        }
        at += encode_plane(plane, n, count, out + at, j->store);
    }
    if (!j->room)
        j->bufs[b] = out;
    j->sizes[b] = at;
    j->csums[b] = ft__csum(src, len);
    return 0;
}

size_t ft_codec_bound(uint64_t nbytes, unsigned elem_size, uint32_t block_bytes)
{
    if (elem_size == 0)
        return 0;
    uint64_t block = block_bytes ? block_bytes : DEFAULT_BLOCK;
    uint64_t nblocks = (nbytes + block - 1) / block;
    return (size_t)(HEAD + ENTRY * nblocks + nbytes + (uint64_t)elem_size * 2 * nblocks);
}

static int check_args(uint64_t nbytes, unsigned esize, uint32_t *block)
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

/* Block wave + @p i to its place in the output: down from its worst-case offset (in place),
 * or from its own buffer. */
static int64_t place_block(void *arg, unsigned i)
{
    enc_job *j = arg;
    uint32_t b = j->wave + i;
    if (j->room)
        memmove(j->out + j->at[b], j->room + (uint64_t)b * block_room(j, b), j->sizes[b]);
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
static int place_blocks(ft_ctx *ctx, enc_job *j, int64_t *results)
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
                        : ft__pool_run(ctx->pool, e - w, place_block, j, results);
        w = e;
    }
    return rc;
}

int64_t ft_codec_encode(ft_ctx *ctx, const void *src, uint64_t nbytes, unsigned elem_size,
                        uint32_t block_bytes, unsigned flags, void *dst, size_t cap)
{
    if (!ctx || (!src && nbytes) || !dst)
        return ft__err(-EINVAL, "codec: NULL argument");
    int rc = check_args(nbytes, elem_size, &block_bytes);
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
    if ((rc = ft__pool_run(ctx->pool, nblocks, encode_block, &j, results)) < 0) {
        ft__err(rc, "codec: encoding");
        goto out;
    }
    for (uint32_t b = 0; b < nblocks; b++)
        if (results[b] < 0) {
            rc = ft__err((int)results[b], "codec: encoding block %u", b);
            goto out;
        }
    uint8_t *d = dst;
    memcpy(d, MAGIC, 4);
    d[4] = (uint8_t)elem_size;
    d[5] = 2;
    d[6] = STREAMS;
    d[7] = 0;
    put64(d + 8, nbytes);
    put32(d + 16, block_bytes);
    put32(d + 20, nblocks);
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
    if ((rc = place_blocks(ctx, &j, results)) < 0)
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
    return canonical(len, code) < 0 ? -EBADMSG : 0;
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
    split(n, S, round8, seg);
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
        if (mode[k] != MODE_RAW && !scratch && !(scratch = scratch_get(n * e + 1))) {
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
    if (check_args(j->nbytes, j->esize, &block) < 0 || block != j->block ||
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

int64_t ft_codec_decode(ft_ctx *ctx, const void *src, size_t len, void *dst, size_t cap)
{
    if (!ctx || !src || (!dst && cap))
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
    if ((rc = ft__pool_run(ctx->pool, nblocks, decode_block, &j, results)) < 0) {
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

/* ---- the GPU decoder's view (codec_dev.h, codec_gpu.c) ---- */

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
        split(n, j.streams, j.round8, seg);
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
