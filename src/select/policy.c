/*
 * The selector's policy: sliding-window UCB over log-throughput.
 *
 * An arm's score for a key is  mean + C * s / sqrt(n)  of the ln(bytes/s) samples in its
 * window (the last FT__SEL_WINDOW), s its spread (at least FT__SEL_SD_FLOOR; SD_ONE for one
 * sample), n its samples plus its trials in flight. The highest score is chosen. So:
 * - an arm never measured for the key is explored (the fallback first, then the others in the
 *   caller's order: ft__selector.order), unless the nearest
 *   key that measured it (the other company, then sizes up to PRIOR_REACH buckets away, then
 *   for reads the other uncached class) says what it does, or else the arm whose setting it
 *   varies measured the key (ft__selector.family): then that estimate is its mean, with one
 *   sample's spread. So a setting of an engine that measured under half the best is not
 *   tried, and settings are tried after the engines nothing is known of;
 * - an arm (or estimate) at under half the best mean after SKIP_AFTER samples is skipped;
 * - an arm in the lead stays there while its mean does; a leader that drifts down is
 *   overtaken as its old samples leave the window; close runners-up are re-tried while their
 *   spread leaves room (they are trials: large calls try them a slice at a time).
 * The policy knows keys, arms and samples only.
 */
#include "select.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The tunables, each with its reason. */
#define C_UCB 1.0f       /* one standard error: a runner-up inside the leader's noise is
                            re-tried, one beyond it is not */
#define SD_ONE 0.3f      /* the spread assumed of one sample or an estimate: a 30% hiccup
                            is common on a shared VM */
#define SKIP 0.6931472f  /* ln 2: under half the best is no candidate */
#define SKIP_AFTER 2u    /* one sample can be a hiccup */
#define PRIOR_REACH 3    /* buckets either way an estimate comes from: 8x the size */

int ft__sel_create(ft__selector **out, unsigned narms)
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
    if (atomic_compare_exchange_strong_explicit(&s->entries[index], &e, fresh,
                                                memory_order_acq_rel, memory_order_acquire))
        return fresh;
    pthread_mutex_destroy(&fresh->lock); /* another thread made it first: e is theirs */
    free(fresh);
    return e;
}

unsigned ft__sel_bucket(uint64_t len)
{
    unsigned b = len ? 63u - (unsigned)__builtin_clzll(len) : 0;
    return b < FT__SEL_BUCKET_TOP ? b : FT__SEL_BUCKET_TOP;
}

unsigned ft__sel_key_index(const ft__sel_key *k)
{
    unsigned i = (unsigned)k->write * 2 + k->mem;
    i = i * FT__SEL_BUCKETS + k->bucket;
    i = i * FT__SEL_CLASSES + k->cls;
    return i * 2 + k->busy;
}

void ft__sel_key_decode(unsigned index, ft__sel_key *k)
{
    k->busy = (uint8_t)(index % 2);
    index /= 2;
    k->cls = (uint8_t)(index % FT__SEL_CLASSES);
    index /= FT__SEL_CLASSES;
    k->bucket = (uint8_t)(index % FT__SEL_BUCKETS);
    index /= FT__SEL_BUCKETS;
    k->mem = (uint8_t)(index % 2);
    k->write = (uint8_t)(index / 2);
}

void ft__sel_arm_changed(ft__sel_arm *a)
{
    unsigned n = FT__MIN(a->n, (uint32_t)FT__SEL_WINDOW);
    double sum = 0, sq = 0;
    for (unsigned i = 0; i < n; i++)
        sum += a->lt[i];
    double mean = n ? sum / n : 0;
    for (unsigned i = 0; i < n; i++)
        sq += (a->lt[i] - mean) * (a->lt[i] - mean);
    a->mean = (float)mean;
    a->sd = n > 1 ? (float)sqrt(sq / (n - 1)) : SD_ONE;
}

/* An estimate of an arm for a key that never measured it. */
typedef struct estimate {
    float mean;
    uint32_t n; /* samples behind it, 0: none */
} estimate;

/* The related key @p variant of @p key at distance @p d (see the file's comment): 0 the other
 * company, 1 and 2 the sizes d buckets down and up, 3 and 4 those in the other company, 5 the
 * other uncached read class at the same size and company. false: no such key. */
