/* What saves, loads and gc agree on: which names a checkpoint's files may have (a plain file
 * name; a generation's shard name) and the commit lock of a directory (commit.c says what it
 * serializes). */
#include "ckpt.h"
#include "../base/syscall.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define EXT ".safetensors"

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

bool ft__plain_name(const char *name, size_t len)
{
    return len > 0 && strlen(name) == len && !strchr(name, '/') && !strchr(name, '\\') &&
           strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

bool ft__generation_shard(const char *name, size_t *stem_len)
{
    size_t len = strlen(name), tail = strlen("-00001-of-00004.3fa9c2d1" EXT);
    if (len <= tail || !ends_with(name, EXT))
        return false;
    const char *t = name + len - tail;
    for (int i = 0; i < 24; i++) {
        bool digit = (i >= 1 && i <= 5) || (i >= 10 && i <= 14);
        bool hex = i >= 16;
        char c = t[i];
        if ((digit && !isdigit((unsigned char)c)) || (hex && !isxdigit((unsigned char)c)) ||
            (i == 0 && c != '-') || (i >= 6 && i <= 9 && c != "-of-"[i - 6]) ||
            (i == 15 && c != '.'))
            return false;
    }
    *stem_len = len - tail;
    return true;
}

void ft__commit_unlock(int fd)
{
    if (fd < 0)
        return;
    int saved = errno; /* a caller's errno outlives the release */
    ft__sys.close(fd); /* the flock goes with the descriptor */
    errno = saved;
}

int ft__commit_lock(const char *dir, bool shared, int *fd)
{
    *fd = -1;
    int d = ft__sys.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (d < 0)
        return errno == EACCES ? 0 /* a directory we may write but not list: no lock */
                               : ft__err(-errno, "cannot open directory %s to lock it", dir);
    while (ft__sys.flock(d, shared ? LOCK_SH : LOCK_EX) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        ft__commit_unlock(d);
        /* filesystems without flock (some network ones): commits as before, unserialized */
        if (e == EOPNOTSUPP || e == ENOLCK || e == ENOSYS || e == EINVAL || e == EBADF)
            return 0;
        return ft__err(-e, "cannot lock directory %s", dir);
    }
    *fd = d;
    return 0;
}
