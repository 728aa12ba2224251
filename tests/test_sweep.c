/*
 * Fault sweeps: for each operation (single and sharded saves, a save replacing the other
 * form, load, verify, the engines' reads and writes, the spill store, gc, AUTO with its
 * profile) and each entry of the syscall table, fail the 1st, 2nd, ... call (EIO, and the
 * errors a site treats apart: ENOSPC, ENOENT, EOPNOTSUPP, ENOSYS; EINTR; short transfers)
 * until the operation runs clean. After each run: the return value is a count, 0,
 * FT_SAVE_WARNING or -errno with a detail; a failed save left the previous checkpoint
 * installed and nothing of its own; a successful one installed the new checkpoint whole;
 * reads return the right bytes or an error; the context and the store work afterwards.
 * FT_SWEEP_FULL=1 (make check-faults) sweeps every call; otherwise calls past the 24th are
 * sampled with a stride, to bound the time.
 */
#include "fixture.h"
#include "../src/core/internal.h" /* select.h, and the files AUTO wires to */
#include "../src/ckpt/ckpt.h" /* ft__fst_probe_shift */

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ft_ctx *ctx;
static fx_state *st;
static char dir[4200], path[4300], index_[4400], data_file[4400];
static unsigned runs, injected_runs;
static bool full, verbose;
#define SHARD (12u << 10)

/* ---- operations: prepare (no faults), run (faulted), judge (no faults) ---- */

typedef struct op {
    const char *name;
    void (*prep)(void);
    int64_t (*run)(void);
    bool (*judge)(int64_t rc);
} op;

static void clear_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4600];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
}

static void prep_single(void)
{
    clear_dir();
    fx_save(ctx, st, path, 0, 0);
}

static void prep_sharded(void)
{
    clear_dir();
    fx_save(ctx, st, path, 0, SHARD);
}

static int64_t run_save_single(void)
{
    return fx_save(ctx, st, path, 1, 0);
}

static int64_t run_save_sharded(void)
{
    return fx_save(ctx, st, path, 1, SHARD);
}

static uint64_t also_now; /* the cleanups failing in this run (see alsos) */


