#include "syscall.h"

#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int sys_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}

struct ft__cachestat_range {
    uint64_t off, len;
};
struct ft__cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

static int sys_cachestat(int fd, uint64_t off, uint64_t len, uint64_t *cached)
{
#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif
    struct ft__cachestat_range r = {off, len};
    struct ft__cachestat cs;
    long rc = syscall(__NR_cachestat, fd, &r, &cs, 0);
    if (rc == 0)
        *cached = cs.nr_cache;
    return (int)rc;
}

/* liburing's wait is an inline function; the table needs an address. */
static int sys_uring_wait_cqe(struct io_uring *ring, struct io_uring_cqe **cqe)
{
    return io_uring_wait_cqe(ring, cqe);
}

const ft__syscalls ft__sys_real = {
    .open = sys_open,
    .close = close,
    .pread = pread,
    .pwrite = pwrite,
    .fstat = fstat,
    .fstatfs = fstatfs,
    .fdatasync = fdatasync,
    .fsync = fsync,
    .ftruncate = ftruncate,
    .fallocate = fallocate,
    .fadvise = posix_fadvise,
    .mmap = mmap,
    .munmap = munmap,
    .madvise = madvise,
    .mincore = mincore,
    .cachestat = sys_cachestat,
    .rename = rename,
    .unlink = unlink,
    .uring_init = io_uring_queue_init_params,
    .uring_register_buffers = io_uring_register_buffers,
    .uring_submit = io_uring_submit,
    .uring_wait_cqe = sys_uring_wait_cqe,
    .uring_exit = io_uring_queue_exit,
};

ft__syscalls ft__sys = ft__sys_real;

void ft__sys_reset(void)
{
    ft__sys = ft__sys_real;
}
