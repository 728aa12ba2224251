/*
 * A pool of equally sized, FT__DIRECT_ALIGN-aligned buffers, reused across transfers.
 * Buffers of 2 MiB and more are 2 MiB-aligned and advised MADV_HUGEPAGE: the first touch of
 * fresh memory is the slow part of a first transfer in a virtual machine (0.2 GB/s with 4 KiB
 * pages on the development VM, 0.67 GB/s with transparent huge pages).
 */
#include "base.h"
#include "syscall.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE (2u << 20)

struct ft__bufpool {
    pthread_mutex_t lock;
    const ft__buf_hooks *hooks; /* what each buffer goes through (page-locking), or NULL */
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

int ft__bufpool_create_with(ft__bufpool **out, size_t buf_size, unsigned max_cached,
                            const ft__buf_hooks *hooks)
{
    int rc = ft__bufpool_create(out, buf_size, max_cached);
    if (rc == 0)
        (*out)->hooks = hooks;
    return rc;
}

static void buf_free(const ft__bufpool *p, void *buf)
{
    if (buf && p->hooks)
        p->hooks->unmade(buf);
    free(buf);
}

void ft__bufpool_destroy(ft__bufpool *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < p->ncached; i++)
        buf_free(p, p->cached[i]);
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
    bool huge = p->size >= HUGE_PAGE;
    if (posix_memalign(&buf, huge ? HUGE_PAGE : FT__DIRECT_ALIGN, p->size) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    if (huge) /* a hint: without THP the memory simply stays in small pages */
        ft__sys.madvise(buf, p->size / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
    if (p->hooks)
        p->hooks->made(buf, p->size);
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
    buf_free(p, buf);
}

bool ft__bufpool_hooked(const ft__bufpool *p)
{
    return p->hooks != NULL;
}

size_t ft__bufpool_size(const ft__bufpool *p)
{
    return p->size;
}
