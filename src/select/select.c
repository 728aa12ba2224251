/* The selector's policy: explore, exploit by median, re-check, drift, nearest bucket. */
#include "select.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ft__sel_create(ft__selector **out, unsigned narms, uint64_t (*now_ns)(void), uint64_t seed)
{
    if (narms == 0 || narms > FT__SEL_MAX_ARMS)
        return -EINVAL;
    ft__selector *s = calloc(1, sizeof *s);
    ft__sel_entry *_Atomic *e = s ? calloc(FT__SEL_KEYS, sizeof *e) : NULL;
    if (!e) {
        free(s);
        return -ENOMEM;
    }
    s->entries = e;
    s->narms = narms;
    s->now_ns = now_ns;
    s->rng = seed | 1;
    s->recheck = 0.02;
    s->drift = 0.6;
    *out = s;
    return 0;
}

void ft__sel_destroy(ft__selector *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < FT__SEL_KEYS; i++) {
        ft__sel_entry *e = atomic_load_explicit(&s->entries[i], memory_order_acquire);
        if (e) {
            pthread_mutex_destroy(&e->lock);
            free(e);
        }
    }
    free(s->entries);
    free(s);
}

ft__sel_entry *ft__sel_entry_at(ft__selector *s, unsigned index, bool make)
{
    ft__sel_entry *e = atomic_load_explicit(&s->entries[index], memory_order_acquire);
    if (e || !make)
        return e;
    ft__sel_entry *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    pthread_mutex_init(&fresh->lock, NULL);
    fresh->best = -1;
    if (atomic_compare_exchange_strong_explicit(&s->entries[index], &e, fresh,
                                                memory_order_acq_rel, memory_order_acquire))
        return fresh;
    pthread_mutex_destroy(&fresh->lock); /* another thread made it first: e is theirs */
    free(fresh);
    return e;
}

bool ft__sel_stint_key(const ft__selector *s, const ft__sel_key *k)
{
    return ft__sel_stream_key(k) && k->busy && k->bucket < 64 &&
           (s->stint_buckets >> k->bucket & 1);
}

unsigned ft__sel_bucket(uint64_t len)
{
    unsigned b = len ? 63u - (unsigned)__builtin_clzll(len) : 0;
    return b < FT__SEL_BUCKET_TOP ? b : FT__SEL_BUCKET_TOP;
}

unsigned ft__sel_key_index(const ft__sel_key *k)
{
    unsigned i = k->write;
    i = i * 2 + k->mem;
    i = i * FT__SEL_BUCKETS + k->bucket;
    i = i * FT__SEL_CACHE + k->cache;
    i = i * FT__SEL_BUSY + k->busy;
    return i * FT__SEL_CPU + k->cpu;
}

void ft__sel_key_decode(unsigned index, ft__sel_key *k)
{
    k->cpu = (uint8_t)(index % FT__SEL_CPU);
    index /= FT__SEL_CPU;
    k->busy = (uint8_t)(index % FT__SEL_BUSY);
    index /= FT__SEL_BUSY;
    k->cache = (uint8_t)(index % FT__SEL_CACHE);
    index /= FT__SEL_CACHE;
    k->bucket = (uint8_t)(index % FT__SEL_BUCKETS);
    index /= FT__SEL_BUCKETS;
    k->mem = (uint8_t)(index % 2);
    k->write = (uint8_t)(index / 2);
}

float ft__sel_median(const ft__sel_stats *st)
{
    return st->n ? st->med : 0;
}

