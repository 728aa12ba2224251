/* Parse and validate safetensors headers (src/base/json.c), strictly: every failure is a
 * distinct, clear error naming the file and the tensor. */
#include "ckpt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ft__csum_encode(const uint64_t *csums, uint64_t n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (uint64_t i = 0; i < n; i++)
        for (int d = 0; d < 16; d++)
            hex[i * 16 + (uint64_t)d] = digits[(csums[i] >> (60 - 4 * d)) & 0xf];
}

int ft__csum_decode(const char *hex, size_t len, uint64_t *out, uint64_t n)
{
    if (len != n * 16)
        return -EBADMSG;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int d = 0; d < 16; d++) {
            char c = hex[i * 16 + (uint64_t)d];
            unsigned x = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                       : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16u;
            if (x > 15)
                return -EBADMSG;
            v = v << 4 | x;
        }
        out[i] = v;
    }
    return 0;
}

void ft__st_header_free(ft__st_header *h)
{
    for (size_t i = 0; i < h->ntensors; i++)
        free(h->tensors[i].name);
    for (size_t i = 0; i < h->nmeta; i++) {
        free(h->meta[i].key);
        free(h->meta[i].value);
    }
    free(h->tensors);
    free(h->meta);
    free(h->csums);
    free(h->parts);
    memset(h, 0, sizeof *h);
}

uint64_t ft__parts_layout(const ft__span *spans, size_t n, uint64_t block, uint64_t nblocks,
                          uint64_t *first)
{
    for (uint64_t b = 0; b < nblocks; b++)
        first[b] = 0; /* first counts the block's tensors until the second pass */
    for (size_t i = 0; i < n; i++)
        for (uint64_t b = spans[i].begin / block;
             spans[i].end > spans[i].begin && b <= (spans[i].end - 1) / block && b < nblocks; b++)
            first[b]++;
    uint64_t parts = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        uint64_t count = first[b];
        first[b] = count >= 2 ? parts : UINT64_MAX;
        parts += count >= 2 ? count : 0;
    }
    return parts;
}

/* "WHERE: invalid safetensors header: ..." (a .fst container's: "invalid .fst header"). */
static int bad_as(const char *format, const char *where, const char *fmt, const char *a,
                  const char *b)
{
    char msg[FT__DETAIL_MAX / 2];
    snprintf(msg, sizeof msg, fmt, a, b);
    return ft__err(-EBADMSG, "%s: invalid %s header: %s", where, format, msg);
}

static int bad(const char *where, const char *fmt, const char *a, const char *b)
{
    return bad_as("safetensors", where, fmt, a, b);
}

/* A non-negative JSON integer. */
static bool get_u64(const ft__json *v, uint64_t *out)
{
    int64_t x;
    if (!ft__json_int(v, &x) || x < 0)
        return false;
    *out = (uint64_t)x;
    return true;
}

int ft__st_entry(const char *name, const ft__json *v, size_t keys, const char *where,
                 ft__st_tensor *t)
{
    if (ft__json_type(v) != FT__JSON_OBJECT)
        return bad(where, "entry '%s' is not an object%s", name, "");
    if (ft__json_len(v) != keys)
        return bad(where, keys == 3 ? "entry '%s' must have exactly dtype, shape and "
                                      "data_offsets%s"
                                    : "entry '%s' must have dtype, shape, data_offsets, stored "
                                      "and compressed%s", name, "");
    const ft__json *dt = ft__json_get(v, "dtype"), *sh = ft__json_get(v, "shape"),
                 *off = ft__json_get(v, "data_offsets");
    if (ft__json_type(dt) != FT__JSON_STRING || ft__json_type(sh) != FT__JSON_ARRAY ||
        ft__json_type(off) != FT__JSON_ARRAY)
        return bad(where, "tensor '%s': dtype must be a string, shape and data_offsets arrays%s",
                   name, "");
    int d = ft_dtype_from_name(ft__json_string(dt));
    if (d < 0)
        return bad(where, "tensor '%s': unknown dtype '%s'", name, ft__json_string(dt));
    t->dtype = (ft_dtype)d;
    if (ft__json_len(sh) > FT_MAX_DIMS)
        return bad(where, "tensor '%s': more than 16 dimensions%s", name, "");
    t->ndim = (unsigned)ft__json_len(sh);
    for (unsigned i = 0; i < t->ndim; i++)
        if (!get_u64(ft__json_item(sh, i), &t->shape[i]))
            return bad(where, "tensor '%s': shape holds a value that is not a non-negative "
                              "integer%s", name, "");
    uint64_t bytes;
    int sized = ft__tensor_bytes(t->dtype, t->shape, t->ndim, &bytes);
    if (sized == -EDOM)
        return bad(where, "tensor '%s': %s elements do not fill whole bytes", name,
                   ft_dtype_name(t->dtype));
    if (sized < 0)
        return bad(where, "tensor '%s': byte size overflows 64 bits%s", name, "");
    if (ft__json_len(off) != 2 || !get_u64(ft__json_item(off, 0), &t->begin) ||
        !get_u64(ft__json_item(off, 1), &t->end))
        return bad(where, "tensor '%s': data_offsets must be two non-negative integers%s", name,
                   "");
    if (t->end < t->begin)
        return bad(where, "tensor '%s': data_offsets end before they begin%s", name, "");
    if (t->end - t->begin != bytes)
        return bad(where, "tensor '%s': shape x dtype size does not match data_offsets%s",
                   name, "");
    return 0;
}

