/* Cheap context probes for the selector: page-cache residency and CPU load. */
#include "select.h"
#include "../core/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PROBE_PAGES 16u /* pages sampled at each of the range's start, middle and end */

static _Atomic int have_cachestat = 1;

/* Resident pages among [off, off+len) via cachestat(2) (Linux 6.5), else mincore. */
static int resident(int fd, uint64_t off, uint64_t len, uint64_t *pages)
{
    if (atomic_load_explicit(&have_cachestat, memory_order_relaxed)) {
        int rc = ft__sys.cachestat(fd, off, len, pages);
        if (rc == 0)
            return 0;
        if (errno != ENOSYS)
            return -1;
        atomic_store_explicit(&have_cachestat, 0, memory_order_relaxed);
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = off / (uint64_t)page * (uint64_t)page;
    size_t maplen = (size_t)(off + len - start);
    void *map = ft__sys.mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED)
        return -1;
    unsigned char vec[PROBE_PAGES + 2];
    size_t n = (maplen + (size_t)page - 1) / (size_t)page;
    int rc = n <= sizeof vec ? ft__sys.mincore(map, maplen, vec) : -1;
    *pages = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        *pages += vec[i] & 1;
    ft__sys.munmap(map, maplen);
    return rc;
}

unsigned ft__probe_cache(int fd, uint64_t off, uint64_t len)
{
    const uint64_t page = 4096, win = PROBE_PAGES * page;
    uint64_t at[3] = {off, off + len / 2, off + len > win ? off + len - win : off};
    unsigned windows = len <= 3 * win ? 1 : 3;
    uint64_t cached = 0, total = 0;
    for (unsigned i = 0; i < windows; i++) {
        uint64_t l = windows == 1 ? len : win;
        uint64_t start = at[i] / page * page, end = (at[i] + l + page - 1) / page * page;
        uint64_t c;
        if (resident(fd, start, end - start, &c) < 0)
            return 0; /* unknown: treat as cold */
        cached += c;
        total += (end - start) / page;
    }
    if (total == 0 || cached * 10 <= total)
        return 0;
    return cached * 10 >= total * 9 ? 2 : 1;
}

static _Atomic uint64_t last_ns;
static _Atomic unsigned last_class;

void ft__probe_cpu_forget(void)
{
    atomic_store_explicit(&last_ns, 0, memory_order_relaxed);
}

unsigned ft__probe_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t prev = atomic_load_explicit(&last_ns, memory_order_relaxed);
    if (now - prev < 500000000ull && prev)
        return atomic_load_explicit(&last_class, memory_order_relaxed);
    if (!atomic_compare_exchange_strong(&last_ns, &prev, now))
        return atomic_load_explicit(&last_class, memory_order_relaxed);
    /* Runnable tasks right now (the 4th field of /proc/loadavg, "running/total"), not the
     * load average: that one counts tasks waiting on I/O, i.e. our own transfers. */
    unsigned cls = 0;
    int fd = ft__sys.open("/proc/loadavg", O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        char text[128];
        ssize_t n = ft__sys.pread(fd, text, sizeof text - 1, 0);
        ft__sys.close(fd);
        unsigned running = 0;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (n > 0) {
            text[n] = '\0';
            float a, b, c;
            /* our own working threads are not load from others; +1: this thread */
            unsigned ours = 1u + atomic_load_explicit(&ft__threads_working, memory_order_relaxed);
            if (sscanf(text, "%f %f %f %u/", &a, &b, &c, &running) == 4)
                cls = running > ours && running - ours > (unsigned)(cpus > 0 ? cpus : 1);
        }
    }
    atomic_store_explicit(&last_class, cls, memory_order_relaxed);
    return cls;
}
