/*
 * The GPU encoder of codec streams (decode.c's format), written once for nvcc and for the C
 * compiler, as dev.h is for the decoder: kernel.cu wraps these functions in the encoder's
 * kernels, and gpu_enc.c runs the very same functions thread by thread on the CPU, so the
 * tests check that they write exactly the bytes of the CPU encoder (encode.c) on machines
 * without a GPU.
 *
 * A block's encoding, in steps (one kernel each on the GPU):
 * 1. count: the histogram of each byte plane and the block's checksum, xxh3-64 of its bytes
 *    (a CUDA block per codec block: the block goes through shared memory in tiles; seven
 *    warps load and count a tile while eight lanes of the eighth hash the one before, one
 *    accumulator each);
 * 2. code: per plane: raw, constant or Huffman, the code lengths (the length-limited
 *    Huffman encode.c calls too: the same code; on the GPU the symbols are sorted by rank, a
 *    thread each, and one thread builds the code), the canonical codes;
 * 3. bits: each stream is cut into chunks of FTZ_CHUNK elements, a thread per chunk (every
 *    plane of it): its bits per plane, and in the chunk holding a stream's last group of four
 *    symbols the bits before it (where encode.c checks its room last);
 * 4. layout: per stream, its chunks' offsets (a prefix sum: on the GPU a warp's scan) and
 *    its bits; per plane, the streams' starts with put_stream's exact room bounds (a plane
 *    that would not fit is stored raw, as encode.c does); the planes' places and the block's
 *    size;
 * 5. write (once the host placed every block): a thread per chunk writes its codes at its
 *    bit offset, whole 32-bit words it alone fills stored, the words it shares with its
 *    neighbours (and the headers' bytes) OR-ed into memory cleared before; raw planes go the
 *    same way, as 8-bit codes.
 * The host writes the stream's header and table. The result is the stream encode.c writes,
 * byte for byte.
 */
#ifndef FT_CODEC_ENC_DEV_H
#define FT_CODEC_ENC_DEV_H

#include "dev.h"
#include "enc_xxh3.h"

#define FTZ_HUFF_HEAD (128 + 4 * FTZ_LANES) /* code lengths, stream sizes */

/* elements of a stream a thread codes (steps 3 and 5): few, so that a warp's stores of
 * neighbouring chunks fall on few cache lines */
#define FTZ_CHUNK 32
/* bytes of a block in shared memory at a time (step 1): 64 for each thread of 7 warps */
#define FTZ_TILE 14336

/* One block for the encoder's kernels (the host fills src, n and chunk0, later out). */
typedef struct ftz_eblock {
    uint64_t src;    /* address of its elements (a multiple of the element size) */
    uint64_t out;    /* where its encoding goes (step 5) */
    uint64_t csum;   /* xxh3-64 of its bytes (step 1) */
    uint32_t n;      /* elements */
    uint32_t size;   /* its encoding's bytes (step 4) */
    uint32_t chunk0; /* its first entry in the wave's chunk bits (32 streams x chunks x E) */
    uint32_t pad;
} ftz_eblock;

