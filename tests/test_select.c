/* The selector's properties, with fake arms of known cost on an injected clock: convergence,
 * regret under noise and drift, unseen keys, skipped arms, trials in flight, profile round
 * trip, concurrency. Then engine AUTO on real files: bytes, the cache policy, sample windows,
 * first uses, trial slices. */
#include "testlib.h"
#include "../src/core/internal.h" /* select.h, and the files AUTO wires to */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ARMS 8
#define ALL ((1u << ARMS) - 1)

/* ---- the fake world: arms of known throughput, a clock, multiplicative noise ---- */

static uint64_t fake_now;
static double tput[ARMS];   /* bytes per second of each arm */
static double noise = 0.1;  /* each call's time is off by up to this share, either way */
static uint64_t rng = 12345;

static double uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* One call: choose, run for bytes / tput(+-noise) on the fake clock, record. */
static unsigned step(ft__selector *s, const ft__sel_key *k, uint32_t eligible, uint64_t bytes)
{
    bool trial;
    unsigned arm = ft__sel_choose(s, k, eligible, 0, &trial);
    uint64_t ns = (uint64_t)((double)bytes / tput[arm] * 1e9 * (1 + noise * (2 * uniform() - 1)));
    fake_now += ns;
    ft__sel_record(s, k, arm, bytes, ns, trial);
    return arm;
}

static unsigned best_of(uint32_t eligible)
{
    unsigned b = (unsigned)__builtin_ctz(eligible);
    for (unsigned a = 0; a < ARMS; a++)
        if ((eligible >> a & 1) && tput[a] > tput[b])
            b = a;
    return b;
}

/* Distinct costs, 0.5 .. 4 GB/s, in an order the seed picks. */
static void set_costs(uint64_t seed)
{
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = 0.5e9 * (1 + (double)((a * 5 + seed) % ARMS) / 2);
}

/* @p calls steps of @p bytes: the time taken over the time the best arm would have taken. */
static double regret(ft__selector *s, const ft__sel_key *k, unsigned calls, uint64_t bytes,
                     unsigned *best_picks)
{
    uint64_t t0 = fake_now;
    unsigned hits = 0;
    for (unsigned i = 0; i < calls; i++)
        hits += step(s, k, ALL, bytes) == best_of(ALL);
    if (best_picks)
        *best_picks = hits;
    return (double)(fake_now - t0) / ((double)calls * (double)bytes / tput[best_of(ALL)] * 1e9);
}

static const ft__sel_key key20 = {.bucket = 20, .cls = FT__CLS_CACHED};

static ft__selector *fresh(void)
{
    ft__selector *s = NULL;
    if (ft__sel_create(&s, ARMS) != 0) {
        fprintf(stderr, "ft__sel_create failed\n");
        exit(1);
    }
    return s;
}

/* Every cost order: after a budget of 4 calls per arm, >= 95% of decisions are the best. */
static void case_converges(void)
{
    unsigned worst = 1000;
    for (uint64_t seed = 0; seed < ARMS; seed++) {
        ft__selector *s = fresh();
        set_costs(seed);
        regret(s, &key20, 4 * ARMS, 1 << 20, NULL);
        unsigned hits;
        regret(s, &key20, 500, 1 << 20, &hits);
        worst = hits < worst ? hits : worst;
        ft__sel_destroy(s);
    }
    printf("  worst of %u cost orders: %u of 500 decisions on the best arm\n", ARMS, worst);
    T_TRUE(worst >= 475);
}

/* Regret under heavy noise (+-30%): the whole run, exploration included, within 15% of
 * always using the best arm; with arms 3% apart (inside the noise) within 5%. */
static void case_regret_noise(void)
{
    noise = 0.3;
    double worst = 0;
    for (uint64_t seed = 0; seed < 4; seed++) {
        ft__selector *s = fresh();
        set_costs(seed);
        double r = regret(s, &key20, 2000, 1 << 20, NULL);
        worst = r > worst ? r : worst;
        ft__sel_destroy(s);
    }
    ft__selector *s = fresh();
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a < 2 ? 2e9 * (a ? 1.03 : 1) : 0.5e9;
    double ties = regret(s, &key20, 2000, 1 << 20, NULL);
    ft__sel_destroy(s);
    noise = 0.1;
    printf("  +-30%% noise: time / best arm's %.3f (worst of 4); two arms 3%% apart %.3f\n",
           worst, ties);
    T_TRUE(worst < 1.15);
    T_TRUE(ties < 1.05);
}

/* Drift: the costs change order mid-run; the new best leads again within 100 calls. */
static void case_drift(void)
{
    ft__selector *s = fresh();
    set_costs(1);
    regret(s, &key20, 500, 1 << 20, NULL);
    set_costs(4);
    regret(s, &key20, 100, 1 << 20, NULL);
    unsigned hits;
    double r = regret(s, &key20, 400, 1 << 20, &hits);
    printf("  after the change: %u of 400 on the new best, time / best %.3f\n", hits, r);
    T_TRUE(hits >= 360);
    ft__sel_destroy(s);
}

/* Arms under half the best after two samples are skipped, not re-tried. */
static void case_skip(void)
{
    ft__selector *s = fresh();
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a == 3 ? 2e9 : a == 5 ? 1.6e9 : 0.6e9;
    regret(s, &key20, 100, 1 << 20, NULL);
    unsigned slow = 0;
    for (unsigned i = 0; i < 1000; i++) {
        unsigned a = step(s, &key20, ALL, 1 << 20);
        slow += a != 3 && a != 5;
    }
    printf("  calls on arms under half the best after 100 calls: %u of 1000\n", slow);
    T_EQ(slow, 0u);
    ft__sel_destroy(s);
}

/* An unseen key starts from the nearest measured one: its first call is the neighbour's best,
 * and it never explores what the neighbour measured at under half the best. */
static void case_unseen_keys(void)
{
    ft__selector *s = fresh();
    set_costs(2);
    regret(s, &key20, 200, 1 << 20, NULL);
    ft__sel_key near = key20, far = key20;
    near.bucket = 22;
    far.bucket = 10; /* beyond the reach of estimates: explored afresh */
    bool trial;
    T_EQ(ft__sel_choose(s, &near, ALL, 0, &trial), best_of(ALL));
    ft__sel_release(s, &near, best_of(ALL));
    unsigned hopeless = 0;
    for (unsigned i = 0; i < 100; i++) {
        unsigned a = step(s, &near, ALL, 4 << 20);
        hopeless += tput[a] < 0.5 * tput[best_of(ALL)];
    }
    T_EQ(ft__sel_choose(s, &far, ALL, 6, &trial), 6u); /* nothing known: the fallback */
    T_TRUE(trial);
    ft__sel_release(s, &far, 6);
    printf("  4 MiB key beside a measured 1 MiB one: %u calls on hopeless arms\n", hopeless);
    T_EQ(hopeless, 0u);
    /* only the eligible arms are ever chosen */
    for (unsigned i = 0; i < 200; i++)
        T_TRUE((0x24u >> step(s, &far, 0x24, 1 << 20)) & 1);
    ft__sel_destroy(s);
}