/* Remove what remove_recognisable_leftovers would, but not the names in @p keep (a listing). */
static void remove_listed_except(const char *keep)
{
    if (!keep)
        return;
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4600], line[300];
    while (d && (e = readdir(d))) {
        snprintf(line, sizeof line, "%s\n", e->d_name);
        size_t len = strlen(e->d_name);
        bool gen = len > 36 && strstr(e->d_name, "-of-") && e->d_name[len - 21] == '.';
        if ((strstr(e->d_name, ".fastensor-tmp-") || gen) && !strstr(keep, line)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    if (d)
        closedir(d);
}

/* A save's outcome: failed with the old checkpoint (at @p old) alone in the directory, or
 * installed the new one (at @p now) whole; after a warning, the next save cleans up. */
static bool judge_save(int64_t rc, const char *old, const char *now, uint64_t shard)
{
    if (rc < 0) {
        if (!*ft_last_error())
            return fprintf(stderr, "  an error without a detail\n"), false;
        if (fx_which(ctx, st, old) != 0)
            return fprintf(stderr, "  the previous checkpoint is gone: %s\n", ft_last_error()),
                   false;
        if (also_now >> T_OP_UNLINK & 1) { /* the old one's files are still listed: keep */
            char *keep = fx_expected(ctx, old);
            remove_listed_except(keep);
            free(keep);
        }
        return fx_only(ctx, dir, old);
    }
    if (rc != 0 && rc != FT_SAVE_WARNING)
        return fprintf(stderr, "  save returned %lld\n", (long long)rc), false;
    if (fx_which(ctx, st, now) != 1)
        return fprintf(stderr, "  the new checkpoint is not whole: %s\n", ft_last_error()),
               false;
    if (rc == FT_SAVE_WARNING && fx_save(ctx, st, path, 1, shard) != 0)
        return false;
    if (!fx_only(ctx, dir, now) && also_now) /* the next unfaulted save cleans up */
        return fx_save(ctx, st, path, 1, shard) == 0 && fx_only(ctx, dir, now);
    return fx_only(ctx, dir, now);
}

static bool judge_single(int64_t rc)
{
    return judge_save(rc, path, path, 0);
}

static bool judge_sharded(int64_t rc)
{
    return judge_save(rc, index_, index_, SHARD);
}

static bool judge_to_sharded(int64_t rc)
{
    return judge_save(rc, path, index_, SHARD);
}

static bool judge_to_single(int64_t rc)
{
    return judge_save(rc, index_, path, 0);
}

/* Loads of version 0: every tensor, one tensor verified, the checkpoint verified. */
static void prep_loaded(void)
{
    struct stat s;
    if (stat(index_, &s) != 0)
        prep_sharded();
}

static int64_t run_load(void)
{
    int v = fx_which(ctx, st, dir);
    return v == 0 ? 0 : v < 0 && v != -100 ? v : -1000;
}

static int64_t run_load_one(void)
{
    ft_ckpt *c;
    int rc = ft_ckpt_open(ctx, &c, index_);
    if (rc < 0)
        return rc;
    int64_t k = ft_ckpt_find(c, st->names[6]);
    const ft_tensor *want = &st->t[0][6];
    uint8_t *buf = malloc(want->data.len + 1);
    ft_buf b = ft_host_buf(buf, want->data.len);
    ft_load_opts lo = {.flags = FT_LOAD_VERIFY};
    int64_t r = k < 0 ? k : ft_ckpt_load_tensor(c, (size_t)k, &b, &lo);
    if (r >= 0)
        r = r == (int64_t)want->data.len && !memcmp(buf, want->data.ptr, want->data.len)
                ? 0 : -1000;
    if (r == 0)
        r = ft_ckpt_verify(c, NULL, NULL, NULL);
    free(buf);
    ft_ckpt_close(c);
    return r;
}

static bool judge_read(int64_t rc)
{
    if (rc == -1000)
        return fprintf(stderr, "  wrong bytes came back\n"), false;
    if (rc < 0 && !*ft_last_error())
        return fprintf(stderr, "  an error without a detail\n"), false;
    return run_load() == 0; /* and loads work again */
}

/* The engines: a write and a read of an unaligned range. */
#define RW_LEN ((size_t)(300u << 10) + 7)
static uint8_t *rw_src, *rw_dst;

static void prep_rw(void)
{
    memset(rw_dst, 0, RW_LEN);
}

static int64_t run_rw(ft_engine e, bool write)
{
    ft_file *f;
    int rc = ft_file_open(ctx, &f, data_file, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                          0644);
    if (rc < 0)
        return rc;
    ft_buf s = ft_host_buf(rw_src, RW_LEN), d = ft_host_buf(rw_dst, RW_LEN);
    ft_io_opts o = {.engine = e};
    int64_t r = write ? ft_write(f, &s, 4097, &o) : ft_read(f, &d, 4097, &o);
    if (r >= 0 && write) { /* read back unfaulted below: only the count matters here */
        r = r == (int64_t)RW_LEN ? 0 : -1000;
    } else if (r >= 0) {
        r = r == (int64_t)RW_LEN && !memcmp(rw_src, rw_dst, RW_LEN) ? 0 : -1000;
    }
    int crc = ft_file_close(f);
    return r < 0 ? r : crc;
}

#define RW_OPS(tag, engine)                                                                   \
    static int64_t run_read_##tag(void) { return run_rw(engine, false); }                    \
    static int64_t run_write_##tag(void) { return run_rw(engine, true); }
RW_OPS(posix, FT_ENGINE_POSIX)
RW_OPS(direct, FT_ENGINE_DIRECT)
RW_OPS(uring, FT_ENGINE_URING)
RW_OPS(mmap, FT_ENGINE_MMAP)
RW_OPS(auto, FT_ENGINE_AUTO)

/* After any write, faulted or not, an unfaulted write and read give the right bytes. */
static bool judge_rw(int64_t rc)
{
    if (rc == -1000)
        return fprintf(stderr, "  wrong count or bytes\n"), false;
    if (rc < 0 && !*ft_last_error())
        return fprintf(stderr, "  an error without a detail\n"), false;
    memset(rw_dst, 0, RW_LEN);
    return run_rw(FT_ENGINE_POSIX, true) == 0 && run_rw(FT_ENGINE_POSIX, false) == 0;
}

/* t_store_evict without its asserts: faults here are expected. */
static int64_t evict(ft_store *s)
{
    static uint8_t fill[1u << 20];
    ft_buf b = ft_host_buf(fill, sizeof fill);
    uint64_t key;
    int64_t r = ft_store_put(s, &b, NULL, &key);
    int64_t f = ft_store_flush(s);
    if (r == 0)
        ft_store_drop(s, key);
    return r < 0 ? r : f;
}

/* The spill store: create, put, get back, destroy. */
static int64_t run_store(void)
{
    ft_store *s;
    ft_store_opts so = {.dir = dir, .staging_bytes = 1u << 20, .engine = FT_ENGINE_DIRECT};
    int rc = ft_store_create(ctx, &s, &so);
    if (rc < 0)
        return rc;
    uint64_t keys[3];
    int64_t r = 0;
    size_t len = 200000; /* within rw_src */
    for (unsigned i = 0; i < 3 && r >= 0; i++) {
        ft_buf b = ft_host_buf(rw_src + i * 1000, len);
        r = ft_store_put(s, &b, NULL, &keys[i]);
        if (r < 0)
            keys[i] = 0;
    }
    if (r >= 0)
        r = ft_store_flush(s);
    if (r >= 0) /* push the entries out of the ring, so the gets read the file */
        r = evict(s);
    for (unsigned i = 3; r >= 0 && i-- > 0;) {
        ft_buf d = ft_host_buf(rw_dst, len);
        r = ft_store_get(s, keys[i], &d, NULL);
        if (r >= 0)
            r = ft_store_wait(s, keys[i]);
        if (r >= 0 && memcmp(rw_dst, rw_src + i * 1000, len) != 0)
            r = -1000;
    }
    ft_store_destroy(s);
    return r < 0 ? r : 0;
}

/* A spill file whose unlink failed stays until gc finds its process gone: remove ours. */
static unsigned remove_spill_leftovers(void)
{
    unsigned n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4600];
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, ".fastensor-spill-", 17) == 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            n += unlink(p) == 0;
        }
    if (d)
        closedir(d);
    return n;
}