void ft__sel_stats_changed(ft__sel_stats *st)
{
    unsigned n = FT__MIN(st->n, (uint32_t)FT__SEL_WINDOW);
    st->med = 0;
    if (n == 0)
        return;
    float v[FT__SEL_WINDOW];
    memcpy(v, st->tput, n * sizeof *v);
    for (unsigned i = 1; i < n; i++) /* insertion sort: at most 8 values */
        for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
            float t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    st->med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A uniform draw in [0, 1) (splitmix64 over an atomic counter: lock-free, thread-safe). */
static double draw(ft__selector *s)
{
    uint64_t z = atomic_fetch_add_explicit(&s->rng, 0x9E3779B97F4A7C15ull, memory_order_relaxed);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static int best_arm(const ft__sel_entry *e, uint32_t eligible, unsigned narms)
{
    int best = -1;
    float bm = -1;
    for (unsigned a = 0; a < narms; a++) {
        if (!(eligible >> a & 1) || e->arm[a].n == 0)
            continue;
        float m = ft__sel_median(&e->arm[a]);
        if (m > bm) {
            bm = m;
            best = (int)a;
        }
    }
    return best;
}

/* Make @p arm the key's chosen arm, its median the record, and start its streaks anew.
 * Call with the key's lock held. */
static void lead(ft__sel_entry *e, int arm)
{
    e->best = (int8_t)arm;
    e->record = ft__sel_median(&e->arm[arm]);
    e->low_streak = 0;
    e->behind_streak = 0;
}

/* The best arm of the nearest size bucket with data in the same context, else in the
 * nearest other context (CPU load, then transfers in flight), or -1. */
static int nearest_known_in(ft__selector *s, const ft__sel_key *key, uint32_t eligible);

static int nearest_known(ft__selector *s, const ft__sel_key *key, uint32_t eligible)
{
    for (unsigned flip = 0; flip < 4; flip++) {
        ft__sel_key k = *key;
        k.cpu = (uint8_t)(k.cpu ^ (flip & 1));
        k.busy = (uint8_t)(k.busy ^ (flip >> 1));
        int a = nearest_known_in(s, &k, eligible);
        if (a >= 0)
            return a;
    }
    return -1;
}

static int nearest_known_in(ft__selector *s, const ft__sel_key *key, uint32_t eligible)
{
    for (int d = 0; d < FT__SEL_BUCKETS; d++) {
        for (int sign = -1; sign <= 1; sign += 2) {
            if (d == 0 && sign > 0)
                continue;
            int b = (int)key->bucket + sign * d;
            if (b < 0 || b >= FT__SEL_BUCKETS)
                continue;
            ft__sel_key k = *key;
            k.bucket = (uint8_t)b;
            ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&k), false);
            if (!e)
                continue;
            pthread_mutex_lock(&e->lock);
            int a = e->best >= 0 ? e->best : best_arm(e, eligible, s->narms);
            pthread_mutex_unlock(&e->lock);
            if (a >= 0 && (eligible >> a & 1))
                return a;
        }
    }
    return -1;
}

/*
 * What related keys say of a young key's arms: a mask of the arms worth exploring, 0 when
 * no related key has measured two arms or more. Exploring a new key only among these keeps
 * a job from paying for arms already known to be hopeless (O_DIRECT for cached reads, ...).
 * Related keys, nearest first: the same size in the other contexts (CPU load, transfers in
 * flight), then the sizes one bucket away in this context and the others, then for reads
 * the sibling among the cold classes (cold, stream: what an engine does with data the page
 * cache lacks), then the buckets two away, and so on. Each arm takes its verdict from the
 * nearest related key that measured it, up to two buckets beyond the first related key
 * found: a workload of many sizes, a few calls of each, explores every arm of every size
 * otherwise (development machine, a mixed workload's cold reads of 8 to 256 MiB, one to
 * three calls per key and pass: still exploring in its fourth pass, `mmap` at 0.6 GB/s
 * where `posix` read 2.4, while the same size's stream reads had measured `mmap` at under a
 * third of `posix` two passes before).
 * An arm measured at under half the best there is left out; at under 80% of it where that
 * is strong evidence: the same size in another context, or a size one bucket away in this
 * context where both it and the best had their full trials. Its exploration costs the key
 * more than a fifth of a call each time, and with a few calls per key the trials are
 * most of what the key does.
 */
static void estimates(ft__selector *s, const ft__sel_key *key, uint32_t eligible, float *est);

/* The related key @p variant (0-3: CPU load and transfers in flight flipped; 4: the read's
 * other cold class) of @p key at bucket @p bucket; false when there is none. */
