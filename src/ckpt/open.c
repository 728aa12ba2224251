/* Opening checkpoints: a safetensors file, an index of shards, or a directory of either. */
#include "ckpt.h"
#include <fcntl.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../base/syscall.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int ft__slurp(ft_ctx *ctx, const char *path, uint64_t max, char **out, size_t *len)
{
    ft_file *f;
    int rc = ft_file_open(ctx, &f, path, FT_OPEN_READ, 0);
    if (rc < 0)
        return rc;
    int64_t size = ft_file_size(f);
    if (size >= 0 && (uint64_t)size > max)
        size = ft__err(-EFBIG, "%s: %lld bytes is over the %llu-byte limit", path,
                       (long long)size, (unsigned long long)max);
    char *buf = size >= 0 ? malloc((size_t)size + 1) : NULL;
    int64_t n = size;
    if (size >= 0 && !buf)
        n = ft__err(-ENOMEM, "%s", path);
    else if (buf) {
        ft_buf b = ft_host_buf(buf, (size_t)size);
        ft_io_opts o = ft__meta_io();
        n = ft_read(f, &b, 0, &o);
    }
    ft_file_close(f);
    if (n < 0 || n != size) {
        free(buf);
        return n < 0 ? (int)n : ft__err(-EIO, "%s changed while being read", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = (size_t)n;
    return 0;
}

/* What a file that is not safetensors is, by its first bytes: "" when nothing is known. */
static const char *foreign_kind(const uint8_t *head)
{
    if (!memcmp(head, "PK\x03\x04", 4))
        return " (a zip archive: torch.save's format; load it with torch.load)";
    if (head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
        return " (a Python pickle: an old torch.save or pickle file; load it with torch.load)";
    if (!memcmp(head, "\x93NUMPY", 6))
        return " (a numpy .npy file)";
    if (!memcmp(head, "GGUF", 4))
        return " (a GGUF file)";
    if (!memcmp(head, FT__FST_MAGIC, 8))
        return " (a fastensor .fst container: one opens alone, never as a shard of an index)";
    return "";
}

/* The header of a file already known to be at least 8 bytes long, whose first 8 bytes say
 * @p n: read and parsed into s->header. */
static int shard_parse(ft__shard *s, uint64_t n, int64_t size)
{
    if (n > FT__ST_HEADER_MAX)
        return ft__err(-EBADMSG, "%s: not a safetensors file: its first 8 bytes, read as "
                                 "safetensors' header length, say %llu, over the format's "
                                 "limit of %llu", s->path, (unsigned long long)n,
                       FT__ST_HEADER_MAX);
    if (n + 8 > (uint64_t)size)
        return ft__err(-EBADMSG, "%s: the file is truncated: its header needs %llu bytes, the "
                                 "file holds %lld", s->path, (unsigned long long)n + 8,
                       (long long)size);
    char *json = malloc(n ? (size_t)n : 1);
    if (!json)
        return ft__err(-ENOMEM, "%s: header", s->path);
    ft_buf b = ft_host_buf(json, (size_t)n);
    ft_io_opts o = ft__meta_io();
    int64_t r = ft_read(s->file, &b, 8, &o);
    int rc;
    if (r == (int64_t)n) {
        size_t len = (size_t)n; /* safetensors pads with spaces; JSON allows them anyway */
        s->data_start = 8 + n;
        s->data_size = (uint64_t)size - s->data_start;
        rc = ft__st_parse(json, len, s->data_size, s->path, &s->header);
    } else {
        rc = r < 0 ? (int)r : ft__err(-EIO, "%s: short header read", s->path);
    }
    free(json);
    return rc;
}

/* Open and parse shard @p s: a safetensors file, or where it is @p alone (no index lists
 * it), a .fst container too. */
static int shard_open(ft_ctx *ctx, ft__shard *s, bool alone)
{
    int rc = ft_file_open(ctx, &s->file, s->path, FT_OPEN_READ, 0);
    if (rc < 0)
        return rc;
    int64_t size = ft_file_size(s->file);
    if (size < 0)
        return (int)size;
    uint8_t le[8];
    ft_buf b = ft_host_buf(le, 8);
    ft_io_opts o = ft__meta_io();
    if (size < 8 || ft_read(s->file, &b, 0, &o) != 8)
        return ft__err(-EBADMSG, "%s: not a safetensors file (%lld bytes, shorter than the "
                                 "8-byte header length)", s->path, (long long)size);
    if (alone && !memcmp(le, FT__FST_MAGIC, 8))
        return ft__fst_open(s, size);
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--)
        n = n << 8 | le[k];
    /* The real parse decides; the first bytes only name what an invalid file is. A valid
     * header length can begin with any bytes (0x580 reads as a pickle's "80 05"). */
    rc = shard_parse(s, n, size);
    const char *kind = rc == -EBADMSG || rc == -EINVAL ? foreign_kind(le) : "";
    if (*kind)
        return ft__err(-EBADMSG, "%s: not a safetensors file%s", s->path, kind);
    return rc;
}

/* The directory part of @p path ("." when none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

/* A shard name from an index: relative, no "..", and resolving inside @p dir. */
static int shard_path(const char *index, const char *dir, const char *name, char **out)
{
    char *joined = NULL;
    if (asprintf(&joined, "%s/%s", dir, name) < 0)
        return ft__err(-ENOMEM, "%s", index);
    char real_dir[PATH_MAX], real_file[PATH_MAX];
    if (!realpath(dir, real_dir) || !realpath(joined, real_file)) {
        int e = -errno;
        free(joined);
        return ft__err(e, "%s: shard file '%s'", index, name);
    }
    size_t dl = strlen(real_dir);
    if (strncmp(real_file, real_dir, dl) != 0 || real_file[dl] != '/') {
        free(joined);
        return ft__err(-EINVAL, "%s: shard file '%s' leads outside the index's directory "
                                "(to %s)", index, name, real_file);
    }
    *out = joined;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int ft__index_read(ft_ctx *ctx, const char *path, ft__json_doc **root_out,
                   const char ***names_out, size_t *count)
{
    char *text = NULL;
    size_t len = 0;
    int rc = ft__slurp(ctx, path, FT__ST_HEADER_MAX, &text, &len);
    if (rc < 0)
        return rc;
    char err[200];
    ft__json_doc *doc;
    rc = ft__json_parse(text, len, &doc, err, sizeof err);
    free(text);
    if (rc == -ENOMEM)
        return ft__err(rc, "%s", path);
    if (rc < 0)
        return ft__err(rc, "%s: invalid index JSON at %s", path, err);
    const ft__json *root = ft__json_root(doc), *map = ft__json_get(root, "weight_map");
    if (ft__json_type(map) != FT__JSON_OBJECT || ft__json_len(map) == 0) {
        ft__json_free(doc);
        return ft__err(-EBADMSG, "%s: an index needs a non-empty \"weight_map\" object", path);
    }
    size_t n = ft__json_len(map), nfiles = 0;
    const char **files = calloc(n, sizeof *files);
    if (!files) {
        ft__json_free(doc);
        return ft__err(-ENOMEM, "%s", path);
    }
    const char *key;
    const ft__json *v;
    for (size_t i = 0; (key = ft__json_member(map, i, &v)); i++) {
        if (ft__json_type(v) != FT__JSON_STRING)
            rc = ft__err(-EBADMSG, "%s: weight_map entry '%s' is not a file name", path, key);
        else if (!ft__plain_name(ft__json_string(v), ft__json_len(v)))
            rc = ft__err(-EINVAL, "%s: shard file '%s' is not a plain file name inside the "
                                  "index's directory", path, ft__json_string(v));
        if (rc < 0)
            break;
        files[nfiles++] = ft__json_string(v);
    }
    if (rc < 0) {
        free(files);
        ft__json_free(doc);
        return rc;
    }
    qsort(files, nfiles, sizeof *files, cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < nfiles; i++)
        if (!distinct || strcmp(files[i], files[distinct - 1]) != 0)
            files[distinct++] = files[i];
    *root_out = doc;
    *names_out = files;
    *count = distinct;
    return 0;
}

/* Parse an index: fill c->shards with paths (sorted, distinct) and check the weight map
 * against the shards' contents once they are open. */
static int index_load(ft_ckpt *c, const char *path, ft__json_doc **map_out)
{
    ft__json_doc *root;
    const char **files;
    size_t nfiles;
    int rc = ft__index_read(c->ctx, path, &root, &files, &nfiles);
    if (rc < 0)
        return rc;
    c->shards = calloc(nfiles, sizeof *c->shards);
    char *dir = dir_of(path);
    if (!c->shards || !dir)
        rc = ft__err(-ENOMEM, "%s", path);
    for (size_t i = 0; rc == 0 && i < nfiles; i++) {
        rc = shard_path(path, dir, files[i], &c->shards[c->nshards].path);
        if (rc == 0)
            c->nshards++;
    }
    free(dir);
    free(files);
    if (rc < 0) {
        ft__json_free(root);
        return rc;
    }
    *map_out = root;
    return 0;
}

/* The weight map names exactly the tensors of the shards, each in the right file. */
static int index_check(const ft_ckpt *c, const char *path, const ft__json *root)
{
    const ft__json *map = ft__json_get(root, "weight_map");
    size_t seen = 0;
    for (unsigned k = 0; k < c->nshards; k++) {
        const ft__shard *s = &c->shards[k];
        const char *base = strrchr(s->path, '/');
        base = base ? base + 1 : s->path;
        for (size_t i = 0; i < s->header.ntensors; i++) {
            const char *name = s->header.tensors[i].name;
            const ft__json *v = ft__json_get(map, name);
            if (!v)
                return ft__err(-EBADMSG, "%s: tensor '%s' of %s is not in the weight map", path,
                               name, s->path);
            const char *want = ft__json_string(v), *slash = strrchr(want, '/');
            if (strcmp(slash ? slash + 1 : want, base) != 0)
                return ft__err(-EBADMSG, "%s: tensor '%s' is mapped to %s but stored in %s",
                               path, name, want, s->path);
            seen++;
        }
    }
    if (seen != ft__json_len(map))
        return ft__err(-EBADMSG, "%s: the weight map names %zu tensors, the shards hold %zu",
                       path, ft__json_len(map), seen);
    /* metadata.total_size, where given, is the tensors' bytes (Hugging Face's meaning). */
    const ft__json *total = ft__json_get(ft__json_get(root, "metadata"), "total_size");
    if (!total)
        return 0;
    uint64_t bytes = 0;
    for (unsigned k = 0; k < c->nshards; k++)
        for (size_t i = 0; i < c->shards[k].header.ntensors; i++)
            bytes += c->shards[k].header.tensors[i].end - c->shards[k].header.tensors[i].begin;
    if (ft__json_type(total) != FT__JSON_INT || ft__json_int_value(total) < 0)
        return ft__err(-EBADMSG, "%s: metadata.total_size is not a byte count (a "
                                 "non-negative integer)", path);
    if ((uint64_t)ft__json_int_value(total) != bytes)
        return ft__err(-EBADMSG, "%s: metadata.total_size says %lld bytes, the shards' "
                                 "tensors hold %llu (an index of another checkpoint?)", path,
                       (long long)ft__json_int_value(total), (unsigned long long)bytes);
    return 0;
}

/* A directory with both forms of one name (an index and the file it is named after): a save
 * of one form over the other was interrupted between its commit and its cleanup. Each is a
 * whole checkpoint; which one is meant, only the caller can say. */
static int refuse_both(const char *single, const char *index)
{
    struct stat a, b;
    const char *newer = ft__sys.stat(single, &a) == 0 && ft__sys.stat(index, &b) == 0 &&
                                a.st_mtim.tv_sec > b.st_mtim.tv_sec
                            ? single : index;
    return ft__err(-EINVAL, "two checkpoints under one name: %s and %s (a save was "
                            "interrupted; %s looks newer): open one by its path, or save "
                            "again to replace both", single, index, newer);
}

/* The file named like the index @p index, minus ".index.json" (NULL on ENOMEM). */
static char *single_of(const char *index)
{
    return strndup(index, strlen(index) - strlen(".index.json"));
}

/* A directory: its one index, else its one .safetensors file. */
static int pick_in_dir(const char *dir, char **out)
{
    DIR *d = ft__sys.opendir(dir);
    if (!d)
        return ft__err(-errno, "cannot list %s", dir);
    char *index = NULL, *single = NULL;
    int nindex = 0, nsingle = 0;
    struct dirent *e;
    size_t stem;
    int listed;
    while ((listed = ft__dir_next(d, &e)) > 0) {
        if (ft__generation_shard(e->d_name, &stem))
            continue; /* listed by an index, or left by a save that died */
        if (ends_with(e->d_name, ".safetensors.index.json") && ++nindex == 1)
            index = strdup(e->d_name);
        else if (ends_with(e->d_name, ".safetensors") && ++nsingle == 1)
            single = strdup(e->d_name);
    }
    ft__sys.closedir(d);
    int rc = 0;
    const char *pick = nindex == 1 ? index : nindex == 0 && nsingle == 1 ? single : NULL;
    if (listed < 0) /* a partial listing could pick the wrong checkpoint */
        rc = ft__err(listed, "cannot list %s: %s", dir, ft_strerror(listed));
    else if (nindex > 1 || (nindex == 0 && nsingle > 1))
        rc = ft__err(-EINVAL, "%s holds several checkpoints (%d indexes, %d files): name one",
                     dir, nindex, nsingle);
    else if (!pick)
        rc = ft__err(-ENOENT, "%s holds no .safetensors file or index", dir);
    else if (asprintf(out, "%s/%s", dir, pick) < 0)
        rc = ft__err(-ENOMEM, "%s", dir);
    char *also = rc == 0 && nindex == 1 ? single_of(*out) : NULL;
    struct stat st;
    if (also && ft__sys.stat(also, &st) == 0 && S_ISREG(st.st_mode))
        rc = refuse_both(also, *out);
    else if (also && errno != ENOENT)
        rc = ft__err(-errno, "cannot stat %s", also);
    if (rc < 0 && also) {
        free(*out);
        *out = NULL;
    }
    free(also);
    free(index);
    free(single);
    return rc;
}

static int by_name(const void *a, const void *b, void *arg)
{
    const ft_ckpt *c = arg;
    return strcmp(c->tensors[*(const size_t *)a]->name, c->tensors[*(const size_t *)b]->name);
}

/* Flatten the shards' tensors, index them by name, refuse names repeated across shards. */
static int ckpt_index(ft_ckpt *c)
{
    for (unsigned k = 0; k < c->nshards; k++)
        c->ntensors += c->shards[k].header.ntensors;
    c->tensors = calloc(c->ntensors + 1, sizeof *c->tensors);
    c->by_name = calloc(c->ntensors + 1, sizeof *c->by_name);
    if (!c->tensors || !c->by_name)
        return ft__err(-ENOMEM, "checkpoint index");
    size_t at = 0;
    for (unsigned k = 0; k < c->nshards; k++) {
        ft__shard *s = &c->shards[k];
        s->first = at;
        s->count = s->header.ntensors;
        for (size_t i = 0; i < s->count; i++) {
            s->header.tensors[i].shard = k;
            c->by_name[at] = at;
            c->tensors[at++] = &s->header.tensors[i];
        }
    }
    qsort_r(c->by_name, c->ntensors, sizeof *c->by_name, by_name, c);
    for (size_t i = 1; i < c->ntensors; i++)
        if (!strcmp(c->tensors[c->by_name[i]]->name, c->tensors[c->by_name[i - 1]]->name))
            return ft__err(-EBADMSG, "tensor '%s' appears in two shards",
                           c->tensors[c->by_name[i]]->name);
    c->meta = c->shards[0].header.meta;
    c->nmeta = c->shards[0].header.nmeta;
    return 0;
}

/* How many times ft_ckpt_open starts again over an index replaced while it was opened. */
#define FT__OPEN_TRIES 3

/* (one call site for both looks at an index: the fault sweep reaches it through the first) */
static int index_stat(const char *path, struct stat *st)
{
    return ft__sys.stat(path, st);
}

/* Whether the file at @p path is no longer the one @p was (renamed over, or removed). */
static bool index_replaced(const char *path, const struct stat *was)
{
    struct stat now;
    if (index_stat(path, &now) != 0)
        return errno == ENOENT;
    return now.st_ino != was->st_ino || now.st_dev != was->st_dev ||
           now.st_mtim.tv_sec != was->st_mtim.tv_sec ||
           now.st_mtim.tv_nsec != was->st_mtim.tv_nsec || now.st_size != was->st_size;
}

/* One try at opening @p path_in. Where it read an index, *index_out is its path (the
 * caller frees it) and *seen what the file was when it was read. */
static int open_once(ft_ctx *ctx, ft_ckpt **out, const char *path_in, char **index_out,
                     struct stat *seen)
{
    struct stat st;
    char *picked = NULL;
    int rc = 0;
    if (ft__sys.stat(path_in, &st) != 0) {
        /* The name a sharded save was given ("model.safetensors") opens its index. */
        int err = errno;
        if (err == ENOENT && asprintf(&picked, "%s.index.json", path_in) < 0)
            picked = NULL;
        if (!picked || ft__sys.stat(picked, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(picked);
            return ft__err(-err, "cannot open checkpoint %s", path_in);
        }
    }
    if (!picked && S_ISDIR(st.st_mode) && (rc = pick_in_dir(path_in, &picked)) < 0)
        return rc;
    const char *path = picked ? picked : path_in;
    ft_ckpt *c = calloc(1, sizeof *c);
    if (!c) {
        free(picked);
        return ft__err(-ENOMEM, "checkpoint");
    }
    c->ctx = ctx;
    ft__json_doc *index = NULL;
    int lock = -1;
    if (ends_with(path, ".index.json")) {
        char *dir = dir_of(path);
        if (!(*index_out = strdup(path)) || !dir)
            rc = ft__err(-ENOMEM, "checkpoint");
        else if ((rc = ft__commit_lock(dir, true, &lock)) < 0)
            ;
        else if (index_stat(path, seen) != 0)
            rc = ft__err(-errno, "cannot open checkpoint index %s", path);
        else
            rc = index_load(c, path, &index);
        free(dir);
    } else if (!(c->shards = calloc(1, sizeof *c->shards)) ||
               !(c->shards[0].path = strdup(path))) {
        rc = ft__err(-ENOMEM, "checkpoint");
    } else {
        c->nshards = 1;
    }
    for (unsigned k = 0; rc == 0 && k < c->nshards; k++)
        rc = shard_open(ctx, &c->shards[k], !index);
    ft__commit_unlock(lock); /* the descriptors hold this version from here on */
    if (rc == 0 && index)
        rc = index_check(c, path, ft__json_root(index));
    if (rc == 0)
        rc = ckpt_index(c);
    uint64_t total = 0; /* AUTO's cache policy weighs a shard with the whole checkpoint */
    for (unsigned k = 0; rc == 0 && k < c->nshards; k++)
        total += c->shards[k].data_size;
    for (unsigned k = 0; rc == 0 && k < c->nshards; k++)
        atomic_store_explicit(&c->shards[k].file->au->ws_hint, total, memory_order_relaxed);
    ft__json_free(index);
    free(picked);
    if (rc < 0) {
        FT__KEEPING_DETAIL(ft_ckpt_close(c));
        return rc;
    }
    *out = c;
    return 0;
}

int ft_ckpt_open(ft_ctx *ctx, ft_ckpt **out, const char *path_in)
{
    if (!ctx || !out || !path_in || !*path_in)
        return ft__err(-EINVAL, "ft_ckpt_open: missing context, output or path");
    /* Our saves wait for the open of an index's shards (the directory's commit lock, held
     * shared); a writer that does not (or a filesystem without flock) can install a new index
     * and remove the shards of the one just read before they are opened. Once open, the
     * descriptors hold that version: a vanished shard of an index that has changed since is
     * a replaced checkpoint, opened again. */
    for (int tries = 1;; tries++) {
        struct stat seen;
        char *index = NULL;
        int rc = open_once(ctx, out, path_in, &index, &seen);
        bool replaced = rc == -ENOENT && index && index_replaced(index, &seen);
        if (replaced && tries == FT__OPEN_TRIES)
            rc = ft__err(-ESTALE, "%s: the checkpoint was replaced by a save of the same name "
                                  "while it was being opened (%d times): open it again", index,
                         tries);
        free(index);
        if (!replaced || tries == FT__OPEN_TRIES)
            return rc;
    }
}

void ft_ckpt_close(ft_ckpt *c)
{
    if (!c)
        return;
    for (unsigned k = 0; c->shards && k < c->nshards; k++) {
        ft__shard *s = &c->shards[k];
        ft_file_close(s->file);
        ft__st_header_free(&s->header);
        free(s->path);
        free(s->owned_base);
    }
    free(c->shards);
    free(c->tensors);
    free(c->by_name);
    free(c);
}

size_t ft_ckpt_count(const ft_ckpt *c)
{
    return c ? c->ntensors : 0;
}

int ft_ckpt_info(const ft_ckpt *c, size_t i, ft_tensor_info *info)
{
    if (!c || i >= c->ntensors || !info)
        return -ERANGE;
    const ft__st_tensor *t = c->tensors[i];
    const ft__shard *s = &c->shards[t->shard];
    *info = (ft_tensor_info){.name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                             .shape = t->shape, .nbytes = t->end - t->begin,
                             .shard = t->shard, .data_offset = t->begin,
                             .file_offset = s->data_start +
                                            (s->fst ? t->stored_begin : t->begin)};
    return 0;
}

int ft_ckpt_format(const ft_ckpt *c)
{
    return !c ? -EINVAL : c->shards[0].fst ? FT_FORMAT_FST : FT_FORMAT_SAFETENSORS;
}

int ft_ckpt_stored(const ft_ckpt *c, size_t i, uint64_t *stored)
{
    if (!c || i >= c->ntensors)
        return -ERANGE;
    const ft__st_tensor *t = c->tensors[i];
    bool fst = c->shards[t->shard].fst;
    if (stored)
        *stored = fst ? t->stored_end - t->stored_begin : t->end - t->begin;
    return fst && t->coded;
}

int64_t ft_ckpt_find(const ft_ckpt *c, const char *name)
{
    if (!c || !name)
        return -EINVAL;
    size_t lo = 0, hi = c->ntensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int d = strcmp(c->tensors[c->by_name[mid]]->name, name);
        if (d == 0)
            return (int64_t)c->by_name[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -ENOENT;
}

size_t ft_ckpt_metadata_count(const ft_ckpt *c)
{
    return c ? c->nmeta : 0;
}

int ft_ckpt_metadata(const ft_ckpt *c, size_t i, const char **key, const char **value)
{
    if (!c || i >= c->nmeta)
        return -ERANGE;
    if (key)
        *key = c->meta[i].key;
    if (value)
        *value = c->meta[i].value;
    return 0;
}

unsigned ft_ckpt_shard_count(const ft_ckpt *c)
{
    return c ? c->nshards : 0;
}

int64_t ft_ckpt_shard_size(const ft_ckpt *c, unsigned k)
{
    return c && k < c->nshards ? (int64_t)c->shards[k].data_size : -ERANGE;
}

int64_t ft_ckpt_shard_data_start(const ft_ckpt *c, unsigned k)
{
    return c && k < c->nshards ? (int64_t)c->shards[k].data_start : -ERANGE;
}

const char *ft_ckpt_shard_path(const ft_ckpt *c, unsigned k)
{
    return c && k < c->nshards ? c->shards[k].path : NULL;
}

int ft_ckpt_shard_cached(const ft_ckpt *c, unsigned k)
{
    if (!c || k >= c->nshards)
        return -ERANGE;
    const ft__shard *s = &c->shards[k];
    uint64_t size = s->fst ? s->stored_size : s->data_size; /* the bytes in the file */
    return size && ft__file_cached(s->file, s->data_start, size);
}

int ft_ckpt_shard_fd(const ft_ckpt *c, unsigned k)
{
    return c && k < c->nshards ? c->shards[k].file->fd : -ERANGE;
}

int ft_ckpt_has_checksums(const ft_ckpt *c)
{
    for (unsigned k = 0; c && k < c->nshards; k++) /* a .fst's codec blocks carry theirs */
        if (!c->shards[k].header.csum_block && !c->shards[k].fst)
            return 0;
    return c && c->nshards > 0;
}

void ft__shard_tensors_in(const ft__shard *s, uint64_t from, uint64_t to, char *buf,
                          size_t len)
{
    const ft__st_header *h = &s->header;
    size_t n = 0, at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < h->ntensors; i++) {
        const ft__st_tensor *t = &h->tensors[i];
        if (t->end <= from || t->begin >= to || t->end == t->begin)
            continue;
        if (n++ < 4 && at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s'%s'", n > 1 ? ", " : "", t->name);
    }
    if (n == 1) {
        char one[FT__DETAIL_MAX];
        snprintf(one, sizeof one, "tensor %s", buf);
        snprintf(buf, len, "%s", one);
        return;
    }
    char tail[96];
    snprintf(tail, sizeof tail, n > 4 ? ", ... (%zu tensors share the block; it has no part "
                                        "checksums to tell which)"
                                      : " (%zu tensors share the block; it has no part "
                                        "checksums to tell which)", n);
    if (at < len)
        snprintf(buf + at, len - at, "%s", tail);
    if (n == 0)
        snprintf(buf, len, "no tensor (padding)");
    else if (n > 1) { /* "one of 'a', 'b' (...)" */
        char many[FT__DETAIL_MAX];
        snprintf(many, sizeof many, "one of %s", buf);
        snprintf(buf, len, "%s", many);
    }
}

const char *ft__shard_tensor_at(const ft__shard *s, uint64_t at)
{
    const ft__st_header *h = &s->header;
    size_t lo = 0, hi = h->ntensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->tensors[mid].end <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < h->ntensors ? h->tensors[lo].name : "(none)";
}