static int parse_checksums(const ft__json *meta, uint64_t data_size, const char *where,
                           ft__st_header *h)
{
    const ft__json *algo = ft__json_get(meta, FT__META_CSUM_ALGO),
                 *blk = ft__json_get(meta, FT__META_CSUM_BLOCK),
                 *sums = ft__json_get(meta, FT__META_CSUMS);
    if (!algo && !blk && !sums)
        return 0;
    if (ft__json_type(algo) != FT__JSON_STRING ||
        strcmp(ft__json_string(algo), FT__CSUM_ALGO) != 0)
        return bad(where, "metadata %s is not \"%s\"", FT__META_CSUM_ALGO, FT__CSUM_ALGO);
    uint64_t block;
    if (ft__json_type(blk) != FT__JSON_STRING ||
        ft_parse_size(ft__json_string(blk), &block) < 0 || block < 4096 ||
        (block & (block - 1)) || ft__json_type(sums) != FT__JSON_STRING)
        return bad(where, "metadata %s / %s are malformed", FT__META_CSUM_BLOCK, FT__META_CSUMS);
    h->csum_block = block;
    h->ncsums = (data_size + block - 1) / block;
    h->csums = malloc((h->ncsums ? h->ncsums : 1) * sizeof *h->csums);
    if (!h->csums)
        return ft__err(-ENOMEM, "%s: checksums", where);
    if (ft__csum_decode(ft__json_string(sums), ft__json_len(sums), h->csums,
                        h->ncsums) < 0)
        return bad(where, "metadata %s does not hold one 16-digit hex value per block%s",
                   FT__META_CSUMS, "");
    return 0;
}

/* The part checksums, when present, once the tensors and blocks are known. */
static int parse_parts(const ft__json *meta, const char *where, ft__st_header *h)
{
    const ft__json *hex = ft__json_get(meta, FT__META_PARTS);
    if (!hex || !h->csum_block)
        return 0;
    ft__span *spans = malloc((h->ntensors + 1) * sizeof *spans);
    uint64_t *first = malloc((h->ncsums + 1) * sizeof *first);
    if (!spans || !first) {
        free(spans);
        free(first);
        return ft__err(-ENOMEM, "%s: checksums", where);
    }
    for (size_t i = 0; i < h->ntensors; i++)
        spans[i] = (ft__span){h->tensors[i].begin, h->tensors[i].end};
    uint64_t n = ft__parts_layout(spans, h->ntensors, h->csum_block, h->ncsums, first);
    free(spans);
    free(first);
    h->parts = malloc((n + 1) * sizeof *h->parts);
    if (!h->parts)
        return ft__err(-ENOMEM, "%s: checksums", where);
    h->nparts = n;
    if (ft__json_type(hex) != FT__JSON_STRING ||
        ft__csum_decode(ft__json_string(hex), ft__json_len(hex), h->parts, n) < 0)
        return bad(where, "metadata %s does not hold one 16-digit hex value per part%s",
                   FT__META_PARTS, "");
    return 0;
}

