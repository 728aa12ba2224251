/*
 * Spill store lifecycle and memory: the unlinked spill file and its slot allocator, the
 * pinned host ring (and host tier) with LRU eviction of cached copies, the entry table.
 */
#include "store.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_STAGING (256ull << 20)
#define GROW_STEP (64ull << 20) /* the file grows in steps this big: few fallocate calls */
#define HOST_CHUNK (64ull << 20) /* host memory is pinned in pieces this big, when first used */
#define MAX_HOST (1ull << 56) /* larger host sizes are mistakes (and would overflow sums) */
enum { CHUNK_UNUSED, CHUNK_TOUCHED, CHUNK_PINNED, CHUNK_PAGEABLE };

uint64_t ft__store_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static const char *spill_dir(const ft_store_opts *o)
{
    if (o->dir && *o->dir)
        return o->dir;
    const char *d = getenv("FASTENSOR_SPILL_DIR");
    if (!d || !*d)
        d = getenv("TMPDIR");
    return d && *d ? d : "/var/tmp";
}

/* An unlinked file in @p dir: O_TMPFILE never has a name; elsewhere the name lives only
 * between open and unlink. */
static int open_spill(const char *dir, char *label, size_t label_len)
{
    snprintf(label, label_len, "%s/(fastensor spill file)", dir);
    int fd = ft__sys.open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
        return ft__err(-errno, "cannot create a spill file in %s", dir);
    for (unsigned attempt = 0; attempt < 100; attempt++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/.fastensor-spill-%ld-%u-%lu", dir, (long)getpid(),
                 attempt, (unsigned long)(ft__store_now() & 0xffffff));
        fd = ft__sys.open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST)
            continue;
        if (fd < 0)
            return ft__err(-errno, "cannot create a spill file in %s", dir);
        if (ft__sys.unlink(path) != 0) {
            int e = errno;
            ft__sys.close(fd);
            return ft__err(-e, "cannot unlink the spill file %s", path);
        }
        return fd;
    }
    return ft__err(-EEXIST, "cannot find a free spill file name in %s", dir);
}

/* Allocate [from, to) of the file; filesystems without fallocate get a plain extension. */
static int file_extend(ft_store *s, uint64_t from, uint64_t to)
{
    int rc = ft_file_allocate(s->file, from, to - from);
    if (rc == -EOPNOTSUPP)
        rc = ft_file_truncate(s->file, to);
    return rc;
}

/* Host memory: one reserved mapping for the ring and the host tier, its pages taken only
 * when first used and pinned (registered with the driver) a chunk at a time, so a large
 * tier costs nothing until entries fill it and stays with the store once they have. */
static int host_reserve(ft_store *s, uint64_t bytes)
{
    void *p = ft__sys.mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return ft__err(-errno, "spill store: cannot reserve %llu bytes of host memory",
                       (unsigned long long)bytes);
    s->host = p;
    s->host_bytes = bytes;
    s->chunks = calloc((bytes + HOST_CHUNK - 1) / HOST_CHUNK, 1);
    if (!s->chunks)
        return ft__err(-ENOMEM, "spill store: chunk table");
    return 0;
}

void ft__store_host_commit(ft_store *s, uint64_t off, uint64_t len)
{
    if (!len)
        return;
    bool cuda = ft__cuda_in_use();
    for (uint64_t c = off / HOST_CHUNK; c <= (off + len - 1) / HOST_CHUNK; c++) {
        if (s->chunks[c] == CHUNK_PINNED || s->chunks[c] == CHUNK_PAGEABLE ||
            (s->chunks[c] == CHUNK_TOUCHED && !cuda))
            continue;
        s->chunks[c] = CHUNK_TOUCHED;
        if (!cuda || ft__cuda_enter(0) != 0)
            continue;
        uint64_t at = c * HOST_CHUNK, n = s->host_bytes - at < HOST_CHUNK ? s->host_bytes - at
                                                                            : HOST_CHUNK;
        /* Pinned: device copies run at full speed, asynchronously, straight from here. A
         * refusal (a locked-memory limit) leaves it pageable, which still works. */
        CUresult r = ft__cu.MemHostRegister(s->host + at, n, FT_CU_MEMHOSTREGISTER_PORTABLE);
        ft__cuda_leave();
        s->chunks[c] = r == 0 ? CHUNK_PINNED : CHUNK_PAGEABLE;
        if (r == 0)
            s->st.host_pinned += n;
    }
}

