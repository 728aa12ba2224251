/* Installing checkpoints: one commit point per save (single file and sharded), a save
 * replacing the other form of its name, both forms refused in a directory, errors that leave
 * the previous checkpoint installed, post-commit failures as warnings, cleanup of dead saves
 * (ft_ckpt_gc), FIFOs refused, and SIGKILL trials: at random moments and at each rename,
 * fsync and unlink, never a mixed checkpoint, never a leftover after gc; loads racing
 * re-saves of the name, and two saves of one name at once. */
#include "fixture.h"
#include "../src/base/syscall.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static ft_ctx *ctx;
static fx_state *st;
/* four or five shards of the fixture (~384 KiB, or FT_KILL_MIB) */
static uint64_t SHARD = 96u << 10;

/* A fresh directory under t_dir() and the checkpoint name in it. */
static void fresh(const char *tag, char *dir, char *path, char *index)
{
    snprintf(dir, 4200, "%s/%s", t_dir(), tag);
    mkdir(dir, 0755);
    snprintf(path, 4300, "%s/model.safetensors", dir);
    snprintf(index, 4400, "%s.index.json", path);
}

static void case_replace_forms(void)
{
    char dir[4200], path[4300], index[4400];
    fresh("forms", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    T_EQ(fx_which(ctx, st, dir), 0);
    T_TRUE(fx_only(ctx, dir, index));
    T_EQ(fx_save(ctx, st, path, 1, SHARD), 0); /* sharded over sharded: a new generation */
    T_EQ(fx_which(ctx, st, dir), 1);
    T_TRUE(fx_only(ctx, dir, index));
    T_EQ(fx_save(ctx, st, path, 2, 0), 0); /* single over sharded: index and shards go */
    T_EQ(fx_which(ctx, st, dir), 2);
    T_TRUE(fx_only(ctx, dir, path));
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0); /* sharded over single: the file goes */
    T_EQ(fx_which(ctx, st, dir), 0);
    T_TRUE(fx_only(ctx, dir, index));
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, index), 0);
    T_TRUE(ft_ckpt_shard_count(c) >= 4);
    T_TRUE(strstr(ft_ckpt_shard_path(c, 0), "model-00001-of-0000") != NULL);
    ft_ckpt_close(c);
}

static void case_both_forms_refused(void)
{
    char dir[4200], path[4300], index[4400], other[4400];
    fresh("both", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    snprintf(other, sizeof other, "%s/elsewhere.safetensors", t_dir());
    T_EQ(fx_save(ctx, st, other, 1, 0), 0);
    T_EQ(rename(other, path), 0); /* as a crash between a commit and its cleanup leaves it */
    T_EQ(fx_which(ctx, st, dir), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "model.safetensors and") != NULL);
    T_TRUE(strstr(ft_last_error(), "model.safetensors.index.json") != NULL);
    T_EQ(fx_which(ctx, st, path), 1); /* each by its own path is whole */
    T_EQ(fx_which(ctx, st, index), 0);
    T_EQ(fx_save(ctx, st, path, 2, SHARD), 0); /* the next save replaces both */
    T_EQ(fx_which(ctx, st, dir), 2);
    T_TRUE(fx_only(ctx, dir, index));
}

/* An EIO at each rename of a sharded save over an older one: the older stays, whole, and
 * nothing of the failed save remains. */
static void case_rename_faults(void)
{
    char dir[4200], path[4300], index[4400];
    fresh("renames", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    for (unsigned nth = 1;; nth++) {
        t_fault_set(T_OP_RENAME, T_FAULT_ERRNO, EIO, nth, 1);
        int rc = fx_save(ctx, st, path, 1, SHARD);
        unsigned hit = t_fault_clear();
        if (!hit) {
            T_EQ(rc, 0);
            T_EQ(fx_which(ctx, st, dir), 1);
            T_TRUE(nth >= 5);
            break;
        }
        if (rc != -EIO)
            T_FAIL("rename %u: rc %d, expected -EIO", nth, rc);
        T_EQ(fx_which(ctx, st, dir), 0);
        T_TRUE(fx_only(ctx, dir, index));
    }
}

/* A failing directory fsync after the commit is a warning: the new checkpoint is there. */
static void case_post_commit_warning(void)
{
    char dir[4200], path[4300], index[4400];
    fresh("warn", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, 0), 0);
    t_fault_set(T_OP_FSYNC, T_FAULT_ERRNO, EIO, 1, 1); /* single: the first fsync follows it */
    int rc = fx_save(ctx, st, path, 1, 0);
    T_EQ(t_fault_clear(), 1);
    T_EQ(rc, FT_SAVE_WARNING);
    T_TRUE(strstr(ft_last_error(), "fsync of directory") != NULL);
    T_EQ(fx_which(ctx, st, path), 1);
    t_fault_set(T_OP_FSYNC, T_FAULT_ERRNO, EIO, 1, 1); /* sharded: the first precedes it */
    T_EQ(fx_save(ctx, st, path, 2, SHARD), -EIO);
    t_fault_clear();
    T_EQ(fx_which(ctx, st, dir), 1);
    T_TRUE(fx_only(ctx, dir, path));
    t_fault_set(T_OP_FSYNC, T_FAULT_ERRNO, EIO, 2, 1);
    T_EQ(fx_save(ctx, st, path, 2, SHARD), FT_SAVE_WARNING);
    t_fault_clear();
    T_EQ(fx_which(ctx, st, dir), 2);
    T_TRUE(fx_only(ctx, dir, index));
}

