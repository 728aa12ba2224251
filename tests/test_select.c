/* The selector with an injected clock and fake arms of known cost: convergence within the
 * exploration budget, >= 95% optimal decisions when stationary, re-convergence after the
 * costs swap, unseen keys, profile round trip, corrupt/foreign profiles, concurrent callers;
 * and engine AUTO end to end on real files. */
#include "testlib.h"
#include "../src/select/select.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#define ARMS 8

static uint64_t fake_now;
static uint64_t fake_clock(void)
{
    return fake_now;
}

/* Throughput of each arm (bytes per second), per test. */
static double tput[ARMS];
static uint64_t noise_state = 12345;

/* One simulated call: choose, "run" for bytes / tput (+-10% noise) on the fake clock, record. */
static unsigned step(ft__selector *s, const ft__sel_key *k, uint64_t bytes)
{
    unsigned arm = ft__sel_choose(s, k, (1u << ARMS) - 1, 0, NULL);
    noise_state = noise_state * 6364136223846793005ull + 1442695040888963407ull;
    double noise = 0.9 + 0.2 * (double)(noise_state >> 40) / (double)(1ull << 24);
    uint64_t t0 = fake_clock();
    fake_now += (uint64_t)((double)bytes / tput[arm] * 1e9 * noise);
    ft__sel_record(s, k, arm, bytes, fake_clock() - t0);
    return arm;
}

static unsigned best_of(void)
{
    unsigned b = 0;
    for (unsigned a = 1; a < ARMS; a++)
        if (tput[a] > tput[b])
            b = a;
    return b;
}

static void set_costs(uint64_t seed)
{
    for (unsigned a = 0; a < ARMS; a++) /* distinct: 0.5 .. 4 GB/s */
        tput[a] = 0.5e9 * (1 + (double)((a * 5 + seed) % ARMS) / 2);
}

static const ft__sel_key key20 = {.write = 0, .bucket = 20, .cache = 2};
/* cold reads: beside others they follow what was learned alone (cached ones do not) */
static const ft__sel_key cold20 = {.write = 0, .bucket = 20, .cache = 0};

static void case_converges(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 1), 0);
    set_costs(3);
    unsigned budget = ARMS * FT__SEL_EXPLORE + 1, converged_at = 0;
    for (unsigned i = 0; i < 200; i++) {
        unsigned arm = step(s, &key20, 1 << 20);
        if (arm == best_of() && !converged_at && i >= ARMS * FT__SEL_EXPLORE)
            converged_at = i;
    }
    printf("  converged after %u calls (budget %u)\n", converged_at, budget);
    T_TRUE(converged_at > 0 && converged_at <= budget);
    ft__sel_destroy(s);
}

static unsigned optimal_share(ft__selector *s, const ft__sel_key *k, unsigned calls)
{
    unsigned good = 0;
    for (unsigned i = 0; i < calls; i++)
        good += step(s, k, 1 << 20) == best_of();
    return good;
}

static void case_stationary(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 2), 0);
    set_costs(1);
    optimal_share(s, &key20, ARMS * FT__SEL_EXPLORE + 10);
    unsigned good = optimal_share(s, &key20, 10000);
    printf("  %u of 10000 decisions optimal once converged\n", good);
    T_TRUE(good >= 9500);
    ft__sel_destroy(s);
}

/* Once converged, re-checks of the other arms cost little time even where most arms are
 * hopeless (O_DIRECT arms beside page-cache copies of cached data: 20x slower). */
/* A selector (seeded with @p seed) converged on key20 with arm 0 at @p first bytes/s, arm 1
 * at @p second and the others at @p rest; NULL when it cannot be made. */
static ft__selector *converged(uint64_t seed, double first, double second, double rest)
{
    ft__selector *s;
    if (ft__sel_create(&s, ARMS, fake_clock, seed) < 0)
        return NULL;
    tput[0] = first;
    tput[1] = second;
    for (unsigned a = 2; a < ARMS; a++)
        tput[a] = rest;
    optimal_share(s, &key20, 200);
    return s;
}

static void case_recheck_cost(void)
{
    ft__selector *s = converged(10, 36e9, 20e9, 1.7e9);
    T_TRUE(s != NULL);
    if (!s)
        return;
    uint64_t t0 = fake_now;
    unsigned calls = 20000;
    optimal_share(s, &key20, calls);
    double ideal = (double)calls * (double)(1 << 20) / tput[0] * 1e9;
    double overhead = (double)(fake_now - t0) / ideal - 1;
    printf("  time beyond the best arm's: %.2f%%\n", 100 * overhead);
    T_TRUE(overhead < 0.02);
    ft__sel_destroy(s);
}

static void case_swap(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 3), 0);
    set_costs(2);
    optimal_share(s, &key20, 300);
    unsigned old_best = best_of(), worst = 0;
    for (unsigned a = 0; a < ARMS; a++)
        if (tput[a] < tput[worst])
            worst = a;
    double t = tput[old_best];
    tput[old_best] = tput[worst];
    tput[worst] = t;
    optimal_share(s, &key20, 100); /* drift detection and re-exploration */
    unsigned good = optimal_share(s, &key20, 1000);
    printf("  after the swap: %u of 1000 decisions optimal\n", good);
    T_TRUE(good >= 950);
    ft__sel_destroy(s);
}

/* A drift re-explores the arms that may now lead, not those still hopeless beside the chosen
 * arm's new level: the best arm of page-cache copies falling from 36 to 15 GB/s (another job
 * on the CPUs) makes the 30 GB/s runner-up worth a look, not the 2 GB/s O_DIRECT arms. */
static void case_drift_spares_hopeless(void)
{
    ft__selector *s = converged(11, 36e9, 30e9, 2e9);
    T_TRUE(s != NULL);
    if (!s)
        return;
    tput[0] = 15e9;
    unsigned slow = 0, calls = 300;
    uint64_t t0 = fake_now;
    for (unsigned i = 0; i < calls; i++)
        slow += step(s, &key20, 1 << 20) >= 2;
    double ideal = (double)calls * (double)(1 << 20) / tput[1] * 1e9;
    double overhead = (double)(fake_now - t0) / ideal - 1;
    unsigned good = optimal_share(s, &key20, 1000);
    printf("  after the drop: %u of %u calls on the 2 GB/s arms, %.1f%% beyond the best arm's "
           "time; then %u of 1000 optimal\n", slow, calls, 100 * overhead, good);
    T_TRUE(slow <= 2);
    T_TRUE(overhead < 0.05);
    T_TRUE(good >= 950);
    ft__sel_destroy(s);
}

/* The chosen arm's window full of older, faster figures (a profile tuned on another file)
 * gives way once three calls in a row were slower than the next explored arm's median. */
static void case_behind_streak(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 15), 0);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a == 6 ? 2.2e9 : a == 2 ? 1.8e9 : 0.6e9;
    optimal_share(s, &key20, 200);
    tput[6] = 1.35e9;
    tput[2] = 2.3e9;
    unsigned switched_at = 0;
    for (unsigned i = 1; i <= 20 && !switched_at; i++)
        if (step(s, &key20, 1 << 20) == 2)
            switched_at = i;
    unsigned good = optimal_share(s, &key20, 1000);
    printf("  on the new best arm from call %u; then %u of 1000 optimal\n", switched_at, good);
    T_TRUE(switched_at >= 1 && switched_at <= 4);
    T_TRUE(good >= 950);
    ft__sel_destroy(s);
}

/* Plain writes are measured at their sync: until then a key's arms are all pending. Once
 * each has had its trials, the rest of the pass goes where an unseen key would, not round
 * robin over every arm. */
