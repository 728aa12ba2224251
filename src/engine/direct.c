/*
 * direct: O_DIRECT pread/pwrite, several in flight on the pool's threads. Block-aligned
 * memory is transferred in place; any other memory goes through aligned bounce buffers from
 * the context's pool. Unaligned heads and tails are left to buffered I/O (ft__direct_transfer).
 */
#include "engine.h"

#include <errno.h>
#include <string.h>

static int direct_fd(const ft__io *io)
{
    return (int)(intptr_t)io->aux;
}

static int64_t read_in_place(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return ft__rw_full(direct_fd(io), io->file->fd, ptr, len, off, false);
}

static int64_t write_in_place(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return ft__rw_full(direct_fd(io), io->file->fd, ptr, len, off, true);
}

static int64_t read_bounced(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    uint8_t *bounce = ft__bufpool_get(io->ctx->bounce);
    if (!bounce)
        return ft__err(-ENOMEM, "no bounce buffer for O_DIRECT read");
    int64_t r = ft__rw_full(direct_fd(io), io->file->fd, bounce, len, off, false);
    if (r > 0)
        memcpy(ptr, bounce, (size_t)r);
    ft__bufpool_put(io->ctx->bounce, bounce);
    return r;
}

static int64_t write_bounced(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    uint8_t *bounce = ft__bufpool_get(io->ctx->bounce);
    if (!bounce)
        return ft__err(-ENOMEM, "no bounce buffer for O_DIRECT write");
    memcpy(bounce, ptr, (size_t)len);
    int64_t r = ft__rw_full(direct_fd(io), io->file->fd, bounce, len, off, true);
    ft__bufpool_put(io->ctx->bounce, bounce);
    return r;
}

static int64_t direct_middle(const ft__io *part, bool write, int fd)
{
    ft__io io = *part;
    io.aux = (void *)(intptr_t)fd;
    if (ft__is_direct_aligned(io.ptr, io.off, io.len))
        return ft__io_parallel(&io, io.piece ? io.piece : io.ctx->cfg.chunk_size,
                               write ? write_in_place : read_in_place);
    return ft__io_parallel(&io, ft__bufpool_size(io.ctx->bounce),
                           write ? write_bounced : read_bounced);
}

static int64_t direct_read(const ft__io *io)
{
    return ft__direct_transfer(io, false, direct_middle);
}

static int64_t direct_write(const ft__io *io)
{
    return ft__direct_transfer(io, true, direct_middle);
}

const ft__engine_ops ft__engine_direct = {
    .name = "direct",
    .id = FT_ENGINE_DIRECT,
    .caps = FT__CAP_BYPASS_CACHE | FT__CAP_NEEDS_DIRECT | FT__CAP_SETS_UP,
    .read = direct_read,
    .write = direct_write,
};
