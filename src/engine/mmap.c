/*
 * mmap: map the range and copy in parallel chunks. Fast when the file is in the page cache.
 * Writes reserve the blocks first (fallocate), so a full disk is an -ENOSPC here rather than
 * a SIGBUS in the copy; where the filesystem cannot reserve, or the descriptor cannot be
 * mapped for writing, the write goes through the posix engine instead.
 */
#include "engine.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct mapping {
    uint8_t *base;     /* mmap result */
    size_t map_len;
    uint8_t *at_off;   /* base + (io->off - page-aligned offset) */
} mapping;

/* Reads of this much and more advise MADV_HUGEPAGE instead of MADV_WILLNEED (see below). */
#define HUGE_ADVICE_MIN (1u << 20)

static bool thp_usable;
static void thp_probe(void)
{
    /* "always [madvise] never": the advice does something unless THP is off (or the
     * setting cannot be read). */
    char text[128] = "";
    int fd = ft__sys.open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        int64_t n = ft__pread_full(fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = '\0';
        ft__sys.close(fd);
    }
    thp_usable = text[0] && !strstr(text, "[never]");
}

/*
 * How a read's mapping is advised. MADV_WILLNEED starts readahead over the range before the
 * copies fault it in, but that readahead fills the page cache with 4 KiB folios, and every
 * later read of those pages pays for the small folios: on the development machine, posix
 * re-reads of a file read cold by this engine ran at 16-17 GB/s (1 MiB calls), against
 * 20-24 after a cold pass by posix. With MADV_HUGEPAGE the faults read ahead in 2 MiB folios
 * instead: the re-reads ran at 23-25, and this engine itself at 2.1-2.7 GB/s cold on 1 GiB
 * calls (0.9-1.4 with WILLNEED) and 15-16 GB/s warm on 64 MiB calls (8.5-9.6). Such a fault
 * reads the whole 2 MiB-aligned block around it, so reads under 1 MiB (a 4 KiB one would
 * read 512 times its size) keep WILLNEED, as do machines with THP off, where the advice does
 * nothing.
 */
static int read_advice(uint64_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, thp_probe);
    return len >= HUGE_ADVICE_MIN && thp_usable ? MADV_HUGEPAGE : MADV_WILLNEED;
}

static int map_range(const ft__io *io, bool write, mapping *m)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = io->off / (uint64_t)page * (uint64_t)page;
    m->map_len = (size_t)(io->off + io->len - start);
    int prot = write ? PROT_READ | PROT_WRITE : PROT_READ;
    void *p = ft__sys.mmap(NULL, m->map_len, prot, MAP_SHARED, io->file->fd, (off_t)start);
    if (p == MAP_FAILED)
        return ft__err(-errno, "mmap of %zu bytes at offset %llu of %s", m->map_len,
                       (unsigned long long)start, io->file->path);
    m->base = p;
    m->at_off = m->base + (io->off - start);
    if (!write)
        (void)ft__sys.madvise(m->base, m->map_len, read_advice(io->len));
    return 0;
}

static int64_t copy_out(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    const mapping *m = io->aux;
    /* one call maps the piece's pages, not a fault per few; each thread its own piece, so
     * cold pieces are read in parallel (a failure leaves the faults to memcpy) */
    (void)ft__populate(m->at_off + (off - io->off), len);
    memcpy(ptr, m->at_off + (off - io->off), (size_t)len);
    return (int64_t)len;
}

static int64_t copy_in(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    const mapping *m = io->aux;
    memcpy(m->at_off + (off - io->off), ptr, (size_t)len);
    return (int64_t)len;
}

static int64_t mmap_transfer(const ft__io *io, bool write)
{
    mapping m;
    int rc = map_range(io, write, &m);
    if (rc < 0)
        return rc;
    ft__io job = *io;
    job.aux = &m;
    int64_t r = ft__io_parallel(&job, ft__io_piece(io), write ? copy_in : copy_out);
    if (ft__sys.munmap(m.base, m.map_len) != 0 && r >= 0)
        r = ft__err(-errno, "munmap of %s", io->file->path);
    return r;
}

static int64_t mmap_read(const ft__io *io)
{
    return mmap_transfer(io, false);
}

