/*
 * Spill store puts, and the transfer helpers gets share. A put copies its source into the
 * pinned ring (device memory: on the store's stream after the producer's queued work, so the
 * caller never waits for it) and a pool task writes the ring copy to the entry's file slot,
 * then frees the ring space.
 */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* *device = -1 for host memory, else the CUDA device holding the buffer. */
int ft__store_buf_device(const ft_buf *b, int *device)
{
    if (b->kind != FT_MEM_HOST && b->kind != FT_MEM_CUDA)
        return ft__err(-EINVAL, "spill store: memory kind %d is not supported", (int)b->kind);
    if (!b->ptr && b->len)
        return ft__err(-EFAULT, "spill store: buffer pointer is NULL");
    const char *why;
    if (b->kind == FT_MEM_CUDA && !ft_cuda_available(&why))
        return ft__err(-ENODEV, "spill store: device memory, but CUDA is not available: %s",
                       why);
    return ft__buf_device(b, device);
}

/* Queue, on the store's stream, a wait for the work now queued on the producer's stream and
 * the device-to-host copy into the ring (when the entry has a ring copy). Lock held. */
static int queue_device_copy(ft_store *s, ft__entry *e, void *stream)
{
    int rc = ft__cuda_enter(e->src_device);
    if (rc < 0)
        return rc;
    CUstream out;
    CUevent ready = NULL;
    CUresult r = 0;
    if ((rc = ft__store_stream(s, e->src_device, false, &out)) == 0) {
        r = ft__cu.EventCreate(&ready, FT_CU_EVENT_DISABLE_TIMING);
        if (r == 0 && (r = ft__cu.EventRecord(ready, (CUstream)stream)) == 0)
            r = ft__cu.StreamWaitEvent(out, ready, 0);
        if (ready)
            ft__cu.EventDestroy(ready); /* released once the stream has passed it */
        if (r == 0 && e->host_off >= 0) {
            r = ft__cu.EventCreate(&e->copied, FT_CU_EVENT_DISABLE_TIMING);
            if (r == 0)
                r = ft__store_ring_copy(s, (uint64_t)e->host_off,
                                        (CUdeviceptr)(uintptr_t)e->src.ptr, e->len, false, out);
            if (r == 0)
                r = ft__cu.EventRecord(e->copied, out);
        }
        if (r != 0)
            rc = ft__cuda_err(r, "spill store: queueing the device-to-host copy");
    }
    ft__cuda_leave();
    return rc;
}

static int sync_event(int device, CUevent ev, const char *what)
{
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUresult r = ft__cu.EventSynchronize(ev);
    ft__cuda_leave();
    return r ? ft__cuda_err(r, what) : 0;
}

/*
 * Move an entry's whole slot between the file and caller memory @p mem (host or device) of
 * e->len bytes, with O_DIRECT-sized requests only: the block-aligned body directly, the last
 * partial block through a small aligned buffer (zero-padded on writes). The store never
 * issues a buffered read of its file, whose readahead could cache a neighbouring slot's old
 * contents while an O_DIRECT write lands there.
 */
int64_t ft__store_slot_transfer(ft_store *s, const ft__entry *e, const ft_buf *mem,
                                int device, CUstream stream, bool write)
{
    ft_io_opts o = {.engine = e->engine, .stream = stream, .cache = e->cache};
    uint64_t body = e->len / FT__DIRECT_ALIGN * FT__DIRECT_ALIGN, tail = e->len - body;
    ft_buf part = *mem;
    part.len = body;
    int64_t r = body ? ft__transfer(s->file, &part, (uint64_t)e->file_off, &o, write) : 0;
    if (r < 0 || tail == 0)
        return r;
    if ((uint64_t)r != body)
        return ft__err(-EIO, "spill store: %s %lld of %llu bytes", write ? "wrote" : "read",
                       (long long)r, (unsigned long long)body);
    uint8_t *block = NULL, *at = (uint8_t *)mem->ptr + body;
    if (posix_memalign((void **)&block, FT__DIRECT_ALIGN, FT__DIRECT_ALIGN) != 0)
        return ft__err(-ENOMEM, "spill store: tail buffer");
    ft_buf tb = ft_host_buf(block, FT__DIRECT_ALIGN);
    o.stream = NULL;
    int64_t rc = 0;
    CUresult cr = 0;
    if (write) {
        memset(block + tail, 0, FT__DIRECT_ALIGN - tail);
        if (device < 0) {
            memcpy(block, at, tail);
        } else if ((rc = ft__cuda_enter(device)) == 0) { /* after the producer, as the body */
            cr = ft__cu.MemcpyDtoHAsync(block, (CUdeviceptr)(uintptr_t)at, tail, stream);
            if (cr == 0)
                cr = ft__cu.StreamSynchronize(stream);
            ft__cuda_leave();
        }
        if (rc == 0 && cr == 0)
            rc = ft__transfer(s->file, &tb, (uint64_t)e->file_off + body, &o, true);
    } else {
        rc = ft__transfer(s->file, &tb, (uint64_t)e->file_off + body, &o, false);
        if (rc >= 0 && (uint64_t)rc < tail)
            rc = ft__err(-EIO, "spill store: short read of the last block");
        if (rc >= 0 && device < 0) {
            memcpy(at, block, tail);
        } else if (rc >= 0 && (rc = ft__cuda_enter(device)) == 0) {
            cr = ft__cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)at, block, tail, stream);
            if (cr == 0)
                cr = ft__cu.StreamSynchronize(stream);
            ft__cuda_leave();
        }
    }
    free(block);
    if (cr != 0)
        return ft__cuda_err(cr, "spill store: last block copy");
    return rc < 0 ? rc : (int64_t)e->len;
}

