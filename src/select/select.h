/*
 * The adaptive selector (engine AUTO): the Fastensor paper's dictionary, done properly.
 * A key is (direction, memory kind, size bucket, context class); an arm is an engine with
 * one of a few settings. Per key and arm it keeps the last few measured throughputs; it
 * explores every eligible arm a few times (one real call each, never extra I/O), then
 * exploits the best median, re-checks others with a small probability, re-explores a key
 * whose chosen arm drifts well below its record, and answers unseen keys from the nearest
 * known size bucket. The core below knows nothing of files: tests drive it with fake arms.
 */
#ifndef FT_SELECT_SELECT_H
#define FT_SELECT_SELECT_H

#include "../core/internal.h"

#define FT__SEL_BUCKETS 48     /* log2 of the size: 1 B .. 128 TiB */
/* Sizes from 256 MiB up share the top bucket: every engine cuts transfers that large into
 * chunk-sized pieces, so their throughput no longer depends on the size, and calls that
 * large (a checkpoint's shard is one) are too costly and too rare to explore per size: a
 * 2.5 GB load found no data for its own size after `fastensor tune` and explored the
 * slower engines in use. */
#define FT__SEL_BUCKET_TOP 28
#define FT__SEL_CACHE 4        /* reads: cold, partly cached, cached, stream; writes: plain,
                                  synced by the call, synced later by the caller */
#define FT__SEL_BUSY 2         /* no other transfer in flight / some */
#define FT__SEL_CPU 2          /* CPU load low / high */
#define FT__SEL_KEYS (2 * 2 * FT__SEL_BUCKETS * FT__SEL_CACHE * FT__SEL_BUSY * FT__SEL_CPU)
#define FT__SEL_MAX_ARMS 16
#define FT__SEL_WINDOW 8       /* throughputs kept per key and arm */
#define FT__SEL_EXPLORE 3      /* samples of each arm before exploiting */

typedef struct ft__sel_stats {
    float tput[FT__SEL_WINDOW]; /* bytes per second, ring */
    uint32_t n;                 /* samples ever recorded (ring index = n % WINDOW) */
    uint32_t pending;           /* calls made whose measurement is not in yet */
    float med;                  /* median of the window (ft__sel_stats_changed) */
} ft__sel_stats;

typedef struct ft__sel_entry {
    pthread_mutex_t lock;
    _Atomic uint32_t calls;     /* decisions taken for this key */
    _Atomic int8_t best;        /* arm exploited, -1 while exploring */
    /* The eligible arms under which the key was last exploited with nothing left to explore
     * (0: not so): then a decision reads best without taking the lock. */
    _Atomic uint32_t settled;
    float record;               /* best arm's median when it was chosen */
    uint8_t low_streak;         /* consecutive samples of best far below record */
    uint8_t behind_streak;      /* consecutive samples of best below the runner-up's median */
    ft__sel_stats arm[FT__SEL_MAX_ARMS];
} ft__sel_entry;

typedef struct ft__selector {
    unsigned narms;
    uint64_t (*now_ns)(void);   /* injectable clock */
    _Atomic uint64_t rng;       /* for re-check draws */
    double recheck;             /* probability of trying another arm once converged */
    double drift;               /* re-explore when best falls below drift x record */
    _Atomic int dirty;          /* changed since the last save */
    /* Arms that do not go through the page cache (O_DIRECT engines): for reads their speed
     * hardly depends on the key's cache class, so what they did in one class of a size is
     * their estimate in the others. Set by the caller after creation; 0: none. */
    uint32_t cache_blind;
    /* Size buckets (bit b: 2^b bytes) whose stream reads beside other transfers are measured
     * in stints by the caller (stint.c): a sample is a run of calls' delivered rate, not one
     * call's time. Those keys are ranked on their own samples among every eligible arm, not
     * by the calls that ran alone. Set after creation; 0: none. */
    uint64_t stint_buckets;
    /* FT__SEL_KEYS entries, each allocated when its key is first chosen for or recorded:
     * made all at once (2 MB), they cost a process 12 ms of page faults on a VM, the first
     * AUTO call's time, for keys a job mostly never uses */
    ft__sel_entry *_Atomic *entries;
} ft__selector;

int ft__sel_create(ft__selector **out, unsigned narms, uint64_t (*now_ns)(void), uint64_t seed);
void ft__sel_destroy(ft__selector *sel);

unsigned ft__sel_key_index(const ft__sel_key *k);
/** The entry of key index @p index: NULL while nothing was chosen for or recorded under that
 * key (unless @p make: then made now; NULL only when memory runs out). */
