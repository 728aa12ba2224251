/* Asynchronous requests: many at once from several threads, poll/wait/free semantics,
 * errors delivered at wait. */
#include "testlib.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

static ft_ctx *ctx;

#define THREADS 4
#define REQS 8
#define PIECE ((size_t)(1u << 20) + 17)

typedef struct {
    unsigned id;
    int failures;
    char why[256];
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    char name[64];
    snprintf(name, sizeof name, "async-%u.bin", w->id);
    ft_file *f;
    if (ft_file_open(ctx, &f, t_path(name), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                                FT_OPEN_TRUNC, 0644) < 0) {
        snprintf(w->why, sizeof w->why, "open: %s", ft_last_error());
        w->failures++;
        return NULL;
    }
    uint8_t *src = malloc(REQS * PIECE), *dst = calloc(REQS, PIECE);
    t_fill_random(src, REQS * PIECE, w->id + 1);
    ft_req *reqs[REQS];
    const ft_engine engines[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT, FT_ENGINE_URING,
                                 FT_ENGINE_MMAP};
    for (unsigned i = 0; i < REQS; i++) { /* all writes in flight at once, mixed engines */
        ft_buf b = ft_host_buf(src + i * PIECE, PIECE);
        ft_io_opts o = {.engine = engines[(i + w->id) % 4]};
        if (ft_submit_write(f, &b, i * PIECE, &o, &reqs[i]) < 0) {
            w->failures++;
            return NULL;
        }
    }
    for (unsigned i = 0; i < REQS; i++) {
        if (ft_req_wait(reqs[i]) != (int64_t)PIECE)
            w->failures++;
        ft_req_free(reqs[i]);
    }
    for (unsigned i = 0; i < REQS; i++) {
        ft_buf d = ft_host_buf(dst + i * PIECE, PIECE);
        ft_io_opts o = {.engine = engines[(i + w->id + 1) % 4]};
        if (ft_submit_read(f, &d, i * PIECE, &o, &reqs[i]) < 0) {
            w->failures++;
            return NULL;
        }
    }
    for (int i = REQS - 1; i >= 0; i--) { /* waited in reverse, polled first */
        while (!ft_req_poll(reqs[i]))
            usleep(100);
        if (ft_req_wait(reqs[i]) != (int64_t)PIECE)
            w->failures++;
        ft_req_free(reqs[i]);
    }
    size_t at = t_first_diff(src, dst, REQS * PIECE);
    if (at != (size_t)-1) {
        snprintf(w->why, sizeof w->why, "data differs at byte %zu", at);
        w->failures++;
    }
    ft_file_close(f);
    free(src);
    free(dst);
    return NULL;
}

static void case_many_threads(void)
{
    pthread_t th[THREADS];
    worker w[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        w[i] = (worker){.id = i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (unsigned i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    for (unsigned i = 0; i < THREADS; i++)
        if (w[i].failures)
            T_FAIL("thread %u: %d failures (%s)", i, w[i].failures, w[i].why);
}

static void case_wait_semantics(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("sem.bin"), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                      0644), 0);
    char buf[4096];
    t_fill_random(buf, sizeof buf, 3);
    ft_buf b = ft_host_buf(buf, sizeof buf);
    ft_req *r;
    T_EQ(ft_submit_write(f, &b, 0, NULL, &r), 0);
    T_EQ(ft_req_wait(r), sizeof buf);
    T_EQ(ft_req_poll(r), 1);
    T_EQ(ft_req_wait(r), sizeof buf); /* waiting again gives the same result */
    ft_req_free(r);
    T_EQ(ft_submit_read(f, &b, 0, NULL, &r), 0);
    ft_req_free(r); /* freeing an unwaited request waits for it */
    ft_req_free(NULL);
    T_EQ(ft_req_wait(NULL), -EINVAL);
    T_EQ(ft_req_poll(NULL), 0);
    ft_file_close(f);
}

static void case_errors(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("err.bin"), FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
    char buf[8192];
    ft_buf b = ft_host_buf(buf, sizeof buf);
    ft_req *r = NULL;
    /* Checked at submit: not readable. */
    T_EQ(ft_submit_read(f, &b, 0, NULL, &r), -EBADF);
    T_TRUE(r == NULL);
    /* Failing at run time: the error and its detail arrive at wait. */
    ft_io_opts o = {.engine = FT_ENGINE_POSIX};
    t_fault_set(T_OP_PWRITE, T_FAULT_ERRNO, ENOSPC, 1, 0);
    T_EQ(ft_submit_write(f, &b, 0, &o, &r), 0);
    int64_t res = ft_req_wait(r);
    t_fault_clear();
    T_EQ(res, -ENOSPC);
    T_TRUE(strstr(ft_last_error(), "pwrite") != NULL);
    ft_req_free(r);
    T_TRUE(strstr(ft_last_error(), "pwrite") != NULL); /* free keeps the caller's detail */
    ft_file_close(f);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(4);
    const t_case cases[] = {
        {"4 threads x 8 requests in flight, every engine", case_many_threads},
        {"poll, wait twice, free without wait, NULL", case_wait_semantics},
        {"errors at submit and at wait", case_errors},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
