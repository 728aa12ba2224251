/*
 * The files a save replaces or removes are freed off the caller's path. A rename over a file,
 * or its unlink, frees the file's blocks inside that call when it drops the last reference
 * (on ext4 hundreds of milliseconds for a few GiB, more with online discard): the caller
 * would wait for the old checkpoint's deletion as long as for a good part of the new one's
 * writing. So a save first takes an O_PATH reference to each file it is about to replace or
 * remove; the rename and the unlink then drop names only, and the references are closed by
 * a worker of the context's pool once the save is done. A reference that cannot be taken
 * costs nothing but that wait.
 */
#include "ckpt.h"
#include "../base/syscall.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ft__name_hold(ft__ckpt_name *n, const char *path)
{
    if (n->nheld == n->held_cap) {
        size_t cap = n->held_cap ? 2 * n->held_cap : 4;
        int *grown = realloc(n->held, cap * sizeof *grown);
        if (!grown)
            return;
        n->held = grown;
        n->held_cap = cap;
    }
    /* O_PATH opens nothing (no FIFO waits, no device side effects) yet pins the inode;
     * O_NOFOLLOW: a link at the name is what the rename replaces, not its target. */
    int fd = ft__sys.open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd >= 0)
        n->held[n->nheld++] = fd;
}

typedef struct held_fds {
    size_t n;
    int fd[];
} held_fds;

/* close() directly, not through the syscall table: nothing could act on a failure to drop
 * an O_PATH reference, and a call on a pool worker would make the fault tests' call
 * counts depend on timing. */
static void close_all(const int *fd, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fd[i]);
}

static void close_held(void *arg)
{
    held_fds *h = arg;
    close_all(h->fd, h->n);
    free(h);
}

void ft__name_release(ft__ckpt_name *n, ft__pool *pool)
{
    held_fds *h = n->nheld && pool && ft__pool_workers(pool)
                      ? malloc(sizeof *h + n->nheld * sizeof h->fd[0]) : NULL;
    if (h) {
        h->n = n->nheld;
        memcpy(h->fd, n->held, n->nheld * sizeof h->fd[0]);
    }
    if (!h || ft__pool_post(pool, close_held, h) < 0) {
        free(h); /* no worker to take them: free them here, as an unheld rename would have */
        close_all(n->held, n->nheld);
    }
    free(n->held);
    n->held = NULL;
    n->nheld = n->held_cap = 0;
}
