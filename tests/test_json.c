/*
 * The JSON reader and writer (src/base/json.c): every value type and escape, objects small
 * and large (the sorted index), member order, strict errors with their positions (bad
 * tokens, numbers out of range, surrogates, NUL, control characters, invalid UTF-8,
 * duplicate keys, nesting limits, trailing text), and random strings and integers written,
 * read back byte for byte.
 */
#include "testlib.h"
#include "../src/base/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char err[256];

static const ft__json *parse(const char *text, ft__json_doc **doc)
{
    int rc = ft__json_parse(text, strlen(text), doc, err, sizeof err);
    return rc == 0 ? ft__json_root(*doc) : NULL;
}

static void case_values(void)
{
    ft__json_doc *doc;
    const char *text = " { \"i\" : -42 , \"big\": 9223372036854775807, \"small\": "
                       "-9223372036854775808, \"r\": -2.5e-3, \"t\": true, \"f\": false, "
                       "\"n\": null, \"s\": \"q\\\"b\\\\s\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\", "
                       "\"raw\": \"caf\xc3\xa9 \xe2\x82\xac\", \"a\": [1, [], {}, [2, [3]]], "
                       "\"e\": {}, \"z\": 0, \"mz\": -0 }\n";
    const ft__json *r = parse(text, &doc);
    if (!r)
        T_FAIL("parse: %s", err);
    T_EQ(ft__json_type(r), FT__JSON_OBJECT);
    T_EQ(ft__json_len(r), 13);
    T_EQ(ft__json_int_value(ft__json_get(r, "i")), -42);
    T_EQ(ft__json_int_value(ft__json_get(r, "big")), INT64_MAX);
    T_EQ(ft__json_int_value(ft__json_get(r, "small")), INT64_MIN);
    T_EQ(ft__json_type(ft__json_get(r, "r")), FT__JSON_REAL);
    T_EQ(ft__json_type(ft__json_get(r, "t")), FT__JSON_TRUE);
    T_EQ(ft__json_type(ft__json_get(r, "f")), FT__JSON_FALSE);
    T_EQ(ft__json_type(ft__json_get(r, "n")), FT__JSON_NULL);
    T_EQ(ft__json_type(ft__json_get(r, "missing")), FT__JSON_NONE);
    const char *want = "q\"b\\s/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80";
    const ft__json *s = ft__json_get(r, "s");
    T_EQ(ft__json_len(s), strlen(want));
    T_MEMEQ(ft__json_string(s), want, strlen(want) + 1);
    T_TRUE(strcmp(ft__json_string(ft__json_get(r, "raw")), "caf\xc3\xa9 \xe2\x82\xac") == 0);
    const ft__json *a = ft__json_get(r, "a");
    T_EQ(ft__json_len(a), 4);
    T_EQ(ft__json_int_value(ft__json_item(a, 0)), 1);
    T_EQ(ft__json_len(ft__json_item(a, 1)), 0);
    T_EQ(ft__json_type(ft__json_item(a, 2)), FT__JSON_OBJECT);
    T_EQ(ft__json_int_value(ft__json_item(ft__json_item(ft__json_item(a, 3), 1), 0)), 3);
    T_TRUE(ft__json_item(a, 4) == NULL);
    T_EQ(ft__json_int_value(ft__json_get(r, "mz")), 0);
    /* the wrong type answers as absent */
    int64_t x = 7;
    T_TRUE(!ft__json_int(ft__json_get(r, "s"), &x) && x == 7);
    T_TRUE(ft__json_string(ft__json_get(r, "i")) == NULL);
    T_TRUE(ft__json_get(a, "i") == NULL && ft__json_item(r, 0) == NULL);
    const ft__json *v;
    T_TRUE(ft__json_member(a, 0, &v) == NULL && v == NULL);
    /* members in the text's order */
    static const char *order[] = {"i", "big", "small", "r", "t", "f", "n", "s", "raw", "a",
                                  "e", "z", "mz"};
    for (size_t i = 0; i < 13; i++)
        T_TRUE(strcmp(ft__json_member(r, i, &v), order[i]) == 0 && v);
    ft__json_free(doc);
    /* any value at the top */
    T_TRUE(parse("  \"x\"  ", &doc) && ft__json_len(ft__json_root(doc)) == 1);
    ft__json_free(doc);
    T_TRUE(parse("12.5", &doc));
    ft__json_free(doc);
}

