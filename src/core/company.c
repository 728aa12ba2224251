/*
 * AUTO's company from outside the context. Transfers of other contexts (of other processes
 * above all: two processes loading one checkpoint) share the disk and the CPUs as the
 * context's own transfers in flight do, and a sample taken beside them belongs in the busy
 * keys: in a single-process key it passed for what an arm does alone (development machine,
 * `fastensor demo`: an mmap load timed while another process read the same file ranked mmap
 * first for lone cold loads, where it then ran 0.9 s against posix's 0.5). While a context has
 * transfers in flight it holds a read lock on the first byte of its profile's ".active" file
 * (an open file description's lock, F_OFD_SETLK: the kernel drops it with its process); a
 * decision asks whether another description holds one (F_OFD_GETLK, which never reports the
 * asker's own). A context whose transfers all end writes the time (CLOCK_MONOTONIC, one clock
 * for all processes) and its token at byte 8 of the file before it drops its lock, having read
 * what another wrote there, so that a call alone at its start and its end still sees another
 * that came and went meanwhile: of two processes loading one checkpoint at once, the first to
 * start often ended last and took its sample for a lone one (development machine, `fastensor
 * demo`: 3 of 9 such pairs, 1 s loads in the key of 0.25 s ones). Without a kept profile there
 * is no such file, and company is the context's.
 */
#include "internal.h"
#include "../base/syscall.h"

#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ft__company_init(ft__company *c, uint64_t token)
{
    *c = (ft__company){.token = token | 1};
    pthread_mutex_init(&c->lock, NULL);
    atomic_init(&c->fd, -1);
    atomic_init(&c->other_ended, 0);
}

void ft__company_destroy(ft__company *c)
{
    int fd = atomic_load(&c->fd);
    if (fd >= 0)
        ft__sys.close(fd);
    pthread_mutex_destroy(&c->lock);
}

void ft__company_retry(ft__company *c)
{
    pthread_mutex_lock(&c->lock);
    if (atomic_load(&c->fd) < 0)
        c->tried = false;
    pthread_mutex_unlock(&c->lock);
}

static int active_open(void)
{
    char dir[4096], file[4096], path[4200];
    ft__profile_place(dir, file, sizeof dir, false); /* (made by AUTO's first use, not here) */
    if (!dir[0] && !file[0])
        return -1;
    if (dir[0])
        snprintf(path, sizeof path, "%s/active", dir);
    else
        snprintf(path, sizeof path, "%s.active", file);
    return ft__sys.open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
}

/* Take (F_RDLCK) or drop (F_UNLCK) the context's lock on @p fd. */
static void active_mark(int fd, short type)
{
    struct flock lk = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    (void)ft__sys.lock(fd, F_OFD_SETLK, &lk); /* (failed: others see no company here) */
}

void ft__company_enter(ft__company *c)
{
    pthread_mutex_lock(&c->lock);
    if (!c->tried) {
        c->tried = true;
        atomic_store(&c->fd, active_open());
    }
    int fd = atomic_load(&c->fd);
    if (c->calls++ == 0 && fd >= 0) {
        active_mark(fd, F_RDLCK);
        c->since = now_ns();
    }
    pthread_mutex_unlock(&c->lock);
}

/* Where a context writes when its transfers last ended, with its token (after the lock
 * byte); not for a run of transfers shorter than ACTIVE_BRIEF (a small read's, which another's
 * sample hardly felt: the write would be most of its cost). */
#define ACTIVE_ENDED 8
#define ACTIVE_BRIEF 1000000ull

/* The end another context recorded (ns), 0: none, or the record is this context's. */
static uint64_t other_end(const ft__company *c, int fd)
{
    uint64_t rec[2] = {0, 0};
    if (ft__sys.pread(fd, rec, sizeof rec, ACTIVE_ENDED) != (ssize_t)sizeof rec)
        return 0;
    return rec[1] != c->token ? rec[0] : 0;
}

void ft__company_leave(ft__company *c)
{
    pthread_mutex_lock(&c->lock);
    int fd = atomic_load(&c->fd);
    if (--c->calls == 0 && fd >= 0) {
        uint64_t rec[2] = {now_ns(), c->token};
        if (rec[0] - c->since >= ACTIVE_BRIEF) {
            uint64_t o = other_end(c, fd);
            if (o > atomic_load(&c->other_ended))
                atomic_store(&c->other_ended, o);
            (void)ft__sys.pwrite(fd, rec, sizeof rec, ACTIVE_ENDED); /* (failed: unseen) */
        }
        active_mark(fd, F_UNLCK);
    }
    pthread_mutex_unlock(&c->lock);
}

bool ft__company_now(ft__company *c)
{
    int fd = atomic_load(&c->fd);
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    return fd >= 0 && ft__sys.lock(fd, F_OFD_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
}

bool ft__company_since(ft__company *c, uint64_t t0)
{
    int fd = atomic_load(&c->fd);
    return fd >= 0 && (atomic_load(&c->other_ended) > t0 || other_end(c, fd) > t0);
}