static void case_writes_awaiting_sync(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 6), 0);
    set_costs(2);
    const ft__sel_key w = {.write = 1, .bucket = 24, .cache = 0};
    const uint32_t all = (1u << ARMS) - 1;
    unsigned tries[ARMS] = {0};
    for (unsigned i = 0; i < ARMS * FT__SEL_EXPLORE; i++) {
        unsigned a = ft__sel_choose(s, &w, all, 5, NULL);
        tries[a]++;
        ft__sel_pending(s, &w, a, +1);
    }
    for (unsigned a = 0; a < ARMS; a++)
        T_EQ(tries[a], FT__SEL_EXPLORE);
    unsigned on_default = 0;
    for (unsigned i = 0; i < 100; i++) {
        unsigned a = ft__sel_choose(s, &w, all, 5, NULL);
        on_default += a == 5;
        ft__sel_pending(s, &w, a, +1);
    }
    printf("  while waiting for the sync: %u of 100 writes on the default arm\n", on_default);
    T_EQ(on_default, 100);
    /* a neighbouring size measured: its best arm */
    ft__sel_key near = w;
    near.bucket = 23;
    optimal_share(s, &near, 200);
    T_EQ(ft__sel_choose(s, &w, all, 5, NULL), best_of());
    ft__sel_destroy(s);
}

static void case_unseen_keys(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 4), 0);
    set_costs(5);
    ft__sel_key far = key20;
    far.bucket = 27;
    T_EQ(ft__sel_choose(s, &far, (1u << ARMS) - 1, 6, NULL), 6); /* nothing known: the default */
    optimal_share(s, &key20, 200);
    T_EQ(ft__sel_choose(s, &far, (1u << ARMS) - 1, 6, NULL), best_of()); /* nearest bucket */
    uint32_t without_best = ((1u << ARMS) - 1) & ~(1u << best_of());
    unsigned a = ft__sel_choose(s, &far, without_best, 6, NULL);
    T_TRUE(a != best_of()); /* never an ineligible arm */
    ft__sel_destroy(s);
    /* sizes from 256 MiB up share one bucket: what tune learns at 256M serves a 5 GB shard */
    T_EQ(ft__sel_bucket(4096), 12);
    T_EQ(ft__sel_bucket((256u << 20) - 1), 27);
    T_EQ(ft__sel_bucket(256u << 20), FT__SEL_BUCKET_TOP);
    T_EQ(ft__sel_bucket(5ull << 30), FT__SEL_BUCKET_TOP);
    T_EQ(ft__sel_bucket(UINT64_MAX), FT__SEL_BUCKET_TOP);
}

static void case_profile(void)
{
    ft__selector *s, *t;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 5), 0);
    set_costs(6);
    optimal_share(s, &key20, 200);
    const char *path = t_path("profile.txt");
    T_EQ(ft__sel_save(s, path, "dev=1:2 test"), 0);
    T_EQ(ft__sel_create(&t, ARMS, fake_clock, 6), 0);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), 0);
    T_EQ(ft__sel_choose(t, &key20, (1u << ARMS) - 1, 7, NULL), best_of()); /* starts warm */
    unsigned idx = ft__sel_key_index(&key20);
    for (unsigned a = 0; a < ARMS; a++) {
        float m1 = ft__sel_median(&ft__sel_entry_at(s, idx, true)->arm[a]);
        float m2 = ft__sel_median(&ft__sel_entry_at(t, idx, true)->arm[a]);
        T_TRUE(m1 == 0 ? m2 == 0 : m2 / m1 > 0.9999f && m2 / m1 < 1.0001f);
    }
    ft__sel_destroy(t);
    /* another machine's profile is ignored, and so is a corrupt one */
    T_EQ(ft__sel_create(&t, ARMS, fake_clock, 7), 0);
    T_EQ(ft__sel_load(t, path, "dev=9:9 test"), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "another machine") != NULL);
    FILE *f = fopen(path, "a");
    fputs("0 0 20 2 0 0 3 2 1e9 banana\n", f);
    fclose(f);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "profile.txt:") != NULL);
    T_EQ(ft__sel_choose(t, &key20, (1u << ARMS) - 1, 7, NULL), 7); /* nothing was loaded */
    f = fopen(path, "w");
    fputs("something else\n", f);
    fclose(f);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), -EINVAL);
    T_EQ(ft__sel_load(t, t_path("absent.txt"), "x"), 0);
    ft__sel_destroy(t);
    ft__sel_destroy(s);

    /* Loaded samples count as they are: an arm saved with one (lucky) sample is measured
     * again in use, and two poor calls outvote it (padded, it kept the key). */
    f = fopen(path, "w");
    fputs("fastensor-profile 1\ntag dev=1:2 test\n0 0 20 2 0 0 0 1 5e9\n"
          "0 0 20 2 0 0 1 3 4e9 4e9 4e9\n", f);
    fclose(f);
    T_EQ(ft__sel_create(&t, ARMS, fake_clock, 8), 0);
    T_EQ(ft__sel_load(t, path, "dev=1:2 test"), 0);
    uint64_t mib = 1 << 20, slow = mib * 1000000000ull / 300000000ull; /* 0.3 GB/s */
    for (unsigned i = 0; i < 2; i++) {
        T_EQ(ft__sel_choose(t, &key20, 3, 7, NULL), 0);
        ft__sel_record(t, &key20, 0, mib, slow);
    }
    T_EQ(ft__sel_choose(t, &key20, 3, 7, NULL), 1);
    ft__sel_destroy(t);
}

static ft__selector *shared;

static void *hammer(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg * 7919 + 1;
    for (unsigned i = 0; i < 20000; i++) {
        r = r * 6364136223846793005ull + 1;
        ft__sel_key k = {.write = r >> 63, .bucket = (uint8_t)(10 + (r >> 40) % 12),
                         .cache = (uint8_t)((r >> 20) % 3)};
        unsigned arm = ft__sel_choose(shared, &k, (1u << ARMS) - 1, 0, NULL);
        ft__sel_record(shared, &k, arm, 1 << 20, (uint64_t)(1e6 / (1 + arm)));
    }
    return NULL;
}

static void case_concurrent(void)
{
    T_EQ(ft__sel_create(&shared, ARMS, fake_clock, 8), 0);
    pthread_t th[8];
    for (uintptr_t i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, hammer, (void *)i);
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    /* arm 7 is the fastest everywhere in the hammer: every busy key found it */
    ft__sel_key k = {.bucket = 15, .cache = 1};
    T_EQ(ft__sel_choose(shared, &k, (1u << ARMS) - 1, 0, NULL) == 7 ||
             ft__sel_choose(shared, &k, (1u << ARMS) - 1, 0, NULL) == 7, 1);
    ft__sel_destroy(shared);
}

/* @p calls steps of 4 MiB under @p k: how many went to each arm (printed as @p where). */
static void explore_picks(ft__selector *s, const ft__sel_key *k, unsigned calls,
                          const char *where, unsigned picks[ARMS])
{
    for (unsigned a = 0; a < ARMS; a++)
        picks[a] = 0;
    for (unsigned i = 0; i < calls; i++)
        picks[step(s, k, 4 << 20)]++;
    printf("  explored at %s:", where);
    for (unsigned a = 0; a < ARMS; a++)
        printf(" %u", picks[a]);
    printf("\n");
}

/* A new key explores only the arms its measured neighbour finds competitive, and those the
 * neighbour never measured: unknown is not hopeless (left out, an arm missing at one size
 * was missing from every size explored from it). */
