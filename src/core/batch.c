/*
 * Batches (ft_read_batch, ft_write_batch): many independent transfers of one file in one
 * call. Every op is checked before any runs; device-memory batches with engine cufile go to
 * cuFile's batch API, everything else runs op by op on the pool (each op on the path
 * ft_read/ft_write would take), and one fdatasync ends a FT_IO_SYNC write batch.
 */
#include "internal.h"
#include "../engine/engine.h"

#include <errno.h>
#include <stdlib.h>

typedef struct batch_job {
    ft_file *file;
    ft_batch_op *ops;
    ft_io_opts opts; /* without FT_IO_SYNC: the batch syncs once at the end */
    bool write;
    ft__first_err failed; /* the lowest failed op, with its worker's detail */
} batch_job;

static int64_t batch_op(void *arg, unsigned i)
{
    batch_job *job = arg;
    ft_batch_op *op = &job->ops[i];
    op->result = ft__transfer(job->file, &op->buf, op->offset, &job->opts, job->write);
    if (op->result < 0)
        ft__first_err_note(&job->failed, i, (int)op->result);
    return op->result;
}

static int batch_on_pool(batch_job *job, size_t n)
{
    int64_t *results = malloc(n * sizeof *results);
    if (!results)
        return ft__err(-ENOMEM, "%s: batch of %zu ops", job->file->path, n);
    ft__first_err_init(&job->failed);
    int rc = ft__pool_run(job->file->ctx->pool, (unsigned)n, batch_op, job, results);
    int first = ft__first_err_take(&job->failed);
    free(results);
    if (rc < 0)
        return ft__err(rc, "%s: cannot queue a batch of %zu ops", job->file->path, n);
    return first;
}

/* The one device all ops' memory is on, or -1 (host memory, or several devices). */
static int batch_device(const ft_batch_op *ops, size_t n)
{
    int common = -1;
    for (size_t i = 0; i < n; i++) {
        int dev;
        if (ft__buf_device(&ops[i].buf, &dev) < 0 || dev < 0 || (i > 0 && dev != common))
            return -1;
        common = dev;
    }
    return common;
}

static int batch(ft_file *f, ft_batch_op *ops, size_t n, const ft_io_opts *opts, bool write)
{
    const char *what = write ? "ft_write_batch" : "ft_read_batch";
    if (!f || (!ops && n))
        return ft__err(-EINVAL, "%s: file or ops is NULL", what);
    if (n > UINT32_MAX / 2)
        return ft__err(-EINVAL, "%s: %zu ops is too many for one batch", what, n);
    for (size_t i = 0; i < n; i++)
        ops[i].result = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = ft__io_check(f, &ops[i].buf, ops[i].offset, opts, write);
        if (rc < 0) {
            char detail[FT__DETAIL_MAX];
            ft__detail_save(detail);
            ops[i].result = rc;
            return ft__err(rc, "%s: op %zu of %zu: %s (no op ran)", what, i, n, detail);
        }
    }
    if (n == 0)
        return 0;
    batch_job job = {.file = f, .ops = ops, .write = write};
    if (opts)
        job.opts = *opts;
    if (write && (job.opts.flags & FT_IO_SYNC)) /* one sync at the end, for all of them */
        job.opts.flags = (job.opts.flags & ~(unsigned)FT_IO_SYNC) | FT_IO_SYNC_LATER;
    int rc = 1, device;
    ft_engine e = job.opts.engine == FT_ENGINE_AUTO ? f->ctx->cfg.engine : job.opts.engine;
    const ft__engine_ops *eo = ft__engine_get(e);
    if (eo && eo->batch && (device = batch_device(ops, n)) >= 0)
        rc = eo->batch(f, ops, n, write, device, job.opts.stream);
    if (rc == 1)
        rc = batch_on_pool(&job, n);
    if (rc == 0 && write && opts && (opts->flags & FT_IO_SYNC))
        rc = ft_file_sync(f);
    return rc;
}

int ft_read_batch(ft_file *f, ft_batch_op *ops, size_t n, const ft_io_opts *opts)
{
    return batch(f, ops, n, opts, false);
}

int ft_write_batch(ft_file *f, ft_batch_op *ops, size_t n, const ft_io_opts *opts)
{
    return batch(f, ops, n, opts, true);
}
