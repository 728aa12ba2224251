/*
 * cuFile's batch API (cuFileBatchIOSetUp/Submit/GetStatus/Destroy) for ft_read_batch and
 * ft_write_batch with engine cufile: many small device-memory transfers handed to cuFile in
 * submissions of up to the driver's batch size, instead of a call each. Used with GPUDirect
 * Storage (or FASTENSOR_CUFILE_BATCH=1); where cuFile refuses batches (a set-up or first
 * submission fails) the refusal is remembered with its reason. Otherwise batches run as
 * parallel single calls (batch.c).
 */
#include "cufile.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Batch ops larger than this run as ordinary, split transfers. */
#define FT__CUFILE_BATCH_MAX_OP (16u << 20)
/* Seconds without a single completion before a batch is cancelled as stuck. */
#define FT__CUFILE_BATCH_STALL_S 30

/* The batch API: usable until a set-up or first submission fails, then refused for the
 * process with the reason (compatibility mode may refuse batches). */
static pthread_mutex_t batch_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *batch_refusal; /* NULL while the batch API is usable */
static char batch_refusal_buf[160];
static unsigned batch_max = 128; /* ops per submission: the driver's max_batch_io_size */
/* Whether batches go to the batch API at all: with nvidia-fs, or when FASTENSOR_CUFILE_BATCH=1.
 * In compatibility mode cuFile serves batch ops one at a time: on the H200 machine batches
 * of 64 ops ran 2-32x slower than the same ops as parallel cuFileRead/cuFileWrite calls. */
static bool batch_wanted;
static const char *batch_policy = "";

static void batch_refuse(const char *what, cufile_error e)
{
    pthread_mutex_lock(&batch_lock);
    snprintf(batch_refusal_buf, sizeof batch_refusal_buf, "%s failed (cuFile error %d, CUDA %d)",
             what, e.err, e.cu_err);
    batch_refusal = batch_refusal_buf;
    pthread_mutex_unlock(&batch_lock);
}

static const char *batch_refused(void)
{
    pthread_mutex_lock(&batch_lock);
    const char *why = batch_refusal;
    pthread_mutex_unlock(&batch_lock);
    return why;
}

/* Read the batch API's limits and decide whether batches use it (once the driver is open). */
static pthread_once_t batch_once = PTHREAD_ONCE_INIT;

static void batch_init(void)
{
    bool gds = ft__cufile_gds();
    if (!ft__cf.BatchSetUp || !ft__cf.BatchSubmit || !ft__cf.BatchGetStatus ||
        !ft__cf.BatchCancel || !ft__cf.BatchDestroy) {
        batch_refusal = "libcufile.so.0 lacks the batch API";
        return;
    }
    const char *env = getenv("FASTENSOR_CUFILE_BATCH");
    if (env && *env) {
        batch_wanted = strcmp(env, "0") != 0;
        batch_policy = batch_wanted ? "used for batches (FASTENSOR_CUFILE_BATCH=1)"
                                    : "not used (FASTENSOR_CUFILE_BATCH=0)";
    } else {
        batch_wanted = gds;
        batch_policy = gds ? "used for batches (GPUDirect Storage)"
                           : "not used in compatibility mode, where it serves ops one at a "
                             "time (FASTENSOR_CUFILE_BATCH=1 forces it)";
    }
    cufile_props props;
    memset(&props, 0, sizeof props);
    if (ft__cf.DriverGetProperties && ft__cf.DriverGetProperties(&props).err == 0 &&
        props.max_batch_io_size > 0 && props.max_batch_io_size <= 4096)
        batch_max = props.max_batch_io_size;
}

/* Set a batch up and tear it down. @return NULL, or the refusal it caused. */
static const char *batch_probe(void)
{
    if (ft__cuda_enter(0) < 0)
        return NULL;
    void *handle;
    cufile_error e = ft__cf.BatchSetUp(&handle, 1);
    if (e.err == 0)
        ft__cf.BatchDestroy(handle);
    else
        batch_refuse("cuFileBatchIOSetUp", e);
    ft__cuda_leave();
    return batch_refused();
}

void ft__cufile_batch_describe(char *buf, size_t len)
{
    const char *why;
    if (ft__cufile_usable(&why))
        pthread_once(&batch_once, batch_init);
    if (!ft__cufile_usable(&why))
        snprintf(buf, len, "not available: cuFile: %s", why);
    else if ((why = batch_refused()) || (why = batch_probe()))
        snprintf(buf, len, "not available: %s (batches run as parallel calls)", why);
    else
        snprintf(buf, len, "available, up to %u ops per submission; %s", batch_max,
                 batch_policy);
}

/* One batch in flight: ops [first, first + count) of the caller's array. */
typedef struct batch_run {
    ft_file *file;
    ft_batch_op *ops;
    bool write;
    int64_t size;    /* reads: the file's size */
    void *handle;    /* cuFile batch handle */
    void *fh;        /* cuFile file handle */
    cufile_io_params *params;
    cufile_io_event *events;
    ft__first_err failed; /* the lowest failed op, with its detail */
} batch_run;

static void batch_fail(batch_run *b, size_t i, int64_t err)
{
    b->ops[i].result = err;
    ft__first_err_note(&b->failed, (unsigned)i, (int)err);
}

