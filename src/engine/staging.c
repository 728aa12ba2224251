/*
 * Device memory through the host engines: a pipelined pinned staging path. The transfer is
 * cut into segments run in parallel; each segment's worker has its own stream and two
 * pinned buffers, so the disk I/O of chunk i+1 overlaps the host<->device copy of chunk i.
 * Pinned buffers (4096-aligned, so O_DIRECT works in place) are allocated once per context
 * and device, and reused; each is a bounce buffer's size (4 MiB): pinning is what a fresh
 * process's first load pays for them (H100 machine: 150 ms for 16 buffers of 16 MiB, the
 * first 256 MiB of a 4 GiB load), and 16 MiB ones copied no faster. A cached 4 GiB checkpoint
 * into a fresh process's GPU: 29.8 GB/s median with 4 MiB buffers, 14.0 with 16 MiB ones (3
 * rounds, same run). A lane's two buffers are one piece of our memory in 2 MiB pages, touched
 * by the lane's own thread and registered (cuMemHostRegister), cuMemHostAlloc's where the
 * driver refuses: 64 MiB took 11-17 ms so against 24-36 ms from cuMemHostAlloc, 33-37 ms of
 * a fresh process's first 39-44 ms 256 MiB call, and copy at the same 53 GB/s (H100 machine,
 * docs/benchmarks/peers-h100-warm-pinning.json). The same pool keeps bare lanes (a stream and
 * its events, no buffers) for engines that copy from memory of their own (cachedma.c).
 */
#include "engine.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdlib.h>

#define MAX_SLOTS 8

typedef ft__lane stage_slot;

/* Two kinds of lanes, each up to MAX_SLOTS: with pinned buffers ([1]) and bare ([0]). */
struct ft__stage {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    stage_slot *free[2];
    unsigned made[2];
    size_t chunk;
    ft__bufpool *mem; /* the lanes' buffers: 2 chunks each, in 2 MiB pages, not kept */
};

int ft__stage_create(ft__stage **out, size_t chunk)
{
    ft__stage *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    int rc = ft__bufpool_create(&s->mem, 2 * chunk, 0);
    if (rc < 0) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->freed, NULL);
    s->chunk = chunk;
    *out = s;
    return 0;
}

/* Lane @p sl's two buffers (its device's context current). */
static CUresult slot_buffers(ft__stage *s, stage_slot *sl)
{
    uint8_t *m = ft__bufpool_get(s->mem);
    if (m) {
        for (size_t at = 0; at < 2 * s->chunk; at += 4096) /* in this thread, beside the
                                                              other lanes' */
            ((volatile uint8_t *)m)[at] = 0;
        if (ft__cu.MemHostRegister(m, 2 * s->chunk, FT_CU_MEMHOSTREGISTER_PORTABLE) == 0) {
            sl->buf[0] = m;
            sl->buf[1] = m + s->chunk;
            sl->registered = true;
            return 0;
        }
        ft__bufpool_put(s->mem, m);
    }
    CUresult r = 0;
    for (int i = 0; i < 2 && r == 0; i++)
        r = ft__cu.MemHostAlloc((void **)&sl->buf[i], s->chunk, FT_CU_MEMHOSTALLOC_PORTABLE);
    return r;
}

static void slot_free(ft__stage *s, stage_slot *sl)
{
    if (ft__cuda_enter(sl->device) == 0) {
        if (sl->registered) {
            ft__cu.MemHostUnregister(sl->buf[0]);
            ft__bufpool_put(s->mem, sl->buf[0]);
            sl->buf[0] = sl->buf[1] = NULL;
        }
        for (int i = 0; i < 2; i++) {
            if (sl->buf[i])
                ft__cu.MemFreeHost(sl->buf[i]);
            if (sl->done[i])
                ft__cu.EventDestroy(sl->done[i]);
        }
        if (sl->stream)
            ft__cu.StreamDestroy(sl->stream);
        ft__cuda_leave();
    }
    free(sl);
}

