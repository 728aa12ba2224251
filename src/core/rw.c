/* Whole-range pread/pwrite: loop on short counts and EINTR, cap each call at FT__MAX_RW. */
#include "internal.h"
#include "syscall.h"

#include <errno.h>

int64_t ft__pread_full(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        size_t want = (size_t)FT__MIN(len - done, (uint64_t)FT__MAX_RW);
        ssize_t n = ft__sys.pread(fd, (uint8_t *)buf + done, want, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ft__err(-errno, "pread of %zu bytes at offset %llu", want,
                           (unsigned long long)(off + done));
        }
        if (n == 0)
            break; /* end of file */
        done += (uint64_t)n;
    }
    return (int64_t)done;
}

int64_t ft__pwrite_full(int fd, const void *buf, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        size_t want = (size_t)FT__MIN(len - done, (uint64_t)FT__MAX_RW);
        ssize_t n = ft__sys.pwrite(fd, (const uint8_t *)buf + done, want, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return ft__err(-errno, "pwrite of %zu bytes at offset %llu", want,
                           (unsigned long long)(off + done));
        }
        if (n == 0)
            return ft__err(-EIO, "pwrite made no progress at offset %llu",
                           (unsigned long long)(off + done));
        done += (uint64_t)n;
    }
    return (int64_t)done;
}