static bool judge_store(int64_t rc)
{
    if (remove_spill_leftovers() && rc >= 0)
        return fprintf(stderr, "  a store that worked left its spill file named\n"), false;
    if (rc == -1000)
        return fprintf(stderr, "  a get returned wrong bytes\n"), false;
    if (rc < 0 && !*ft_last_error())
        return fprintf(stderr, "  an error without a detail\n"), false;
    return run_store() == 0;
}

/* gc over leftovers of a dead save. */
static void prep_gc(void)
{
    prep_loaded();
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    char p[4600];
    snprintf(p, sizeof p, "%s/model.safetensors.fastensor-tmp-%d-0", dir, (int)pid);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    close(fd);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.00c0ffee.safetensors", dir);
    fd = open(p, O_CREAT | O_WRONLY, 0644);
    close(fd);
}

static int64_t run_gc(void)
{
    return ft_ckpt_gc(ctx, dir, NULL, NULL);
}

static bool judge_gc(int64_t rc)
{
    if (rc < 0 && !*ft_last_error())
        return false;
    return fx_which(ctx, st, index_) == 0 && ft_ckpt_gc(ctx, dir, NULL, NULL) >= 0 &&
           fx_only(ctx, dir, index_);
}

/* AUTO, learning and saving its profile in a context of its own. */
static int64_t run_profile(void)
{
    char pdir[4400];
    snprintf(pdir, sizeof pdir, "%s/profiles", t_dir());
    mkdir(pdir, 0755);
    setenv("FASTENSOR_PROFILE", pdir, 1);
    ft_ctx *c2;
    ft_config cfg;
    ft_config_init(&cfg);
    cfg.threads = 2;
    int rc = ft_ctx_create(&c2, &cfg);
    if (rc < 0) {
        setenv("FASTENSOR_PROFILE", "off", 1);
        return rc;
    }
    ft_file *f = NULL;
    int64_t r = ft_file_open(c2, &f, data_file, FT_OPEN_READ, 0);
    for (unsigned i = 0; r >= 0 && i < 4; i++) {
        ft_buf d = ft_host_buf(rw_dst, RW_LEN);
        r = ft_read(f, &d, 4097, NULL);
        if (r >= 0)
            r = memcmp(rw_src, rw_dst, RW_LEN) ? -1000 : 0;
    }
    ft_file_close(f);
    if (r >= 0)
        r = ft_profile_save(c2);
    ft_ctx_destroy(c2);
    setenv("FASTENSOR_PROFILE", "off", 1);
    return r;
}

static bool judge_profile(int64_t rc)
{
    if (rc == -1000)
        return fprintf(stderr, "  wrong bytes\n"), false;
    return rc >= 0 || *ft_last_error();
}

static void prep_none(void)
{
}

/* A shard large enough for the host destination's huge-page advice and prefaulting. */
#define BIG ((size_t)6 << 20)
static uint8_t *big;
static char big_path[4400];

