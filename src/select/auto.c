/*
 * Engine AUTO: the selector wired to files. One selector per filesystem device per context,
 * with its profile loaded when first used and saved when the context is destroyed (or by
 * ft_profile_save). FASTENSOR_PROFILE: "off" disables persistence; a directory holds one
 * profile per device; any other value names the file itself. Default directory:
 * $XDG_CACHE_HOME/fastensor, else $HOME/.cache/fastensor.
 */
#include "select.h"
#include "../engine/engine.h"
#include "../core/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* The arms: engines and the settings that change their behaviour (piece = 0: default;
 * UINT64_MAX: do not split). Appending keeps profiles valid; reordering needs a new tag. */
const ft__arm ft__arms[] = {
    {FT_ENGINE_POSIX, 0, "posix"},
    {FT_ENGINE_POSIX, UINT64_MAX, "posix/1thread"},
    {FT_ENGINE_DIRECT, 0, "direct"},
    {FT_ENGINE_DIRECT, 8u << 20, "direct/8M"},
    {FT_ENGINE_URING, 0, "uring"},
    {FT_ENGINE_URING, 8u << 20, "uring/8M"},
    {FT_ENGINE_MMAP, 0, "mmap"},
    {FT_ENGINE_MMAP, UINT64_MAX, "mmap/1thread"},
    {FT_ENGINE_CUFILE, 0, "cufile"},
};
const unsigned ft__narms = sizeof ft__arms / sizeof *ft__arms;
#define ARMS_TAG "arms=posix,posix/1,direct,direct/8M,uring,uring/8M,mmap,mmap/1,cufile"

#define MAX_DEVICES 16

