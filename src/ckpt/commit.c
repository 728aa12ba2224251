/*
 * Installing checkpoints: one commit point per save, and the cleanup around it.
 *
 * A name (the path a save is given, "dir/model.safetensors") holds one checkpoint: the file
 * itself, or an index beside it ("model.safetensors.index.json") with the shards it lists.
 * A save writes every new file under a temporary name that carries the writer's pid, holding
 * an exclusive flock on each until the save ends; shards are renamed to names unique to the
 * save (a generation: "model-00001-of-00004.3fa9c2d1.safetensors"), then the single rename
 * of the file or of the index installs the checkpoint. Only after that are the files of the
 * previous checkpoint removed, so no crash or error at any step can leave a mix of two saves.
 * Leftovers of saves that died (their temporaries, shards of generations no index lists) are
 * removed by the next save of the name and by ft_ckpt_gc; a file whose flock is held or whose
 * pid is alive belongs to a save in progress and is left alone.
 *
 * Commits into one directory take turns under the directory's commit lock: the rename that
 * installs a checkpoint, the removal of what it replaced and the release of the save's own
 * locks, and every sweep for leftovers. So of two concurrent saves of one name, the later
 * commit finds the earlier one's shards unlocked and no longer listed, and removes them; and
 * no index can be installed between a sweep's reading of the indexes and its removals. A load
 * of an index holds the lock shared until its shards are open (open.c; the lock: names.c).
 */
#include "ckpt.h"
#include "../base/syscall.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define TMP_MARK ".fastensor-tmp-"
#define EXT ".safetensors"

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int ft__name_init(ft__ckpt_name *n, const char *path)
{
    memset(n, 0, sizeof *n);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!ft__plain_name(base, strlen(base)))
        return ft__err(-EINVAL, "%s: a checkpoint needs a file name, not a directory", path);
    n->path = strdup(path);
    n->dir = slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path))
                                                 : strdup(".");
    if (asprintf(&n->index, "%s.index.json", path) < 0)
        n->index = NULL;
    if (!n->path || !n->dir || !n->index) {
        ft__name_free(n);
        return ft__err(-ENOMEM, "%s", path);
    }
    n->base = n->path + (base - path);
    n->stem_len = ends_with(n->base, EXT) && strlen(n->base) > strlen(EXT)
                      ? strlen(n->base) - strlen(EXT) : strlen(n->base);
    return 0;
}

void ft__name_free(ft__ckpt_name *n)
{
    ft__name_release(n, NULL);
    for (size_t i = 0; i < n->nold; i++)
        free(n->old[i]);
    free(n->old);
    free(n->path);
    free(n->dir);
    free(n->index);
    memset(n, 0, sizeof *n);
}

/* The plain file names an index lists (unique; any order). @return 0 or -errno. */
static int index_names(ft_ctx *ctx, const char *index, char ***out, size_t *count)
{
    ft__json_doc *root;
    const char **names;
    size_t n;
    int rc = ft__index_read(ctx, index, &root, &names, &n);
    if (rc < 0)
        return rc;
    char **copy = calloc(n + 1, sizeof *copy);
    for (size_t i = 0; copy && i < n; i++)
        if (!(copy[i] = strdup(names[i]))) {
            for (size_t j = 0; j < i; j++)
                free(copy[j]);
            free(copy);
            copy = NULL;
        }
    free(names);
    ft__json_free(root);
    if (!copy)
        return ft__err(-ENOMEM, "%s", index);
    *out = copy;
    *count = n;
    return 0;
}

/* Whether @p path exists: 1, 0, or -errno when that cannot be told. */
static int present(const char *path)
{
    struct stat st;
    if (ft__sys.stat(path, &st) == 0)
        return 1;
    return errno == ENOENT ? 0 : ft__err(-errno, "cannot stat %s", path);
}

int ft__name_installed(ft_ctx *ctx, ft__ckpt_name *n)
{
    /* Only whether each form can be told matters: the cleanup after the commit tries to
     * remove the other form whether or not it was seen. */
    for (size_t i = 0; i < n->nold; i++) /* a second look replaces the first */
        free(n->old[i]);
    free(n->old);
    n->old = NULL;
    n->nold = 0;
    int single = present(n->path), index = single < 0 ? single : present(n->index);
    if (single < 0 || index <= 0)
        return single < 0 ? single : index;
    /* An invalid index is replaced all the same (its shards, unknown, are left); one that
     * cannot be read fails the save, which would otherwise leave them behind. */
    int rc = index_names(ctx, n->index, &n->old, &n->nold);
    if (rc == -EBADMSG || rc == -EINVAL) {
        n->old = NULL;
        n->nold = 0;
        rc = 0;
    }
    return rc;
}

char *ft__tmp_name(const char *final)
{
    static _Atomic unsigned long counter;
    char *s = NULL;
    if (asprintf(&s, "%s" TMP_MARK "%d-%lu", final, (int)getpid(),
                 (unsigned long)atomic_fetch_add(&counter, 1)) < 0)
        return NULL;
    return s;
}

