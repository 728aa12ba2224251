/*
 * JSON for safetensors headers and index files: a strict reader (RFC 8259: UTF-8, no
 * duplicate keys, no NUL in strings, integers within int64) into a read-only tree, and a
 * writer that appends to a growing string. The library's own code, so the wheel needs no
 * JSON library at run time.
 */
#ifndef FT_BASE_JSON_H
#define FT_BASE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    FT__JSON_NONE = 0, /* what the accessors report for a NULL value (a key not there) */
    FT__JSON_NULL,
    FT__JSON_FALSE,
    FT__JSON_TRUE,
    FT__JSON_INT,
    FT__JSON_REAL,
    FT__JSON_STRING,
    FT__JSON_ARRAY,
    FT__JSON_OBJECT,
};

typedef struct ft__json ft__json;
typedef struct ft__json_doc ft__json_doc;

/**
 * Parse @p len bytes of @p text. @return 0 and *out (free with ft__json_free), or -EBADMSG
 * with "line L column C: what" in @p err (@p errlen bytes), or -ENOMEM. Nesting deeper than
 * 2048 levels, text after the value, invalid UTF-8 and duplicate object keys are errors.
 */
int ft__json_parse(const char *text, size_t len, ft__json_doc **out, char *err, size_t errlen);
void ft__json_free(ft__json_doc *doc);
const ft__json *ft__json_root(const ft__json_doc *doc);

/* Accessors take NULL (an absent value) and answer as for a value of another type. */
int ft__json_type(const ft__json *v);
/** Items of an array, members of an object, bytes of a string; else 0. */
size_t ft__json_len(const ft__json *v);
/** Item @p i of an array (NULL past its end or for another type). */
const ft__json *ft__json_item(const ft__json *v, size_t i);
/** Member @p i of an object, in the text's order: its key, and its value in *val. */
const char *ft__json_member(const ft__json *v, size_t i, const ft__json **val);
/** The value of @p key in an object (NULL when not there or not an object). */
const ft__json *ft__json_get(const ft__json *v, const char *key);
/** A string's bytes, NUL-terminated (NULL for another type). */
const char *ft__json_string(const ft__json *v);
/** An integer's value in *out; false for another type. */
bool ft__json_int(const ft__json *v, int64_t *out);
/** An integer's value; 0 for another type. */
int64_t ft__json_int_value(const ft__json *v);

/** Whether @p len bytes of @p s are well-formed UTF-8 (no overlongs, surrogates or code
 * points past U+10FFFF). */
bool ft__utf8_valid(const char *s, size_t len);

/* The writer: appends; a failed allocation makes ft__jw_done return NULL. */
typedef struct {
    char *p;
    size_t len, cap;
    bool failed;
} ft__jw;

void ft__jw_raw(ft__jw *w, const char *s);
/** @p s (@p n bytes of UTF-8) as a JSON string: quoted, with '"', '\\' and control
 * characters escaped. */
void ft__jw_str(ft__jw *w, const char *s, size_t n);
void ft__jw_int(ft__jw *w, int64_t v);
/** The text written (NUL-terminated, for free()) and its length; NULL on ENOMEM. */
char *ft__jw_done(ft__jw *w, size_t *len);

#endif