struct ft__auto {
    pthread_mutex_t lock;
    _Atomic uint32_t used[2]; /* per memory kind: the engines this context has run once */
    unsigned n;
    struct {
        dev_t dev;
        ft__selector *sel;
        char path[4200]; /* profile file, "" when not persisted */
        char tag[160];
    } dev[MAX_DEVICES];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int ft__auto_create(ft__auto **out)
{
    ft__auto *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    pthread_mutex_init(&a->lock, NULL);
    *out = a;
    return 0;
}

static void profile_path(dev_t dev, char *out, size_t len)
{
    const char *env = getenv("FASTENSOR_PROFILE");
    out[0] = '\0';
    if (env && !strcmp(env, "off"))
        return;
    char dir[4096];
    struct stat st;
    if (env && *env && !(stat(env, &st) == 0 && S_ISDIR(st.st_mode))) {
        snprintf(out, len, "%s", env);
        return;
    }
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(dir, sizeof dir, "%s/fastensor", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME"))
        snprintf(dir, sizeof dir, "%s/.cache/fastensor", getenv("HOME"));
    else
        return;
    if (!env) { /* create the default directory (and .cache) on first use */
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash) {
            *slash = '\0';
            mkdir(parent, 0755);
        }
        mkdir(dir, 0755);
    }
    snprintf(out, len, "%s/profile-%u-%u.txt", dir, major(dev), minor(dev));
}

/* Whether the arm goes through the page cache (the others are O_DIRECT). */
static bool buffered_arm(unsigned arm)
{
    return ft__arms[arm].engine == FT_ENGINE_POSIX || ft__arms[arm].engine == FT_ENGINE_MMAP;
}

/* The selector of the filesystem on device @p dev (created, with its profile, on first use). */
static ft__selector *selector_of_dev(ft__auto *a, dev_t dev)
{
    pthread_mutex_lock(&a->lock);
    ft__selector *sel = NULL;
    for (unsigned i = 0; i < a->n && !sel; i++)
        if (a->dev[i].dev == dev)
            sel = a->dev[i].sel;
    if (!sel && a->n < MAX_DEVICES &&
        ft__sel_create(&sel, ft__narms, now_ns, (uint64_t)dev ^ now_ns()) == 0) {
        for (unsigned k = 0; k < ft__narms; k++)
            if (!buffered_arm(k))
                sel->cache_blind |= 1u << k;
        sel->stint_buckets = ft__stint_buckets();
        unsigned i = a->n++;
        a->dev[i].dev = dev;
        a->dev[i].sel = sel;
        snprintf(a->dev[i].tag, sizeof a->dev[i].tag, "dev=%u:%u gpu=none %s",
                 major(dev), minor(dev), ARMS_TAG);
        profile_path(dev, a->dev[i].path, sizeof a->dev[i].path);
        if (a->dev[i].path[0]) {
            char keep[FT__DETAIL_MAX];
            ft__detail_save(keep);
            if (ft__sel_load(sel, a->dev[i].path, a->dev[i].tag) < 0 &&
                !getenv("FASTENSOR_QUIET"))
                fprintf(stderr, "fastensor: ignoring profile (it will be rebuilt): %s\n",
                        ft_last_error());
            ft__detail_restore(keep);
            atomic_store(&sel->dirty, 0);
        }
    }
    pthread_mutex_unlock(&a->lock);
    return sel;
}

/* The selector for the filesystem holding @p f, remembered by the file. */
static ft__selector *selector_for(ft_file *f)
{
    ft__selector *known = atomic_load_explicit(&f->sel, memory_order_acquire);
    if (known)
        return known;
    struct stat st;
    if (ft__sys.fstat(f->fd, &st) != 0)
        return NULL;
    ft__selector *sel = selector_of_dev(f->ctx->autosel, st.st_dev);
    atomic_store_explicit(&f->sel, sel, memory_order_release);
    return sel;
}

/* Engines usable for @p f, worked out once per file. */
static unsigned file_caps(ft_file *f)
{
    unsigned caps = atomic_load_explicit(&f->auto_caps, memory_order_acquire);
    if (caps)
        return caps;
    char keep[FT__DETAIL_MAX];
    ft__detail_save(keep);
    bool direct = ft__file_direct_fd(f) >= 0;
    ft__detail_restore(keep);
    caps = 1u | (direct ? 2u : 0) |
           (direct && ft_engine_available(f->ctx, FT_ENGINE_URING, NULL) ? 4u : 0);
    atomic_store_explicit(&f->auto_caps, caps, memory_order_release);
    return caps;
}

/* Page-cache class of a read, probed at most once per millisecond per file: in a loop of
 * small reads the probe would cost as much as the read. */
static unsigned cache_class(ft_file *f, uint64_t off, uint64_t len, uint64_t now)
{
    uint64_t memo = atomic_load_explicit(&f->cache_memo, memory_order_relaxed);
    if (memo && now - (memo >> 2) < 1000000u)
        return (unsigned)(memo & 3);
    unsigned cls = ft__probe_cache(f->fd, off, len);
    atomic_store_explicit(&f->cache_memo, (now << 2) | cls, memory_order_relaxed);
    return cls;
}

/*
 * Reads that go on from the file's previous one form the stream class: the kernel's readahead
 * serves buffered engines ahead of them, which makes most of their later reads find their
 * pages cached. Those reads are still the stream's (the cache is the buffered engine's own
 * doing), so a run that started cold stays in the stream class until it breaks; one that
 * started cached is classed by residency as usual.
 * "Go on" allows for requests in flight, which are decided in the pool's threads and so out
 * of order, up to twice the queue's depth apart: within 32 lengths, and within 64 MiB or
 * twice the calls in flight times the length, either way. (16 in flight on 2 cores: 8
 * lengths broke a cold 1 MiB stream every few hundred calls, and with readahead ahead of it,
 * it went on as "cached" and filled the cached keys with disk-speed samples. With 64 MiB
 * alone the limit, 64 MiB reads 4 in flight broke their stream in 1 of 3 passes on the
 * development machine: the call decided out of order went to the "partly cached" key's
 * `uring`, and that pass read at 1.89 GB/s against 2.15-2.50 for passes that stayed on the
 * stream's `mmap/1thread`.) The same range again, a read at the file's start (a new pass) or
 * a jump farther than that is no stream.
 */
static unsigned read_class(ft_file *f, uint64_t off, uint64_t len, unsigned inflight,
                           uint64_t now)
{
    unsigned cls = cache_class(f, off, len, now);
    uint64_t prev = atomic_exchange_explicit(&f->read_end, off + len, memory_order_relaxed);
    uint64_t gap = prev > off ? prev - off : off - prev;
    uint64_t reach = FT__MAX((uint64_t)64 << 20, 2ull * inflight * len);
    bool seq = prev != 0 && off != 0 && gap / 32 <= len && gap <= reach && off + len != prev;
    if (!seq) {
        atomic_store_explicit(&f->stream_cold, cls != 2, memory_order_relaxed);
        return cls;
    }
    if (cls != 2)
        atomic_store_explicit(&f->stream_cold, true, memory_order_relaxed);
    return atomic_load_explicit(&f->stream_cold, memory_order_relaxed) ? 3 : cls;
}

static uint32_t eligible_arms(ft_file *f, uint64_t len, int device, bool durable_write)
{
    unsigned caps = file_caps(f);
    bool direct = caps & 2, uring = caps & 4;
    /* cuFile: device memory only, once its driver is open (no call waits for that), while
     * the file's registration has not failed */
    bool cufile = device >= 0 && direct && !f->cufile_err && ft__cufile_usable_now(f->ctx);
    uint32_t mask = 0;
    for (unsigned i = 0; i < ft__narms; i++) {
        const ft__arm *arm = &ft__arms[i];
        /* durable writes: buffered engines only move their cost into the later sync */
        if (durable_write && direct &&
            (arm->engine == FT_ENGINE_POSIX || arm->engine == FT_ENGINE_MMAP) && len >= 65536)
            continue;
        if ((arm->engine == FT_ENGINE_DIRECT && !direct) ||
            (arm->engine == FT_ENGINE_URING && !uring) ||
            (arm->engine == FT_ENGINE_CUFILE && !cufile))
            continue;
        /* a setting that cannot change this transfer is the same arm twice */
        if (arm->piece == UINT64_MAX && len <= (2u << 20))
            continue;
        if (arm->piece && arm->piece != UINT64_MAX && len <= arm->piece)
            continue;
        mask |= 1u << i;
    }
    return mask;
}

/* The arm for a key nothing is known about: page-cache copies for cached reads (an O_DIRECT
 * engine would read them from the disk again), O_DIRECT for large cold or durable ones. */
static unsigned static_default(uint32_t eligible, uint64_t len, const ft__sel_key *key)
{
    if (!key->write && key->cache == 2)
        return 0; /* posix */
    if (len >= (1u << 20)) {
        if (eligible & (1u << 4))
            return 4; /* uring */
        if (eligible & (1u << 2))
            return 2; /* direct */
    }
    return 0; /* posix */
}

/*
 * Small reads are timed one in SMALL_READ_EVERY (per thread), trials always: timing and
 * recording a call (two clock reads, the key's lock, its window's median) cost about
 * 100 ns, which beside a 4 KiB read of 1-5 us was most of AUTO's cost per call and a few
 * percent of the read (development machine, 1-byte cached reads: 215 ns over posix timed
 * every call, 85-91 ns timed one in 8). A key of small reads gets thousands of calls, so its
 * samples still come by the hundred; exploring and re-checks are timed whole. Writes are
 * always timed: plain ones are measured in runs that share their sync's time by bytes.
 */
#define SMALL_READ (256u << 10)
#define SMALL_READ_EVERY 8

/* Whether to time this small read: drawn (xorshift, per thread), not counted. A counter
 * shared by all keys aliases with a job's pattern: calls alternating between two keys
 * timed one key's every fourth call and the other's never. */
static bool small_read_drawn(uint64_t now)
{
    static _Thread_local uint32_t x;
    if (!x)
        x = (uint32_t)(now ^ (now >> 32) ^ (uintptr_t)&x) | 1u;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x % SMALL_READ_EVERY == 0;
}

void ft__auto_decide(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned durable,
                     int device, ft__decision *d)
{
    memset(d, 0, sizeof *d);
    uint64_t now = now_ns();
    ft__selector *sel = selector_for(f);
    d->inflight = atomic_load_explicit(&f->ctx->inflight, memory_order_relaxed);
    d->key = (ft__sel_key){
        .write = write,
        .mem = device >= 0 ? FT_MEM_CUDA : FT_MEM_HOST,
        .bucket = (uint8_t)ft__sel_bucket(len),
        .cache = write ? (uint8_t)durable : (uint8_t)read_class(f, off, len, d->inflight, now),
        .busy = d->inflight > 1,
        .cpu = (uint8_t)ft__probe_cpu(),
    };
    uint32_t eligible = eligible_arms(f, len, device, write && durable);
    d->sel = sel;
    bool stint = sel && ft__sel_stream_key(&d->key) && (sel->stint_buckets >> d->key.bucket & 1);
    if (!stint || !ft__stint_join(f, d, eligible, now)) {
        unsigned fallback = static_default(eligible, len, &d->key);
        d->arm = sel ? ft__sel_choose(sel, &d->key, eligible, fallback, &d->trial) : fallback;
        if (stint && ft__sel_stint_key(sel, &d->key))
            ft__stint_begin(f, d, len, now);
    }
    d->engine = ft__arms[d->arm].engine;
    d->piece = ft__arms[d->arm].piece;
    d->timed = write || d->trial || d->stint || len >= SMALL_READ || small_read_drawn(now);
    /* the clock starts now: the decision's own cost (the first call of a file opens its
     * O_DIRECT descriptor, loads the profile, probes io_uring) is no arm's */
    d->t0 = d->timed ? now_ns() : 0;
}

/* (key, arm) runs of plain writes awaiting their sync, per file */
#define MAX_PENDING 64

/* Plain writes of one key and arm since the file's last sync: one sample when it comes. A
 * sample per write would fill the arm's window with one run's figures (a 64 MiB pass of
 * 4 KiB writes is 16384 of them); a run is one measurement of the arm, as a job saving a
 * file and syncing it is one use of it. */
struct ft__pending_write {
    ft__selector *sel;
    ft__sel_key key;
    unsigned index, arm, calls; /* index: the key's (ft__sel_key_index) */
    uint64_t bytes, ns;
};

/* A call shorter than this amortizes no engine's one-time setup: its first call in a context
 * is not a sample. */
#define SETUP_AMORTIZED_NS 250000000ull

/*
 * Whether this is the context's first call of the decision's engine for its memory kind
 * (engines, not arms: an engine's settings share what it sets up). That call pays for what
 * the engine sets up once and keeps (pinned staging buffers and CUDA
 * streams for device memory: 12 ms measured on the H200 machine; an io_uring ring and its
 * registered buffers; bounce buffers), which says nothing about the arm's speed. Recorded, it
 * made a 4 KiB staged read look 50 times slower than it is, the arm was eliminated at once,
 * and through the priors of neighbouring sizes never tried at any size again (the 36 GB/s
 * posix copy of cached data to a GPU lost to mmap's 21 for every block size).
 */
bool ft__auto_first_use(ft_file *f, const ft__decision *d)
{
    uint32_t bit = 1u << d->engine;
    _Atomic uint32_t *used = &f->ctx->autosel->used[d->key.mem & 1];
    /* every call asks: read first, write the shared word only the first time */
    if (atomic_load_explicit(used, memory_order_relaxed) & bit)
        return false;
    return !(atomic_fetch_or_explicit(used, bit, memory_order_relaxed) & bit);
}

/*
 * FASTENSOR_TRACE=FILE: one line per AUTO call (key, arm, bytes, nanoseconds, transfers in
 * flight at its start, the bytes of the caller's whole call (a trial slice is one line, the
 * rest of its call another), and whether it became a sample; an untimed small read shows 0 ns
 * and the key it was decided under), to see what the selector did in a
 * run, where the profile keeps only the last few samples per arm.
 */
static FILE *trace_file;
static void trace_open(void)
{
    const char *path = getenv("FASTENSOR_TRACE");
    if (path && *path && (trace_file = fopen(path, "ae")) != NULL)
        setvbuf(trace_file, NULL, _IOLBF, 0);
}

void ft__auto_trace_line(const char *fmt, ...)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, trace_open);
    if (!trace_file)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(trace_file, fmt, ap);
    va_end(ap);
}