static bool related_key(const ft__sel_key *key, int bucket, unsigned variant, ft__sel_key *k)
{
    if (bucket < 0 || bucket >= FT__SEL_BUCKETS)
        return false;
    *k = *key;
    k->bucket = (uint8_t)bucket;
    if (variant < 4) {
        k->cpu = (uint8_t)(k->cpu ^ (variant & 1));
        k->busy = (uint8_t)(k->busy ^ (variant >> 1));
        return true;
    }
    if (key->write || (key->cache != 0 && key->cache != 3))
        return false;
    k->cache = key->cache == 0 ? 3 : 0;
    return true;
}

static uint32_t prior_mask(ft__selector *s, const ft__sel_key *key, uint32_t eligible)
{
    uint32_t mask = eligible, open = eligible; /* open: arms without the nearest verdict yet */
    uint32_t behind = eligible, samples[FT__SEL_MAX_ARMS] = {0};
    int first = -1;
    for (int d = 0; d < FT__SEL_BUCKETS && (first < 0 || d <= first + 2); d++) {
        for (unsigned variant = 0; variant < 5; variant++) {
            for (int sign = -1; sign <= 1; sign += 2) {
                /* the other cold class counts as one bucket further away */
                int dist = variant < 4 ? d : d - 1;
                if (dist < 0 || (dist == 0 && (sign > 0 || variant == 0)))
                    continue; /* the key itself is not its own prior */
                ft__sel_key k;
                if (!related_key(key, (int)key->bucket + sign * dist, variant, &k) ||
                    ft__sel_stint_key(s, &k) != ft__sel_stint_key(s, key))
                    continue; /* a stint's figures and a call's measure different things */
                ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&k), false);
                if (!e)
                    continue;
                float med[FT__SEL_MAX_ARMS], best = 0;
                uint32_t n[FT__SEL_MAX_ARMS], best_n = 0;
                unsigned sampled = 0;
                pthread_mutex_lock(&e->lock);
                for (unsigned a = 0; a < s->narms; a++) {
                    med[a] = (eligible >> a & 1) ? ft__sel_median(&e->arm[a]) : 0;
                    n[a] = e->arm[a].n;
                    sampled += med[a] > 0;
                    if (med[a] > best) {
                        best = med[a];
                        best_n = n[a];
                    }
                }
                pthread_mutex_unlock(&e->lock);
                if (sampled < 2)
                    continue;
                if (first < 0) {
                    first = d;
                    /* An arm the first related key never measured is unknown there, not
                     * hopeless. Unless it is an O_DIRECT arm left out there for its figures
                     * in another cache class: those figures price it here too. */
                    float est[FT__SEL_MAX_ARMS];
                    estimates(s, &k, eligible, est);
                    for (unsigned a = 0; a < s->narms; a++)
                        if (med[a] == 0 && est[a] > 0) {
                            med[a] = est[a];
                            n[a] = 0;
                        }
                }
                bool close = (d == 0 && variant < 4) || (d == 1 && variant == 0);
                for (unsigned a = 0; a < s->narms; a++) {
                    if (med[a] == 0)
                        continue;
                    if (med[a] >= 0.8f * best)
                        behind &= ~(1u << a);
                    samples[a] += n[a];
                    if (!(open >> a & 1))
                        continue;
                    open &= ~(1u << a); /* the nearest verdict */
                    bool strong = close && (d == 0 || (n[a] >= FT__SEL_EXPLORE &&
                                                       best_n >= FT__SEL_EXPLORE));
                    if (med[a] < (strong ? 0.8f : 0.5f) * best)
                        mask &= ~(1u << a);
                }
            }
        }
    }
    /* and the arms every related key measured under 80% of its best, over a full trial's
     * worth of samples among them */
    for (unsigned a = 0; a < s->narms; a++)
        if ((behind >> a & 1) && !(open >> a & 1) && samples[a] >= FT__SEL_EXPLORE)
            mask &= ~(1u << a);
    return first >= 0 ? mask : 0;
}

/* Successive elimination: an arm measured at under half of the best arm (under a quarter
 * after a single sample: one sample can be a hiccup) counts as explored. In a stream key a
 * single sample says too little: a call's speed there depends on the calls of other arms
 * before it, whose readahead it finds or not (development machine, 4 KiB stream reads in
 * tune: `posix` one sample at 0.02 GB/s beside `mmap`'s 0.39, never tried again; the stream's
 * calls in flight followed `mmap` and read at 0.07 GB/s where `posix` read 0.68). */
