/*
 * Engine AUTO: the selector (select/) wired to files and engines: a call's key, the arms it may
 * use (the cache policy), the policy's answer, what the call did as a sample. One selector per
 * filesystem device per context, with its profile loaded when first used and saved when the
 * context is destroyed (or by ft_profile_save). FASTENSOR_PROFILE: "off" disables persistence;
 * a directory holds one profile per device; any other value names the file itself. Default
 * directory: $XDG_CACHE_HOME/fastensor, else $HOME/.cache/fastensor.
 */
#include "internal.h"
#include "../select/select.h"
#include "../engine/engine.h"
#include "../base/syscall.h"

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

#define MAX_DEVICES 16

struct ft__auto {
    pthread_mutex_t lock;
    ft__company company; /* other contexts' transfers on the profile (company.c) */
    _Atomic uint32_t used[2]; /* per memory kind: the engines this context has run once */
    const char *labels[FT__SEL_MAX_ARMS]; /* the arms' names in profiles */
    uint8_t order[FT__SEL_MAX_ARMS]; /* the order arms nothing is known of are explored in */
    uint8_t family[FT__SEL_MAX_ARMS]; /* per arm, its engine's default arm */
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
    /* (a token distinct for every context of every process: its address, the process, the
     * time) */
    ft__company_init(&a->company, (uint64_t)(uintptr_t)a ^ (uint64_t)getpid() << 40 ^ now_ns());
    for (unsigned i = 0; i < ft__narms; i++)
        a->labels[i] = ft__arms[i].label;
    /* Each engine's default setting before its other settings (one piece, 8 MiB pieces): a
     * setting refines what its engine does. In table order, a fresh profile's cold loads
     * tried posix/1thread and mmap/1thread before mmap and fill (development VM, a 498 MB
     * cold load: 0.44-0.61 and 0.39-0.42 s against 0.26-0.30 s for posix, mmap and fill). */
    unsigned k = 0;
    for (unsigned pass = 0; pass < 2; pass++)
        for (unsigned i = 0; i < ft__narms; i++)
            if ((ft__arms[i].piece != 0) == pass)
                a->order[k++] = (uint8_t)i;
    /* A setting is judged by its engine's default where nothing else is known of it: a
     * fresh profile's 2-process loads tried mmap/1thread (0.93 s) after mmap had measured
     * 0.93-1.12 s beside others, fill 0.37-0.46 (development VM, `fastensor demo`). */
    for (unsigned i = 0; i < ft__narms; i++) {
        a->family[i] = (uint8_t)i;
        for (unsigned j = 0; j < ft__narms; j++)
            if (ft__arms[j].engine == ft__arms[i].engine && ft__arms[j].piece == 0 &&
                ft__arms[j].fill == ft__arms[i].fill) {
                a->family[i] = (uint8_t)j;
                break;
            }
    }
    *out = a;
    return 0;
}

static void profile_path(dev_t dev, char *out, size_t len)
{
    char dir[4096];
    ft__profile_place(dir, out, len < sizeof dir ? len : sizeof dir, true);
    if (dir[0])
        snprintf(out, len, "%s/profile-%u-%u.txt", dir, major(dev), minor(dev));
}

void ft__auto_enter(ft_ctx *ctx)
{
    atomic_fetch_add_explicit(&ctx->inflight, 1, memory_order_relaxed);
    ft__company_enter(&ctx->autosel->company);
}

void ft__auto_leave(ft_ctx *ctx)
{
    ft__company_leave(&ctx->autosel->company);
    atomic_fetch_sub_explicit(&ctx->inflight, 1, memory_order_relaxed);
}

/* The arms that go through the page cache. */
static uint32_t buffered_mask(void)
{
    uint32_t m = 0;
    for (unsigned i = 0; i < ft__narms; i++)
        if (!(ft__engine_get(ft__arms[i].engine)->caps & FT__CAP_BYPASS_CACHE))
            m |= 1u << i;
    return m;
}