void ft__auto_trace(const ft__decision *d, const ft__sel_key *key, int64_t result, uint64_t ns,
                    const char *what)
{
    ft__auto_trace_line("%s %s bucket=%u cache=%u busy=%u cpu=%u arm=%s bytes=%lld ns=%llu "
                        "inflight=%u call=%llu %s\n", key->write ? "write" : "read",
                        key->mem ? "cuda" : "host", key->bucket, key->cache, key->busy, key->cpu,
                        ft__arms[d->arm].label, (long long)result, (unsigned long long)ns,
                        d->inflight, (unsigned long long)d->call, what);
}

void ft__auto_done(ft_file *f, const ft__decision *d, int64_t result, bool counted)
{
    if (d->stint) {
        ft__stint_done(f, d, result, now_ns());
        return;
    }
    if (!d->sel || result <= 0)
        return;
    if (!d->timed) {
        ft__auto_first_use(f, d); /* what the engine sets up once, this call paid */
        ft__auto_trace(d, &d->key, result, 0, "untimed");
        return;
    }
    uint64_t ns = now_ns() - d->t0;
    /* Transfers in flight at the call's end, this one included. */
    unsigned end = atomic_load_explicit(&f->ctx->inflight, memory_order_relaxed) + !counted;
    /* A call that began alone but ends beside others did not run alone: its sample is one of
     * calls in flight. In the alone key it would say what the arm does when it shares the
     * CPUs and the disk with calls that arrived after it (2-core development VM: cached 1 MiB
     * posix reads that began a batch of 8 took 3-33 ms, against 0.05-0.2 ms alone, and sent
     * the key to io_uring at 3 GB/s). */
    ft__sel_key key = d->key;
    if (!key.busy && end > 1)
        key.busy = 1;
    if (ft__auto_first_use(f, d) && ns < SETUP_AMORTIZED_NS) {
        ft__auto_trace(d, &key, result, ns, "first-use");
        return;
    }
    /* writes made durable by a later sync (plain ones, if ever) wait for it; those synced
     * by the call itself were timed with their sync */
    bool later = key.write && key.cache != 1;
    ft__auto_trace(d, &key, result, ns, later ? "pending-sync" : "sample");
    /* Transfers running at once share the threads and the disk: a call that ran beside k
     * others took about k+1 times its own time. Counting its share (transfers in flight at
     * its start and end, averaged) keeps samples taken under load comparable with the rest. */
    unsigned conc = (d->inflight + end) / 2;
    if (conc > 1)
        ns /= conc;
    if (!later) { /* reads, and writes already durable */
        ft__sel_record(d->sel, &key, d->arm, (uint64_t)result, ns);
        return;
    }
    /* A plain write (or one the caller syncs later) is measured once it is durable
     * (ft__auto_synced), or at close: a buffered write is cheap only until its pages must
     * reach the disk. */
    pthread_mutex_lock(&f->lock);
    if (!f->pending)
        f->pending = calloc(MAX_PENDING, sizeof *f->pending);
    struct ft__pending_write *run = NULL;
    unsigned index = ft__sel_key_index(&key);
    for (unsigned i = 0; f->pending && i < f->npending && !run; i++)
        if (f->pending[i].sel == d->sel && f->pending[i].arm == d->arm &&
            f->pending[i].index == index)
            run = &f->pending[i];
    if (!run && f->pending && f->npending < MAX_PENDING) {
        run = &f->pending[f->npending++];
        *run = (struct ft__pending_write){.sel = d->sel, .key = key, .index = index,
                                          .arm = d->arm};
    }
    bool queued = run != NULL;
    if (run) {
        run->calls++;
        run->bytes += (uint64_t)result;
        run->ns += ns;
    }
    pthread_mutex_unlock(&f->lock);
    if (queued)
        ft__sel_pending(d->sel, &key, d->arm, +1);
    else
        ft__sel_record(d->sel, &key, d->arm, (uint64_t)result, ns);
}

