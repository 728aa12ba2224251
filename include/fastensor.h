/*
 * fastensor.h - move tensors between files and memory as fast as the hardware allows.
 *
 * The only public header of libfastensor. Conventions, everywhere:
 *  - success is 0 or a non-negative count, failure is -errno;
 *  - after a failure, ft_last_error() gives a detail message for the calling thread;
 *  - handles are opaque, made by *_create / *_open and released by *_destroy / *_close,
 *    which accept NULL;
 *  - every function is safe to call from several threads at once on the same context and
 *    the same file, unless its comment says otherwise.
 */
#ifndef FASTENSOR_H
#define FASTENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FT_VERSION_MAJOR 0
#define FT_VERSION_MINOR 1
#define FT_VERSION_PATCH 0
#define FT_VERSION_STRING "0.1.0"

/** @return the library's version string ("MAJOR.MINOR.PATCH"). */
const char *ft_version(void);

/**
 * Parse a byte count: decimal digits with an optional suffix K, M, G or T (powers of 1024;
 * "KiB", "k" and "KB" are read the same), e.g. "4096", "4K", "64M", "1G".
 * @return 0 and *out set, or -EINVAL (malformed), -ERANGE (above 2^64 - 1).
 */
int ft_parse_size(const char *text, uint64_t *out);

/**
 * What a transfer leaves in the page cache. Values are stable (passed from Python).
 * FT_CACHE_AUTO: the context's setting (FASTENSOR_CACHE), which by default decides per call:
 * reads of data in the page cache are copied from it; uncached data that fits in about half
 * of what the cache can keep (MemAvailable, and a cgroup memory limit) is read through it,
 * so that the next load, in this process or another, finds it there, unless this device
 * measured O_DIRECT reads well ahead of buffered ones (then O_DIRECT: `fastensor info` says
 * which); larger data goes O_DIRECT, evicting nothing. Writes synced by the call or later
 * (checkpoint saves) go O_DIRECT from 64 KiB; plain writes may take either.
 */
typedef enum ft_cache_mode {
    FT_CACHE_AUTO = 0,
    FT_CACHE_KEEP = 1,   /**< through the page cache (buffered engines only) */
    FT_CACHE_BYPASS = 2, /**< around it (O_DIRECT engines) where the filesystem allows */
    FT_CACHE_COUNT
} ft_cache_mode;

/** @return "auto", "keep", "bypass" or "unknown". */
const char *ft_cache_name(ft_cache_mode mode);
/** Parse a cache mode name. @return the mode (>= 0) or -EINVAL. */
int ft_cache_from_name(const char *name);

/* ------------------------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------------------------- */

/**
 * Describe an error code returned by any ft_ function.
 * @param err  a negative errno value (as returned) or a positive errno value.
 * @return a static, thread-safe string; never NULL.
 */
const char *ft_strerror(int err);

/**
 * The detail message of the last failure on the calling thread (which file, which offset,
 * which engine, what the kernel said). Set by every failing ft_ call; left unchanged by
 * successful calls. @return a thread-local string, "" when there is none; valid until the
 * next ft_ call on this thread.
 */
const char *ft_last_error(void);

/* ------------------------------------------------------------------------------------------
 * Engines
 * ---------------------------------------------------------------------------------------- */

/** Transfer engines. Values are stable (they are stored in profiles and passed from Python). */
typedef enum ft_engine {
    FT_ENGINE_AUTO = 0,   /**< let the library choose per call */
    FT_ENGINE_POSIX = 1,  /**< buffered pread/pwrite in parallel chunks */
    FT_ENGINE_DIRECT = 2, /**< O_DIRECT through aligned bounce buffers, several in flight */
    FT_ENGINE_URING = 3,  /**< io_uring with O_DIRECT, registered buffers, deep queue */
    FT_ENGINE_MMAP = 4,   /**< mapped file and parallel copy */
    FT_ENGINE_CUFILE = 5, /**< NVIDIA cuFile / GPUDirect Storage (device memory) */
    FT_ENGINE_CACHEDMA = 6, /**< reads into device memory DMA'd by the GPU from the page cache
                                 (a read-only mapping registered with the driver); host memory
                                 as mmap, writes as posix */
    FT_ENGINE_COUNT
} ft_engine;

/** @return the engine's short name ("auto", "posix", ...), or "unknown". */
const char *ft_engine_name(ft_engine engine);

/**
 * Parse an engine name (case-insensitive): "auto", "posix", "direct", "uring", "mmap",
 * "cufile".
 * @return the engine (>= 0), or -EINVAL for an unknown name.
 */
int ft_engine_from_name(const char *name);

/* ------------------------------------------------------------------------------------------
 * Context
 * ---------------------------------------------------------------------------------------- */

/** Context settings. Zero in a field means "the default". */
typedef struct ft_config {
    unsigned threads;      /**< worker threads (default: max(8, 2 x CPUs), at most 256) */
    size_t chunk_size;     /**< largest piece of a split transfer and of one O_DIRECT
                                request (64 MiB) */
    unsigned queue_depth;  /**< io_uring requests in flight per transfer (16) */
    size_t bounce_size;    /**< one aligned bounce buffer and pinned staging buffer (4 MiB) */
    ft_engine engine;      /**< engine for calls that ask for AUTO (default AUTO: the
                                library's choice) */
    ft_cache_mode cache;   /**< cache mode for calls that ask for FT_CACHE_AUTO (default AUTO) */
} ft_config;

/**
 * Fill @p cfg with the defaults, then apply the environment variables FASTENSOR_THREADS,
 * FASTENSOR_CHUNK_SIZE, FASTENSOR_QUEUE_DEPTH, FASTENSOR_BOUNCE_SIZE (sizes accept K/M/G
 * suffixes), FASTENSOR_ENGINE (an engine name) and FASTENSOR_CACHE (auto, keep, bypass).
 * @return 0, or -EINVAL when a variable is malformed (ft_last_error names it); @p cfg then
 *         holds the defaults plus the variables read before the bad one.
 */
int ft_config_init(ft_config *cfg);

typedef struct ft_ctx ft_ctx;

/**
 * Create a context: a thread pool, buffer pools and per-engine state shared by its files.
 * @param cfg  settings, or NULL for ft_config_init()'s result (defaults + environment).
 * @return 0 and *out set, or -EINVAL (bad settings), -ENOMEM, -EAGAIN (threads).
 */
int ft_ctx_create(ft_ctx **out, const ft_config *cfg);

/** Destroy a context. All its files must be closed and requests finished. NULL is a no-op. */
void ft_ctx_destroy(ft_ctx *ctx);

/** Copy the effective settings of @p ctx (defaults resolved) into @p cfg. */
void ft_ctx_config(const ft_ctx *ctx, ft_config *cfg);

/**
 * Whether @p engine can run in this process (io_uring allowed by the kernel, ...).
 * @param reason  if not NULL, set to a static explanation when unavailable, else to "".
 * @return 1 available, 0 not available (the library then falls back, see each engine).
 */
int ft_engine_available(ft_ctx *ctx, ft_engine engine, const char **reason);

/**
 * Save the AUTO selector's dictionaries now (one profile per filesystem device; also done
 * when the context is destroyed). FASTENSOR_PROFILE: "off" (no persistence), a directory, or
 * a file; default $XDG_CACHE_HOME/fastensor/ (else ~/.cache/fastensor/).
 * @return 0 or -errno.
 */
