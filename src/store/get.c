/*
 * Spill store gets, prefetches, waits and drops. A get served from a ring copy into device
 * memory is only queued on the store's stream, with the consumer stream made to wait; other
 * gets are pool tasks (from the ring, or from the file in whole O_DIRECT blocks).
 */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A get from the entry's ring copy into device memory, only queued: the store's stream waits
 * for the consumer's queued work (the buffer may still be in use) and for the put's copy into
 * the ring; the consumer's stream waits for the copy out. Lock held. */
static int get_queued(ft_store *s, ft__entry *e, const ft_buf *dst, int dev, void *stream)
{
    int rc = ft__cuda_enter(dev);
    if (rc < 0)
        return rc;
    CUstream in;
    CUevent ready = NULL;
    CUresult r = 0;
    if ((rc = ft__store_stream(s, dev, true, &in)) == 0) {
        r = ft__cu.EventCreate(&ready, FT_CU_EVENT_DISABLE_TIMING);
        if (r == 0 && (r = ft__cu.EventRecord(ready, (CUstream)stream)) == 0)
            r = ft__cu.StreamWaitEvent(in, ready, 0);
        if (ready)
            ft__cu.EventDestroy(ready);
        if (r == 0 && e->copy_pending)
            r = ft__cu.StreamWaitEvent(in, e->copied, 0);
        if (r == 0)
            r = ft__store_ring_copy(s, (uint64_t)e->host_off, (CUdeviceptr)(uintptr_t)dst->ptr,
                                    e->len, true, in);
        if (r == 0 && e->got && e->got_device != dev) {
            if (e->got_pending) /* a copy to another device: let it finish first */
                r = ft__cu.EventSynchronize(e->got);
            ft__cu.EventDestroy(e->got);
            e->got = NULL;
        }
        if (r == 0 && !e->got && (r = ft__cu.EventCreate(&e->got, FT_CU_EVENT_DISABLE_TIMING)) == 0)
            e->got_device = dev;
        if (r == 0 && (r = ft__cu.EventRecord(e->got, in)) == 0)
            r = ft__cu.StreamWaitEvent((CUstream)stream, e->got, 0);
        if (r != 0)
            rc = ft__cuda_err(r, "spill store: queueing the host-to-device copy");
    }
    ft__cuda_leave();
    if (rc == 0 && !e->got_pending) { /* the ring copy is held until the copy completes */
        e->got_pending = true;
        e->host_refs++;
        ft__store_inflight(s, (int64_t)e->len);
    }
    if (rc == 0)
        s->st.host_hits++;
    return rc;
}

static void get_task(void *arg)
{
    ft__store_task *t = arg;
    ft_store *s = t->s;
    ft__entry *e = t->e;
    free(t);
    int64_t r = 0;
    pthread_mutex_lock(&s->lock);
    while (e->copy_pending || e->prefetching)
        pthread_cond_wait(&s->changed, &s->lock);
    bool from_ring = e->host_off >= 0;
    if (from_ring)
        e->host_refs++;
    pthread_mutex_unlock(&s->lock);
    CUstream in = e->dst_device >= 0 ? s->in[e->dst_device] : NULL;
    if (from_ring && e->dst_device < 0) {
        memcpy(e->dst.ptr, s->host + e->host_off, e->len);
    } else if (from_ring) {
        if ((r = ft__cuda_enter(e->dst_device)) == 0) {
            CUresult cr = ft__store_ring_copy(s, (uint64_t)e->host_off,
                                              (CUdeviceptr)(uintptr_t)e->dst.ptr, e->len, true,
                                              in);
            if (cr == 0)
                cr = ft__cu.StreamSynchronize(in);
            ft__cuda_leave();
            if (cr != 0)
                r = ft__cuda_err(cr, "spill store: host-to-device copy");
        }
    } else if (e->on_disk) {
        r = ft__store_slot_transfer(s, e, &e->dst, e->dst_device, in, false);
        if (r >= 0 && (uint64_t)r != e->len)
            r = ft__err(-EIO, "spill store: spill file read %lld of %llu bytes", (long long)r,
                        (unsigned long long)e->len);
    } else {
        r = ft__err(e->err ? e->err : -EIO, "spill store: entry %llu holds no data (%s)",
                    (unsigned long long)e->key, e->detail ? e->detail : "put failed");
    }
    pthread_mutex_lock(&s->lock);
    if (from_ring) {
        s->st.host_hits++;
        ft__store_host_unref(s, e);
    } else if (r >= 0) {
        s->st.bytes_read += e->len;
    }
    e->get_err = r < 0 ? (int)r : 0;
    if (r < 0)
        ft__store_keep_detail(e);
    e->getting = false;
    ft__store_inflight(s, -(int64_t)e->len);
    ft__store_task_done(s, e);
    pthread_mutex_unlock(&s->lock);
}