void ft__stage_destroy(ft__stage *s)
{
    if (!s)
        return;
    for (int kind = 0; kind < 2; kind++)
        while (s->free[kind]) {
            stage_slot *sl = s->free[kind];
            s->free[kind] = sl->next;
            slot_free(s, sl);
        }
    pthread_cond_destroy(&s->freed);
    pthread_mutex_destroy(&s->lock);
    ft__bufpool_destroy(s->mem);
    free(s);
}

int ft__lane_get(ft__stage *s, int device, bool buffers, ft__lane **out)
{
    const int kind = buffers;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        stage_slot **pp = &s->free[kind];
        while (*pp && (*pp)->device != device)
            pp = &(*pp)->next;
        if (*pp) {
            *out = *pp;
            *pp = (*pp)->next;
            pthread_mutex_unlock(&s->lock);
            return 0;
        }
        if (s->made[kind] < MAX_SLOTS)
            break;
        if (s->free[kind]) { /* slots of another device are idle: retire one */
            stage_slot *old = s->free[kind];
            s->free[kind] = old->next;
            s->made[kind]--;
            pthread_mutex_unlock(&s->lock);
            slot_free(s, old); /* pushes and pops its own context: ours stays current */
            pthread_mutex_lock(&s->lock);
            continue;
        }
        pthread_cond_wait(&s->freed, &s->lock);
    }
    s->made[kind]++;
    pthread_mutex_unlock(&s->lock);
    stage_slot *sl = calloc(1, sizeof *sl);
    CUresult r = sl ? 0 : 2;
    if (sl) {
        sl->device = device;
        if (buffers)
            r = slot_buffers(s, sl);
        for (int i = 0; i < 2 && r == 0; i++)
            r = ft__cu.EventCreate(&sl->done[i], FT_CU_EVENT_DISABLE_TIMING);
        if (r == 0)
            r = ft__cu.StreamCreate(&sl->stream, FT_CU_STREAM_NON_BLOCKING);
    }
    if (r != 0) {
        if (sl)
            slot_free(s, sl);
        pthread_mutex_lock(&s->lock);
        s->made[kind]--;
        pthread_cond_broadcast(&s->freed);
        pthread_mutex_unlock(&s->lock);
        return ft__cuda_err(r, buffers ? "pinned staging buffers" : "a stream and its events");
    }
    *out = sl;
    return 0;
}

void ft__lane_put(ft__stage *s, ft__lane *sl)
{
    const int kind = sl->buf[0] != NULL;
    pthread_mutex_lock(&s->lock);
    sl->next = s->free[kind];
    s->free[kind] = sl;
    pthread_cond_broadcast(&s->freed);
    pthread_mutex_unlock(&s->lock);
}

typedef struct stage_job {
    const ft__engine_ops *ops;
    bool write;
    int device;
    CUevent caller_ready; /* recorded on the caller's stream: queued work before us */
} stage_job;