static void case_prior(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 6), 0);
    for (unsigned a = 1; a <= 3; a++) /* measured at 1 MiB: arms 1-2 good, 3 hopeless */
        for (unsigned i = 0; i < FT__SEL_EXPLORE; i++)
            ft__sel_record(s, &key20, a, 1 << 20, a == 3 ? 10000000 : 1000000);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = 1e9; /* at 4 MiB every arm is as good */
    ft__sel_key k22 = key20;
    k22.bucket = 22;
    unsigned picks[ARMS];
    explore_picks(s, &k22, (ARMS - 1) * FT__SEL_EXPLORE, "4 MiB", picks);
    for (unsigned a = 0; a < ARMS; a++)
        T_EQ(picks[a], a == 3 ? 0u : (unsigned)FT__SEL_EXPLORE);
    /* once the key is no longer young (2 x 3 x ARMS calls), what the prior left out is
     * explored too, at once rather than at the re-check rate */
    unsigned later = 0;
    for (unsigned i = 0; i < 2 * FT__SEL_EXPLORE * ARMS + 10; i++)
        later += step(s, &k22, 4 << 20) == 3;
    printf("  arm 3 after the key matured: %u calls\n", later);
    T_TRUE(later >= FT__SEL_EXPLORE);
    ft__sel_destroy(s);
}

/* Record @p n samples of @p arm at @p rate bytes/s under @p key. */
static void record_n(ft__selector *s, const ft__sel_key *key, unsigned arm, unsigned n,
                     double rate)
{
    for (unsigned i = 0; i < n; i++)
        ft__sel_record(s, key, arm, 1 << 20, (uint64_t)((1 << 20) / rate * 1e9));
}

/* Many sizes, a few calls each: a new key's exploration leaves out an arm every related key
 * measured under 80% of its best over three samples among them, and one the other cold class
 * measured under half its best; an arm any of them found close to its best is explored. */
static void case_prior_pooled(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 7), 0);
    ft__sel_key cold = {.bucket = 24, .cache = 0}, k = cold;
    for (int b = 23; b <= 25; b += 2) { /* one or two samples of each arm: no full trial */
        k.bucket = (uint8_t)b;
        record_n(s, &k, 0, 1, 2e9);                  /* the best */
        record_n(s, &k, 1, 2, 1.4e9);                /* 70% in both */
        record_n(s, &k, 2, 1, b == 23 ? 1.4e9 : 1.8e9); /* 70%, then 90% */
        record_n(s, &k, 5, 1, 1.8e9);
    }
    k = cold;
    k.cache = 3; /* the stream class of the same size */
    record_n(s, &k, 0, 1, 2e9);
    record_n(s, &k, 4, 1, 0.8e9); /* 40% */
    record_n(s, &k, 6, 1, 1.9e9);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = 1e9; /* here every arm is as good */
    unsigned picks[ARMS];
    explore_picks(s, &cold, 6 * FT__SEL_EXPLORE, "16 MiB", picks);
    for (unsigned a = 0; a < ARMS; a++)
        T_EQ(picks[a], a == 1 || a == 4 ? 0u : (unsigned)FT__SEL_EXPLORE);
    ft__sel_destroy(s);
}

/* Beside calls in flight the cache-blind arms compete on their own samples when one of them
 * was best alone (a deep queue can win there what a single call did not); where a buffered
 * arm was best alone, it is the answer as before. */
static void case_busy_blind(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 12), 0);
    s->cache_blind = 0xE0;
    for (unsigned a = 0; a < ARMS; a++) /* alone: arm 5 best */
        tput[a] = a == 5 ? 2e9 : a > 5 ? 1.5e9 : 0.5e9;
    optimal_share(s, &cold20, 200);
    ft__sel_key busy = cold20;
    busy.busy = 1;
    for (unsigned a = 0; a < ARMS; a++) /* in flight: arm 7 (a deep queue) 4x faster */
        tput[a] = a == 7 ? 8e9 : a >= 5 ? 2e9 : 0.5e9;
    unsigned share = optimal_share(s, &busy, 400), others = 0;
    for (unsigned i = 0; i < 400; i++)
        others += ft__sel_choose(s, &busy, (1u << ARMS) - 1, 0, NULL) < 5;
    printf("  in flight: %u of 400 on the deep-queue arm, %u of 400 on buffered arms\n", share,
           others);
    T_TRUE(share >= 380);
    T_EQ(others, 0u);
    ft__sel_destroy(s);
}

/* Arms 5..7 (the cache-blind ones of these tests) measured on key20's cold reads into
 * memory of kind @p mem: 1 GB/s. */
static void record_blind_cold(ft__selector *s, ft_mem_kind mem)
{
    ft__sel_key cold = key20;
    cold.cache = 0;
    cold.mem = (uint8_t)mem;
    for (unsigned a = 5; a < ARMS; a++)
        for (unsigned i = 0; i < FT__SEL_EXPLORE; i++)
            ft__sel_record(s, &cold, a, 1 << 20, 1000000);
}

/* Cache-blind (O_DIRECT) arms measured cold are not explored for cached reads, where they
 * are twenty times slower than a page-cache copy; without that knowledge they are. */
static unsigned blind_picks(uint32_t cache_blind, unsigned calls)
{
    ft__selector *s;
    if (ft__sel_create(&s, ARMS, fake_clock, 11) < 0)
        return UINT32_MAX;
    s->cache_blind = cache_blind;
    record_blind_cold(s, FT_MEM_HOST);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a < 5 ? 20e9 : 1e9;
    unsigned picks = 0;
    for (unsigned i = 0; i < calls; i++)
        picks += step(s, &key20, 1 << 20) >= 5;
    ft__sel_destroy(s);
    return picks;
}

static void case_cache_blind(void)
{
    unsigned known = blind_picks(0xE0, 5 * FT__SEL_EXPLORE + 5);
    unsigned unknown = blind_picks(0, 5 * FT__SEL_EXPLORE + 5);
    printf("  O_DIRECT arms tried while exploring cached reads: %u with their cold figures, %u "
           "without\n", known, unknown);
    T_EQ(known, 0u);
    T_EQ(unknown, 3u);
    /* re-checks price them by the estimate too: 0.5 / 19 of the draws that reach them */
    unsigned later = blind_picks(0xE0, 5000);
    printf("  ... and in 5000 calls: %u\n", later);
    T_TRUE(later <= 5);
}

/* A cached key new to its context (the CPU-load class flipped) explores from its neighbour
 * in the other context, which never measured the O_DIRECT arms cached: their cold figures
 * price them, there as here, so none is tried. */
static void case_cache_blind_new_context(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 13), 0);
    s->cache_blind = 0xE0;
    record_blind_cold(s, FT_MEM_HOST);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a < 5 ? 20e9 - 1e9 * a : 1e9;
    unsigned before = 0, after = 0;
    for (unsigned i = 0; i < 200; i++)
        before += step(s, &key20, 1 << 20) >= 5;
    ft__sel_key loaded = key20;
    loaded.cpu = 1;
    for (unsigned i = 0; i < 5 * FT__SEL_EXPLORE + 5; i++)
        after += step(s, &loaded, 1 << 20) >= 5;
    printf("  O_DIRECT arms tried for cached reads: %u in the first context, %u in the next\n",
           before, after);
    T_EQ(before, 0u);
    T_EQ(after, 0u);
    ft__sel_destroy(s);
}

/* A cached key of the other memory kind (host reads on a profile built for device memory)
 * prices the O_DIRECT arms by their cold figures there: the disk is the same. */
static void case_cache_blind_other_memory(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 14), 0);
    s->cache_blind = 0xE0;
    record_blind_cold(s, FT_MEM_CUDA);
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a < 5 ? 20e9 - 1e9 * a : 1e9;
    unsigned picks = 0;
    for (unsigned i = 0; i < 5 * FT__SEL_EXPLORE + 5; i++)
        picks += step(s, &key20, 1 << 20) >= 5;
    printf("  O_DIRECT arms tried for cached host reads, cold figures from device memory: %u\n",
           picks);
    T_EQ(picks, 0u);
    ft__sel_destroy(s);
}

/* Calls in flight in a CPU-load class where no call ran alone take the decision learned
 * alone in the other class, not their own samples (where O_DIRECT scores best per call). */
