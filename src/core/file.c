/* Files: one buffered descriptor, an O_DIRECT one opened on first use. */
#include "internal.h"
#include "../engine/engine.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int open_fd(const char *path, int oflags, mode_t mode)
{
    for (;;) {
        int fd = ft__sys.open(path, oflags, mode);
        if (fd >= 0 || errno != EINTR)
            return fd;
    }
}

int ft_file_open(ft_ctx *ctx, ft_file **out, const char *path, unsigned flags, mode_t mode)
{
    if (!ctx || !out || !path || !*path)
        return ft__err(-EINVAL, "ft_file_open: missing context, output or path");
    const unsigned known = FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC |
                           FT_OPEN_EXCL;
    if ((flags & ~known) || !(flags & (FT_OPEN_READ | FT_OPEN_WRITE)))
        return ft__err(-EINVAL, "%s: open flags 0x%x need READ and/or WRITE and no others",
                       path, flags);
    if ((flags & (FT_OPEN_CREATE | FT_OPEN_TRUNC)) && !(flags & FT_OPEN_WRITE))
        return ft__err(-EINVAL, "%s: CREATE and TRUNC need WRITE", path);
    /* O_NONBLOCK: opening a FIFO or a device must not block before the type check below
     * refuses it; it is cleared once the file is known to be a regular one. */
    int extra = O_CLOEXEC | O_NONBLOCK;
    if (flags & FT_OPEN_CREATE)
        extra |= O_CREAT;
    if (flags & FT_OPEN_TRUNC)
        extra |= O_TRUNC;
    if (flags & FT_OPEN_EXCL)
        extra |= O_EXCL;
    /* A write-only file is opened read-write when permitted: mmap writes need it. */
    int access = (flags & FT_OPEN_WRITE) ? O_RDWR : O_RDONLY;
    int fd = open_fd(path, access | extra, mode);
    if (fd < 0 && errno == EACCES && !(flags & FT_OPEN_READ)) {
        access = O_WRONLY;
        fd = open_fd(path, access | extra, mode);
    }
    if (fd < 0)
        return ft__err(-errno, "cannot open %s", path);
    int rc = ft__file_adopt(ctx, out, fd, path, flags, access);
    /* the status flags the file was opened with were O_NONBLOCK alone (O_CLOEXEC is the
     * descriptor's, not the file's) */
    if (rc == 0 && ft__sys.fcntl(fd, F_SETFL, 0) != 0) {
        rc = ft__err(-errno, "cannot clear O_NONBLOCK on %s", path);
        ft_file_close(*out);
        *out = NULL;
    }
    return rc;
}

int ft__file_adopt(ft_ctx *ctx, ft_file **out, int fd, const char *path, unsigned flags,
                   int access)
{
    struct stat st;
    int rc = 0;
    if (ft__sys.fstat(fd, &st) != 0)
        rc = ft__err(-errno, "cannot stat %s", path);
    else if (S_ISDIR(st.st_mode))
        rc = ft__err(-EISDIR, "%s", path);
    else if (!S_ISREG(st.st_mode))
        rc = ft__err(-EINVAL, "%s is not a regular file (a FIFO, socket or device)", path);
    ft_file *f = rc ? NULL : calloc(1, sizeof *f);
    if (!rc && (!f || !(f->path = strdup(path)))) {
        free(f);
        f = NULL;
        rc = ft__err(-ENOMEM, "%s", path);
    }
    if (rc) {
        ft__sys.close(fd);
        return rc;
    }
    f->ctx = ctx;
    f->fd = fd;
    f->open_flags = access;
    f->readable = flags & FT_OPEN_READ;
    f->writable = flags & FT_OPEN_WRITE;
    f->fd_readable = access != O_WRONLY;
    f->direct_fd = -1;
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return 0;
}

int ft_file_close(ft_file *f)
{
    if (!f)
        return 0;
    int rc = 0;
    ft__auto_file_close(f);
    for (int e = 0; e < FT_ENGINE_COUNT; e++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)e);
        if (ops && ops->file_close)
            ops->file_close(f);
    }
    if (f->direct_fd >= 0 && ft__sys.close(f->direct_fd) != 0 && errno != EINTR)
        rc = ft__err(-errno, "close of %s (O_DIRECT)", f->path);
    if (ft__sys.close(f->fd) != 0 && errno != EINTR && rc == 0)
        rc = ft__err(-errno, "close of %s", f->path);
    pthread_mutex_destroy(&f->lock);
    free(f->path);
    free(f);
    return rc;
}

