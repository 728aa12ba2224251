/* Stints: how AUTO measures stream reads beside other transfers (see select.h). */
#include "select.h"

#include <stdlib.h>

/*
 * Stints. Stream reads of 64 KiB to 8 MiB beside other transfers (a prefetch of 1 MiB blocks,
 * 16 in flight) share the kernel's readahead from call to call: a buffered call's time says
 * what the calls before it read ahead, not what its arm does. Development machine, a cold
 * 1 GiB stream in 1 MiB reads, 16 in flight: `posix` calls scored 55 GB/s each (most found
 * their pages read ahead) in a run that delivered 2.3-2.8 GB/s, and 0.79 when explored
 * between O_DIRECT calls (their gaps stop its readahead), where `uring` scored 1.58 per call
 * and delivered 1.2. Such a key's arm is taken for a stint of consecutive stream calls of
 * the file and that size, and the stint is one sample: its delivered rate, its calls' bytes
 * over their share of the time. Time while k of the lane's calls are in flight is shared
 * among them, 1/k each, so the shares add up to the time the lane was busy, and calls of
 * two stints in flight together (at a change of arm) each take their own part. (Charging
 * each completion the time since the one before it gave a buffered stint 26-61 GB/s on the
 * H200 machine's cold 4 MiB stream, 16 in flight: its calls completed in a burst just after
 * those of the stint before it, which had waited for the disk.) A stint is STINT_BYTES
 * long (up to STINT_MAX_CALLS calls): a buffered
 * arm's first calls after an O_DIRECT stint run before its readahead has grown, and in
 * stints of 8 MiB `posix` scored 1.2-3.0 GB/s where its runs delivered 2.4. (Stints of
 * at least twice the calls in flight were 128 MiB of 4 MiB calls 16 in flight: up to
 * 2.3 GiB for three stints of each of six arms.) Each
 * size bucket and memory kind has a lane of its own: a job reading tensors of several sizes
 * at once interleaves them.
 */
#define STINT_BUCKET_MIN 16 /* 64 KiB */
#define STINT_BUCKET_END 23 /* 8 MiB: calls that large read ahead for themselves */
#define STINT_BYTES (32ull << 20)
#define STINT_MAX_CALLS 1024u

struct ft__stint {
    uint32_t seq;          /* its number in its lane, 0: the slot is free */
    ft__selector *sel;
    ft__sel_key key;       /* the key of its first call: a stream read beside others */
    unsigned arm;
    bool trial;
    bool spoiled;          /* a call failed or paid for its engine's setup: no sample */
    uint32_t want;         /* calls it is to have */
    uint32_t left;         /* calls still to join it (0 once the next stint began) */
    uint32_t calls, done;  /* calls that joined it, calls completed */
    uint64_t bytes, ns;    /* what its calls moved, in the time charged to them */
};

/* A size bucket and memory kind's stints: the current one and the few before it, whose
 * last calls may still be in flight (buffered calls complete far out of order: the one that
 * waits for the disk, then the dozen behind it that its readahead served). */
#define STINT_SLOTS 4
struct ft__stint_lane {
    uint32_t seq;                 /* the current stint's number */
    uint32_t inflight;            /* calls of its stints in flight */
    uint64_t last;                /* when inflight last changed */
    double share;                 /* ns of time shared out per call in flight, ever */
    struct ft__stint slot[STINT_SLOTS]; /* by number modulo STINT_SLOTS */
};
#define STINT_LANES (2 * (STINT_BUCKET_END - STINT_BUCKET_MIN))

uint64_t ft__stint_buckets(void)
{
    uint64_t mask = 0;
    for (unsigned b = STINT_BUCKET_MIN; b < STINT_BUCKET_END; b++)
        mask |= 1ull << b;
    return mask;
}

/* The lane of @p key (a stint size) on @p f, made on first use; NULL when memory runs out.
 * Call with the file's lock held. */
static struct ft__stint_lane *stint_lane(ft_file *f, const ft__sel_key *key)
{
    if (!f->stints)
        f->stints = calloc(STINT_LANES, sizeof *f->stints);
    unsigned i = (key->mem & 1) * (STINT_BUCKET_END - STINT_BUCKET_MIN) + key->bucket -
                 STINT_BUCKET_MIN;
    return f->stints ? &f->stints[i] : NULL;
}

/* Share the time since the lane's last change among its calls in flight. Call with the
 * file's lock held. */
static void stint_share(struct ft__stint_lane *lane, uint64_t now)
{
    if (lane->inflight && now > lane->last)
        lane->share += (double)(now - lane->last) / lane->inflight;
    lane->last = FT__MAX(lane->last, now);
}

/* Add the call decided in @p d at @p now to the stint @p st of @p lane. Call with the file's
 * lock held. */
