/* Injected faults through the syscall table: every engine returns a clean -errno on EIO and
 * ENOSPC, survives EINTR and short transfers with the right bytes, and stays usable after. */
#include "testlib.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ft_ctx *ctx;
static const ft_engine engines[] = {FT_ENGINE_POSIX, FT_ENGINE_DIRECT, FT_ENGINE_URING,
                                    FT_ENGINE_MMAP};

/* Big enough for edges, a middle and several pieces; unaligned on both sides. */
#define SIZE ((size_t)(3u << 20) + 5)
#define OFF 4095u

typedef struct {
    enum t_fault_op op;
    enum t_fault_kind kind;
    int err;
    unsigned nth, count;
    bool write;
} fault_spec;

/* Run one transfer under @p fs. @p expect: 0 = must succeed with the right bytes, else the
 * -errno it must fail with. The fault must really have fired. */
static void fault_run(ft_engine e, const fault_spec *fs, int expect)
{
    static uint64_t seed = 1;
    const char *path = t_path("fault.bin");
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE |
                                         FT_OPEN_TRUNC, 0644), 0);
    uint8_t *src = malloc(SIZE), *dst = malloc(SIZE);
    t_fill_random(src, SIZE, seed++);
    memset(dst, 0, SIZE);
    ft_buf b = ft_host_buf(src, SIZE), d = ft_host_buf(dst, SIZE);
    ft_io_opts o = {.engine = e};
    if (!fs->write)
        T_EQ(ft_write(f, &b, OFF, NULL), SIZE);
    t_fault_set(fs->op, fs->kind, fs->err, fs->nth, fs->count);
    int64_t r = fs->write ? ft_write(f, &b, OFF, &o) : ft_read(f, &d, OFF, &o);
    unsigned injected = t_fault_clear();
    const char *detail = ft_last_error();
    char what[96];
    snprintf(what, sizeof what, "%s %s", ft_engine_name(e), fs->write ? "write" : "read");
    if (injected == 0) {
        ft_file_close(f);
        T_FAIL("%s: the fault never fired", what);
    }
    if (expect) {
        if (r != expect)
            T_FAIL("%s: returned %lld, expected %d (%s)", what, (long long)r, expect,
                   ft_strerror(expect));
        if (!*detail)
            T_FAIL("%s: no detail message", what);
    } else if (r != (int64_t)SIZE) {
        T_FAIL("%s: returned %lld, expected %zu", what, (long long)r, SIZE);
    }
    /* Whatever happened, the file and the context still work. */
    T_EQ(ft_write(f, &b, OFF, &o), SIZE);
    T_EQ(ft_read(f, &d, OFF, &o), SIZE);
    T_MEMEQ(src, dst, SIZE);
    ft_file_close(f);
    free(src);
    free(dst);
}

static enum t_fault_op rw_op(ft_engine e, bool write)
{
    if (e == FT_ENGINE_URING)
        return T_OP_URING_CQE;
    return write ? T_OP_PWRITE : T_OP_PREAD;
}

static void case_eio(void)
{
    for (size_t i = 0; i < 3; i++) { /* mmap does no read/write calls */
        ft_engine e = engines[i];
        fault_run(e, &(fault_spec){rw_op(e, false), T_FAULT_ERRNO, EIO, 2, 1, false}, -EIO);
        fault_run(e, &(fault_spec){rw_op(e, true), T_FAULT_ERRNO, EIO, 2, 1, true}, -EIO);
    }
}

static void case_enospc(void)
{
    for (size_t i = 0; i < 3; i++) {
        ft_engine e = engines[i];
        fault_run(e, &(fault_spec){rw_op(e, true), T_FAULT_ERRNO, ENOSPC, 1, 0, true},
                  -ENOSPC);
    }
    /* mmap reserves blocks first: a full disk is an error, not a SIGBUS. */
    fault_run(FT_ENGINE_MMAP, &(fault_spec){T_OP_FALLOCATE, T_FAULT_ERRNO, ENOSPC, 1, 0, true},
              -ENOSPC);
}

static void case_eintr(void)
{
    for (size_t i = 0; i < 3; i++) {
        ft_engine e = engines[i];
        fault_run(e, &(fault_spec){rw_op(e, false), T_FAULT_EINTR, 0, 1, 3, false}, 0);
        fault_run(e, &(fault_spec){rw_op(e, true), T_FAULT_EINTR, 0, 1, 3, true}, 0);
    }
}