int ft_profile_save(ft_ctx *ctx);

/**
 * Print the AUTO dictionary for the filesystem holding @p path (loading its profile): per
 * key, the leading arm and each arm's mean GB/s and sample count. @return 0 or -errno.
 */
int ft_profile_show(ft_ctx *ctx, const char *path, FILE *out);

/* ------------------------------------------------------------------------------------------
 * Files
 * ---------------------------------------------------------------------------------------- */

enum {
    FT_OPEN_READ = 1u << 0,   /**< open for reading */
    FT_OPEN_WRITE = 1u << 1,  /**< open for writing */
    FT_OPEN_CREATE = 1u << 2, /**< create if missing (with the given mode) */
    FT_OPEN_TRUNC = 1u << 3,  /**< truncate to 0 on open */
    FT_OPEN_EXCL = 1u << 4,   /**< fail with -EEXIST if it exists (with CREATE) */
};

typedef struct ft_file ft_file;

/**
 * Open a file for transfers. The library keeps a buffered descriptor and opens an O_DIRECT
 * one and mappings on demand, per engine.
 * @param flags  FT_OPEN_* bits; at least one of READ and WRITE.
 * @param mode   permission bits for FT_OPEN_CREATE (e.g. 0644).
 * @return 0 and *out set, or -errno (-ENOENT, -EACCES, -EISDIR, -EINVAL, ...).
 */
int ft_file_open(ft_ctx *ctx, ft_file **out, const char *path, unsigned flags, mode_t mode);

/**
 * Close a file. Pending requests on it must have been waited for. NULL is a no-op.
 * @return 0, or -errno from close(2) (the descriptor is released all the same).
 */
int ft_file_close(ft_file *file);

/** @return the file's current size in bytes (>= 0), or -errno. */
int64_t ft_file_size(ft_file *file);

/** Set the file's size (extend with a hole or shrink). @return 0 or -errno. */
int ft_file_truncate(ft_file *file, uint64_t size);

/** Reserve disk blocks for [offset, offset+len) (fallocate). @return 0 or -errno. */
int ft_file_allocate(ft_file *file, uint64_t offset, uint64_t len);

/** Make written data durable (fdatasync). @return 0 or -errno. */
int ft_file_sync(ft_file *file);

/** @return the path the file was opened with (owned by the file). */
const char *ft_file_path(const ft_file *file);

/* ------------------------------------------------------------------------------------------
 * Memory and transfers
 * ---------------------------------------------------------------------------------------- */

/** Where a buffer lives. */
typedef enum ft_mem_kind {
    FT_MEM_HOST = 0, /**< host memory, pageable or pinned (any alignment); device pointers
                          passed as HOST are recognised and treated as FT_MEM_CUDA */
    FT_MEM_CUDA = 1, /**< CUDA device memory of device ft_buf.device */
} ft_mem_kind;

/** What FT_CACHE_AUTO does with cold reads on one filesystem (see ft_cache_mode). */
typedef struct ft_cache_info {
    uint64_t room;        /**< bytes of data that fit now: read through the page cache */
    double buffered_bps;  /**< best measured cold large read through the cache, 0: none yet */
    double direct_bps;    /**< best measured cold large O_DIRECT read, 0: none yet */
    int prefer_direct;    /**< both measured and buffered well behind: O_DIRECT all the same */
} ft_cache_info;

/** Fill @p out for the filesystem holding @p path and memory kind @p mem. @return 0 or -errno. */
int ft_cache_policy(ft_ctx *ctx, const char *path, ft_mem_kind mem, ft_cache_info *out);

/** A memory range taking part in a transfer. */
typedef struct ft_buf {
    void *ptr;        /**< start of the range (any alignment) */
    size_t len;       /**< bytes to transfer */
    ft_mem_kind kind; /**< memory kind */
    int device;       /**< device ordinal for device memory, else 0 */
} ft_buf;

/** @return a host buffer descriptor for [ptr, ptr+len). */
static inline ft_buf ft_host_buf(void *ptr, size_t len)
{
    ft_buf b = {ptr, len, FT_MEM_HOST, 0};
    return b;
}

enum {
    FT_IO_SYNC = 1u << 0, /**< fdatasync the file once a write completes (durable on return) */
    /** The caller makes this write durable later, with ft_file_sync (a checkpoint's or a
     *  bench pass's writes, synced once at the end). Moves no data itself; it tells engine
     *  AUTO to weigh each engine with its share of that sync and to keep writes of 64 KiB and
     *  more off the page cache, where they would only move their cost into the sync. */
    FT_IO_SYNC_LATER = 1u << 1,
};

/** Per-call options; NULL means engine AUTO and no flags. */
typedef struct ft_io_opts {
    ft_engine engine; /**< engine for this call, FT_ENGINE_AUTO to let the library choose */
    unsigned flags;   /**< FT_IO_* bits */
    void *stream;     /**< device memory: the caller's CUstream (NULL: the legacy default
                           stream). The transfer starts after the work already queued on it
                           (a write never reads the buffer before its producers finish; a
                           read never overwrites it while queued work still uses it) and the
                           data is in place when the call returns. */
    ft_cache_mode cache; /**< engine AUTO: what the call leaves in the page cache */
} ft_io_opts;

/**
 * Read up to buf->len bytes at @p offset of @p file into @p buf.
 * Any offset, length and buffer alignment. Blocks until done.
 * @return bytes read: buf->len, or fewer when the file ends first (0 at or past EOF);
 *         or -errno (-EIO, -EBADF if the file is not readable, -EINVAL, ...).
 */
int64_t ft_read(ft_file *file, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts);

/**
 * Write buf->len bytes from @p buf at @p offset of @p file, extending the file as needed.
 * With FT_IO_SYNC the data is durable when the call returns.
 * @return buf->len, or -errno (-ENOSPC, -EIO, -EBADF if the file is not writable, ...);
 *         after a failure the range's contents are unspecified.
 */
int64_t ft_write(ft_file *file, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts);

typedef struct ft_req ft_req;

/**
 * Start an asynchronous read (same semantics as ft_read) and return at once.
 * The buffer must stay valid and untouched until the request is waited for.
 * @return 0 and *out set, or -errno (the request was not started).
 */
int ft_submit_read(ft_file *file, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                   ft_req **out);

/** Start an asynchronous write (same semantics as ft_write). @see ft_submit_read */
int ft_submit_write(ft_file *file, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                    ft_req **out);

/**
 * Ask whether a request has finished, without blocking.
 * @return 1 finished (ft_req_wait returns at once), 0 still running.
 */
int ft_req_poll(ft_req *req);

/**
 * Wait for a request to finish and collect its result. The request stays allocated until
 * ft_req_free; waiting again returns the same result.
 * @return what ft_read / ft_write would have returned; on failure the detail message is
 *         made the calling thread's ft_last_error().
 */
int64_t ft_req_wait(ft_req *req);

/** Free a request, waiting for it first if it is still running. NULL is a no-op. */
void ft_req_free(ft_req *req);

/** One transfer of a batch: a buffer, a file offset, and the outcome. */
typedef struct ft_batch_op {
    ft_buf buf;      /**< memory side (host or device, any alignment) */
    uint64_t offset; /**< file offset */
    int64_t result;  /**< out: bytes transferred (a read stops at end of file) or -errno */
} ft_batch_op;