static bool related(const ft__sel_key *key, int d, unsigned variant, ft__sel_key *k)
{
    *k = *key;
    if (variant == 5) {
        if (d != 0 || key->write || key->cls == FT__CLS_CACHED)
            return false;
        k->cls = key->cls == FT__CLS_COLD ? FT__CLS_STREAM : FT__CLS_COLD;
        return true;
    }
    if ((d == 0) != (variant == 0))
        return false;
    int b = (int)key->bucket + (variant == 1 || variant == 3 ? -d : d);
    if (b < 0 || b >= FT__SEL_BUCKETS)
        return false;
    k->bucket = (uint8_t)b;
    if (variant == 0 || variant >= 3)
        k->busy ^= 1;
    return true;
}

/* Estimates for the arms in @p want from the nearest related keys that measured them. Takes
 * each related key's lock in turn, never two at once. */
static void estimates(ft__selector *s, const ft__sel_key *key, uint32_t want, estimate *est)
{
    for (int d = 0; d <= PRIOR_REACH && want; d++)
        for (unsigned v = 0; v < 6 && want; v++) {
            ft__sel_key k;
            if (!related(key, d, v, &k))
                continue;
            ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(&k), false);
            if (!e)
                continue;
            pthread_mutex_lock(&e->lock);
            for (unsigned a = 0; a < s->narms; a++)
                if ((want >> a & 1) && e->arm[a].n) {
                    est[a] = (estimate){e->arm[a].mean, e->arm[a].n};
                    want &= ~(1u << a);
                }
            pthread_mutex_unlock(&e->lock);
        }
}

/* Estimates of the arms in @p want that have none from related keys: the key's measure of the
 * arm each varies (ft__selector.family). Call with the key's lock held. */
static void family_estimates(const ft__selector *s, const ft__sel_entry *e, uint32_t want,
                             estimate *est)
{
    for (unsigned a = 0; s->family && a < s->narms; a++) {
        unsigned f = s->family[a];
        if ((want >> a & 1) && !est[a].n && f < s->narms && f != a && e->arm[f].n)
            est[a] = (estimate){e->arm[f].mean, e->arm[f].n};
    }
}

/* The eligible arm with the best measured mean (-1: none). Call with the key's lock held. */
static int leader(const ft__sel_entry *e, uint32_t eligible, unsigned narms)
{
    int best = -1;
    for (unsigned a = 0; a < narms; a++)
        if ((eligible >> a & 1) && e->arm[a].n && (best < 0 || e->arm[a].mean > e->arm[best].mean))
            best = (int)a;
    return best;
}

/* The arm to use: the highest score (see the file's comment), the first in the selector's
 * order of those that tie (the fallback before all). Call with the key's lock held. */
static unsigned pick(const ft__selector *s, const ft__sel_entry *e, uint32_t eligible,
                     unsigned fallback, const estimate *est)
{
    unsigned narms = s->narms;
    int lead = leader(e, eligible, narms);
    float top = lead >= 0 ? e->arm[lead].mean : -INFINITY;
    for (unsigned a = 0; a < narms; a++) /* what estimates promise counts as a bar too */
        if ((eligible >> a & 1) && !e->arm[a].n && est[a].n >= SKIP_AFTER && est[a].mean > top)
            top = est[a].mean;
    int chosen = -1;
    float best = -INFINITY;
    for (unsigned i = 0; i <= narms; i++) {
        unsigned a = i == 0 ? fallback : s->order ? s->order[i - 1] : i - 1;
        if (i > 0 && a == fallback)
            continue;
        const ft__sel_arm *st = &e->arm[a];
        if (!(eligible >> a & 1))
            continue;
        float score;
        if (!st->n && st->pending)
            continue; /* its first trial is under way */
        if (!st->n && !est[a].n)
            score = INFINITY; /* nothing known anywhere: explore */
        else if (!st->n)
            score = est[a].n >= SKIP_AFTER && est[a].mean < top - SKIP
                        ? -INFINITY
                        : est[a].mean + C_UCB * SD_ONE;
        else if (st->n >= SKIP_AFTER && st->mean < top - SKIP)
            score = -INFINITY;
        else
            score = st->mean + C_UCB * FT__MAX(st->sd, FT__SEL_SD_FLOOR) /
                                   sqrtf((float)(FT__MIN(st->n, (uint32_t)FT__SEL_WINDOW) +
                                                 st->pending));
        if (chosen < 0 || score > best) {
            chosen = (int)a;
            best = score;
        }
    }
    if (chosen < 0 || best == -INFINITY)
        return lead >= 0 ? (unsigned)lead : fallback;
    return (unsigned)chosen;
}