/* Fill params for ops from *next on, at most batch_max. @return how many. */
static unsigned batch_fill(batch_run *b, size_t *next, size_t n)
{
    unsigned k = 0;
    for (; *next < n && k < batch_max; (*next)++) {
        ft_batch_op *op = &b->ops[*next];
        uint64_t len = op->buf.len;
        if (!b->write)
            len = (uint64_t)b->size <= op->offset ? 0 : FT__MIN(len, b->size - op->offset);
        op->result = 0;
        if (len == 0)
            continue;
        uint8_t *ptr = op->buf.ptr, *base = ft__cufile_base(b->file->ctx, ptr, len);
        b->params[k++] = (cufile_io_params){
            .mode = CUFILE_BATCH,
            .batch = {base, (off_t)op->offset, (off_t)(ptr - base), (size_t)len},
            .fh = b->fh,
            .opcode = b->write ? CUFILE_WRITE : CUFILE_READ,
            .cookie = (void *)(uintptr_t)*next,
        };
    }
    return k;
}

/* Collect the completions of @p k submitted ops. @return 0 or -EIO (status failed: the
 * batch was cancelled and the ops not seen complete are marked failed). */
static int batch_reap(batch_run *b, unsigned k)
{
    unsigned seen = 0, idle_s = 0;
    while (seen < k) {
        unsigned nr = k - seen;
        struct timespec timeout = {.tv_sec = 1};
        cufile_error e = ft__cf.BatchGetStatus(b->handle, 1, &nr, b->events, &timeout);
        idle_s = nr ? 0 : idle_s + 1;
        if (e.err != 0 || idle_s >= FT__CUFILE_BATCH_STALL_S) {
            ft__cf.BatchCancel(b->handle);
            for (unsigned j = 0; j < k; j++)
                if (b->ops[(uintptr_t)b->params[j].cookie].result == 0)
                    batch_fail(b, (uintptr_t)b->params[j].cookie,
                               e.err ? ft__err(-EIO, "cuFileBatchIOGetStatus failed (cuFile "
                                                     "error %d)", e.err)
                                     : ft__err(-ETIMEDOUT, "cuFile batch: no op completed in "
                                                           "%u s", idle_s));
            return e.err ? -EIO : -ETIMEDOUT;
        }
        for (unsigned j = 0; j < nr; j++) {
            const cufile_io_event *ev = &b->events[j];
            size_t i = (uintptr_t)ev->cookie;
            if (ev->status == CUFILE_WAITING || ev->status == CUFILE_PENDING)
                continue;
            seen++;
            ssize_t ret = (ssize_t)ev->ret;
            uint64_t want = b->ops[i].buf.len;
            if (ev->status != CUFILE_COMPLETE || ret < 0)
                batch_fail(b, i, ft__err(-EIO, "cuFile batch %s of %zu bytes at %llu of %s: "
                                               "status 0x%x, result %zd",
                                         b->write ? "write" : "read", (size_t)want,
                                         (unsigned long long)b->ops[i].offset, b->file->path,
                                         ev->status, ret));
            else if (b->write && (uint64_t)ret < want)
                batch_fail(b, i, ft__err(-EIO, "cuFile batch write of %zu bytes at %llu of %s "
                                               "wrote %zd", (size_t)want,
                                         (unsigned long long)b->ops[i].offset, b->file->path,
                                         ret));
            else
                b->ops[i].result = ret;
        }
    }
    return 0;
}

/* Submit and reap every op. @return 1 if the first submission was refused (nothing ran). */
static int batch_run_all(batch_run *b, size_t n)
{
    size_t next = 0;
    for (bool first = true; next < n; first = false) {
        unsigned k = batch_fill(b, &next, n);
        if (!k)
            break;
        cufile_error e = ft__cf.BatchSubmit(b->handle, k, b->params, 0);
        if (e.err != 0 && first) {
            batch_refuse("cuFileBatchIOSubmit", e);
            return 1;
        }
        if (e.err != 0) {
            for (unsigned j = 0; j < k; j++)
                batch_fail(b, (uintptr_t)b->params[j].cookie,
                           ft__err(-EIO, "cuFileBatchIOSubmit failed (cuFile error %d)", e.err));
            continue;
        }
        batch_reap(b, k);
    }
    return 0;
}

int ft__cufile_batch(ft_file *f, ft_batch_op *ops, size_t n, bool write, int device,
                     void *stream)
{
    if (!ft__cufile_usable(NULL))
        return 1;
    pthread_once(&batch_once, batch_init);
    if (!batch_wanted || batch_refused())
        return 1;
    for (size_t i = 0; i < n; i++)
        if (ops[i].buf.len > FT__CUFILE_BATCH_MAX_OP)
            return 1; /* large transfers are faster split over threads */
    batch_run b = {.file = f, .ops = ops, .write = write};
    if (ft__cufile_file_handle(f, &b.fh) < 0 || (!write && (b.size = ft__file_size(f)) < 0))
        return 1; /* the ordinary path reports it, op by op */
    void *ready = NULL;
    int rc = ft__cuda_event_after(device, stream, &ready);
    if (rc == 0) /* cuFile runs on no stream: wait for the caller's on the host */
        rc = ft__cuda_event_wait(device, ready);
    ft__cuda_event_free(device, ready);
    if (rc < 0 || (rc = ft__cuda_enter(device)) < 0)
        return rc;
    ft__first_err_init(&b.failed);
    b.params = calloc(batch_max, sizeof *b.params);
    b.events = calloc(batch_max, sizeof *b.events);
    int refused = 1;
    if (!b.params || !b.events) {
        rc = ft__err(-ENOMEM, "cuFile batch of %u ops", batch_max);
        refused = 0;
    } else {
        cufile_error e = ft__cf.BatchSetUp(&b.handle, batch_max);
        if (e.err != 0) {
            batch_refuse("cuFileBatchIOSetUp", e);
        } else {
            refused = batch_run_all(&b, n);
            ft__cf.BatchDestroy(b.handle);
        }
    }
    ft__cuda_leave();
    free(b.params);
    free(b.events);
    int first = ft__first_err_take(&b.failed); /* nothing ran where rc < 0 or refused */
    if (rc < 0)
        return rc;
    return refused ? 1 : first;
}