/**
 * Run @p n independent reads of @p file as one call, in parallel: many small transfers
 * (the tensors of a checkpoint, pages of a cache) without a call and a wait each.
 * With engine FT_ENGINE_CUFILE, device memory of one GPU, ops of at most 16 MiB and
 * GPUDirect Storage (nvidia-fs; or FASTENSOR_CUFILE_BATCH=1), the ops go to cuFile's batch
 * API (cuFileBatchIOSubmit, up to cuFile's batch size per submission). Otherwise, and where
 * cuFile refuses batches (`fastensor info` says why), each op takes the path ft_read would,
 * in parallel on the context's threads. Device memory is
 * ordered as for ft_read with opts->stream. All ops are checked first: if one is invalid,
 * none runs. Ops whose ranges overlap run in no defined order.
 * @return 0 when every op succeeded, else the -errno of the first failed op (its detail is
 *         ft_last_error()); every op's result is set (0 for ops that did not run).
 */
int ft_read_batch(ft_file *file, ft_batch_op *ops, size_t n, const ft_io_opts *opts);

/** Run @p n independent writes as one call; FT_IO_SYNC makes them durable with one sync at
 * the end. Otherwise as ft_read_batch. */
int ft_write_batch(ft_file *file, ft_batch_op *ops, size_t n, const ft_io_opts *opts);


/* ------------------------------------------------------------------------------------------
 * GPUs (libcuda.so.1, libcufile.so.0 and libnvidia-ml.so.1 are opened at run time)
 * ---------------------------------------------------------------------------------------- */

/** @return 1 when the CUDA driver and a device are usable, else 0 with *reason set. */
int ft_cuda_available(const char **reason);

/** Allocate @p len bytes of device memory on @p device (cuMemAlloc). @return 0 or -errno. */
int ft_cuda_alloc(int device, size_t len, void **out);

/** Free memory from ft_cuda_alloc. NULL is a no-op. @return 0 or -errno. */
int ft_cuda_free(void *ptr);

/** Copy @p len bytes between host and device memory (either way). @return 0 or -errno. */
int ft_cuda_copy(void *dst, const void *src, size_t len);

/**
 * Register a long-lived device buffer with cuFile (cuFileBufRegister) for @p ctx: cuFile
 * transfers into or out of any part of it then move data without cuFile's internal bounce
 * buffers (with GPUDirect Storage; in compatibility mode registration is accepted and changes
 * little). Optional: unregistered device memory works with every engine. The registration
 * lasts until ft_buf_unregister or ft_ctx_destroy; the memory must outlive it.
 * @return 0; -EINVAL (not device memory, or empty), -EEXIST (overlaps a registered range),
 *         -ENODEV / -EOPNOTSUPP (no CUDA / no cuFile: the detail says why), -EIO (cuFile
 *         refused: its error code in the detail).
 */
int ft_buf_register(ft_ctx *ctx, const ft_buf *buf);

/** Undo ft_buf_register of the range starting at buf->ptr. @return 0 or -ENOENT. */
int ft_buf_unregister(ft_ctx *ctx, const ft_buf *buf);

/**
 * Describe the GPUs (driver version, devices, pinned copy bandwidth) and cuFile (GDS or
 * compatibility mode, or why not available) as text lines into @p buf. @return 0.
 */
int ft_gpu_describe(char *buf, size_t len);

/** Cumulative energy counters; differences of two samples give joules spent. */
typedef struct ft_energy {
    double gpu_joules; /**< all GPUs (NVML), valid when gpu_valid */
    double cpu_joules; /**< CPU packages (RAPL powercap), valid when cpu_valid */
    int gpu_valid;
    int cpu_valid;
} ft_energy;

/** Read the energy counters. @return 0 (fields say what was readable). */
int ft_energy_sample(ft_energy *out);

/* ------------------------------------------------------------------------------------------
 * Checkpoints: safetensors files (8-byte little-endian header length, JSON header, data)
 * ---------------------------------------------------------------------------------------- */

/** Element types, named as in safetensors. Values are stable. */
typedef enum ft_dtype {
    FT_DTYPE_BOOL = 0,
    FT_DTYPE_U8,
    FT_DTYPE_I8,
    FT_DTYPE_F8_E5M2,
    FT_DTYPE_F8_E4M3,
    FT_DTYPE_F8_E8M0,
    FT_DTYPE_I16,
    FT_DTYPE_U16,
    FT_DTYPE_F16,
    FT_DTYPE_BF16,
    FT_DTYPE_I32,
    FT_DTYPE_U32,
    FT_DTYPE_F32,
    FT_DTYPE_C64,
    FT_DTYPE_F64,
    FT_DTYPE_I64,
    FT_DTYPE_U64,
    FT_DTYPE_F4,      /**< 4-bit float (E2M1), two per byte */
    FT_DTYPE_F6_E2M3, /**< 6-bit floats, four per three bytes */
    FT_DTYPE_F6_E3M2,
    FT_DTYPE_F8_E4M3FNUZ,
    FT_DTYPE_F8_E5M2FNUZ,
    FT_DTYPE_COUNT
} ft_dtype;

/** @return the safetensors name ("F32", ...), or NULL for an unknown value. */
const char *ft_dtype_name(ft_dtype dtype);
/** @return the dtype for a safetensors name (exact, e.g. "BF16"), or -EINVAL. */
int ft_dtype_from_name(const char *name);
/** @return bytes per element (1..8), or 0 for the packed sub-byte types and unknown values. */
size_t ft_dtype_size(ft_dtype dtype);
/** @return bits per element (4, 6, 8, ..., 64), or 0 for an unknown value. A tensor of a
 * packed type holds a whole number of bytes: elements x bits is a multiple of 8. */
unsigned ft_dtype_bits(ft_dtype dtype);
/** @return the dtype's rank in safetensors' layout order (its Dtype enum): a save lays
 * tensors out from the highest rank down, each rank by name, so every tensor sits aligned to
 * its element (0 for an unknown value). */
unsigned ft_dtype_rank(ft_dtype dtype);

#define FT_MAX_DIMS 16

/** A tensor to save: name, element type, shape and its bytes (row-major, contiguous). */
typedef struct ft_tensor {
    const char *name;      /**< UTF-8, unique within a checkpoint, not "__metadata__" */
    ft_dtype dtype;
    unsigned ndim;         /**< 0 (a scalar) .. FT_MAX_DIMS */
    const uint64_t *shape; /**< ndim extents (may be NULL when ndim is 0) */
    ft_buf data;           /**< exactly product(shape) x dtype size bytes */
} ft_tensor;

enum {
    FT_SAVE_NO_CHECKSUM = 1u << 0, /**< do not record xxh3 block checksums */
    FT_SAVE_NO_SYNC = 1u << 1,     /**< skip fdatasync/fsync (not crash-safe; for scratch) */
};

/** What a save to a .fst path does with float tensors (docs/FORMAT.md). */
typedef enum ft_compression {
    FT_COMPRESS_AUTO = 0, /**< code them where coding pays on this machine and disk
                               (ft_fst_coding_pays of ft_fst_measure) */
    FT_COMPRESS_ALWAYS,   /**< code each; keep a stream that saves at least 5% */
    FT_COMPRESS_NONE,     /**< store every tensor (codec blocks, checksums, no coding) */
    FT_COMPRESS_COUNT
} ft_compression;

