/* The spill store's private parts shared by its files. */
#ifndef FT_STORE_STORE_H
#define FT_STORE_STORE_H

#include "../core/internal.h"
#include "../gpu/cuda.h"
#include "extent.h"

#define FT__STORE_MAX_DEVICES 16

/* One stored tensor. Its host copy (a range of the pinned ring) is shared by holders counted
 * in host_refs: the put pipeline until the write is done, the host tier / prefetch cache,
 * and a get copying out of it. */
typedef struct ft__entry {
    uint64_t key;
    uint64_t len;       /* bytes of the tensor */
    uint64_t slot;      /* len rounded up to the O_DIRECT block */
    int64_t file_off;   /* its slot of the spill file (-1: none, len 0) */
    int64_t host_off;   /* its copy in the ring, -1: none */
    unsigned host_refs;
    bool cached;        /* one host ref is the tier's or the prefetch cache's */
    bool dirty;         /* held by the host tier only: never written */
    bool on_disk;       /* the file slot holds the data */
    bool copy_pending;  /* the put still reads its source */
    bool landed;        /* the put is finished (failed or not) */
    bool getting;       /* a get task runs */
    bool prefetching;   /* a prefetch task reads into the host copy */
    bool demoting;      /* a task writes the tier's copy to the file (the tier was full) */
    bool unwritable;    /* that write failed: the entry stays in the tier */
    bool got_pending;   /* an asynchronous host-to-device copy out of the host copy */
    bool dropped;
    unsigned tasks;     /* pool tasks working on the entry */
    int err;            /* the put's failure (-errno), sticky */
    int get_err;        /* the last get's failure */
    char *detail;       /* message of err or get_err */
    uint64_t lru;       /* last use, for evicting cached copies */
    uint64_t order;     /* when it was put (the store's tick then) */
    ft_engine engine;   /* of its file transfers: the store's when it was put */
    ft_cache_mode cache; /* and their class (AUTO: page cache or O_DIRECT), the same way */
    ft_buf src;         /* the put's source (used by its task) */
    int src_device;     /* -1: host memory */
    ft_buf dst;         /* the running get's destination */
    int dst_device;
    CUevent copied;     /* device put: the device-to-host copy is done */
    CUevent got;        /* asynchronous get: the host-to-device copy is done */
    int got_device;
} ft__entry;

struct ft_store {
    ft_ctx *ctx;
    ft_file *file;
    ft_store_opts opts;
    char dir[4096];         /* where the spill file lives */
    pthread_mutex_t lock;
    pthread_cond_t changed; /* any entry's state moved on */
    ft__extents space;      /* slots of the spill file */
    uint64_t file_size;     /* bytes allocated to the file */
    uint64_t cache_limit;   /* AUTO: the bytes of the file the page cache may hold */
    ft_cache_mode cache;    /* AUTO: where entries put now go (FT_CACHE_KEEP, then BYPASS
                               once the file outgrows cache_limit; one way) */
    ft__extents ring;       /* pinned host memory */
    uint8_t *host;          /* reserved mapping of the ring: staging + host tier */
    uint64_t host_bytes;
    uint8_t *chunks;        /* per HOST_CHUNK of it: unused, touched, pinned, pageable */
    ft__entry **table;      /* entries by key's low 32 bits */
    uint32_t table_len, table_cap;
    uint32_t *free_idx;
    uint32_t nfree;
    uint32_t generation;
    uint64_t tick;
    unsigned tasks;         /* pool tasks running for the store */
    unsigned demotions;     /* tier entries being written to make room */
    uint64_t puts_landing;  /* puts not landed yet */
    int flush_err;          /* first failed put since the last flush */
    char *flush_detail;
    ft_store_stats st;
    CUstream out[FT__STORE_MAX_DEVICES]; /* device-to-host copies of puts */
    CUstream in[FT__STORE_MAX_DEVICES];  /* host-to-device copies of gets */
};