/* Reopen the same inode (not whatever the path names now) with O_DIRECT. */
static int open_direct(ft_file *f)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
    int fd = open_fd(proc, f->open_flags | O_DIRECT | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT) { /* no /proc: the path, checked to be the same file */
        fd = open_fd(f->path, f->open_flags | O_DIRECT | O_CLOEXEC, 0);
        struct stat a, b;
        if (fd >= 0 && (ft__sys.fstat(fd, &a) || ft__sys.fstat(f->fd, &b) ||
                        a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
            ft__sys.close(fd);
            errno = ESTALE;
            fd = -1;
        }
    }
    if (fd >= 0)
        return fd;
    if (errno == EINVAL)
        return ft__err(-EINVAL, "O_DIRECT is not supported by the filesystem holding %s",
                       f->path);
    return ft__err(-errno, "cannot open %s with O_DIRECT", f->path);
}

int ft__file_direct_fd(ft_file *f)
{
    bool fresh = false; /* this call tried, so the thread's detail says why it failed */
    pthread_mutex_lock(&f->lock);
    if (f->direct_fd < 0 && f->direct_err == 0) {
        fresh = true;
        int fd = open_direct(f);
        if (fd >= 0)
            f->direct_fd = fd;
        else
            f->direct_err = fd;
    }
    int rc = f->direct_fd >= 0 ? f->direct_fd : f->direct_err;
    pthread_mutex_unlock(&f->lock);
    if (rc < 0 && !fresh)
        return ft__err(rc, "O_DIRECT unavailable for %s", f->path);
    return rc;
}

int64_t ft__file_size(ft_file *f)
{
    struct stat st;
    if (ft__sys.fstat(f->fd, &st) != 0)
        return ft__err(-errno, "cannot stat %s", f->path);
    return (int64_t)st.st_size;
}

int64_t ft_file_size(ft_file *f)
{
    if (!f)
        return ft__err(-EINVAL, "ft_file_size: file is NULL");
    return ft__file_size(f);
}

int ft_file_truncate(ft_file *f, uint64_t size)
{
    if (!f || size > INT64_MAX)
        return ft__err(-EINVAL, "ft_file_truncate: bad file or size");
    if (!f->writable)
        return ft__err(-EBADF, "%s is not open for writing", f->path);
    for (;;) {
        if (ft__sys.ftruncate(f->fd, (off_t)size) == 0)
            return 0;
        if (errno != EINTR)
            return ft__err(-errno, "cannot truncate %s to %llu bytes", f->path,
                           (unsigned long long)size);
    }
}

int ft_file_allocate(ft_file *f, uint64_t offset, uint64_t len)
{
    if (!f || offset > INT64_MAX || len > INT64_MAX - offset)
        return ft__err(-EINVAL, "ft_file_allocate: bad file or range");
    if (!f->writable)
        return ft__err(-EBADF, "%s is not open for writing", f->path);
    if (len == 0)
        return 0;
    for (;;) {
        if (ft__sys.fallocate(f->fd, 0, (off_t)offset, (off_t)len) == 0)
            return 0;
        if (errno != EINTR)
            return ft__err(-errno, "cannot allocate %llu bytes at %llu in %s",
                           (unsigned long long)len, (unsigned long long)offset, f->path);
    }
}

int ft_file_sync(ft_file *f)
{
    if (!f)
        return ft__err(-EINVAL, "ft_file_sync: file is NULL");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (;;) {
        if (ft__sys.fdatasync(f->fd) == 0)
            break;
        if (errno != EINTR)
            return ft__err(-errno, "fdatasync of %s", f->path);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    ft__auto_synced(f, (uint64_t)((b.tv_sec - a.tv_sec) * 1000000000ll + (b.tv_nsec - a.tv_nsec)));
    return 0;
}

const char *ft_file_path(const ft_file *f)
{
    return f ? f->path : NULL;
}