/* One byte plane of a block. */
typedef struct ftz_eplane {
    uint32_t count[256];         /* step 1 */
    uint32_t cl[256];            /* code << 8 | length (step 2) */
    uint32_t start[FTZ_LANES];   /* each stream's first byte from the mode byte (step 4) */
    uint32_t bytes[FTZ_LANES];   /* each stream's bytes (step 4) */
    uint8_t lens[128];           /* the code lengths as written: symbol 2i in the low nibble */
    uint32_t n;                  /* the block's elements */
    uint32_t off;                /* from the block's first byte (step 4) */
    uint32_t size;               /* its bytes in the block (step 2's estimate, then step 4) */
    uint8_t mode;                /* FTZ_RAW, FTZ_CONST, FTZ_HUFF (step 4 may store it raw) */
    uint8_t value;               /* FTZ_CONST: the byte */
    uint8_t pad[2];
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

/* Bytes [0, @p valid) of the 8-byte word @p v of a block (from one of its multiples of 8
 * on, so byte i is of plane i % E) into @p hist ([E][256]). */
FTZ_FN void ftz_count_word(uint64_t v, unsigned valid, unsigned E, uint32_t *hist)
{
    FTZ_UNROLL
    for (unsigned i = 0; i < 8; i++)
        if (i < valid)
            ftz_hist_add(&hist[256 * (i % E) + ((uint32_t)(v >> (8 * i)) & 255)]);
}

/* ---- step 2: the code ---- */

/* Symbol @p s's sort key: its count (clamped to 2^23 - 1) above the symbol (keys are
 * distinct: any sort orders them alike). */
FTZ_FN uint64_t ftz_key(uint32_t count, unsigned s)
{
    uint64_t c = count < (0xffffffffu >> 9) ? count : (0xffffffffu >> 9);
    return c << 8 | s;
}

/* The keys of the symbols counted in @p count, sorted (Shell sort); @return how many. */
FTZ_FN unsigned ftz_sorted_keys(const uint32_t count[256], uint64_t key[256])
{
    unsigned n = 0;
    for (unsigned s = 0; s < 256; s++)
        if (count[s])
            key[n++] = ftz_key(count[s], s);
    const unsigned gaps[] = {57, 23, 10, 4, 1};
    for (unsigned g = 0; g < 5; g++)
        for (unsigned i = gaps[g]; i < n; i++) {
            uint64_t v = key[i];
            unsigned j = i;
            for (; j >= gaps[g] && key[j - gaps[g]] > v; j -= gaps[g])
                key[j] = key[j - gaps[g]];
            key[j] = v;
        }
    return n;
}

/*
 * Huffman code lengths (at most FTZ_MAXLEN) into @p len (zeroed by the caller) of the
 * @p n >= 2 symbols whose keys @p key holds sorted, for both encoders: two queues merged with
 * leaves first on ties, depths clamped, then the rarest symbols lengthened until the code
 * fits. @p weight, @p parent, @p depth: room for 511 (shared memory on the GPU).
 */
FTZ_FN void ftz_lengths(const uint64_t *key, unsigned n, uint8_t len[256], uint64_t *weight,
                        uint16_t *parent, uint8_t *depth)
{
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

/* Huffman code lengths (at most FTZ_MAXLEN) of the symbols counted in @p count (two or
 * more), for both encoders (encode.c's code_lengths calls this). */
FTZ_FN void ftz_code_lengths(const uint32_t count[256], uint8_t len[256])
{
    uint64_t key[256], weight[511];
    uint16_t parent[511];
    uint8_t depth[511];
    for (unsigned s = 0; s < 256; s++)
        len[s] = 0;
    unsigned n = ftz_sorted_keys(count, key);
    if (n >= 2) /* (one symbol is a constant plane) */
        ftz_lengths(key, n, len, weight, parent, depth);
}

/* Plane @p p's mode from its counts, up to its code (encode.c's encode_plane): constant
 * where one byte value is used, raw where the plane is too short. @return whether a code
 * is to be made (then ftz_plane_huff decides). */
FTZ_FN int ftz_plane_start(ftz_eplane *p)
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
        return 0;
    }
    return used != 0 && p->n > 1 + FTZ_HUFF_HEAD;
}

/* Plane @p p with code lengths @p len: raw where the code's estimate gains nothing, else
 * Huffman with canonical codes. */