int ft__st_meta_parse(const ft__json *meta, const char *where, ft__st_header *h)
{
    if (ft__json_type(meta) != FT__JSON_OBJECT)
        return bad(where, "__metadata__ is not an object%s%s", "", "");
    h->meta = calloc(ft__json_len(meta) + 1, sizeof *h->meta);
    if (!h->meta)
        return ft__err(-ENOMEM, "%s: metadata", where);
    const char *key;
    const ft__json *v;
    for (size_t i = 0; (key = ft__json_member(meta, i, &v)); i++) {
        if (ft__json_type(v) != FT__JSON_STRING)
            return bad(where, "__metadata__ value of '%s' is not a string%s", key, "");
        if (strncmp(key, "fastensor.", 10) == 0)
            continue;
        ft__st_meta *m = &h->meta[h->nmeta++];
        if (!(m->key = strdup(key)) || !(m->value = strdup(ft__json_string(v))))
            return ft__err(-ENOMEM, "%s: metadata", where);
    }
    return 0;
}

static int parse_metadata(const ft__json *meta, uint64_t data_size, const char *where,
                          ft__st_header *h)
{
    int rc = ft__st_meta_parse(meta, where, h);
    if (rc == 0)
        rc = parse_checksums(meta, data_size, where, h);
    return rc < 0 ? rc : parse_parts(meta, where, h);
}

static int by_begin(const void *a, const void *b)
{
    const ft__st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

int ft__st_layout(ft__st_header *h, const char *format, const char *where, uint64_t *end)
{
    qsort(h->tensors, h->ntensors, sizeof *h->tensors, by_begin);
    uint64_t at = 0;
    for (size_t i = 0; i < h->ntensors; i++) {
        const ft__st_tensor *t = &h->tensors[i];
        if (t->begin > at)
            return bad_as(format, where, "a hole in the data before tensor '%s'%s", t->name, "");
        if (t->begin < at)
            return bad_as(format, where, "tensor '%s' overlaps tensor '%s'", t->name,
                          h->tensors[i - 1].name);
        at = t->end;
    }
    *end = at;
    return 0;
}

static int parse_root(const ft__json *root, uint64_t data_size, const char *where,
                      ft__st_header *h)
{
    if (ft__json_type(root) != FT__JSON_OBJECT)
        return bad(where, "the header is not a JSON object%s%s", "", "");
    h->tensors = calloc(ft__json_len(root) + 1, sizeof *h->tensors);
    if (!h->tensors)
        return ft__err(-ENOMEM, "%s: header", where);
    const char *key;
    const ft__json *v, *meta = NULL;
    int rc;
    for (size_t i = 0; (key = ft__json_member(root, i, &v)); i++) {
        if (strcmp(key, "__metadata__") == 0) {
            meta = v; /* parsed once the tensors say how large the data section is */
            continue;
        }
        ft__st_tensor *t = &h->tensors[h->ntensors];
        if ((rc = ft__st_entry(key, v, 3, where, t)) < 0)
            return rc;
        if (!(t->name = strdup(key)))
            return ft__err(-ENOMEM, "%s: header", where);
        h->ntensors++;
    }
    uint64_t at;
    if ((rc = ft__st_layout(h, "safetensors", where, &at)) < 0)
        return rc;
    if (at > data_size)
        return ft__err(-EBADMSG, "%s: the file is truncated: its header describes %llu bytes "
                                 "of tensor data, the file holds %llu (%llu missing)", where,
                       (unsigned long long)at, (unsigned long long)data_size,
                       (unsigned long long)(at - data_size));
    if (at != data_size) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%llu", (unsigned long long)at);
        snprintf(b, sizeof b, "%llu", (unsigned long long)data_size);
        return bad(where, "tensors cover %s bytes but the data section holds %s", a, b);
    }
    return meta ? parse_metadata(meta, data_size, where, h) : 0;
}

int ft__st_parse(const char *json, size_t len, uint64_t data_size, const char *where,
                 ft__st_header *out)
{
    memset(out, 0, sizeof *out);
    if (len == 0 || json[0] != '{')
        return bad(where, "the header does not start with '{'%s%s", "", "");
    if (!ft__utf8_valid(json, len))
        return bad(where, "the header is not valid UTF-8%s%s", "", "");
    char err[200];
    ft__json_doc *doc;
    int rc = ft__json_parse(json, len, &doc, err, sizeof err);
    if (rc == -ENOMEM)
        return ft__err(rc, "%s: header", where);
    if (rc < 0)
        return bad(where, "JSON error at %s%s", err, "");
    rc = parse_root(ft__json_root(doc), data_size, where, out);
    ft__json_free(doc);
    if (rc < 0)
        ft__st_header_free(out);
    return rc;
}
