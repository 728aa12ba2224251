/* Fault injection through the library's syscall table, for every entry: the armed op fails
 * (or is cut short, or interrupted) from its nth call on; each injected call's site is kept
 * for tests/check-fault-sites.sh. */
#include "testlib.h"
#include "../src/base/syscall.h"

#include <dlfcn.h>
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *const op_names[T_OP_COUNT] = {
    "pread", "pwrite", "uring_cqe", "fdatasync", "open", "mmap", "fallocate", "close",
    "fstat", "fstatfs", "fsync", "ftruncate", "fadvise", "munmap", "madvise", "mincore",
    "cachestat", "fcntl", "flock", "rename", "unlink", "stat", "mkdir", "opendir", "readdir",
    "kill", "lock",
    "uring_init", "uring_register_buffers", "uring_submit", "uring_wait_cqe"};

const char *t_fault_op_name(enum t_fault_op op)
{
    return (unsigned)op < T_OP_COUNT ? op_names[op] : "?";
}

static struct {
    bool on;
    enum t_fault_op op;
    enum t_fault_kind kind;
    int err;
    unsigned nth, count;
    atomic_uint calls;
    atomic_uint injected;
    uint64_t also;          /* ops that fail at every call too (1 << op) */
    atomic_uint also_injected;
} fault;

/* The error of the call being failed: the armed one's, or EIO for the others in "also". */
static _Thread_local bool failing_also;

/* ---- sites ---- */
static void sites_dump(void);
#define MAX_SITES 1024
static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static void *sites[MAX_SITES];
static unsigned nsites;

void t_fault_sites_flush(void)
{
    sites_dump();
}

static void sites_dump(void)
{
    const char *out = getenv("FT_FAULT_SITES");
    FILE *f = out && *out ? fopen(out, "a") : NULL;
    if (!f)
        return;
    for (unsigned i = 0; i < nsites; i++) {
        Dl_info di;
        if (dladdr(sites[i], &di) && di.dli_fname)
            fprintf(f, "injected %s 0x%lx\n", di.dli_fname,
                    (unsigned long)((uintptr_t)sites[i] - (uintptr_t)di.dli_fbase - 1));
    }
    fclose(f);
}

static void site_add(void *ret)
{
    static bool registered;
    pthread_mutex_lock(&sites_lock);
    if (!registered) {
        registered = true;
        atexit(sites_dump);
    }
    bool known = false;
    for (unsigned i = 0; i < nsites && !known; i++)
        known = sites[i] == ret;
    if (!known && nsites < MAX_SITES)
        sites[nsites++] = ret;
    pthread_mutex_unlock(&sites_lock);
}

/* Whether this call of @p op gets the fault; @p ret is the caller's return address. */
static bool fault_hit(enum t_fault_op op, void *ret)
{
    failing_also = false;
    if (fault.on && fault.op != op && (fault.also >> op & 1) && atomic_load(&fault.injected)) {
        atomic_fetch_add(&fault.also_injected, 1);
        site_add(ret);
        failing_also = true;
        return true;
    }
    if (!fault.on || fault.op != op)
        return false;
    unsigned call = atomic_fetch_add(&fault.calls, 1) + 1;
    if (call < fault.nth || (fault.count && call >= fault.nth + fault.count))
        return false;
    atomic_fetch_add(&fault.injected, 1);
    site_add(ret);
    return true;
}


static int fault_errno(void)
{
    if (failing_also)
        return EIO;
    return fault.kind == T_FAULT_EINTR ? EINTR : fault.err;
}

#define RET __builtin_return_address(0)

/* An entry that fails with -1 and errno. */
#define FAIL_INT(name, OP, params, args)                                                      \
    static int f_##name params                                                                \
    {                                                                                         \
        if (fault_hit(OP, RET)) {                                                             \
            errno = fault_errno();                                                            \
            return -1;                                                                        \
        }                                                                                     \
        return ft__sys_real.name args;                                                        \
    }

FAIL_INT(open, T_OP_OPEN, (const char *p, int fl, mode_t m), (p, fl, m))
FAIL_INT(fstat, T_OP_FSTAT, (int fd, struct stat *st), (fd, st))
FAIL_INT(fstatfs, T_OP_FSTATFS, (int fd, struct statfs *st), (fd, st))
FAIL_INT(fdatasync, T_OP_FDATASYNC, (int fd), (fd))
FAIL_INT(fsync, T_OP_FSYNC, (int fd), (fd))
FAIL_INT(ftruncate, T_OP_FTRUNCATE, (int fd, off_t len), (fd, len))
FAIL_INT(fallocate, T_OP_FALLOCATE, (int fd, int mode, off_t off, off_t len),
         (fd, mode, off, len))
FAIL_INT(madvise, T_OP_MADVISE, (void *a, size_t len, int adv), (a, len, adv))
FAIL_INT(mincore, T_OP_MINCORE, (void *a, size_t len, unsigned char *v), (a, len, v))
FAIL_INT(cachestat, T_OP_CACHESTAT, (int fd, uint64_t off, uint64_t len, uint64_t *c),
         (fd, off, len, c))
FAIL_INT(fcntl, T_OP_FCNTL, (int fd, int cmd, int arg), (fd, cmd, arg))
FAIL_INT(flock, T_OP_FLOCK, (int fd, int op), (fd, op))
FAIL_INT(rename, T_OP_RENAME, (const char *a, const char *b), (a, b))
FAIL_INT(unlink, T_OP_UNLINK, (const char *p), (p))
FAIL_INT(stat, T_OP_STAT, (const char *p, struct stat *st), (p, st))
FAIL_INT(mkdir, T_OP_MKDIR, (const char *p, mode_t m), (p, m))
FAIL_INT(kill, T_OP_KILL, (pid_t pid, int sig), (pid, sig))
FAIL_INT(lock, T_OP_LOCK, (int fd, int cmd, struct flock *lk), (fd, cmd, lk))

