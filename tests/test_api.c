/* The API's edges: settings and environment, names, bad arguments, file errors, sizes,
 * durability calls, and filesystems without O_DIRECT; and the thread pool's queue order. */
#include "testlib.h"
#include "../src/base/base.h" /* the thread pool */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ft_ctx *ctx;

static void case_parse_size(void)
{
    uint64_t v = 0;
    T_EQ(ft_parse_size("4096", &v), 0);
    T_EQ(v, 4096);
    T_EQ(ft_parse_size("4K", &v), 0);
    T_EQ(v, 4096);
    T_EQ(ft_parse_size("64m", &v), 0);
    T_EQ(v, 64ll << 20);
    T_EQ(ft_parse_size("1GiB", &v), 0);
    T_EQ(v, 1ll << 30);
    T_EQ(ft_parse_size("2T", &v), 0);
    T_EQ(v, 2ll << 40);
    T_EQ(ft_parse_size("", &v), -EINVAL);
    T_EQ(ft_parse_size("-1", &v), -EINVAL);
    T_EQ(ft_parse_size("12Q", &v), -EINVAL);
    T_EQ(ft_parse_size("1K2", &v), -EINVAL);
    T_EQ(ft_parse_size("99999999999999999999", &v), -ERANGE);
    T_EQ(ft_parse_size("99999999999T", &v), -ERANGE);
    T_EQ(ft_parse_size(NULL, &v), -EINVAL);
}

static void case_config_env(void)
{
    ft_config cfg;
    setenv("FASTENSOR_THREADS", "3", 1);
    setenv("FASTENSOR_CHUNK_SIZE", "2M", 1);
    setenv("FASTENSOR_ENGINE", "MMAP", 1);
    T_EQ(ft_config_init(&cfg), 0);
    T_EQ(cfg.threads, 3);
    T_EQ(cfg.chunk_size, 2 << 20);
    T_EQ(cfg.engine, FT_ENGINE_MMAP);
    setenv("FASTENSOR_QUEUE_DEPTH", "lots", 1);
    T_EQ(ft_config_init(&cfg), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "FASTENSOR_QUEUE_DEPTH") != NULL);
    ft_ctx *c = NULL;
    T_EQ(ft_ctx_create(&c, NULL), -EINVAL); /* NULL settings read the environment */
    T_TRUE(c == NULL);
    unsetenv("FASTENSOR_QUEUE_DEPTH");
    setenv("FASTENSOR_ENGINE", "warp", 1);
    T_EQ(ft_config_init(&cfg), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "FASTENSOR_ENGINE") != NULL);
    unsetenv("FASTENSOR_ENGINE");
    T_EQ(ft_ctx_create(&c, NULL), 0);
    ft_config eff;
    ft_ctx_config(c, &eff);
    T_EQ(eff.threads, 3);
    T_EQ(eff.queue_depth, 16);
    ft_ctx_destroy(c);
    unsetenv("FASTENSOR_THREADS");
    unsetenv("FASTENSOR_CHUNK_SIZE");
    ft_config_init(&cfg);
    cfg.chunk_size = 1000; /* not a multiple of 4096 */
    T_EQ(ft_ctx_create(&c, &cfg), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "chunk_size") != NULL);
    ft_ctx_destroy(NULL);
}

static void case_engine_names(void)
{
    for (int e = 0; e < FT_ENGINE_COUNT; e++)
        T_EQ(ft_engine_from_name(ft_engine_name((ft_engine)e)), e);
    T_EQ(ft_engine_from_name("Direct"), FT_ENGINE_DIRECT);
    T_EQ(ft_engine_from_name("nope"), -EINVAL);
    T_EQ(ft_engine_from_name(NULL), -EINVAL);
    T_TRUE(strcmp(ft_engine_name((ft_engine)99), "unknown") == 0);
    const char *why = NULL;
    T_EQ(ft_engine_available(ctx, FT_ENGINE_POSIX, &why), 1);
    T_TRUE(why && *why == '\0');
    T_EQ(ft_engine_available(ctx, (ft_engine)99, &why), 0);
    T_TRUE(*why != '\0');
}

static void case_errors_text(void)
{
    T_TRUE(strcmp(ft_strerror(-ENOENT), "No such file or directory") == 0);
    T_TRUE(strcmp(ft_strerror(ENOENT), ft_strerror(-ENOENT)) == 0);
    T_TRUE(strcmp(ft_strerror(0), "success") == 0);
    T_TRUE(ft_strerror(-99999) != NULL);
    T_TRUE(strcmp(ft_version(), FT_VERSION_STRING) == 0);
}

