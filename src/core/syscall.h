/*
 * The syscall table: every call the library makes into the kernel goes through ft__sys, so
 * tests can replace an entry (inject EIO, ENOSPC, EINTR, short transfers at the N-th call)
 * the way SQLite's aSyscall[] does. Entries follow the libc convention (-1 and errno) except
 * the io_uring ones, which follow liburing's (-errno).
 */
#ifndef FT_CORE_SYSCALL_H
#define FT_CORE_SYSCALL_H

#include <sys/stat.h>
#include <sys/statfs.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct io_uring;
struct io_uring_params;
struct io_uring_cqe;

typedef struct ft__syscalls {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fstat)(int fd, struct stat *st);
    int (*fstatfs)(int fd, struct statfs *st);
    int (*fdatasync)(int fd);
    int (*fsync)(int fd);
    int (*ftruncate)(int fd, off_t len);
    int (*fallocate)(int fd, int mode, off_t off, off_t len);
    int (*fadvise)(int fd, off_t off, off_t len, int advice); /* returns an errno, like libc */
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t off);
    int (*munmap)(void *addr, size_t len);
    int (*madvise)(void *addr, size_t len, int advice);
    int (*mincore)(void *addr, size_t len, unsigned char *vec);
    /* cachestat(2): resident pages of [off, off+len); -1 and errno (ENOSYS before 6.5) */
    int (*cachestat)(int fd, uint64_t off, uint64_t len, uint64_t *cached_pages);
    int (*rename)(const char *from, const char *to);
    int (*unlink)(const char *path);
    int (*uring_init)(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
    int (*uring_register_buffers)(struct io_uring *ring, const struct iovec *iov, unsigned n);
    int (*uring_submit)(struct io_uring *ring);
    int (*uring_wait_cqe)(struct io_uring *ring, struct io_uring_cqe **cqe);
    void (*uring_exit)(struct io_uring *ring);
} ft__syscalls;

/** The live table. Tests may overwrite entries; ft__sys_reset() restores the real ones. */
extern ft__syscalls ft__sys;

/** The real implementations, for wrappers that inject faults around them. */
extern const ft__syscalls ft__sys_real;

void ft__sys_reset(void);

#endif
