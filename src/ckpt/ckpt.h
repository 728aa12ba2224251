/* Checkpoint internals: the parsed form of safetensors files and indexes. */
#ifndef FT_CKPT_CKPT_H
#define FT_CKPT_CKPT_H

#include "../base/json.h"
#include "../core/internal.h"

/* safetensors' own limit on the header. */
#define FT__ST_HEADER_MAX 100000000ull
/* Our data sections start on this boundary. */
#define FT__ST_ALIGN 4096u
/* Default bytes per checksum block. */
#define FT__CSUM_BLOCK (1u << 20)
/* Piece of a checkpoint's data moved by one task (a multiple of the checksum block). */
#define FT__CKPT_PIECE (4u << 20)

#define FT__META_CSUM_ALGO "fastensor.checksum"
#define FT__META_CSUM_BLOCK "fastensor.block_size"
#define FT__META_CSUMS "fastensor.checksums"
#define FT__META_VERSION "fastensor.version"
#define FT__META_PARTS "fastensor.part_checksums"
#define FT__CSUM_ALGO "xxh3-64"

typedef struct ft__st_tensor {
    char *name;
    ft_dtype dtype;
    unsigned ndim;
    uint64_t shape[FT_MAX_DIMS];
    uint64_t begin, end; /* within the data section (a .fst's: where a safetensors file of
                            its tensors would hold them, the decoded layout) */
    unsigned shard;
    uint64_t stored_begin, stored_end; /* .fst: its codec stream in the data section */
    bool coded;                        /* .fst: the stream codes planes (else stores them) */
} ft__st_tensor;

typedef struct ft__st_meta {
    char *key;
    char *value;
} ft__st_meta;

/* One parsed safetensors header. */
typedef struct ft__st_header {
    ft__st_tensor *tensors; /* sorted by begin */
    size_t ntensors;
    ft__st_meta *meta;      /* user metadata (fastensor.* excluded) */
    size_t nmeta;
    uint64_t csum_block;    /* 0 when the file has no checksums */
    uint64_t *csums;        /* ceil(data_size / csum_block) values */
    uint64_t ncsums;
    uint64_t *parts;        /* part checksums (see ft__parts_layout), NULL when absent */
    uint64_t nparts;
} ft__st_header;

/* A tensor's bytes in the data section, [begin, end). */
typedef struct ft__span {
    uint64_t begin, end;
} ft__span;

/**
 * Part checksums tell which tensor of a block shared by several holds bad bytes: for each
 * checksum block that two or more non-empty tensors overlap, one xxh3-64 per such tensor of
 * its bytes within the block, blocks in order, tensors in data order. Given the tensors'
 * spans (sorted by begin), fill first[b] (for b < nblocks) with the index of block b's first
 * part, or UINT64_MAX when one tensor alone (or none) has the block. @return the parts' count.
 */
uint64_t ft__parts_layout(const ft__span *spans, size_t n, uint64_t block, uint64_t nblocks,
                          uint64_t *first);

/**
 * Parse and validate a safetensors header of @p len bytes whose data section holds
 * @p data_size bytes. @p where names the file in messages.
 * @return 0, or -EBADMSG / -EINVAL with a detail saying what is wrong.
 */
int ft__st_parse(const char *json, size_t len, uint64_t data_size, const char *where,
                 ft__st_header *out);
void ft__st_header_free(ft__st_header *h);

/** Parse tensor entry @p name of a header: an object of @p keys members, of which dtype,
 * shape and data_offsets are read into @p t. @return 0 or -EBADMSG / -ENOMEM. */
int ft__st_entry(const char *name, const ft__json *v, size_t keys, const char *where,
                 ft__st_tensor *t);
/** Sort @p h's tensors by offset and check they tile the data from 0 (no hole, no overlap);
 * *end: where the last one ends. @p format names the format in messages. */
