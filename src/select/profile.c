/*
 * The selector's profile: a versioned text file, written atomically, tagged with what it
 * describes (filesystem device, GPU, arm table), so one never misleads another machine.
 *   fastensor-profile 2
 *   tag <text>
 *   <write> <mem> <bucket> <class> <busy> <arm label> <n> <bytes/s>...   (one line per key
 *                                                        and arm, oldest sample first)
 * Arms go by label, so a profile stays valid when arms are added (lines of an arm this build
 * lacks are skipped).
 */
#include "select.h"
#include "../base/syscall.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROFILE_MAGIC "fastensor-profile 2"

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
            const ft__sel_arm *st = &e->arm[a];
            if (!st->n)
                continue;
            unsigned n = FT__MIN(st->n, (uint32_t)FT__SEL_WINDOW);
            char num[16];
            snprintf(num, sizeof num, "#%u", a);
            fprintf(f, "%u %u %u %u %u %s %u", key.write, key.mem, key.bucket, key.cls,
                    key.busy, sel->labels ? sel->labels[a] : num, n);
            for (unsigned k = 0; k < n; k++) /* oldest first */
                fprintf(f, " %.6g", exp((double)st->lt[(st->n - n + k) % FT__SEL_WINDOW]));
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

/* The arm named @p label, sel->narms when there is none. */
static unsigned arm_of_label(const ft__selector *sel, const char *label)
{
    for (unsigned a = 0; a < sel->narms; a++) {
        char num[16];
        snprintf(num, sizeof num, "#%u", a);
        if (!strcmp(label, sel->labels ? sel->labels[a] : num))
            return a;
    }
    return sel->narms;
}

typedef struct loaded {
    unsigned key, arm, n;
    float lt[FT__SEL_WINDOW];
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
                rc = ft__err(-EINVAL, "%s: not a version-2 fastensor profile", path);
            continue;
        }
        if (lineno == 2) {
            if (strncmp(line, "tag ", 4) != 0 || strcmp(line + 4, tag) != 0)
                rc = ft__err(-EINVAL, "%s: made for another machine or setup (%s, here: %s)",
                             path, strncmp(line, "tag ", 4) ? "no tag" : line + 4, tag);
            continue;
        }
        ft__sel_key k;
        unsigned v[7];
        char label[64];
        int used = 0;
        if (sscanf(line, "%u %u %u %u %u %63s %u%n", &v[0], &v[1], &v[2], &v[3], &v[4], label,
                   &v[6], &used) != 7 || v[0] > 1 || v[1] > 1 || v[2] >= FT__SEL_BUCKETS ||
            v[3] >= FT__SEL_CLASSES || v[4] > 1 || v[6] == 0 || v[6] > FT__SEL_WINDOW) {
            rc = ft__err(-EINVAL, "%s:%d: malformed line", path, lineno);
            break;
        }
        if ((v[5] = arm_of_label(sel, label)) >= sel->narms)
            continue; /* an arm this build does not have */
        k = (ft__sel_key){(uint8_t)v[0], (uint8_t)v[1], (uint8_t)v[2], (uint8_t)v[3],
                          (uint8_t)v[4]};
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
        r->arm = v[5];
        r->n = v[6];
        const char *p = line + used;
        for (unsigned i = 0; i < r->n && rc == 0; i++) {
            char *end;
            double t = strtod(p, &end);
            if (end == p || !(t > 0) || t > 1e15)
                rc = ft__err(-EINVAL, "%s:%d: bad throughput", path, lineno);
            r->lt[i] = (float)log(t);
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
        ft__sel_arm *st = &e->arm[rows[i].arm];
        memcpy(st->lt, rows[i].lt, rows[i].n * sizeof(float)); /* as measured, not padded */
        st->n = rows[i].n;
        ft__sel_arm_changed(st);
        pthread_mutex_unlock(&e->lock);
    }
    free(rows);
    return rc;
}

/* A size bucket as text: 4K, 1M, 256M+ (the top bucket), ... */
static void size_name(unsigned bucket, char *out, size_t len)
{
    uint64_t b = 1ull << bucket;
    const char *more = bucket >= FT__SEL_BUCKET_TOP ? "+" : "";
    if (b >= (1u << 30))
        snprintf(out, len, "%lluG%s", (unsigned long long)(b >> 30), more);
    else if (b >= (1u << 20))
        snprintf(out, len, "%lluM%s", (unsigned long long)(b >> 20), more);
    else if (b >= 1024)
        snprintf(out, len, "%lluK", (unsigned long long)(b >> 10));
    else
        snprintf(out, len, "%llu", (unsigned long long)b);
}

void ft__sel_show(ft__selector *sel, FILE *out)
{
    char num[FT__SEL_MAX_ARMS][16];
    const char *labels[FT__SEL_MAX_ARMS];
    for (unsigned a = 0; a < sel->narms; a++) {
        snprintf(num[a], sizeof num[a], "#%u", a);
        labels[a] = sel->labels ? sel->labels[a] : num[a];
    }
    static const char *read_cls[] = {"cold", "cached", "stream"};
    static const char *write_cls[] = {"-", "sync", "later"};
    fprintf(out, "%-5s %-4s %7s %-6s %-4s  %-14s  %s\n", "op", "mem", "size", "class", "busy",
            "leader", "GB/s mean (samples) per arm");
    fprintf(out, "(class: reads \"cached\" in the page cache, \"stream\" uncached reads "
                 "continuing the previous one; writes \"sync\" synced by the call, \"later\" "
                 "synced by the caller later)\n");
    unsigned shown = 0;
    for (unsigned i = 0; i < FT__SEL_KEYS; i++) {
        ft__sel_entry *e = ft__sel_entry_at(sel, i, false);
        if (!e)
            continue;
        ft__sel_key key;
        ft__sel_key_decode(i, &key);
        pthread_mutex_lock(&e->lock);
        int lead = -1;
        for (unsigned a = 0; a < sel->narms; a++)
            if (e->arm[a].n && (lead < 0 || e->arm[a].mean > e->arm[lead].mean))
                lead = (int)a;
        if (lead >= 0) {
            char size[32];
            size_name(key.bucket, size, sizeof size);
            fprintf(out, "%-5s %-4s %7s %-6s %-4s  %-14s ", key.write ? "write" : "read",
                    key.mem ? "cuda" : "host", size,
                    key.write ? write_cls[key.cls] : read_cls[key.cls], key.busy ? "yes" : "no",
                    labels[lead]);
            for (unsigned a = 0; a < sel->narms; a++)
                if (e->arm[a].n)
                    fprintf(out, " %s=%.2f(%u)", labels[a], exp((double)e->arm[a].mean) / 1e9,
                            e->arm[a].n);
            fputc('\n', out);
            shown++;
        }
        pthread_mutex_unlock(&e->lock);
    }
    if (!shown)
        fprintf(out, "(empty: run `fastensor tune` or any transfers with engine auto)\n");
}
