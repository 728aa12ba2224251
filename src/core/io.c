/* Synchronous transfers: checks, engine choice, dispatch, durability. */
#include "internal.h"
#include "../engine/engine.h"
#include "syscall.h"

#include <errno.h>

/* Below this, one buffered call beats setting up parallel or O_DIRECT work. */
#define AUTO_SMALL (1u << 20)

int ft__io_check(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                 bool write)
{
    if (!f || !buf)
        return ft__err(-EINVAL, "%s: file or buffer is NULL", write ? "write" : "read");
    if (buf->kind != FT_MEM_HOST)
        return ft__err(-EINVAL, "%s: memory kind %d is not supported", f->path, (int)buf->kind);
    if (!buf->ptr && buf->len)
        return ft__err(-EFAULT, "%s: buffer pointer is NULL", f->path);
    if (offset > INT64_MAX || buf->len > INT64_MAX - offset)
        return ft__err(-EFBIG, "%s: range at %llu of %zu bytes is beyond the largest offset",
                       f->path, (unsigned long long)offset, buf->len);
    if (opts && ((unsigned)opts->engine >= FT_ENGINE_COUNT || (opts->flags & ~FT_IO_SYNC)))
        return ft__err(-EINVAL, "%s: bad options (engine %d, flags 0x%x)", f->path,
                       (int)opts->engine, opts->flags);
    if (write && !f->writable)
        return ft__err(-EBADF, "%s is not open for writing", f->path);
    if (!write && !f->readable)
        return ft__err(-EBADF, "%s is not open for reading", f->path);
    return 0;
}

/* The static rule until the selector learns better: small -> one buffered call; large ->
 * O_DIRECT through io_uring (or threads) when the filesystem allows it. */
static ft_engine auto_engine(ft_file *f, uint64_t len)
{
    if (len < AUTO_SMALL)
        return FT_ENGINE_POSIX;
    if (ft__file_direct_fd(f) < 0)
        return FT_ENGINE_POSIX;
    return ft_engine_available(f->ctx, FT_ENGINE_URING, NULL) ? FT_ENGINE_URING
                                                             : FT_ENGINE_DIRECT;
}

static ft_engine choose_engine(ft_file *f, uint64_t len, const ft_io_opts *opts)
{
    ft_engine e = opts ? opts->engine : FT_ENGINE_AUTO;
    if (e == FT_ENGINE_AUTO)
        e = f->ctx->cfg.engine;
    return e == FT_ENGINE_AUTO ? auto_engine(f, len) : e;
}

int64_t ft__transfer(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                     bool write)
{
    ft__io io = {.ctx = f->ctx, .file = f, .ptr = buf->ptr, .len = buf->len, .off = offset};
    if (!write) {
        int64_t size = ft__file_size(f);
        if (size < 0)
            return size;
        io.len = (uint64_t)size <= offset ? 0 : FT__MIN(io.len, (uint64_t)size - offset);
    }
    int64_t r = 0;
    if (io.len > 0) {
        const ft__engine_ops *ops = ft__engine_get(choose_engine(f, io.len, opts));
        r = write ? ops->write(&io) : ops->read(&io);
    }
    if (r >= 0 && write && opts && (opts->flags & FT_IO_SYNC)) {
        int rc = ft_file_sync(f);
        if (rc < 0)
            return rc;
    }
    return r;
}

int64_t ft_read(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts)
{
    int rc = ft__io_check(f, buf, offset, opts, false);
    return rc < 0 ? rc : ft__transfer(f, buf, offset, opts, false);
}

int64_t ft_write(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts)
{
    int rc = ft__io_check(f, buf, offset, opts, true);
    return rc < 0 ? rc : ft__transfer(f, buf, offset, opts, true);
}
