/* cm_json: a small, strict, bounded JSON reader for the executor side (config.json,
 * safetensors headers, model.safetensors.index.json). The gateway has cJSON; arka_core must
 * not depend on it, hence this module.
 *
 * Strict RFC 8259: one value with optional surrounding whitespace, no comments, no trailing
 * commas, no NaN/Infinity, no leading zeros, no control characters or invalid UTF-8 in
 * strings, escapes (including \u surrogate pairs) decoded to UTF-8. Nesting is capped at
 * CM_JSON_MAX_DEPTH. Memory is bounded by a small multiple of the input length (every node
 * consumes at least one input byte; decoded strings are never longer than their source), and
 * the caller bounds the input. Duplicate object keys are kept in document order; the lookups
 * return the first (callers that must refuse duplicates check for them).
 *
 *   cm_json_doc *d; char err[128];
 *   if (cm_json_parse(text, len, &d, err, sizeof err)) { fprintf(stderr, "config.json: %s\n", err); }
 *   int64_t n; if (cm_json_get_int(cm_json_root(d), "hidden_size", &n) == 0) ...
 *   for (const cm_json *c = cm_json_root(d)->child; c; c = c->next) printf("%s\n", c->key);
 *   cm_json_free(d);
 *
 * A parsed document is immutable: any number of threads may read it.
 */
#ifndef CM_JSON_H
#define CM_JSON_H

#include <stddef.h>
#include <stdint.h>

#define CM_JSON_MAX_DEPTH 64

enum cm_json_type { CM_JSON_NULL = 0, CM_JSON_BOOL, CM_JSON_NUMBER, CM_JSON_STRING, CM_JSON_ARRAY, CM_JSON_OBJECT };

typedef struct cm_json cm_json;
struct cm_json {
    int         type;    /* enum cm_json_type */
    const char *key;     /* member name (NUL-terminated) when the parent is an object, else NULL */
    size_t      key_len; /* bytes of key (a key may contain an escaped NUL) */
    const char *str;     /* STRING: decoded UTF-8, NUL-terminated */
    size_t      str_len;
    double      num;     /* NUMBER: value as double */
    int64_t     i;       /* NUMBER: exact value when is_int */
    int         is_int;  /* NUMBER written as an integer (no fraction/exponent) that fits int64 */
    int         boolean; /* BOOL */
    size_t      n;       /* ARRAY/OBJECT: number of children */
    cm_json    *child;   /* ARRAY/OBJECT: first child */
    cm_json    *next;    /* next sibling */
};

typedef struct cm_json_doc cm_json_doc;

/* Parses len bytes at text (need not be NUL-terminated). On success *out owns every node and
 * string; free it with cm_json_free(). On error returns CM_EFORMAT (or CM_ENOMEM) and writes
 * "line L, column C: problem" into err. Can be called from any thread. */
int  cm_json_parse(const char *text, size_t len, cm_json_doc **out, char *err, size_t errlen);
/* Frees the document and every node; accepts NULL. */
void cm_json_free(cm_json_doc *d);
const cm_json *cm_json_root(const cm_json_doc *d);

/* Member of an object by exact key (first match), or NULL (also when obj is not an object). */
const cm_json *cm_json_get(const cm_json *obj, const char *key);
/* Element i of an array, or NULL. O(i). */
const cm_json *cm_json_at(const cm_json *arr, size_t i);

/* Typed member getters: 0 on success, CM_ENOTFOUND when the key is absent or its value is
 * null, CM_EFORMAT when the value has another type (get_int: a number that is not an exact
 * integer). */
int cm_json_get_int(const cm_json *obj, const char *key, int64_t *out);
int cm_json_get_num(const cm_json *obj, const char *key, double *out);
int cm_json_get_bool(const cm_json *obj, const char *key, int *out);
int cm_json_get_str(const cm_json *obj, const char *key, const char **out);


#endif
