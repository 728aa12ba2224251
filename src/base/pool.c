/*
 * A fixed thread pool with one FIFO queue. Work comes as groups (ft__pool_run: n indexed
 * tasks, the caller waits) or as detached tasks (ft__pool_post). A waiting caller runs queued
 * tasks of its own group while it waits: its group can always finish even when every worker
 * is itself waiting inside a task, so nested use from workers (async requests) cannot
 * deadlock. A thread that asked for it (ft__pool_first) queues its groups ahead of the
 * queue: the next free workers take them.
 */
#include "base.h"

#include <errno.h>
#include <stdlib.h>

typedef struct ft__group {
    int64_t (*fn)(void *arg, unsigned i);
    void *arg;
    int64_t *results;
    unsigned pending; /* tasks not finished; guarded by the pool lock */
} ft__group;

struct ft__task {
    ft__task *next;
    ft__group *group;          /* NULL for a detached task */
    unsigned index;            /* index within the group */
    void (*detached)(void *);  /* detached function */
    void *arg;
};

struct ft__pool {
    pthread_mutex_t lock;
    pthread_cond_t work;  /* queue became non-empty, or stop */
    pthread_cond_t done;  /* a group task finished */
    ft__task *head, *tail;
    bool stop;
    unsigned nthreads;
    pthread_t *threads;
};

/* Whether this thread's groups go ahead of the queue (ft__pool_first). */
static _Thread_local bool queue_first;

bool ft__pool_first(bool on)
{
    bool was = queue_first;
    queue_first = on;
    return was;
}

/* Queue tasks @p t[0..n) (n >= 1), in their order, behind those queued or, with @p front,
 * ahead of them. */
static void queue_push(ft__pool *p, ft__task *t, unsigned n, bool front)
{
    for (unsigned i = 0; i + 1 < n; i++)
        t[i].next = &t[i + 1];
    ft__task *last = &t[n - 1];
    if (front) {
        last->next = p->head;
        if (!p->head)
            p->tail = last;
        p->head = t;
    } else {
        last->next = NULL;
        if (p->tail)
            p->tail->next = t;
        else
            p->head = t;
        p->tail = last;
    }
}

/* Remove and return the first queued task of @p g (any task when g is NULL). */
static ft__task *queue_take(ft__pool *p, const ft__group *g)
{
    ft__task *prev = NULL;
    for (ft__task *t = p->head; t; prev = t, t = t->next) {
        if (g && t->group != g)
            continue;
        if (prev)
            prev->next = t->next;
        else
            p->head = t->next;
        if (p->tail == t)
            p->tail = prev;
        return t;
    }
    return NULL;
}

/* Run one task with the lock released; retakes it before returning. */
static void task_run(ft__pool *p, ft__task *t)
{
    pthread_mutex_unlock(&p->lock);
    if (t->group) {
        ft__group *g = t->group;
        g->results[t->index] = g->fn(g->arg, t->index);
        pthread_mutex_lock(&p->lock);
        if (--g->pending == 0)
            pthread_cond_broadcast(&p->done);
        return;
    }
    t->detached(t->arg);
    free(t);
    pthread_mutex_lock(&p->lock);
}

static void *worker_main(void *arg)
{
    ft__pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        ft__task *t = queue_take(p, NULL);
        if (t) {
            task_run(p, t);
            continue;
        }
        if (p->stop)
            break;
        pthread_cond_wait(&p->work, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int ft__pool_create(ft__pool **out, unsigned threads)
{
    ft__pool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->threads = calloc(threads ? threads : 1, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    for (unsigned i = 0; i < threads; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc) {
            ft__pool_destroy(p);
            return ft__err(-rc, "cannot start worker thread %u of %u", i + 1, threads);
        }
        p->nthreads++;
    }
    *out = p;
    return 0;
}

void ft__pool_destroy(ft__pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

int ft__pool_run(ft__pool *p, unsigned n, int64_t (*fn)(void *arg, unsigned i), void *arg,
                 int64_t *results)
{
    if (n == 0)
        return 0;
    if (n == 1 || p->nthreads == 0) {
        for (unsigned i = 0; i < n; i++)
            results[i] = fn(arg, i);
        return 0;
    }
    ft__task *tasks = calloc(n, sizeof *tasks);
    if (!tasks)
        return -ENOMEM;
    ft__group g = {.fn = fn, .arg = arg, .results = results, .pending = n};
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < n; i++)
        tasks[i] = (ft__task){.group = &g, .index = i};
    queue_push(p, tasks, n, queue_first);
    pthread_cond_broadcast(&p->work);
    while (g.pending > 0) {
        ft__task *t = queue_take(p, &g);
        if (t)
            task_run(p, t);
        else
            pthread_cond_wait(&p->done, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    free(tasks);
    return 0;
}

unsigned ft__pool_workers(const ft__pool *p)
{
    return p->nthreads;
}

int ft__pool_post(ft__pool *p, void (*fn)(void *arg), void *arg)
{
    ft__task *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->detached = fn;
    t->arg = arg;
    pthread_mutex_lock(&p->lock);
    queue_push(p, t, 1, false);
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
    return 0;
}