/* Trials in flight: calls decided before any sample came back explore different arms, and
 * every trial's end (sample or release) leaves nothing pending. */
static void case_trials_in_flight(void)
{
    ft__selector *s = fresh();
    set_costs(3);
    unsigned arm[ARMS];
    bool trial[ARMS];
    uint32_t seen = 0;
    for (unsigned i = 0; i < ARMS; i++) {
        arm[i] = ft__sel_choose(s, &key20, ALL, 0, &trial[i]);
        T_TRUE(trial[i]);
        seen |= 1u << arm[i];
    }
    printf("  %u calls decided at once explored %d arms\n", ARMS, __builtin_popcount(seen));
    T_EQ(seen, ALL);
    for (unsigned i = 0; i < ARMS; i++)
        if (i % 2)
            ft__sel_record(s, &key20, arm[i], 1 << 20, 1000000, trial[i]);
        else
            ft__sel_release(s, &key20, arm[i]);
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&key20), false);
    for (unsigned a = 0; a < ARMS; a++)
        T_EQ(e->arm[a].pending, 0u);
    ft__sel_destroy(s);
}

/* Once settled, a decision is the lock-free one (no trial, the same arm), until a sample. */
static void case_fast_path(void)
{
    ft__selector *s = fresh();
    set_costs(5);
    regret(s, &key20, 300, 1 << 20, NULL);
    bool trial = true;
    unsigned a = ft__sel_choose(s, &key20, ALL, 0, &trial);
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&key20), false);
    T_TRUE(!trial);
    T_EQ(atomic_load(&e->fast), (uint64_t)ALL << 8 | (a + 1));
    pthread_mutex_lock(&e->lock); /* held: a decision must not need it */
    for (unsigned i = 0; i < 1000; i++)
        T_EQ(ft__sel_choose(s, &key20, ALL, 0, &trial), a);
    pthread_mutex_unlock(&e->lock);
    ft__sel_record(s, &key20, a, 1 << 20, 1000000, false);
    T_EQ(atomic_load(&e->fast), 0u);
    ft__sel_destroy(s);
}

static void case_profile(void)
{
    ft__selector *s = fresh(), *t = fresh();
    set_costs(6);
    regret(s, &key20, 200, 1 << 20, NULL);
    const char *path = t_path("profile.txt");
    T_EQ(ft__sel_save(s, path, "dev=1:2 test"), 0);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), 0);
    bool trial;
    T_EQ(ft__sel_choose(t, &key20, ALL, 7, &trial), best_of(ALL)); /* starts warm */
    T_TRUE(!trial);
    unsigned idx = ft__sel_key_index(&key20);
    for (unsigned a = 0; a < ARMS; a++) {
        ft__sel_arm *x = &ft__sel_entry_at(s, idx, true)->arm[a];
        ft__sel_arm *y = &ft__sel_entry_at(t, idx, true)->arm[a];
        T_EQ(FT__MIN(x->n, 8u), y->n);
        T_TRUE(fabsf(x->mean - y->mean) < 1e-4f);
    }
    ft__sel_destroy(t);
    /* another machine's profile, a corrupt one, another version: refused, nothing loaded */
    t = fresh();
    T_EQ(ft__sel_load(t, path, "dev=9:9 test"), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "another machine") != NULL);
    FILE *f = fopen(path, "a");
    fputs("0 0 20 1 0 #3 2 1e9 banana\n", f);
    fclose(f);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "profile.txt:") != NULL);
    T_EQ(ft__sel_choose(t, &key20, ALL, 7, &trial), 7u);
    ft__sel_release(t, &key20, 7);
    f = fopen(path, "w");
    fputs("fastensor-profile 1\ntag dev=1:2 test\n", f);
    fclose(f);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "version-2") != NULL);
    T_EQ(ft__sel_load(t, t_path("absent.txt"), "x"), 0);
    /* arms go by label: one this build lacks is skipped, the others load */
    f = fopen(path, "w");
    fputs("fastensor-profile 2\ntag dev=1:2 test\n0 0 20 1 0 warp9 2 9e9 9e9\n"
          "0 0 20 1 0 #4 2 2e9 2e9\n", f);
    fclose(f);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), 0);
    unsigned loaded = 0;
    for (unsigned a = 0; a < ARMS; a++)
        loaded += ft__sel_entry_at(t, idx, true)->arm[a].n;
    T_EQ(ft__sel_entry_at(t, idx, true)->arm[4].n, 2u);
    T_EQ(loaded, 2u);
    ft__sel_destroy(t);
    ft__sel_destroy(s);
}

static ft__selector *shared;

static void *hammer(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg * 7919 + 1;
    for (unsigned i = 0; i < 20000; i++) {
        r = r * 6364136223846793005ull + 1;
        ft__sel_key k = {.write = r >> 63, .bucket = (uint8_t)(10 + (r >> 40) % 12),
                         .cls = (uint8_t)((r >> 20) % 3), .busy = (r >> 30) & 1};
        bool trial;
        unsigned arm = ft__sel_choose(shared, &k, ALL, 0, &trial);
        if ((r >> 10) % 16 == 0)
            ft__sel_release(shared, &k, arm); /* (also when no trial: must be harmless) */
        else
            ft__sel_record(shared, &k, arm, 1 << 20, (uint64_t)(1e6 / (1 + arm)), trial);
    }
    return NULL;
}

/* 8 threads choosing, recording and releasing at once: the fastest arm found everywhere it
 * was measured, no trial left pending. */
static void case_concurrent(void)
{
    shared = fresh();
    pthread_t th[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, hammer, (void *)i);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    unsigned keys = 0, found = 0, pending = 0;
    for (unsigned i = 0; i < FT__SEL_KEYS; i++) {
        ft__sel_entry *e = ft__sel_entry_at(shared, i, false);
        if (!e)
            continue;
        keys++;
        int lead = -1;
        for (unsigned a = 0; a < ARMS; a++) {
            pending += e->arm[a].pending;
            if (e->arm[a].n && (lead < 0 || e->arm[a].mean > e->arm[lead].mean))
                lead = (int)a;
        }
        found += lead == ARMS - 1;
    }
    printf("  %u keys, %u led by the fastest arm, %u trials pending\n", keys, found, pending);
    T_TRUE(keys > 0 && found == keys);
    T_EQ(pending, 0u);
    ft__sel_destroy(shared);
}

/* ---- engine AUTO on real files ---- */

typedef struct real_file {
    ft_ctx *ctx;
    ft_file *f;
    uint8_t *src, *dst;
    size_t n;
} real_file;

static int real_open(real_file *x, const char *name, size_t n, uint64_t seed)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    x->n = n;
    x->ctx = t_ctx(4);
    x->src = malloc(n);
    x->dst = malloc(n);
    if (!x->ctx || !x->src || !x->dst ||
        ft_file_open(x->ctx, &x->f, t_path(name),
                     FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644) < 0)
        return -1;
    t_fill_random(x->src, n, seed);
    ft_buf b = ft_host_buf(x->src, n);
    return ft_write(x->f, &b, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX, .flags = FT_IO_SYNC}) ==
                   (int64_t)n ? 0 : -1;
}

