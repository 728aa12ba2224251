#include "syscall.h"

#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static int sys_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
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