static void prep_big(void)
{
    struct stat s;
    if (stat(big_path, &s) == 0)
        return;
    uint64_t shape[1] = {BIG};
    ft_tensor t = {"big", FT_DTYPE_U8, 1, shape, ft_host_buf(big, BIG)};
    ft_ckpt_save(ctx, big_path, &t, 1, NULL);
}

static int64_t run_big(void)
{
    ft_ckpt *c;
    int rc = ft_ckpt_open(ctx, &c, big_path);
    if (rc < 0)
        return rc;
    int64_t r = ft_ckpt_load_all(c, NULL);
    if (r == 0)
        r = memcmp(ft_ckpt_data(c, 0), big, BIG) ? -1000 : 0;
    ft_ckpt_close(c);
    return r;
}

static bool judge_big(int64_t rc)
{
    return rc != -1000 && (rc == 0 || *ft_last_error()) && run_big() == 0;
}

/* A directory holding both forms of a name is refused, naming both. */
static void prep_both(void)
{
    prep_sharded();
    char p[4400];
    snprintf(p, sizeof p, "%s/both.safetensors", t_dir());
    fx_save(ctx, st, p, 1, 0);
    rename(p, path);
}

/* Refused (0), a whole version (a fault hid one form: 1), or an error; -1000 for a mix. */
static int64_t run_both(void)
{
    int v = fx_which(ctx, st, dir);
    if (v == -EINVAL && strstr(ft_last_error(), "two checkpoints"))
        return 0;
    return v >= 0 ? 1 : v == -100 ? -1000 : v;
}

static bool judge_both(int64_t rc)
{
    return rc != -1000 && (rc >= 0 || *ft_last_error()) && run_both() == 0;
}

static int64_t run_truncate(void)
{
    ft_file *f;
    int rc = ft_file_open(ctx, &f, data_file, FT_OPEN_READ | FT_OPEN_WRITE, 0);
    if (rc < 0)
        return rc;
    int64_t size = ft_file_size(f);
    rc = size < 0 ? (int)size : ft_file_truncate(f, (uint64_t)size + 4096);
    if (rc == 0)
        rc = ft_file_truncate(f, (uint64_t)size);
    int crc = ft_file_close(f);
    return rc < 0 ? rc : crc;
}

static bool judge_truncate(int64_t rc)
{
    return (rc == 0 || *ft_last_error()) && run_truncate() == 0;
}

/* The store with its defaults (AUTO: sized from /proc/meminfo). */
static int64_t run_store_auto(void)
{
    ft_store *s;
    ft_store_opts so = {.dir = dir, .staging_bytes = 1u << 20};
    int rc = ft_store_create(ctx, &s, &so);
    if (rc < 0)
        return rc;
    uint64_t key;
    ft_buf b = ft_host_buf(rw_src, 100000), d = ft_host_buf(rw_dst, 100000);
    int64_t r = ft_store_put(s, &b, NULL, &key);
    if (r == 0 && (r = ft_store_get(s, key, &d, NULL)) == 0 && (r = ft_store_wait(s, key)) == 0)
        r = memcmp(rw_src, rw_dst, 100000) ? -1000 : 0;
    ft_store_destroy(s);
    return r;
}

static bool judge_store_auto(int64_t rc)
{
    if (remove_spill_leftovers() && rc >= 0)
        return false;
    return rc != -1000 && (rc == 0 || *ft_last_error()) && run_store_auto() == 0;
}

/* io_uring in a fresh context: its ring made and its buffers registered under the fault. */
static int64_t run_uring_fresh(void)
{
    ft_ctx *c2;
    ft_config cfg;
    ft_config_init(&cfg);
    cfg.threads = 2;
    int rc = ft_ctx_create(&c2, &cfg);
    if (rc < 0)
        return rc;
    ft_ctx *keep = ctx;
    ctx = c2;
    int64_t r = run_rw(FT_ENGINE_URING, false);
    ctx = keep;
    ft_ctx_destroy(c2);
    return r;
}

