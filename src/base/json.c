/*
 * JSON reader and writer (see json.h). The reader is recursive descent over the text with
 * one arena per document: values, strings and member arrays are carved from it, and the
 * items of an array or object being read wait on one scratch stack until it closes, when
 * they are copied into the arena in one piece. Objects of more than SMALL_OBJECT members get
 * an index sorted by key: duplicate keys show up as neighbours, lookups bisect.
 */
#include "json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 2048
#define SMALL_OBJECT 16           /* members searched one by one up to this many */
#define CHUNK_BYTES (64u << 10)   /* arena chunks, at least */

typedef struct member member;

struct ft__json {
    int type;
    size_t n; /* items, members, or string bytes */
    union {
        int64_t i;
        double d;
        const char *s;
        ft__json *items;
        struct {
            member *m;
            const member **sorted; /* by key; NULL for small objects */
        } o;
    } u;
};

struct member {
    const char *key;
    ft__json v;
};

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[]; /* cap bytes */
} chunk;

struct ft__json_doc {
    chunk *chunks;
    ft__json root;
};

typedef struct {
    const char *s, *at, *end;
    ft__json_doc *doc;
    member *stack; /* items of the arrays and objects open now */
    size_t top, cap;
    char *err;
    size_t errlen;
    int rc;
} parser;

/* ---- arena ---- */

static void *arena(parser *p, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk *c = p->doc->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        if (!(c = malloc(sizeof *c + cap)))
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = p->doc->chunks;
        p->doc->chunks = c;
    }
    void *r = (unsigned char *)c->data + c->used;
    c->used += n;
    return r;
}

void ft__json_free(ft__json_doc *doc)
{
    if (!doc)
        return;
    for (chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc);
}

/* ---- errors ---- */

__attribute__((format(printf, 2, 3))) static int fail(parser *p, const char *fmt, ...)
{
    if (p->rc)
        return p->rc;
    unsigned line = 1, col = 1;
    for (const char *c = p->s; c < p->at; c++) {
        if (*c == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)*c & 0xc0) != 0x80) { /* characters, not bytes */
            col++;
        }
    }
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->errlen)
        snprintf(p->err, p->errlen, "line %u column %u: %s", line, col, what);
    return p->rc = -EBADMSG;
}

static int oom(parser *p)
{
    if (p->errlen)
        snprintf(p->err, p->errlen, "out of memory");
    return p->rc = -ENOMEM;
}

/* ---- UTF-8 ---- */

/* The length of the well-formed sequence at @p s (at most @p left bytes), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t left)
{
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || n > left)
        return 0;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1fu) : n == 3 ? (c & 0x0fu) : (c & 0x07u);
    for (size_t k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[k] & 0x3fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

bool ft__utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0, n; i < len; i += n)
        if (!(n = utf8_seq(s + i, len - i)))
            return false;
    return true;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- the reader ---- */

static void skip_ws(parser *p)
{
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r'))
        p->at++;
}

static int hex4(parser *p, uint32_t *out)
{
    if (p->end - p->at < 4)
        return fail(p, "a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->at[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return fail(p, "a \\u escape needs four hex digits");
        v = v << 4 | (uint32_t)d;
    }
    p->at += 4;
    *out = v;
    return 0;
}