static void case_short(void)
{
    for (size_t i = 0; i < 3; i++) {
        ft_engine e = engines[i];
        fault_run(e, &(fault_spec){rw_op(e, false), T_FAULT_SHORT, 0, 1, 0, false}, 0);
        fault_run(e, &(fault_spec){rw_op(e, true), T_FAULT_SHORT, 0, 1, 0, true}, 0);
    }
}

static void case_mmap_fails(void)
{
    fault_run(FT_ENGINE_MMAP, &(fault_spec){T_OP_MMAP, T_FAULT_ERRNO, ENOMEM, 1, 1, false},
              -ENOMEM);
    fault_run(FT_ENGINE_MMAP, &(fault_spec){T_OP_MMAP, T_FAULT_ERRNO, ENOMEM, 1, 1, true},
              -ENOMEM);
}

static void case_sync_fails(void)
{
    const char *path = t_path("sync.bin");
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
    char buf[100] = "data";
    ft_buf b = ft_host_buf(buf, sizeof buf);
    ft_io_opts o = {.engine = FT_ENGINE_POSIX, .flags = FT_IO_SYNC};
    t_fault_set(T_OP_FDATASYNC, T_FAULT_ERRNO, EIO, 1, 1);
    int64_t r = ft_write(f, &b, 0, &o);
    unsigned injected = t_fault_clear();
    T_EQ(injected, 1);
    T_EQ(r, -EIO);
    T_TRUE(strstr(ft_last_error(), "fdatasync") != NULL);
    t_fault_set(T_OP_FDATASYNC, T_FAULT_EINTR, 0, 1, 2);
    r = ft_write(f, &b, 0, &o);
    T_EQ(t_fault_clear(), 2);
    T_EQ(r, sizeof buf);
    ft_file_close(f);
}

/* Energy counters that cannot be listed are reported as unreadable, never an error; the
 * listing's entries fail the same way. */
static void case_energy_unreadable(void)
{
    ft_energy e;
    t_fault_set(T_OP_OPENDIR, T_FAULT_ERRNO, EACCES, 1, 0);
    T_EQ(ft_energy_sample(&e), 0);
    T_TRUE(t_fault_clear() >= 1);
    T_EQ(e.cpu_valid, 0);
    T_EQ(e.cpu_joules, 0.0);
    ft_energy clean;
    T_EQ(ft_energy_sample(&clean), 0); /* the listing itself failing, where it exists */
    t_fault_set(T_OP_READDIR, T_FAULT_ERRNO, EIO, 1, 0);
    T_EQ(ft_energy_sample(&e), 0);
    unsigned listed = t_fault_clear();
    printf("  powercap %s; readdir failed %u times\n", clean.cpu_valid ? "readable" : "absent",
           listed);
    if (listed)
        T_EQ(e.cpu_valid, 0);
    T_EQ(ft_energy_sample(NULL), -EINVAL);
}