static void real_close(real_file *x)
{
    ft_file_close(x->f);
    ft_ctx_destroy(x->ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(x->src);
    free(x->dst);
}

static ft__sel_arm arm_of(ft_file *f, const ft__sel_key *k, unsigned arm)
{
    ft__selector *sel = atomic_load(&f->au->sel);
    ft__sel_entry *e = sel ? ft__sel_entry_at(sel, ft__sel_key_index(k), false) : NULL;
    ft__sel_arm st = {{0}, 0, 0, 0, 0};
    if (e) {
        pthread_mutex_lock(&e->lock);
        st = e->arm[arm];
        pthread_mutex_unlock(&e->lock);
    }
    return st;
}

/* Samples of every arm for @p k on @p f. */
static unsigned samples_of(ft_file *f, const ft__sel_key *k)
{
    unsigned n = 0;
    for (unsigned a = 0; a < ft__narms; a++)
        n += arm_of(f, k, a).n;
    return n;
}

static void evict(ft_file *f)
{
    t_evict(f->path);
}

/* The cache modes: keep leaves a cold read's data in the page cache, bypass does not; auto
 * keeps data that fits and bypasses what does not (a checkpoint's whole size counts). */
static void case_cache_modes(void)
{
    real_file x;
    T_EQ(real_open(&x, "cache.bin", 8u << 20, 3), 0);
    ft_buf d = ft_host_buf(x.dst, x.n);
    int fd = open(x.f->path, O_RDONLY);
    static const struct { int mode; uint64_t hint; unsigned cached; const char *what; } runs[] = {
        {FT_CACHE_KEEP, 0, FT__CLS_CACHED, "keep"},
        {FT_CACHE_BYPASS, 0, FT__CLS_COLD, "bypass"},
        {FT_CACHE_AUTO, 0, FT__CLS_CACHED, "auto, 8 MiB file"},
        {FT_CACHE_AUTO, UINT64_MAX / 2, FT__CLS_COLD, "auto, part of a checkpoint too large"},
    };
    for (unsigned i = 0; i < sizeof runs / sizeof *runs; i++) {
        for (unsigned rep = 0; rep < 3; rep++) { /* whatever arm each call explores */
            atomic_store(&x.f->au->ws_hint, runs[i].hint);
            evict(x.f);
            atomic_store(&x.f->au->cache_memo, 0);
            memset(x.dst, 0, x.n);
            T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.cache = (ft_cache_mode)runs[i].mode}), x.n);
            T_MEMEQ(x.src, x.dst, x.n);
            unsigned after = ft__probe_cache(fd, 0, x.n);
            if (rep == 0)
                printf("  %s: %s after a cold read\n", runs[i].what,
                       after == FT__CLS_CACHED ? "cached" : "not cached");
            T_EQ(after, runs[i].cached);
        }
    }
    close(fd);
    T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.cache = (ft_cache_mode)7}), -EINVAL);
    ft_cache_info ci;
    T_EQ(ft_cache_policy(x.ctx, x.f->path, FT_MEM_HOST, &ci), 0);
    T_TRUE(ci.room > 0 && !ci.prefer_direct);
    /* a device whose cold reads measured well ahead O_DIRECT: data that fits goes O_DIRECT */
    ft__selector *sel = atomic_load(&x.f->au->sel);
    ft__sel_key cold = {.bucket = FT__SEL_BUCKET_TOP, .cls = FT__CLS_COLD};
    for (unsigned i = 0; i < 2; i++) {
        ft__sel_record(sel, &cold, 0, 1u << 30, 1000000000, false); /* posix 1.07 GB/s */
        ft__sel_record(sel, &cold, 2, 1u << 30, 400000000, false);  /* direct 2.7 GB/s */
    }
    atomic_store(&sel->direct_memo[0], 0);
    T_EQ(ft_cache_policy(x.ctx, x.f->path, FT_MEM_HOST, &ci), 0);
    printf("  measured cold: buffered %.2f GB/s, O_DIRECT %.2f: prefer O_DIRECT %d\n",
           ci.buffered_bps / 1e9, ci.direct_bps / 1e9, ci.prefer_direct);
    T_TRUE(ci.prefer_direct);
    evict(x.f);
    atomic_store(&x.f->au->cache_memo, 0);
    T_EQ(ft_read(x.f, &d, 0, NULL), x.n);
    T_MEMEQ(x.src, x.dst, x.n);
    int fd2 = open(x.f->path, O_RDONLY);
    T_EQ(ft__probe_cache(fd2, 0, x.n), FT__CLS_COLD);
    close(fd2);
    real_close(&x);
    /* FASTENSOR_CACHE: the default of calls that leave it to the context */
    ft_config cfg;
    setenv("FASTENSOR_CACHE", "bypass", 1);
    T_EQ(ft_config_init(&cfg), 0);
    T_EQ(cfg.cache, FT_CACHE_BYPASS);
    setenv("FASTENSOR_CACHE", "sometimes", 1);
    T_EQ(ft_config_init(&cfg), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "FASTENSOR_CACHE") != NULL);
    unsetenv("FASTENSOR_CACHE");
}

static uint64_t now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* long enough that a read alone (0.5 s under ThreadSanitizer) ends well before it */
#define HOLD_US 2000000

typedef struct cold_reader {
    const char *path;
    const uint8_t *want;
    size_t n;
    bool ok;
} cold_reader;

/* Another context reading the file cold, as another process would. */
static void *read_cold(void *arg)
{
    cold_reader *r = arg;
    ft_ctx *ctx = t_ctx(2);
    ft_file *f = NULL;
    uint8_t *buf = malloc(r->n);
    ft_buf d = ft_host_buf(buf, r->n);
    r->ok = ctx && buf && ft_file_open(ctx, &f, r->path, FT_OPEN_READ, 0) == 0 &&
            ft_read(f, &d, 0, &(ft_io_opts){.cache = FT_CACHE_KEEP}) == (int64_t)r->n &&
            !memcmp(buf, r->want, r->n);
    if (f)
        ft_file_close(f);
    ft_ctx_destroy(ctx);
    free(buf);
    return NULL;
}

/* Uncached reads through the page cache take no lock and wait for no other reader: one
 * while another process holds the file's flock ends long before that lets go (on the
 * development machine a follower of the lock's holder loaded no faster than a reader that
 * ignores it, two and four processes at once, and slower in the demo's 2-process load), and
 * readers of several contexts reading the file cold at once all get its bytes. */