static void stint_add(struct ft__stint_lane *lane, struct ft__stint *st, ft__decision *d,
                      uint64_t now)
{
    stint_share(lane, now);
    lane->inflight++;
    d->stint_share = lane->share;
    st->calls++;
    d->arm = st->arm;
    d->trial = st->trial;
    d->stint = st->seq;
}

bool ft__stint_join(ft_file *f, ft__decision *d, uint32_t eligible, uint64_t now)
{
    bool joined = false;
    pthread_mutex_lock(&f->lock);
    struct ft__stint_lane *lane = stint_lane(f, &d->key);
    struct ft__stint *st = lane ? &lane->slot[lane->seq % STINT_SLOTS] : NULL;
    if (st && st->seq && st->seq == lane->seq && st->left > 0 && st->sel == d->sel &&
        (eligible >> st->arm & 1)) {
        st->left--;
        stint_add(lane, st, d, now);
        joined = true;
    }
    pthread_mutex_unlock(&f->lock);
    return joined;
}

/* What a stint that will get no more calls leaves the selector: its sample, when it had
 * enough calls and none spoiled it. Call without the file's lock. */
static void stint_finish(const struct ft__stint *st)
{
    ft__sel_pending(st->sel, &st->key, st->arm, -1);
    bool enough = !st->spoiled && st->done >= (st->want + 1) / 2 && st->ns > 0 && st->bytes > 0;
    ft__auto_trace_line("stint read %s bucket=%u cache=%u busy=%u cpu=%u arm=%s bytes=%llu "
                        "ns=%llu calls=%u of=%u %s\n", st->key.mem ? "cuda" : "host",
                        st->key.bucket, st->key.cache, st->key.busy, st->key.cpu,
                        ft__arms[st->arm].label, (unsigned long long)st->bytes,
                        (unsigned long long)st->ns, st->calls, st->want,
                        enough ? "sample" : "dropped");
    if (enough)
        ft__sel_record(st->sel, &st->key, st->arm, st->bytes, st->ns);
}

/* The lane's previous stint gets no more calls; one STINT_SLOTS stints back whose last calls
 * never came back ends with what came. */
void ft__stint_begin(ft_file *f, ft__decision *d, uint64_t len, uint64_t now)
{
    uint64_t want = FT__MIN(STINT_BYTES / len, (uint64_t)STINT_MAX_CALLS);
    struct ft__stint ended = {0};
    pthread_mutex_lock(&f->lock);
    struct ft__stint_lane *lane = stint_lane(f, &d->key);
    if (lane) {
        lane->slot[lane->seq % STINT_SLOTS].left = 0;
        if (++lane->seq == 0)
            lane->seq = 1;
        struct ft__stint *st = &lane->slot[lane->seq % STINT_SLOTS];
        if (st->seq)
            ended = *st;
        *st = (struct ft__stint){.seq = lane->seq, .sel = d->sel, .key = d->key,
                                 .arm = d->arm, .trial = d->trial, .want = (uint32_t)want,
                                 .left = (uint32_t)want - 1};
        stint_add(lane, st, d, now);
    }
    pthread_mutex_unlock(&f->lock);
    if (ended.seq)
        stint_finish(&ended);
    if (d->stint)
        ft__sel_pending(d->sel, &d->key, d->arm, +1);
}

void ft__stint_done(ft_file *f, const ft__decision *d, int64_t result, uint64_t now)
{
    bool setup = result > 0 && ft__auto_first_use(f, d);
    ft__auto_trace(d, &d->key, result, now - d->t0, "stint");
    struct ft__stint fin = {0};
    pthread_mutex_lock(&f->lock);
    struct ft__stint_lane *lane = stint_lane(f, &d->key);
    uint64_t charged = 0;
    if (lane && lane->inflight) { /* (an ended stint's calls still count here) */
        stint_share(lane, now);
        lane->inflight--;
        charged = (uint64_t)(lane->share - d->stint_share);
    }
    struct ft__stint *st = lane ? &lane->slot[d->stint % STINT_SLOTS] : NULL;
    if (st && st->seq == d->stint) {
        st->spoiled |= result <= 0 || setup;
        st->bytes += result > 0 ? (uint64_t)result : 0;
        st->ns += charged;
        st->done++;
        if (st->left == 0 && st->done == st->calls) {
            fin = *st;
            st->seq = 0;
        }
    }
    pthread_mutex_unlock(&f->lock);
    if (fin.seq)
        stint_finish(&fin);
}

void ft__stint_close(ft_file *f)
{
    for (unsigned i = 0; f->stints && i < STINT_LANES; i++) /* streams that ended in one */
        for (unsigned k = 0; k < STINT_SLOTS; k++)
            if (f->stints[i].slot[k].seq)
                stint_finish(&f->stints[i].slot[k]);
    free(f->stints);
    f->stints = NULL;
}