/* ---- store.c (lifecycle, memory), used by put.c and get.c; lock held ---- */

/** @return the live entry of @p key or NULL (with -ENOENT detail set). */
ft__entry *ft__store_lookup(ft_store *s, uint64_t key);
/** Give a new entry its key and table place. @return 0 or -ENOMEM. */
int ft__store_insert(ft_store *s, ft__entry *e);
/** Reserve a file slot of @p len bytes, growing the file if the store may. @return off. */
int64_t ft__store_file_reserve(ft_store *s, uint64_t len);
/** Take @p len bytes of the ring, evicting cached copies of entries put before
 * @p evict_before (least recently used first); with @p wait, block (counted as stall) until
 * in-flight puts free space. @return offset or -EAGAIN (no wait). */
int64_t ft__store_ring_take(ft_store *s, uint64_t len, uint64_t evict_before, bool wait);
/** Make the ring's [off, off+len) usable: its pages pinned where CUDA is in use. */
void ft__store_host_commit(ft_store *s, uint64_t off, uint64_t len);
/** An asynchronous device copy to or from the ring's [host_off, host_off+len), split where
 * its pinned pieces meet: the driver takes an asynchronous copy within one registration. */
CUresult ft__store_ring_copy(ft_store *s, uint64_t host_off, CUdeviceptr dev, uint64_t len,
                            bool to_device, CUstream stream);
/** Transfer the entry's whole host copy (its slot) to or from its file slot. */
int64_t ft__store_copy_io(ft_store *s, const ft__entry *e, bool write);
/** Start writing the oldest tier entry put before @p before to its file slot, to make
 * room. @return whether one was started. */
bool ft__store_demote(ft_store *s, uint64_t before);
/** Drop one holder of the entry's host copy; the last one frees it. */
void ft__store_host_unref(ft_store *s, ft__entry *e);
/** Forget the entry: lookups fail from now on; it is freed once nothing works on it. */
void ft__store_mark_dropped(ft_store *s, ft__entry *e);
/** Free the entry if it is dropped and nothing works on it any more. */
void ft__store_maybe_free(ft_store *s, ft__entry *e);
/** Count @p delta bytes in (or out of) flight. */
void ft__store_inflight(ft_store *s, int64_t delta);
/** Keep the entry's failure message. */
void ft__store_keep_detail(ft__entry *e);
/** The store's copy stream for @p device (created on first use, context entered). */
int ft__store_stream(ft_store *s, int device, bool in, CUstream *out);
/** Release host copies whose asynchronous gets have finished. @return how many. */
unsigned ft__store_reap(ft_store *s);
/* ---- put.c: helpers the transfers share ---- */

/** A pool task's argument: the store and the entry it works on. */
typedef struct ft__store_task {
    ft_store *s;
    ft__entry *e;
} ft__store_task;

/** *device = -1 for host memory, else the CUDA device of @p b. @return 0 or -errno. */
int ft__store_buf_device(const ft_buf *b, int *device);
/** Queue fn(task of s, e) on the pool, counted as the entry's and store's (lock held). */
int ft__store_post(ft_store *s, ft__entry *e, void (*fn)(void *));
/** End of a task (lock held): counts, wakes waiters, frees a dropped entry. */
void ft__store_task_done(ft_store *s, ft__entry *e);
/** Move the entry's slot between the file and @p mem in whole O_DIRECT blocks. */
int64_t ft__store_slot_transfer(ft_store *s, const ft__entry *e, const ft_buf *mem,
                                int device, CUstream stream, bool write);

/** @return @p n rounded up to whole O_DIRECT blocks (a slot's size). */
static inline uint64_t ft__store_round_block(uint64_t n)
{
    return (n + FT__DIRECT_ALIGN - 1) / FT__DIRECT_ALIGN * FT__DIRECT_ALIGN;
}

/** @return monotonic nanoseconds. */
uint64_t ft__store_now(void);

#endif