static void prep_profile(void)
{
    ft__probe_forget(); /* /proc/meminfo is read again under the fault */
    int fd = open(data_file, O_RDONLY); /* a cold read: the objective weighs the cache room */
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static int64_t run_profile_show(void)
{
    FILE *out = fopen("/dev/null", "w");
    int rc = ft_profile_show(ctx, data_file, out);
    fclose(out);
    return rc;
}

static enum t_fault_op op_now = T_OP_COUNT; /* the call the sweep fails now */

/* Whether no file whose name holds @p a (or @p b) was left in the sweep's directory, where
 * the unlink that removes it did not fail now; any that are there are removed for the next
 * run. */
static bool no_leftovers(const char *a, const char *b)
{
    bool may = op_now == T_OP_UNLINK || (also_now >> T_OP_UNLINK & 1), left = false;
    DIR *d = opendir(dir);
    struct dirent *e;
    char gone[5000];
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, a) || (b && strstr(e->d_name, b))) {
            left = true;
            snprintf(gone, sizeof gone, "%s/%s", dir, e->d_name);
            unlink(gone);
        }
    if (d)
        closedir(d);
    return left && !may ? fprintf(stderr, "  a temporary was left behind\n"), false : true;
}

/* A .fst container: saved over the previous one (coded where the context's costs say it
 * pays), then loaded and verified. */
static char fst_path[4400];

static void prep_fst(void)
{
    ft_save_opts so = {.compression = FT_COMPRESS_ALWAYS};
    if (ft_ckpt_save(ctx, fst_path, st->t[0], FX_TENSORS, &so) != 0)
        fprintf(stderr, "  prep: %s\n", ft_last_error());
}

/* Which version the container holds (0, 1), -1 neither, or -errno. */
static int fst_which(ft_ctx *c2, bool verify)
{
    ft_ckpt *c = NULL;
    int rc = ft_ckpt_open(c2, &c, fst_path);
    ft_load_opts lo = {.flags = verify ? FT_LOAD_VERIFY : 0};
    if (rc == 0 && (rc = ft_ckpt_load_all(c, &lo)) == 0 && verify)
        rc = ft_ckpt_verify(c, NULL, NULL, NULL);
    for (int v = 0; rc == 0 && v < 2; v++) {
        bool same = ft_ckpt_count(c) == FX_TENSORS;
        for (size_t i = 0; same && i < FX_TENSORS; i++) {
            int64_t k = ft_ckpt_find(c, st->names[i]);
            const void *data = k < 0 ? NULL : ft_ckpt_data(c, (size_t)k);
            same = data && (!st->t[v][i].data.len ||
                            !memcmp(data, st->t[v][i].data.ptr, st->t[v][i].data.len));
        }
        if (same) {
            ft_ckpt_close(c);
            return v;
        }
    }
    if (rc == 0)
        rc = -1;
    ft_ckpt_close(c);
    return rc;
}

static int64_t run_fst(void)
{
    ft_fst_cost pays = {.encode = 8, .share = 0.5, .decode = 8, .write = 1, .read = 1};
    ft_fst_cost_set(ctx, dir, 4, &pays);
    ft_save_opts so = {.compression = FT_COMPRESS_AUTO};
    int rc = ft_ckpt_save(ctx, fst_path, st->t[1], FX_TENSORS, &so);
    if (rc < 0)
        return rc;
    int v = fst_which(ctx, true);
    return v == 1 ? 0 : v < 0 && v != -1 ? v : -1000;
}

static bool judge_fst(int64_t rc)
{
    if (rc == -1000)
        return fprintf(stderr, "  the container holds the wrong bytes\n"), false;
    if (rc < 0 && !*ft_last_error())
        return fprintf(stderr, "  an error without a detail\n"), false;
    int v = fst_which(ctx, false);
    if (rc < 0 && v != 0 && v != 1) /* the load may be what failed, after the save */
        return fprintf(stderr, "  the container is neither version: %d\n", v), false;
    return no_leftovers("fst.fastensor-tmp", ".fst-probe");
}

/* What coding costs, measured in a fresh context (its probe file removed, failed or not). */
static int64_t run_fst_measure(void)
{
    ft_ctx *c2;
    int rc = ft_ctx_create(&c2, NULL);
    if (rc < 0)
        return rc;
    ft_fst_cost c;
    rc = ft_fst_measure(c2, dir, 2, &c);
    if (rc == 0 && !(c.encode > 0 && c.share > 0 && c.decode > 0 && c.write > 0 && c.read > 0))
        rc = -1000;
    ft_ctx_destroy(c2);
    return rc;
}

/* A small file installed over another (ft_file_install), then a file removed
 * (ft_file_remove): the name holds the old bytes or the new, never a temporary left. */
static char inst_path[4400], gone_path[4400];

static void prep_install(void)
{
    FILE *f = fopen(inst_path, "w");
    fputs("old", f);
    fclose(f);
    f = fopen(gone_path, "w");
    fputs("gone", f);
    fclose(f);
}