int ft__st_layout(ft__st_header *h, const char *format, const char *where, uint64_t *end);
/** Parse a __metadata__ object (strings only; fastensor.* keys are skipped) into @p h. */
int ft__st_meta_parse(const ft__json *meta, const char *where, ft__st_header *h);

/** Parse 16 hex digits per checksum. @return 0 or -EBADMSG. */
int ft__csum_decode(const char *hex, size_t len, uint64_t *out, uint64_t n);
/** Write 16 lower-case hex digits per checksum (no terminator). */
void ft__csum_encode(const uint64_t *csums, uint64_t n, char *hex);

typedef struct ft__shard {
    char *path;
    ft_file *file;
    uint64_t data_start; /* 8 + header length */
    uint64_t data_size;
    ft__st_header header;
    size_t first;        /* its tensors: ckpt->tensors[first .. first + count) */
    size_t count;
    void *owned_base;    /* ft_ckpt_load_all's allocation */
    uint8_t *owned;      /* its data section inside owned_base */
    bool fst;            /* a .fst container: data_size is the decoded size, data_start where
                            the streams start, stored_size their section's bytes (fst.c) */
    uint64_t stored_size;
} ft__shard;

struct ft_ckpt {
    ft_ctx *ctx;
    ft__shard *shards;
    unsigned nshards;
    const ft__st_tensor **tensors; /* every tensor, by shard then offset */
    size_t ntensors;
    size_t *by_name;               /* indexes into tensors, sorted by name */
    ft__st_meta *meta;             /* user metadata (of the first shard) */
    size_t nmeta;
};

/** The names of the tensors overlapping data bytes [from, to) of shard @p s, quoted, for
 * messages: "'a'", or "'a', 'b' (2 tensors share the block)". */
void ft__shard_tensors_in(const ft__shard *s, uint64_t from, uint64_t to, char *buf,
                          size_t len);
/** The name of the tensor overlapping data byte @p at of shard @p s (for messages). */
const char *ft__shard_tensor_at(const ft__shard *s, uint64_t at);
/** Read @p dst->len bytes of shard @p s's data from data byte @p at into @p dst with @p io.
 * @return dst->len, or -errno (-EIO where the file ends first). */
int64_t ft__shard_read(ft__shard *s, const ft_buf *dst, uint64_t at, const ft_io_opts *io);

/* ---- .fst containers (fst.c, fst_save.c, fst_cost.c; docs/FORMAT.md) ---- */

#define FT__FST_MAGIC "FASTENSZ"
#define FT__FST_DATA 4096u /* where the streams start */
/** @p n bytes rounded up to whole pages: a .fst stream's place in the file and its room. */
static inline uint64_t ft__fst_page_up(uint64_t n)
{
    return (n + 4095) / 4096 * 4096;
}
#define FT__FST_VERSION 1

/** Parse the container @p s (its file open, @p size bytes, starting with the magic). */
int ft__fst_open(ft__shard *s, int64_t size);
/**
 * Decoded bytes [at, at + dst->len) of container @p s into @p dst (host or device memory):
 * the streams of the tensors they overlap are read (through @p io's engine, the next group
 * while one decodes) and decoded, on the GPU into device memory where the library can (and
 * not @p host_decode), else on the host with every block's checksum checked.
 * @return dst->len, or -errno: -EBADMSG naming the tensor.
 */
int64_t ft__fst_read(ft_ctx *ctx, ft__shard *s, uint64_t at, const ft_buf *dst,
                     const ft_io_opts *io, bool host_decode);
/** Decode every stream of @p s on the host (checksums checked), reporting progress in
 * decoded bytes as ft_ckpt_verify does. @return 0 or -errno (-EBADMSG naming the tensor). */
int ft__fst_verify(ft_ctx *ctx, ft__shard *s, const ft_io_opts *io,
                   void (*progress)(uint64_t, uint64_t, void *), void *arg, uint64_t *done,
                   uint64_t total);

