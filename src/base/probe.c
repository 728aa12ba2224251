/* Cheap context probes for AUTO: page-cache residency, and the room the page cache has. */
#include "base.h"
#include "syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    return total && cached * 10 >= total * 9 ? FT__CLS_CACHED : FT__CLS_COLD;
}

/* The first number after @p key in @p text, UINT64_MAX when absent ("max" too). */
static uint64_t number_after(const char *text, const char *key)
{
    const char *p = key[0] ? strstr(text, key) : text;
    if (!p)
        return UINT64_MAX;
    p += strlen(key);
    while (*p == ' ' || *p == ':')
        p++;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    return end == p ? UINT64_MAX : (uint64_t)v;
}

/* The file's text (at most @p cap - 1 bytes, NUL-terminated), through the syscall table:
 * false when it cannot be read. */
static bool read_small(const char *path, char *text, size_t cap)
{
    int fd = ft__sys.open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return false;
    ssize_t n = ft__sys.pread(fd, text, cap - 1, 0);
    ft__sys.close(fd);
    if (n < 0)
        return false;
    text[n] = '\0';
    return true;
}

/* Room below this process's cgroup v2 memory limit (memory.max - memory.current, where the
 * page cache of files it reads is charged), UINT64_MAX when there is none. */
static uint64_t cgroup_room(void)
{
    char self[512], path[700], text[64];
    if (!read_small("/proc/self/cgroup", self, sizeof self) || strncmp(self, "0::", 3) != 0)
        return UINT64_MAX;
    self[strcspn(self, "\n")] = '\0';
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", self + 3);
    if (!read_small(path, text, sizeof text))
        return UINT64_MAX;
    uint64_t max = number_after(text, "");
    snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", self + 3);
    if (max == UINT64_MAX || !read_small(path, text, sizeof text))
        return UINT64_MAX;
    uint64_t cur = number_after(text, "");
    return cur == UINT64_MAX ? UINT64_MAX : cur < max ? max - cur : 0;
}

static _Atomic uint64_t room_ns, room_bytes;

void ft__probe_forget(void)
{
    atomic_store_explicit(&room_ns, 0, memory_order_relaxed);
}

uint64_t ft__probe_cache_room(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 1;
    uint64_t prev = atomic_load_explicit(&room_ns, memory_order_acquire);
    if (prev && now - prev < 500000000ull)
        return atomic_load_explicit(&room_bytes, memory_order_relaxed);
    char text[4096];
    uint64_t kib = read_small("/proc/meminfo", text, sizeof text)
                       ? number_after(text, "MemAvailable:")
                       : UINT64_MAX;
    uint64_t room = kib == UINT64_MAX ? 0 : kib << 10; /* unknown: no room promised */
    room = FT__MIN(room, cgroup_room());
    atomic_store_explicit(&room_bytes, room, memory_order_relaxed);
    atomic_store_explicit(&room_ns, now, memory_order_release);
    return room;
}