static void touch(const char *dir, const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd >= 0 && write(fd, "x", 1) == 1)
        close(fd);
}

static pid_t dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static void gc_count(const char *path, void *arg)
{
    (void)path;
    (*(int *)arg)++;
}

static void case_gc(void)
{
    char dir[4200], path[4300], index[4400], name[256], held[4500];
    fresh("gc", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    char *installed = fx_listing(dir);
    pid_t dead = dead_pid();
    const char *doomed[] = {"model.safetensors.fastensor-tmp-%d-0",
                            "model-00001-of-00004.0badf00d.safetensors.fastensor-tmp-%d-3",
                            "other.safetensors.tmp-%d-7", "x.safetensors.index.json.tmp-%d",
                            "model-00002-of-00004.0badf00d.safetensors"};
    for (size_t i = 0; i < sizeof doomed / sizeof *doomed; i++) {
        snprintf(name, sizeof name, doomed[i], (int)dead);
        touch(dir, name);
    }
    /* kept: a live pid's temporary, a dead pid's one whose flock is held (a save in another
     * pid namespace), a user's own files, a shard name no generation pattern matches */
    snprintf(name, sizeof name, "model.safetensors.fastensor-tmp-%d-9", (int)getpid());
    touch(dir, name);
    snprintf(name, sizeof name, "model.safetensors.fastensor-tmp-%d-1", (int)dead);
    touch(dir, name);
    snprintf(held, sizeof held, "%s/%s", dir, name);
    int lock = open(held, O_RDONLY);
    T_EQ(flock(lock, LOCK_EX), 0);
    touch(dir, "notes.txt");
    touch(dir, "model-00001-of-00004.safetensors");
    touch(dir, "model-00001-of-00004.nothex00.safetensors");
    int removed = 0;
    T_EQ(ft_ckpt_gc(ctx, dir, gc_count, &removed), 5);
    T_EQ(removed, 5);
    close(lock);
    char *after = fx_listing(dir);
    for (size_t i = 0; i < sizeof doomed / sizeof *doomed; i++) {
        snprintf(name, sizeof name, doomed[i], (int)dead);
        if (strstr(after, name))
            T_FAIL("gc left %s", name);
    }
    T_TRUE(strstr(after, "notes.txt") && strstr(after, "nothex00") &&
           strstr(after, "model-00001-of-00004.safetensors\n"));
    for (char *line = installed; *line;) { /* the checkpoint is untouched */
        char *nl = strchr(line, '\n');
        *nl = '\0';
        T_TRUE(strstr(after, line) != NULL);
        line = nl + 1;
    }
    T_EQ(fx_which(ctx, st, index), 0);
    T_EQ(ft_ckpt_gc(ctx, dir, NULL, NULL), 1); /* the unlocked one, once its lock is gone */
    T_EQ(ft_ckpt_gc(ctx, index, NULL, NULL), -ENOTDIR);
    free(installed);
    free(after);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "opening a FIFO blocked\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

static void case_fifo(void)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/fifo.safetensors", t_dir());
    T_EQ(mkfifo(p, 0644), 0);
    signal(SIGALRM, on_alarm);
    alarm(10);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, p), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "not a regular file") != NULL);
    alarm(0);
    unlink(p);
}

/* ---- kill trials ---- */

static unsigned kill_nth;
static enum t_fault_op kill_op;
static atomic_uint kill_calls;

#define KILLER(name, OP, params, args)                                                        \
    static int k_##name params                                                                \
    {                                                                                         \
        if (kill_op == OP && atomic_fetch_add(&kill_calls, 1) + 1 == kill_nth)                \
            raise(SIGKILL);                                                                   \
        return ft__sys_real.name args;                                                        \
    }