CUresult ft__store_ring_copy(ft_store *s, uint64_t host_off, CUdeviceptr dev, uint64_t len,
                            bool to_device, CUstream stream)
{
    CUresult r = 0;
    while (len && r == 0) {
        uint64_t n = HOST_CHUNK - host_off % HOST_CHUNK;
        n = n < len ? n : len;
        r = to_device ? ft__cu.MemcpyHtoDAsync(dev, s->host + host_off, n, stream)
                      : ft__cu.MemcpyDtoHAsync(s->host + host_off, dev, n, stream);
        host_off += n;
        dev += n;
        len -= n;
    }
    return r;
}

static void host_release(ft_store *s)
{
    if (!s->host)
        return;
    bool entered = false;
    for (uint64_t c = 0; s->chunks && c * HOST_CHUNK < s->host_bytes; c++) {
        if (s->chunks[c] != CHUNK_PINNED)
            continue;
        if (!entered && ft__cuda_enter(0) != 0)
            break; /* no context: the mapping goes anyway, and the driver's records with it */
        entered = true;
        ft__cu.MemHostUnregister(s->host + c * HOST_CHUNK);
    }
    if (entered)
        ft__cuda_leave();
    ft__sys.munmap(s->host, s->host_bytes); /* no fault test: void cleanup of our own mapping */
    s->host = NULL;
}

/* MemAvailable of /proc/meminfo in bytes (0 where it cannot be read). */
static uint64_t available_memory(void)
{
    char text[4096];
    int fd = ft__sys.open("/proc/meminfo", O_RDONLY | O_CLOEXEC, 0);
    ssize_t n = fd >= 0 ? ft__sys.pread(fd, text, sizeof text - 1, 0) : -1;
    if (fd >= 0)
        ft__sys.close(fd);
    if (n <= 0)
        return 0;
    text[n] = '\0';
    const char *at = strstr(text, "MemAvailable:");
    unsigned long long kib = 0;
    if (!at || sscanf(at, "MemAvailable: %llu kB", &kib) != 1)
        return 0;
    return (uint64_t)kib << 10;
}

int ft_store_create(ft_ctx *ctx, ft_store **out, const ft_store_opts *opts)
{
    if (!ctx || !out)
        return ft__err(-EINVAL, "ft_store_create: context or output is NULL");
    ft_store_opts o = opts ? *opts : (ft_store_opts){0};
    if ((unsigned)o.engine >= FT_ENGINE_COUNT)
        return ft__err(-EINVAL, "spill store: unknown engine %d", (int)o.engine);
    bool host_auto = o.host_cache_bytes == FT_STORE_HOST_AUTO;
    if ((!host_auto && o.host_cache_bytes > MAX_HOST) || o.staging_bytes > MAX_HOST)
        return ft__err(-EINVAL, "spill store: host_cache_bytes %llu or staging_bytes %llu is "
                                "beyond any machine's memory",
                       (unsigned long long)o.host_cache_bytes,
                       (unsigned long long)o.staging_bytes);
    if (!o.staging_bytes)
        o.staging_bytes = DEFAULT_STAGING;
    o.staging_bytes = ft__store_round_block(o.staging_bytes);
    if (host_auto)
        o.host_cache_bytes = available_memory() / 4;
    o.host_cache_bytes = ft__store_round_block(o.host_cache_bytes);
    o.capacity = o.capacity / FT__DIRECT_ALIGN * FT__DIRECT_ALIGN;
    if (opts && opts->capacity && !o.capacity)
        return ft__err(-EINVAL, "spill store: capacity %llu is below one block (%u bytes)",
                       (unsigned long long)opts->capacity, FT__DIRECT_ALIGN);
    ft_store *s = calloc(1, sizeof *s);
    if (!s)
        return ft__err(-ENOMEM, "spill store");
    s->ctx = ctx;
    s->opts = o;
    s->st.host_budget = o.host_cache_bytes;
    s->opts.dir = NULL; /* not kept: the caller's string; our copy is s->dir */
    snprintf(s->dir, sizeof s->dir, "%s", spill_dir(&o));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    char label[4400];
    int rc = 0, fd = open_spill(s->dir, label, sizeof label);
    if (fd < 0)
        rc = fd;
    else
        rc = ft__file_adopt(ctx, &s->file, fd, label, FT_OPEN_READ | FT_OPEN_WRITE, O_RDWR);
    if (rc == 0)
        rc = ft__extents_init(&s->space, o.capacity);
    if (rc == 0 && o.capacity && (rc = file_extend(s, 0, o.capacity)) == 0)
        s->file_size = o.capacity;
    if (rc == 0 && o.engine == FT_ENGINE_AUTO) { /* see the header */
        s->cache_limit = o.page_cache_bytes ? o.page_cache_bytes : available_memory() / 8;
        s->cache = ft__auto_spill_goal(s->file, s->file_size, s->cache_limit);
    }
    if (rc == 0)
        rc = ft__extents_init(&s->ring, o.staging_bytes + o.host_cache_bytes);
    if (rc == 0)
        rc = host_reserve(s, o.staging_bytes + o.host_cache_bytes);
    if (rc < 0) {
        FT__KEEPING_DETAIL(ft_store_destroy(s));
        return rc;
    }
    *out = s;
    return 0;
}