static void case_shared_reads(void)
{
    real_file x;
    T_EQ(real_open(&x, "shared.bin", 32u << 20, 6), 0);
    ft_buf d = ft_host_buf(x.dst, x.n);
    int holder = open(x.f->path, O_RDONLY);
    evict(x.f);
    T_EQ(flock(holder, LOCK_EX), 0);
    uint64_t t0 = now_mono();
    T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.cache = FT_CACHE_KEEP}), x.n);
    double took = (double)(now_mono() - t0) / 1e9;
    flock(holder, LOCK_UN);
    close(holder);
    T_MEMEQ(x.src, x.dst, x.n);
    printf("  a cold read while another holds the file's flock: %.2f s\n", took);
    T_TRUE(took < HOLD_US * 0.5e-6);
    evict(x.f);
    cold_reader r[3];
    pthread_t th[3];
    for (unsigned i = 0; i < 3; i++) {
        r[i] = (cold_reader){.path = x.f->path, .want = x.src, .n = x.n};
        T_EQ(pthread_create(&th[i], NULL, read_cold, &r[i]), 0);
    }
    memset(x.dst, 0, x.n);
    T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.cache = FT_CACHE_KEEP}), x.n);
    for (unsigned i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        T_TRUE(r[i].ok);
    }
    T_MEMEQ(x.src, x.dst, x.n);
    real_close(&x);
}

/* Stream reads beside others: one sample per window of 32 MiB of their calls, each call's
 * time its share of the time in flight. Driven through the decision hooks with the in-flight
 * count set by hand, so the company is certain. */
static void case_stream_windows(void)
{
    real_file x;
    const size_t mib = 1u << 20;
    T_EQ(real_open(&x, "windows.bin", 65 * mib, 4), 0);
    ft_buf one = ft_host_buf(x.dst, mib); /* the read engines' first uses */
    for (unsigned i = 0; i < 4; i++)
        T_EQ(ft_read(x.f, &one, 0, NULL), mib);
    evict(x.f);
    atomic_fetch_add(&x.ctx->inflight, 4); /* 3 others in flight throughout, and this one */
    ft__decision d0 = {0};
    unsigned arm = 0, samples = 0;
    for (unsigned i = 0; i < 65; i++) {
        ft__decision d;
        ft__auto_decide(x.f, i * mib, mib, false, 0, -1, FT_CACHE_KEEP, &d);
        if (i == 1)
            d0 = d;
        if (i >= 2 && i != 33) /* a window keeps its arm for its 32 calls */
            T_EQ(d.arm, arm);
        arm = d.arm;
        ft_buf part = ft_host_buf(x.dst, mib);
        int64_t r = ft_read(x.f, &part, i * mib,
                            &(ft_io_opts){.engine = ft__arms[d.arm].engine});
        T_EQ(r, mib);
        ft__auto_done(x.f, &d, r, true);
    }
    atomic_fetch_sub(&x.ctx->inflight, 4);
    T_EQ(d0.key.cls, FT__CLS_STREAM);
    T_EQ(d0.key.busy, 1);
    samples = samples_of(x.f, &d0.key);
    printf("  64 stream calls of 1 MiB beside others: %u samples\n", samples);
    T_EQ(samples, 2u);
    real_close(&x);
}

/* Plain writes: one sample per key and arm at the sync, not one per call. */
static void case_write_windows(void)
{
    real_file x;
    T_EQ(real_open(&x, "wwin.bin", 4u << 20, 5), 0);
    ft_buf b = ft_host_buf(x.src, 64u << 10);
    ft_io_opts posix = {.engine = FT_ENGINE_POSIX};
    T_EQ(ft_write(x.f, &b, 0, &posix), b.len); /* posix's first use for writes: AUTO's own */
    ft__sel_key k = {.write = 1, .bucket = 16, .cls = FT__CLS_PLAIN};
    unsigned runs = 0; /* (key, arm) runs: one sample each */
    for (unsigned round = 0; round < 3; round++) {
        uint32_t arms = 0;
        for (unsigned i = 0; i < 64; i++) {
            ft__decision d;
            ft__auto_decide(x.f, i * b.len, b.len, true, 0, -1, FT_CACHE_KEEP, &d);
            arms |= 1u << d.arm;
            T_EQ(ft_write(x.f, &b, i * b.len, &(ft_io_opts){.engine = d.engine}), b.len);
            ft__auto_done(x.f, &d, (int64_t)b.len, false);
        }
        T_EQ(samples_of(x.f, &k), runs); /* nothing before the sync */
        T_EQ(ft_file_sync(x.f), 0);
        runs += (unsigned)__builtin_popcount(arms);
    }
    unsigned n = samples_of(x.f, &k);
    printf("  3 runs of 64 plain writes, each synced once: %u samples, %u runs\n", n, runs);
    T_EQ(n, runs);
    real_close(&x);
}

/* An engine's first call in a context pays for what the engine sets up once (direct's bounce
 * buffers and descriptor): no sample. The page-cache engines set nothing up for host memory:
 * their first call is one. */
static void case_first_use(void)
{
    real_file x;
    T_EQ(real_open(&x, "first.bin", 1u << 20, 8), 0);
    ft_buf d = ft_host_buf(x.dst, x.n);
    ft__sel_key key = {.bucket = 20, .cls = FT__CLS_CACHED};
    T_EQ(ft_read(x.f, &d, 0, NULL), x.n); /* cached: posix explored first */
    T_MEMEQ(x.src, x.dst, x.n);
    printf("  posix samples after its first call: %u\n", arm_of(x.f, &key, 0).n);
    T_EQ(arm_of(x.f, &key, 0).n, 1u);
    unsigned direct = 0;
    while (direct < ft__narms && strcmp(ft__arms[direct].label, "direct"))
        direct++;
    T_TRUE(direct < ft__narms);
    uint32_t samples[2];
    for (unsigned i = 0; i < 2; i++) {
        ft__decision dec;
        ft__auto_decide(x.f, 0, x.n, false, 0, -1, FT_CACHE_AUTO, &dec);
        memset(x.dst, 0, x.n);
        int64_t r = ft_read(x.f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_DIRECT});
        T_EQ(r, x.n);
        T_MEMEQ(x.src, x.dst, x.n);
        dec.arm = direct;
        dec.engine = FT_ENGINE_DIRECT;
        ft__auto_done(x.f, &dec, r, false);
        samples[i] = arm_of(x.f, &dec.key, direct).n;
    }
    printf("  direct samples after 1, 2 calls: %u %u\n", samples[0], samples[1]);
    T_EQ(samples[0], 0u);
    T_EQ(samples[1], 1u);
    real_close(&x);
}