static bool eliminated(const ft__sel_stats *st, float best_m, bool stream)
{
    if (st->n < (stream ? 2u : 1u))
        return false;
    return ft__sel_median(st) < (st->n >= 2 ? 0.5f : 0.25f) * best_m;
}

/*
 * Estimates (bytes/s, 0: none) of the cache-blind arms for a read key from the same size and
 * context in the other cache classes, cold first, in this memory kind, then in the other
 * (what an O_DIRECT read costs is the disk's, wherever the bytes go). An O_DIRECT read of
 * cached data reads it from the disk again: measured cold, it need not be explored cached,
 * where one call of it costs twenty page-cache copies (H200 machine: 1.7 against 36 GB/s;
 * a job's first warm 1 GiB reads into host memory, on a profile tuned for device memory,
 * explored them at 2.3 GB/s). Call without holding the key's lock (this takes the other
 * keys' locks).
 */
static void estimates(ft__selector *s, const ft__sel_key *key, uint32_t eligible, float *est)
{
    memset(est, 0, s->narms * sizeof *est);
    uint32_t want = eligible & s->cache_blind;
    if (key->write || !want)
        return;
    static const uint8_t order[] = {0, 3, 1, 2}; /* cold, stream, partial, cached */
    /* this context first, then the others (CPU load, calls in flight, memory kind): a key
     * new to its context is where an O_DIRECT call of cached data is likeliest to be tried */
    for (unsigned flip = 0; flip < 8 && want; flip++) {
        for (unsigned i = 0; i < sizeof order && want; i++) {
            if (order[i] == key->cache)
                continue;
            ft__sel_key k = *key;
            k.cache = order[i];
            k.cpu = (uint8_t)(k.cpu ^ (flip & 1));
            k.busy = (uint8_t)(k.busy ^ (flip >> 1 & 1));
            k.mem = (uint8_t)(k.mem ^ (flip >> 2));
            ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&k), false);
            if (!e)
                continue;
            pthread_mutex_lock(&e->lock);
            for (unsigned a = 0; a < s->narms; a++)
                if ((want >> a & 1) && e->arm[a].n >= FT__SEL_EXPLORE) {
                    est[a] = ft__sel_median(&e->arm[a]);
                    want &= ~(1u << a);
                }
            pthread_mutex_unlock(&e->lock);
        }
    }
}

/* An arm not measured here whose estimate from another cache class is under half the best. */
static bool hopeless_elsewhere(const ft__sel_stats *st, float est, float best_m)
{
    return st->n == 0 && est > 0 && est < 0.5f * best_m;
}

/*
 * Cached reads are page-cache copies: calls in flight share the CPUs, not a disk or a
 * readahead, so a call's share of its time (auto.c) says what its arm does, and such keys
 * beside others are ranked on their own samples. Following the calls alone, they stayed
 * with what those ranked first however it did in flight: H200 machine, a tune whose cached
 * 1 MiB reads alone put `mmap` first, then five rounds of warm 1 MiB reads 16 in flight all
 * through `mmap`, 8.6 GB/s against `posix` fixed at 47 (the calls alone, ever fewer, never
 * changed the ranking).
 */
static bool cached_read(const ft__sel_key *k)
{
    return !k->write && k->cache == 2;
}

