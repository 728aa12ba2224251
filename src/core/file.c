/* Files: opening, adopting a descriptor, closing, sizes (the descriptors themselves:
 * engine/handle.c). */
#include "internal.h"
#include "../engine/engine.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    int fd = ft__open_retry(path, access | extra, mode);
    if (fd < 0 && errno == EACCES && !(flags & FT_OPEN_READ)) {
        access = O_WRONLY;
        fd = ft__open_retry(path, access | extra, mode);
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
    /* AUTO's state is allocated with the file */
    struct with_auto {
        ft_file f;
        struct ft__file_auto au;
    } *w = rc ? NULL : calloc(1, sizeof *w);
    ft_file *f = w ? &w->f : NULL;
    if (f)
        f->au = &w->au;
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