/* A call that began alone but ends beside others is a sample of calls in flight. */
static void case_company_arrived(void)
{
    real_file x;
    T_EQ(real_open(&x, "company.bin", 1u << 20, 9), 0);
    ft_buf d = ft_host_buf(x.dst, x.n);
    T_EQ(ft_read(x.f, &d, 0, NULL), x.n); /* posix's first call: no sample */
    ft__sel_key alone = {.bucket = 20, .cls = FT__CLS_CACHED}, busy = alone;
    busy.busy = 1;
    for (unsigned joined = 0; joined < 2; joined++) {
        uint32_t a0 = arm_of(x.f, &alone, 0).n, b0 = arm_of(x.f, &busy, 0).n;
        atomic_fetch_add(&x.ctx->inflight, 1);
        ft__decision dec;
        ft__auto_decide(x.f, 0, x.n, false, 0, -1, FT_CACHE_AUTO, &dec);
        T_EQ(dec.key.busy, 0);
        if (joined)
            atomic_fetch_add(&x.ctx->inflight, 1);
        int64_t r = ft_read(x.f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX});
        atomic_fetch_sub(&x.ctx->inflight, 1);
        dec.arm = 0;
        dec.engine = FT_ENGINE_POSIX;
        ft__auto_done(x.f, &dec, r, false);
        if (joined)
            atomic_fetch_sub(&x.ctx->inflight, 1);
        T_EQ(arm_of(x.f, &alone, 0).n - a0, joined ? 0u : 1u);
        T_EQ(arm_of(x.f, &busy, 0).n - b0, joined ? 1u : 0u);
    }
    real_close(&x);
}

/* Another context with transfers in flight on the same profile (another process, above all)
 * is company: a call beside it decides and records in the busy key, and so does a call that
 * began alone and ended beside it. The profile's ".active" file failing to open is opened
 * again when AUTO makes its selector (the profile's directory may be new); where its lock can
 * be neither taken nor tested, company is the context's own. Transfers go on either way. */
static void case_company_outside(void)
{
    char prof[4200], active[4300];
    snprintf(prof, sizeof prof, "%s", t_path("company-profile.txt"));
    snprintf(active, sizeof active, "%s.active", prof);
    size_t n = 1u << 20;
    uint8_t *src = malloc(n), *dst = malloc(n);
    t_fill_random(src, n, 31);
    for (int fault = 0; fault < 3; fault++) { /* none; open of .active fails; locks fail */
        setenv("FASTENSOR_PROFILE", prof, 1);
        ft_ctx *ctx = t_ctx(2);
        ft_file *f;
        T_EQ(ft_file_open(ctx, &f, t_path("company2.bin"),
                          FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
        if (fault) /* (the open: the next one, .active's) */
            t_fault_set(fault == 1 ? T_OP_OPEN : T_OP_LOCK, T_FAULT_ERRNO, EACCES, 1,
                        fault == 1 ? 1 : 0);
        ft_buf b = ft_host_buf(src, n), d = ft_host_buf(dst, n);
        ft_io_opts posix = {.engine = FT_ENGINE_POSIX};
        T_EQ(ft_write(f, &b, 0, &posix), (int64_t)n); /* (its first transfer: opens .active) */
        T_EQ(ft_read(f, &d, 0, NULL), (int64_t)n);   /* (AUTO works on, whatever failed) */
        T_MEMEQ(src, dst, n);
        int other = open(active, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        struct flock lk = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        T_EQ(fcntl(other, F_OFD_SETLK, &lk), 0); /* the other context's transfers begin */
        ft__sel_key alone = {.bucket = 20, .cls = FT__CLS_CACHED}, busy = alone;
        busy.busy = 1;
        for (int arrived = 0; arrived < 2; arrived++) {
            uint32_t a0 = arm_of(f, &alone, 0).n, b0 = arm_of(f, &busy, 0).n;
            if (arrived) { /* alone at the decision, the other arrives during the call */
                lk.l_type = F_UNLCK;
                T_EQ(fcntl(other, F_OFD_SETLK, &lk), 0);
            }
            ft__auto_enter(ctx);
            ft__decision dec;
            ft__auto_decide(f, 0, n, false, 0, -1, FT_CACHE_AUTO, &dec);
            T_EQ(dec.key.busy, !arrived && fault != 2);
            if (arrived) {
                lk.l_type = F_RDLCK;
                T_EQ(fcntl(other, F_OFD_SETLK, &lk), 0);
            }
            int64_t r = ft_read(f, &d, 0, &posix);
            ft__auto_leave(ctx);
            dec.arm = 0;
            dec.engine = FT_ENGINE_POSIX;
            ft__auto_done(f, &dec, r, false);
            T_EQ(arm_of(f, &alone, 0).n - a0, fault == 2 ? 1u : 0u);
            T_EQ(arm_of(f, &busy, 0).n - b0, fault == 2 ? 0u : 1u);
        }
        /* another came and went during the call, alone at its start and its end: a busy
         * sample; reading that failing, a lone one; writing its own end failing, still busy;
         * nobody else (the record its own): a lone one */
        for (int came = 0; fault == 0 && came < 4; came++) {
            lk.l_type = F_UNLCK;
            T_EQ(fcntl(other, F_OFD_SETLK, &lk), 0);
            uint32_t a0 = arm_of(f, &alone, 0).n, b0 = arm_of(f, &busy, 0).n;
            ft__auto_enter(ctx);
            ft__decision dec;
            ft__auto_decide(f, 0, n, false, 0, -1, FT_CACHE_AUTO, &dec);
            T_EQ(dec.key.busy, 0);
            dec.call = n;
            int64_t r = ft_read(f, &d, 0, &posix);
            if (came < 3) { /* the other's transfers begin and end */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                uint64_t rec[2] = {(uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                                   12345};
                T_EQ(pwrite(other, rec, sizeof rec, 8), (ssize_t)sizeof rec);
            }
            usleep(2000); /* (a run of transfers long enough to record its end) */
            if (came == 1 || came == 2)
                t_fault_set(came == 1 ? T_OP_PREAD : T_OP_PWRITE, T_FAULT_ERRNO, EIO, 1, 0);
            ft__auto_leave(ctx);
            dec.arm = 0;
            dec.engine = FT_ENGINE_POSIX;
            ft__auto_done(f, &dec, r, false);
            if (came == 1 || came == 2)
                T_TRUE(t_fault_clear() >= 1);
            bool lone = came == 1 || came == 3;
            T_EQ(arm_of(f, &alone, 0).n - a0, lone ? 1u : 0u);
            T_EQ(arm_of(f, &busy, 0).n - b0, lone ? 0u : 1u);
        }
        close(other); /* (its lock goes: a context alone again) */
        ft__auto_enter(ctx);
        ft__decision dec;
        ft__auto_decide(f, 0, n, false, 0, -1, FT_CACHE_AUTO, &dec);
        ft__auto_leave(ctx);
        T_EQ(dec.key.busy, 0);
        if (dec.trial)
            ft__sel_release(dec.sel, &dec.key, dec.arm);
        if (fault)
            T_TRUE(t_fault_clear() >= 1);
        ft_file_close(f);
        if (fault == 0) /* closing .active fails: nothing to act on */
            t_fault_set(T_OP_CLOSE, T_FAULT_ERRNO, EIO, 1, 0);
        ft_ctx_destroy(ctx);
        if (fault == 0)
            T_TRUE(t_fault_clear() >= 1);
        unsetenv("FASTENSOR_PROFILE");
    }
    free(src);
    free(dst);
}

/* AUTO end to end: every arm moves the right bytes, the profile is saved and shown. */
static void case_auto_end_to_end(void)
{
    setenv("FASTENSOR_PROFILE", t_path("auto-profile.txt"), 1);
    ft_ctx *ctx = t_ctx(4);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("auto.bin"), FT_OPEN_READ | FT_OPEN_WRITE |
                                                       FT_OPEN_CREATE, 0644), 0);
    size_t n = (4u << 20) + 5;
    uint8_t *src = malloc(n), *dst = malloc(n);
    t_fill_random(src, n, 21);
    ft_buf b = ft_host_buf(src, n), d = ft_host_buf(dst, n);
    static const int modes[] = {FT_CACHE_AUTO, FT_CACHE_KEEP, FT_CACHE_BYPASS};
    for (unsigned i = 0; i < 30; i++) {
        ft_io_opts o = {.cache = (ft_cache_mode)modes[i % 3], .flags = i % 2 ? FT_IO_SYNC : 0};
        T_EQ(ft_write(f, &b, 4095, &o), n);
        memset(dst, 0, n);
        if (i % 4 == 0)
            evict(f);
        T_EQ(ft_read(f, &d, 4095, &o), n);
        T_MEMEQ(src, dst, n);
    }
    ft_file_close(f);
    T_EQ(ft_profile_save(ctx), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    T_EQ(ft_profile_show(ctx, t_path("auto.bin"), out), 0);
    fclose(out);
    T_TRUE(strstr(buf, "read") && strstr(buf, "write") && strstr(buf, "uring"));
    free(buf);
    buf = NULL;
    out = open_memstream(&buf, &len);
    T_EQ(ft_profile_show(ctx, t_path("no-such-file"), out), -ENOENT);
    fclose(out);
    free(buf);
    ft_ctx_destroy(ctx);
    FILE *p = fopen(t_path("auto-profile.txt"), "r");
    char line[64] = "";
    T_TRUE(p && fgets(line, sizeof line, p) && !strcmp(line, "fastensor-profile 2\n"));
    if (p)
        fclose(p);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
    free(dst);
}

/* A large transfer whose arm is on trial moves a 256 MiB slice with it and decides again for
 * the rest (the bytes come out whole); a synchronous write is never cut. */
static void case_trial_slices(void)
{
    real_file x;
    size_t n = (512u << 20) + 4097; /* two slices, then an odd tail */
    T_EQ(real_open(&x, "slices.bin", n, 31), 0);
    ft_buf d = ft_host_buf(x.dst, n), b = ft_host_buf(x.src, n);
    ft__sel_key rk = {.bucket = FT__SEL_BUCKET_TOP, .cls = FT__CLS_CACHED};
    ft__sel_key wk = {.write = 1, .bucket = FT__SEL_BUCKET_TOP, .cls = FT__CLS_SYNC};
    ft_buf one = ft_host_buf(x.dst, 1u << 20); /* the read engines' first uses */
    for (unsigned i = 0; i < 4; i++)
        T_EQ(ft_read(x.f, &one, 0, NULL), one.len);
    T_EQ(ft_read(x.f, &d, 0, NULL), n); /* unseen: a trial, cut */
    T_MEMEQ(x.src, x.dst, n);
    unsigned reads = samples_of(x.f, &rk); /* (and cold, where the cache let pages go) */
    rk.cls = FT__CLS_COLD;
    reads += samples_of(x.f, &rk);
    ft_buf small = ft_host_buf(x.src, 1u << 20); /* the write engines' first uses */
    for (unsigned i = 0; i < 3; i++)
        T_EQ(ft_write(x.f, &small, 0, &(ft_io_opts){.flags = FT_IO_SYNC}), small.len);
    T_EQ(ft_write(x.f, &b, 0, &(ft_io_opts){.flags = FT_IO_SYNC}), n);
    unsigned writes = samples_of(x.f, &wk);
    memset(x.dst, 0, n);
    T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX}), n);
    T_MEMEQ(x.src, x.dst, n);
    printf("  samples of a 512 MiB read: %u; of a synchronous 512 MiB write: %u\n", reads,
           writes);
    T_TRUE(reads >= 2);
    T_EQ(writes, 1u);
    real_close(&x);
}