unsigned ft__sel_choose(ft__selector *s, const ft__sel_key *key, uint32_t eligible,
                        unsigned fallback, bool *trial)
{
    *trial = false;
    if (fallback >= s->narms || !(eligible >> fallback & 1))
        fallback = (unsigned)__builtin_ctz(eligible);
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), true);
    if (!e)
        return fallback;
    uint64_t fast = atomic_load_explicit(&e->fast, memory_order_acquire);
    if (fast && fast >> 8 == eligible)
        return (unsigned)(fast & 0xff) - 1;
    uint32_t unmeasured = 0;
    pthread_mutex_lock(&e->lock);
    for (unsigned a = 0; a < s->narms; a++)
        if ((eligible >> a & 1) && !e->arm[a].n)
            unmeasured |= 1u << a;
    pthread_mutex_unlock(&e->lock);
    estimate est[FT__SEL_MAX_ARMS] = {{0, 0}};
    estimates(s, key, unmeasured, est);
    pthread_mutex_lock(&e->lock);
    family_estimates(s, e, unmeasured, est);
    unsigned arm = pick(s, e, eligible, fallback, est);
    int lead = leader(e, eligible, s->narms);
    *trial = lead != (int)arm;
    if (*trial)
        e->arm[arm].pending++;
    else
        atomic_store_explicit(&e->fast, (uint64_t)eligible << 8 | (arm + 1),
                              memory_order_release);
    pthread_mutex_unlock(&e->lock);
    return arm;
}

/* Under the key's lock: end a trial of @p arm, forget the fast decision. */
static void changed(ft__sel_entry *e, unsigned arm, bool trial)
{
    if (trial && e->arm[arm].pending)
        e->arm[arm].pending--;
    atomic_store_explicit(&e->fast, 0, memory_order_release);
}

void ft__sel_record(ft__selector *s, const ft__sel_key *key, unsigned arm, uint64_t bytes,
                    uint64_t ns, bool trial)
{
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), true);
    if (!e || arm >= s->narms)
        return;
    double bps = (double)bytes * 1e9 / (double)(ns ? ns : 1);
    pthread_mutex_lock(&e->lock);
    ft__sel_arm *a = &e->arm[arm];
    a->lt[a->n % FT__SEL_WINDOW] = (float)log(bps > 1 ? bps : 1);
    a->n++;
    ft__sel_arm_changed(a);
    changed(e, arm, trial);
    pthread_mutex_unlock(&e->lock);
    atomic_store_explicit(&s->dirty, 1, memory_order_relaxed);
}

void ft__sel_release(ft__selector *s, const ft__sel_key *key, unsigned arm)
{
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), false);
    if (!e || arm >= s->narms)
        return;
    pthread_mutex_lock(&e->lock);
    changed(e, arm, true);
    pthread_mutex_unlock(&e->lock);
}

int ft__sel_best(ft__selector *s, const ft__sel_key *key, uint32_t mask, uint32_t min_n,
                 double *mean, double *se2)
{
    ft__sel_entry *e = ft__sel_entry_at(s, ft__sel_key_index(key), false);
    int best = -1;
    if (!e)
        return -1;
    pthread_mutex_lock(&e->lock);
    for (unsigned a = 0; a < s->narms; a++)
        if ((mask >> a & 1) && e->arm[a].n >= min_n &&
            (best < 0 || e->arm[a].mean > e->arm[best].mean))
            best = (int)a;
    if (best >= 0) {
        const ft__sel_arm *arm = &e->arm[best];
        double sd = FT__MAX(arm->sd, FT__SEL_SD_FLOOR);
        *mean = arm->mean;
        *se2 = sd * sd / FT__MIN(arm->n, (uint32_t)FT__SEL_WINDOW);
    }
    pthread_mutex_unlock(&e->lock);
    return best;
}