int ft_store_get(ft_store *s, uint64_t key, const ft_buf *dst, void *stream)
{
    if (!s || !dst)
        return ft__err(-EINVAL, "ft_store_get: store or destination is NULL");
    int dev, rc = ft__store_buf_device(dst, &dev);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    if (!e)
        rc = -ENOENT;
    else if (dst->len != e->len)
        rc = ft__err(-EINVAL, "spill store: entry %llu has %llu bytes, the buffer %zu",
                     (unsigned long long)key, (unsigned long long)e->len, dst->len);
    else if (e->getting)
        rc = ft__err(-EBUSY, "spill store: entry %llu has a get in progress",
                     (unsigned long long)key);
    else if (e->landed && e->err && e->host_off < 0)
        rc = ft__err(e->err, "spill store: entry %llu was not stored: %s",
                     (unsigned long long)key, e->detail ? e->detail : "");
    if (rc < 0 || e->len == 0) {
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    e->lru = ++s->tick;
    s->st.gets++;
    s->st.bytes_got += e->len;
    e->get_err = 0;
    if (dev >= 0 && e->host_off >= 0 && !e->prefetching &&
        (!e->copy_pending || e->src_device >= 0)) {
        rc = get_queued(s, e, dst, dev, stream);
    } else {
        e->getting = true;
        e->dst = *dst;
        e->dst_device = dev;
        ft__store_inflight(s, (int64_t)e->len);
        if (dev >= 0 && (rc = ft__cuda_enter(dev)) == 0) {
            /* The buffer may still be in use by work queued on the consumer's stream: the
             * store's stream (which the task's transfer follows) waits for it. */
            CUstream in;
            CUevent ready = NULL;
            if ((rc = ft__store_stream(s, dev, true, &in)) == 0) {
                CUresult r = ft__cu.EventCreate(&ready, FT_CU_EVENT_DISABLE_TIMING);
                if (r == 0 && (r = ft__cu.EventRecord(ready, (CUstream)stream)) == 0)
                    r = ft__cu.StreamWaitEvent(in, ready, 0);
                if (ready)
                    ft__cu.EventDestroy(ready);
                if (r != 0)
                    rc = ft__cuda_err(r, "spill store: consumer stream");
            }
            ft__cuda_leave();
        }
        if (rc == 0)
            rc = ft__store_post(s, e, get_task);
        if (rc < 0) {
            e->getting = false;
            ft__store_inflight(s, -(int64_t)e->len);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void prefetch_task(void *arg)
{
    ft__store_task *t = arg;
    ft_store *s = t->s;
    ft__entry *e = t->e;
    free(t);
    int64_t r = ft__store_copy_io(s, e, false);
    pthread_mutex_lock(&s->lock);
    e->prefetching = false;
    if (r != (int64_t)e->slot) { /* keep no copy: a get reads the file and reports */
        e->cached = false;
        ft__store_host_unref(s, e);
    } else {
        s->st.bytes_prefetched += e->len;
        s->st.bytes_read += e->len;
    }
    ft__store_inflight(s, -(int64_t)e->len);
    ft__store_task_done(s, e);
    pthread_mutex_unlock(&s->lock);
}

int ft_store_prefetch(ft_store *s, uint64_t key)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_prefetch: store is NULL");
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    int rc = e ? 0 : -ENOENT;
    if (e && !e->landed && e->host_off >= 0 && !e->cached) {
        /* Still being written from the ring: that copy stays once it is on disk (as every
         * written copy does, until the ring needs room; the use makes it recent). */
        e->lru = ++s->tick;
        rc = 1;
    } else if (e && e->landed && e->on_disk && e->host_off < 0 && !e->getting &&
        e->slot <= s->opts.staging_bytes) {
        /* Room from copies put before this one only: read back in the reverse order of the
         * puts (a backward pass), later ones are wanted sooner. */
        int64_t off = ft__store_ring_take(s, e->slot, e->order, false);
        if (off == -ENOMEM)
            rc = ft__err(-ENOMEM, "spill store: ring allocator");
        else if (off < 0)
            rc = ft__err(-EBUSY, "spill store: no free ring space for %llu bytes",
                         (unsigned long long)e->slot);
        if (off >= 0) {
            e->host_off = off;
            e->host_refs = 1;
            e->cached = e->prefetching = true;
            e->lru = ++s->tick;
            ft__store_inflight(s, (int64_t)e->len);
            rc = ft__store_post(s, e, prefetch_task);
            if (rc < 0) {
                e->prefetching = e->cached = false;
                ft__store_inflight(s, -(int64_t)e->len);
                ft__store_host_unref(s, e);
            } else {
                rc = 1;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ft_store_poll(ft_store *s, uint64_t key)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_poll: store is NULL");
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    int r = !e ? -ENOENT : e->landed && !e->getting;
    pthread_mutex_unlock(&s->lock);
    return r;
}

int ft_store_wait(ft_store *s, uint64_t key)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_wait: store is NULL");
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    int r = e ? 0 : -ENOENT;
    uint64_t t0 = 0;
    while (e && (!e->landed || e->getting)) {
        if (!t0)
            t0 = ft__store_now();
        pthread_cond_wait(&s->changed, &s->lock);
    }
    if (t0)
        s->st.stall_ns += ft__store_now() - t0;
    if (e && (e->get_err || e->err)) {
        r = e->get_err ? e->get_err : e->err;
        ft__detail_restore(e->detail ? e->detail : "");
    }
    pthread_mutex_unlock(&s->lock);
    return r;
}

int ft_store_drop(ft_store *s, uint64_t key)
{
    if (!s)
        return ft__err(-EINVAL, "ft_store_drop: store is NULL");
    pthread_mutex_lock(&s->lock);
    ft__entry *e = ft__store_lookup(s, key);
    if (e) {
        ft__store_mark_dropped(s, e);
        if (e->got_pending && ft__cu.EventQuery(e->got) == 0) {
            e->got_pending = false;
            ft__store_inflight(s, -(int64_t)e->len);
            ft__store_host_unref(s, e);
        }
        if (e->dirty) {
            s->st.host_resident -= e->slot;
            e->dirty = false;
            e->cached = false;
            ft__store_host_unref(s, e);
        } else if (e->cached && !e->prefetching) {
            e->cached = false;
            ft__store_host_unref(s, e);
        }
        pthread_cond_broadcast(&s->changed);
        ft__store_maybe_free(s, e); /* else the last task or ft__store_reap frees it */
    }
    pthread_mutex_unlock(&s->lock);
    return e ? 0 : -ENOENT;
}
