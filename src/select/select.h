/*
 * The adaptive selector (engine AUTO): what it knows and how it learns.
 *
 * - the policy (policy.c, profile.c): keys, arms and samples only. Per key and arm a sliding
 *   window of log-throughput samples; one rule, sliding-window UCB (see policy.c). Tests
 *   drive it with fake arms and a fake clock.
 * - the sample windows (window.c): runs of calls that become one sample.
 * - the objective (objective.c): what a transfer should leave in the page cache.
 * The wiring to files and engines (the key of a call, the arms it may use, the facts the
 * objective weighs) is core/auto.c's.
 */
#ifndef FT_SELECT_SELECT_H
#define FT_SELECT_SELECT_H

#include "../base/base.h"

#include <stdio.h>

#define FT__SEL_BUCKET_TOP 28  /* sizes from 256 MiB up share one bucket: every engine cuts
                                  them into chunk-sized pieces */
#define FT__SEL_BUCKETS (FT__SEL_BUCKET_TOP + 1)
#define FT__SEL_CLASSES 3      /* see ft__sel_key.cls */
#define FT__SEL_KEYS (2 * 2 * FT__SEL_BUCKETS * FT__SEL_CLASSES * 2)
#define FT__SEL_MAX_ARMS 16
#define FT__SEL_WINDOW 8       /* samples kept per key and arm: drift leaves in 8 calls */
#define FT__SEL_SD_FLOOR 0.05f /* 5%: the spread of the best engine's own second run (its
                                  twin) on the machines measured; a smaller one is not believed */

/* A selector key: (direction, memory kind, size bucket, class, company). */
typedef struct ft__sel_key {
    uint8_t write;  /* 0 read, 1 write */
    uint8_t mem;    /* ft_mem_kind */
    uint8_t bucket; /* floor(log2(len)), FT__SEL_BUCKET_TOP and up together */
    uint8_t cls;    /* reads: 0 cold, 1 cached, 2 stream (continuing an uncached run);
                       writes: 0 plain, 1 synced by the call, 2 synced later by the caller */
    uint8_t busy;   /* other transfers in flight: the context's, or another context's on
                       the same profile (core/auto.c: company) */
} ft__sel_key;

/* Write classes of ft__sel_key.cls (the read classes are FT__CLS_COLD, _CACHED, _STREAM). */
enum { FT__CLS_PLAIN = 0, FT__CLS_SYNC = 1, FT__CLS_LATER = 2 };

typedef struct ft__sel_arm {
    float lt[FT__SEL_WINDOW]; /* ln(bytes per second), ring */
    uint32_t n;               /* samples ever recorded (ring index: n % WINDOW) */
    uint32_t pending;         /* trials chosen whose sample is not in yet */
    float mean, sd;           /* of the window (worked out when it changes) */
} ft__sel_arm;

typedef struct ft__sel_entry {
    pthread_mutex_t lock;
    /* The decision for one eligible mask, (mask << 8) | (arm + 1), 0: none. Set when a
     * choice is no trial, cleared by every sample: until then a decision reads it without
     * the lock. */
    _Atomic uint64_t fast;
    ft__sel_arm arm[FT__SEL_MAX_ARMS];
} ft__sel_entry;

typedef struct ft__selector {
    unsigned narms;
    uint32_t buffered;            /* arms that go through the page cache (set by the caller) */
    const char *const *labels;    /* the arms' names in profiles (set by the caller; NULL:
                                     "#0", "#1", ...) */
    const uint8_t *order;         /* every arm once, in the order arms nothing is known of
                                     are explored after the fallback (set by the caller;
                                     NULL: index order) */
    const uint8_t *family;        /* per arm, the arm whose setting it varies (its engine's
                                     default; an arm of its own: itself), (set by the caller;
                                     NULL: every arm its own) */
    _Atomic uint64_t direct_memo[4]; /* per memory kind and company (mem * 2 + busy),
                                        (ns << 1) | whether cold reads measured faster
                                        O_DIRECT */
    _Atomic int dirty;            /* changed since the last save */
    ft__sel_entry *_Atomic *entries; /* FT__SEL_KEYS, each made when first used */
} ft__selector;

int ft__sel_create(ft__selector **out, unsigned narms);
void ft__sel_destroy(ft__selector *sel);

unsigned ft__sel_bucket(uint64_t len);
unsigned ft__sel_key_index(const ft__sel_key *k);
void ft__sel_key_decode(unsigned index, ft__sel_key *k);
/** The entry of key @p index; NULL while none was made (unless @p make: NULL on ENOMEM). */
ft__sel_entry *ft__sel_entry_at(ft__selector *sel, unsigned index, bool make);

