/* First-fit range allocator. The free list is a sorted array: entries are few (a store holds
 * hundreds to thousands of slots), and a sorted array keeps merging a matter of neighbours. */
#include "extent.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ft__extents_init(ft__extents *e, uint64_t total)
{
    memset(e, 0, sizeof *e);
    e->cap = 16;
    if (!(e->free = malloc(e->cap * sizeof *e->free)))
        return -ENOMEM;
    e->total = total;
    if (total)
        e->free[e->n++] = (ft__range){0, total};
    return 0;
}

void ft__extents_fini(ft__extents *e)
{
    free(e->free);
    memset(e, 0, sizeof *e);
}

/* Each free may add one range, and there are never more free ranges than live allocations
 * plus one: keeping room for that many means ft__extents_free never needs memory. */
static int reserve(ft__extents *e)
{
    size_t need = e->live + 2 + e->n;
    if (need <= e->cap)
        return 0;
    size_t cap = need * 2;
    ft__range *v = realloc(e->free, cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    e->free = v;
    e->cap = cap;
    return 0;
}

static void remove_at(ft__extents *e, size_t i)
{
    memmove(&e->free[i], &e->free[i + 1], (e->n - i - 1) * sizeof *e->free);
    e->n--;
}

int64_t ft__extents_alloc(ft__extents *e, uint64_t len)
{
    if (len == 0 || len > INT64_MAX)
        return -EINVAL;
    if (reserve(e) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < e->n; i++) {
        ft__range *r = &e->free[i];
        if (r->len < len)
            continue;
        uint64_t off = r->off;
        r->off += len;
        r->len -= len;
        if (r->len == 0)
            remove_at(e, i);
        e->used += len;
        e->live++;
        return (int64_t)off;
    }
    return -ENOSPC;
}

uint64_t ft__extents_grow_need(const ft__extents *e, uint64_t len)
{
    uint64_t tail = 0;
    if (e->n && e->free[e->n - 1].off + e->free[e->n - 1].len == e->total)
        tail = e->free[e->n - 1].len;
    return e->total - tail + len;
}

int ft__extents_grow(ft__extents *e, uint64_t total)
{
    if (total <= e->total)
        return 0;
    if (reserve(e) < 0)
        return -ENOMEM;
    if (e->n && e->free[e->n - 1].off + e->free[e->n - 1].len == e->total)
        e->free[e->n - 1].len += total - e->total;
    else
        e->free[e->n++] = (ft__range){e->total, total - e->total};
    e->total = total;
    return 0;
}

void ft__extents_free(ft__extents *e, uint64_t off, uint64_t len)
{
    if (len == 0)
        return;
    size_t i = 0; /* first free range after off */
    while (i < e->n && e->free[i].off < off)
        i++;
    bool prev = i > 0 && e->free[i - 1].off + e->free[i - 1].len == off;
    bool next = i < e->n && off + len == e->free[i].off;
    e->used -= len;
    e->live--;
    if (prev && next) {
        e->free[i - 1].len += len + e->free[i].len;
        remove_at(e, i);
    } else if (prev) {
        e->free[i - 1].len += len;
    } else if (next) {
        e->free[i].off = off;
        e->free[i].len += len;
    } else {
        memmove(&e->free[i + 1], &e->free[i], (e->n - i) * sizeof *e->free);
        e->free[i] = (ft__range){off, len};
        e->n++;
    }
}

uint64_t ft__extents_largest(const ft__extents *e)
{
    uint64_t best = 0;
    for (size_t i = 0; i < e->n; i++)
        if (e->free[i].len > best)
            best = e->free[i].len;
    return best;
}