/* A string at the opening quote: its bytes (in the arena, NUL-terminated) and length. */
static int read_string(parser *p, const char **out, size_t *outlen)
{
    const char *start = ++p->at, *q = start;
    while (q < p->end && *q != '"') /* the closing quote: escapes only shrink the text */
        q += *q == '\\' ? 2 : 1;
    if (q >= p->end)
        return fail(p, "a string without its closing quote");
    char *dst = arena(p, (size_t)(q - start) + 1);
    if (!dst)
        return oom(p);
    size_t n = 0;
    while (p->at < q) {
        unsigned char c = (unsigned char)*p->at;
        if (c == '\\') {
            char e = p->at[1];
            p->at += 2;
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *k = e ? strchr(from, e) : NULL;
            if (k) {
                dst[n++] = to[k - from];
                continue;
            }
            uint32_t cp, lo;
            int rc;
            if (e != 'u') {
                p->at -= 2;
                return fail(p, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
            }
            if ((rc = hex4(p, &cp)) < 0)
                return rc;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail(p, "a low surrogate \\u%04" PRIX32 " without its high one", cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (p->end - p->at < 2 || p->at[0] != '\\' || p->at[1] != 'u')
                    return fail(p, "a high surrogate \\u%04" PRIX32 " without its low one", cp);
                p->at += 2;
                if ((rc = hex4(p, &lo)) < 0)
                    return rc;
                if (lo < 0xdc00 || lo > 0xdfff)
                    return fail(p, "a high surrogate \\u%04" PRIX32 " without its low one", cp);
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0)
                return fail(p, "\\u0000 in a string");
            n += put_utf8(dst + n, cp);
        } else if (c < 0x20) {
            return fail(p, "control character 0x%02x in a string", c);
        } else {
            size_t k = utf8_seq((const unsigned char *)p->at, (size_t)(q - p->at));
            if (!k)
                return fail(p, "invalid UTF-8 in a string");
            memcpy(dst + n, p->at, k);
            n += k;
            p->at += k;
        }
    }
    p->at = q + 1;
    dst[n] = 0;
    *out = dst;
    *outlen = n;
    return 0;
}

static int read_number(parser *p, ft__json *v)
{
    const char *t = p->at;
    bool neg = t < p->end && *t == '-', real = false;
    if (neg)
        t++;
    if (t >= p->end || *t < '0' || *t > '9')
        return fail(p, "invalid number");
    if (*t == '0' && t + 1 < p->end && t[1] >= '0' && t[1] <= '9')
        return fail(p, "a number with a leading zero");
    while (t < p->end && *t >= '0' && *t <= '9')
        t++;
    if (t < p->end && *t == '.') {
        real = true;
        if (++t >= p->end || *t < '0' || *t > '9')
            return fail(p, "invalid number: digits must follow '.'");
        while (t < p->end && *t >= '0' && *t <= '9')
            t++;
    }
    if (t < p->end && (*t == 'e' || *t == 'E')) {
        real = true;
        if (++t < p->end && (*t == '+' || *t == '-'))
            t++;
        if (t >= p->end || *t < '0' || *t > '9')
            return fail(p, "invalid number: digits must follow the exponent");
        while (t < p->end && *t >= '0' && *t <= '9')
            t++;
    }
    if (!real) {
        uint64_t mag = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        for (const char *d = p->at + neg; d < t; d++) {
            unsigned digit = (unsigned)(*d - '0');
            if (mag > (lim - digit) / 10)
                return fail(p, "integer out of the int64 range");
            mag = mag * 10 + digit;
        }
        v->type = FT__JSON_INT;
        v->u.i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    } else {
        size_t n = (size_t)(t - p->at);
        char small[64], *buf = n < sizeof small ? small : malloc(n + 1);
        if (!buf)
            return oom(p);
        memcpy(buf, p->at, n);
        buf[n] = 0;
        double d = strtod(buf, NULL);
        if (buf != small)
            free(buf);
        if (!isfinite(d))
            return fail(p, "real number out of range");
        v->type = FT__JSON_REAL;
        v->u.d = d;
    }
    p->at = t;
    return 0;
}

static int by_key(const void *a, const void *b)
{
    return strcmp((*(const member *const *)a)->key, (*(const member *const *)b)->key);
}

static int push(parser *p)
{
    if (p->top == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        member *s = realloc(p->stack, cap * sizeof *s);
        if (!s)
            return oom(p);
        p->stack = s;
        p->cap = cap;
    }
    p->top++;
    return 0;
}

static int read_value(parser *p, ft__json *v, int depth);

/* The members waiting on the stack from @p base, as the object @p v. */
static int close_object(parser *p, ft__json *v, size_t base, const char *open)
{
    size_t n = p->top - base;
    member *m = arena(p, n * sizeof *m + 1);
    if (!m)
        return oom(p);
    if (n) /* (an empty object may come before anything was pushed: no stack yet) */
        memcpy(m, p->stack + base, n * sizeof *m);
    p->top = base;
    v->type = FT__JSON_OBJECT;
    v->n = n;
    v->u.o.m = m;
    v->u.o.sorted = NULL;
    const char *dup = NULL;
    if (n <= SMALL_OBJECT) {
        for (size_t i = 1; i < n && !dup; i++)
            for (size_t j = 0; j < i && !dup; j++)
                if (strcmp(m[i].key, m[j].key) == 0)
                    dup = m[i].key;
    } else {
        const member **s = arena(p, n * sizeof *s);
        if (!s)
            return oom(p);
        for (size_t i = 0; i < n; i++)
            s[i] = &m[i];
        qsort(s, n, sizeof *s, by_key);
        for (size_t i = 1; i < n && !dup; i++)
            if (strcmp(s[i - 1]->key, s[i]->key) == 0)
                dup = s[i]->key;
        v->u.o.sorted = s;
    }
    if (dup) {
        p->at = open;
        return fail(p, "duplicate object key '%.80s'", dup);
    }
    return 0;
}

static int read_object(parser *p, ft__json *v, int depth)
{
    const char *open = p->at++;
    size_t base = p->top;
    int rc;
    skip_ws(p);
    if (p->at < p->end && *p->at == '}') {
        p->at++;
        return close_object(p, v, base, open);
    }
    for (;;) {
        skip_ws(p);
        if (p->at >= p->end || *p->at != '"')
            return fail(p, "a string (an object key) expected");
        const char *key;
        size_t klen;
        if ((rc = read_string(p, &key, &klen)) < 0)
            return rc;
        skip_ws(p);
        if (p->at >= p->end || *p->at != ':')
            return fail(p, "':' expected after an object key");
        p->at++;
        if ((rc = push(p)) < 0)
            return rc;
        p->stack[p->top - 1].key = key;
        ft__json item;
        if ((rc = read_value(p, &item, depth + 1)) < 0)
            return rc;
        p->stack[p->top - 1].v = item; /* (nested values popped back to this one) */
        skip_ws(p);
        if (p->at < p->end && *p->at == ',') {
            p->at++;
            continue;
        }
        if (p->at < p->end && *p->at == '}') {
            p->at++;
            return close_object(p, v, base, open);
        }
        return fail(p, "',' or '}' expected");
    }
}

static int read_array(parser *p, ft__json *v, int depth)
{
    p->at++;
    size_t base = p->top;
    int rc;
    skip_ws(p);
    bool empty = p->at < p->end && *p->at == ']';
    if (empty)
        p->at++;
    while (!empty) {
        if ((rc = push(p)) < 0)
            return rc;
        ft__json item;
        if ((rc = read_value(p, &item, depth + 1)) < 0)
            return rc;
        p->stack[p->top - 1].v = item;
        skip_ws(p);
        if (p->at < p->end && *p->at == ',') {
            p->at++;
            continue;
        }
        if (p->at < p->end && *p->at == ']') {
            p->at++;
            break;
        }
        return fail(p, "',' or ']' expected");
    }
    size_t n = p->top - base;
    ft__json *items = arena(p, n * sizeof *items + 1);
    if (!items)
        return oom(p);
    for (size_t i = 0; i < n; i++)
        items[i] = p->stack[base + i].v;
    p->top = base;
    v->type = FT__JSON_ARRAY;
    v->n = n;
    v->u.items = items;
    return 0;
}

static bool word(parser *p, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(p->end - p->at) < n || memcmp(p->at, w, n) != 0)
        return false;
    p->at += n;
    return true;
}