/* One segment: [off, off+len) of the file <-> device memory at ptr, chunk by chunk. */
static int64_t segment(const ft__io *io, uint8_t *dptr, uint64_t off, uint64_t len)
{
    const stage_job *j = io->aux;
    ft__stage *st = io->ctx->stage;
    int rc = ft__cuda_enter(j->device);
    if (rc < 0)
        return rc;
    stage_slot *sl = NULL;
    if ((rc = ft__lane_get(st, j->device, true, &sl)) < 0) {
        ft__cuda_leave();
        return rc;
    }
    CUresult r = j->caller_ready ? ft__cu.StreamWaitEvent(sl->stream, j->caller_ready, 0) : 0;
    uint64_t chunk = st->chunk, nchunks = (len + chunk - 1) / chunk, done = 0;
    int64_t result = 0;
    ft__io host = *io;
    host.aux = NULL;
    if (!j->write) {
        for (uint64_t k = 0; k < nchunks && r == 0 && result >= 0; k++) {
            unsigned b = (unsigned)(k & 1);
            uint64_t n = FT__MIN(chunk, len - k * chunk);
            if (k >= 2 && (r = ft__cu.EventSynchronize(sl->done[b])) != 0)
                break; /* the copy out of this buffer two chunks ago must be finished */
            host.ptr = sl->buf[b];
            host.off = off + k * chunk;
            host.len = n;
            result = j->ops->read(&host);
            if (result <= 0)
                break;
            r = ft__cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)(dptr + k * chunk), sl->buf[b],
                                      (size_t)result, sl->stream);
            if (r == 0)
                r = ft__cu.EventRecord(sl->done[b], sl->stream);
            done += (uint64_t)result;
            if ((uint64_t)result < n)
                break; /* end of file */
        }
    } else if (nchunks > 0) {
        r = r ? r : ft__cu.MemcpyDtoHAsync(sl->buf[0], (CUdeviceptr)(uintptr_t)dptr,
                                           (size_t)FT__MIN(chunk, len), sl->stream);
        if (r == 0)
            r = ft__cu.EventRecord(sl->done[0], sl->stream);
        for (uint64_t k = 0; k < nchunks && r == 0 && result >= 0; k++) {
            unsigned b = (unsigned)(k & 1);
            uint64_t n = FT__MIN(chunk, len - k * chunk);
            if (k + 1 < nchunks) { /* fetch the next chunk while this one goes to disk */
                uint64_t n2 = FT__MIN(chunk, len - (k + 1) * chunk);
                r = ft__cu.MemcpyDtoHAsync(sl->buf[b ^ 1],
                                           (CUdeviceptr)(uintptr_t)(dptr + (k + 1) * chunk),
                                           (size_t)n2, sl->stream);
                if (r == 0)
                    r = ft__cu.EventRecord(sl->done[b ^ 1], sl->stream);
            }
            if (r == 0)
                r = ft__cu.EventSynchronize(sl->done[b]);
            if (r != 0)
                break;
            host.ptr = sl->buf[b];
            host.off = off + k * chunk;
            host.len = n;
            result = j->ops->write(&host);
            done += result > 0 ? (uint64_t)result : 0;
        }
    }
    CUresult rs = ft__cu.StreamSynchronize(sl->stream);
    r = r ? r : rs;
    ft__lane_put(st, sl);
    ft__cuda_leave();
    if (result < 0)
        return result;
    if (r != 0)
        return ft__cuda_err(r, j->write ? "device-to-host copy" : "host-to-device copy");
    return (int64_t)done;
}

int64_t ft__stage_transfer(const ft__io *io, const ft__engine_ops *ops, bool write, int device,
                           void *caller_ready)
{
    ft_ctx *ctx = io->ctx;
    /* Our streams start after caller_ready: the work queued on the caller's stream when the
     * transfer was asked for, so we neither read a buffer before it is written nor
     * overwrite one still in use. */
    stage_job j = {.ops = ops, .write = write, .device = device,
                   .caller_ready = (CUevent)caller_ready};
    /* Segments: whole chunks, spread over up to MAX_SLOTS workers. Not finer: a transfer
     * of one chunk cut over all eight lanes has every lane's pinned buffers allocated on
     * first use; a loop of 16 MiB get_tensor calls into CUDA in a fresh process ran at 4.7
     * GB/s so, 7.0 without (H200 machine). */
    uint64_t chunk = ctx->stage->chunk;
    uint64_t nchunks = (io->len + chunk - 1) / chunk;
    uint64_t per = (nchunks + MAX_SLOTS - 1) / MAX_SLOTS;
    ft__io seg = *io;
    seg.aux = &j;
    return ft__io_parallel(&seg, FT__MAX(per, 1) * chunk, segment);
}
