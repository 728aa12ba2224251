/*
 * The selector's profile: a versioned text file, written atomically, tagged with what it
 * describes (filesystem device, GPU, arm table), so one never misleads another machine.
 *   fastensor-profile 1
 *   tag <text>
 *   <write> <mem> <bucket> <cache> <busy> <cpu> <arm> <n> <tput>...   (one line per arm)
 */
#include "select.h"
#include "../core/syscall.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROFILE_MAGIC "fastensor-profile 1"

/* The profile's text (malloc'ed, *len bytes), or NULL on ENOMEM. */
static char *profile_text(ft__selector *sel, const char *tag, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len); /* memory only: no system call */
    if (!f)
        return NULL;
    fprintf(f, "%s\ntag %s\n", PROFILE_MAGIC, tag);
    for (unsigned i = 0; i < FT__SEL_KEYS; i++) {
        ft__sel_entry *e = ft__sel_entry_at(sel, i, false);
        if (!e)
            continue;
        pthread_mutex_lock(&e->lock);
        ft__sel_key key;
        ft__sel_key_decode(i, &key);
        for (unsigned a = 0; a < sel->narms; a++) {
            const ft__sel_stats *st = &e->arm[a];
            if (!st->n)
                continue;
            unsigned n = FT__MIN(st->n, (uint32_t)FT__SEL_WINDOW);
            fprintf(f, "%u %u %u %u %u %u %u %u", key.write, key.mem, key.bucket, key.cache,
                    key.busy, key.cpu, a, n);
            for (unsigned k = 0; k < n; k++) /* oldest first */
                fprintf(f, " %.6g", (double)st->tput[(st->n - n + k) % FT__SEL_WINDOW]);
            fputc('\n', f);
        }
        pthread_mutex_unlock(&e->lock);
    }
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(text);
        return NULL;
    }
    return text;
}

int ft__sel_save(ft__selector *sel, const char *path, const char *tag)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    size_t len = 0;
    char *text = profile_text(sel, tag, &len);
    if (!text)
        return ft__err(-ENOMEM, "profile");
    int fd = ft__sys.open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(text);
        return ft__err(-errno, "cannot write profile %s", tmp);
    }
    int64_t w = ft__pwrite_full(fd, text, len, 0);
    free(text);
    int rc = w < 0 ? (int)w : 0;
    while (rc == 0 && ft__sys.fdatasync(fd) != 0)
        if (errno != EINTR)
            rc = ft__err(-errno, "fdatasync of profile %s", tmp);
    if (ft__sys.close(fd) != 0 && rc == 0 && errno != EINTR)
        rc = ft__err(-errno, "close of profile %s", tmp);
    if (rc == 0 && ft__sys.rename(tmp, path) != 0)
        rc = ft__err(-errno, "cannot rename profile to %s", path);
    if (rc < 0)
        ft__sys.unlink(tmp);
    return rc;
}

typedef struct loaded {
    unsigned key, arm, n;
    float tput[FT__SEL_WINDOW];
} loaded;

/* The whole profile file (NUL-terminated), through the syscall table. 0 with *text NULL
 * when there is none. */
static int read_profile(const char *path, char **text)
{
    *text = NULL;
    int fd = ft__sys.open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0)
        return errno == ENOENT ? 0 : ft__err(-errno, "cannot read profile %s", path);
    struct stat st;
    int rc = 0;
    if (ft__sys.fstat(fd, &st) != 0)
        rc = ft__err(-errno, "cannot stat profile %s", path);
    else if (!S_ISREG(st.st_mode) || st.st_size > (64 << 20))
        rc = ft__err(-EINVAL, "%s: not a regular file of at most 64 MiB", path);
    char *buf = rc == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    if (rc == 0 && !buf)
        rc = ft__err(-ENOMEM, "profile");
    int64_t n = rc == 0 ? ft__pread_full(fd, buf, (uint64_t)st.st_size, 0) : 0;
    if (n < 0)
        rc = (int)n;
    ft__sys.close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    return 0;
}