static int read_value(parser *p, ft__json *v, int depth)
{
    memset(v, 0, sizeof *v);
    if (depth > MAX_DEPTH)
        return fail(p, "nested deeper than %d levels", MAX_DEPTH);
    skip_ws(p);
    if (p->at >= p->end)
        return fail(p, "a value expected, the text ended");
    switch (*p->at) {
    case '{':
        return read_object(p, v, depth);
    case '[':
        return read_array(p, v, depth);
    case '"':
        v->type = FT__JSON_STRING;
        return read_string(p, &v->u.s, &v->n);
    case 't':
        v->type = FT__JSON_TRUE;
        return word(p, "true") ? 0 : fail(p, "invalid token");
    case 'f':
        v->type = FT__JSON_FALSE;
        return word(p, "false") ? 0 : fail(p, "invalid token");
    case 'n':
        v->type = FT__JSON_NULL;
        return word(p, "null") ? 0 : fail(p, "invalid token");
    default:
        if (*p->at == '-' || (*p->at >= '0' && *p->at <= '9'))
            return read_number(p, v);
        return fail(p, "invalid token");
    }
}

int ft__json_parse(const char *text, size_t len, ft__json_doc **out, char *err, size_t errlen)
{
    *out = NULL;
    if (errlen)
        err[0] = 0;
    parser p = {.s = text, .at = text, .end = text + len, .err = err, .errlen = errlen};
    if (!(p.doc = calloc(1, sizeof *p.doc)))
        return -ENOMEM;
    int rc = read_value(&p, &p.doc->root, 1);
    if (rc == 0) {
        skip_ws(&p);
        if (p.at != p.end)
            rc = fail(&p, "the text goes on after the value");
    }
    free(p.stack);
    if (rc < 0) {
        ft__json_free(p.doc);
        return rc;
    }
    *out = p.doc;
    return 0;
}

