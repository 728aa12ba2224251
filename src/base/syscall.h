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

#include <dirent.h>

struct flock;
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
    int (*fcntl)(int fd, int cmd, int arg);
    int (*flock)(int fd, int op);
    /* fcntl(2) with a struct flock: F_OFD_SETLK, F_OFD_GETLK */
    int (*lock)(int fd, int cmd, struct flock *lk);
    int (*rename)(const char *from, const char *to);
    int (*unlink)(const char *path);
    int (*stat)(const char *path, struct stat *st);
    int (*mkdir)(const char *path, mode_t mode);
    DIR *(*opendir)(const char *path);
    struct dirent *(*readdir)(DIR *d); /* NULL at the end; NULL and errno set on failure */
    void (*rewinddir)(DIR *d);
    int (*closedir)(DIR *d); /* nothing to act on where it fails: its result is not read */
    int (*kill)(pid_t pid, int sig);
    int (*uring_init)(unsigned entries, struct io_uring *ring, struct io_uring_params *p);
    int (*uring_register_buffers)(struct io_uring *ring, const struct iovec *iov, unsigned n);
    int (*uring_submit)(struct io_uring *ring);
    int (*uring_wait_cqe)(struct io_uring *ring, struct io_uring_cqe **cqe);
    void (*uring_exit)(struct io_uring *ring);
} ft__syscalls;

/* The real implementations, one initializer for both tables (C wants constants). */
#define FT__SYSCALLS_REAL                                                                     \
    {                                                                                         \
        .open = ft__sys_open, .close = close, .pread = pread, .pwrite = pwrite,               \
        .fstat = ft__sys_fstat, .fstatfs = fstatfs, .fdatasync = fdatasync, .fsync = fsync,           \
        .ftruncate = ftruncate, .fallocate = fallocate, .fadvise = posix_fadvise,             \
        .mmap = mmap, .munmap = munmap, .madvise = madvise, .mincore = mincore,               \
        .cachestat = ft__sys_cachestat, .fcntl = ft__sys_fcntl, .flock = flock,               \
        .lock = ft__sys_lock,                                                                 \
        .rename = rename, .unlink = unlink, .stat = ft__sys_stat, .mkdir = mkdir,                     \
        .opendir = opendir, .readdir = readdir, .rewinddir = rewinddir,                       \
        .closedir = closedir, .kill = kill,                                                   \
        .uring_init = io_uring_queue_init_params,                                             \
        .uring_register_buffers = io_uring_register_buffers,                                  \
        .uring_submit = io_uring_submit, .uring_wait_cqe = ft__sys_uring_wait_cqe,            \
        .uring_exit = io_uring_queue_exit,                                                    \
    }

/** The live table. Tests may overwrite entries; ft__sys_reset() restores the real ones. */
extern ft__syscalls ft__sys;

/** The real implementations, for wrappers that inject faults around them. */
extern const ft__syscalls ft__sys_real;

void ft__sys_reset(void);

/** The next entry of @p d in *e, through the table. @return 1, 0 at the end, or -errno. */
int ft__dir_next(DIR *d, struct dirent **e);

#endif