KILLER(rename, T_OP_RENAME, (const char *a, const char *b), (a, b))
KILLER(fsync, T_OP_FSYNC, (int fd), (fd))
KILLER(fdatasync, T_OP_FDATASYNC, (int fd), (fd))
KILLER(unlink, T_OP_UNLINK, (const char *p), (p))

/* After a killed save: the name holds version @p a or @p b, whole; gc leaves nothing else.
 * @return 0, or 1 for a mixed or broken checkpoint, 2 for leftovers. */
static int judge(const char *dir, const char *path, const char *index, int a, int b,
                 unsigned *saw)
{
    int v = fx_which(ctx, st, dir);
    if (v == -EINVAL) { /* both forms: each must be whole; then a save settles it */
        int x = fx_which(ctx, st, path), y = fx_which(ctx, st, index);
        if ((x != a && x != b) || (y != a && y != b))
            return 1;
        fx_save(ctx, st, path, a, 0);
        v = a;
    }
    if (v != a && v != b) {
        fprintf(stderr, "  checkpoint is %d (%s)\n", v, ft_last_error());
        return 1;
    }
    saw[v == b]++;
    if (ft_ckpt_gc(ctx, dir, NULL, NULL) < 0)
        return 2;
    struct stat s;
    return fx_only(ctx, dir, stat(index, &s) == 0 ? index : path) ? 0 : 2;
}

/* Children save versions 0 and 1 in turn (sharded; every fourth trial alternating forms)
 * and are killed at random moments. */