/* ---- accessors ---- */

const ft__json *ft__json_root(const ft__json_doc *doc)
{
    return doc ? &doc->root : NULL;
}

int ft__json_type(const ft__json *v)
{
    return v ? v->type : FT__JSON_NONE;
}

size_t ft__json_len(const ft__json *v)
{
    return v && (v->type == FT__JSON_ARRAY || v->type == FT__JSON_OBJECT ||
                 v->type == FT__JSON_STRING) ? v->n : 0;
}

const ft__json *ft__json_item(const ft__json *v, size_t i)
{
    return v && v->type == FT__JSON_ARRAY && i < v->n ? &v->u.items[i] : NULL;
}

const char *ft__json_member(const ft__json *v, size_t i, const ft__json **val)
{
    if (!v || v->type != FT__JSON_OBJECT || i >= v->n) {
        *val = NULL;
        return NULL;
    }
    *val = &v->u.o.m[i].v;
    return v->u.o.m[i].key;
}

const ft__json *ft__json_get(const ft__json *v, const char *key)
{
    if (!v || v->type != FT__JSON_OBJECT)
        return NULL;
    if (!v->u.o.sorted) {
        for (size_t i = 0; i < v->n; i++)
            if (strcmp(v->u.o.m[i].key, key) == 0)
                return &v->u.o.m[i].v;
        return NULL;
    }
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v->u.o.sorted[mid]->key, key);
        if (c == 0)
            return &v->u.o.sorted[mid]->v;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *ft__json_string(const ft__json *v)
{
    return v && v->type == FT__JSON_STRING ? v->u.s : NULL;
}

bool ft__json_int(const ft__json *v, int64_t *out)
{
    if (!v || v->type != FT__JSON_INT)
        return false;
    *out = v->u.i;
    return true;
}

int64_t ft__json_int_value(const ft__json *v)
{
    int64_t x;
    return ft__json_int(v, &x) ? x : 0;
}

/* ---- the writer ---- */

static void put(ft__jw *w, const char *s, size_t n)
{
    if (w->failed)
        return;
    if (w->cap - w->len < n + 1) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len < n + 1)
            cap *= 2;
        char *p = realloc(w->p, cap);
        if (!p) {
            w->failed = true;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    if (n) /* (s may be NULL for nothing) */
        memcpy(w->p + w->len, s, n);
    w->len += n;
    w->p[w->len] = 0;
}

void ft__jw_raw(ft__jw *w, const char *s)
{
    put(w, s, strlen(s));
}

void ft__jw_str(ft__jw *w, const char *s, size_t n)
{
    put(w, "\"", 1);
    size_t run = 0; /* bytes copied as they are, waiting */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        put(w, s + i - run, run);
        run = 0;
        char esc[8];
        static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt";
        const char *k = c ? strchr(from, c) : NULL;
        if (k)
            snprintf(esc, sizeof esc, "\\%c", to[k - from]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", c);
        put(w, esc, strlen(esc));
    }
    put(w, s + n - run, run);
    put(w, "\"", 1);
}

void ft__jw_int(ft__jw *w, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    put(w, buf, strlen(buf));
}

char *ft__jw_done(ft__jw *w, size_t *len)
{
    if (w->failed || !w->p) {
        free(w->p);
        w->p = NULL;
        w->cap = w->len = 0;
        return NULL;
    }
    char *out = w->p;
    *len = w->len;
    w->p = NULL;
    w->cap = w->len = 0;
    return out;
}
