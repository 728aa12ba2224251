/* The descriptors of a file the engines use: the O_DIRECT one is opened on first use. */
#include "handle.h"
#include "../base/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

/* Reopen the same inode (not whatever the path names now) with O_DIRECT. */
static int open_direct(ft_file *f)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
    int fd = ft__open_retry(proc, f->open_flags | O_DIRECT | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT) { /* no /proc: the path, checked to be the same file */
        fd = ft__open_retry(f->path, f->open_flags | O_DIRECT | O_CLOEXEC, 0);
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