unsigned ft__sel_choose(ft__selector *s, const ft__sel_key *key, uint32_t eligible,
                        unsigned fallback, bool *trial)
{
    bool caller_ignores;
    if (!trial)
        trial = &caller_ignores;
    *trial = false;
    bool use_prior = true; /* the neighbours' verdicts narrow a new key's exploration */
    if (key->busy && !ft__sel_stint_key(s, key) && !cached_read(key)) {
        /* Beside other transfers of this context a call's time is mostly theirs (they share
         * the threads and the disk; readahead one call starts serves the next), so its
         * throughput says little about its arm: measured on a 2-core machine, buffered
         * reads of a cold stream score like O_DIRECT per call at 3x their total rate.
         * Such calls take the decision learned from calls that ran alone (the best of the
         * arms eligible here), where there is one; their samples still land in their own
         * key. Where that is a cache-blind (O_DIRECT) arm, the cache-blind arms compete on
         * their samples here: nothing reads ahead for them, so their share of the time is
         * honest, and with calls in flight a deep queue can win what a single call did not
         * (development machine, 1 MiB cold reads, 8 in flight: io_uring 5.1 GB/s, direct
         * 1.25, where direct was best alone). */
        /* The alone key of this CPU-load class, else of the other: our own transfers in
         * flight can tip a 2-core machine into the high class, where no call ran alone (the
         * development machine's profile after a 7-round bench: the high class's in-flight
         * cold 1 MiB stream key held 8 samples of every arm, `direct` ahead at 1.2 GB/s per
         * call, where `posix` fixed streamed at 1.9).
         * Stream reads of the sizes the caller measures in stints (ft__sel_stint_key) are
         * not decided here: a stint's delivered rate is honest for every arm. Nor are cached
         * reads (cached_read). */
        int b = -1;
        for (unsigned flip = 0; flip < 2 && b < 0; flip++) {
            ft__sel_key alone = *key;
            alone.busy = 0;
            alone.cpu = (uint8_t)(alone.cpu ^ flip);
            ft__sel_entry *q = ft__sel_entry_at(s, ft__sel_key_index(&alone), false);
            b = q ? atomic_load_explicit(&q->best, memory_order_relaxed) : -1;
            if (b >= 0 && !(eligible >> b & 1))
                b = -1;
            if (q && b < 0) {
                pthread_mutex_lock(&q->lock);
                b = q->best >= 0 && (eligible >> q->best & 1) ? q->best
                                                               : best_arm(q, eligible, s->narms);
                pthread_mutex_unlock(&q->lock);
            }
        }
        if (b >= 0 && (eligible >> b & 1)) {
            uint32_t blind = eligible & s->cache_blind;
            if (!(blind >> b & 1) || blind == 1u << b)
                return (unsigned)b;
            eligible = blind;
            fallback = (unsigned)b;
            use_prior = false; /* what was ranked alone is what may change here */
        }
    }
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), true);
    if (!e)
        return fallback;
    bool check = draw(s) < s->recheck; /* keep checking the others now and then */
    /* the call after which a young key's prior no longer narrows its exploration: the arms
     * the prior left out are explored from here on (the locked path finds them) */
    bool matured = atomic_fetch_add_explicit(&e->calls, 1, memory_order_relaxed) ==
                   2 * FT__SEL_EXPLORE * s->narms;
    /* A settled key (explored, exploited since under these eligible arms): its best, read
     * without the lock. A drift or a new arm to explore unsettles it. */
    if (!check && !matured && atomic_load_explicit(&e->settled, memory_order_acquire) == eligible) {
        int b = atomic_load_explicit(&e->best, memory_order_relaxed);
        if (b >= 0 && (eligible >> b & 1))
            return (unsigned)b;
    }
    pthread_mutex_lock(&e->lock);
    /* Successive elimination (the re-checks still try eliminated arms now and then). */
    bool stream = ft__sel_stream_key(key);
    float best_m = 0;
    for (unsigned a = 0; a < s->narms; a++)
        if ((eligible >> a & 1) && e->arm[a].n)
            best_m = FT__MAX(best_m, ft__sel_median(&e->arm[a]));
    int explore = -1;
    uint32_t fewest = UINT32_MAX, total = 0;
    for (unsigned a = 0; a < s->narms; a++) {
        if (!(eligible >> a & 1))
            continue;
        total += e->arm[a].n + e->arm[a].pending;
        if (eliminated(&e->arm[a], best_m, stream))
            continue;
        uint32_t tried = e->arm[a].n + e->arm[a].pending;
        if (tried < FT__SEL_EXPLORE && tried < fewest) {
            fewest = tried;
            explore = (int)a;
        }
    }
    if (total == 0) {
        /* Unseen key: answer like the nearest known size, then explore from there on. */
        pthread_mutex_unlock(&e->lock);
        int a = nearest_known(s, key, eligible);
        return a >= 0 ? (unsigned)a : fallback;
    }
    float est[FT__SEL_MAX_ARMS];
    bool have_est = false;
    if (explore >= 0) {
        /* Still exploring: not the cache-blind arms measured hopeless in another cache class,
         * and in a key's first calls only among the arms a measured neighbour finds
         * competitive. */
        bool young = e->calls <= 2 * FT__SEL_EXPLORE * s->narms;
        pthread_mutex_unlock(&e->lock);
        uint32_t prior = young && use_prior ? prior_mask(s, key, eligible) : 0;
        estimates(s, key, eligible, est);
        have_est = true;
        pthread_mutex_lock(&e->lock);
        uint32_t allowed = eligible & (prior ? prior : eligible);
        explore = -1;
        fewest = UINT32_MAX;
        for (unsigned a = 0; a < s->narms; a++) {
            if (!(allowed >> a & 1) || eliminated(&e->arm[a], best_m, stream) ||
                hopeless_elsewhere(&e->arm[a], est[a], best_m))
                continue;
            uint32_t tried = e->arm[a].n + e->arm[a].pending;
            if (tried < FT__SEL_EXPLORE && tried < fewest) {
                fewest = tried;
                explore = (int)a;
            }
        }
    }
    unsigned pick;
    if (explore >= 0) {
        pick = (unsigned)explore; /* round robin over the least-sampled arms */
        *trial = true;
        atomic_store_explicit(&e->settled, 0, memory_order_release);
    } else {
        if (e->best < 0 || !(eligible >> e->best & 1)) {
            int b = best_arm(e, eligible, s->narms);
            if (b < 0) {
                /* Every arm has had its trials, none is measured yet (writes waiting for
                 * their sync): answer as for an unseen key until the samples come. Going
                 * on round robin spread a whole pass of writes over every arm, the slow
                 * ones included (H200 machine, 16 MiB to 1 GiB host writes: 8% short of
                 * the best engine). */
                pthread_mutex_unlock(&e->lock);
                int a = nearest_known(s, key, eligible);
                return a >= 0 ? (unsigned)a : fallback;
            }
            lead(e, b);
        }
        pick = (unsigned)e->best;
        atomic_store_explicit(&e->settled, eligible, memory_order_release);
        if (check) {
            /* A re-check of an arm at a fraction f of the best arm's speed costs 1/f - 1
             * calls' worth of extra time: a 16 MiB O_DIRECT read of cached data beside
             * 36 GB/s page-cache copies costs twenty. A drawn arm is taken with probability
             * min(1, 0.5 / that cost), so re-checks cost at most half a call each on average
             * (under 1% of the time at a 2% re-check rate), close arms are checked at the
             * full rate and hopeless ones rarely; a change of context that makes them good
             * shows as drift of the best. An arm never measured here is priced by its
             * estimate from another cache class, else always taken. */
            float bm = ft__sel_median(&e->arm[e->best]);
            uint32_t cand = 0;
            for (unsigned a = 0; a < s->narms; a++)
                if ((eligible >> a & 1) && a != (unsigned)e->best)
                    cand |= 1u << a;
            int drawn = -1;
            if (cand) {
                unsigned skip = (unsigned)(draw(s) * (unsigned)__builtin_popcount(cand));
                for (unsigned a = 0; a < s->narms && drawn < 0; a++)
                    if ((cand >> a & 1) && skip-- == 0)
                        drawn = (int)a;
            }
            if (drawn >= 0) {
                float m = e->arm[drawn].n ? ft__sel_median(&e->arm[drawn]) : 0;
                if (m == 0 && (s->cache_blind >> drawn & 1) && !key->write) {
                    pthread_mutex_unlock(&e->lock);
                    if (!have_est)
                        estimates(s, key, eligible, est);
                    m = est[drawn];
                    pthread_mutex_lock(&e->lock);
                }
                double cost = m > 0 ? (double)bm / m - 1 : 0;
                if (cost <= 0.5 || draw(s) < 0.5 / cost) {
                    pick = (unsigned)drawn;
                    *trial = true;
                }
            }
        }
    }
    pthread_mutex_unlock(&e->lock);
    return pick;
}

