/* First-fit allocator of byte ranges, for spill-file slots and the pinned host ring. */
#ifndef FT_STORE_EXTENT_H
#define FT_STORE_EXTENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ft__range {
    uint64_t off, len;
} ft__range;

typedef struct ft__extents {
    ft__range *free; /* free ranges, sorted by offset, never adjacent */
    size_t n, cap;
    uint64_t total;  /* bytes managed (grows when allocating with grow) */
    uint64_t used;   /* bytes allocated */
    size_t live;     /* allocations not freed */
} ft__extents;

/** Manage [0, total). @return 0 or -ENOMEM. */
int ft__extents_init(ft__extents *e, uint64_t total);
void ft__extents_fini(ft__extents *e);

/** Take @p len bytes, the lowest free range that fits. @return offset, -ENOSPC or -ENOMEM. */
int64_t ft__extents_alloc(ft__extents *e, uint64_t len);

/** @return the managed size needed for an alloc of @p len to fit at the end. */
uint64_t ft__extents_grow_need(const ft__extents *e, uint64_t len);

/** Extend the managed size to @p total (free space at the end). @return 0 or -ENOMEM. */
int ft__extents_grow(ft__extents *e, uint64_t total);

/** Give [off, off+len) back, merging with its neighbours. Cannot fail: alloc keeps room. */
void ft__extents_free(ft__extents *e, uint64_t off, uint64_t len);

/** @return the largest free range (what one alloc without grow can get). */
uint64_t ft__extents_largest(const ft__extents *e);

#endif