static int64_t run_install(void)
{
    int rc = ft_file_install(ctx, inst_path, "new bytes", 9, 0);
    if (rc < 0)
        return rc;
    return ft_file_remove(ctx, gone_path);
}

static bool judge_install(int64_t rc)
{
    if (rc < 0 && !*ft_last_error())
        return fprintf(stderr, "  an error without a detail\n"), false;
    char got[16] = "";
    FILE *f = fopen(inst_path, "r");
    size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
    if (f)
        fclose(f);
    got[n] = '\0';
    if (strcmp(got, "old") && strcmp(got, "new bytes"))
        return fprintf(stderr, "  the file holds '%s'\n", got), false;
    if (rc >= 0 && strcmp(got, "new bytes"))
        return fprintf(stderr, "  installed, but the file holds '%s'\n", got), false;
    struct stat sb;
    if (rc == 0 && stat(gone_path, &sb) == 0)
        return fprintf(stderr, "  removed, but the file is there\n"), false;
    return no_leftovers("installed.bin.fastensor-tmp", NULL);
}

static const op ops[] = {
    {"single save over a single file", prep_single, run_save_single, judge_single},
    {"sharded save over a sharded one", prep_sharded, run_save_sharded, judge_sharded},
    {"sharded save over a single file", prep_single, run_save_sharded, judge_to_sharded},
    {"single save over a sharded one", prep_sharded, run_save_single, judge_to_single},
    {"load of every tensor, verified", prep_loaded, run_load, judge_read},
    {"load of one tensor, verify", prep_loaded, run_load_one, judge_read},
    {"posix write", prep_rw, run_write_posix, judge_rw},
    {"posix read", prep_rw, run_read_posix, judge_rw},
    {"direct write", prep_rw, run_write_direct, judge_rw},
    {"direct read", prep_rw, run_read_direct, judge_rw},
    {"uring write", prep_rw, run_write_uring, judge_rw},
    {"uring read", prep_rw, run_read_uring, judge_rw},
    {"mmap write", prep_rw, run_write_mmap, judge_rw},
    {"mmap read", prep_rw, run_read_mmap, judge_rw},
    {"auto write", prep_rw, run_write_auto, judge_rw},
    {"auto read", prep_rw, run_read_auto, judge_rw},
    {"store create, put, get", prep_none, run_store, judge_store},
    {"gc of a dead save's leftovers", prep_gc, run_gc, judge_gc},
    {"AUTO and its profile", prep_profile, run_profile, judge_profile},
    {"load of a 6 MiB shard", prep_big, run_big, judge_big},
    {"a directory with both forms", prep_both, run_both, judge_both},
    {"truncate", prep_rw, run_truncate, judge_truncate},
    {"store with its defaults", prep_none, run_store_auto, judge_store_auto},
    {"uring in a fresh context", prep_rw, run_uring_fresh, judge_rw},
    {"profile show", prep_none, run_profile_show, judge_profile},
    {".fst save over a .fst, its load", prep_fst, run_fst, judge_fst},
    {".fst costs measured", prep_none, run_fst_measure, judge_fst},
    {"a file installed, another removed", prep_install, run_install, judge_install},
};

/* The faults tried on each syscall-table entry. */
typedef struct fault_kind {
    enum t_fault_kind kind;
    int err;
    unsigned count; /* calls failed from the nth on (0: all) */
} fault_kind;

static size_t kinds_of(enum t_fault_op o, fault_kind *out)
{
    size_t n = 0;
    out[n++] = (fault_kind){T_FAULT_ERRNO, EIO, 1};
    out[n++] = (fault_kind){T_FAULT_EINTR, 0, 1};
    if (o == T_OP_PREAD || o == T_OP_PWRITE || o == T_OP_URING_CQE)
        out[n++] = (fault_kind){T_FAULT_SHORT, 0, 1};
    if (o == T_OP_PWRITE || o == T_OP_FALLOCATE || o == T_OP_URING_CQE)
        out[n++] = (fault_kind){T_FAULT_ERRNO, ENOSPC, 1};
    if (o == T_OP_OPEN || o == T_OP_STAT) {
        out[n++] = (fault_kind){T_FAULT_ERRNO, ENOENT, 1};
        out[n++] = (fault_kind){T_FAULT_ERRNO, EOPNOTSUPP, 1};
        out[n++] = (fault_kind){T_FAULT_ERRNO, EOPNOTSUPP, 0}; /* and every fallback too */
    }
    if (o == T_OP_CACHESTAT)
        out[n++] = (fault_kind){T_FAULT_ERRNO, ENOSYS, 1};
    if (o == T_OP_FALLOCATE)
        out[n++] = (fault_kind){T_FAULT_ERRNO, EOPNOTSUPP, 1};
    return n;
}

