/*
 * The objective: what a transfer should leave behind in the page cache, decided from facts
 * the caller gathers (core/auto.c: the file's size or its checkpoint's, the room the page
 * cache has, the call's key) and from what this selector measured. A read is worth what it
 * delivers now and what it leaves in the page cache for the next one (the next process's
 * load, the other ranks reading the same file); a durable write, what it costs until the
 * data is on the disk.
 */
#include "select.h"

#include <math.h>

/* Data fits what the page cache can keep when it is at most this share of the room: the
 * rest is for the destination (a host load needs as much again) and everything else. */
#define CACHE_SHARE 0.5

/* Cold reads of data that fits go O_DIRECT all the same where this device's best buffered
 * cold rate, at large sizes, is below DIRECT_EDGE of its best O_DIRECT one (fast NVMe arrays,
 * where the page cache's copies cap the rate), both measured twice or more and the lead
 * beyond their spread (ft__sel_measured_direct), in the call's
 * company: alone, or beside other transfers. Beside others, a reader that finds the file
 * being read already leaves the cache to the one that began first: on the development VM (2
 * CPUs), two processes reading a 495 MB checkpoint cold at once, 4 rounds, took 0.43-1.23 s
 * both through the page cache (each copying out of it), 0.50-0.55 both O_DIRECT, 0.52-0.90
 * one each way (and the file cached for the next load). */
#define DIRECT_EDGE 0.8

uint64_t ft__sel_cache_fits(uint64_t room)
{
    return (uint64_t)(CACHE_SHARE * (double)room);
}

/* O_DIRECT is "well ahead" where its best mean ln-rate is above the buffered one's by
 * ln(1 / DIRECT_EDGE) and by the standard error of that difference besides: a lead inside
 * the samples' own spread is no result (at the spread's floor, two samples of each need a
 * lead of 1.31x, the edge alone 1.25x; a noisy buffered arm, more). */
bool ft__sel_measured_direct(ft__selector *sel, int mem, bool busy, double *buf_bps,
                             double *direct_bps)
{
    *buf_bps = *direct_bps = 0;
    uint32_t buffered = sel->buffered, all = (1u << sel->narms) - 1;
    for (int b = FT__SEL_BUCKET_TOP; b >= 24; b--) {
        ft__sel_key k = {.write = 0, .mem = (uint8_t)mem, .bucket = (uint8_t)b,
                         .cls = FT__CLS_COLD, .busy = busy};
        double mb, vb, md, vd;
        if (ft__sel_best(sel, &k, buffered, 2, &mb, &vb) >= 0 &&
            ft__sel_best(sel, &k, all & ~buffered, 2, &md, &vd) >= 0) {
            *buf_bps = exp(mb);
            *direct_bps = exp(md);
            return md - mb > -log(DIRECT_EDGE) + sqrt(vb + vd);
        }
    }
    return false;
}

/* The same, remembered per selector (a filesystem), memory kind and company for a second. */
static bool prefers_direct(ft__selector *sel, int mem, bool busy, uint64_t now)
{
    _Atomic uint64_t *memo = &sel->direct_memo[(mem & 1) * 2 + busy];
    uint64_t m = atomic_load_explicit(memo, memory_order_relaxed);
    if (m && now - (m >> 1) < 1000000000ull)
        return m & 1;
    double x, y;
    bool yes = ft__sel_measured_direct(sel, mem, busy, &x, &y);
    atomic_store_explicit(memo, now << 1 | yes, memory_order_relaxed);
    return yes;
}

/*
 * With FT_CACHE_AUTO: cached data is copied out of the cache (an O_DIRECT read would read the
 * disk again); uncached data that fits (the file, or the checkpoint it belongs to, within
 * CACHE_SHARE of the room) goes through the cache, unless this device measured O_DIRECT well
 * ahead in the call's company; data that does not fit goes O_DIRECT, where it evicts nothing. Durable writes go
 * O_DIRECT from 64 KiB: buffered ones only move their cost into the sync; plain writes and
 * small ones may take any arm.
 */
/*
 * A spill file (activations written once and read back soon, once): through the page cache
 * while the file is within what the cache may hold of it (@p limit; 0: unknown): the cache
 * keeps recent entries in spare memory and writes them back on its own; past it O_DIRECT,
 * where it evicts nothing. One way: page-cache and O_DIRECT I/O of one slot are not
 * coherent (readahead may cache a slot's old contents while an O_DIRECT write lands), so
 * the caller keeps each entry's class and never goes back.
 */
int ft__sel_spill_goal(uint64_t data, uint64_t limit)
{
    return limit && data <= limit ? FT_CACHE_KEEP : FT_CACHE_BYPASS;
}

int ft__sel_cache_goal(ft__selector *sel, const ft__sel_key *k, uint64_t len, int mode,
                       uint64_t data, uint64_t room, uint64_t now)
{
    if (mode != FT_CACHE_AUTO)
        return mode;
    if (k->write)
        return k->cls == FT__CLS_PLAIN || len < 65536 ? FT_CACHE_AUTO : FT_CACHE_BYPASS;
    if (k->cls == FT__CLS_CACHED)
        return FT_CACHE_KEEP;
    bool fits = data <= ft__sel_cache_fits(room);
    return !fits || (sel && prefers_direct(sel, k->mem, k->busy, now)) ? FT_CACHE_BYPASS
                                                                        : FT_CACHE_KEEP;
}