ft__sel_entry *ft__sel_entry_at(ft__selector *sel, unsigned index, bool make);
/** The key of table index @p index (the inverse of ft__sel_key_index). */
void ft__sel_key_decode(unsigned index, ft__sel_key *k);
unsigned ft__sel_bucket(uint64_t len);

/**
 * Choose an arm for @p key among the arms set in @p eligible (a bit mask, non-zero).
 * @p fallback is the static default when nothing at all is known. @p trial (may be NULL) is
 * set when the arm is tried (exploring the key, or a re-check), not the key's best.
 */
unsigned ft__sel_choose(ft__selector *sel, const ft__sel_key *key, uint32_t eligible,
                        unsigned fallback, bool *trial);

/** Record that @p arm moved @p bytes in @p ns nanoseconds for @p key. */
void ft__sel_record(ft__selector *sel, const ft__sel_key *key, unsigned arm, uint64_t bytes,
                    uint64_t ns);

/** Whether @p k is a read of a stream (cache class 3: a run of reads that began uncached). */
static inline bool ft__sel_stream_key(const ft__sel_key *k)
{
    return !k->write && k->cache == 3;
}

/** Whether @p key's samples come from stints (see stint_buckets). */
bool ft__sel_stint_key(const ft__selector *sel, const ft__sel_key *key);

/** Count (+n) or uncount (-n) calls of @p arm whose measurement will come later. */
void ft__sel_pending(ft__selector *sel, const ft__sel_key *key, unsigned arm, int delta);

/** Median throughput (bytes/s) of an arm for a key, 0 when unsampled. */
float ft__sel_median(const ft__sel_stats *s);
/** Work the median out again after the window or the count changed (it is read on every
 * decision: sorting each arm's window per call was a quarter of AUTO's cost per call). */
void ft__sel_stats_changed(ft__sel_stats *s);

/* ---- persistence (profile.c) ---- */

/** Write the selector's statistics to @p path atomically, tagged with @p tag. */
int ft__sel_save(ft__selector *sel, const char *path, const char *tag);
/**
 * Load statistics from @p path. A missing file is 0 (nothing loaded); a corrupt file, one of
 * another version or with another @p tag is -EINVAL (detail says why) and loads nothing.
 */
int ft__sel_load(ft__selector *sel, const char *path, const char *tag);
/** Parse a profile's text (changed in place: lines are cut out), @p path naming it in
 * messages. @return as ft__sel_load. */
int ft__sel_parse(ft__selector *sel, char *text, const char *path, const char *tag);

/* ---- context probes (probe.c) ---- */

/** Page-cache residency class of [off, off+len) of @p fd: 0 cold, 1 partial, 2 cached.
 * (auto.c adds 3, stream: not all cached and continuing the file's previous read, where the
 * kernel's readahead works for buffered engines.) */
unsigned ft__probe_cache(int fd, uint64_t off, uint64_t len);
/** CPU load class: 1 when more tasks are runnable than there are CPUs (sampled every 0.5 s). */
unsigned ft__probe_cpu(void);
/** Make the next ft__probe_cpu read /proc/loadavg again (tests). */
void ft__probe_cpu_forget(void);

/* ---- stints (stint.c): stream reads beside other transfers, measured a run at a time ---- */

/** The size buckets (bit b: 2^b bytes) whose stream reads beside others go in stints. */
uint64_t ft__stint_buckets(void);
/** Let the stream read decided in @p d (a stint size) join its lane's current stint on @p f,
 * if one is open and its arm is eligible: then @p d has the stint's arm. */
bool ft__stint_join(ft_file *f, ft__decision *d, uint32_t eligible, uint64_t now);
/** Open a stint of @p len calls' size on @p f for the decision @p d (its key a stint key,
 * its arm chosen). */
void ft__stint_begin(ft_file *f, ft__decision *d, uint64_t len, uint64_t now);
/** A call of a stint came back at @p now with @p result bytes (or -errno). */
void ft__stint_done(ft_file *f, const ft__decision *d, int64_t result, uint64_t now);
/** The file closes: its stints end with what came (a sample each where enough did). */
void ft__stint_close(ft_file *f);

/* ---- AUTO's bookkeeping shared with the stints (auto.c) ---- */

/** Whether this is the context's first call of @p d's engine for its memory kind (that call
 * pays for what the engine sets up once: no sample). */
bool ft__auto_first_use(ft_file *f, const ft__decision *d);
/** A line to the FASTENSOR_TRACE file, when there is one. */
void ft__auto_trace_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** The trace line of an AUTO call (its key, arm, bytes, time and what became of it). */
void ft__auto_trace(const ft__decision *d, const ft__sel_key *key, int64_t result, uint64_t ns,
                    const char *what);

#endif