FTZ_FN void ftz_plane_huff(ftz_eplane *p, const uint8_t len[256])
{
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

/* Plane @p p's mode and code from its counts, on one thread (the CPU runner's step 2). */
FTZ_FN void ftz_plane_code(ftz_eplane *p)
{
    if (!ftz_plane_start(p))
        return;
    uint8_t len[256];
    ftz_code_lengths(p->count, len);
    ftz_plane_huff(p, len);
}

/* ---- steps 3-5: streams ---- */

/* Elements per stream of a plane of @p n elements (decode.c's split: rounded up to 8). */
FTZ_FN uint32_t ftz_stream_q(uint32_t n)
{
    uint32_t q = (uint32_t)(((uint64_t)n + FTZ_LANES - 1) / FTZ_LANES);
    return (q + 7) & ~7u;
}

/* Lane @p lane's elements [*from, *to) of a plane of @p n elements. */
FTZ_FN void ftz_lane_range(uint32_t n, unsigned lane, uint32_t *from, uint32_t *to)
{
    uint64_t q = ftz_stream_q(n), a = q * lane, b = q * (lane + 1);
    *from = (uint32_t)(a < n ? a : n);
    *to = lane + 1 < FTZ_LANES && b < n ? (uint32_t)b : n;
}

/* Chunks per stream of a block of @p n elements. */
FTZ_FN uint32_t ftz_chunks(uint32_t n)
{
    return (ftz_stream_q(n) + FTZ_CHUNK - 1) / FTZ_CHUNK;
}

/* The first element of stream @p lane's last group of four (encode.c checks its room there),
 * of a stream over [from, to). */
FTZ_FN uint32_t ftz_last_group(uint32_t from, uint32_t to)
{
    return to > from ? from + (to - from - 1) / 4 * 4 : from;
}

/* Chunk @p c of stream @p lane: elements [*a, *b) (empty past the stream's end). */
FTZ_FN void ftz_chunk_range(uint32_t n, unsigned lane, uint32_t c, uint32_t *a, uint32_t *b)
{
    uint32_t from, to;
    ftz_lane_range(n, lane, &from, &to);
    uint64_t x = (uint64_t)from + (uint64_t)c * FTZ_CHUNK;
    *a = x < to ? (uint32_t)x : to;
    *b = x + FTZ_CHUNK < to ? (uint32_t)(x + FTZ_CHUNK) : to;
}

/* An aligned 8-byte word of the input (global memory on the GPU). */
FTZ_FN uint64_t ftz_ld64a(uint64_t addr)
{
#ifdef __CUDACC__
    return __ldg((const unsigned long long *)(uintptr_t)addr);
#else
    return *(const uint64_t *)(uintptr_t)addr;
#endif
}

/* A 32-bit word OR-ed into memory (atomically on the GPU: its other bytes are other
 * threads'). */
FTZ_FN void ftz_or32(uint64_t addr, uint32_t v)
{
#ifdef __CUDACC__
    atomicOr((unsigned int *)(uintptr_t)addr, v);
#else
    *(uint32_t *)(uintptr_t)addr |= v;
#endif
}

FTZ_FN void ftz_or8(uint64_t addr, uint32_t v)
{
    ftz_or32(addr & ~(uint64_t)3, (v & 255) << (8 * (addr & 3)));
}

/* Bits written MSB first from a bit position on, a 32-bit word at a time: the first word
 * where the position is inside it and the last are OR-ed (neighbours share them), the words
 * in between stored. */
typedef struct ftz_bitw {
    uint64_t acc;  /* pending bits from the top (the first cnt bits of the word at `at`) */
    uint64_t at;   /* the aligned word being filled */
    uint32_t cnt;
    uint32_t edge; /* the word at `at` has bits before ours */
} ftz_bitw;

FTZ_FN void ftz_bitw_start(ftz_bitw *w, uint64_t bit)
{
    w->acc = 0;
    w->at = bit >> 5 << 2;
    w->cnt = (uint32_t)(bit & 31);
    w->edge = w->cnt != 0;
}

FTZ_FN void ftz_bitw_word(uint64_t at, uint32_t v, uint32_t shared_word)
{
    v = ftz_bswap(v); /* the stream's first bit is its byte's top bit */
    if (shared_word)
        ftz_or32(at, v);
    else
        *(uint32_t *)(uintptr_t)at = v;
}

FTZ_FN void ftz_bitw_put(ftz_bitw *w, uint32_t code, uint32_t len)
{
    if (!len)
        return;
    w->cnt += len;
    w->acc |= (uint64_t)code << (64 - w->cnt);
    if (w->cnt >= 32) {
        ftz_bitw_word(w->at, (uint32_t)(w->acc >> 32), w->edge);
        w->edge = 0;
        w->at += 4;
        w->acc <<= 32;
        w->cnt -= 32;
    }
}

FTZ_FN void ftz_bitw_end(const ftz_bitw *w)
{
    if (w->cnt)
        ftz_bitw_word(w->at, (uint32_t)(w->acc >> 32), 1);
}

/* Byte @p v of plane @p k through code table @p tab ([E][256], code << 8 | length): its
 * length added to bits[k], or (@p write) its code to writer w[k]. */
FTZ_FN void ftz_code_byte(unsigned k, uint32_t v, const uint32_t *tab, uint64_t *bits,
                          ftz_bitw *w, int write)
{
    uint32_t c = tab[256 * k + v];
    if (write)
        ftz_bitw_put(&w[k], c >> 8, c & 255);
    else
        bits[k] += c & 255;
}

/* Elements [a, b) of the block at @p src (@p E bytes each, @p src a multiple of E) through
 * the aligned 8-byte words that hold them, so byte i of a word is of plane i % E. */
FTZ_FN void ftz_range_code(uint64_t src, unsigned E, uint32_t a, uint32_t b,
                           const uint32_t *tab, uint64_t *bits, ftz_bitw *w, int write)
{
    if (a >= b)
        return;
    uint64_t lo = src + (uint64_t)a * E, hi = src + (uint64_t)b * E;
    for (uint64_t at = lo & ~(uint64_t)7; at < hi; at += 8) {
        uint64_t v = ftz_ld64a(at);
        if (at >= lo && at + 8 <= hi) {
            FTZ_UNROLL
            for (unsigned i = 0; i < 8; i++)
                ftz_code_byte(i % E, (uint32_t)(v >> (8 * i)) & 255, tab, bits, w, write);
        } else {
            FTZ_UNROLL
            for (unsigned i = 0; i < 8; i++)
                if (at + i >= lo && at + i < hi)
                    ftz_code_byte(i % E, (uint32_t)(v >> (8 * i)) & 255, tab, bits, w, write);
        }
    }
}

/* Step 3, chunk @p c of stream @p lane of block @p b: its bits per plane in cbits[k] (a
 * plane's table entries of length 0 count nothing), and where it holds the stream's last
 * group, the bits before that in lastin[32 k + lane]. */
FTZ_FN void ftz_chunk_bits(const ftz_eblock *b, const uint32_t *tab, unsigned E, unsigned lane,
                           uint32_t c, uint32_t *cbits, uint32_t *lastin)
{
    uint32_t from, to, x, y;
    ftz_lane_range(b->n, lane, &from, &to);
    ftz_chunk_range(b->n, lane, c, &x, &y);
    uint32_t mark = ftz_last_group(from, to);
    uint64_t bits[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (x < y && mark >= x && mark < y) {
        ftz_range_code(b->src, E, x, mark, tab, bits, (ftz_bitw *)0, 0);
        for (unsigned k = 0; k < E; k++)
            lastin[32 * k + lane] = (uint32_t)bits[k];
        x = mark;
    }
    ftz_range_code(b->src, E, x, y, tab, bits, (ftz_bitw *)0, 0);
    for (unsigned k = 0; k < E; k++)
        cbits[k] = (uint32_t)bits[k];
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

/* Step 4, stream @p lane of plane @p k of a block of @p n elements: its chunks' bits (at
 * @p cbits, the block's entries) turned into their offsets in the stream; its bits in *bits
 * and the bits before its last group (from @p lastin) in *last. */
FTZ_FN void ftz_stream_sum(uint32_t *cbits, uint32_t n, unsigned E, unsigned k, unsigned lane,
                           const uint32_t *lastin, uint64_t *bits, uint64_t *last)
{
    uint32_t C = ftz_chunks(n), from, to;
    ftz_lane_range(n, lane, &from, &to);
    uint32_t cl = (ftz_last_group(from, to) - from) / FTZ_CHUNK;
    uint32_t *x = &cbits[(uint64_t)lane * C * E + k];
    uint64_t at = 0;
    *last = 0;
    for (uint32_t c0 = 0; c0 < C; c0 += 8) { /* eight loads at a time, then their sums */
        uint32_t t[8];
        FTZ_UNROLL
        for (unsigned i = 0; i < 8; i++)
            t[i] = c0 + i < C ? x[(uint64_t)(c0 + i) * E] : 0;
        FTZ_UNROLL
        for (unsigned i = 0; i < 8; i++) {
            if (c0 + i == cl && from < to)
                *last = at + lastin[32 * k + lane];
            if (c0 + i < C)
                x[(uint64_t)(c0 + i) * E] = (uint32_t)at;
            at += t[i];
        }
    }
    *bits = at;
}

/* Step 4, plane @p p's final mode and bytes once its streams' bits are known (see
 * ftz_plane_layout), each stream's start and bytes in it. */
FTZ_FN void ftz_plane_finish(ftz_eplane *p, const uint64_t bits[FTZ_LANES],
                             const uint64_t last[FTZ_LANES])
{
    if (p->mode != FTZ_HUFF)
        return;
    uint32_t size = ftz_plane_layout(p->n, bits, last, p->start);
    p->mode = size ? FTZ_HUFF : FTZ_RAW;
    p->size = size ? size : 1 + p->n;
    for (unsigned j = 0; j < FTZ_LANES; j++)
        p->bytes[j] = (uint32_t)((bits[j] + 7) / 8);
}

/* Step 4, the places of the block's @p E planes (@p p) and its bytes. */
FTZ_FN void ftz_block_finish(ftz_eblock *b, ftz_eplane *p, unsigned E)
{
    uint32_t at = 0;
    for (unsigned k = 0; k < E; k++) {
        p[k].off = at;
        at += p[k].size;
    }
    b->size = at;
}

/* Step 5: the code table of plane @p p as written (raw planes as 8-bit codes, constant ones
 * as nothing), entry @p v. */
FTZ_FN uint32_t ftz_write_code(const ftz_eplane *p, unsigned v)
{
    return p->mode == FTZ_HUFF ? p->cl[v] : p->mode == FTZ_RAW ? (v << 8 | 8) : 0;
}

/* Step 5, lane @p lane's share of plane @p p's header at @p out: the mode byte (and a constant
 * plane's byte) from lane 0; of a Huffman plane four of the code length bytes and its
 * stream's size. */
FTZ_FN void ftz_plane_head(const ftz_eplane *p, uint64_t out, unsigned lane)
{
    if (lane == 0) {
        ftz_or8(out, p->mode);
        if (p->mode == FTZ_CONST)
            ftz_or8(out + 1, p->value);
    }
    if (p->mode != FTZ_HUFF)
        return;
    for (unsigned i = 4 * lane; i < 4 * lane + 4; i++)
        ftz_or8(out + 1 + i, p->lens[i]);
    for (unsigned b = 0; b < 4; b++)
        ftz_or8(out + 1 + 128 + 4 * lane + b, p->bytes[lane] >> (8 * b));
}

/* Step 5, chunk @p c of stream @p lane of block @p b (its planes @p p, the code tables as
 * written @p tab, the chunk's bit offsets in its streams @p coff): its codes (raw bytes) at
 * their places, and from the first chunk of each stream its share of the headers. */
FTZ_FN void ftz_chunk_write(const ftz_eblock *b, const ftz_eplane *p, const uint32_t *tab,
                            const uint32_t *coff, unsigned E, unsigned lane, uint32_t c)
{
    if (c == 0)
        for (unsigned k = 0; k < E; k++)
            ftz_plane_head(&p[k], b->out + p[k].off, lane);
    uint32_t x, y;
    ftz_chunk_range(b->n, lane, c, &x, &y);
    if (x >= y)
        return;
    ftz_bitw w[8];
    for (unsigned k = 0; k < E; k++) {
        uint64_t at = b->out + p[k].off;
        uint64_t bit = p[k].mode == FTZ_HUFF ? (at + p[k].start[lane]) * 8 + coff[k]
                                             : (at + 1 + x) * 8;
        ftz_bitw_start(&w[k], bit);
    }
    ftz_range_code(b->src, E, x, y, tab, (uint64_t *)0, w, 1);
    for (unsigned k = 0; k < E; k++)
        if (p[k].mode != FTZ_CONST)
            ftz_bitw_end(&w[k]);
}

#endif