/** Tests: the cost probes (ft_fst_measure) use their sizes shifted right by this much. */
extern unsigned ft__fst_probe_shift;
/** The codec block bytes a .fst save codes @p elem-byte elements in (fst_cost.c). */
uint32_t ft__fst_block(unsigned elem);
/** Whether GPU @p dev codes a save's @p elem-byte floats (its encoder wrote the CPU
 * encoder's bytes for a sample, faster; checked once per context), its rate in *encode. */
bool ft__fst_gpu_codes(ft_ctx *ctx, int dev, unsigned elem, double *encode);
/** The lock a save holds while GPU @p dev codes a tensor (one at a time per GPU), or NULL. */
pthread_mutex_t *ft__fst_gpu_lock(ft_ctx *ctx, int dev);
/** Whether a save to @p path writes a .fst container (the name ends in ".fst"). */
bool ft__fst_path(const char *path);
/** Write a container of @p n checked tensors (in this order) into the empty file @p f
 * (named @p path in messages, in directory @p dir, whose disk "auto" weighs): streams,
 * header, head; not synced. Where opts->coded, tensor i's stream is the coded one of the
 * caller's tensor @p order[i]. @return 0 or -errno. */
int ft__fst_write(ft_ctx *ctx, ft_file *f, const char *path, const char *dir,
                  const ft_tensor *t, size_t n, const ft_save_opts *opts, const size_t *order);

/* ---- a .fst save's coding (fst_code.c): the writer's batches, and ft_fst_code ---- */

/* the batch buffers a save keeps: one coded while the others are written */
#define FT__FST_BUFFERS 3u

/* What a batch's GPU pass left for a tensor. */
enum { FT__GPU_NOT, FT__GPU_CODED, FT__GPU_TOO_LITTLE, FT__GPU_FAILED };

/** A tensor's stream. */
typedef struct ft__fst_stream {
    const ft_tensor *t;
    uint8_t *buf;     /* page-aligned; the stream, then zeros to its page's end */
    uint64_t size;    /* the stream's bytes */
    size_t cap;       /* the room it may take at buf (whole pages) */
    unsigned elem;    /* the element size it is coded by (1: stored) */
    bool want;        /* coding was asked for (else stored) */
    bool compressed;  /* kept coded */
    int gpu;          /* FT__GPU_* */
    uint64_t at;      /* where it goes in the data section */
} ft__fst_stream;

/** How a save codes: which float sizes, the buffers its batches are coded into. */
typedef struct ft__fst_coder {
    ft_ctx *ctx;
    const char *path;   /* for messages */
    ft__bufpool *rooms; /* the batches' buffers, kept by the context between saves */
    bool code[9];       /* by element size: code floats of that size */
    bool code_dev[9];   /* the same for tensors in GPU memory (their GPU may code them) */
} ft__fst_coder;

/** A batch of tensors coded at once into its room. */
typedef struct ft__fst_batch {
    ft__fst_stream *items;
    size_t n;
    uint8_t *room;    /* from the coder's buffers, or own's (a larger one) */
    ft__bufpool *own;
} ft__fst_batch;

/** The coder of a save of @p n tensors @p t in directory @p dir (its disk weighed by "auto"
 * @p mode). @return 0 or -ENOMEM. */
int ft__fst_coder_init(ft__fst_coder *c, ft_ctx *ctx, const char *path, const char *dir,
                       const ft_tensor *t, size_t n, ft_compression mode);
void ft__fst_coder_done(ft__fst_coder *c);
/** Whether a stream of @p m bytes of a tensor of @p n is worth keeping coded. */
bool ft__fst_saves_enough(int64_t m, uint64_t n);
/** Tensor @p t's stream parameters in coder @p c's save: the element size it is coded by
 * (1: stored), whether coding was asked for, the room its stream takes (whole pages). */
ft__fst_stream ft__fst_coding(const ft__fst_coder *c, const ft_tensor *t);
/** The end of batch @p k (the first ones smaller: the disk starts sooner), of tensors @p t
 * from @p first; the room its streams take in *room. */