/* The selector of the filesystem on device @p dev (created, with its profile, on first use). */
static ft__selector *selector_of_dev(ft__auto *a, dev_t dev)
{
    pthread_mutex_lock(&a->lock);
    ft__selector *sel = NULL;
    for (unsigned i = 0; i < a->n && !sel; i++)
        if (a->dev[i].dev == dev)
            sel = a->dev[i].sel;
    if (!sel && a->n < MAX_DEVICES && ft__sel_create(&sel, ft__narms) == 0) {
        sel->buffered = buffered_mask();
        sel->labels = a->labels;
        sel->order = a->order;
        sel->family = a->family;
        unsigned i = a->n++;
        a->dev[i].dev = dev;
        a->dev[i].sel = sel;
        snprintf(a->dev[i].tag, sizeof a->dev[i].tag, "dev=%u:%u", major(dev), minor(dev));
        profile_path(dev, a->dev[i].path, sizeof a->dev[i].path);
        ft__company_retry(&a->company); /* (the directory may be new: .active too) */
        if (a->dev[i].path[0]) {
            FT__KEEPING_DETAIL(if (ft__sel_load(sel, a->dev[i].path, a->dev[i].tag) < 0 &&
                                   !getenv("FASTENSOR_QUIET"))
                                   fprintf(stderr, "fastensor: ignoring profile (it will "
                                                   "be rebuilt): %s\n",
                                           ft_last_error()));
            atomic_store(&sel->dirty, 0);
        }
    }
    pthread_mutex_unlock(&a->lock);
    return sel;
}

/* The selector for the filesystem holding @p f, remembered by the file. */
static ft__selector *selector_for(ft_file *f)
{
    ft__selector *known = atomic_load_explicit(&f->au->sel, memory_order_acquire);
    if (known)
        return known;
    struct stat st;
    if (ft__sys.fstat(f->fd, &st) != 0)
        return NULL;
    ft__selector *sel = selector_of_dev(f->ctx->autosel, st.st_dev);
    atomic_store_explicit(&f->au->sel, sel, memory_order_release);
    return sel;
}

/* What file_caps knows of a file: worked out (1), O_DIRECT opens (2), engine e usable
 * (ENGINE_OK(e): available in the process, and O_DIRECT works where it needs that). */
#define CAPS_KNOWN 1u
#define CAPS_DIRECT 2u
#define ENGINE_OK(e) (4u << (e))

static unsigned probe_caps(ft_file *f)
{
    bool direct = ft__file_direct_fd(f) >= 0;
    unsigned caps = CAPS_KNOWN | (direct ? CAPS_DIRECT : 0);
    for (int e = 0; e < FT_ENGINE_COUNT; e++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)e);
        /* an engine with ready() is asked per call instead: its available() may wait */
        if (ops && !ops->ready && (direct || !(ops->caps & FT__CAP_NEEDS_DIRECT)) &&
            ft_engine_available(f->ctx, (ft_engine)e, NULL))
            caps |= ENGINE_OK(e);
    }
    return caps;
}

/* Engines usable for @p f, worked out once per file (the probes' failures are no error of
 * the call's). */
static unsigned file_caps(ft_file *f)
{
    unsigned caps = atomic_load_explicit(&f->au->caps, memory_order_acquire);
    if (caps)
        return caps;
    FT__KEEPING_DETAIL(caps = probe_caps(f));
    atomic_store_explicit(&f->au->caps, caps, memory_order_release);
    return caps;
}

/* Page-cache class of a read, probed at most once per millisecond per file: in a loop of
 * small reads the probe would cost as much as the read. */
static unsigned cache_class(ft_file *f, uint64_t off, uint64_t len, uint64_t now)
{
    uint64_t memo = atomic_load_explicit(&f->au->cache_memo, memory_order_relaxed);
    if (memo && now - (memo >> 2) < 1000000u)
        return (unsigned)(memo & 3);
    unsigned cls = ft__probe_cache(f->fd, off, len);
    atomic_store_explicit(&f->au->cache_memo, (now << 2) | cls, memory_order_relaxed);
    return cls;
}

/*
 * A read that goes on from the file's previous one, in a run that started uncached, is a
 * stream read: the kernel's readahead serves buffered engines ahead of it, so most of its
 * pages are found cached, by the buffered engine's own doing. "Goes on" allows for requests
 * in flight, decided out of order in the pool's threads: within 32 lengths, and within
 * 64 MiB or twice the calls in flight times the length. The same range again, a read at the
 * file's start (a new pass) or a farther jump is no stream.
 */