int ft__tmp_lock(const char *tmp)
{
    int fd = ft__sys.open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return ft__err(-errno, "cannot create %s", tmp);
    if (ft__sys.flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = -errno;
        ft__sys.close(fd);
        ft__sys.unlink(tmp);
        return ft__err(e, "cannot lock %s", tmp);
    }
    return fd;
}

uint32_t ft__generation(const ft__ckpt_name *n, unsigned nshards)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed[3] = {(uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                        (uint64_t)getpid(), (uint64_t)(uintptr_t)n};
    for (unsigned tries = 0;; tries++) {
        uint32_t gen = (uint32_t)ft__csum(seed, sizeof seed);
        char *first = ft__shard_name(n, 0, nshards, gen);
        bool taken = !first || present(first) != 0; /* there, or cannot be told */
        for (size_t i = 0; !taken && i < n->nold; i++) /* never a name the old index lists */
            taken = strcmp(strrchr(first, '/') ? strrchr(first, '/') + 1 : first,
                           n->old[i]) == 0;
        free(first);
        if (!taken || tries == 16)
            return gen;
        seed[2]++;
    }
}

char *ft__shard_name(const ft__ckpt_name *n, unsigned k, unsigned nshards, uint32_t gen)
{
    char *s = NULL;
    size_t dir_len = (size_t)(n->base - n->path);
    if (asprintf(&s, "%.*s%.*s-%05u-of-%05u.%08x" EXT, (int)dir_len, n->path, (int)n->stem_len,
                 n->base, k + 1, nshards, gen) < 0)
        return NULL;
    return s;
}

int ft__fsync_dir(const char *dir)
{
    int fd = ft__sys.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return ft__err(-errno, "cannot open directory %s to sync it", dir);
    int rc = 0;
    while (ft__sys.fsync(fd) != 0)
        if (errno != EINTR) {
            rc = ft__err(-errno, "fsync of directory %s", dir);
            break;
        }
    ft__sys.close(fd);
    return rc;
}

/* ---- leftovers ---- */

/* The pid of a temporary's name ("…" TMP_MARK "PID-N", the older "….tmp-PID-N", or a
 * spill store's ".fastensor-spill-PID-N-M" between its open and unlink), else 0. */
static long tmp_owner(const char *name)
{
    const char *m = strstr(name, TMP_MARK);
    const char *digits = m ? m + strlen(TMP_MARK) : NULL;
    if (!m && strncmp(name, ".fastensor-spill-", 17) == 0) /* a spill file not yet unlinked */
        digits = name + 17;
    if (!m && !digits) {
        const char *legacy[] = {EXT ".tmp-", EXT ".index.json.tmp-", ".index.json.tmp-"};
        for (size_t i = 0; !digits && i < sizeof legacy / sizeof *legacy; i++)
            if ((m = strstr(name, legacy[i])))
                digits = m + strlen(legacy[i]);
    }
    if (!digits || !isdigit((unsigned char)*digits))
        return 0;
    char *end;
    long pid = strtol(digits, &end, 10);
    if (pid <= 0 || (*end && *end != '-'))
        return 0;
    for (const char *p = *end ? end + 1 : end; *p; p++)
        if (!isdigit((unsigned char)*p) && *p != '-')
            return 0;
    return pid;
}

/* Whether a file is owned by a live save: its flock is held. */
static bool locked_by_other(const char *path)
{
    int fd = ft__sys.open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0)
        return errno != ENOENT;
    bool held = ft__sys.flock(fd, LOCK_EX | LOCK_NB) != 0;
    ft__sys.close(fd);
    return held;
}

static bool pid_alive(long pid)
{
    return pid == (long)getpid() || ft__sys.kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

typedef struct sweep {
    ft_ctx *ctx;
    const char *dir;
    const char *stem;   /* only this stem's files; NULL: every file in dir */
    size_t stem_len;
    char **listed;      /* file names every index in dir lists */
    size_t nlisted;
    void (*removed)(const char *path, void *arg);
    void *arg;
    int64_t count;
    int first_err;
} sweep;

static bool listed(const sweep *w, const char *name)
{
    for (size_t i = 0; i < w->nlisted; i++)
        if (strcmp(w->listed[i], name) == 0)
            return true;
    return false;
}

/* Gather the names every index in the directory lists (an unreadable index protects its
 * directory's generation shards: nothing of its stem is removed). A listing that fails is
 * an error: an index it missed would leave its shards unprotected. */
static int gather_listed(sweep *w, DIR *d, bool *unreadable)
{
    struct dirent *e;
    int more;
    while ((more = ft__dir_next(d, &e)) > 0) {
        if (!ends_with(e->d_name, ".index.json") || tmp_owner(e->d_name))
            continue;
        char *path = NULL, **names = NULL;
        size_t n = 0;
        if (asprintf(&path, "%s/%s", w->dir, e->d_name) < 0)
            return ft__err(-ENOMEM, "%s", w->dir);
        if (index_names(w->ctx, path, &names, &n) < 0)
            *unreadable = true;
        free(path);
        char **grown = realloc(w->listed, (w->nlisted + n + 1) * sizeof *grown);
        if (!grown) {
            for (size_t i = 0; i < n; i++)
                free(names[i]);
            free(names);
            return ft__err(-ENOMEM, "%s", w->dir);
        }
        w->listed = grown;
        if (n)
            memcpy(w->listed + w->nlisted, names, n * sizeof *names);
        w->nlisted += n;
        free(names);
    }
    return more < 0 ? ft__err(more, "cannot list %s: %s", w->dir, ft_strerror(more)) : 0;
}

static void sweep_remove(sweep *w, const char *name)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", w->dir, name) < 0)
        return;
    if (!locked_by_other(path)) {
        if (ft__sys.unlink(path) == 0) {
            w->count++;
            if (w->removed)
                w->removed(path, w->arg);
        } else if (errno != ENOENT && !w->first_err) {
            w->first_err = ft__err(-errno, "cannot remove %s", path);
        }
    }
    free(path);
}

