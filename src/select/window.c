/*
 * Sample windows: how what calls did becomes samples. A window is a run of calls of one key and
 * arm on one file (a window set per file, its own lock), and one sample: their bytes over their
 * share of the time (a call that ran while k transfers were in flight counts 1/k of its time,
 * see auto.c). Most windows are one call. Two kinds last longer:
 * - stream reads beside other transfers: the kernel's readahead one call starts serves the
 *   next, so a buffered call's own time says what the calls before it read ahead (development
 *   machine, a cold stream of 1 MiB reads 16 in flight: `posix` calls scored 55 GB/s each in
 *   a run that delivered 2.3-2.8). Their window takes every stream call of the key on the
 *   file, on its arm, until WINDOW_BYTES have come.
 * - buffered writes not synced by the call: cheap until their pages must reach the disk. The
 *   window closes at the file's next sync, whose time is shared by bytes among the buffered
 *   windows (O_DIRECT writes left it nothing to flush).
 */
#include "select.h"

#include <stdlib.h>

#define MAX_WINDOWS 16             /* open per file; beyond, calls are windows of their own */
#define WINDOW_BYTES (32ull << 20) /* a stream window: beyond the readahead's reach */
#define SYNC_SHARE_MIN (1u << 20)  /* below, a sync's time is its fixed cost (journal commit,
                                      cache flush: 1-5 ms), not those bytes' writeback */

typedef struct window {
    ft__selector *sel;
    ft__sel_key key;
    unsigned index, arm; /* index: the key's */
    uint32_t trials;
    uint64_t bytes, ns;
} window;

struct ft__win_set {
    pthread_mutex_t lock;
    unsigned n;
    window w[MAX_WINDOWS];
};

bool ft__win_key(const ft__sel_key *key)
{
    return key->write ? key->cls != FT__CLS_SYNC : key->cls == FT__CLS_STREAM && key->busy;
}

/* The set, made on first use (NULL when memory runs out). */
static ft__win_set *set_of(ft__win_set *_Atomic *slot)
{
    ft__win_set *s = atomic_load_explicit(slot, memory_order_acquire);
    if (s)
        return s;
    ft__win_set *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    pthread_mutex_init(&fresh->lock, NULL);
    if (atomic_compare_exchange_strong_explicit(slot, &s, fresh, memory_order_acq_rel,
                                                memory_order_acquire))
        return fresh;
    pthread_mutex_destroy(&fresh->lock);
    free(fresh);
    return s;
}

/* The open window of (sel, key index) with an arm in @p arms. Call with the lock held. */
static window *find(ft__win_set *s, const ft__selector *sel, unsigned index, uint32_t arms)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->w[i].sel == sel && s->w[i].index == index && (arms >> s->w[i].arm & 1))
            return &s->w[i];
    return NULL;
}

/* Turn a closed window into its sample (or, with @p drop, into none), ending its trials. */
static void close_window(const window *w, uint64_t extra_ns, bool drop)
{
    uint32_t trials = w->trials;
    if (!drop && w->bytes) {
        ft__sel_record(w->sel, &w->key, w->arm, w->bytes, w->ns + extra_ns, trials > 0);
        trials -= trials > 0;
    }
    while (trials--)
        ft__sel_release(w->sel, &w->key, w->arm);
}

bool ft__win_join(ft__win_set *_Atomic *slot, ft__selector *sel, const ft__sel_key *key,
                  uint32_t eligible, unsigned *arm)
{
    ft__win_set *s = atomic_load_explicit(slot, memory_order_acquire);
    if (!s)
        return false;
    pthread_mutex_lock(&s->lock);
    window *w = find(s, sel, ft__sel_key_index(key), eligible);
    if (w)
        *arm = w->arm;
    pthread_mutex_unlock(&s->lock);
    return w != NULL;
}

void ft__win_add(ft__win_set *_Atomic *slot, ft__selector *sel, const ft__sel_key *key,
                 unsigned arm, bool trial, uint64_t bytes, uint64_t ns)
{
    unsigned index = ft__sel_key_index(key);
    ft__win_set *s = set_of(slot);
    window *w = NULL, done;
    bool full = false;
    if (s) {
        pthread_mutex_lock(&s->lock);
        w = find(s, sel, index, 1u << arm);
        if (!w && s->n < MAX_WINDOWS) {
            w = &s->w[s->n++];
            *w = (window){.sel = sel, .key = *key, .index = index, .arm = arm};
        }
        if (w) {
            w->trials += trial;
            w->bytes += bytes;
            w->ns += ns;
            if ((full = !key->write && w->bytes >= WINDOW_BYTES)) {
                done = *w;
                *w = s->w[--s->n];
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
    if (full)
        close_window(&done, 0, false);
    else if (!w) /* no room: a window of its own */
        ft__sel_record(sel, key, arm, bytes, ns, trial);
}

void ft__win_flush(ft__win_set *_Atomic *slot, uint64_t sync_ns, bool closing)
{
    ft__win_set *s = closing ? atomic_exchange_explicit(slot, NULL, memory_order_acq_rel)
                             : atomic_load_explicit(slot, memory_order_acquire);
    if (!s)
        return;
    window out[MAX_WINDOWS];
    unsigned n = 0;
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < s->n;) {
        if (closing || s->w[i].key.write) {
            out[n++] = s->w[i];
            s->w[i] = s->w[--s->n];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (closing) {
        pthread_mutex_destroy(&s->lock);
        free(s);
    }
    uint64_t buffered = 0;
    for (unsigned i = 0; i < n; i++)
        if (out[i].key.write && (out[i].sel->buffered >> out[i].arm & 1))
            buffered += out[i].bytes;
    for (unsigned i = 0; i < n; i++) {
        bool mine = out[i].key.write && (out[i].sel->buffered >> out[i].arm & 1);
        /* a read window cut short by the close, or buffered writes too few for the sync */
        bool drop = out[i].key.write ? mine && sync_ns && buffered < SYNC_SHARE_MIN
                                     : out[i].bytes < WINDOW_BYTES / 4;
        uint64_t share = mine && buffered && sync_ns
                             ? (uint64_t)((double)sync_ns * (double)out[i].bytes / (double)buffered)
                             : 0;
        close_window(&out[i], share, drop);
    }
}