void ft__sel_pending(ft__selector *s, const ft__sel_key *key, unsigned arm, int delta)
{
    if (arm >= s->narms)
        return;
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), true);
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    int64_t now = (int64_t)e->arm[arm].pending + delta;
    e->arm[arm].pending = now > 0 ? (uint32_t)now : 0;
    if (delta < 0) /* calls on trial may now be one sample: the arm may need more */
        atomic_store_explicit(&e->settled, 0, memory_order_release);
    pthread_mutex_unlock(&e->lock);
}

void ft__sel_record(ft__selector *s, const ft__sel_key *key, unsigned arm, uint64_t bytes,
                    uint64_t ns)
{
    if (arm >= s->narms || bytes == 0)
        return;
    float tput = (float)((double)bytes * 1e9 / (double)(ns ? ns : 1));
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), true);
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    ft__sel_stats *st = &e->arm[arm];
    st->tput[st->n % FT__SEL_WINDOW] = tput;
    st->n++;
    ft__sel_stats_changed(st);
    if (e->best >= 0) {
        float bm = ft__sel_median(&e->arm[e->best]);
        if ((int)arm == e->best) {
            /* The record is the chosen arm's median over its window, not the best value
             * ever seen: a maximum ratchets up on lucky samples until ordinary ones look
             * like drift (cached 1 MiB reads re-explored every few hundred calls). */
            e->record = bm;
            /* Low means below drift x record and below the next best arm's median: a dip
             * that leaves the arm ahead of every other changes no decision. */
            float runner_up = 0, second_m = 0; /* second: the best other explored arm */
            int second = -1;
            for (unsigned a = 0; a < s->narms; a++) {
                if ((int)a == e->best || !e->arm[a].n)
                    continue;
                float m = ft__sel_median(&e->arm[a]);
                runner_up = FT__MAX(runner_up, m);
                if (e->arm[a].n >= FT__SEL_EXPLORE && m > second_m) {
                    second_m = m;
                    second = (int)a;
                }
            }
            bool low = tput < s->drift * e->record && (runner_up == 0 || tput < runner_up);
            e->low_streak = low ? (uint8_t)(e->low_streak + 1) : 0;
            e->behind_streak = second >= 0 && tput < second_m ? (uint8_t)(e->behind_streak + 1)
                                                               : 0;
            /* A slow decline never looks like drift against its own median: once the
             * chosen arm's median falls behind another explored arm's, that one leads; and
             * so it does once the chosen arm's last three calls were each slower than that
             * arm's median. Its window still holds older figures (a loaded profile's, from
             * another file: the development machine's tune measured cold 1 GiB reads by
             * mmap/1thread at 2.2 GB/s, the bench's file gave 1.3 where direct gave 2.3,
             * and five new samples of eight were needed before its median fell behind). */
            if (second >= 0 && (second_m > bm || e->behind_streak >= 3))
                lead(e, second);
            if (e->low_streak >= 3) {
                /* Drift: the chosen arm fell well below its record three times running:
                 * the context changed, so every arm's old figures are suspect. Explore
                 * this key again, keeping only each arm's newest sample: one under a quarter
                 * of what the chosen arm does now stays eliminated, the others are tried.
                 * (H200 machine, warm reads: posix/1thread measured 4.6 GB/s beside posix's
                 * 33; one 256 MiB trial slice of it takes a 1 GiB read from 33 to 13 GB/s.
                 * Wiping every figure re-explored such arms after each drift.) */
                for (unsigned a = 0; a < s->narms; a++)
                    if (e->arm[a].n) {
                        float last = e->arm[a].tput[(e->arm[a].n - 1) % FT__SEL_WINDOW];
                        e->arm[a].tput[0] = last;
                        e->arm[a].n = 1;
                        ft__sel_stats_changed(&e->arm[a]);
                    }
                e->best = -1;
                e->low_streak = 0;
                e->behind_streak = 0;
                atomic_store_explicit(&e->settled, 0, memory_order_release);
            }
        } else if (st->n >= FT__SEL_EXPLORE && ft__sel_median(st) > bm) {
            lead(e, (int)arm); /* a re-check found a better arm */
        }
    }
    pthread_mutex_unlock(&e->lock);
    atomic_store_explicit(&s->dirty, 1, memory_order_relaxed);
}