static void case_busy_other_cpu(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 16), 0);
    s->cache_blind = 0xE0;
    ft__sel_key stream = key20;
    stream.cache = 3;
    for (unsigned a = 0; a < ARMS; a++) /* alone: buffered arm 0 best */
        tput[a] = a == 0 ? 2.5e9 : a < 5 ? 2e9 : 1.2e9;
    optimal_share(s, &stream, 200);
    ft__sel_key busy = stream;
    busy.busy = 1;
    busy.cpu = 1;
    for (unsigned a = 0; a < ARMS; a++) /* in flight, per call: arm 5 looks best */
        for (unsigned i = 0; i < FT__SEL_EXPLORE; i++)
            ft__sel_record(s, &busy, a, 1 << 20, a == 5 ? 800000 : 1000000);
    unsigned blind = 0;
    for (unsigned i = 0; i < 400; i++)
        blind += ft__sel_choose(s, &busy, (1u << ARMS) - 1, 0, NULL) >= 5;
    printf("  in flight, high CPU load, nothing alone there: %u of 400 on O_DIRECT arms\n",
           blind);
    T_EQ(blind, 0u);
    ft__sel_destroy(s);
}

/* A call beside others takes the decision learned alone: the best arm eligible for it (one
 * the file cannot use, such as cuFile after its registration failed, is not). */
static void case_busy(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 9), 0);
    set_costs(4);
    optimal_share(s, &cold20, 200);
    unsigned best = best_of(), second = best == 0 ? 1 : 0;
    for (unsigned a = 0; a < ARMS; a++)
        if (a != best && tput[a] > tput[second])
            second = a;
    ft__sel_key busy = cold20;
    busy.busy = 1;
    uint32_t all = (1u << ARMS) - 1;
    T_EQ(ft__sel_choose(s, &busy, all, 7, NULL), best);
    T_EQ(ft__sel_choose(s, &busy, all & ~(1u << best), 7, NULL), second);
    ft__sel_destroy(s);
}

/* Cached reads beside others are ranked on their own samples (page-cache copies share only
 * the CPUs): where another arm is best in flight than alone, they find it. */
static void case_busy_cached(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 15), 0);
    for (unsigned a = 0; a < ARMS; a++) /* alone: arm 6 best, arm 0 close behind */
        tput[a] = a == 6 ? 4e9 : a == 0 ? 3.5e9 : 1e9;
    optimal_share(s, &key20, 200);
    ft__sel_key busy = key20;
    busy.busy = 1;
    for (unsigned a = 0; a < ARMS; a++) /* in flight: arm 0 five times arm 6 */
        tput[a] = a == 0 ? 40e9 : a == 6 ? 8e9 : 1e9;
    optimal_share(s, &busy, 100);
    unsigned share = optimal_share(s, &busy, 400);
    printf("  in flight: %u of 400 on the arm best there (arm 6 led alone)\n", share);
    T_TRUE(share >= 380);
    ft__sel_destroy(s);
}

/* A 1 MiB file of random bytes in the page cache, in a context of its own with no profile,
 * and the key of its reads alone. */
typedef struct cached_file {
    ft_ctx *ctx;
    ft_file *f;
    uint8_t *src, *dst;
    size_t n;
    ft__sel_key key;
} cached_file;

static int cached_open(cached_file *x, const char *name, uint64_t seed)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    x->n = 1u << 20;
    x->ctx = t_ctx(4);
    x->src = malloc(x->n);
    x->dst = malloc(x->n);
    if (!x->ctx || !x->src || !x->dst ||
        ft_file_open(x->ctx, &x->f, t_path(name),
                     FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644) < 0)
        return -1;
    t_fill_random(x->src, x->n, seed);
    ft_buf b = ft_host_buf(x->src, x->n);
    x->key = (ft__sel_key){.write = 0, .mem = FT_MEM_HOST, .bucket = 20, .cache = 2,
                           .cpu = (uint8_t)ft__probe_cpu()};
    return ft_write(x->f, &b, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX}) == (int64_t)x->n
               ? 0 : -1;
}

static void cached_close(cached_file *x)
{
    ft_file_close(x->f);
    ft_ctx_destroy(x->ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(x->src);
    free(x->dst);
}

/* A call that began alone but ends beside others (which arrived after it) is a sample of
 * calls in flight, not of calls alone. Driven through the decision and completion hooks
 * with the context's in-flight count set by hand, so the overlap is certain. */
static void case_company_arrived(void)
{
    cached_file x;
    T_EQ(cached_open(&x, "company.bin", 9), 0);
    ft_ctx *ctx = x.ctx;
    ft_file *f = x.f;
    size_t n = x.n;
    ft_buf d = ft_host_buf(x.dst, n);
    T_EQ(ft_read(f, &d, 0, NULL), n); /* posix's first call in this context: no sample */
    ft__sel_key alone = x.key, busy = alone;
    busy.busy = 1;
    ft__selector *sel = atomic_load(&f->sel);
    T_TRUE(sel != NULL);
    if (!sel) {
        cached_close(&x);
        return;
    }
    uint32_t before[2], after[2];
    for (unsigned joined = 0; joined < 2; joined++) {
        ft__sel_entry *ea = ft__sel_entry_at(sel, ft__sel_key_index(&alone), true);
        ft__sel_entry *eb = ft__sel_entry_at(sel, ft__sel_key_index(&busy), true);
        before[0] = ea->arm[0].n, before[1] = eb->arm[0].n;
        atomic_fetch_add(&ctx->inflight, 1); /* this call starts alone */
        ft__decision dec;
        ft__auto_decide(f, 0, n, false, false, -1, &dec);
        T_EQ(dec.key.busy, 0);
        if (joined)
            atomic_fetch_add(&ctx->inflight, 1); /* another call arrives and is still running */
        int64_t r = ft_read(f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX});
        T_EQ(r, n);
        atomic_fetch_sub(&ctx->inflight, 1); /* this call ends */
        dec.arm = 0; /* (whatever was decided: posix moved the bytes) */
        dec.engine = FT_ENGINE_POSIX;
        ft__auto_done(f, &dec, r, false);
        if (joined)
            atomic_fetch_sub(&ctx->inflight, 1);
        after[0] = ea->arm[0].n, after[1] = eb->arm[0].n;
        printf("  %s: alone-key samples +%u, in-flight-key samples +%u\n",
               joined ? "another call arrived" : "alone throughout", after[0] - before[0],
               after[1] - before[1]);
        T_EQ(after[0] - before[0], (joined ? 0u : 1u));
        T_EQ(after[1] - before[1], (joined ? 1u : 0u));
    }
    cached_close(&x);
}

/* An engine's first call in a context pays for what its engine sets up once (staging buffers,
 * rings): it is not a sample. */
static void case_first_use(void)
{
    cached_file x;
    T_EQ(cached_open(&x, "first.bin", 8), 0);
    ft_file *f = x.f;
    size_t n = x.n;
    uint8_t *src = x.src, *dst = x.dst;
    ft_buf d = ft_host_buf(dst, n);
    ft__sel_key key = x.key;
    uint32_t samples[2];
    for (unsigned i = 0; i < 2; i++) { /* (a third call explores another arm) */
        T_EQ(ft_read(f, &d, 0, NULL), n); /* a cached read: posix */
        T_MEMEQ(src, dst, n);
        ft__selector *sel = atomic_load(&f->sel);
        T_TRUE(sel != NULL);
        ft__sel_entry *e = sel ? ft__sel_entry_at(sel, ft__sel_key_index(&key), false) : NULL;
        samples[i] = e ? e->arm[0].n : 0;
    }
    printf("  posix samples after 1, 2 calls: %u %u\n", samples[0], samples[1]);
    T_EQ(samples[0], 0u);
    T_EQ(samples[1], 1u);
    cached_close(&x);
}