typedef struct fill_count {
    ft__fill_watch w;
    _Atomic uint64_t told;
} fill_count;

static void count_told(ft__fill_watch *w, uint64_t off, uint64_t len)
{
    (void)off;
    atomic_fetch_add(&((fill_count *)w)->told, len);
}

/* The fill arm: the mmap engine's fill brings an evicted range into the page cache without
 * a copy, telling its watcher of every byte (none read once stopped), and maps a caller's
 * mapping in; the fill arm (ft__fill_read) reads ahead and copies behind, byte-exact at odd
 * offsets and lengths, the data left cached, where mappings cannot be populated (read
 * through a buffer instead) and to the first failure of its readahead or its copies; AUTO offers the
 * arm for uncached reads of 16 MiB and more that the cache mode keeps, never for cached data,
 * bypassing reads, small reads or writes. */
static void case_fill_arm(void)
{
    real_file x;
    const size_t n = (80u << 20) + 12345;
    T_EQ(real_open(&x, "fill.bin", n, 41), 0);
    const ft__engine_ops *mm = ft__engine_get(FT_ENGINE_MMAP);
    T_TRUE(mm->fill != NULL);
    bool evicts = t_evict(x.f->path);
    if (!evicts)
        printf("  (eviction did not take here: what is cached is not judged)\n");
    /* the engine's fill, watched; stopped first: every piece told, none read */
    fill_count fc = {.w.filled = count_told};
    ft__io io = {.ctx = x.ctx, .file = x.f, .off = 4096, .len = n - 4096 - 777,
                 .piece = 4u << 20, .device = -1, .watch = &fc.w};
    atomic_store(&fc.w.stop, true);
    T_EQ(mm->fill(&io), (int64_t)io.len);
    T_EQ(atomic_load(&fc.told), io.len);
    if (evicts)
        T_TRUE(!ft__file_cached(x.f, io.off, io.len));
    atomic_store(&fc.w.stop, false);
    atomic_store(&fc.told, 0);
    T_EQ(mm->fill(&io), (int64_t)io.len);
    T_EQ(atomic_load(&fc.told), io.len);
    T_TRUE(ft__file_cached(x.f, io.off, io.len));
    /* ft__file_fill with a mapping: mapped in, byte-exact; bypass: nothing */
    if (evicts)
        t_evict(x.f->path);
    uint8_t *m = mmap(NULL, n, PROT_READ, MAP_SHARED, x.f->fd, 0);
    T_TRUE(m != MAP_FAILED);
    T_EQ(ft__file_fill(x.f, 0, n, NULL, FT_CACHE_BYPASS), 0);
    T_EQ(ft__file_fill(x.f, 8192, n - 8192, m + 8192, FT_CACHE_KEEP), 1);
    T_TRUE(ft__file_cached(x.f, 8192, n - 8192));
    T_MEMEQ(m, x.src, n);
    munmap(m, n);
    /* the arm: odd ranges, byte-exact, cached after */
    static const struct { uint64_t off, len; } ranges[] = {
        {0, 80u << 20}, {4097, (64u << 20) + 3}, {12345, (80u << 20)}};
    for (unsigned i = 0; i < 3; i++) {
        if (evicts)
            t_evict(x.f->path);
        memset(x.dst, 0, n);
        ft__io rd = {.ctx = x.ctx, .file = x.f, .ptr = x.dst, .off = ranges[i].off,
                     .len = ranges[i].len, .device = -1};
        T_EQ(ft__fill_read(&rd, mm, FT_CACHE_KEEP, NULL), (int64_t)ranges[i].len);
        T_MEMEQ(x.dst, x.src + ranges[i].off, ranges[i].len);
        T_TRUE(ft__file_cached(x.f, rd.off, rd.len));
    }
    ft__io rd = {.ctx = x.ctx, .file = x.f, .ptr = x.dst, .off = 0, .len = n, .device = -1};
    /* the readahead's mappings cannot be populated (no such advice): its pieces are read
     * through a buffer (a copy through the mmap arm ignores the advice's failure) */
    if (evicts)
        t_evict(x.f->path);
    memset(x.dst, 0, n);
    t_fault_set(T_OP_MADVISE, T_FAULT_ERRNO, EINVAL, 1, 0);
    T_EQ(ft__fill_read(&rd, mm, FT_CACHE_KEEP, NULL), (int64_t)n);
    T_TRUE(t_fault_clear() >= 1);
    T_MEMEQ(x.dst, x.src, n);
    /* its advice fails: that error, naming the file */
    t_fault_set(T_OP_FADVISE, T_FAULT_ERRNO, EIO, 2, 1);
    T_EQ(ft__fill_read(&rd, mm, FT_CACHE_KEEP, NULL), -EIO);
    T_TRUE(t_fault_clear() == 1);
    T_TRUE(strstr(ft_last_error(), "readahead") && strstr(ft_last_error(), "fill.bin"));
    /* AUTO: the arm for uncached reads the cache mode keeps, from 16 MiB up */
    unsigned fill = ft__narms;
    for (unsigned a = 0; a < ft__narms; a++)
        if (ft__arms[a].fill)
            fill = a;
    T_TRUE(fill < ft__narms);
    ft_buf all = ft_host_buf(x.dst, n);
    ft__sel_key cold = {.bucket = (uint8_t)ft__sel_bucket(n), .cls = FT__CLS_COLD};
    ft__sel_key warm = cold;
    warm.cls = FT__CLS_CACHED;
    for (unsigned i = 0; i < 16 && evicts; i++) { /* until every arm is tried */
        t_evict(x.f->path);
        T_EQ(ft_read(x.f, &all, 0, &(ft_io_opts){.cache = FT_CACHE_KEEP}), (int64_t)n);
        T_MEMEQ(x.dst, x.src, n);
    }
    if (evicts)
        T_TRUE(arm_of(x.f, &cold, fill).n >= 1);
    for (unsigned i = 0; i < 16; i++) {
        T_EQ(ft_read(x.f, &all, 0, NULL), (int64_t)n);
        ft_buf small = ft_host_buf(x.dst, 8u << 20);
        if (evicts)
            t_evict(x.f->path);
        T_EQ(ft_read(x.f, &small, 0, &(ft_io_opts){.cache = FT_CACHE_KEEP}), (int64_t)small.len);
        T_EQ(ft_read(x.f, &all, 0, &(ft_io_opts){.cache = FT_CACHE_BYPASS}), (int64_t)n);
    }
    ft__sel_key small_cold = {.bucket = 23, .cls = FT__CLS_COLD};
    T_EQ(arm_of(x.f, &warm, fill).n, 0u);
    T_EQ(arm_of(x.f, &small_cold, fill).n, 0u);
    printf("  fill arm samples: %u cold (of %u), %u cached, %u of 8 MiB\n",
           arm_of(x.f, &cold, fill).n, samples_of(x.f, &cold), arm_of(x.f, &warm, fill).n,
           arm_of(x.f, &small_cold, fill).n);
    real_close(&x);
}