int ft__sel_load(ft__selector *sel, const char *path, const char *tag)
{
    char *text;
    int rc = read_profile(path, &text);
    if (rc < 0 || !text)
        return rc;
    rc = ft__sel_parse(sel, text, path, tag);
    free(text);
    return rc;
}

int ft__sel_parse(ft__selector *sel, char *text, const char *path, const char *tag)
{
    int rc = 0, lineno = 0;
    size_t count = 0, cap = 256;
    loaded *rows = malloc(cap * sizeof *rows);
    if (!rows)
        return ft__err(-ENOMEM, "profile");
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); rc == 0 && line;
         line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (lineno == 1) {
            if (strcmp(line, PROFILE_MAGIC) != 0)
                rc = ft__err(-EINVAL, "%s: not a version-1 fastensor profile", path);
            continue;
        }
        if (lineno == 2) {
            if (strncmp(line, "tag ", 4) != 0 || strcmp(line + 4, tag) != 0)
                rc = ft__err(-EINVAL, "%s: made for another machine or setup (%s, here: %s)",
                             path, strncmp(line, "tag ", 4) ? "no tag" : line + 4, tag);
            continue;
        }
        ft__sel_key k;
        unsigned v[8];
        int used = 0;
        if (sscanf(line, "%u %u %u %u %u %u %u %u%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7], &used) != 8 || v[0] > 1 || v[1] > 1 || v[2] >= FT__SEL_BUCKETS ||
            v[3] >= FT__SEL_CACHE || v[4] >= FT__SEL_BUSY || v[5] >= FT__SEL_CPU ||
            v[6] >= sel->narms || v[7] == 0 || v[7] > FT__SEL_WINDOW) {
            rc = ft__err(-EINVAL, "%s:%d: malformed line", path, lineno);
            break;
        }
        k = (ft__sel_key){(uint8_t)v[0], (uint8_t)v[1], (uint8_t)v[2], (uint8_t)v[3],
                          (uint8_t)v[4], (uint8_t)v[5]};
        if (count == cap) {
            loaded *more = realloc(rows, 2 * cap * sizeof *rows);
            if (!more) {
                rc = ft__err(-ENOMEM, "profile");
                break;
            }
            rows = more;
            cap *= 2;
        }
        loaded *r = &rows[count++];
        r->key = ft__sel_key_index(&k);
        r->arm = v[6];
        r->n = v[7];
        const char *p = line + used;
        for (unsigned i = 0; i < r->n && rc == 0; i++) {
            char *end;
            double t = strtod(p, &end);
            if (end == p || !(t > 0) || t > 1e15)
                rc = ft__err(-EINVAL, "%s:%d: bad throughput", path, lineno);
            r->tput[i] = (float)t;
            p = end;
        }
        if (rc == 0 && *p && *p != ' ')
            rc = ft__err(-EINVAL, "%s:%d: trailing garbage", path, lineno);
    }
    if (rc == 0 && lineno < 2)
        rc = ft__err(-EINVAL, "%s: truncated profile", path);
    for (size_t i = 0; rc == 0 && i < count; i++) { /* all good: take it */
        ft__sel_entry *e = ft__sel_entry_at(sel, rows[i].key, true);
        if (!e) {
            rc = ft__err(-ENOMEM, "profile");
            break;
        }
        pthread_mutex_lock(&e->lock);
        ft__sel_stats *st = &e->arm[rows[i].arm];
        /* As measured, not padded: an arm saved with fewer samples than exploring takes is
         * either eliminated already (then it stays so) or still a candidate, which use goes
         * on measuring. Padded to three copies of its median, one lucky sample (5.4 GB/s
         * for 1 GiB cold reads, from the development VM's host cache) held a key until three
         * calls at 0.34 GB/s outvoted it. */
        memcpy(st->tput, rows[i].tput, rows[i].n * sizeof(float));
        st->n = rows[i].n;
        ft__sel_stats_changed(st);
        pthread_mutex_unlock(&e->lock);
    }
    free(rows);
    return rc;
}