/**
 * Choose an arm for @p key among @p eligible (a non-zero bit mask). @p fallback is explored
 * first where nothing is known. *trial is set when the arm is not the key's best measured
 * one (exploring): then the caller must end it with ft__sel_record or ft__sel_release.
 */
unsigned ft__sel_choose(ft__selector *sel, const ft__sel_key *key, uint32_t eligible,
                        unsigned fallback, bool *trial);
/** A sample: @p arm moved @p bytes in @p ns for @p key (a trial of it ends when @p trial). */
void ft__sel_record(ft__selector *sel, const ft__sel_key *key, unsigned arm, uint64_t bytes,
                    uint64_t ns, bool trial);
/** A trial of @p arm ends without a sample. */
void ft__sel_release(ft__selector *sel, const ft__sel_key *key, unsigned arm);
/** The best arm among @p mask measured for @p key (at least @p min_n samples), its mean
 * ln-throughput in *mean and the square of that mean's standard error (its spread at least
 * FT__SEL_SD_FLOOR) in *se2; -1 when none. */
int ft__sel_best(ft__selector *sel, const ft__sel_key *key, uint32_t mask, uint32_t min_n,
                 double *mean, double *se2);
/** Work an arm's mean and spread out again (its window changed). */
void ft__sel_arm_changed(ft__sel_arm *a);

/* ---- the objective (objective.c) ---- */

/**
 * What a transfer of @p len bytes (key @p k, cache mode @p mode) should leave in the page
 * cache: FT_CACHE_KEEP (buffered arms), FT_CACHE_BYPASS (O_DIRECT arms) or FT_CACHE_AUTO (any
 * arm). @p data: the bytes the file (or the checkpoint it belongs to) holds, @p room what the
 * page cache can hold; @p sel (may be NULL) what this filesystem measured, at time @p now.
 */
int ft__sel_cache_goal(ft__selector *sel, const ft__sel_key *k, uint64_t len, int mode,
                       uint64_t data, uint64_t room, uint64_t now);
/** Where a spill file of @p data bytes goes (FT_CACHE_KEEP or FT_CACHE_BYPASS), @p limit
 * the bytes of it the page cache may hold (0: unknown). */
int ft__sel_spill_goal(uint64_t data, uint64_t limit);
/** The most data that fits what the page cache can keep, of @p room. */
uint64_t ft__sel_cache_fits(uint64_t room);
/** Whether cold reads alone (or beside others: @p busy) measured faster O_DIRECT here (both
 * kinds' best rates, at large sizes, in *buf_bps and *direct_bps; 0 where not measured twice
 * yet). */
bool ft__sel_measured_direct(ft__selector *sel, int mem, bool busy, double *buf_bps,
                             double *direct_bps);

/* ---- persistence (profile.c) ---- */

/** Write the selector's samples to @p path atomically, tagged with @p tag. */
int ft__sel_save(ft__selector *sel, const char *path, const char *tag);
/** Load samples from @p path: 0 (also when missing), or -EINVAL (corrupt, another version,
 * another @p tag: detail says why) and nothing loaded. */
int ft__sel_load(ft__selector *sel, const char *path, const char *tag);
/** Parse a profile's text (cut in place), @p path naming it in messages. As ft__sel_load. */
int ft__sel_parse(ft__selector *sel, char *text, const char *path, const char *tag);
/** Print the keys with samples. */
void ft__sel_show(ft__selector *sel, FILE *out);

/* ---- sample windows (window.c) ---- */

/** The open windows of one file (made on first use, freed at its close). */
typedef struct ft__win_set ft__win_set;

/** Whether calls of @p key are measured in windows of several calls (stream reads beside
 * others, buffered writes awaiting their sync); else each call is a window of its own. */
bool ft__win_key(const ft__sel_key *key);
/** A stream read beside others joins its key's open window in @p set, if one has an arm in
 * @p eligible: then *arm is that arm (the window owns the trial). */
bool ft__win_join(ft__win_set *_Atomic *set, ft__selector *sel, const ft__sel_key *key,
                  uint32_t eligible, unsigned *arm);
/** Add what a call did (@p bytes in its share @p ns of the time) to its window. */
void ft__win_add(ft__win_set *_Atomic *set, ft__selector *sel, const ft__sel_key *key,
                 unsigned arm, bool trial, uint64_t bytes, uint64_t ns);
/** The file was synced in @p sync_ns: close its write windows, the sync's time shared by bytes
 * among those of buffered arms. @p closing: the file closes, every window ends. */
void ft__win_flush(ft__win_set *_Atomic *set, uint64_t sync_ns, bool closing);

#endif