static int sweep_dir(sweep *w)
{
    DIR *d = ft__sys.opendir(w->dir);
    if (!d)
        return ft__err(-errno, "cannot list %s", w->dir);
    bool unreadable = false;
    int rc = gather_listed(w, d, &unreadable);
    ft__sys.rewinddir(d);
    struct dirent *e;
    int more = 0;
    while (rc == 0 && (more = ft__dir_next(d, &e)) > 0) {
        const char *name = e->d_name;
        size_t stem_len = 0;
        if (w->stem && (strncmp(name, w->stem, w->stem_len) != 0))
            continue;
        long pid = tmp_owner(name);
        if (pid) {
            if (!pid_alive(pid))
                sweep_remove(w, name);
        } else if (!unreadable && ft__generation_shard(name, &stem_len) &&
                   (!w->stem || stem_len == w->stem_len) && !listed(w, name)) {
            sweep_remove(w, name);
        }
    }
    ft__sys.closedir(d);
    for (size_t i = 0; i < w->nlisted; i++)
        free(w->listed[i]);
    free(w->listed);
    if (rc == 0 && more < 0)
        rc = ft__err(more, "cannot list %s: %s", w->dir, ft_strerror(more));
    return rc < 0 ? rc : w->first_err;
}

int64_t ft_ckpt_gc(ft_ctx *ctx, const char *dir,
                   void (*removed)(const char *path, void *arg), void *arg)
{
    if (!ctx || !dir || !*dir)
        return ft__err(-EINVAL, "ft_ckpt_gc: missing context or directory");
    struct stat st;
    if (ft__sys.stat(dir, &st) != 0)
        return ft__err(-errno, "cannot open %s", dir);
    if (!S_ISDIR(st.st_mode))
        return ft__err(-ENOTDIR, "%s is not a directory", dir);
    sweep w = {.ctx = ctx, .dir = dir, .removed = removed, .arg = arg};
    int lock;
    int rc = ft__commit_lock(dir, false, &lock);
    if (rc == 0)
        rc = sweep_dir(&w);
    ft__commit_unlock(lock);
    if (rc == 0 && w.count)
        rc = ft__fsync_dir(dir);
    return rc < 0 ? rc : w.count;
}

/* ---- after the commit ---- */

/* Unlink a file of the previous checkpoint. @return 1 removed, 0 absent, or -errno. */
static int remove_file(ft__ckpt_name *n, const char *name, bool in_dir)
{
    char *path = NULL;
    if (in_dir ? asprintf(&path, "%s/%s", n->dir, name) < 0 : !(path = strdup(name)))
        return ft__err(-ENOMEM, "%s", name);
    int rc = 1;
    ft__name_hold(n, path);
    if (ft__sys.unlink(path) != 0)
        rc = errno == ENOENT ? 0
                             : ft__err(-errno, "cannot remove %s of the previous checkpoint", path);
    free(path);
    return rc;
}

int ft__after_commit(ft_ctx *ctx, ft__ckpt_name *n, bool sharded, const char *const *keep,
                     size_t nkeep, bool sync)
{
    int first = sync ? ft__fsync_dir(n->dir) : 0, rc;
    unsigned removed = 0;
    /* The other form of the name goes first (tried whether or not it was seen before the
     * save): from here on the name has one checkpoint. */
    rc = remove_file(n, sharded ? n->path : n->index, false);
    removed += rc > 0;
    if (rc < 0 && !first)
        first = rc;
    for (size_t i = 0; i < n->nold; i++) {
        bool kept = false;
        for (size_t j = 0; j < nkeep && !kept; j++)
            kept = strcmp(keep[j], n->old[i]) == 0;
        if (kept)
            continue;
        rc = remove_file(n, n->old[i], true);
        removed += rc > 0;
        if (rc < 0 && !first)
            first = rc;
    }
    char stem[4096];
    snprintf(stem, sizeof stem, "%.*s", (int)n->stem_len, n->base);
    sweep w = {.ctx = ctx, .dir = n->dir, .stem = stem, .stem_len = n->stem_len};
    if ((rc = sweep_dir(&w)) && !first)
        first = rc;
    if (sync && (removed || w.count) && (rc = ft__fsync_dir(n->dir)) && !first)
        first = rc;
    return first;
}