static void case_open_fails(void)
{
    ft_file *f = NULL;
    t_fault_set(T_OP_OPEN, T_FAULT_ERRNO, EMFILE, 1, 1);
    int rc = ft_file_open(ctx, &f, t_path("open.bin"), FT_OPEN_WRITE | FT_OPEN_CREATE, 0644);
    T_EQ(t_fault_clear(), 1);
    T_EQ(rc, -EMFILE);
    T_TRUE(f == NULL);
    T_TRUE(strstr(ft_last_error(), "open.bin") != NULL);
    /* The O_DIRECT descriptor is opened on first use: its failure is the call's error. */
    T_EQ(ft_file_open(ctx, &f, t_path("open.bin"), FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
    char buf[8192] = {1};
    ft_buf b = ft_host_buf(buf, sizeof buf);
    ft_io_opts o = {.engine = FT_ENGINE_DIRECT};
    t_fault_set(T_OP_OPEN, T_FAULT_ERRNO, ENFILE, 1, 0);
    int64_t r = ft_write(f, &b, 0, &o);
    t_fault_clear();
    T_EQ(r, -ENFILE);
    ft_file_close(f);
}

/* In a child: one AUTO read and one mmap read of random bytes with a new context; a
 * fault set by @p arm is injected from the read on. @return 0 when both gave the bytes. */
static int reads_under(enum t_fault_op op, const char *label)
{
    ft_ctx *c;
    if (ft_ctx_create(&c, NULL) < 0)
        return 1;
    size_t n = (2u << 20) + 3;
    uint8_t *src = malloc(n), *dst = malloc(n);
    t_fill_random(src, n, 99);
    ft_file *f = NULL;
    ft_buf d = ft_host_buf(dst, n);
    /* written around the library: its first call (a named engine's is AUTO's sample too) is
     * the read under the fault, which loads the profile and opens the trace */
    int fd = open(t_path("settings.bin"), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    int bad = fd < 0 || write(fd, src, n) != (ssize_t)n;
    if (fd >= 0)
        close(fd);
    bad = bad || ft_file_open(c, &f, t_path("settings.bin"), FT_OPEN_READ, 0644) != 0;
    t_fault_set(op, T_FAULT_ERRNO, EACCES, 1, 0);
    for (int e = 0; !bad && e < 2; e++) {
        memset(dst, 0, n);
        ft_io_opts o = {.engine = e ? FT_ENGINE_MMAP : FT_ENGINE_AUTO};
        bad = ft_read(f, &d, 0, &o) != (int64_t)n || memcmp(src, dst, n) != 0;
    }
    unsigned hit = t_fault_clear();
    printf("  %s: %u %s calls failed, reads %s\n", label, hit, t_fault_op_name(op),
           bad ? "WRONG" : "right");
    ft_file_close(f);
    ft_ctx_destroy(c);
    free(src);
    free(dst);
    return bad || !hit;
}

/* Run @p body in a forked child (settings read once per process start fresh there) and
 * expect it to exit 0. */
static void in_child(int (*body)(void))
{
    if (!t_fork_threads_ok())
        return;
    pid_t pid = fork();
    T_TRUE(pid >= 0);
    if (pid == 0) {
        int bad = body();
        t_fault_sites_flush();
        fflush(stdout);
        _exit(bad);
    }
    int status;
    T_EQ(waitpid(pid, &status, 0), pid);
    T_TRUE(WIFEXITED(status));
    T_EQ(WEXITSTATUS(status), 0);
}

static int settings_fail_body(void)
{
    setenv("FASTENSOR_QUIET", "1", 1);
    setenv("FASTENSOR_PROFILE", "off", 1);
    setenv("FASTENSOR_TRACE", t_path("trace.txt"), 1);
    int bad = reads_under(T_OP_OPEN, "trace file and THP setting unreadable");
    struct stat st;
    bad |= stat(t_path("trace.txt"), &st) == 0; /* nothing traced, nothing created */
    setenv("FASTENSOR_PROFILE", t_dir(), 1);
    bad |= reads_under(T_OP_STAT, "profile directory's stat fails");
    unsetenv("FASTENSOR_PROFILE");
    setenv("XDG_CACHE_HOME", t_path("xdg-cache"), 1);
    bad |= reads_under(T_OP_MKDIR, "profile directory cannot be made");
    bad |= stat(t_path("xdg-cache"), &st) == 0;
    return bad;
}

/* What the library reads for itself besides the transfer: the profile directory (its
 * stat, and the mkdir of the default one), the FASTENSOR_TRACE file and the transparent huge
 * page setting. Each failing costs that setting only (no profile kept, no trace, no huge
 * page advice); the transfers give the right bytes. */
static void case_settings_fail(void)
{
    in_child(settings_fail_body);
}

static int settings_close_body(void)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    return reads_under(T_OP_CLOSE, "closes fail");
}

/* The huge-page setting's descriptor failing to close costs nothing. */
static void case_settings_close_fails(void)
{
    in_child(settings_close_body);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    /* First, while this process has one thread: a child forked while other threads start up
     * can inherit a held allocator lock (seen under AddressSanitizer). */
    const t_case forked[] = {
        {"settings that cannot be read: profile directory, trace file, THP", case_settings_fail},
        {"the huge-page setting's descriptor fails to close", case_settings_close_fails},
    };
    int frc = t_run(forked, sizeof forked / sizeof *forked);
    /* Small chunks and bounce buffers: a transfer makes many calls to inject into. */
    ft_config cfg;
    ft_config_init(&cfg);
    cfg.threads = 4;
    cfg.chunk_size = cfg.bounce_size = 256u << 10;
    cfg.queue_depth = 4;
    T_ASSERT_OK(ft_ctx_create(&ctx, &cfg));
    if (!ft_engine_available(ctx, FT_ENGINE_URING, NULL))
        printf("  note: io_uring unavailable here; the uring cases exercise its fallback\n");
    const t_case cases[] = {
        {"EIO mid-transfer: clean -EIO, usable after", case_eio},
        {"ENOSPC on write: clean -ENOSPC", case_enospc},
        {"EINTR is retried: right bytes", case_eintr},
        {"short transfers are continued: right bytes", case_short},
        {"mmap failure: clean -ENOMEM", case_mmap_fails},
        {"fdatasync failure and EINTR under FT_IO_SYNC", case_sync_fails},
        {"open failures (buffered and O_DIRECT)", case_open_fails},
        {"energy counters that cannot be listed", case_energy_unreadable},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc ? rc : frc;
}