/* AUTO end to end: real files, every arm correct, decisions recorded and persisted. */
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
    for (unsigned i = 0; i < 40; i++) { /* enough to explore every arm for both directions */
        T_EQ(ft_write(f, &b, 4095, NULL), n);
        memset(dst, 0, n);
        T_EQ(ft_read(f, &d, 4095, NULL), n);
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
    char dir[4096], *dbuf = NULL; /* the directory holding it: the same filesystem's table */
    snprintf(dir, sizeof dir, "%s", t_path("auto.bin"));
    *strrchr(dir, '/') = '\0';
    out = open_memstream(&dbuf, &len);
    T_EQ(ft_profile_show(ctx, dir, out), 0);
    fclose(out);
    T_TRUE(!strcmp(buf, dbuf));
    free(dbuf);
    out = open_memstream(&dbuf, &len);
    T_EQ(ft_profile_show(ctx, t_path("no-such-file"), out), -ENOENT);
    fclose(out);
    free(dbuf);
    free(buf);
    ft_ctx_destroy(ctx);
    FILE *p = fopen(t_path("auto-profile.txt"), "r");
    T_TRUE(p != NULL);
    char line[64];
    T_TRUE(fgets(line, sizeof line, p) && !strcmp(line, "fastensor-profile 1\n"));
    fclose(p);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
    free(dst);
}

/* Decisions made so far for @p key of @p f's selector, whatever the CPU load class. */
static uint32_t decisions(ft_file *f, const ft__sel_key *key)
{
    ft__selector *sel = atomic_load(&f->sel);
    uint32_t n = 0;
    for (unsigned cpu = 0; sel && cpu < FT__SEL_CPU; cpu++) {
        ft__sel_key k = *key;
        k.cpu = (uint8_t)cpu;
        ft__sel_entry *e = ft__sel_entry_at(sel, ft__sel_key_index(&k), false);
        n += e ? e->calls : 0;
    }
    return n;
}

/* A large AUTO transfer whose arm is on trial moves only a 256 MiB slice with it and decides
 * again for the rest (each slice at its own offset and address: the bytes must come out
 * whole); a synchronous write is never cut (it is measured with its fdatasync). */
static void case_trial_slices(void)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *ctx = t_ctx(4);
    ft_file *f;
    T_EQ(ft_file_open(ctx, &f, t_path("slices.bin"),
                      FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
    size_t n = (512u << 20) + 4097; /* two slices, then an odd tail */
    uint8_t *src = malloc(n), *dst = malloc(n);
    T_TRUE(src && dst);
    if (!src || !dst)
        return;
    t_fill_random(src, n, 31);
    ft_buf b = ft_host_buf(src, n), d = ft_host_buf(dst, n);
    T_EQ(ft_write(f, &b, 4096, &(ft_io_opts){.engine = FT_ENGINE_POSIX}), n); /* cached */
    ft__sel_key key = {.write = 0, .mem = FT_MEM_HOST, .bucket = FT__SEL_BUCKET_TOP, .cache = 2};
    uint32_t most = 0;
    /* A key's first two calls are unseen-key answers, not trials. Up to 8 calls: a loaded
     * machine can flip the CPU-load class between calls, and each class's key starts
     * unseen (one failure in three runs here beside a benchmark, at 4 calls). */
    for (unsigned i = 0; i < 8 && most < 2; i++) {
        uint32_t before = decisions(f, &key);
        memset(dst, 0, n);
        T_EQ(ft_read(f, &d, 4096, NULL), n);
        T_MEMEQ(src, dst, n);
        uint32_t made = decisions(f, &key) - before;
        most = made > most ? made : most;
    }
    printf("  most decisions in one 512 MiB read: %u\n", most);
    T_TRUE(most >= 2);
    ft__sel_key wkey = {.write = 1, .mem = FT_MEM_HOST, .bucket = FT__SEL_BUCKET_TOP, .cache = 1};
    for (unsigned i = 0; i < 3; i++) { /* trials from the 2nd call on */
        uint32_t before = decisions(f, &wkey);
        T_EQ(ft_write(f, &b, 0, &(ft_io_opts){.flags = FT_IO_SYNC}), n);
        uint32_t after = decisions(f, &wkey);
        printf("  synchronous 512 MiB write %u: %u decisions\n", i + 1, after - before);
        T_EQ(after - before, 1u);
    }
    memset(dst, 0, n);
    T_EQ(ft_read(f, &d, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX}), n);
    T_MEMEQ(src, dst, n);
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
    free(dst);
}

/* The arm statistics of @p d's key (whatever it is now). */
static ft__sel_stats arm_stats(const ft__decision *d, unsigned arm)
{
    ft__sel_entry *e = ft__sel_entry_at(d->sel, ft__sel_key_index(&d->key), false);
    ft__sel_stats st = {0};
    if (e) {
        pthread_mutex_lock(&e->lock);
        st = e->arm[arm];
        pthread_mutex_unlock(&e->lock);
    }
    return st;
}

/* Report @p n plain writes of @p bytes each on @p arm (of engine @p engine) as done. */
static void fake_writes(ft_file *f, ft__decision d, unsigned arm, ft_engine engine,
                        unsigned n, uint64_t bytes)
{
    d.arm = arm;
    d.engine = engine;
    for (unsigned i = 0; i < n; i++)
        ft__auto_done(f, &d, (int64_t)bytes, false);
}

/* A context without a profile (FASTENSOR_PROFILE=off) and @p name opened in it for reading
 * and writing (NULL when that fails); undone by close_unprofiled. */
static ft_file *open_unprofiled(ft_ctx **ctx, const char *name)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    *ctx = t_ctx(2);
    ft_file *f = NULL;
    int rc = ft_file_open(*ctx, &f, t_path(name), FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE,
                          0644);
    return rc == 0 ? f : NULL;
}

static void close_unprofiled(ft_ctx *ctx, ft_file *f)
{
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    unsetenv("FASTENSOR_PROFILE");
}

/* Plain writes: one sample per (key, arm) run at the sync, not one per write; a run of a few
 * buffered KiB is no sample (the sync's time is then its own fixed cost, not theirs). */
static void case_write_runs(void)
{
    ft_ctx *ctx;
    ft_file *f = open_unprofiled(&ctx, "runs.bin");
    T_TRUE(f != NULL);
    ft__decision d;
    ft__auto_decide(f, 0, 65536, true, false, -1, &d);
    T_TRUE(d.sel != NULL);
    const unsigned posix = 0, direct = 2; /* ft__arms[] */
    fake_writes(f, d, posix, FT_ENGINE_POSIX, 1, 65536); /* each engine's first use */
    fake_writes(f, d, direct, FT_ENGINE_DIRECT, 1, 65536);
    fake_writes(f, d, posix, FT_ENGINE_POSIX, 100, 65536);
    fake_writes(f, d, direct, FT_ENGINE_DIRECT, 50, 65536);
    T_EQ(arm_stats(&d, posix).pending, 100u);
    T_EQ(arm_stats(&d, direct).pending, 50u);
    T_EQ(ft_file_sync(f), 0);
    ft__sel_stats p = arm_stats(&d, posix), q = arm_stats(&d, direct);
    printf("  after a run of 100 + 50 writes and its sync: %u + %u samples\n", p.n, q.n);
    T_EQ(p.n, 1u);
    T_EQ(q.n, 1u);
    T_EQ(p.pending + q.pending, 0u);
    fake_writes(f, d, posix, FT_ENGINE_POSIX, 3, 4096);
    fake_writes(f, d, direct, FT_ENGINE_DIRECT, 100, 65536);
    T_EQ(ft_file_sync(f), 0);
    p = arm_stats(&d, posix);
    q = arm_stats(&d, direct);
    printf("  after 12 KiB buffered among 100 O_DIRECT writes: %u + %u samples\n", p.n, q.n);
    T_EQ(p.n, 1u);
    T_EQ(q.n, 2u);
    T_EQ(p.pending, 0u);
    close_unprofiled(ctx, f);
}

