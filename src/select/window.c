/*
 * Sample windows: how what calls did becomes samples. A window is a run of calls of one key
 * and arm on one file, and one sample: their bytes over their share of the time (a call that
 * ran while k transfers were in flight counts 1/k of its time, see auto.c). Most windows are
 * one call. Two kinds last longer:
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

struct ft__win {
    ft__selector *sel;
    ft__sel_key key;
    unsigned index, arm; /* index: the key's */
    uint32_t calls, trials;
    uint64_t bytes, ns;
};

bool ft__win_key(const ft__sel_key *key)
{
    return key->write ? key->cls != FT__CLS_SYNC : key->cls == FT__CLS_STREAM && key->busy;
}

/* The open window of (sel, key, arm) on @p f; any arm in @p arms. Call with f->lock held. */
static struct ft__win *find(ft_file *f, const ft__decision *d, unsigned index, uint32_t arms)
{
    for (unsigned i = 0; i < f->nwins; i++)
        if (f->wins[i].sel == d->sel && f->wins[i].index == index && (arms >> f->wins[i].arm & 1))
            return &f->wins[i];
    return NULL;
}

/* Turn a closed window into its sample (or, with @p drop, into none), ending its trials. */
static void close_window(const struct ft__win *w, uint64_t extra_ns, bool drop)
{
    uint32_t trials = w->trials;
    if (!drop && w->bytes) {
        ft__sel_record(w->sel, &w->key, w->arm, w->bytes, w->ns + extra_ns, trials > 0);
        trials -= trials > 0;
    }
    while (trials--)
        ft__sel_release(w->sel, &w->key, w->arm);
}

bool ft__win_join(ft_file *f, ft__decision *d, uint32_t eligible)
{
    if (!d->sel)
        return false;
    pthread_mutex_lock(&f->lock);
    struct ft__win *w = find(f, d, ft__sel_key_index(&d->key), eligible);
    if (w)
        d->arm = w->arm;
    pthread_mutex_unlock(&f->lock);
    d->joined = w != NULL;
    return d->joined;
}

void ft__win_add(ft_file *f, const ft__decision *d, uint64_t bytes, uint64_t ns)
{
    unsigned index = ft__sel_key_index(&d->key);
    struct ft__win done;
    bool full = false, alone = false;
    pthread_mutex_lock(&f->lock);
    if (!f->wins)
        f->wins = calloc(MAX_WINDOWS, sizeof *f->wins);
    struct ft__win *w = f->wins ? find(f, d, index, 1u << d->arm) : NULL;
    if (!w && f->wins && f->nwins < MAX_WINDOWS) {
        w = &f->wins[f->nwins++];
        *w = (struct ft__win){.sel = d->sel, .key = d->key, .index = index, .arm = d->arm};
    }
    if (w) {
        w->calls++;
        w->trials += d->trial;
        w->bytes += bytes;
        w->ns += ns;
        full = !d->key.write && w->bytes >= WINDOW_BYTES;
        if (full) {
            done = *w;
            *w = f->wins[--f->nwins];
        }
    } else {
        alone = true;
    }
    pthread_mutex_unlock(&f->lock);
    if (full)
        close_window(&done, 0, false);
    if (alone)
        ft__sel_record(d->sel, &d->key, d->arm, bytes, ns, d->trial);
}

void ft__win_flush(ft_file *f, uint64_t sync_ns, bool closing)
{
    struct ft__win out[MAX_WINDOWS];
    unsigned n = 0;
    pthread_mutex_lock(&f->lock);
    for (unsigned i = 0; i < f->nwins;) {
        if (closing || f->wins[i].key.write) {
            out[n++] = f->wins[i];
            f->wins[i] = f->wins[--f->nwins];
        } else {
            i++;
        }
    }
    if (closing) {
        free(f->wins);
        f->wins = NULL;
    }
    pthread_mutex_unlock(&f->lock);
    uint64_t buffered = 0;
    for (unsigned i = 0; i < n; i++)
        if (out[i].key.write && ft__auto_buffered_arm(out[i].arm))
            buffered += out[i].bytes;
    for (unsigned i = 0; i < n; i++) {
        bool mine = out[i].key.write && ft__auto_buffered_arm(out[i].arm);
        /* a read window cut short by the close, or buffered writes too few for the sync */
        bool drop = out[i].key.write ? mine && sync_ns && buffered < SYNC_SHARE_MIN
                                     : out[i].bytes < WINDOW_BYTES / 4;
        uint64_t share = mine && buffered && sync_ns
                             ? (uint64_t)((double)sync_ns * (double)out[i].bytes / (double)buffered)
                             : 0;
        close_window(&out[i], share, drop);
    }
}
