/* Asynchronous requests: a transfer run as a detached task on the context's pool. */
#include "internal.h"
#include "../gpu/cuda.h"

#include <errno.h>
#include <stdlib.h>

struct ft_req {
    ft_file *file;
    ft_buf buf;
    uint64_t offset;
    ft_io_opts opts;
    bool has_opts;
    bool write;
    int device;       /* device memory: its device, else -1 */
    void *ready;      /* device memory: the caller's stream at submit (a CUevent) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool done;
    int64_t result;
    char detail[FT__DETAIL_MAX];
};

static void req_run(void *arg)
{
    ft_req *req = arg;
    int64_t r = ft__transfer_after(req->file, &req->buf, req->offset,
                                   req->has_opts ? &req->opts : NULL, req->write, req->ready);
    pthread_mutex_lock(&req->lock);
    req->result = r;
    if (r < 0)
        ft__detail_save(req->detail);
    atomic_store_explicit(&req->done, true, memory_order_release);
    pthread_cond_broadcast(&req->cond);
    pthread_mutex_unlock(&req->lock);
}

static int submit(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                  ft_req **out, bool write)
{
    if (!out)
        return ft__err(-EINVAL, "submit: request output is NULL");
    int rc = ft__io_check(f, buf, offset, opts, write);
    if (rc < 0)
        return rc;
    ft_req *req = calloc(1, sizeof *req);
    if (!req)
        return ft__err(-ENOMEM, "request for %s", f->path);
    *req = (ft_req){.file = f, .buf = *buf, .offset = offset, .write = write};
    if (opts) {
        req->opts = *opts;
        req->has_opts = true;
    }
    /* The order on the caller's stream is taken now, not when a worker gets to it: work
     * the caller queues after submitting must not come before this transfer. */
    if ((rc = ft__buf_device(buf, &req->device)) == 0 && req->device >= 0 && buf->len)
        rc = ft__cuda_event_after(req->device, opts ? opts->stream : NULL, &req->ready);
    if (rc < 0) {
        free(req);
        return rc;
    }
    pthread_mutex_init(&req->lock, NULL);
    pthread_cond_init(&req->cond, NULL);
    if ((rc = ft__pool_post(f->ctx->pool, req_run, req)) < 0) {
        ft__cuda_event_free(req->device, req->ready);
        pthread_cond_destroy(&req->cond);
        pthread_mutex_destroy(&req->lock);
        free(req);
        return ft__err(rc, "cannot queue a request for %s", f->path);
    }
    *out = req;
    return 0;
}

int ft_submit_read(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                   ft_req **out)
{
    return submit(f, buf, offset, opts, out, false);
}

int ft_submit_write(ft_file *f, const ft_buf *buf, uint64_t offset, const ft_io_opts *opts,
                    ft_req **out)
{
    return submit(f, buf, offset, opts, out, true);
}

int ft_req_poll(ft_req *req)
{
    return req && atomic_load_explicit(&req->done, memory_order_acquire);
}

int64_t ft_req_wait(ft_req *req)
{
    if (!req)
        return ft__err(-EINVAL, "ft_req_wait: request is NULL");
    pthread_mutex_lock(&req->lock);
    while (!atomic_load_explicit(&req->done, memory_order_acquire))
        pthread_cond_wait(&req->cond, &req->lock);
    int64_t r = req->result;
    pthread_mutex_unlock(&req->lock);
    if (r < 0)
        ft__detail_restore(req->detail);
    return r;
}

void ft_req_free(ft_req *req)
{
    if (!req)
        return;
    FT__KEEPING_DETAIL((void)ft_req_wait(req)); /* the caller's last error stays */
    ft__cuda_event_free(req->device, req->ready);
    pthread_cond_destroy(&req->cond);
    pthread_mutex_destroy(&req->lock);
    free(req);
}