/* Writes the caller syncs later (FT_IO_SYNC_LATER, as a checkpoint save's): a key class of
 * their own, no page-cache arm from 64 KiB up, measured at the sync; the bytes land whole. */
static void case_sync_later(void)
{
    ft_ctx *ctx;
    ft_file *f = open_unprofiled(&ctx, "later.bin");
    T_TRUE(f != NULL);
    ft__decision d;
    ft__auto_decide(f, 0, 1u << 20, true, 2, -1, &d);
    T_EQ(d.key.cache, 2);
    T_TRUE(d.engine == FT_ENGINE_DIRECT || d.engine == FT_ENGINE_URING);
    ft__auto_decide(f, 0, 4096, true, 2, -1, &d); /* small: the page cache is allowed */
    T_EQ(d.engine, FT_ENGINE_POSIX);
    size_t piece = 1u << 20, n = 12 * piece;
    uint8_t *src = malloc(n), *dst = malloc(n);
    T_TRUE(src && dst);
    if (!src || !dst)
        return;
    t_fill_random(src, n, 41);
    ft_io_opts later = {.flags = FT_IO_SYNC_LATER};
    for (size_t off = 0; off < n; off += piece) {
        ft_buf b = ft_host_buf(src + off, piece);
        T_EQ(ft_write(f, &b, off, &later), (int64_t)piece);
    }
    ft__auto_decide(f, 0, piece, true, 2, -1, &d);
    uint32_t pending = 0, samples = 0, buffered = 0;
    for (unsigned a = 0; a < ft__narms; a++) {
        pending += arm_stats(&d, a).pending;
        buffered += ft__arms[a].engine == FT_ENGINE_POSIX || ft__arms[a].engine == FT_ENGINE_MMAP
                        ? arm_stats(&d, a).pending + arm_stats(&d, a).n : 0;
    }
    printf("  12 writes of 1 MiB synced later: %u awaiting the sync\n", pending);
    T_TRUE(pending >= 1);
    T_EQ(buffered, 0u);
    T_EQ(ft_file_sync(f), 0);
    pending = 0;
    for (unsigned a = 0; a < ft__narms; a++) {
        pending += arm_stats(&d, a).pending;
        samples += arm_stats(&d, a).n;
    }
    T_EQ(pending, 0u);
    T_TRUE(samples >= 1);
    ft_buf back = ft_host_buf(dst, n);
    T_EQ(ft_read(f, &back, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX}), (int64_t)n);
    T_MEMEQ(src, dst, n);
    close_unprofiled(ctx, f);
    free(src);
    free(dst);
}

/* With nothing known: a cached read starts on posix (an O_DIRECT engine would read it from
 * the disk again), a cold one on an O_DIRECT engine; reads that go on from the previous one
 * form the stream class. */
static void case_static_defaults(void)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *ctx = t_ctx(4);
    ft_file *f;
    const char *path = t_path("defaults.bin");
    T_EQ(ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644), 0);
    size_t n = 8u << 20;
    uint8_t *src = malloc(n);
    t_fill_random(src, n, 5);
    ft_buf b = ft_host_buf(src, n);
    ft_io_opts posix = {.engine = FT_ENGINE_POSIX};
    T_EQ(ft_write(f, &b, 0, &posix), n); /* through the page cache: cached now */
    ft__decision d;
    ft__auto_decide(f, 0, n, false, false, -1, &d);
    T_EQ(d.key.cache, 2);
    T_EQ(d.engine, FT_ENGINE_POSIX);
    T_EQ(ft_file_sync(f), 0);
    FILE *evict = fopen(path, "r");
    T_TRUE(evict != NULL);
    T_EQ(posix_fadvise(fileno(evict), 0, 0, POSIX_FADV_DONTNEED), 0);
    fclose(evict);
    usleep(3000); /* past the cache probe's 1 ms memo */
    ft__auto_decide(f, 0, n, false, false, -1, &d);
    T_EQ(d.key.cache, 0);
    T_TRUE(d.engine == FT_ENGINE_URING || d.engine == FT_ENGINE_DIRECT);
    /* reading on from there is a stream (readahead's context); far away again is not */
    ft__auto_decide(f, n, n / 4, false, false, -1, &d);
    T_EQ(d.key.cache, 3);
    ft__auto_decide(f, n + n / 4, n / 4, false, false, -1, &d);
    T_EQ(d.key.cache, 3);
    /* requests in flight start out of order: 20 lengths ahead still continues the stream */
    ft__auto_decide(f, n + n / 2 + 20 * (n / 4), n / 4, false, false, -1, &d);
    T_EQ(d.key.cache, 3);
    ft__auto_decide(f, 64 * n, n / 4, false, false, -1, &d);
    T_EQ(d.key.cache, 0);
    /* 64 MiB reads, 4 in flight: decided out of order, two lengths ahead or three behind the
     * last one, they still continue the stream (64 MiB alone was the limit before); back at
     * the file's start, a new pass begins */
    const uint64_t big = 64u << 20, at = 64 * big;
    atomic_store(&ctx->inflight, 4u);
    ft__auto_decide(f, at, big, false, false, -1, &d);
    T_EQ(d.key.cache, 0);
    ft__auto_decide(f, at + 3 * big, big, false, false, -1, &d);
    T_EQ(d.key.cache, 3);
    ft__auto_decide(f, at + big, big, false, false, -1, &d);
    T_EQ(d.key.cache, 3);
    ft__auto_decide(f, 0, big, false, false, -1, &d);
    T_EQ(d.key.cache, 0);
    atomic_store(&ctx->inflight, 0u);
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
}

/* Samples recorded so far under @p key (every arm). */
static uint32_t key_samples(ft__selector *sel, const ft__sel_key *key)
{
    ft__sel_entry *e = sel ? ft__sel_entry_at(sel, ft__sel_key_index(key), false) : NULL;
    uint32_t n = 0;
    for (unsigned a = 0; e && a < sel->narms; a++)
        n += e->arm[a].n;
    return n;
}

/* Samples recorded so far under @p key in either CPU-load class: the class is probed per
 * call, and another process's load can flip it in the middle of a loop. */
static uint32_t key_samples_any_cpu(ft__selector *sel, const ft__sel_key *key)
{
    uint32_t n = 0;
    for (unsigned cpu = 0; cpu < FT__SEL_CPU; cpu++) {
        ft__sel_key k = *key;
        k.cpu = (uint8_t)cpu;
        n += key_samples(sel, &k);
    }
    return n;
}

/* Small reads are timed one in eight once their key is explored, drawn at random (calls
 * alternating between two keys leave neither untimed); every trial is timed. */