/* Below this many bytes of buffered writes a sync's time is mostly its own fixed cost
 * (journal commit, disk cache flush: 1-5 ms on the machines measured), not the writeback of
 * those bytes: shared among them, it made a few 4 KiB buffered trial writes among O_DIRECT
 * ones look 100 times slower than a run of them synced once. */
#define SYNC_SHARE_MIN (1u << 20)

/* Record the pending runs of writes, the sync's time shared (by bytes) among the buffered
 * ones: O_DIRECT writes left nothing in the page cache for it to flush. Buffered runs too
 * small to be told from the sync's fixed cost are no sample (their arm is tried again). */
static void flush_pending(ft_file *f, uint64_t sync_ns)
{
    pthread_mutex_lock(&f->lock);
    unsigned n = f->npending;
    struct ft__pending_write *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, f->pending, n * sizeof *copy);
    f->npending = 0;
    pthread_mutex_unlock(&f->lock);
    if (!copy)
        return;
    uint64_t buffered = 0;
    for (unsigned i = 0; i < n; i++)
        buffered += buffered_arm(copy[i].arm) ? copy[i].bytes : 0;
    bool too_few = sync_ns && buffered < SYNC_SHARE_MIN;
    for (unsigned i = 0; i < n; i++) {
        bool mine = buffered_arm(copy[i].arm);
        ft__sel_pending(copy[i].sel, &copy[i].key, copy[i].arm, -(int)copy[i].calls);
        if (mine && too_few)
            continue;
        uint64_t share = mine && buffered
                             ? (uint64_t)((double)sync_ns * (double)copy[i].bytes / (double)buffered)
                             : 0;
        ft__sel_record(copy[i].sel, &copy[i].key, copy[i].arm, copy[i].bytes,
                       copy[i].ns + share);
    }
    free(copy);
}