static void case_open_errors(void)
{
    ft_file *f = NULL;
    T_EQ(ft_file_open(ctx, &f, t_path("missing/nothing.bin"), FT_OPEN_READ, 0), -ENOENT);
    T_TRUE(strstr(ft_last_error(), "nothing.bin") != NULL);
    T_EQ(ft_file_open(ctx, &f, t_dir(), FT_OPEN_READ, 0), -EISDIR);
    T_EQ(ft_file_open(ctx, &f, "/dev/null", FT_OPEN_READ, 0), -EINVAL);
    T_EQ(ft_file_open(ctx, &f, t_path("x"), 0, 0), -EINVAL);
    T_EQ(ft_file_open(ctx, &f, t_path("x"), FT_OPEN_READ | FT_OPEN_CREATE, 0644), -EINVAL);
    T_EQ(ft_file_open(ctx, &f, t_path("x"), FT_OPEN_READ | 0x100, 0), -EINVAL);
    T_EQ(ft_file_open(NULL, &f, t_path("x"), FT_OPEN_READ, 0), -EINVAL);
    T_EQ(ft_file_open(ctx, &f, "", FT_OPEN_READ, 0), -EINVAL);
    T_TRUE(f == NULL);
    T_EQ(ft_file_close(NULL), 0);

    /* EXCL on an existing file fails and leaves its bytes alone. */
    const char *keep = t_path("keep.bin");
    int fd = open(keep, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    T_EQ(write(fd, "precious", 8), 8);
    close(fd);
    T_EQ(ft_file_open(ctx, &f, keep, FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_EXCL, 0644),
         -EEXIST);
    struct stat st;
    T_EQ(stat(keep, &st), 0);
    T_EQ(st.st_size, 8);
}

/* Permissions, checked as an unprivileged user in a child (root bypasses them). */
static void case_permissions(void)
{
    const char *p = t_path("private.bin");
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    close(fd);
    chmod(t_dir(), 0755);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && setuid(65534) != 0)
            _exit(3);
        ft_file *f;
        int rc = ft_file_open(ctx, &f, p, FT_OPEN_READ, 0);
        _exit(rc == -EACCES ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    T_TRUE(WIFEXITED(status));
    T_EQ(WEXITSTATUS(status), 0);
}

static void case_bad_transfers(void)
{
    ft_file *ro, *wo;
    const char *p = t_path("rw.bin");
    T_EQ(ft_file_open(ctx, &wo, p, FT_OPEN_WRITE | FT_OPEN_CREATE | FT_OPEN_TRUNC, 0644), 0);
    T_EQ(ft_file_open(ctx, &ro, p, FT_OPEN_READ, 0), 0);
    char buf[64] = "x";
    ft_buf b = ft_host_buf(buf, sizeof buf);
    T_EQ(ft_write(ro, &b, 0, NULL), -EBADF);
    T_EQ(ft_read(wo, &b, 0, NULL), -EBADF);
    T_EQ(ft_write(NULL, &b, 0, NULL), -EINVAL);
    T_EQ(ft_write(wo, NULL, 0, NULL), -EINVAL);
    ft_buf nul = {NULL, 10, FT_MEM_HOST, 0};
    T_EQ(ft_write(wo, &nul, 0, NULL), -EFAULT);
    ft_buf weird = {buf, 10, (ft_mem_kind)7, 0};
    T_EQ(ft_write(wo, &weird, 0, NULL), -EINVAL);
    T_EQ(ft_write(wo, &b, UINT64_MAX - 10, NULL), -EFBIG);
    ft_io_opts bad_engine = {.engine = (ft_engine)42};
    T_EQ(ft_write(wo, &b, 0, &bad_engine), -EINVAL);
    ft_io_opts bad_flags = {.flags = 0x80};
    T_EQ(ft_write(wo, &b, 0, &bad_flags), -EINVAL);
    ft_buf empty = {NULL, 0, FT_MEM_HOST, 0};
    T_EQ(ft_write(wo, &empty, 0, NULL), 0);
    T_EQ(ft_file_size(ro), 0); /* nothing was written by any of the above */
    /* A write-only file still works with every engine (mmap falls back to pwrite). */
    for (int e = 1; e < FT_ENGINE_COUNT; e++) {
        ft_io_opts o = {.engine = (ft_engine)e};
        T_EQ(ft_write(wo, &b, (uint64_t)e * 100, &o), sizeof buf);
    }
    T_EQ(ft_file_truncate(ro, 0), -EBADF);
    ft_file_close(ro);
    ft_file_close(wo);
}

static void case_size_sync_allocate(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("size.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                       FT_OPEN_CREATE, 0644), 0);
    T_TRUE(strstr(ft_file_path(f), "size.bin") != NULL);
    T_EQ(ft_file_size(f), 0);
    T_EQ(ft_file_allocate(f, 0, 1 << 20), 0);
    T_EQ(ft_file_size(f), 1 << 20);
    T_EQ(ft_file_truncate(f, 12345), 0);
    T_EQ(ft_file_size(f), 12345);
    char buf[100];
    t_fill_random(buf, sizeof buf, 5);
    ft_buf b = ft_host_buf(buf, sizeof buf);
    ft_io_opts o = {.flags = FT_IO_SYNC};
    T_EQ(ft_write(f, &b, 20000, &o), 100);
    T_EQ(ft_file_size(f), 20100);
    o.flags = FT_IO_SYNC_LATER; /* the caller syncs */
    T_EQ(ft_write(f, &b, 20100, &o), 100);
    T_EQ(ft_file_size(f), 20200);
    T_EQ(ft_file_sync(f), 0);
    T_EQ(ft_file_size(NULL), -EINVAL);
    T_EQ(ft_file_sync(NULL), -EINVAL);
    ft_file_close(f);
}

/* A filesystem without O_DIRECT (its open fails with EINVAL, as on older tmpfs): the O_DIRECT
 * engines say so, AUTO falls back to buffered I/O. */
static void case_no_odirect(void)
{
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("nodirect.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                           FT_OPEN_CREATE, 0600), 0);
    size_t n = 3 << 20;
    uint8_t *src = malloc(n), *dst = malloc(n);
    t_fill_random(src, n, 11);
    ft_buf b = ft_host_buf(src, n), d = ft_host_buf(dst, n);
    t_fault_set(T_OP_OPEN, T_FAULT_ERRNO, EINVAL, 1, 0); /* every O_DIRECT open */
    ft_io_opts direct = {.engine = FT_ENGINE_DIRECT}, uring = {.engine = FT_ENGINE_URING};
    T_EQ(ft_write(f, &b, 0, &direct), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "O_DIRECT") != NULL);
    T_EQ(ft_read(f, &d, 0, &uring), 0); /* file still empty: nothing to read */
    T_EQ(ft_write(f, &b, 0, &uring), -EINVAL);
    T_EQ(ft_write(f, &b, 0, NULL), n);
    T_EQ(ft_read(f, &d, 0, NULL), n);
    T_TRUE(t_fault_clear() >= 1);
    T_MEMEQ(src, dst, n);
    ft_file_close(f);
    free(src);
    free(dst);
}

/* The pool: a thread's groups queued ahead (ft__pool_first) are the next free worker's. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool worker_go, a_started, a_go, b1_ran, b1_in_time;
    ft__pool *pool;
} pool_gates;

static void wait_gate(pool_gates *g, const bool *flag, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&g->lock);
    while (!*flag && pthread_cond_timedwait(&g->cond, &g->lock, &until) == 0)
        ;
    pthread_mutex_unlock(&g->lock);
}

static void open_gate(pool_gates *g, bool *flag)
{
    pthread_mutex_lock(&g->lock);
    *flag = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void hold_worker(void *arg)
{
    pool_gates *g = arg;
    wait_gate(g, &g->worker_go, 30);
}

static int64_t task_a(void *arg, unsigned i)
{
    pool_gates *g = arg;
    if (i == 0)
        open_gate(g, &g->a_started);
    wait_gate(g, &g->a_go, 30);
    return 0;
}

static void *run_a(void *arg)
{
    pool_gates *g = arg;
    int64_t results[3];
    ft__pool_run(g->pool, 3, task_a, g, results);
    return NULL;
}

/* B0 (run by its caller) frees the worker and waits for B1, which only the worker can run:
 * in time when B1 is ahead of A's queued tasks (each of which holds the worker). */
static int64_t task_b(void *arg, unsigned i)
{
    pool_gates *g = arg;
    if (i == 1) {
        open_gate(g, &g->b1_ran);
        return 0;
    }
    open_gate(g, &g->worker_go);
    wait_gate(g, &g->b1_ran, 5);
    pthread_mutex_lock(&g->lock);
    g->b1_in_time = g->b1_ran; /* (late, B1 runs on this thread after B0) */
    pthread_mutex_unlock(&g->lock);
    return 0;
}

static void case_pool_first(void)
{
    pool_gates g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    T_EQ(ft__pool_create(&g.pool, 1), 0);
    T_EQ(ft__pool_post(g.pool, hold_worker, &g), 0);
    pthread_t a;
    T_EQ(pthread_create(&a, NULL, run_a, &g), 0);
    wait_gate(&g, &g.a_started, 30); /* A0 runs on A's thread; A1, A2 are queued */
    T_TRUE(g.a_started);
    T_EQ(ft__pool_first(true), false);
    int64_t results[2];
    T_EQ(ft__pool_run(g.pool, 2, task_b, &g, results), 0);
    T_EQ(ft__pool_first(false), true);
    bool in_time = g.b1_in_time;
    open_gate(&g, &g.a_go);
    pthread_join(a, NULL);
    ft__pool_destroy(g.pool);
    T_TRUE(in_time);
}

int main(void)
{
    ctx = t_ctx(2);
    const t_case cases[] = {
        {"ft_parse_size", case_parse_size},
        {"the pool runs a thread's groups queued ahead first", case_pool_first},
        {"settings from FASTENSOR_* and validation", case_config_env},
        {"engine names and availability", case_engine_names},
        {"ft_strerror, ft_version", case_errors_text},
        {"open errors name the path; EXCL keeps the file", case_open_errors},
        {"permission denied as an unprivileged user", case_permissions},
        {"bad transfers are refused without touching the file", case_bad_transfers},
        {"size, truncate, allocate, sync, FT_IO_SYNC", case_size_sync_allocate},
        {"no O_DIRECT: clear error, AUTO falls back", case_no_odirect},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