static void case_small_reads_sampled(void)
{
    cached_file x;
    T_EQ(cached_open(&x, "small.bin", 12), 0);
    ft_file *f = x.f;
    uint8_t *src = x.src, *dst = x.dst;
    ft__sel_key key[2] = {x.key, x.key};
    key[0].bucket = 12; /* 4 KiB reads */
    key[1].bucket = 13; /* 8 KiB reads */
    ft_buf d[2] = {ft_host_buf(dst, 4096), ft_host_buf(dst, 8192)};
    unsigned trials = 0, untimed_trials = 0;
    for (unsigned i = 0; i < 800; i++) { /* explore both keys: every trial timed */
        ft__decision dec;
        ft__auto_decide(f, 0, d[i & 1].len, false, false, -1, &dec);
        trials += dec.trial;
        untimed_trials += dec.trial && !dec.timed;
        T_EQ(ft_read(f, &d[i & 1], 0, NULL), (int64_t)d[i & 1].len);
    }
    T_MEMEQ(src, dst, 8192);
    ft__selector *sel = atomic_load(&f->sel);
    const unsigned calls = 1600; /* per key, alternating */
    uint32_t made[2];
    for (unsigned k = 0; k < 2; k++)
        made[k] = key_samples_any_cpu(sel, &key[k]);
    for (unsigned i = 0; i < 2 * calls; i++)
        T_EQ(ft_read(f, &d[i & 1], 0, NULL), (int64_t)d[i & 1].len);
    for (unsigned k = 0; k < 2; k++)
        made[k] = key_samples_any_cpu(sel, &key[k]) - made[k];
    printf("  trials while exploring: %u, untimed: %u; samples from %u cached 4 KiB and 8 KiB "
           "reads each, alternating: %u and %u\n", trials, untimed_trials, calls, made[0], made[1]);
    T_TRUE(trials >= 3);
    T_EQ(untimed_trials, 0u);
    /* one in 8: 200 +- 60 (4.5 standard deviations of Binomial(1600, 1/8), 13.2), plus the
     * re-checks (2%, timed whole) */
    for (unsigned k = 0; k < 2; k++)
        T_TRUE(made[k] >= calls / 8 - 60 && made[k] <= calls / 8 + 60 + calls / 20);
    cached_close(&x);
}

/* A stream key's arm is not eliminated on one sample (its first call there may have found no
 * readahead); any other key's is, under a quarter of the best. */
static void case_stream_one_sample(void)
{
    for (unsigned stream = 0; stream < 2; stream++) {
        ft__selector *s;
        T_EQ(ft__sel_create(&s, 2, fake_clock, 1), 0);
        s->recheck = 0;
        ft__sel_key k = {.bucket = 12, .cache = (uint8_t)(stream ? 3 : 0)};
        for (int i = 0; i < 3; i++)
            ft__sel_record(s, &k, 1, 4096, 10000); /* arm 1: 0.41 GB/s */
        ft__sel_record(s, &k, 0, 4096, 200000);    /* arm 0: 0.02 GB/s once */
        unsigned tried = 0, last = 0;
        for (int i = 0; i < 20; i++) {
            last = ft__sel_choose(s, &k, 3, 1, NULL);
            if (last == 0) { /* arm 0 as it really is: 0.51 GB/s */
                tried++;
                ft__sel_record(s, &k, 0, 4096, 8000);
            } else {
                ft__sel_record(s, &k, 1, 4096, 10000);
            }
        }
        printf("  %s key: arm 0 tried %u more times, last pick %u\n", stream ? "stream" : "cold",
               tried, last);
        if (stream) {
            T_TRUE(tried >= 2);
            T_EQ(last, 0u);
        } else {
            T_EQ(tried, 0u);
        }
        ft__sel_destroy(s);
    }
}

/* Stream reads beside others of the stint sizes are ranked on their own samples (stints'
 * delivered rates, see stint.c) among every arm: not by the calls alone, where a buffered arm
 * that is best in flight (its readahead serving the calls after it) can look hopeless. */
static void case_stint_keys(void)
{
    ft__selector *s;
    T_EQ(ft__sel_create(&s, ARMS, fake_clock, 14), 0);
    s->cache_blind = 0xE0;
    s->stint_buckets = 1ull << 20;
    ft__sel_key alone = key20, busy = key20;
    alone.cache = busy.cache = 3;
    busy.busy = 1;
    for (unsigned a = 0; a < ARMS; a++) /* alone: O_DIRECT arm 5 best, buffered far behind */
        tput[a] = a == 5 ? 2e9 : a > 5 ? 1.5e9 : 0.4e9;
    optimal_share(s, &alone, 200);
    for (unsigned a = 0; a < ARMS; a++) /* in flight: buffered arm 1 best */
        tput[a] = a == 1 ? 3e9 : a >= 5 ? 1.2e9 : 0.5e9;
    unsigned share = optimal_share(s, &busy, 400);
    ft__sel_key other = busy; /* a size that is not measured in stints: as before */
    other.bucket = 24;
    for (unsigned a = 0; a < ARMS; a++)
        tput[a] = a == 5 ? 2e9 : a > 5 ? 1.5e9 : 0.4e9;
    optimal_share(s, &(ft__sel_key){.bucket = 24, .cache = 3}, 200);
    unsigned blind = 0;
    for (unsigned i = 0; i < 200; i++)
        blind += ft__sel_choose(s, &other, (1u << ARMS) - 1, 0, NULL) >= 5;
    printf("  stint key: %u of 400 on the arm best in flight; other size: %u of 200 on "
           "O_DIRECT arms, as learned alone\n", share, blind);
    T_TRUE(share >= 350);
    T_EQ(blind, 200u);
    ft__sel_destroy(s);
}

/* A file of @p n random bytes (@p src), written, synced and dropped from the page cache. */
static ft_file *cold_file(ft_ctx *ctx, const char *name, uint8_t *src, size_t n)
{
    ft_file *f;
    const char *path = t_path(name);
    if (ft_file_open(ctx, &f, path, FT_OPEN_READ | FT_OPEN_WRITE | FT_OPEN_CREATE, 0644) < 0)
        return NULL;
    ft_buf b = ft_host_buf(src, n);
    FILE *evict = NULL;
    if (ft_write(f, &b, 0, &(ft_io_opts){.engine = FT_ENGINE_POSIX}) != (int64_t)n ||
        ft_file_sync(f) < 0 || !(evict = fopen(path, "r")) ||
        posix_fadvise(fileno(evict), 0, 0, POSIX_FADV_DONTNEED) != 0) {
        if (evict)
            fclose(evict);
        ft_file_close(f);
        return NULL;
    }
    fclose(evict);
    usleep(3000); /* past the cache probe's 1 ms memo */
    return f;
}

/* A context without a profile whose every engine has made its first AUTO call (which would
 * spoil a stint: it pays for its engine's setup), and @p f on it: @p n random bytes
 * (@p src), cold. NULL on failure. */
static ft_ctx *stint_setup(const char *name, uint8_t *src, size_t n, ft_file **f)
{
    setenv("FASTENSOR_PROFILE", "off", 1);
    ft_ctx *ctx = t_ctx(4);
    t_fill_random(src, n, 41);
    *f = ctx ? cold_file(ctx, name, src, n) : NULL;
    if (!*f) {
        ft_ctx_destroy(ctx);
        return NULL;
    }
    ft__decision mark;
    ft__auto_decide(*f, n - 1, 1, false, false, -1, &mark); /* far from 0: no stream */
    mark.timed = false;
    for (ft_engine e = FT_ENGINE_POSIX; e <= FT_ENGINE_MMAP; e++) {
        mark.engine = e;
        ft__auto_done(*f, &mark, 1, false);
    }
    return ctx;
}

/* Samples of the stream key beside others for reads of 2^@p bucket bytes (any CPU load), and
 * the calls of it still pending. */
static uint32_t stint_samples(ft__selector *sel, unsigned bucket, uint32_t *pending)
{
    ft__sel_key key = {.mem = FT_MEM_HOST, .bucket = (uint8_t)bucket, .cache = 3, .busy = 1};
    for (unsigned cpu = 0; cpu < FT__SEL_CPU && pending; cpu++) {
        key.cpu = (uint8_t)cpu;
        ft__sel_entry *e = ft__sel_entry_at(sel, ft__sel_key_index(&key), false);
        for (unsigned a = 0; e && a < sel->narms; a++)
            *pending += e->arm[a].pending;
    }
    return key_samples_any_cpu(sel, &key);
}

/* AUTO on a cold stream of 1 MiB reads with calls in flight: the calls come in stints of
 * one arm (32 MiB), one sample per stint (not per call) under the stream key beside others,
 * nothing left pending, the bytes exact. Then 1 MiB and 2 MiB reads interleaved: each size's
 * stints go on in a lane of their own. The in-flight count is raised by hand, so every call
 * is one beside others. */