/* Keep the entry in the host tier instead of writing it. When the tier is full, the entries
 * put before it go to the file, oldest first (a backward pass wants the newest back first),
 * until it fits; when they cannot make room, the entry itself is written. */
static bool admit_to_tier(ft_store *s, ft__entry *e)
{
    if (e->slot > s->opts.host_cache_bytes)
        return false;
    while (s->st.host_resident + e->slot > s->opts.host_cache_bytes &&
           ft__store_demote(s, e->order))
        ;
    if (s->st.host_resident + e->slot > s->opts.host_cache_bytes)
        return false;
    e->cached = e->dirty = true;
    e->host_refs++;
    s->st.host_resident += e->slot;
    return true;
}

static void put_task(void *arg)
{
    ft__store_task *t = arg;
    ft_store *s = t->s;
    ft__entry *e = t->e;
    free(t);
    ft_io_opts o = {.engine = e->engine, .cache = e->cache};
    int64_t r = 0;
    bool write = true, ring = e->host_off >= 0; /* fixed while the put holds it */
    if (ring) {
        uint8_t *copy = s->host + e->host_off;
        if (e->src_device >= 0)
            r = sync_event(e->src_device, e->copied, "spill store: device-to-host copy");
        else
            memcpy(copy, e->src.ptr, e->len);
        pthread_mutex_lock(&s->lock);
        e->copy_pending = false; /* the source is free: the ring holds the data */
        /* An entry dropped before its write starts (used from the ring and let go of, as
         * the last activations of a forward pass are) is never written. */
        write = r == 0 && !e->dropped && !admit_to_tier(s, e);
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        if (write) {
            ft_buf b = ft_host_buf(copy, e->slot);
            r = ft__transfer(s->file, &b, (uint64_t)e->file_off, &o, true);
        }
    } else { /* larger than the ring: straight from the source */
        r = ft__store_slot_transfer(s, e, &e->src, e->src_device,
                          e->src_device >= 0 ? s->out[e->src_device] : NULL, true);
    }
    pthread_mutex_lock(&s->lock);
    e->copy_pending = false;
    s->puts_landing--;
    if (r < 0) {
        e->err = (int)r;
        ft__store_keep_detail(e);
        if (!s->flush_err) {
            s->flush_err = (int)r;
            free(s->flush_detail);
            s->flush_detail = e->detail ? strdup(e->detail) : NULL;
        }
    } else if (write) {
        e->on_disk = true;
        s->st.bytes_written += e->len;
    } else if (!e->dirty) {
        s->st.writes_skipped++;
    }
    /* The written ring copy stays as a cached one, evictable, until the ring needs the space
     * (or a prefetch asked for it): the entries put last are often wanted back first. */
    if (ring && r >= 0 && !e->cached && !e->dropped && write) {
        e->cached = true; /* the put's ring reference becomes the cache's */
    } else if (ring) {
        ft__store_host_unref(s, e);
    }
    e->landed = true;
    ft__store_inflight(s, -(int64_t)e->len);
    ft__store_task_done(s, e);
    pthread_mutex_unlock(&s->lock);
}

/* Take back a put that could not be started (under s->lock, which this releases): wait for
 * its device copy if one was queued, then drop the entry. */
