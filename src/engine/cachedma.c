/*
 * cachedma: reads into device memory that the GPU copies straight out of the page cache.
 *
 * The range is mapped read-only and cut, at page boundaries of the mapping, into pieces; a
 * few workers, each with a stream of its own, take a segment of pieces each: fault a piece
 * in (MADV_POPULATE_READ), register it with the driver (cuMemHostRegister with
 * CU_MEMHOSTREGISTER_READ_ONLY: page-cache pages may be pinned for the device to read),
 * queue its copy to the device, and go on to the next piece while the copy runs; a piece is
 * unregistered once its copy is done. So each worker has at most two pieces registered, and
 * the call at most WORKERS x 2 x PIECE_MAX bytes. The staging path's two copies (page cache
 * to pinned buffer, pinned buffer to device) become one, and no pinned buffer is allocated.
 * The streams start after the caller's ready event, and the call returns when every copy is
 * done, like the staging path.
 *
 * Where the driver refuses the registration, the call goes through pinned staging (posix)
 * instead and the engine stops being offered to AUTO (ready() is false); the reason stays
 * for `fastensor info`. A file that shrinks under the read is an -EIO, never a SIGBUS: the
 * CPU touches the mapping only through madvise, which fails instead of faulting.
 * Host memory is read as the mmap engine reads it; writes go as posix writes (through pinned
 * staging for device memory). AUTO offers the engine for cached reads into device memory.
 */
#include "engine.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define WORKERS 8
#define PIECE_MIN ((uint64_t)2 << 20)
#define PIECE_MAX ((uint64_t)256 << 20)

/* The driver's answer to read-only registration in this process: 0 not asked yet, 1 works,
 * 2 refused (then refusal holds the reason). */
static _Atomic int verdict;
static pthread_mutex_t refusal_lock = PTHREAD_MUTEX_INITIALIZER;
static char refusal[300];

/* Internal result of a worker whose registration the driver refused (nothing else failed). */
#define REFUSED (-ENOTSUP)

typedef struct dma_job {
    const ft__io *io;   /* the call */
    uint8_t *map;       /* the mapping, at file offset map_off */
    uint64_t map_off;
    uint64_t piece;
    _Atomic int refused; /* a worker's registration was refused */
} dma_job;

static void note_refusal(CUresult r)
{
    const char *text = NULL;
    if (ft__cu.GetErrorString)
        ft__cu.GetErrorString(r, &text);
    pthread_mutex_lock(&refusal_lock);
    if (atomic_load(&verdict) != 2) {
        snprintf(refusal, sizeof refusal,
                 "the driver refused a read-only registration of a file mapping: CUDA error "
                 "%d (%s); device reads go through pinned staging", r, text ? text : "?");
        atomic_store(&verdict, 2);
    }
    pthread_mutex_unlock(&refusal_lock);
}

/* Fault [p, p+n) of the mapping in. -EIO where the file no longer holds those pages (it
 * shrank under the read); 0 otherwise, also where the kernel lacks the advice (then the
 * registration faults the pages in itself). */
static int populate(const dma_job *j, uint8_t *p, uint64_t n)
{
#ifdef MADV_POPULATE_READ
    if (ft__sys.madvise(p, (size_t)n, MADV_POPULATE_READ) != 0 && /* no fault test: GPU */
        (errno == EFAULT || errno == EIO || errno == ENOMEM))
        return ft__err(-EIO, "%s changed under a read: %llu bytes at offset %llu are gone",
                       j->io->file->path, (unsigned long long)n,
                       (unsigned long long)(j->map_off + (uint64_t)(p - j->map)));
#else
    (void)j;
    (void)p;
    (void)n;
#endif
    return 0;
}

/* A registration failed with @p r: the file shrank (-EIO), the driver is short of memory
 * for now (-ENOMEM, no verdict), or it refuses (REFUSED, remembered). */