static int64_t mmap_write(const ft__io *io)
{
    if (!io->file->fd_readable)
        return ft__engine_posix.write(io);
    if (ft__sys.fallocate(io->file->fd, 0, (off_t)io->off, (off_t)io->len) != 0) {
        int e = errno;
        if (e == EOPNOTSUPP || e == ENOSYS)
            return ft__engine_posix.write(io);
        return ft__err(-e, "cannot reserve %llu bytes at offset %llu of %s for mmap",
                       (unsigned long long)io->len, (unsigned long long)io->off, io->file->path);
    }
    return mmap_transfer(io, true);
}

/* ---- fill: the page cache filled without a copy ---- */

/* Wait for bytes [at, end) of @p fd to be in the page cache without copying them: a
 * read-only mapping of them populated (MADV_POPULATE_READ, Linux 5.14), then unmapped.
 * @return 0 when they are cached, else 1 (no such advice, a file shorter than the range,
 * an I/O error: the piece is read through a buffer instead). */
static int populate_cached(int fd, uint64_t at, uint64_t end)
{
    uint64_t lo = at & ~(uint64_t)4095;
    void *m = ft__sys.mmap(NULL, (size_t)(end - lo), PROT_READ, MAP_SHARED, fd, (off_t)lo);
    if (m == MAP_FAILED)
        return 1;
    int r = ft__populate(m, end - lo);
    (void)ft__sys.munmap(m, (size_t)(end - lo)); /* no fault test: fails only for a bad range */
    return r == 0 ? 0 : 1;
}

/* Read [at, end) of the file through a bounce buffer: the pages land in the page cache.
 * @return 0 or -errno. */
static int64_t read_through(const ft__io *io, uint64_t at, uint64_t end)
{
    uint8_t *buf = ft__bufpool_get(io->ctx->bounce);
    if (!buf)
        return ft__err(-ENOMEM, "%s: readahead: no buffer", io->file->path);
    uint64_t step = ft__bufpool_size(io->ctx->bounce);
    int64_t r = 0;
    for (uint64_t o = at; o < end && r >= 0; o += step) {
        r = ft__pread_full(io->file->fd, buf, FT__MIN(step, end - o), o);
        if (r >= 0 && (uint64_t)r < FT__MIN(step, end - o))
            break; /* the file ended early: the copy reports it */
    }
    ft__bufpool_put(io->ctx->bounce, buf);
    return r < 0 ? ft__err((int)r, "%s: readahead: %s", io->file->path, ft_strerror((int)r)) : 0;
}

/* One piece: readahead asked for all of it at once, then waited for, so it is in the page
 * cache when this returns: through a mapping (no copy; on the development machine a cold
 * 1 GiB load ran 2x faster than when the piece was read through a bounce buffer, four
 * processes at once 2.3x), else by reading it through a bounce buffer (where the kernel
 * ignores the advice, as some sandboxes do, the reads do the work). @p map: the caller's
 * mapping of the piece, mapped in once it is cached, or NULL. */
static int64_t fill_piece(const ft__io *io, uint8_t *map, uint64_t at, uint64_t len)
{
    ft__fill_watch *w = io->watch;
    int64_t r = 0;
    if (!w || !atomic_load(&w->stop)) { /* (once stopped: told, unread) */
        int e = ft__sys.fadvise(io->file->fd, (off_t)at, (off_t)len, POSIX_FADV_WILLNEED);
        if (e)
            r = ft__err(-e, "%s: readahead: %s", io->file->path, ft_strerror(-e));
        else if (populate_cached(io->file->fd, at, at + len) != 0)
            r = read_through(io, at, at + len);
        if (r >= 0 && map) /* cached now: mapped in while the other pieces are still read */
            ft__touch_pages(map, len);
    }
    if (w)
        w->filled(w, at, len);
    return r < 0 ? r : (int64_t)len;
}

/* All pieces queued at once (ft__io_parallel): one thread's readahead keeps a few requests
 * in flight at most, and pieces near each other keep the threads' reads one sequential
 * stream to the disk. */
static int64_t mmap_fill(const ft__io *io)
{
    return ft__io_parallel(io, ft__io_piece(io), fill_piece);
}

const ft__engine_ops ft__engine_mmap = {
    .name = "mmap",
    .id = FT_ENGINE_MMAP,
    .caps = 0,
    .read = mmap_read,
    .write = mmap_write,
    .fill = mmap_fill,
};