/** Options of ft_ckpt_save; NULL means the defaults. */
typedef struct ft_save_opts {
    ft_engine engine;           /**< engine for the data (AUTO: the library's choice) */
    unsigned flags;             /**< FT_SAVE_* bits */
    uint64_t shard_size;        /**< 0: one file; else shard above this many data bytes */
    uint64_t checksum_block;    /**< bytes per checksum block (0: 1 MiB; power of 2, >= 4K) */
    const char *const *metadata; /**< NULL or key, value, key, value, ..., NULL (strings) */
    ft_cache_mode cache;        /**< engine AUTO: KEEP leaves the files in the page cache
                                     (buffered writes, then fdatasync) for a read-back soon */
    ft_compression compression; /**< a .fst path: which tensors are coded (else AUTO only) */
    const struct ft_fst_coded *coded; /**< a .fst path: the streams ft_fst_code made of these
                                           tensors, written as they are (NULL: coded here) */
    const size_t *coded_index;  /**< with coded: tensor i's stream is coded_index[i] (a save
                                     of some of the coded tensors); NULL: stream i */
} ft_save_opts;

/** ft_ckpt_save's result when the new checkpoint is installed but a step after its commit
 * point failed (the directory fsync that makes it durable, or removing the previous
 * checkpoint's files): ft_last_error says which. Not an error: nothing needs redoing, though
 * the save may not survive a power loss until the directory is synced. */
#define FT_SAVE_WARNING 1

/**
 * Save tensors as a safetensors checkpoint at @p path, atomically; or, where @p path ends in
 * ".fst", as a compressed container (docs/FORMAT.md: each tensor's codec stream at a page
 * boundary, coded as opts->compression says, the header after the streams; one file, no
 * shard_size), installed the same way. The data section starts on
 * a 4096-byte boundary (the header is padded with spaces) and xxh3 checksums of fixed-size
 * blocks go into __metadata__ under "fastensor.*" keys; tensors are laid out as safetensors
 * lays them out: larger elements first (each aligned to its element size), then by name.
 * With opts->shard_size the data is split into shards beside an index
 * NAME.safetensors.index.json (Hugging Face layout; @p path names the index's stem,
 * "dir/model.safetensors"), written in parallel.
 *
 * Every file is written under a temporary name ("….fastensor-tmp-PID-N", flock'ed while the
 * save runs) and fdatasync'ed. One rename then installs the checkpoint: of the file over
 * @p path, or, for shards (named for this save: "model-00001-of-00004.GEN.safetensors", made
 * durable first), of the index. Only then are the previous checkpoint's files removed: the
 * other form of the name too (a single-file save replaces an earlier sharded one and the
 * reverse), and leftovers of saves that died (see ft_ckpt_gc). A crash or an error at any
 * point leaves the previous checkpoint complete, or the new one: never a mix.
 * @return 0; FT_SAVE_WARNING (installed, a step after the commit failed); or -errno, with the
 *         previous checkpoint at @p path, if any, still the one installed and no file of
 *         this save left behind: -EINVAL (bad tensor, name, shape or size: nothing
 *         written), -ENOSPC, -EIO, ...
 */
int ft_ckpt_save(ft_ctx *ctx, const char *path, const ft_tensor *tensors, size_t count,
                 const ft_save_opts *opts);

typedef struct ft_ckpt ft_ckpt;

/** What a checkpoint says about one tensor. Pointers live as long as the ft_ckpt. */
typedef struct ft_tensor_info {
    const char *name;
    ft_dtype dtype;
    unsigned ndim;
    const uint64_t *shape;
    uint64_t nbytes;      /**< bytes of data */
    unsigned shard;       /**< index of the shard file holding it */
    uint64_t data_offset; /**< offset within its shard's data section */
    uint64_t file_offset; /**< offset within its shard file */
} ft_tensor_info;

/**
 * Open a checkpoint: a .safetensors file, a .safetensors.index.json index, a .fst container
 * (told by its magic; its tensors are decoded by every load call, data_offset being where a
 * safetensors file would hold them), or a directory holding exactly one safetensors file or
 * index (an index is preferred). Every header is validated
 * strictly (size limits, JSON shape, dtypes, shapes against byte ranges, offsets inside the
 * file, no overlaps or holes, unique UTF-8 names; shard paths must stay inside the index's
 * directory). @return 0, or -ENOENT, -EACCES, ..., -EINVAL / -EBADMSG for an invalid file
 * (ft_last_error says what is wrong and where).
 */
int ft_ckpt_open(ft_ctx *ctx, ft_ckpt **out, const char *path);

/** Close a checkpoint and free what ft_ckpt_load_all allocated. NULL is a no-op. */
void ft_ckpt_close(ft_ckpt *ckpt);

/** @return the number of tensors. */
size_t ft_ckpt_count(const ft_ckpt *ckpt);

enum {
    FT_FORMAT_SAFETENSORS = 0, /**< safetensors files (one, or shards of an index) */
    FT_FORMAT_FST = 1,         /**< a .fst container: tensors stored as codec streams */
};

/** @return the checkpoint's format (FT_FORMAT_*), or -EINVAL. */
int ft_ckpt_format(const ft_ckpt *ckpt);

/**
 * The bytes tensor @p index takes in its file (*stored, when not NULL): a .fst container's
 * stream, else its data. @return 1 where its stream codes it (compressed), 0 where its bytes
 * are stored as they are, or -ERANGE.
 */
int ft_ckpt_stored(const ft_ckpt *ckpt, size_t index, uint64_t *stored);

/** Describe tensor @p index (file order within each shard). @return 0 or -ERANGE. */
int ft_ckpt_info(const ft_ckpt *ckpt, size_t index, ft_tensor_info *info);

/** @return the index of the tensor called @p name, or -ENOENT. */
int64_t ft_ckpt_find(const ft_ckpt *ckpt, const char *name);

/** @return the number of user metadata entries (fastensor.* keys excluded). */
size_t ft_ckpt_metadata_count(const ft_ckpt *ckpt);

/** Get metadata entry @p index as key and value. @return 0 or -ERANGE. */
int ft_ckpt_metadata(const ft_ckpt *ckpt, size_t index, const char **key, const char **value);

/** @return the number of shard files (1 for a single file). */
unsigned ft_ckpt_shard_count(const ft_ckpt *ckpt);

/** @return the size of shard @p shard's data section, or -ERANGE. */
int64_t ft_ckpt_shard_size(const ft_ckpt *ckpt, unsigned shard);

/** @return where shard @p shard's data section starts in its file, or -ERANGE. */
int64_t ft_ckpt_shard_data_start(const ft_ckpt *ckpt, unsigned shard);

/** @return the path of shard @p shard, or NULL. */
const char *ft_ckpt_shard_path(const ft_ckpt *ckpt, unsigned shard);

/**
 * The descriptor shard @p shard was opened and parsed through (owned by the checkpoint:
 * do not close it). Map or read the shard through it, never by its name: a file replaced
 * under that name since the open is another checkpoint. @return the fd or -ERANGE.
 */
int ft_ckpt_shard_fd(const ft_ckpt *ckpt, unsigned shard);

/** @return 1 when the checkpoint carries fastensor checksums (for every shard), else 0. */
int ft_ckpt_has_checksums(const ft_ckpt *ckpt);