static int registration_failed(dma_job *j, CUresult r)
{
    const ft__io *io = j->io;
    int64_t size = ft__file_size(io->file);
    if (size >= 0 && (uint64_t)size < io->off + io->len)
        return ft__err(-EIO, "%s changed under a read: it has %lld bytes, the read needs %llu",
                       io->file->path, (long long)size,
                       (unsigned long long)(io->off + io->len));
    if (r == FT_CU_ERROR_OUT_OF_MEMORY)
        return ft__cuda_err(r, "registering a file mapping for a device read");
    note_refusal(r);
    atomic_store(&j->refused, 1);
    return REFUSED;
}

/* One worker: the pieces of [off, off+len) (page-aligned file offsets of the mapping; at is
 * their address in it), each registered, copied, unregistered. */
static int64_t segment(const ft__io *sio, uint8_t *at, uint64_t off, uint64_t len)
{
    dma_job *j = sio->aux;
    const ft__io *io = j->io;
    int rc = ft__cuda_enter(io->device);
    if (rc < 0)
        return rc;
    ft__lane *ln = NULL;
    if ((rc = ft__lane_get(io->ctx->stage, io->device, false, &ln)) < 0) {
        ft__cuda_leave();
        return rc;
    }
    CUresult r = io->ready ? ft__cu.StreamWaitEvent(ln->stream, (CUevent)io->ready, 0) : 0;
    uint8_t *reg[2] = {NULL, NULL};
    uint64_t end = off + len, want_end = io->off + io->len;
    int64_t result = 0;
    for (uint64_t k = 0, p = off; p < end && r == 0 && result == 0; k++, p += j->piece) {
        unsigned b = (unsigned)(k & 1);
        uint64_t n = FT__MIN(j->piece, end - p);
        if (reg[b]) { /* the copy out of this piece two pieces ago must be done */
            if ((r = ft__cu.EventSynchronize(ln->done[b])) != 0)
                break;
            ft__cu.MemHostUnregister(reg[b]);
            reg[b] = NULL;
        }
        uint8_t *host = at + (p - off);
        if ((result = populate(j, host, n)) < 0)
            break;
        CUresult rr = ft__cu.MemHostRegister(host, (size_t)n, FT_CU_MEMHOSTREGISTER_READ_ONLY);
        if (rr != 0) {
            result = registration_failed(j, rr);
            break;
        }
        reg[b] = host;
        uint64_t lo = FT__MAX(p, io->off), hi = FT__MIN(p + n, want_end);
        r = ft__cu.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)(io->ptr + (lo - io->off)),
                                   j->map + (lo - j->map_off), (size_t)(hi - lo), ln->stream);
        if (r == 0)
            r = ft__cu.EventRecord(ln->done[b], ln->stream);
    }
    CUresult rs = ft__cu.StreamSynchronize(ln->stream);
    r = r ? r : rs;
    for (int b = 0; b < 2; b++)
        if (reg[b])
            ft__cu.MemHostUnregister(reg[b]);
    ft__lane_put(io->ctx->stage, ln);
    ft__cuda_leave();
    if (result < 0)
        return result;
    if (r != 0)
        return ft__cuda_err(r, "host-to-device copy from the page cache");
    return (int64_t)len;
}

/* Pieces: the call spread over the workers, 2..256 MiB, whole pages. */
static uint64_t piece_size(uint64_t len, uint64_t page)
{
    uint64_t p = FT__MIN(FT__MAX(len / WORKERS, PIECE_MIN), PIECE_MAX);
    return (p + page - 1) / page * page;
}