static void case_kill_random(void)
{
    if (!t_fork_threads_ok())
        return;
    const char *env = getenv("FT_KILL_TRIALS"), *ms = getenv("FT_KILL_DELAY_MS");
    unsigned trials = env ? (unsigned)atoi(env) : 60, mixed = 0, leftovers = 0;
    unsigned delay_us = 1000u * (ms ? (unsigned)atoi(ms) : 60);
    unsigned saw[2] = {0, 0};
    char dir[4200], path[4300], index[4400];
    fresh("kill", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (unsigned r = 0; r < trials; r++) {
        bool forms = r % 4 == 3;
        pid_t pid = fork();
        if (pid == 0) {
            ft_ctx *cc = t_ctx(2);
            for (unsigned i = 0;; i++)
                fx_save(cc, st, path, (int)(i % 2 ? 0 : 1), forms && i % 3 == 1 ? 0 : SHARD);
        }
        usleep((useconds_t)((unsigned)rand() % delay_us));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        int j = judge(dir, path, index, 0, 1, saw);
        mixed += j == 1;
        leftovers += j == 2;
    }
    printf("  %u random kills of sharded saves: versions seen %u/%u, mixed %u, leftovers "
           "after gc %u\n", trials, saw[0], saw[1], mixed, leftovers);
    T_EQ(mixed, 0);
    T_EQ(leftovers, 0);
}

/* One save of version 1 over version 0, killed at the nth call of each step's syscall. */
static void case_kill_at_steps(void)
{
    if (!t_fork_threads_ok())
        return;
    static const struct { enum t_fault_op op; const char *name; } steps[] = {
        {T_OP_RENAME, "rename"}, {T_OP_FSYNC, "fsync"}, {T_OP_FDATASYNC, "fdatasync"},
        {T_OP_UNLINK, "unlink"}};
    char dir[4200], path[4300], index[4400];
    fresh("steps", dir, path, index);
    unsigned trials = 0, bad = 0;
    for (int single = 0; single < 2; single++)
        for (size_t s = 0; s < sizeof steps / sizeof *steps; s++)
            for (unsigned nth = 1; nth <= 8; nth++) {
                T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
                pid_t pid = fork();
                if (pid == 0) {
                    kill_op = steps[s].op;
                    kill_nth = nth;
                    ft__sys.rename = k_rename;
                    ft__sys.fsync = k_fsync;
                    ft__sys.fdatasync = k_fdatasync;
                    ft__sys.unlink = k_unlink;
                    ft_ctx *cc = t_ctx(2);
                    _exit(fx_save(cc, st, path, 1, single ? 0 : SHARD) < 0 ? 3 : 0);
                }
                int status;
                waitpid(pid, &status, 0);
                bool killed = WIFSIGNALED(status);
                unsigned saw[2] = {0, 0};
                int j = judge(dir, path, index, 0, 1, saw);
                trials += killed;
                if (j || (!killed && WEXITSTATUS(status) != 0) || (!killed && !saw[1])) {
                    bad++;
                    fprintf(stderr, "  %s, %s #%u: %s, judged %d\n", single ? "single" : "sharded",
                            steps[s].name, nth, killed ? "killed" : "ran through", j);
                }
            }
    printf("  %u saves killed at a rename, fsync, fdatasync or unlink: %u bad\n", trials, bad);
    T_EQ(bad, 0);
    T_TRUE(trials >= 20);
}

/* ---- concurrent saves and loads ---- */

static atomic_uint open_delay_us, opens_vanished;

/* A slow reader: each open waits first (the audit's way of widening the window between
 * reading an index and opening its shards); counts the opens that found no file. */
static int slow_open(const char *p, int flags, mode_t mode)
{
    unsigned us = atomic_load(&open_delay_us);
    if (us)
        usleep(us);
    int fd = ft__sys_real.open(p, flags, mode);
    if (fd < 0 && errno == ENOENT)
        atomic_fetch_add(&opens_vanished, 1);
    return fd;
}

static unsigned env_trials(const char *name, unsigned full, unsigned quick)
{
    const char *env = getenv(name);
    return env ? (unsigned)atoi(env) : t_large_tests() ? full : quick;
}

/* A child re-saves versions 0 and 1 (sharded) without pause while this process loads the
 * name with every open slowed: each load holds one version whole, or fails saying the
 * checkpoint was replaced while it was opened. */
static void case_load_during_resaves(void)
{
    if (!t_fork_threads_ok())
        return;
    unsigned trials = env_trials("FT_RESAVE_TRIALS", 200, 40);
    char dir[4200], path[4300], index[4400];
    fresh("resave", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    pid_t pid = fork();
    if (pid == 0) {
        ft_ctx *cc = t_ctx(2);
        for (unsigned i = 0;; i++)
            fx_save(cc, st, path, (int)(i % 2), SHARD);
    }
    unsigned saw[2] = {0, 0}, stale = 0, bad = 0;
    atomic_store(&opens_vanished, 0);
    atomic_store(&open_delay_us, 3000);
    ft__sys.open = slow_open;
    for (unsigned r = 0; r < trials; r++) {
        int v = fx_which(ctx, st, r % 2 ? dir : path);
        if (v == 0 || v == 1)
            saw[v]++;
        else if (v == -ESTALE && strstr(ft_last_error(), "replaced by a save"))
            stale++;
        else if (++bad <= 3)
            fprintf(stderr, "  load %u: %d (%s)\n", r, v, ft_last_error());
    }
    ft__sys.open = ft__sys_real.open;
    atomic_store(&open_delay_us, 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    printf("  %u loads during re-saves: versions %u/%u, %u opens found a shard gone, %u gave "
           "up (replaced 3 times), %u failed or mixed\n", trials, saw[0], saw[1],
           atomic_load(&opens_vanished), stale, bad);
    T_EQ(bad, 0);
    T_TRUE(saw[0] + saw[1] > 0);
}

/* Two processes save versions 1 and 2 of one name (sharded) at the same moment: both
 * succeed, one version is installed whole, and no file of the other is left, without gc. */
static void case_concurrent_saves(void)
{
    if (!t_fork_threads_ok())
        return;
    unsigned trials = env_trials("FT_DOUBLE_SAVE_TRIALS", 100, 30), orphaned = 0, failed = 0;
    unsigned saw[2] = {0, 0};
    char dir[4200], path[4300], index[4400];
    fresh("double", dir, path, index);
    T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
    for (unsigned r = 0; r < trials; r++) {
        int go[2];
        T_EQ(pipe(go), 0);
        pid_t kids[2];
        for (int k = 0; k < 2; k++)
            if ((kids[k] = fork()) == 0) {
                char c;
                close(go[1]);
                if (read(go[0], &c, 1) != 1)
                    _exit(4);
                ft_ctx *cc = t_ctx(2);
                /* every third trial one of them saves a single file over the shards */
                _exit(fx_save(cc, st, path, 1 + k, r % 3 == 2 && k ? 0 : SHARD) < 0 ? 3 : 0);
            }
        close(go[0]);
        T_EQ(write(go[1], "gg", 2), 2);
        close(go[1]);
        for (int k = 0; k < 2; k++) {
            int status;
            waitpid(kids[k], &status, 0);
            failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        int v = fx_which(ctx, st, dir);
        if (v == 1 || v == 2)
            saw[v - 1]++;
        else
            failed++;
        struct stat sb;
        if (!fx_only(ctx, dir, stat(index, &sb) == 0 ? index : path))
            orphaned++;
        ft_ckpt_gc(ctx, dir, NULL, NULL); /* the next trial starts clean either way */
    }
    printf("  %u double saves: installed 1: %u, 2: %u; %u failed, %u left files behind\n",
           trials, saw[0], saw[1], failed, orphaned);
    T_EQ(failed, 0);
    T_EQ(orphaned, 0);
}

/* ---- a writer that does not take the commit lock ---- */

static char foreign_src[3][4200];
static const char *foreign_dst;
static unsigned foreign_left, foreign_next;

/* Install the checkpoint of directory @p src in @p dst the way another tool might, without
 * the commit lock: its shards moved in, its index renamed over, the old shards removed. */
static void foreign_install(const char *src, const char *dst)
{
    char old[64][256], from[4200 + 260], to[4200 + 260];
    unsigned nold = 0;
    DIR *d = opendir(dst);
    struct dirent *e;
    while (d && (e = readdir(d)) && nold < 64)
        if (strstr(e->d_name, "-of-"))
            snprintf(old[nold++], sizeof old[0], "%s", e->d_name);
    closedir(d);
    d = opendir(src);
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, "-of-")) {
            if (snprintf(from, sizeof from, "%s/%s", src, e->d_name) < (int)sizeof from &&
                snprintf(to, sizeof to, "%s/%s", dst, e->d_name) < (int)sizeof to)
                rename(from, to);
        }
    closedir(d);
    snprintf(from, sizeof from, "%s/model.safetensors.index.json", src);
    snprintf(to, sizeof to, "%s/model.safetensors.index.json", dst);
    rename(from, to);
    for (unsigned i = 0; i < nold; i++) {
        if (snprintf(to, sizeof to, "%s/%s", dst, old[i]) < (int)sizeof to)
            unlink(to);
    }
}

/* The first open of a shard in foreign_dst installs the next foreign checkpoint there. */
static int replacing_open(const char *p, int flags, mode_t mode)
{
    if (foreign_left && strstr(p, "-of-") && !strncmp(p, foreign_dst, strlen(foreign_dst))) {
        foreign_left--;
        foreign_install(foreign_src[foreign_next++], foreign_dst);
    }
    return ft__sys_real.open(p, flags, mode);
}

/* A load whose index is replaced (by a writer without the lock) between its reading and the
 * opening of its shards starts again on the new index; three times in a row, it fails
 * saying so. */
static void case_replaced_while_opened(void)
{
    char dir[4200], path[4300], index[4400];
    for (unsigned times = 1; times <= 3; times++) {
        char tag[32];
        snprintf(tag, sizeof tag, "foreign%u", times);
        fresh(tag, dir, path, index);
        T_EQ(fx_save(ctx, st, path, 0, SHARD), 0);
        for (unsigned k = 0; k < times; k++) {
            char p[4300];
            snprintf(tag, sizeof tag, "foreign%u-src%u", times, k);
            fresh(tag, foreign_src[k], p, index);
            T_EQ(fx_save(ctx, st, p, 1 + (int)(k % 2), SHARD), 0);
        }
        foreign_dst = dir;
        foreign_left = times;
        foreign_next = 0;
        ft__sys.open = replacing_open;
        int v = fx_which(ctx, st, path);
        ft__sys.open = ft__sys_real.open;
        if (times < 3) {
            T_EQ(v, 1 + (int)((times - 1) % 2)); /* the last one installed, whole */
        } else {
            T_EQ(v, -ESTALE);
            T_TRUE(strstr(ft_last_error(), "replaced by a save of the same name while it was "
                                            "being opened (3 times)") != NULL);
        }
        T_EQ(foreign_left, 0);
    }
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(4);
    /* FT_KILL_MIB: a larger state dict (with FT_KILL_DELAY_MS to match its save time) */
    const char *mib = getenv("FT_KILL_MIB");
    st = fx_make(mib ? (size_t)atoi(mib) << 20 : 384u << 10);
    if (mib)
        SHARD = ((uint64_t)atoi(mib) << 20) / 4;
    const t_case cases[] = {
        {"a save replaces the other form of its name", case_replace_forms},
        {"both forms in a directory are refused, naming both", case_both_forms_refused},
        {"EIO at each rename keeps the previous checkpoint", case_rename_faults},
        {"a failure after the commit is a warning", case_post_commit_warning},
        {"gc removes dead saves' leftovers only", case_gc},
        {"a FIFO is refused, not waited on", case_fifo},
        {"SIGKILL at random moments", case_kill_random},
        {"SIGKILL at each rename, fsync and unlink", case_kill_at_steps},
        {"a load during re-saves holds one version", case_load_during_resaves},
        {"two concurrent saves leave one checkpoint and no orphan", case_concurrent_saves},
        {"a load restarts on an index replaced while it opened", case_replaced_while_opened},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    fx_free(st);
    ft_ctx_destroy(ctx);
    return rc;
}