/**
 * Whether shard @p shard's data section is in the page cache, sampled at its start, middle
 * and end (cachestat(2) where the kernel has it, else mincore). A cached shard can be mapped
 * instead of read: the Python loaders map it (no copy, no fresh memory) unless told not to.
 * @return 1 cached (at least 90% of the sampled pages), 0 not, or -ERANGE.
 */
int ft_ckpt_shard_cached(const ft_ckpt *ckpt, unsigned shard);

/**
 * Bring shard @p shard's data section into the page cache, if the cache mode keeps it there
 * (@p cache; FT_CACHE_AUTO: the context's setting, which keeps a checkpoint that fits, see
 * ft_cache_mode): parallel readahead in pieces of at most 16 MiB, each waited for through a
 * read-only mapping of it (MADV_POPULATE_READ; no copy), else read through a buffer. For
 * mapping the file instead of reading it: the Python host loaders then view the page cache
 * (no copy, no fresh memory), and several processes loading one checkpoint read it from the
 * disk once.
 * @return 1 when the data is cached (or now being read into the cache: a mapping's first
 *         touch of a page waits for it), 0 when the cache mode reads it around the cache,
 *         or -errno.
 */
int ft_ckpt_prefetch(ft_ckpt *ckpt, unsigned shard, ft_cache_mode cache);

/**
 * ft_ckpt_prefetch for a caller that maps the shard's file: @p map is a readable mapping of
 * it from offset 0 (MAP_PRIVATE or MAP_SHARED) covering the data section. Each piece's pages
 * are mapped into it (a byte of every page read, nothing copied) as soon as that piece is
 * cached, while the rest is still read; a shard cached already is mapped in as by
 * ft_map_populate. (Development machine, 1 GiB cold: 1.3x one process's mapped load, 1.2x
 * four processes', against prefetching first and mapping in after.)
 * @return 1 (cached, and mapped in), 0 when the cache mode reads it around the cache or the
 *         file is shorter than its header says (the mapping is left alone: read the shard,
 *         which reports it), or -errno.
 */
int ft_ckpt_prefetch_map(ft_ckpt *ckpt, unsigned shard, ft_cache_mode cache, const void *map);

/**
 * Map the pages of a readable mapping [addr, addr+len) in, in parallel slices on the
 * context's threads, by reading a byte of every page (nothing is copied: a private file
 * mapping stays shared with the page cache until written), waiting for pages still being
 * read. One thread's faults cap a mapped load otherwise. The range must be mapped, and a file
 * mapping must lie within the file (a page past its end raises SIGBUS). @return 0, or -EINVAL.
 */
int ft_map_populate(ft_ctx *ctx, const void *addr, size_t len);

enum {
    FT_LOAD_VERIFY = 1u << 0, /**< check xxh3 block checksums while loading (when present) */
};

/** Options of the load calls; NULL means engine AUTO, no verification. */
typedef struct ft_load_opts {
    ft_engine engine;
    unsigned flags; /**< FT_LOAD_* bits */
    void *stream;   /**< device destinations: the caller's CUstream (see ft_io_opts) */
    ft_cache_mode cache; /**< engine AUTO: what the load leaves in the page cache */
} ft_load_opts;

/**
 * Whether a caller that can map files (the Python host loaders) should map shard @p shard
 * (a private mapping of ft_ckpt_shard_fd, its tensors viewing the page cache, then
 * ft_ckpt_prefetch_map) rather than read it (ft_ckpt_load_shard). @p mmap: 1 map where the
 * shard can be mapped, 0 never, -1 the library's choice: map with engine AUTO (then
 * ft_ckpt_prefetch_map says whether the cache mode keeps it, else read it). Never mapped:
 * FT_LOAD_VERIFY (checksums are checked while reading), a .fst container (decoded), an empty
 * data section, one not 8-byte aligned in the file (tensor views need aligned addresses), a
 * file shorter than its header says (the read reports it).
 * @return 1 map, 0 read, or -errno.
 */
int ft_ckpt_shard_mappable(const ft_ckpt *ckpt, unsigned shard, const ft_load_opts *opts,
                           int mmap);

/**
 * Read shard @p shard's whole data section into @p dst (dst->len must be at least
 * ft_ckpt_shard_size) with one large parallel read: the fastest path. Tensor i of the shard
 * then sits at dst->ptr + info.data_offset. With FT_LOAD_VERIFY, blocks are checked as they
 * arrive (no second read). Into device memory with engine AUTO, an uncached shard the cache
 * mode keeps is read into the page cache as ft_ckpt_prefetch reads it, and each 64 MiB part
 * is copied to the device as soon as it is cached, while the disk reads the rest.
 * @return the bytes read, or -errno; -EBADMSG when a checksum does not match (ft_last_error
 * names the block and the tensor); a failed readahead is the load's error.
 */
int64_t ft_ckpt_load_shard(ft_ckpt *ckpt, unsigned shard, const ft_buf *dst,
                           const ft_load_opts *opts);

/**
 * Load every shard into memory the checkpoint owns (one aligned allocation per shard, read in
 * parallel); ft_ckpt_data then points at each tensor. @return 0 or -errno (see load_shard).
 */
int ft_ckpt_load_all(ft_ckpt *ckpt, const ft_load_opts *opts);

/** @return tensor @p index's bytes after ft_ckpt_load_all, else NULL. */
const void *ft_ckpt_data(const ft_ckpt *ckpt, size_t index);

/**
 * Read one tensor into a caller buffer of at least info.nbytes. With FT_LOAD_VERIFY, the
 * checksum blocks it overlaps are read and checked too. @return bytes read or -errno.
 */
int64_t ft_ckpt_load_tensor(ft_ckpt *ckpt, size_t index, const ft_buf *dst,
                            const ft_load_opts *opts);

/**
 * Read bytes [offset, offset + dst->len) of tensor @p index's data into @p dst (host or
 * device memory), nothing else of the file (what a slice of a tensor needs). With
 * FT_LOAD_VERIFY, the checksum blocks the range overlaps are read and checked too.
 * @return bytes read, or -errno: -ERANGE when the range is not inside the tensor.
 */
int64_t ft_ckpt_read_range(ft_ckpt *ckpt, size_t index, uint64_t offset, const ft_buf *dst,
                           const ft_load_opts *opts);

/**
 * Read several byte ranges of tensor @p index as one call (the runs of a slice, such as a
 * block of columns): ops[k].offset is an offset inside the tensor's data, ops[k].buf where
 * its ops[k].buf.len bytes go (host or device memory). The ranges are read in parallel
 * through the descriptor whose header was parsed (ft_read_batch); with FT_LOAD_VERIFY each
 * is read with the checksum blocks it overlaps, as ft_ckpt_read_range reads. All ranges are
 * checked first: one not inside the tensor, and none is read (-ERANGE). ops[k].result is set
 * to each range's bytes read (0 for ranges that did not run).
 * @return the bytes of all ranges, or -errno of the first failure.
 */
int64_t ft_ckpt_read_ranges(ft_ckpt *ckpt, size_t index, ft_batch_op *ops, size_t n,
                            const ft_load_opts *opts);