static void free_entry(ft_store *s, ft__entry *e)
{
    if (e->file_off >= 0)
        ft__extents_free(&s->space, (uint64_t)e->file_off, e->slot);
    if (e->host_off >= 0) {
        ft__extents_free(&s->ring, (uint64_t)e->host_off, e->slot);
        s->st.host_used -= e->slot;
        if (e->dirty)
            s->st.host_resident -= e->slot;
    }
    if (e->copied)
        ft__cu.EventDestroy(e->copied);
    if (e->got)
        ft__cu.EventDestroy(e->got);
    free(e->detail);
    free(e);
}

void ft_store_destroy(ft_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    while (s->tasks)
        pthread_cond_wait(&s->changed, &s->lock);
    for (uint32_t i = 0; i < s->table_len; i++) {
        ft__entry *e = s->table[i];
        if (!e)
            continue;
        if (e->got_pending)
            ft__cu.EventSynchronize(e->got);
        free_entry(s, e);
    }
    pthread_mutex_unlock(&s->lock);
    for (int d = 0; d < FT__STORE_MAX_DEVICES; d++) {
        if ((s->out[d] || s->in[d]) && ft__cuda_enter(d) == 0) {
            if (s->out[d])
                ft__cu.StreamDestroy(s->out[d]);
            if (s->in[d])
                ft__cu.StreamDestroy(s->in[d]);
            ft__cuda_leave();
        }
    }
    host_release(s);
    free(s->chunks);
    ft__extents_fini(&s->ring);
    ft__extents_fini(&s->space);
    ft_file_close(s->file); /* the spill file had no name: closing it frees its blocks */
    free(s->table);
    free(s->free_idx);
    free(s->flush_detail);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

ft__entry *ft__store_lookup(ft_store *s, uint64_t key)
{
    uint32_t i = (uint32_t)key;
    ft__entry *e = i < s->table_len ? s->table[i] : NULL;
    if (!e || e->key != key || e->dropped) {
        ft__err(-ENOENT, "spill store: no entry with key %llu", (unsigned long long)key);
        return NULL;
    }
    return e;
}

/* Give @p e a key and a table place. @return 0 or -ENOMEM. */
int ft__store_insert(ft_store *s, ft__entry *e)
{
    uint32_t i;
    if (s->nfree) {
        i = s->free_idx[--s->nfree];
    } else {
        if (s->table_len == s->table_cap) {
            uint32_t cap = s->table_cap ? s->table_cap * 2 : 256;
            ft__entry **t = realloc(s->table, cap * sizeof *t);
            uint32_t *f = t ? realloc(s->free_idx, cap * sizeof *f) : NULL;
            if (t)
                s->table = t;
            if (!f)
                return ft__err(-ENOMEM, "spill store: entry table");
            s->free_idx = f;
            s->table_cap = cap;
        }
        i = s->table_len++;
    }
    e->key = (uint64_t)++s->generation << 32 | i;
    s->table[i] = e;
    s->st.entries++;
    return 0;
}

void ft__store_mark_dropped(ft_store *s, ft__entry *e)
{
    if (!e->dropped)
        s->st.entries--;
    e->dropped = true;
}

void ft__store_maybe_free(ft_store *s, ft__entry *e)
{
    if (!e->dropped || e->tasks || e->got_pending)
        return;
    uint32_t i = (uint32_t)e->key;
    if (i < s->table_len && s->table[i] == e) {
        s->table[i] = NULL;
        s->free_idx[s->nfree++] = i;
    }
    free_entry(s, e);
}

int64_t ft__store_file_reserve(ft_store *s, uint64_t len)
{
    int64_t off = ft__extents_alloc(&s->space, len);
    if (off == -ENOSPC && !s->opts.capacity) { /* unbounded: grow the file, then retry */
        uint64_t need = ft__extents_grow_need(&s->space, len);
        uint64_t want = (need + GROW_STEP - 1) / GROW_STEP * GROW_STEP;
        int rc = file_extend(s, s->file_size, want);
        if (rc < 0)
            return ft__err(rc, "spill store: cannot grow the spill file in %s to %llu bytes "
                               "(%llu held by entries)", s->dir,
                           (unsigned long long)want, (unsigned long long)s->space.used);
        if ((rc = ft__extents_grow(&s->space, want)) < 0)
            return ft__err(rc, "spill store: slot table");
        s->file_size = want;
        if (s->opts.engine == FT_ENGINE_AUTO && s->cache == FT_CACHE_KEEP)
            s->cache = ft__auto_spill_goal(s->file, want, s->cache_limit); /* one way */
        off = ft__extents_alloc(&s->space, len);
    }
    if (off == -ENOSPC)
        return ft__err(-ENOSPC, "spill store full: %llu of %llu bytes used, %llu more needed",
                       (unsigned long long)s->space.used, (unsigned long long)s->opts.capacity,
                       (unsigned long long)len);
    if (off < 0)
        return ft__err((int)off, "spill store: slot table");
    return off;
}

void ft__store_host_unref(ft_store *s, ft__entry *e)
{
    if (--e->host_refs || e->host_off < 0)
        return;
    ft__extents_free(&s->ring, (uint64_t)e->host_off, e->slot);
    s->st.host_used -= e->slot;
    e->host_off = -1;
    e->cached = false;
    pthread_cond_broadcast(&s->changed);
}

unsigned ft__store_reap(ft_store *s)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < s->table_len; i++) {
        ft__entry *e = s->table[i];
        if (!e || !e->got_pending || ft__cu.EventQuery(e->got) != 0)
            continue;
        e->got_pending = false;
        ft__store_inflight(s, -(int64_t)e->len);
        ft__store_host_unref(s, e);
        ft__store_maybe_free(s, e);
        n++;
    }
    return n;
}