size_t ft__fst_batch_end(const ft__fst_coder *c, const ft_tensor *t, size_t n, size_t first,
                         unsigned k, uint64_t *room);
/** Code tensors @p t (@p n, taking @p room) as batch @p b: on their GPUs where they code
 * them, the rest on the context's threads. @return 0 or -errno (b to be freed either way). */
int ft__fst_batch_code(ft__fst_coder *c, ft__fst_batch *b, const ft_tensor *t, size_t n,
                       uint64_t room);
void ft__fst_batch_free(ft__fst_coder *c, ft__fst_batch *b);
/** Streams @p out[i] of @p coded for the save's tensor @p t[i], the caller's @p order[i]
 * (its stream that one, or @p index[order[i]]), checked against it (its dtype and shape).
 * @return 0 or -EINVAL. */
int ft__fst_coded_streams(const ft_fst_coded *coded, const size_t *index, const ft_tensor *t,
                          size_t n, const size_t *order, ft__fst_stream *out);

/* ---- reading small files and indexes (open.c) ---- */

/** Read a whole regular file of at most @p max bytes (NUL-terminated). @return 0 or -errno. */
int ft__slurp(ft_ctx *ctx, const char *path, uint64_t max, char **out, size_t *len);
/**
 * Read an index: its JSON (*root, for ft__json_free) and the distinct file names its weight
 * map lists (*names, sorted, pointing into *root; free the array). Every name must be a
 * plain file name. @return 0, or -EBADMSG / -errno with a detail.
 */
int ft__index_read(ft_ctx *ctx, const char *path, ft__json_doc **root, const char ***names,
                   size_t *count);

/* ---- installing a save (commit.c) ---- */

/** Whether @p name (of @p len bytes, no NUL inside) is a plain file name: not empty, no
 * slash or backslash, not "." or "..". */
bool ft__plain_name(const char *name, size_t len);

/** A checkpoint's name: the path a save is given, its index beside it, and the shards the
 * index listed before the save. */
typedef struct ft__ckpt_name {
    char *path;        /* "dir/model.safetensors" */
    char *index;       /* "dir/model.safetensors.index.json" */
    char *dir;         /* "dir" ("." when the path has none) */
    const char *base;  /* inside path: "model.safetensors" */
    size_t stem_len;   /* base without ".safetensors": "model" */
    char **old;        /* file names the previous index listed */
    size_t nold;
    int *held;         /* references to files being replaced or removed (reclaim.c) */
    size_t nheld, held_cap;
} ft__ckpt_name;

int ft__name_init(ft__ckpt_name *n, const char *path);
/** Frees @p n; files still held are released here (ft__name_release with no pool). */
void ft__name_free(ft__ckpt_name *n);
/** Before @p path is renamed over or unlinked: keep a reference to the file there, if any,
 * so that its blocks are freed by ft__name_release instead of by that call. */
void ft__name_hold(ft__ckpt_name *n, const char *path);
/** Drop the held references on a worker of @p pool (here when it has none, or NULL). */
void ft__name_release(ft__ckpt_name *n, ft__pool *pool);
/** Note the shards the name's index lists now. @return 0 or -errno (what is there cannot be
 * told: the save must not go on). */
int ft__name_installed(ft_ctx *ctx, ft__ckpt_name *n);
/** "FINAL.fastensor-tmp-PID-N", unique in this process; NULL on ENOMEM. */
char *ft__tmp_name(const char *final);
/** Create temporary @p tmp exclusively and flock it: held for as long as the descriptor
 * (the save) lives, it tells ft_ckpt_gc the file is in use. @return the fd or -errno. */
int ft__tmp_lock(const char *tmp);
/** Whether @p name is a shard of a generation ("STEM-00001-of-00004.3fa9c2d1.safetensors"):
 * one of a sharded save's, never a checkpoint alone. Its stem's length goes to *stem_len. */
