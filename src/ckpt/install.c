/*
 * Small files installed beside checkpoints (a DCP save's metadata) and files removed from
 * them (the data files a DCP save replaced), as the checkpoint saves install and remove
 * theirs: a locked temporary that ft_ckpt_gc removes after a crash, one rename, the
 * directory made durable; the replaced or removed file held by an O_PATH reference that a
 * pool worker drops (its blocks freed off the caller's path, reclaim.c).
 */
#include "ckpt.h"
#include "../base/syscall.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ft_file_install(ft_ctx *ctx, const char *path, const void *data, size_t len,
                    unsigned flags)
{
    if (!ctx || !path || !*path || (len && !data))
        return ft__err(-EINVAL, "ft_file_install: missing context, path or data");
    if (flags & ~(unsigned)FT_SAVE_NO_SYNC)
        return ft__err(-EINVAL, "%s: unknown install flags 0x%x", path, flags);
    bool sync = !(flags & FT_SAVE_NO_SYNC);
    ft__ckpt_name nm;
    int rc = ft__name_init(&nm, path);
    if (rc < 0)
        return rc;
    char *tmp = ft__tmp_name(path);
    int lock = tmp ? ft__tmp_lock(tmp) : ft__err(-ENOMEM, "%s", path);
    ft_file *f = NULL;
    rc = lock < 0 ? lock : ft_file_open(ctx, &f, tmp, FT_OPEN_WRITE, 0);
    if (rc == 0) {
        ft_buf b = ft_host_buf((void *)data, len);
        ft_io_opts o = {0}; /* AUTO, as a file of its own */
        int64_t w = len ? ft_write(f, &b, 0, &o) : 0;
        rc = w < 0 ? (int)w : 0;
        if (rc == 0 && sync)
            rc = ft_file_sync(f);
        int crc = ft_file_close(f);
        rc = rc ? rc : crc;
    }
    if (rc == 0) {
        ft__name_hold(&nm, path);
        if (ft__sys.rename(tmp, path) != 0)
            rc = ft__err(-errno, "cannot rename %s to %s", tmp, path);
    }
    if (rc < 0 && lock >= 0)
        FT__KEEPING_DETAIL(ft__sys.unlink(tmp));
    if (lock >= 0)
        ft__sys.close(lock);
    if (rc == 0 && sync && ft__fsync_dir(nm.dir) < 0)
        rc = FT_SAVE_WARNING; /* installed; not durable until the directory is synced */
    FT__KEEPING_DETAIL(ft__name_release(&nm, ctx->pool); ft__name_free(&nm));
    free(tmp);
    return rc;
}

int ft_file_remove(ft_ctx *ctx, const char *path)
{
    if (!ctx || !path || !*path)
        return ft__err(-EINVAL, "ft_file_remove: missing context or path");
    ft__ckpt_name nm;
    int rc = ft__name_init(&nm, path);
    if (rc < 0)
        return rc;
    ft__name_hold(&nm, path);
    if (ft__sys.unlink(path) != 0)
        rc = ft__err(-errno, "cannot remove %s", path);
    FT__KEEPING_DETAIL(ft__name_release(&nm, ctx->pool); ft__name_free(&nm));
    return rc;
}