static int64_t device_read(const ft__io *io)
{
    if (atomic_load(&verdict) == 2)
        return ft__stage_transfer(io, &ft__engine_posix, false, io->device, io->ready);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t map_off = io->off / page * page;
    uint64_t map_len = (io->off + io->len + page - 1) / page * page - map_off;
    void *m = ft__sys.mmap(NULL, (size_t)map_len, PROT_READ, MAP_SHARED, /* no fault test: GPU */
                           io->file->fd, (off_t)map_off);
    if (m == MAP_FAILED)
        return ft__err(-errno, "mmap of %llu bytes at offset %llu of %s",
                       (unsigned long long)map_len, (unsigned long long)map_off,
                       io->file->path);
    dma_job j = {.io = io, .map = m, .map_off = map_off, .piece = piece_size(map_len, page)};
    /* the workers' calls: page-aligned segments of the mapping, whole pieces each */
    ft__io whole = {.ctx = io->ctx, .file = io->file, .ptr = m, .len = map_len,
                    .off = map_off, .aux = &j, .device = io->device};
    uint64_t npieces = (map_len + j.piece - 1) / j.piece;
    uint64_t seg = (npieces + WORKERS - 1) / WORKERS * j.piece;
    int64_t r = ft__io_parallel(&whole, seg, segment);
    if (ft__sys.munmap(m, (size_t)map_len) != 0 && r >= 0) /* no fault test: GPU */
        r = ft__err(-errno, "munmap of %s", io->file->path);
    if (r >= 0) {
        int expected = 0;
        atomic_compare_exchange_strong(&verdict, &expected, 1);
        return (int64_t)io->len;
    }
    if (atomic_load(&j.refused) && r == REFUSED) /* nothing but the refusal went wrong */
        return ft__stage_transfer(io, &ft__engine_posix, false, io->device, io->ready);
    return r;
}

static int64_t cachedma_read(const ft__io *io)
{
    return io->device >= 0 ? device_read(io) : ft__engine_mmap.read(io);
}

static int64_t cachedma_write(const ft__io *io)
{
    return io->device >= 0 ? ft__stage_transfer(io, &ft__engine_posix, true, io->device,
                                                 io->ready)
                           : ft__engine_posix.write(io);
}

/* Offered while the driver has not refused; CUDA itself is there when device memory is. */
static bool cachedma_ready(ft_file *f)
{
    (void)f;
    return atomic_load(&verdict) != 2;
}

/* Ask the driver once, with one page of a file every process has (its own program), where
 * no read has asked yet. */
static void probe(void)
{
    int fd = ft__sys.open("/proc/self/exe", O_RDONLY | O_CLOEXEC, 0); /* no fault test: GPU */
    if (fd < 0)
        return;
    long page = sysconf(_SC_PAGESIZE);
    void *m = ft__sys.mmap(NULL, (size_t)page, PROT_READ, /* no fault test: GPU */
                           MAP_SHARED, fd, 0);
    ft__sys.close(fd); /* no fault test: GPU */
    if (m == MAP_FAILED)
        return;
    if (ft__cuda_enter(0) == 0) {
        CUresult r = ft__cu.MemHostRegister(m, (size_t)page, FT_CU_MEMHOSTREGISTER_READ_ONLY);
        if (r == 0) {
            ft__cu.MemHostUnregister(m);
            int expected = 0;
            atomic_compare_exchange_strong(&verdict, &expected, 1);
        } else if (r != FT_CU_ERROR_OUT_OF_MEMORY) {
            note_refusal(r);
        }
        ft__cuda_leave();
    }
    ft__sys.munmap(m, (size_t)page); /* no fault test: GPU */
}

void ft__cachedma_forget(void)
{
    atomic_store(&verdict, 0);
}

void ft__cachedma_describe(char *buf, size_t len)
{
    if (atomic_load(&verdict) == 0)
        FT__KEEPING_DETAIL(probe());
    int v = atomic_load(&verdict);
    pthread_mutex_lock(&refusal_lock);
    snprintf(buf, len, "%s", v == 2 ? refusal
                             : v == 1 ? "read-only registration of file mappings works"
                                      : "not known (the probe could not run)");
    pthread_mutex_unlock(&refusal_lock);
}

/* fastensor info, where there is a device: whether the driver takes file mappings. */
static size_t cachedma_describe(int devices, char *buf, size_t len)
{
    if (devices <= 0)
        return 0;
    char dma[400];
    ft__cachedma_describe(dma, sizeof dma);
    return FT__MIN((size_t)snprintf(buf, len, "cachedma    %s\n", dma), len);
}

const ft__engine_ops ft__engine_cachedma = {
    .name = "cachedma",
    .id = FT_ENGINE_CACHEDMA,
    .caps = FT__CAP_DEVICE_MEMORY | FT__CAP_STREAM_ORDER | FT__CAP_CACHED_READS |
            FT__CAP_SETS_UP,
    .ready = cachedma_ready,
    .read = cachedma_read,
    .write = cachedma_write,
    .describe = cachedma_describe,
};