bool ft__generation_shard(const char *name, size_t *stem_len);
/** A generation for @p nshards shards: none of its names exists or is the old index's. */
uint32_t ft__generation(const ft__ckpt_name *n, unsigned nshards);
/** "dir/STEM-0000k-of-0000N.GEN.safetensors" for shard k (0-based); NULL on ENOMEM. */
char *ft__shard_name(const ft__ckpt_name *n, unsigned k, unsigned nshards, uint32_t gen);
/** fsync a directory. @return 0 or -errno. */
int ft__fsync_dir(const char *dir);
/**
 * Take the commit lock of directory @p dir (a flock of the directory itself, waited for):
 * exclusive, commits into one directory and ft_ckpt_gc's sweeps take turns under it; @p
 * shared, a load holds it from reading an index until its shards are open, so no commit
 * removes them in between. *fd is the descriptor to give ft__commit_unlock, -1 where the
 * filesystem has no flock. @return 0 or -errno (nothing is held then).
 */
int ft__commit_lock(const char *dir, bool shared, int *fd);
/** Release a lock of ft__commit_lock (-1: none). */
void ft__commit_unlock(int fd);
/**
 * After the commit: make it durable (when @p sync), remove the other form of the name (the
 * index and its shards after a single-file save, the file after a sharded one), the previous
 * index's shards not in @p keep (plain names), and leftovers of dead saves of this name.
 * @return 0, or the first failure (the new checkpoint is installed all the same).
 */
int ft__after_commit(ft_ctx *ctx, ft__ckpt_name *n, bool sharded, const char *const *keep,
                     size_t nkeep, bool sync);

/** The options of a checkpoint's metadata reads (headers, the checksum region a failure's
 * message names): posix, whose readahead around a small read is the kernel's smallest. AUTO
 * may explore the mmap arm for them, and a mapping's fault reads 128 KiB or more around it:
 * data that a load bypassing the page cache means to leave out (test_cache.py's bypassing
 * save found its file cached by the open after it). */
static inline ft_io_opts ft__meta_io(void)
{
    return (ft_io_opts){.engine = FT_ENGINE_POSIX};
}
/** The options of a save's writes (its data, header and index): its engine and cache mode,
 * synced later unless FT_SAVE_NO_SYNC. */
static inline ft_io_opts ft__save_io(const ft_save_opts *so)
{
    return (ft_io_opts){.engine = so ? so->engine : FT_ENGINE_AUTO,
                        .flags = so && (so->flags & FT_SAVE_NO_SYNC) ? 0 : FT_IO_SYNC_LATER,
                        .cache = so ? so->cache : FT_CACHE_AUTO};
}
/** Check a save's tensors (@p fst: a .fst container's; @p coded: their streams coded ahead,
 * their data not read) and metadata. @return 0 or -EINVAL, -ENODEV, -EFAULT with detail. */
int ft__tensors_check(const ft_tensor *t, size_t n, const char *const *meta, bool fst,
                      bool coded);
/** A tensor and its index in the caller's array. */
typedef struct ft__placed {
    ft_tensor t;
    size_t index;
} ft__placed;
/** qsort order of ft__placed: safetensors' layout (the highest dtype rank first, then by
 * name). */
int ft__tensor_layout_cmp(const void *a, const void *b);
/** The element size a .fst save codes dtype @p d's bytes by (1, 2, 4, 8), 0 for a type it
 * stores as it is (dtype.c's table). */
unsigned ft__dtype_coded(ft_dtype d);
/** *bytes = the data bytes of a tensor of @p d and @p shape. @return 0, -EINVAL (unknown
 * dtype), -EOVERFLOW, or -EDOM (packed elements that do not fill whole bytes). */
int ft__tensor_bytes(ft_dtype d, const uint64_t *shape, unsigned ndim, uint64_t *bytes);

#endif