/* Calls of @p o in one clean run of @p p. */
static unsigned count_calls(const op *p, enum t_fault_op o)
{
    p->prep();
    t_fault_set(o, T_FAULT_ERRNO, EIO, UINT32_MAX, 1); /* counts, never fires */
    p->run();
    unsigned n = t_fault_calls();
    t_fault_clear();
    p->judge(0);
    return n;
}

/* The next call to fail: every one with FT_SWEEP_FULL (total 0), else the first @p lim, then
 * every 9th, and the last of @p total. */
static unsigned next_nth(unsigned nth, unsigned lim, unsigned total)
{
    if (!total || nth < lim)
        return nth + 1;
    if (nth < total && nth + 9 >= total)
        return total;
    return nth + 9;
}

/* The cleanups behind a first failure, failing too: pass 2 arms one of these with each. */
static const uint64_t alsos[] = {0, 1ull << T_OP_CLOSE | 1ull << T_OP_UNLINK, 1ull << T_OP_UNLINK,
                                 1ull << T_OP_FSTAT | 1ull << T_OP_CLOSE};

static void sweep_op(const op *p)
{
    unsigned bad = 0, ops_runs = 0;
    for (size_t a = 0; a < sizeof alsos / sizeof *alsos; a++)
        for (enum t_fault_op o = 0; o < T_OP_COUNT; o++) {
            if (alsos[a] >> o & 1)
                continue;
            fault_kind kinds[8];
            size_t nk = a ? 1 : kinds_of(o, kinds); /* pass 2: EIO, and open's fallbacks */
            if (a)
                kinds[0] = (fault_kind){T_FAULT_ERRNO, EIO, 1};
            if (a && o == T_OP_OPEN) {
                kinds[nk++] = (fault_kind){T_FAULT_ERRNO, EOPNOTSUPP, 1};
                kinds[nk++] = (fault_kind){T_FAULT_ERRNO, ENOENT, 1};
            }
            for (size_t k = 0; k < nk; k++) {
                unsigned total = full ? 0 : count_calls(p, o), lim = a ? 6 : 24;
                for (unsigned nth = 1;; nth = next_nth(nth, lim, total)) {
                    p->prep();
                    if (verbose)
                        fprintf(stderr, "  %s: %s kind %d err %d call %u also %llx\n", p->name,
                                t_fault_op_name(o), (int)kinds[k].kind, kinds[k].err, nth,
                                (unsigned long long)alsos[a]);
                    t_fault_set(o, kinds[k].kind, kinds[k].err, nth, kinds[k].count);
                    t_fault_also(alsos[a]);
                    also_now = alsos[a];
                    op_now = o;
                    int64_t rc = p->run();
                    unsigned hit = t_fault_clear();
                    runs++;
                    ops_runs++;
                    if (!p->judge(rc)) {
                        bad++;
                        fprintf(stderr, "  %s: %s %s at call %u (also %llx): rc %lld (%s)\n",
                                p->name, t_fault_op_name(o),
                                kinds[k].kind == T_FAULT_SHORT   ? "short"
                                : kinds[k].kind == T_FAULT_EINTR ? "EINTR"
                                                                 : ft_strerror(-kinds[k].err),
                                nth, (unsigned long long)alsos[a], (long long)rc,
                                ft_last_error());
                    }
                    also_now = 0;
                    if (!hit || nth > 4000 || kinds[k].count == 0)
                        break;
                    injected_runs++;
                }
            }
        }
    printf("  %-34s %5u runs, %u bad\n", p->name, ops_runs, bad);
    if (bad)
        T_FAIL("%s: %u runs judged bad", p->name, bad);
}

