/* Whole-range pread/pwrite (loop on short counts and EINTR, cap each call at FT__MAX_RW); open
 * again on EINTR. */
#include "base.h"
#include "syscall.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

int64_t ft__rw_full(int fd, int unaligned_fd, void *buf, uint64_t len, uint64_t off, bool write)
{
    uint64_t done = 0;
    while (done < len) {
        /* O_DIRECT cannot go on from an unaligned place (left by a short count). */
        if (unaligned_fd >= 0 && ((off + done) % FT__DIRECT_ALIGN ||
                                  ((uintptr_t)buf + done) % FT__DIRECT_ALIGN ||
                                  (len - done) % FT__DIRECT_ALIGN))
            fd = unaligned_fd;
        size_t want = (size_t)FT__MIN(len - done, (uint64_t)FT__MAX_RW);
        uint8_t *p = (uint8_t *)buf + done;
        ssize_t n = write ? ft__sys.pwrite(fd, p, want, (off_t)(off + done))
                          : ft__sys.pread(fd, p, want, (off_t)(off + done));
        if (n < 0) {
            int e = errno ? errno : EIO;
            if (e == EINTR)
                continue;
            return ft__err(-e, "%s of %zu bytes at offset %llu", write ? "pwrite" : "pread",
                           want, (unsigned long long)(off + done));
        }
        if (n == 0) {
            if (!write)
                break; /* end of file */
            return ft__err(-EIO, "pwrite made no progress at offset %llu",
                           (unsigned long long)(off + done));
        }
        done += (uint64_t)n;
    }
    return (int64_t)done;
}

int64_t ft__pread_full(int fd, void *buf, uint64_t len, uint64_t off)
{
    return ft__rw_full(fd, -1, buf, len, off, false);
}

int64_t ft__pwrite_full(int fd, const void *buf, uint64_t len, uint64_t off)
{
    return ft__rw_full(fd, -1, (void *)buf, len, off, true);
}

int ft__open_retry(const char *path, int flags, mode_t mode)
{
    for (;;) {
        int fd = ft__sys.open(path, flags, mode);
        if (fd >= 0 || errno != EINTR)
            return fd;
    }
}

int ft__dir_next(DIR *d, struct dirent **e)
{
    errno = 0;
    *e = ft__sys.readdir(d);
    return *e ? 1 : errno ? -errno : 0;
}

int ft__populate(const void *from, uint64_t len)
{
#ifdef MADV_POPULATE_READ
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)from / page * page;
    if (ft__sys.madvise((void *)start, (uintptr_t)from + len - start, MADV_POPULATE_READ))
        return -errno;
    return 0;
#else
    (void)from, (void)len;
    return -EINVAL;
#endif
}

void ft__touch_pages(const void *from, uint64_t len)
{
    /* A read of each page: a fault maps the pages around it too (fault-around). Mapped
     * cached pages one by one, MADV_POPULATE_READ ran at 9 GB/s on the H200 machine, where
     * one thread's faults ran at 26. */
    const volatile uint8_t *p = from;
    unsigned sum = 0;
    for (uint64_t i = 0; i < len; i += 4096)
        sum += p[i];
    if (len)
        sum += p[len - 1];
    (void)sum;
}
