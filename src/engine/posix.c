/* posix: buffered pread/pwrite, the range split in chunks run in parallel over the pool. */
#include "engine.h"

static int64_t read_piece(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return ft__pread_full(io->file->fd, ptr, len, off);
}

static int64_t write_piece(const ft__io *io, uint8_t *ptr, uint64_t off, uint64_t len)
{
    return ft__pwrite_full(io->file->fd, ptr, len, off);
}

static int64_t posix_read(const ft__io *io)
{
    return ft__io_parallel(io, ft__io_piece(io), read_piece);
}

static int64_t posix_write(const ft__io *io)
{
    return ft__io_parallel(io, ft__io_piece(io), write_piece);
}

const ft__engine_ops ft__engine_posix = {
    .name = "posix",
    .id = FT_ENGINE_POSIX,
    .caps = 0,
    .read = posix_read,
    .write = posix_write,
};
