#include "syscall.h"

#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int ft__sys_open(const char *path, int flags, mode_t mode);
int ft__sys_fcntl(int fd, int cmd, int arg);
int ft__sys_lock(int fd, int cmd, struct flock *lk);
int ft__sys_cachestat(int fd, uint64_t off, uint64_t len, uint64_t *cached);
int ft__sys_uring_wait_cqe(struct io_uring *ring, struct io_uring_cqe **cqe);
int ft__sys_fstat(int fd, struct stat *st);
int ft__sys_stat(const char *path, struct stat *st);

/* open and fcntl are variadic in libc; the table has fixed signatures. */
int ft__sys_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}

int ft__sys_fcntl(int fd, int cmd, int arg)
{
    return fcntl(fd, cmd, arg);
}

int ft__sys_lock(int fd, int cmd, struct flock *lk)
{
    return fcntl(fd, cmd, lk);
}

struct ft__cachestat_range {
    uint64_t off, len;
};
struct ft__cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int ft__sys_cachestat(int fd, uint64_t off, uint64_t len, uint64_t *cached)
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

/* stat and fstat as the kernel calls themselves: glibc exports them as functions only from
 * 2.33 on (see glibc-compat.h), and on 64-bit Linux the kernel's struct stat is glibc's. */
int ft__sys_fstat(int fd, struct stat *st)
{
#if defined(SYS_fstat) && (defined(__x86_64__) || defined(__aarch64__))
    return (int)syscall(SYS_fstat, fd, st);
#else
    return fstat(fd, st);
#endif
}

int ft__sys_stat(const char *path, struct stat *st)
{
#if defined(SYS_newfstatat) && (defined(__x86_64__) || defined(__aarch64__))
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
#else
    return stat(path, st);
#endif
}

/* liburing's wait is an inline function; the table needs an address. */
int ft__sys_uring_wait_cqe(struct io_uring *ring, struct io_uring_cqe **cqe)
{
    return io_uring_wait_cqe(ring, cqe);
}

const ft__syscalls ft__sys_real = FT__SYSCALLS_REAL;

ft__syscalls ft__sys = FT__SYSCALLS_REAL;

void ft__sys_reset(void)
{
    ft__sys = ft__sys_real;
}