/* Free the least recently used copy that only the cache holds, of an entry put before
 * @p before. @return whether one was. */
static bool evict_one(ft_store *s, uint64_t before)
{
    ft__entry *victim = NULL;
    for (uint32_t i = 0; i < s->table_len; i++) {
        ft__entry *e = s->table[i];
        if (e && e->cached && !e->dirty && e->host_refs == 1 && !e->prefetching &&
            !e->demoting &&
            e->order < before && (!victim || e->lru < victim->lru))
            victim = e;
    }
    if (!victim)
        return false;
    victim->cached = false;
    ft__store_host_unref(s, victim);
    return true;
}

int64_t ft__store_copy_io(ft_store *s, const ft__entry *e, bool write)
{
    ft_io_opts o = {.engine = e->engine, .cache = e->cache};
    ft_buf b = ft_host_buf(s->host + e->host_off, e->slot);
    return ft__transfer(s->file, &b, (uint64_t)e->file_off, &o, write);
}

/* Pool task bookkeeping: the store waits for its tasks at destroy. */
int ft__store_post(ft_store *s, ft__entry *e, void (*fn)(void *))
{
    ft__store_task *t = malloc(sizeof *t);
    if (!t)
        return ft__err(-ENOMEM, "spill store: task");
    *t = (ft__store_task){s, e};
    e->tasks++;
    s->tasks++;
    int rc = ft__pool_post(s->ctx->pool, fn, t);
    if (rc < 0) {
        e->tasks--;
        s->tasks--;
        free(t);
        return ft__err(rc, "spill store: cannot queue a transfer");
    }
    return 0;
}

/* End of a task (lock held). */
void ft__store_task_done(ft_store *s, ft__entry *e)
{
    e->tasks--;
    s->tasks--;
    pthread_cond_broadcast(&s->changed);
    ft__store_maybe_free(s, e);
}

/* Write a tier entry's copy to its file slot (the tier was full): from then on the copy is
 * a cached one, evictable. A failed write puts it back in the tier: nothing is lost. */