/* close and munmap do their work and then report the error (Linux frees the descriptor
 * whatever close returns; a mapping left behind would only leak). */
static int f_close(int fd)
{
    bool hit = fault_hit(T_OP_CLOSE, RET);
    int rc = ft__sys_real.close(fd);
    if (hit) {
        errno = fault_errno();
        return -1;
    }
    return rc;
}

static int f_munmap(void *a, size_t len)
{
    bool hit = fault_hit(T_OP_MUNMAP, RET);
    int rc = ft__sys_real.munmap(a, len);
    if (hit) {
        errno = fault_errno();
        return -1;
    }
    return rc;
}

static int f_fadvise(int fd, off_t off, off_t len, int advice)
{
    if (fault_hit(T_OP_FADVISE, RET))
        return fault_errno(); /* posix_fadvise returns the error */
    return ft__sys_real.fadvise(fd, off, len, advice);
}

static void *f_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (fault_hit(T_OP_MMAP, RET)) {
        errno = fault_errno();
        return MAP_FAILED;
    }
    return ft__sys_real.mmap(addr, len, prot, flags, fd, off);
}

static DIR *f_opendir(const char *p)
{
    if (fault_hit(T_OP_OPENDIR, RET)) {
        errno = fault_errno();
        return NULL;
    }
    return ft__sys_real.opendir(p);
}

static struct dirent *f_readdir(DIR *d)
{
    if (fault_hit(T_OP_READDIR, RET)) {
        errno = fault_errno();
        return NULL;
    }
    return ft__sys_real.readdir(d);
}

static ssize_t f_pread(int fd, void *buf, size_t len, off_t off)
{
    if (fault_hit(T_OP_PREAD, RET)) {
        if (failing_also || fault.kind != T_FAULT_SHORT) {
            errno = fault_errno();
            return -1;
        }
        len -= len / 2;
    }
    return ft__sys_real.pread(fd, buf, len, off);
}

static ssize_t f_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    if (fault_hit(T_OP_PWRITE, RET)) {
        if (failing_also || fault.kind != T_FAULT_SHORT) {
            errno = fault_errno();
            return -1;
        }
        len -= len / 2;
    }
    return ft__sys_real.pwrite(fd, buf, len, off);
}

/* io_uring entries follow liburing's -errno convention. */
static int f_uring_init(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
    return fault_hit(T_OP_URING_INIT, RET) ? -fault_errno()
                                            : ft__sys_real.uring_init(entries, ring, p);
}

static int f_uring_register(struct io_uring *ring, const struct iovec *iov, unsigned n)
{
    return fault_hit(T_OP_URING_REGISTER, RET)
               ? -fault_errno() : ft__sys_real.uring_register_buffers(ring, iov, n);
}

static int f_uring_submit(struct io_uring *ring)
{
    return fault_hit(T_OP_URING_SUBMIT, RET) ? -fault_errno() : ft__sys_real.uring_submit(ring);
}

/* A failed wait, or (T_OP_URING_CQE) a completion rewritten in the writable ring. */
static int f_uring_wait_cqe(struct io_uring *ring, struct io_uring_cqe **cqe)
{
    if (fault_hit(T_OP_URING_WAIT, RET))
        return -fault_errno();
    int rc = ft__sys_real.uring_wait_cqe(ring, cqe);
    if (rc == 0 && (*cqe)->res > 0 && fault_hit(T_OP_URING_CQE, RET)) {
        if (!failing_also && fault.kind == T_FAULT_SHORT)
            (*cqe)->res = (*cqe)->res > 1 ? (*cqe)->res / 2 : 1;
        else
            (*cqe)->res = -fault_errno();
    }
    return rc;
}

void t_fault_set(enum t_fault_op op, enum t_fault_kind kind, int err, unsigned nth,
                 unsigned count)
{
    ft__sys_reset();
    fault.op = op;
    fault.kind = kind;
    fault.err = err;
    fault.nth = nth;
    fault.count = count;
    atomic_store(&fault.calls, 0);
    atomic_store(&fault.injected, 0);
    atomic_store(&fault.also_injected, 0);
    fault.also = 0;
    fault.on = true;
    ft__syscalls *t = &ft__sys;
    t->open = f_open, t->close = f_close, t->pread = f_pread, t->pwrite = f_pwrite;
    t->fstat = f_fstat, t->fstatfs = f_fstatfs, t->fdatasync = f_fdatasync;
    t->fsync = f_fsync, t->ftruncate = f_ftruncate, t->fallocate = f_fallocate;
    t->fadvise = f_fadvise, t->mmap = f_mmap, t->munmap = f_munmap, t->madvise = f_madvise;
    t->mincore = f_mincore, t->cachestat = f_cachestat, t->fcntl = f_fcntl;
    t->flock = f_flock, t->lock = f_lock, t->rename = f_rename, t->unlink = f_unlink, t->stat = f_stat;
    t->mkdir = f_mkdir, t->opendir = f_opendir, t->readdir = f_readdir, t->kill = f_kill;
    t->uring_init = f_uring_init, t->uring_register_buffers = f_uring_register;
    t->uring_submit = f_uring_submit, t->uring_wait_cqe = f_uring_wait_cqe;
}

void t_fault_also(uint64_t ops)
{
    fault.also = ops;
}

unsigned t_fault_clear(void)
{
    fault.on = false;
    fault.also = 0;
    ft__sys_reset();
    return atomic_load(&fault.injected);
}

unsigned t_fault_calls(void)
{
    return atomic_load(&fault.calls);
}