void ft__auto_synced(ft_file *f, uint64_t ns)
{
    flush_pending(f, ns);
}

void ft__auto_file_close(ft_file *f)
{
    flush_pending(f, 0);
    free(f->pending);
    f->pending = NULL;
    ft__stint_close(f);
}

static int save_all(ft__auto *a, bool only_dirty)
{
    int rc = 0;
    pthread_mutex_lock(&a->lock);
    for (unsigned i = 0; i < a->n; i++) {
        if (!a->dev[i].path[0] || (only_dirty && !atomic_load(&a->dev[i].sel->dirty)))
            continue;
        int r = ft__sel_save(a->dev[i].sel, a->dev[i].path, a->dev[i].tag);
        if (r == 0)
            atomic_store(&a->dev[i].sel->dirty, 0);
        else if (rc == 0)
            rc = r;
    }
    pthread_mutex_unlock(&a->lock);
    return rc;
}

void ft__auto_destroy(ft__auto *a)
{
    if (!a)
        return;
    char keep[FT__DETAIL_MAX];
    ft__detail_save(keep);
    save_all(a, true);
    ft__detail_restore(keep);
    for (unsigned i = 0; i < a->n; i++)
        ft__sel_destroy(a->dev[i].sel);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int ft_profile_save(ft_ctx *ctx)
{
    if (!ctx)
        return ft__err(-EINVAL, "ft_profile_save: context is NULL");
    return save_all(ctx->autosel, false);
}

int ft_profile_show(ft_ctx *ctx, const char *path, FILE *out)
{
    if (!ctx || !path || !out)
        return ft__err(-EINVAL, "ft_profile_show: missing argument");
    int fd = ft__sys.open(path, O_RDONLY | O_CLOEXEC, 0); /* a file or a directory */
    if (fd < 0)
        return ft__err(-errno, "cannot open %s", path);
    struct stat st;
    int rc = ft__sys.fstat(fd, &st) == 0 ? 0 : ft__err(-errno, "cannot stat %s", path);
    ft__sys.close(fd);
    if (rc < 0)
        return rc;
    ft__auto *a = ctx->autosel;
    ft__selector *sel = selector_of_dev(a, st.st_dev);
    const char *ppath = "";
    for (unsigned i = 0; i < a->n; i++)
        if (a->dev[i].sel == sel)
            ppath = a->dev[i].path[0] ? a->dev[i].path : "(not persisted)";
    if (!sel)
        return ft__err(-ENOMEM, "selector");
    static const char *cache_name[] = {"cold", "partial", "cached", "stream"};
    static const char *write_name[] = {"-", "sync", "later", "?"};
    fprintf(out, "profile %s\n\n%-5s %-4s %7s %-7s %-4s %-4s  %-14s  %s\n", ppath, "op", "mem",
            "size", "cache", "busy", "cpu", "chosen", "GB/s (samples) per arm");
    fprintf(out, "(cache: page-cache residency for reads, \"stream\" for uncached reads "
                 "continuing the previous one; writes: \"sync\" synced by the call itself, "
                 "\"later\" synced by the caller later)\n");
    unsigned shown = 0;
    for (unsigned i = 0; i < FT__SEL_KEYS; i++) {
        ft__sel_entry *e = ft__sel_entry_at(sel, i, false);
        if (!e)
            continue;
        pthread_mutex_lock(&e->lock);
        uint32_t any = 0;
        for (unsigned k = 0; k < ft__narms; k++)
            any |= e->arm[k].n;
        if (any) {
            ft__sel_key key;
            ft__sel_key_decode(i, &key);
            int best = -1;
            float bm = 0;
            for (unsigned k = 0; k < ft__narms; k++)
                if (e->arm[k].n && ft__sel_median(&e->arm[k]) > bm) {
                    bm = ft__sel_median(&e->arm[k]);
                    best = (int)k;
                }
            char size[32];
            uint64_t b = 1ull << key.bucket;
            if (key.bucket >= FT__SEL_BUCKET_TOP)
                snprintf(size, sizeof size, "%lluM+", (unsigned long long)(b >> 20));
            else if (b >= (1u << 30))
                snprintf(size, sizeof size, "%lluG", (unsigned long long)(b >> 30));
            else if (b >= (1u << 20))
                snprintf(size, sizeof size, "%lluM", (unsigned long long)(b >> 20));
            else if (b >= 1024)
                snprintf(size, sizeof size, "%lluK", (unsigned long long)(b >> 10));
            else
                snprintf(size, sizeof size, "%llu", (unsigned long long)b);
            fprintf(out, "%-5s %-4s %7s %-7s %-4s %-4s  %-14s ",
                    key.write ? "write" : "read", key.mem ? "cuda" : "host", size,
                    key.write ? write_name[key.cache] : cache_name[key.cache],
                    key.busy ? "yes" : "no", key.cpu ? "high" : "low",
                    best >= 0 ? ft__arms[best].label : "-");
            for (unsigned k = 0; k < ft__narms; k++)
                if (e->arm[k].n)
                    fprintf(out, " %s=%.2f(%u)", ft__arms[k].label,
                            (double)ft__sel_median(&e->arm[k]) / 1e9, e->arm[k].n);
            fputc('\n', out);
            shown++;
        }
        pthread_mutex_unlock(&e->lock);
    }
    if (!shown)
        fprintf(out, "(empty: run `fastensor tune` or any transfers with engine auto)\n");
    return 0;
}