static void case_large_objects(void)
{
    /* 5000 members: lookups through the sorted index, order kept */
    ft__jw w = {0};
    ft__jw_raw(&w, "{");
    for (int i = 0; i < 5000; i++) {
        char key[32];
        snprintf(key, sizeof key, "layer.%d.weight", (i * 7919) % 5000);
        if (i)
            ft__jw_raw(&w, ",");
        ft__jw_str(&w, key, strlen(key));
        ft__jw_raw(&w, ":");
        ft__jw_int(&w, i);
    }
    ft__jw_raw(&w, "}");
    size_t len;
    char *text = ft__jw_done(&w, &len);
    T_TRUE(text != NULL);
    ft__json_doc *doc;
    int rc = ft__json_parse(text, len, &doc, err, sizeof err);
    if (rc < 0) {
        free(text);
        T_FAIL("parse: %s", err);
    }
    const ft__json *r = ft__json_root(doc), *v;
    T_EQ(ft__json_len(r), 5000);
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
        char key[32];
        snprintf(key, sizeof key, "layer.%d.weight", (i * 7919) % 5000);
        bad += ft__json_int_value(ft__json_get(r, key)) != i;
        bad += strcmp(ft__json_member(r, (size_t)i, &v), key) != 0;
    }
    T_EQ(bad, 0);
    T_TRUE(ft__json_get(r, "layer.5000.weight") == NULL && ft__json_get(r, "") == NULL);
    ft__json_free(doc);
    /* one duplicate among many keys */
    text[len - 1] = ',';
    char *dup = malloc(len + 64);
    if (!dup) {
        free(text);
        T_FAIL("out of memory");
    }
    snprintf(dup, len + 64, "%s\"layer.17.weight\":1}", text);
    rc = ft__json_parse(dup, strlen(dup), &doc, err, sizeof err);
    free(dup);
    free(text);
    T_EQ(rc, -EBADMSG);
    T_TRUE(strstr(err, "duplicate object key 'layer.17.weight'") != NULL);
}