static void case_stints(void)
{
    const size_t n = 96u << 20, len = 1u << 20;
    uint8_t *src = malloc(n), *dst = malloc(n);
    ft_file *f = NULL;
    ft_ctx *ctx = src && dst ? stint_setup("stints.bin", src, n, &f) : NULL;
    T_TRUE(ctx != NULL);
    if (!ctx) {
        free(src);
        free(dst);
        return;
    }
    atomic_fetch_add(&ctx->inflight, 3);
    for (size_t off = 0; off < n; off += len) {
        ft_buf b = ft_host_buf(dst + off, len);
        T_EQ(ft_read(f, &b, off, NULL), (int64_t)len);
    }
    T_MEMEQ(src, dst, n);
    ft__selector *sel = atomic_load(&f->sel);
    uint32_t samples = stint_samples(sel, 20, NULL), pending = 0;
    ft_file_close(f); /* the last stint, ended by the stream's end, is recorded at close */
    uint32_t closed = stint_samples(sel, 20, &pending);
    printf("  %zu calls of 1 MiB: stint samples %u, %u after close; pending %u\n", n / len,
           samples, closed, pending);
    /* 95 stream calls (the first is cold) in stints of 32: two whole, the third at close */
    T_EQ(samples, 2u);
    T_EQ(closed, 3u);
    T_EQ(pending, 0u);

    T_TRUE((f = cold_file(ctx, "stints2.bin", src, n)) != NULL);
    memset(dst, 0, n);
    size_t off = 0;
    for (unsigned i = 0; f && off + 2 * len <= n; i++) { /* 1M, 2M, 1M, ... */
        size_t l = i & 1 ? 2 * len : len;
        ft_buf b = ft_host_buf(dst + off, l);
        T_EQ(ft_read(f, &b, off, NULL), (int64_t)l);
        off += l;
    }
    T_MEMEQ(src, dst, off);
    uint32_t s1 = stint_samples(sel, 20, NULL) - closed, s2 = stint_samples(sel, 21, NULL);
    if (f)
        ft_file_close(f);
    uint32_t s1_closed = stint_samples(sel, 20, NULL) - closed;
    atomic_fetch_sub(&ctx->inflight, 3);
    printf("  interleaved: %zu bytes, stint samples 1 MiB %u (%u after close), 2 MiB %u\n", off,
           s1, s1_closed, s2);
    /* 32 calls of each size: of 2 MiB two whole stints of 16; of 1 MiB 31 stream calls, most
     * of a stint of 32, recorded at close */
    T_EQ(s2, 2u);
    T_EQ(s1, 0u);
    T_EQ(s1_closed, 1u);
    ft_ctx_destroy(ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
    free(dst);
}

/* Two stints of 32 calls of 1 MiB in flight together for 40 ms, completed one after the
 * other in a burst (as buffered calls do when the one ahead of them waited for the disk):
 * each is charged its calls' share of the time, 20 ms, not the first completion all of it
 * and the other nothing. Driven through the decision and completion hooks. */
static void case_stint_shares(void)
{
    const size_t n = 1u << 20;
    uint8_t *src = malloc(n);
    ft_file *f = NULL;
    ft_ctx *ctx = src ? stint_setup("shares.bin", src, n, &f) : NULL;
    T_TRUE(ctx != NULL);
    if (!ctx) {
        free(src);
        return;
    }
    atomic_fetch_add(&ctx->inflight, 4);
    ft__decision first, d[64];
    ft__auto_decide(f, 0, n, false, false, -1, &first); /* starts the stream: no stint */
    ft__auto_done(f, &first, 0, false);
    for (unsigned i = 0; i < 64; i++)
        ft__auto_decide(f, (i + 1) * (uint64_t)n, n, false, false, -1, &d[i]);
    usleep(40000);
    for (unsigned i = 0; i < 64; i++)
        ft__auto_done(f, &d[i], (int64_t)n, false);
    atomic_fetch_sub(&ctx->inflight, 4);
    ft__selector *sel = atomic_load(&f->sel);
    ft__sel_key key = {.mem = FT_MEM_HOST, .bucket = 20, .cache = 3, .busy = 1};
    float got[4];
    unsigned k = 0;
    for (unsigned cpu = 0; cpu < FT__SEL_CPU; cpu++) {
        key.cpu = (uint8_t)cpu;
        ft__sel_entry *e = ft__sel_entry_at(sel, ft__sel_key_index(&key), false);
        for (unsigned a = 0; e && a < sel->narms; a++)
            for (unsigned i = 0; i < e->arm[a].n && i < FT__SEL_WINDOW && k < 4; i++)
                got[k++] = e->arm[a].tput[i];
    }
    printf("  stints %u %u, samples:", d[0].stint, d[63].stint);
    for (unsigned i = 0; i < k; i++)
        printf(" %.2f GB/s", (double)got[i] / 1e9);
    printf(" (32 MiB in 20 ms: 1.68)\n");
    T_TRUE(d[0].stint != d[63].stint);
    T_EQ(k, 2u);
    for (unsigned i = 0; i < k; i++) /* the 40 ms may run long, not short */
        T_TRUE(got[i] > 0.4e9 && got[i] < 1.9e9);
    ft_file_close(f);
    ft_ctx_destroy(ctx);
    unsetenv("FASTENSOR_PROFILE");
    free(src);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s", t_dir());
    const t_case cases[] = {
        {"converges within the exploration budget", case_converges},
        {">= 95% optimal decisions once converged", case_stationary},
        {"re-checks cost under 2% of the time once converged", case_recheck_cost},
        {"re-converges after the costs swap", case_swap},
        {"a drift re-explores the arms that may lead, not the hopeless",
         case_drift_spares_hopeless},
        {"the chosen arm gives way after three calls behind the next", case_behind_streak},
        {"unseen keys: nearest bucket, then the default", case_unseen_keys},
        {"writes awaiting their sync: the default after the trials", case_writes_awaiting_sync},
        {"plain writes: a sample per arm and run at the sync", case_write_runs},
        {"writes synced later: their own class, O_DIRECT from 64 KiB", case_sync_later},
        {"a new key explores what its neighbour found good or never measured, then the rest",
         case_prior},
        {"... and leaves out what related keys all found well behind", case_prior_pooled},
        {"calls in flight: the best eligible arm learned alone", case_busy},
        {"... learned alone in the other CPU-load class", case_busy_other_cpu},
        {"cached reads in flight: ranked on their own samples", case_busy_cached},
        {"cached reads skip O_DIRECT arms measured slow cold", case_cache_blind},
        {"... and so does a cached key new to its CPU-load context", case_cache_blind_new_context},
        {"... and one of the other memory kind", case_cache_blind_other_memory},
        {"large transfers are tried a slice at a time", case_trial_slices},
        {"calls in flight: O_DIRECT arms compete when one was best alone", case_busy_blind},
        {"profile round trip; foreign and corrupt profiles ignored", case_profile},
        {"8 threads choosing and recording at once", case_concurrent},
        {"engine AUTO on real files, profile saved", case_auto_end_to_end},
        {"an engine's first call in a context is not a sample", case_first_use},
        {"a call that began alone but ended beside others is not an alone sample",
         case_company_arrived},
        {"unseen keys: posix for cached reads, O_DIRECT for cold; streams", case_static_defaults},
        {"small reads: one in eight timed once explored, every trial timed",
         case_small_reads_sampled},
        {"a stream key's arm is not eliminated on one sample", case_stream_one_sample},
        {"stream reads in flight of stint sizes: ranked on their own samples",
         case_stint_keys},
        {"... measured in stints on a real file: a sample per stint", case_stints},
        {"... each stint charged its calls' share of the time in flight", case_stint_shares},
    };
    return t_run(cases, sizeof cases / sizeof *cases);
}