/* io_uring's availability is probed once per process: each fault there in a child. */
static void case_uring_probe(void)
{
    if (!t_fork_threads_ok())
        return;
    unsigned bad = 0;
    for (int err = 0; err < 3; err++)
        for (unsigned nth = 1; nth <= 2; nth++) {
            pid_t pid = fork();
            if (pid == 0) {
                t_fault_set(T_OP_URING_INIT, T_FAULT_ERRNO, err == 0 ? EIO : err == 1 ? ENOSYS
                                                                                : EPERM, nth, 1);
                ft_ctx *c2 = t_ctx(2);
                ctx = c2;
                int64_t r = run_rw(FT_ENGINE_URING, false);
                bool ok = r == 0 || (r < 0 && r != -1000 && *ft_last_error());
                ft_ctx_destroy(c2);
                t_fault_sites_flush(); /* then _exit: at exit the test directory goes */
                _exit(ok ? 0 : 1);
            }
            int status;
            waitpid(pid, &status, 0);
            bad += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
    printf("  io_uring probe under faults: 6 children, %u bad\n", bad);
    T_EQ(bad, 0);
}

#define SWEEP_CASE(i)                                                                         \
    static void case_##i(void) { sweep_op(&ops[i]); }
SWEEP_CASE(0) SWEEP_CASE(1) SWEEP_CASE(2) SWEEP_CASE(3) SWEEP_CASE(4) SWEEP_CASE(5)
SWEEP_CASE(6) SWEEP_CASE(7) SWEEP_CASE(8) SWEEP_CASE(9) SWEEP_CASE(10) SWEEP_CASE(11)
SWEEP_CASE(12) SWEEP_CASE(13) SWEEP_CASE(14) SWEEP_CASE(15) SWEEP_CASE(16) SWEEP_CASE(17)
SWEEP_CASE(18) SWEEP_CASE(19) SWEEP_CASE(20) SWEEP_CASE(21) SWEEP_CASE(22)
SWEEP_CASE(23) SWEEP_CASE(24) SWEEP_CASE(25) SWEEP_CASE(26) SWEEP_CASE(27)

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    full = getenv("FT_SWEEP_FULL") && atoi(getenv("FT_SWEEP_FULL"));
    verbose = getenv("FT_SWEEP_VERBOSE") != NULL; /* each run's fault, before it runs */
    setenv("FASTENSOR_PROFILE", "off", 1);
    setenv("FASTENSOR_QUIET", "1", 1);
    ft__fst_probe_shift = 4; /* 2 MiB codec samples, a 4 MiB disk probe */
    ctx = t_ctx(3);
    st = fx_make(48u << 10);
    snprintf(dir, sizeof dir, "%s/sweep", t_dir());
    mkdir(dir, 0755);
    snprintf(fst_path, sizeof fst_path, "%s/model.fst", dir);
    snprintf(inst_path, sizeof inst_path, "%s/installed.bin", dir);
    snprintf(gone_path, sizeof gone_path, "%s/removed.bin", dir);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(index_, sizeof index_, "%s.index.json", path);
    snprintf(data_file, sizeof data_file, "%s/data.bin", t_dir());
    snprintf(big_path, sizeof big_path, "%s/big.safetensors", t_dir());
    big = malloc(BIG);
    t_fill_random(big, BIG, 78);
    rw_src = malloc(RW_LEN + 4096);
    rw_dst = malloc(RW_LEN + 4096);
    t_fill_random(rw_src, RW_LEN + 4096, 77);
    if (run_rw(FT_ENGINE_POSIX, true) != 0) /* the file the reads read */
        t_skip("cannot write %s: %s", data_file, ft_last_error());
    const t_case cases[] = {
        {"io_uring probe in fresh processes", case_uring_probe}, /* before any other ring */
        {ops[0].name, case_0}, {ops[1].name, case_1}, {ops[2].name, case_2},
        {ops[3].name, case_3}, {ops[4].name, case_4}, {ops[5].name, case_5},
        {ops[6].name, case_6}, {ops[7].name, case_7}, {ops[8].name, case_8},
        {ops[9].name, case_9}, {ops[10].name, case_10}, {ops[11].name, case_11},
        {ops[12].name, case_12}, {ops[13].name, case_13}, {ops[14].name, case_14},
        {ops[15].name, case_15}, {ops[16].name, case_16}, {ops[17].name, case_17},
        {ops[18].name, case_18}, {ops[19].name, case_19}, {ops[20].name, case_20},
        {ops[21].name, case_21}, {ops[22].name, case_22}, {ops[23].name, case_23},
        {ops[24].name, case_24}, {ops[25].name, case_25}, {ops[26].name, case_26},
        {ops[27].name, case_27},
    };
    _Static_assert(sizeof cases / sizeof *cases == sizeof ops / sizeof *ops + 1,
                   "a case an op");
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    printf("  %u runs, %u with a fault injected\n", runs, injected_runs);
    free(rw_src);
    free(rw_dst);
    free(big);
    fx_free(st);
    ft_ctx_destroy(ctx);
    return rc;
}