static void undo_put(ft_store *s, ft__entry *e, int dev)
{
    if (e->copied)
        sync_event(dev, e->copied, "spill store: device-to-host copy");
    e->copy_pending = false;
    e->landed = true;
    ft__store_mark_dropped(s, e);
    ft__store_inflight(s, -(int64_t)e->len);
    if (e->host_off >= 0)
        ft__store_host_unref(s, e);
    ft__store_maybe_free(s, e);
    pthread_mutex_unlock(&s->lock);
}

int ft_store_put(ft_store *s, const ft_buf *src, void *stream, uint64_t *key)
{
    if (!s || !src || !key)
        return ft__err(-EINVAL, "ft_store_put: store, source or key is NULL");
    int dev, rc = ft__store_buf_device(src, &dev);
    if (rc < 0)
        return rc;
    ft__entry *e = calloc(1, sizeof *e);
    if (!e)
        return ft__err(-ENOMEM, "spill store: entry");
    *e = (ft__entry){.len = src->len, .slot = ft__store_round_block(src->len), .file_off = -1,
                     .host_off = -1, .src = *src, .src_device = dev, .dst_device = -1,
                     .copy_pending = src->len > 0, .landed = src->len == 0};
    pthread_mutex_lock(&s->lock);
    int64_t off = 0;
    if (e->len) {
        off = ft__store_file_reserve(s, e->slot);
        if (off >= 0)
            e->file_off = off;
        e->engine = s->opts.engine;
        e->cache = s->cache; /* after the reserve, which may have switched it */
        if (off >= 0 && e->slot <= ft_store_ring_limit(s) &&
            (off = ft__store_ring_take(s, e->slot, UINT64_MAX, true)) >= 0) {
            e->host_off = off;
            e->host_refs = 1; /* the put's, until its write is done */
        }
    }
    if (off < 0 || (rc = ft__store_insert(s, e)) < 0) {
        if (e->file_off >= 0)
            ft__extents_free(&s->space, (uint64_t)e->file_off, e->slot);
        if (e->host_off >= 0)
            ft__store_host_unref(s, e);
        pthread_mutex_unlock(&s->lock);
        free(e);
        return off < 0 ? (int)off : rc;
    }
    e->order = e->lru = ++s->tick;
    s->st.puts++;
    s->st.bytes_put += e->len;
    if (e->len) {
        ft__store_inflight(s, (int64_t)e->len);
        rc = dev >= 0 ? queue_device_copy(s, e, stream) : 0;
        if (rc == 0)
            rc = ft__store_post(s, e, put_task);
        if (rc == 0)
            s->puts_landing++;
        if (rc < 0) { /* undo: nothing was started but maybe the device copy */
            FT__KEEPING_DETAIL(undo_put(s, e, dev));
            return rc;
        }
    }
    *key = e->key;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int ft_store_stream(ft_store *s, int device, void **stream)
{
    if (!s || !stream)
        return ft__err(-EINVAL, "ft_store_stream: store or output is NULL");
    const char *why;
    if (!ft_cuda_available(&why))
        return ft__err(-ENODEV, "spill store: CUDA is not available: %s", why);
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUstream out = NULL;
    pthread_mutex_lock(&s->lock);
    rc = ft__store_stream(s, device, false, &out);
    pthread_mutex_unlock(&s->lock);
    ft__cuda_leave();
    *stream = out;
    return rc;
}

uint64_t ft_store_ring_limit(const ft_store *s)
{
    return s ? s->opts.staging_bytes + s->opts.host_cache_bytes : 0;
}

int ft_store_released(ft_store *s, uint64_t key)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_released: store is NULL");
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    int r = !e ? -ENOENT : e->copy_pending ? 0 : 1;
    if (e && r == 1 && e->err && !e->on_disk && e->host_off < 0) {
        r = e->err;
        ft__detail_restore(e->detail ? e->detail : "");
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

int ft_store_flush(ft_store *s)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_flush: store is NULL");
    pthread_mutex_lock(&s->lock);
    /* Demotions too: their space in the ring, and their errors, belong to this flush. */
    uint64_t t0 = s->puts_landing || s->demotions ? ft__store_now() : 0;
    while (s->puts_landing || s->demotions)
        pthread_cond_wait(&s->changed, &s->lock);
    if (t0)
        s->st.stall_ns += ft__store_now() - t0;
    int r = s->flush_err;
    if (r)
        ft__detail_restore(s->flush_detail ? s->flush_detail : "");
    s->flush_err = 0;
    free(s->flush_detail);
    s->flush_detail = NULL;
    pthread_mutex_unlock(&s->lock);
    return r;
}