/* A fixed engine's call of 256 KiB or more is a sample of that engine's arm; smaller ones
 * are not. */
static void case_fixed_observed(void)
{
    ft__auto_observes = true;
    real_file x;
    T_EQ(real_open(&x, "fixed.bin", 1u << 20, 12), 0); /* posix, synced: a write sample */
    unsigned mmap = 0;
    while (mmap < ft__narms && strcmp(ft__arms[mmap].label, "mmap"))
        mmap++;
    T_TRUE(mmap < ft__narms);
    ft__sel_key synced = {.write = 1, .bucket = 20, .cls = 1};
    ft__sel_key cached = {.bucket = 20, .cls = FT__CLS_CACHED}, tiny = cached;
    tiny.bucket = 12;
    T_EQ(arm_of(x.f, &synced, 0).n, 1u);
    for (unsigned i = 0; i < 3; i++) {
        memset(x.dst, 0, x.n);
        ft_buf d = ft_host_buf(x.dst, x.n);
        T_EQ(ft_read(x.f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_MMAP}), (int64_t)x.n);
        T_MEMEQ(x.src, x.dst, x.n);
        ft_buf small = ft_host_buf(x.dst, 4096);
        T_EQ(ft_read(x.f, &small, 0, &(ft_io_opts){.engine = FT_ENGINE_MMAP}), 4096);
    }
    printf("  mmap samples: %u of 3 whole reads, %u of 3 small ones\n",
           arm_of(x.f, &cached, mmap).n, arm_of(x.f, &tiny, mmap).n);
    T_EQ(arm_of(x.f, &cached, mmap).n, 3u);
    T_EQ(arm_of(x.f, &tiny, mmap).n, 0u);
    real_close(&x);
    ft__auto_observes = false;
}

/* Cold reads of data that fits go O_DIRECT where this filesystem measured O_DIRECT well ahead
 * in the call's company: alone and beside others apart. */