static void demote_task(void *arg)
{
    ft__store_task *t = arg;
    ft_store *s = t->s;
    ft__entry *e = t->e;
    free(t);
    int64_t r = ft__store_copy_io(s, e, true);
    pthread_mutex_lock(&s->lock);
    e->demoting = false;
    s->demotions--;
    if (r == (int64_t)e->slot) {
        e->on_disk = true;
        s->st.bytes_written += e->len;
        s->st.bytes_demoted += e->len;
    } else if (e->cached && !e->dropped) {
        e->dirty = e->unwritable = true; /* not tried again */
        s->st.host_resident += e->slot;
        if (!s->flush_err) { /* the next flush says why the tier is over its budget */
            s->flush_err = r < 0 ? (int)r : -EIO;
            if (r >= 0)
                ft__err(-EIO, "spill store: wrote %lld of %llu bytes", (long long)r,
                        (unsigned long long)e->slot);
            char msg[FT__DETAIL_MAX];
            ft__detail_save(msg);
            free(s->flush_detail);
            s->flush_detail = strdup(msg);
        }
    }
    ft__store_host_unref(s, e); /* the task's hold */
    ft__store_task_done(s, e);
    pthread_mutex_unlock(&s->lock);
}

bool ft__store_demote(ft_store *s, uint64_t before)
{
    ft__entry *v = NULL;
    for (uint32_t i = 0; i < s->table_len; i++) {
        ft__entry *e = s->table[i];
        if (e && e->dirty && !e->dropped && !e->unwritable && e->order < before &&
            (!v || e->order < v->order))
            v = e;
    }
    if (!v)
        return false;
    v->dirty = false;
    v->demoting = true;
    v->host_refs++;
    s->st.host_resident -= v->slot;
    if (ft__store_post(s, v, demote_task) == 0) {
        s->demotions++;
        return true;
    }
    v->demoting = false; /* no task: it stays in the tier */
    v->host_refs--;
    v->dirty = true;
    s->st.host_resident += v->slot;
    return false;
}

static bool got_pending(const ft_store *s)
{
    for (uint32_t i = 0; i < s->table_len; i++)
        if (s->table[i] && s->table[i]->got_pending)
            return true;
    return false;
}

int64_t ft__store_ring_take(ft_store *s, uint64_t len, uint64_t evict_before, bool wait)
{
    uint64_t t0 = 0;
    for (;;) {
        int64_t off = ft__extents_alloc(&s->ring, len);
        if (off >= 0 || off == -ENOMEM) {
            if (t0)
                s->st.stall_ns += ft__store_now() - t0;
            if (off >= 0) {
                s->st.host_used += len;
                ft__store_host_commit(s, (uint64_t)off, len);
            }
            return off;
        }
        if (evict_one(s, evict_before) || ft__store_reap(s))
            continue;
        if (!wait)
            return -EAGAIN;
        /* Full of the tier's entries: the oldest go to the file, their copies then evictable. */
        if (!s->demotions && !ft__store_demote(s, evict_before) && !s->tasks &&
            !got_pending(s))
            return ft__err(-ENOMEM, "spill store: the host memory (%llu bytes) is held by "
                                    "entries that cannot be written; %llu more needed",
                           (unsigned long long)s->host_bytes, (unsigned long long)len);
        if (!t0)
            t0 = ft__store_now();
        /* Space comes back when a put's write finishes (a broadcast) or a device copy of a
         * get completes (no callback: look again soon). */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->changed, &s->lock, &until);
    }
}

void ft__store_inflight(ft_store *s, int64_t delta)
{
    s->st.inflight_bytes += (uint64_t)delta;
    if (s->st.inflight_bytes > s->st.peak_inflight_bytes)
        s->st.peak_inflight_bytes = s->st.inflight_bytes;
}

void ft__store_keep_detail(ft__entry *e)
{
    char msg[FT__DETAIL_MAX];
    ft__detail_save(msg);
    free(e->detail);
    e->detail = strdup(msg);
}

int ft__store_stream(ft_store *s, int device, bool in, CUstream *out)
{
    if (device < 0 || device >= FT__STORE_MAX_DEVICES)
        return ft__err(-ENODEV, "spill store: CUDA device %d is out of range", device);
    CUstream *slot = in ? &s->in[device] : &s->out[device];
    if (!*slot) {
        CUresult r = ft__cu.StreamCreate(slot, FT_CU_STREAM_NON_BLOCKING);
        if (r != 0)
            return ft__cuda_err(r, "spill store: stream");
    }
    *out = *slot;
    return 0;
}

int ft_store_get_stats(ft_store *s, ft_store_stats *out)
{
    if (!s || !out)
        return ft__err(-EINVAL, "ft_store_get_stats: store or output is NULL");
    pthread_mutex_lock(&s->lock);
    if (ft__cuda_in_use())
        ft__store_reap(s);
    *out = s->st;
    out->file_used = s->space.used;
    out->file_size = s->file_size;
    out->engine = s->opts.engine;
    out->cache = s->cache; /* the current one: AUTO may have moved on to O_DIRECT */
    pthread_mutex_unlock(&s->lock);
    return 0;
}