/**
 * Read bytes [offset, offset + dst->len) of shard @p shard's data section (tensor i of the
 * shard starts at its info.data_offset) into @p dst, host or device memory: several
 * neighbouring tensors in one read. With FT_LOAD_VERIFY, the checksum blocks the range
 * overlaps are read and checked too. @return bytes read, or -errno: -ERANGE when the range is
 * not inside the data section.
 */
int64_t ft_ckpt_read_shard_range(ft_ckpt *ckpt, unsigned shard, uint64_t offset,
                                 const ft_buf *dst, const ft_load_opts *opts);

/**
 * Check every checksum of every shard (reads the whole checkpoint). @p progress, when not
 * NULL, is called with (bytes done, bytes total, arg) from the calling thread.
 * @return 0 when intact; -EBADMSG at the first bad block (ft_last_error names the shard,
 *         block, byte range and tensor); -ENODATA when the checkpoint has no checksums.
 */
int ft_ckpt_verify(ft_ckpt *ckpt, const ft_load_opts *opts,
                   void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/**
 * Install @p len bytes at @p path atomically, as a checkpoint save installs a file (a small
 * file beside checkpoints, such as a DCP save's metadata): written under a locked temporary
 * name (ft_ckpt_gc removes it after a crash), fdatasync'ed, renamed over @p path, the
 * directory fsync'ed (@p flags FT_SAVE_NO_SYNC: neither sync). The file it replaces is freed
 * off the caller's path (a pool worker drops the last reference). A link at @p path is
 * replaced as a name (its target is left alone).
 * @return 0; FT_SAVE_WARNING (installed, the directory fsync failed); or -errno with nothing
 *         installed and no temporary left.
 */
int ft_file_install(ft_ctx *ctx, const char *path, const void *data, size_t len,
                    unsigned flags);

/** Remove the file at @p path, its blocks freed off the caller's path (a pool worker drops
 * the last reference, as a save frees the files it replaces). @return 0 or -errno
 * (-ENOENT). */
int ft_file_remove(ft_ctx *ctx, const char *path);

/**
 * Remove what dead saves left in directory @p dir: temporaries ("*.fastensor-tmp-PID-N",
 * and the older "*.safetensors.tmp-PID-N") of processes that are gone, and shards of
 * generations ("NAME-0000i-of-0000N.GEN.safetensors") that no index in @p dir lists. A file
 * flock'ed by a save in progress, or whose pid is alive, is kept. @p removed, when not NULL,
 * is called with each removed path. Checkpoints themselves are never touched.
 * @return the number of files removed, or -errno (-ENOTDIR, ...).
 */
int64_t ft_ckpt_gc(ft_ctx *ctx, const char *dir,
                   void (*removed)(const char *path, void *arg), void *arg);

/* ------------------------------------------------------------------------------------------
 * Tensor codec: lossless compression of floating-point weights by byte planes
 * ---------------------------------------------------------------------------------------- */

/**
 * The most bytes ft_codec_encode writes for @p nbytes of @p elem_size-byte elements in blocks
 * of @p block_bytes (0: the default, 1 MiB).
 */
size_t ft_codec_bound(uint64_t nbytes, unsigned elem_size, uint32_t block_bytes);

/** ft_codec_encode flag: store every plane raw (the stream still has blocks and checksums). */
#define FT_CODEC_STORE 1u

/**
 * Encode @p nbytes at @p src, little-endian elements of @p elem_size bytes (1, 2, 4 or 8;
 * @p nbytes a multiple of it), into @p dst (@p cap bytes, ft_codec_bound is always enough).
 * The data is cut into independent blocks of @p block_bytes (0: 1 MiB; a multiple of the
 * element size, at least 64 elements); each block is split into its byte planes (byte k of
 * every element) and each plane stored raw, as one repeated byte or Huffman-coded, whichever
 * is smallest (@p flags FT_CODEC_STORE: raw; integers, data that is known not to compress);
 * each block's checksum (xxh3-64 of its bytes) goes with it. Blocks are encoded
 * in parallel on @p ctx's threads. The stream is self-describing (ft_codec_size,
 * ft_codec_decode). Lossless for any bytes.
 * @return the stream's size, or -errno (-EINVAL bad sizes, -ENOSPC @p cap too small).
 */
int64_t ft_codec_encode(ft_ctx *ctx, const void *src, uint64_t nbytes, unsigned elem_size,
                        uint32_t block_bytes, unsigned flags, void *dst, size_t cap);

/**
 * ft_codec_encode on the GPU: @p nbytes at @p src in memory of CUDA device @p device are
 * encoded by its GPU (every step, the block checksums included) into @p dst (@p cap bytes):
 * host memory (pinned memory copies fastest) or memory of the same device; the very stream
 * ft_codec_encode writes for the same bytes. A batch of one (ft_codec_encode_cuda_batch);
 * many tensors go faster as one batch. @return the stream's size, or -errno as the batch's.
 */
int64_t ft_codec_encode_cuda(ft_ctx *ctx, const void *src, uint64_t nbytes, unsigned elem_size,
                             uint32_t block_bytes, void *dst, size_t cap, int device,
                             void *stream);

/** One stream for ft_codec_encode_cuda_batch. */
typedef struct ft_codec_enc_job {
    const void *src;      /**< the elements, in memory of the device */
    uint64_t nbytes;      /**< their bytes (a multiple of elem_size) */
    unsigned elem_size;   /**< 1, 2, 4 or 8 */
    uint32_t block_bytes; /**< as ft_codec_encode's (0: 1 MiB) */
    void *dst;            /**< host memory or memory of the device, for the stream */
    size_t cap;           /**< room at @p dst (ft_codec_bound is always enough) */
    int64_t size;         /**< set by the call: the stream's bytes */
} ft_codec_enc_job;

/**
 * Encode @p n tensors in memory of CUDA device @p device on its GPU, each into its job's
 * destination, as ft_codec_encode would (the same bytes). The blocks of all jobs go through
 * in waves of up to 128 MiB (a kernel per step and wave, whatever the number of tensors), so
 * the device memory a call takes is about 140 MiB where a destination is host memory (the
 * coded bytes pass through it), 20 MiB where all are device memory. Ordered after the work
 * queued on @p stream (a CUstream of that device; NULL: the legacy default stream), and done
 * when this returns. @return the streams' bytes in all, or -errno: -ENOSYS where the library
 * was built without nvcc or the driver cannot load its kernels, -ENODEV without CUDA,
 * -EINVAL where a source is not memory of @p device (or a destination of another device) or
 * the sizes are bad, -ENOSPC (a job's room too small: its destination then holds
 * unspecified bytes), -ENOMEM.
 */
int64_t ft_codec_encode_cuda_batch(ft_ctx *ctx, ft_codec_enc_job *jobs, size_t n, int device,
                                   void *stream);

/** The decoded size of the stream @p src of @p len bytes, or -EBADMSG (not a stream). */
int64_t ft_codec_size(const void *src, size_t len);

/**
 * Decode the stream @p src (@p len bytes) into @p dst (@p cap bytes, at least its decoded
 * size), blocks in parallel on @p ctx's threads, each checked against the xxh3-64 checksum
 * the encoder stored for it. Corrupt input never reads or writes out of bounds: it is
 * -EBADMSG (ft_last_error names the block), and @p dst then holds unspecified bytes.
 * @return the decoded bytes, or -errno (-EBADMSG, -ENOSPC, -ENOMEM).
 */
int64_t ft_codec_decode(ft_ctx *ctx, const void *src, size_t len, void *dst, size_t cap);

/** One stream for ft_codec_decode_cuda. */
typedef struct ft_codec_job {
    const void *src;     /**< the stream in host memory (its headers are checked there) */
    size_t len;          /**< its bytes */
    const void *src_dev; /**< the same bytes already in the device's memory, or NULL: they
                              are copied there from @p src (pinned memory copies fastest) */
    void *dst;           /**< device memory for the decoded bytes */
    size_t cap;          /**< room at @p dst (at least the decoded size) */
} ft_codec_job;

/**
 * Decode @p n streams into memory of CUDA device @p device on its GPU: the host checks each
 * stream's structure (-EBADMSG naming the stream and block, nothing written), the streams'
 * bytes go to device memory in one pass, and one kernel decodes every block of every stream
 * (a warp per block). Ordered after the work queued on @p stream (a CUstream of that device;
 * NULL: the legacy default stream), and done when this returns. Block checksums are not
 * checked on the GPU (ft_codec_decode checks them on the host).
 * @return the decoded bytes of all streams, or -errno: -ENOSYS where the library was built
 * without nvcc or the driver cannot load its kernel, -ENODEV without CUDA, -EINVAL where a
 * @p dst is not memory of @p device, -EBADMSG, -ENOSPC, -ENOMEM.
 */
int64_t ft_codec_decode_cuda(ft_ctx *ctx, const ft_codec_job *jobs, size_t n, int device,
                             void *stream);

/** What coding costs and saves on this machine and disk (rates in GB/s). */
typedef struct ft_fst_cost {
    double encode; /**< coding weights of the element size, on the context's threads */
    double share;  /**< coded bytes / bytes of such weights (normal(0, 0.02)) */
    double decode; /**< decoding bf16 weights on the host */
    double write;  /**< the disk taking a save's writes (O_DIRECT pieces, fdatasync) */
    double read;   /**< the disk reading them back (O_DIRECT) */
} ft_fst_cost;

/**
 * Measure (once per context: the codec once per element size, the disk once per filesystem)
 * what coding floats of @p elem_size bytes (1, 2, 4, 8) costs and saves for files in
 * directory @p dir: the codec on 32 MiB of weights, 64 MiB written with O_DIRECT and
 * fdatasync'ed, then read back with O_DIRECT, under a temporary name (0.3-1 s on two cores).
 * @p dir NULL: the codec's figures only (decode, write, read 0). @return 0, or -errno (a
 * directory where O_DIRECT cannot be used: -EINVAL; such a save stores).
 */
int ft_fst_measure(ft_ctx *ctx, const char *dir, unsigned elem_size, ft_fst_cost *out);

/** Make @p cost what @p ctx knows of floats of @p elem_size bytes (and, with @p dir, of that
 * directory's filesystem) instead of measuring: figures measured elsewhere or kept from an
 * earlier run. @return 0 or -errno. */
int ft_fst_cost_set(ft_ctx *ctx, const char *dir, unsigned elem_size, const ft_fst_cost *cost);

/**
 * Whether coding pays (FT_COMPRESS_AUTO's rule): the write time coding saves, (1 - share)
 * of the bytes at the write rate, is at least 0.76 of the time encoding them takes (encodes
 * overlap the writes before them), and the codec decodes at least as fast as the disk reads.
 * @return 1 or 0.
 */
int ft_fst_coding_pays(const ft_fst_cost *cost);

/**
 * Whether saves code floats of @p elem_size bytes (2, 4, 8) that lie in memory of CUDA device
 * @p device on that GPU rather than on the host: its encoder wrote the CPU encoder's very
 * bytes for 32 MiB of weights, faster, the copy to pinned host memory included (measured once
 * per context, GPU and element size). Its encode rate in GB/s in
 * *encode where not NULL (0: not measured). @return 1 (the GPU codes them), 0 (the host does:
 * no GPU encoder in this build, no driver, a slower or a different stream), or -errno.
 */
int ft_fst_gpu_codes(ft_ctx *ctx, int device, unsigned elem_size, double *encode);

/** Tensors coded ahead of their .fst save (ft_fst_code), in host memory the object keeps. */
typedef struct ft_fst_coded ft_fst_coded;

/**
 * Code @p tensors now, as ft_ckpt_save codes them for a .fst container in directory @p dir
 * (opts->compression and the measured decisions; tensors in GPU memory coded by their GPU
 * where it codes them), into host memory of *@p coded: the streams packed page after page, so
 * it takes their coded size (pinned where the process uses CUDA). Made where *@p coded is
 * NULL; else its memory is reused, grown or trimmed to fit (pass back the object of the last
 * call: a training job's saves code into the same memory). When this returns, the tensors'
 * memory is the caller's again; ft_ckpt_save with opts->coded = *@p coded then writes stream i
 * (or opts->coded_index[i]) for its tensor i (of the same dtype and shape; any name; its data
 * not read): an asynchronous save's staging copy is its coded bytes.
 * @return the streams' bytes, or -errno (the object kept, holding no streams).
 */
int64_t ft_fst_code(ft_ctx *ctx, const char *dir, const ft_tensor *tensors, size_t count,
                    const ft_save_opts *opts, ft_fst_coded **coded);

/** The host memory @p coded holds, in bytes. */
uint64_t ft_fst_coded_memory(const ft_fst_coded *coded);

/** Free @p coded and its memory (NULL: nothing). */
void ft_fst_coded_free(ft_fst_coded *coded);

/* ------------------------------------------------------------------------------------------
 * Spill store: tensors parked on local storage and brought back (activation offload)
 * ---------------------------------------------------------------------------------------- */

typedef struct ft_store ft_store;

/** ft_store_opts.host_cache_bytes: a host tier of a quarter of the memory available. */
#define FT_STORE_HOST_AUTO UINT64_MAX

/** How a spill store is made. Zero fields take the defaults. */
typedef struct ft_store_opts {
    const char *dir;           /**< directory of the spill file; NULL: $FASTENSOR_SPILL_DIR,
                                    else $TMPDIR, else /var/tmp */
    uint64_t capacity;         /**< bytes the spill file may hold; 0: as much as the
                                    filesystem gives (the file grows by fallocate). With a
                                    capacity the file is preallocated at creation. */
    uint64_t staging_bytes;    /**< pinned host ring that puts are copied into (so the source
                                    is released before the disk write) and prefetches read
                                    into; 0: 256 MiB. A written copy stays in the ring until
                                    the space is needed (least recently used goes first), so
                                    the entries put last come back without reading the file;
                                    a prefetch only makes room from entries put before its
                                    own (read back in reverse order, later ones are wanted
                                    sooner). */
    uint64_t host_cache_bytes; /**< host-RAM tier in front of the file: up to this many bytes
                                    of entries stay in memory and are never written; 0: none;
                                    FT_STORE_HOST_AUTO: a quarter of the memory available at
                                    creation. When a put finds the tier full, the entries put
                                    before it are written to the file, oldest first, to make
                                    room (their copies stay as cached ones until the space is
                                    needed): the entries put last stay in memory. The memory
                                    is reserved, not taken: pages are used (and pinned, where
                                    CUDA is in use) in 64 MiB pieces as entries first reach
                                    them, and kept by the store from then on. */
    ft_engine engine;          /**< engine of the spill file's transfers. FT_ENGINE_AUTO:
                                    through the page cache (which holds recent slots in
                                    spare RAM and writes them back on its own) while the
                                    file is within page_cache_bytes, then O_DIRECT for
                                    every entry put from there on; the page cache only
                                    where O_DIRECT is not supported. Each transfer is
                                    AUTO's, among the arms of its entry's kind only: page-
                                    cache and O_DIRECT I/O on one slot are not coherent
                                    (readahead may cache a slot's old contents while an
                                    O_DIRECT write lands), so an entry keeps the kind it
                                    was put with, and the switch goes one way only. */
    uint64_t page_cache_bytes; /**< FT_ENGINE_AUTO: the spill file size up to which its I/O
                                    goes through the page cache; 0: an eighth of the memory
                                    available at creation (below the kernel's default
                                    dirty-page throttling) */
} ft_store_opts;

/** Counters of a store since its creation. */
typedef struct ft_store_stats {
    uint64_t puts, gets;           /**< operations started */
    uint64_t bytes_put;            /**< bytes handed to ft_store_put */
    uint64_t bytes_written;        /**< bytes written to the spill file */
    uint64_t writes_skipped;       /**< puts dropped before their write began: not written */
    uint64_t bytes_read;           /**< bytes read back from the spill file */
    uint64_t bytes_got;            /**< bytes delivered by ft_store_get */
    uint64_t bytes_prefetched;     /**< bytes brought into host memory by ft_store_prefetch */
    uint64_t host_hits;            /**< gets served from host memory (ring or tier) */
    uint64_t stall_ns;             /**< time callers were blocked: a put waiting for ring
                                        space, ft_store_wait waiting for a transfer */
    uint64_t inflight_bytes;       /**< bytes of puts and gets not finished now */
    uint64_t peak_inflight_bytes;  /**< the largest inflight_bytes seen */
    uint64_t entries;              /**< entries stored now (not dropped) */
    uint64_t file_used;            /**< bytes of the spill file held by entries */
    uint64_t file_size;            /**< bytes the spill file has allocated */
    uint64_t host_used;            /**< bytes of pinned host memory held by entries */
    uint64_t host_resident;        /**< bytes of entries held only in the host tier */
    uint64_t host_budget;          /**< bytes the host tier may hold (host_cache_bytes) */
    uint64_t host_pinned;          /**< bytes of host memory pinned so far (kept) */
    uint64_t bytes_demoted;        /**< bytes written from the host tier to make room */
    ft_engine engine;              /**< the engine the store's file transfers use */
    ft_cache_mode cache;           /**< engine AUTO: where entries put now go,
                                        FT_CACHE_KEEP (the page cache) or FT_CACHE_BYPASS
                                        (O_DIRECT); a named engine: FT_CACHE_AUTO */
} ft_store_stats;

/**
 * Create a spill store: one spill file in @p opts->dir, unlinked at once (O_TMPFILE, else
 * open + unlink), so nothing is left behind even if the process is killed; entries get slots
 * of it from an allocator (no file per tensor). @p opts may be NULL (all defaults).
 * @return 0 and *out set, or -errno (-ENOENT / -EACCES for the directory, -ENOSPC when the
 *         capacity cannot be preallocated, -ENOMEM for the host ring, ...).
 */
int ft_store_create(ft_ctx *ctx, ft_store **out, const ft_store_opts *opts);

/** Wait for every transfer, then free the store and its file. NULL is a no-op. */
void ft_store_destroy(ft_store *store);

/**
 * Start storing @p src (host or device memory) and return at once with a new key.
 * Device memory is copied into the pinned ring on the store's stream after the work already
 * queued on @p stream (the producer's CUstream; NULL: the legacy default stream), then written
 * from there in the background. The source must stay valid until ft_store_released says 1.
 * Blocks only while the ring is full (counted as stall time).
 * @return 0 and *key set, or -errno (-ENOSPC when the store's capacity or the filesystem is
 *         full: the message gives used, capacity and need; -EINVAL for a bad buffer).
 */
int ft_store_put(ft_store *store, const ft_buf *src, void *stream, uint64_t *key);

/**
 * The CUstream on which the store copies puts' device memory into its ring (created on first
 * use). A put from device memory that fits the ring only queues that copy, so a caller whose
 * allocator orders reuse by streams (PyTorch's record_stream) may free the source right after
 * ft_store_put, once the allocator knows the memory is in use on this stream.
 * @return 0 and *stream set, -ENODEV without CUDA or for a bad device, or -errno.
 */
int ft_store_stream(ft_store *store, int device, void **stream);

/** @return the largest entry a put copies through the ring (larger ones are read straight
 *          from the source until written). */
uint64_t ft_store_ring_limit(const ft_store *store);

/**
 * @return 1 when the put's source buffer is no longer read (it may be freed or changed),
 *         0 while it still is, or -errno (unknown key, or the copy failed).
 */
int ft_store_released(ft_store *store, uint64_t key);

/**
 * Start reading entry @p key back into @p dst (host or device memory; dst->len must be the
 * entry's length). Device memory is written after the work queued on @p stream when the get
 * starts, and @p stream (the consumer's) is made to wait for the data: kernels queued on it
 * after ft_store_wait returns see the data. Several gets of one entry are allowed one after
 * another (each after ft_store_wait of the previous).
 * @return 0, or -errno (-ENOENT unknown key, -EINVAL length mismatch, -EBUSY a get of the
 *         entry is still pending).
 */
int ft_store_get(ft_store *store, uint64_t key, const ft_buf *dst, void *stream);

/**
 * Start bringing entry @p key from the file into pinned host memory, so a later get is a
 * memory copy; an entry still being written from the ring keeps that copy instead. Never
 * waits: ring space is taken only when free (cached copies of other entries may be evicted
 * for it, least recently used first).
 * @return 1 started (or kept); 0 nothing to do (in memory already, or larger than the ring);
 *         -EBUSY no ring space now (try again later); -ENOENT unknown key.
 */
int ft_store_prefetch(ft_store *store, uint64_t key);

/** @return 1 when entry @p key has no put or get in progress, 0 otherwise, -ENOENT. */
int ft_store_poll(ft_store *store, uint64_t key);

/**
 * Wait until entry @p key's put has landed (in the file or the host tier) and its pending
 * get, if any, has delivered (for device memory: the consumer stream waits for it).
 * @return 0, or the -errno of the failed transfer (its detail in ft_last_error), -ENOENT.
 */
int ft_store_wait(ft_store *store, uint64_t key);

/**
 * Wait until every put started so far has landed (in the file or the host tier), and every
 * host-tier entry being written to the file to make room in the tier has been written.
 * @return 0, or the -errno of the first of them that failed (a put's entry keeps its error;
 *         an entry whose demotion failed stays in the tier).
 */
int ft_store_flush(ft_store *store);

/** Forget entry @p key and free its slot (after its transfers finish). A put still reading
 *  its source goes on reading it: wait for ft_store_released (or ft_store_wait) before a
 *  drop where the source's memory is to be freed right after. @return 0 or -ENOENT. */
int ft_store_drop(ft_store *store, uint64_t key);

/** Fill @p out with the store's counters. @return 0 or -EINVAL. */
int ft_store_get_stats(ft_store *store, ft_store_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* FASTENSOR_H */