static void case_errors(void)
{
    static const struct {
        const char *text;
        const char *expect;
    } cases[] = {
        {"", "the text ended"},
        {"   ", "the text ended"},
        {"{", "a string (an object key) expected"},
        {"{\"a\" 1}", "':' expected"},
        {"{\"a\":1,}", "a string (an object key) expected"},
        {"{\"a\":1 \"b\":2}", "',' or '}' expected"},
        {"[1,]", "invalid token"},
        {"[1 2]", "',' or ']' expected"},
        {"{1:2}", "a string (an object key) expected"},
        {"01", "leading zero"},
        {"-01", "leading zero"},
        {"1.", "digits must follow '.'"},
        {"1.e5", "digits must follow '.'"},
        {"1e", "digits must follow the exponent"},
        {"1e+", "digits must follow the exponent"},
        {"-", "invalid number"},
        {"+1", "invalid token"},
        {".5", "invalid token"},
        {"9223372036854775808", "int64 range"},
        {"-9223372036854775809", "int64 range"},
        {"123456789012345678901234567890", "int64 range"},
        {"1e400", "real number out of range"},
        {"-1e400", "real number out of range"},
        {"tru", "invalid token"},
        {"nul", "invalid token"},
        {"True", "invalid token"},
        {"NaN", "invalid token"},
        {"\"abc", "without its closing quote"},
        {"\"abc\\\"", "without its closing quote"},
        {"\"\\x\"", "invalid escape '\\x'"},
        {"\"\\u12\"", "four hex digits"},
        {"\"\\u12g4\"", "four hex digits"},
        {"\"\\ud800\"", "without its low one"},
        {"\"\\ud800\\u0041\"", "without its low one"},
        {"\"\\udc00\"", "low surrogate"},
        {"\"\\u0000\"", "\\u0000"},
        {"\"a\tb\"", "control character 0x09"},
        {"\"a\nb\"", "control character 0x0a"},
        {"\"\xc3\x28\"", "invalid UTF-8"},
        {"\"\xc0\xaf\"", "invalid UTF-8"},       /* overlong */
        {"\"\xed\xa0\x80\"", "invalid UTF-8"},   /* an encoded surrogate */
        {"\"\xf4\x90\x80\x80\"", "invalid UTF-8"}, /* past U+10FFFF */
        {"\"\xe2\x82\"", "invalid UTF-8"},       /* cut short */
        {"{\"a\":1,\"a\":2}", "duplicate object key 'a'"},
        {"{\"a\":1} x", "goes on after the value"},
        {"{} {}", "goes on after the value"},
        {"\xef\xbb\xbf{}", "invalid token"}, /* a byte order mark */
        {"{\"a\":\n  x}", "line 2 column 3: invalid token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ft__json_doc *doc = (ft__json_doc *)1;
        int rc = ft__json_parse(cases[i].text, strlen(cases[i].text), &doc, err, sizeof err);
        if (rc != -EBADMSG || doc != NULL)
            T_FAIL("case %zu (%s): rc %d, want -EBADMSG", i, cases[i].text, rc);
        if (!strstr(err, cases[i].expect))
            T_FAIL("case %zu (%s): error '%s', want '%s'", i, cases[i].text, err,
                   cases[i].expect);
    }
}

static void case_depth(void)
{
    size_t n = 2048;
    char *text = malloc(2 * n + 8);
    if (!text)
        T_FAIL("out of memory");
    memset(text, '[', n);
    memset(text + n, ']', n);
    ft__json_doc *doc;
    int rc = ft__json_parse(text, 2 * n, &doc, err, sizeof err);
    if (rc < 0) {
        free(text);
        T_FAIL("2048 levels: %s", err);
    }
    ft__json_free(doc);
    memset(text, '[', n + 1);
    memset(text + n + 1, ']', n + 1);
    rc = ft__json_parse(text, 2 * n + 2, &doc, err, sizeof err);
    free(text);
    T_EQ(rc, -EBADMSG);
    T_TRUE(strstr(err, "nested deeper than 2048 levels") != NULL);
    /* a million unclosed brackets: refused at the limit, not by the stack */
    n = 1 << 20;
    if (!(text = malloc(n)))
        T_FAIL("out of memory");
    memset(text, '[', n);
    rc = ft__json_parse(text, n, &doc, err, sizeof err);
    free(text);
    T_EQ(rc, -EBADMSG);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

/* A random UTF-8 string of about @p n code points (control characters, quotes, backslashes,
 * every plane), no NUL. */
static size_t random_utf8(char *out, size_t n)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        switch (next() % 5) {
        case 0: cp = 1 + (uint32_t)(next() % 0x7f); break;            /* ASCII, controls */
        case 1: cp = (uint32_t[]){'"', '\\', '/', '\b', '\n', 0x1f}[next() % 6]; break;
        case 2: cp = 0x80 + (uint32_t)(next() % (0x800 - 0x80)); break;
        case 3: cp = 0x800 + (uint32_t)(next() % (0xd800 - 0x800)); break;
        default: cp = 0x10000 + (uint32_t)(next() % (0x110000 - 0x10000)); break;
        }
        if (cp < 0x80) {
            out[len++] = (char)cp;
        } else if (cp < 0x800) {
            out[len++] = (char)(0xc0 | cp >> 6);
            out[len++] = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            out[len++] = (char)(0xe0 | cp >> 12);
            out[len++] = (char)(0x80 | (cp >> 6 & 0x3f));
            out[len++] = (char)(0x80 | (cp & 0x3f));
        } else {
            out[len++] = (char)(0xf0 | cp >> 18);
            out[len++] = (char)(0x80 | (cp >> 12 & 0x3f));
            out[len++] = (char)(0x80 | (cp >> 6 & 0x3f));
            out[len++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    out[len] = 0;
    return len;
}

static void case_write_read_back(void)
{
    enum { N = 300 };
    static char keys[N][4 * 40 + 8], vals[N][4 * 200 + 1];
    static size_t vlen[N];
    static int64_t ints[N];
    ft__jw w = {0};
    ft__jw_raw(&w, "{");
    for (int i = 0; i < N; i++) {
        size_t k = random_utf8(keys[i], 1 + next() % 40);
        snprintf(keys[i] + k, 8, "#%d", i); /* distinct */
        vlen[i] = random_utf8(vals[i], next() % 200);
        ints[i] = (int64_t)next();
        if (i % 7 == 0)
            ints[i] = i % 2 ? INT64_MIN : INT64_MAX;
        ft__jw_raw(&w, i ? "," : "");
        ft__jw_str(&w, keys[i], strlen(keys[i]));
        ft__jw_raw(&w, ":[");
        ft__jw_str(&w, vals[i], vlen[i]);
        ft__jw_raw(&w, ",");
        ft__jw_int(&w, ints[i]);
        ft__jw_raw(&w, "]");
    }
    ft__jw_raw(&w, "}");
    size_t len;
    char *text = ft__jw_done(&w, &len);
    T_TRUE(text != NULL && strlen(text) == len);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] < 0x20)
            T_FAIL("a control character written as it is at byte %zu", i);
    ft__json_doc *doc;
    int rc = ft__json_parse(text, len, &doc, err, sizeof err);
    free(text);
    if (rc < 0)
        T_FAIL("read back: %s", err);
    const ft__json *r = ft__json_root(doc), *v;
    T_EQ(ft__json_len(r), N);
    for (int i = 0; i < N; i++) {
        const char *key = ft__json_member(r, (size_t)i, &v);
        T_TRUE(key && strcmp(key, keys[i]) == 0);
        T_TRUE(ft__json_get(r, keys[i]) == v);
        const ft__json *s = ft__json_item(v, 0);
        T_EQ(ft__json_len(s), vlen[i]);
        T_MEMEQ(ft__json_string(s), vals[i], vlen[i]);
        T_EQ(ft__json_int_value(ft__json_item(v, 1)), ints[i]);
    }
    ft__json_free(doc);
    /* UTF-8 validation on its own */
    T_TRUE(ft__utf8_valid("", 0) && ft__utf8_valid("caf\xc3\xa9", 5));
    T_TRUE(!ft__utf8_valid("\xc3", 1) && !ft__utf8_valid("\xf8\x88\x80\x80\x80", 5));
}

int main(void)
{
    const t_case cases[] = {
        {"every value type, escape and accessor", case_values},
        {"large objects: sorted lookups, order, duplicates", case_large_objects},
        {"strict errors with their positions", case_errors},
        {"nesting limit", case_depth},
        {"random strings and integers written and read back", case_write_read_back},
    };
    return t_run(cases, sizeof cases / sizeof *cases);
}