static unsigned read_class(ft_file *f, uint64_t off, uint64_t len, unsigned inflight,
                           uint64_t now)
{
    unsigned cls = cache_class(f, off, len, now);
    uint64_t prev = atomic_exchange_explicit(&f->au->read_end, off + len, memory_order_relaxed);
    uint64_t gap = prev > off ? prev - off : off - prev;
    uint64_t reach = FT__MAX((uint64_t)64 << 20, 2ull * inflight * len);
    bool seq = prev != 0 && off != 0 && gap / 32 <= len && gap <= reach && off + len != prev;
    if (!seq || cls == FT__CLS_COLD)
        atomic_store_explicit(&f->au->stream_cold, cls == FT__CLS_COLD, memory_order_relaxed);
    return seq && atomic_load_explicit(&f->au->stream_cold, memory_order_relaxed) ? FT__CLS_STREAM
                                                                              : cls;
}

/* A fill arm pays for its pipeline (a thread, a copy per span) from this size up. */
#define FILL_MIN (16u << 20)

/* The fill arms. */
/* What the arm table says, worked out once (every decision reads it): the fill arms, and the
 * arms explored first where nothing is known, lowest rank first. */
static struct {
    pthread_once_t once;
    uint32_t fill;
    unsigned nfirst;
    uint8_t first[FT__SEL_MAX_ARMS];
} arm_facts = {.once = PTHREAD_ONCE_INIT};

static void arm_facts_init(void)
{
    for (unsigned i = 0; i < ft__narms; i++)
        arm_facts.fill |= (uint32_t)ft__arms[i].fill << i;
    for (unsigned rank = 1; rank <= UINT8_MAX; rank++)
        for (unsigned i = 0; i < ft__narms; i++)
            if (ft__arms[i].first == rank)
                arm_facts.first[arm_facts.nfirst++] = (uint8_t)i;
}

static uint32_t fill_mask(void)
{
    pthread_once(&arm_facts.once, arm_facts_init);
    return arm_facts.fill;
}