static void case_direct_in_company(void)
{
    ft__selector *sel;
    T_EQ(ft__sel_create(&sel, 2), 0);
    sel->buffered = 1u; /* arm 0 through the page cache, arm 1 O_DIRECT */
    ft__sel_key lone = {.bucket = FT__SEL_BUCKET_TOP, .cls = FT__CLS_COLD}, busy = lone;
    busy.busy = 1;
    const uint64_t gb = 1000000000ull, room = 16 * gb;
    for (unsigned i = 0; i < 2; i++) {
        ft__sel_record(sel, &lone, 0, gb, 1000000000, false); /* 1.0 GB/s */
        ft__sel_record(sel, &lone, 1, gb, 900000000, false);  /* 1.1 */
        ft__sel_record(sel, &busy, 0, gb, 2200000000, false); /* 0.45 */
        ft__sel_record(sel, &busy, 1, gb, 1000000000, false); /* 1.0 */
    }
    double b, d;
    T_TRUE(!ft__sel_measured_direct(sel, 0, false, &b, &d));
    T_TRUE(ft__sel_measured_direct(sel, 0, true, &b, &d));
    printf("  beside others: buffered %.2f GB/s, O_DIRECT %.2f\n", b / 1e9, d / 1e9);
    T_EQ(ft__sel_cache_goal(sel, &lone, gb, FT_CACHE_AUTO, gb, room, 1), FT_CACHE_KEEP);
    T_EQ(ft__sel_cache_goal(sel, &busy, gb, FT_CACHE_AUTO, gb, room, 1), FT_CACHE_BYPASS);
    /* data that does not fit goes O_DIRECT alone too; cached data is copied out in both */
    T_EQ(ft__sel_cache_goal(sel, &lone, gb, FT_CACHE_AUTO, room, room, 1), FT_CACHE_BYPASS);
    ft__sel_key warm = busy;
    warm.cls = FT__CLS_CACHED;
    T_EQ(ft__sel_cache_goal(sel, &warm, gb, FT_CACHE_AUTO, gb, room, 1), FT_CACHE_KEEP);
    ft__sel_destroy(sel);
    /* a lead of 1.53x on the means, inside the buffered arm's spread (1.2 and 0.6 GB/s): no */
    T_EQ(ft__sel_create(&sel, 2), 0);
    sel->buffered = 1u;
    ft__sel_record(sel, &lone, 0, 1200000000ull, 1000000000, false);
    ft__sel_record(sel, &lone, 0, 600000000ull, 1000000000, false);
    for (unsigned i = 0; i < 2; i++)
        ft__sel_record(sel, &lone, 1, 1300000000ull, 1000000000, false);
    T_TRUE(!ft__sel_measured_direct(sel, 0, false, &b, &d));
    printf("  noisy: buffered %.2f GB/s, O_DIRECT %.2f (%.2fx): not well ahead\n", b / 1e9,
           d / 1e9, d / b);
    T_TRUE(d / b > 1.5);
    ft__sel_record(sel, &lone, 0, 700000000ull, 1000000000, false); /* steadier: it is */
    ft__sel_record(sel, &lone, 0, 700000000ull, 1000000000, false);
    ft__sel_record(sel, &lone, 0, 700000000ull, 1000000000, false);
    T_TRUE(ft__sel_measured_direct(sel, 0, false, &b, &d));
    ft__sel_destroy(sel);
}

/* Arms nothing is known of are explored after the fallback in the selector's order. */
static void case_explore_order(void)
{
    ft__selector *sel;
    T_EQ(ft__sel_create(&sel, 4), 0);
    static const uint8_t order[] = {3, 1, 0, 2};
    sel->order = order;
    ft__sel_key k = {.bucket = 20};
    unsigned seen[4];
    for (unsigned i = 0; i < 4; i++) {
        bool trial;
        seen[i] = ft__sel_choose(sel, &k, 0xf, 2, &trial);
        T_TRUE(trial);
        ft__sel_record(sel, &k, seen[i], 1u << 20, 1000000, trial);
    }
    printf("  explored: %u %u %u %u (fallback 2, then the order 3 1 0)\n", seen[0], seen[1],
           seen[2], seen[3]);
    T_EQ(seen[0], 2u);
    T_EQ(seen[1], 3u);
    T_EQ(seen[2], 1u);
    T_EQ(seen[3], 0u);
    ft__sel_destroy(sel);
}

/* A setting nothing is known of is judged by its engine's default (ft__selector.family):
 * that of an engine measured under half the best is not tried, that of the leader is. Arms:
 * engine A (0, its setting 1), engine B (2, its setting 3). */
static void family_tries(const uint8_t *family, unsigned seen[4])
{
    ft__selector *sel;
    T_EQ(ft__sel_create(&sel, 4), 0);
    static const uint8_t order[] = {0, 2, 1, 3};
    sel->order = order;
    sel->family = family;
    ft__sel_key k = {.bucket = 20};
    for (unsigned i = 0; i < 2; i++) {
        ft__sel_record(sel, &k, 0, 1u << 20, 1000000, false); /* A: 1 GB/s */
        ft__sel_record(sel, &k, 2, 1u << 20, 4000000, false); /* B: a quarter of it */
    }
    static const uint64_t ns[4] = {1000000, 1000000, 4000000, 4000000};
    memset(seen, 0, 4 * sizeof *seen);
    for (unsigned i = 0; i < 20; i++) {
        bool trial;
        unsigned a = ft__sel_choose(sel, &k, 0xf, 0, &trial);
        seen[a]++;
        ft__sel_record(sel, &k, a, 1u << 20, ns[a], trial);
    }
    ft__sel_destroy(sel);
}

static void case_family(void)
{
    static const uint8_t family[] = {0, 0, 2, 2};
    unsigned seen[4];
    family_tries(family, seen);
    printf("  with families, of 20 calls: A %u, A's setting %u, B %u, B's setting %u\n", seen[0],
           seen[1], seen[2], seen[3]);
    T_EQ(seen[3], 0u);
    T_TRUE(seen[1] >= 1);
    family_tries(NULL, seen); /* without, B's setting is tried as any unknown arm is */
    printf("  without: B's setting %u\n", seen[3]);
    T_TRUE(seen[3] >= 1);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s", t_dir());
    /* the cases drive the selector by hand, with fixed engines' calls as their transfers;
     * case_fixed_observed turns the observation of those calls on */
    ft__auto_observes = false;
    const t_case cases[] = {
        {"converges: >= 95% best decisions after 4 calls per arm, every cost order",
         case_converges},
        {"regret under +-30% noise within 15%, near-ties within 5%", case_regret_noise},
        {"drift: the new best leads within 100 calls", case_drift},
        {"arms under half the best are skipped after two samples", case_skip},
        {"unseen keys: the nearest measured key, else the fallback; eligible arms only",
         case_unseen_keys},
        {"trials in flight explore different arms, and end", case_trials_in_flight},
        {"settled keys decide without the lock until a sample", case_fast_path},
        {"profile round trip; foreign, corrupt and old profiles refused", case_profile},
        {"8 threads choosing, recording, releasing", case_concurrent},
        {"cache modes: keep, bypass, auto by size; FASTENSOR_CACHE", case_cache_modes},
        {"uncached reads wait for no other reader, several contexts at once", case_shared_reads},
        {"stream reads beside others: a sample per 32 MiB window", case_stream_windows},
        {"plain writes: a sample per run at the sync", case_write_windows},
        {"an engine's first call is no sample where it sets something up", case_first_use},
        {"a call that began alone but ended beside others", case_company_arrived},
        {"another context's transfers on the same profile are company", case_company_outside},
        {"engine AUTO on real files, profile saved", case_auto_end_to_end},
        {"large trials a slice at a time, synchronous writes whole", case_trial_slices},
        {"the fill arm: read ahead without a copy, copied behind as cached", case_fill_arm},
        {"a fixed engine's call is a sample of its arm", case_fixed_observed},
        {"O_DIRECT where measured well ahead, alone and beside others apart",
         case_direct_in_company},
        {"arms nothing is known of: the fallback, then the selector's order", case_explore_order},
        {"a setting is judged by its engine's default until tried", case_family},
    };
    return t_run(cases, sizeof cases / sizeof *cases);
}
