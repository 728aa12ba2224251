/* A pool of equally sized, FT__DIRECT_ALIGN-aligned buffers, reused across transfers. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>

struct ft__bufpool {
    pthread_mutex_t lock;
    size_t size;
    unsigned max_cached;
    unsigned ncached;
    void **cached;
};

int ft__bufpool_create(ft__bufpool **out, size_t buf_size, unsigned max_cached)
{
    ft__bufpool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->cached = calloc(max_cached ? max_cached : 1, sizeof *p->cached);
    if (!p->cached) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->size = buf_size;
    p->max_cached = max_cached;
    *out = p;
    return 0;
}

void ft__bufpool_destroy(ft__bufpool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->ncached; i++)
        free(p->cached[i]);
    pthread_mutex_destroy(&p->lock);
    free(p->cached);
    free(p);
}

void *ft__bufpool_get(ft__bufpool *p)
{
    void *buf = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->ncached > 0)
        buf = p->cached[--p->ncached];
    pthread_mutex_unlock(&p->lock);
    if (buf)
        return buf;
    if (posix_memalign(&buf, FT__DIRECT_ALIGN, p->size) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    return buf;
}

void ft__bufpool_put(ft__bufpool *p, void *buf)
{
    if (!buf)
        return;
    pthread_mutex_lock(&p->lock);
    if (p->ncached < p->max_cached) {
        p->cached[p->ncached++] = buf;
        buf = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    free(buf);
}

size_t ft__bufpool_size(const ft__bufpool *p)
{
    return p->size;
}