/* The arms that can run this transfer (key @p k) on @p f. */
static uint32_t eligible_arms(ft_file *f, const ft__sel_key *k, uint64_t len, int device)
{
    unsigned caps = file_caps(f);
    uint32_t mask = 0;
    for (unsigned i = 0; i < ft__narms; i++) {
        const ft__arm *arm = &ft__arms[i];
        const ft__engine_ops *ops = ft__engine_get(arm->engine);
        if ((ops->caps & FT__CAP_DEVICE_MEMORY) && device < 0)
            continue;
        if ((ops->caps & FT__CAP_CACHED_READS) && (k->write || k->cls != FT__CLS_CACHED))
            continue;
        if (arm->fill && (!ops->fill || k->write || k->cls == FT__CLS_CACHED || len < FILL_MIN))
            continue; /* it reads uncached data ahead: nothing to read ahead */
        bool direct_ok = (caps & CAPS_DIRECT) || !(ops->caps & FT__CAP_NEEDS_DIRECT);
        if (ops->ready ? !(direct_ok && ops->ready(f)) : !(caps & ENGINE_OK(arm->engine)))
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

/*
 * The cache policy: which arms a call may use, by what the objective (select/objective.c)
 * says the call should leave in the page cache. Where what it asks for cannot run (no
 * O_DIRECT on the filesystem), every arm may.
 */
static uint32_t cache_arms(ft_file *f, ft__selector *sel, const ft__sel_key *k, uint64_t len,
                           int mode, uint32_t eligible, uint64_t now, int *resolved)
{
    uint32_t buffered = sel ? sel->buffered : buffered_mask();
    uint64_t data = 0, room = 0;
    if (mode == FT_CACHE_AUTO && !k->write && k->cls != FT__CLS_CACHED) {
        int64_t size = ft__file_size(f);
        data = FT__MAX(size > 0 ? (uint64_t)size : 0,
                       atomic_load_explicit(&f->au->ws_hint, memory_order_relaxed));
        room = ft__probe_cache_room();
    }
    mode = ft__sel_cache_goal(sel, k, len, mode, data, room, now);
    *resolved = mode;
    if (mode == FT_CACHE_AUTO)
        return eligible;
    uint32_t m = eligible & (mode == FT_CACHE_KEEP ? buffered : ~buffered);
    *resolved = m ? mode : FT_CACHE_AUTO;
    return m ? m : eligible;
}

int ft__auto_spill_goal(ft_file *f, uint64_t data, uint64_t limit)
{
    if (ft__file_direct_fd(f) < 0)
        return FT_CACHE_KEEP; /* no O_DIRECT here: the page cache is the only way */
    return ft__sel_spill_goal(data, limit);
}

bool ft__auto_keeps(ft_file *f, int cache)
{
    int mode = cache != FT_CACHE_AUTO ? cache : (int)f->ctx->cfg.cache;
    ft__sel_key k = {.mem = FT_MEM_HOST, .bucket = FT__SEL_BUCKET_TOP, .cls = FT__CLS_COLD};
    uint32_t all = (1u << ft__narms) - 1;
    cache_arms(f, selector_for(f), &k, UINT64_MAX, mode, all, now_ns(), &mode);
    return mode == FT_CACHE_KEEP;
}

/* The arm explored first for a key nothing is known about: for uncached reads into device
 * memory the fill arm (read ahead in parallel, each part copied as cached data: what such
 * loads always did before it was an arm; into host memory, 512 MiB cold, it ran at about
 * 0.75x posix on the development machine, so there AUTO measures it among the others);
 * else the arm of the lowest rank (ft__arm.first: a page-cache copy for buffered reads,
 * io_uring, then direct for large O_DIRECT ones), else the first eligible one. */
static unsigned static_default(uint32_t eligible, uint64_t len, const ft__sel_key *k)
{
    uint32_t fill = eligible & fill_mask(); /* (arm_facts made) */
    if (k->mem == FT_MEM_CUDA && fill)
        return (unsigned)__builtin_ctz(fill);
    for (unsigned j = 0; j < arm_facts.nfirst; j++) {
        unsigned i = arm_facts.first[j];
        if ((eligible >> i & 1) && (ft__arms[i].first == 1 || len >= (1u << 20)))
            return i;
    }
    return (unsigned)__builtin_ctz(eligible);
}

/*
 * Small reads are timed one in SMALL_READ_EVERY (per thread), trials always: timing and
 * recording a call (two clock reads, the key's lock) cost about 100 ns, most of a 4 KiB
 * cached read's overhead. A key of small reads gets thousands of calls, so its samples still
 * come by the hundred. Writes are always timed.
 */
#define SMALL_READ (256u << 10)
#define SMALL_READ_EVERY 8

/* Whether to time this small read: drawn (xorshift, per thread), not counted (a shared
 * counter aliases with a job's pattern of keys). */
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

/* The key of a call (and the context's transfers in flight, in d->inflight). */
static void call_key(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned cls,
                     int device, uint64_t now, ft__decision *d)
{
    d->inflight = atomic_load_explicit(&f->ctx->inflight, memory_order_relaxed);
    d->key = (ft__sel_key){
        .write = write,
        .mem = device >= 0 ? FT_MEM_CUDA : FT_MEM_HOST,
        .bucket = (uint8_t)ft__sel_bucket(len),
        .cls = write || cls == FT__CLS_CACHED
                   ? (uint8_t)cls
                   : (uint8_t)read_class(f, off, len, d->inflight, now),
        .busy = d->inflight > 1 || ft__company_now(&f->ctx->autosel->company),
    };
}

void ft__auto_decide(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned cls,
                     int device, int cache, ft__decision *d)
{
    memset(d, 0, sizeof *d);
    uint64_t now = now_ns();
    ft__selector *sel = selector_for(f);
    call_key(f, off, len, write, cls, device, now, d);
    int mode;
    uint32_t eligible = cache_arms(f, sel, &d->key, len, cache,
                                   eligible_arms(f, &d->key, len, device), now, &mode);
    d->sel = sel;
    unsigned fallback = static_default(eligible, len, &d->key);
    if (!sel)
        d->arm = fallback;
    else if (!(ft__win_key(&d->key) && !write &&
               (d->joined = ft__win_join(&f->au->wins, sel, &d->key, eligible, &d->arm))))
        d->arm = ft__sel_choose(sel, &d->key, eligible, fallback, &d->trial);
    d->engine = ft__arms[d->arm].engine;
    d->piece = ft__arms[d->arm].piece;
    d->fill = ft__arms[d->arm].fill;
    bool timed = write || d->trial || ft__win_key(&d->key) || len >= SMALL_READ ||
                 small_read_drawn(now);
    /* the clock starts now: the decision's own cost (the first call of a file opens its
     * O_DIRECT descriptor, loads the profile, probes io_uring) is no arm's */
    d->t0 = timed ? now_ns() : 0;
}

/*
 * A call of a fixed engine is a sample of that engine's arm (its default settings) too: what
 * a process that named an engine measured, AUTO in the next one knows (the profile is the
 * filesystem's). Calls of SMALL_READ and more only: the key's cache probe costs about what a
 * small cached read does.
 */
bool ft__auto_observes = true;

bool ft__auto_observe(ft_file *f, uint64_t off, uint64_t len, bool write, unsigned cls,
                      int device, ft_engine engine, ft__decision *d)
{
    memset(d, 0, sizeof *d);
    if (len < SMALL_READ || !ft__auto_observes)
        return false;
    unsigned arm = 0;
    while (arm < ft__narms && (ft__arms[arm].engine != engine || ft__arms[arm].piece ||
                               ft__arms[arm].fill))
        arm++;
    ft__selector *sel = arm < ft__narms ? selector_for(f) : NULL;
    if (!sel)
        return false;
    call_key(f, off, len, write, cls, device, now_ns(), d);
    d->sel = sel;
    d->arm = arm;
    d->engine = engine;
    d->fixed = true;
    d->t0 = now_ns();
    return true;
}

/* A call shorter than this amortizes no engine's one-time setup: its first call in a context
 * is not a sample. */
#define SETUP_AMORTIZED_NS 250000000ull

/*
 * Whether this is the context's first call of the decision's engine for its memory kind
 * (engines, not arms: an engine's settings share what it sets up), where that engine sets
 * something up. That call pays for what the engine sets up once and keeps (pinned staging
 * buffers and CUDA streams: 12 ms on the H200 machine; an io_uring ring; bounce buffers),
 * which says nothing of the arm's speed: recorded, a 4 KiB staged read looked 50 times slower
 * than it is. The page-cache engines set nothing up for host memory (the pool is the
 * context's): their first call is a sample, the only one a process that loads a checkpoint
 * once gives (development machine, a cached 498 MB load by posix: 109 and 101 ms as a
 * context's first call, 81-104 ms as its second and third).
 */
static bool first_use(ft_file *f, const ft__decision *d)
{
    if (!d->key.mem && !(ft__engine_get(d->engine)->caps & FT__CAP_SETS_UP))
        return false;
    uint32_t bit = 1u << d->engine;
    _Atomic uint32_t *used = &f->ctx->autosel->used[d->key.mem & 1];
    if (atomic_load_explicit(used, memory_order_relaxed) & bit)
        return false;
    return !(atomic_fetch_or_explicit(used, bit, memory_order_relaxed) & bit);
}

/* FASTENSOR_TRACE=FILE: one line per AUTO call (key, arm, bytes, nanoseconds, transfers in
 * flight at its start, the caller's whole call, what became of it). */
static FILE *trace_file;
static void trace_open(void)
{
    const char *path = getenv("FASTENSOR_TRACE");
    int fd = path && *path ? ft__sys.open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)
                           : -1;
    if (fd >= 0 && !(trace_file = fdopen(fd, "a")))
        ft__sys.close(fd); /* no fault test: fdopen fails only without memory */
    if (trace_file)
        setvbuf(trace_file, NULL, _IOLBF, 0);
}

static void trace_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace_line(const char *fmt, ...)
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

static void trace(const ft__decision *d, const ft__sel_key *key, int64_t result, uint64_t ns,
                  const char *what)
{
    trace_line("%s %s bucket=%u cls=%u busy=%u arm=%s bytes=%lld ns=%llu inflight=%u "
                        "call=%llu%s %s\n", key->write ? "write" : "read",
                        key->mem ? "cuda" : "host", key->bucket, key->cls, key->busy,
                        ft__arms[d->arm].label, (long long)result, (unsigned long long)ns,
                        d->inflight, (unsigned long long)d->call,
                        d->trial ? " trial" : d->fixed ? " fixed" : "", what);
}

void ft__auto_done(ft_file *f, const ft__decision *d, int64_t result, bool counted)
{
    if (!d->sel)
        return;
    ft__decision s = *d;
    uint64_t ns = d->t0 ? now_ns() - d->t0 : 0;
    /* transfers in flight at the call's end, this one included */
    unsigned end = atomic_load_explicit(&f->ctx->inflight, memory_order_relaxed) + !counted;
    bool setup = first_use(f, d) && ns < SETUP_AMORTIZED_NS;
    /* A call that began alone but ends beside others (the context's, or another's), or that
     * another's transfers came and went beside, did not run alone: its sample is one of calls
     * in flight (its trial, if any, ends unmeasured in its own key). */
    if (!s.key.busy &&
        (end > 1 || ft__company_now(&f->ctx->autosel->company) ||
         (d->t0 && d->call >= SMALL_READ &&
          ft__company_since(&f->ctx->autosel->company, d->t0)))) {
        s.key.busy = 1;
        if (s.trial)
            ft__sel_release(d->sel, &d->key, d->arm);
        s.trial = false;
    }
    if (result <= 0 || !d->t0 || setup) {
        trace(d, &s.key, result, ns, result <= 0 ? "failed" : setup ? "first-use" : "untimed");
        if (s.trial)
            ft__sel_release(d->sel, &s.key, d->arm);
        return;
    }
    /* Transfers running at once share the threads and the disk: a call beside k others took
     * about k+1 times its own time. Its share (transfers in flight at its start and end,
     * averaged) keeps samples taken under load comparable with the rest. */
    unsigned conc = (d->inflight + end) / 2;
    if (conc > 1)
        ns /= conc;
    bool windowed = ft__win_key(&s.key);
    trace(d, &s.key, result, ns, windowed ? "window" : "sample");
    if (windowed)
        ft__win_add(&f->au->wins, d->sel, &s.key, d->arm, s.trial, (uint64_t)result, ns);
    else
        ft__sel_record(d->sel, &s.key, d->arm, (uint64_t)result, ns, s.trial);
}

void ft__auto_synced(ft_file *f, uint64_t ns)
{
    ft__win_flush(&f->au->wins, ns, false);
}

void ft__auto_file_close(ft_file *f)
{
    ft__win_flush(&f->au->wins, 0, true);
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
    FT__KEEPING_DETAIL(save_all(a, true));
    for (unsigned i = 0; i < a->n; i++)
        ft__sel_destroy(a->dev[i].sel);
    ft__company_destroy(&a->company);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int ft_profile_save(ft_ctx *ctx)
{
    if (!ctx)
        return ft__err(-EINVAL, "ft_profile_save: context is NULL");
    return save_all(ctx->autosel, false);
}

/* The selector of the filesystem holding @p path (a file or a directory) in *sel, its
 * profile's name in *ppath. @return 0 or -errno. */
static int selector_of_path(ft_ctx *ctx, const char *path, ft__selector **sel,
                            const char **ppath)
{
    int fd = ft__sys.open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0)
        return ft__err(-errno, "cannot open %s", path);
    struct stat st;
    int rc = ft__sys.fstat(fd, &st) == 0 ? 0 : ft__err(-errno, "cannot stat %s", path);
    ft__sys.close(fd);
    if (rc < 0)
        return rc;
    ft__auto *a = ctx->autosel;
    if (!(*sel = selector_of_dev(a, st.st_dev)))
        return ft__err(-ENOMEM, "selector");
    for (unsigned i = 0; i < a->n; i++)
        if (a->dev[i].sel == *sel)
            *ppath = a->dev[i].path[0] ? a->dev[i].path : "(not persisted)";
    return 0;
}

int ft_profile_show(ft_ctx *ctx, const char *path, FILE *out)
{
    if (!ctx || !path || !out)
        return ft__err(-EINVAL, "ft_profile_show: missing argument");
    const char *ppath = "";
    ft__selector *sel;
    int rc = selector_of_path(ctx, path, &sel, &ppath);
    if (rc < 0)
        return rc;
    fprintf(out, "profile %s\n\n", ppath);
    ft__sel_show(sel, out);
    return 0;
}

int ft_cache_policy(ft_ctx *ctx, const char *path, ft_mem_kind mem, ft_cache_info *out)
{
    if (!ctx || !path || !out || (mem != FT_MEM_HOST && mem != FT_MEM_CUDA))
        return ft__err(-EINVAL, "ft_cache_policy: bad argument");
    const char *ppath = "";
    ft__selector *sel;
    int rc = selector_of_path(ctx, path, &sel, &ppath);
    if (rc < 0)
        return rc;
    memset(out, 0, sizeof *out);
    out->room = ft__sel_cache_fits(ft__probe_cache_room());
    out->prefer_direct = ft__sel_measured_direct(sel, mem == FT_MEM_CUDA, false,
                                                 &out->buffered_bps, &out->direct_bps);
    return 0;
}
