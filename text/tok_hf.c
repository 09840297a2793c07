/* tok_hf: tokenizers from Hugging Face tokenizer.json (+ tokenizer_config.json), and
 * tok_load_file.
 *
 * Supported: model BPE (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback,
 * fuse_unk, ignore_merges, unk_token); normalizers Replace(' ' -> '▁'), Prepend('▁'), NFC
 * (not applied: inputs are taken as already NFC), Sequence of these; pre-tokenizers ByteLevel
 * (use_regex: the GPT-2 pattern; add_prefix_space), Split with a Regex this module recognises
 * (GPT-2, Llama 3, Qwen2 patterns; behavior Isolated) mapped to the hand-written matchers of
 * tok_pre.c, Split(' ') after a Replace(' ' -> '▁') normalizer (a no-op), Metaspace('▁',
 * prepend_scheme always|first|never, split), Sequence of these; added_tokens (special ones
 * are CONTROL tokens, matched only with parse_special; the others USER_DEFINED, always
 * matched; lstrip, rstrip, single_word honoured; all matched on the raw text); post_processor
 * TemplateProcessing (its leading/trailing special tokens give BOS/EOS and add_bos/add_eos).
 * Anything else is a clear CM_EUNSUPPORTED error naming the construct. */
#include "tok_internal.h"
#include "../common/cm_err.h"
#include "../common/cm_file.h"
#include "../common/cm_json.h"
#include "../common/cm_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define HF_MAX_FILE ((size_t)512 << 20)
#define HF_MAX_ID (1 << 24)

static const char PAT_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char PAT_GPT2_SHORT[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3_ADAPTED[] = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct hf_state {
    const char *path;
    char       *err;
    size_t      errlen;
    /* from model */
    tok__strs   vocab;      /* entries in file order */
    int32_t    *vocab_id;   /* [vocab.n] */
    size_t      vocab_cap;
    tok__strs   merges;     /* 2 strings per merge */
    int         byte_fallback, fuse_unk, ignore_merges;
    char       *unk_token;
    /* from the pipeline */
    int         byte_level, pre, pre_set, escape, prefix, prefix_if_absent, bl_prefix;
} hf_state;

static int hf_fail(hf_state *h, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int hf_fail(hf_state *h, int rc, const char *fmt, ...) {
    if (h->err && h->errlen) {
        int n = snprintf(h->err, h->errlen, "%s: ", h->path);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < h->errlen) vsnprintf(h->err + n, h->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    return cm_file_read(path, HF_MAX_FILE, out, len, err, errlen);
}

/* ---- model ------------------------------------------------------------------------------ */

static int parse_vocab(hf_state *h, tok__tj *j, char **buf, size_t *cap) {
    int rc = tok__tj_obj_begin(j);
    if (rc) return rc;
    size_t len;
    for (int first = 1;; first = 0) {
        int more = tok__tj_obj_next(j, first, buf, cap, &len);
        if (more < 0) return more;
        if (!more) return 0;
        int64_t id;
        if ((rc = tok__tj_num(j, &id))) return rc;
        if (id < 0 || id >= HF_MAX_ID) return tok__tj_fail(j, "token id %lld out of range", (long long)id);
        int32_t k = tok__strs_add(&h->vocab, *buf, len);
        if (k < 0) return k;
        if ((size_t)k >= h->vocab_cap) {
            size_t nc = h->vocab_cap ? h->vocab_cap * 2 : 4096;
            int32_t *ni = realloc(h->vocab_id, nc * sizeof *ni);
            if (!ni) return CM_ENOMEM;
            h->vocab_id = ni;
            h->vocab_cap = nc;
        }
        h->vocab_id[k] = (int32_t)id;
    }
}

static int parse_merges(hf_state *h, tok__tj *j, char **buf, size_t *cap) {
    int rc = tok__tj_arr_begin(j);
    if (rc) return rc;
    size_t len;
    for (int first = 1;; first = 0) {
        int more = tok__tj_arr_next(j, first);
        if (more < 0) return more;
        if (!more) return 0;
        if (tok__tj_peek(j) == '"') {
            if ((rc = tok__tj_str(j, buf, cap, &len))) return rc;
            const char *sp = len > 1 ? memchr(*buf + 1, ' ', len - 1) : NULL;
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - *buf))) return tok__tj_fail(j, "merge \"%s\" is not two tokens", *buf);
            size_t na = (size_t)(sp - *buf);
            if ((rc = tok__strs_add(&h->merges, *buf, na)) < 0 || (rc = tok__strs_add(&h->merges, sp + 1, len - na - 1)) < 0) return rc;
        } else {
            if ((rc = tok__tj_arr_begin(j))) return rc;
            for (int k = 0; k < 2; k++) {
                if (tok__tj_arr_next(j, k == 0) != 1) return tok__tj_fail(j, "merge is not a pair");
                if ((rc = tok__tj_str(j, buf, cap, &len))) return rc;
                if ((rc = tok__strs_add(&h->merges, *buf, len)) < 0) return rc;
            }
            if (tok__tj_arr_next(j, 0) != 0) return tok__tj_fail(j, "merge is not a pair");
        }
    }
}

static int parse_model(hf_state *h, tok__tj *j) {
    char *buf = NULL, *key = NULL;
    size_t cap = 0, kcap = 0, len, klen;
    int rc = tok__tj_obj_begin(j), seen_type = 0;
    for (int first = 1; !rc; first = 0) {
        int more = tok__tj_obj_next(j, first, &key, &kcap, &klen);
        if (more <= 0) { rc = more; break; }
        int lit;
        if (!strcmp(key, "type")) {
            if ((rc = tok__tj_str(j, &buf, &cap, &len))) break;
            if (strcmp(buf, "BPE")) { rc = hf_fail(h, CM_EUNSUPPORTED, "model type %s is not supported (BPE is)", buf); break; }
            seen_type = 1;
        } else if (!strcmp(key, "vocab")) {
            rc = parse_vocab(h, j, &buf, &cap);
        } else if (!strcmp(key, "merges")) {
            rc = parse_merges(h, j, &buf, &cap);
        } else if (!strcmp(key, "byte_fallback") || !strcmp(key, "fuse_unk") || !strcmp(key, "ignore_merges")) {
            if ((rc = tok__tj_lit(j, &lit))) break;
            int on = lit == 1;
            if (key[0] == 'b') h->byte_fallback = on;
            else if (key[0] == 'f') h->fuse_unk = on;
            else h->ignore_merges = on;
        } else if (!strcmp(key, "unk_token") || !strcmp(key, "continuing_subword_prefix") || !strcmp(key, "end_of_word_suffix")) {
            if (tok__tj_peek(j) == 'n') { rc = tok__tj_lit(j, &lit); continue; }
            if ((rc = tok__tj_str(j, &buf, &cap, &len))) break;
            if (key[0] == 'u') {
                free(h->unk_token);
                if (!(h->unk_token = strdup(buf))) rc = CM_ENOMEM;
            } else if (len) {
                rc = hf_fail(h, CM_EUNSUPPORTED, "model.%s \"%s\" is not supported", key, buf);
            }
        } else if (!strcmp(key, "dropout")) {
            if (tok__tj_peek(j) == 'n') { rc = tok__tj_lit(j, &lit); continue; }
            const char *a = j->p;
            if ((rc = tok__tj_skip(j))) break;
            if (strtod(a, NULL) != 0.0) rc = hf_fail(h, CM_EUNSUPPORTED, "BPE dropout is not supported");
        } else {
            rc = tok__tj_skip(j);
        }
    }
    if (!rc && !seen_type) rc = hf_fail(h, CM_EUNSUPPORTED, "model has no type (BPE is supported)");
    free(buf);
    free(key);
    return rc;
}

/* ---- normalizer / pre-tokenizer --------------------------------------------------------- */

static const char *jstr(const cm_json *o, const char *key) {
    const char *s = NULL;
    return cm_json_get_str(o, key, &s) == 0 ? s : NULL;
}

static int is_sp(const char *s) { return s && !strcmp(s, "\xe2\x96\x81"); }

static int apply_normalizer(hf_state *h, const cm_json *n) {
    if (!n || n->type == CM_JSON_NULL) return 0;
    const char *t = jstr(n, "type");
    if (!t) return hf_fail(h, CM_EFORMAT, "normalizer without a type");
    if (!strcmp(t, "Sequence")) {
        const cm_json *list = cm_json_get(n, "normalizers");
        for (const cm_json *c = list ? list->child : NULL; c; c = c->next) {
            int rc = apply_normalizer(h, c);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(t, "Replace")) {
        const cm_json *pat = cm_json_get(n, "pattern");
        const char *from = pat ? jstr(pat, "String") : NULL, *to = jstr(n, "content");
        if (from && !strcmp(from, " ") && is_sp(to)) { h->escape = 1; return 0; }
        return hf_fail(h, CM_EUNSUPPORTED, "normalizer Replace(%s -> %s) is not supported", from ? from : "regex", to ? to : "?");
    }
    if (!strcmp(t, "Prepend")) {
        if (!is_sp(jstr(n, "prepend"))) return hf_fail(h, CM_EUNSUPPORTED, "normalizer Prepend of something else than '\xe2\x96\x81'");
        h->prefix = TOK__PREFIX_EACH;
        h->prefix_if_absent = 0;
        return 0;
    }
    if (!strcmp(t, "NFC")) {
        CM_LOG_DEBUG("tok", "NFC normalizer not applied (input taken as NFC)", "path=%s", h->path);
        return 0;
    }
    return hf_fail(h, CM_EUNSUPPORTED, "normalizer %s is not supported", t);
}

static int set_pre(hf_state *h, int pre, const char *what) {
    if (h->pre_set && h->pre != pre) return hf_fail(h, CM_EUNSUPPORTED, "pre-tokenizer %s after another splitting stage is not supported", what);
    h->pre = pre;
    h->pre_set = 1;
    return 0;
}

static int apply_pre(hf_state *h, const cm_json *p) {
    if (!p || p->type == CM_JSON_NULL) return 0;
    const char *t = jstr(p, "type");
    if (!t) return hf_fail(h, CM_EFORMAT, "pre_tokenizer without a type");
    int b;
    if (!strcmp(t, "Sequence")) {
        const cm_json *list = cm_json_get(p, "pretokenizers");
        for (const cm_json *c = list ? list->child : NULL; c; c = c->next) {
            int rc = apply_pre(h, c);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(t, "ByteLevel")) {
        h->byte_level = 1;
        if (cm_json_get_bool(p, "add_prefix_space", &b) == 0 && b) h->bl_prefix = 1;
        int use_regex = 1;
        cm_json_get_bool(p, "use_regex", &use_regex);
        return use_regex ? set_pre(h, TOK__PRE_GPT2, "ByteLevel(use_regex)") : 0;
    }
    if (!strcmp(t, "Split")) {
        const cm_json *pat = cm_json_get(p, "pattern");
        const char *re = pat ? jstr(pat, "Regex") : NULL, *str = pat ? jstr(pat, "String") : NULL;
        const char *beh = jstr(p, "behavior");
        int invert = 0;
        cm_json_get_bool(p, "invert", &invert);
        if (str && !strcmp(str, " ") && h->escape) return 0; /* spaces are gone after Replace(' ' -> '▁') */
        if (!re) return hf_fail(h, CM_EUNSUPPORTED, "Split on \"%s\" is not supported", str ? str : "?");
        if (!beh || strcmp(beh, "Isolated") || invert)
            return hf_fail(h, CM_EUNSUPPORTED, "Split behavior %s%s is not supported (Isolated is)", beh ? beh : "?", invert ? " inverted" : "");
        if (!strcmp(re, PAT_LLAMA3) || !strcmp(re, PAT_LLAMA3_ADAPTED)) return set_pre(h, TOK__PRE_LLAMA3, "Split");
        if (!strcmp(re, PAT_QWEN2)) return set_pre(h, TOK__PRE_QWEN2, "Split");
        if (!strcmp(re, PAT_GPT2) || !strcmp(re, PAT_GPT2_SHORT)) return set_pre(h, TOK__PRE_GPT2, "Split");
        return hf_fail(h, CM_EUNSUPPORTED, "Split regex is not one this tokenizer knows (GPT-2, Llama 3, Qwen2): %.200s", re);
    }
    if (!strcmp(t, "Metaspace")) {
        if (!is_sp(jstr(p, "replacement"))) return hf_fail(h, CM_EUNSUPPORTED, "Metaspace replacement other than '\xe2\x96\x81'");
        h->escape = 1;
        const char *scheme = jstr(p, "prepend_scheme");
        int add = 1;
        if (cm_json_get_bool(p, "add_prefix_space", &b) == 0) add = b;
        if (scheme) {
            if (!strcmp(scheme, "always")) h->prefix = TOK__PREFIX_EACH;
            else if (!strcmp(scheme, "first")) h->prefix = TOK__PREFIX_FIRST;
            else if (!strcmp(scheme, "never")) h->prefix = TOK__PREFIX_NONE;
            else return hf_fail(h, CM_EUNSUPPORTED, "Metaspace prepend_scheme %s", scheme);
        } else {
            h->prefix = add ? TOK__PREFIX_EACH : TOK__PREFIX_NONE;
        }
        h->prefix_if_absent = 1;
        int split = 1;
        cm_json_get_bool(p, "split", &split);
        return split ? set_pre(h, TOK__PRE_METASPACE, "Metaspace(split)") : 0;
    }
    return hf_fail(h, CM_EUNSUPPORTED, "pre_tokenizer %s is not supported", t);
}

/* ---- assembly --------------------------------------------------------------------------- */

typedef struct span { const char *p; size_t n; } span;

static int parse_span(hf_state *h, span s, const char *what, cm_json_doc **out) {
    *out = NULL;
    if (!s.p) return 0;
    char jerr[160];
    int rc = cm_json_parse(s.p, s.n, out, jerr, sizeof jerr);
    if (rc) return hf_fail(h, rc, "%s: %s", what, jerr);
    return 0;
}

/* "<s>" or {"content": "<s>", ...} or null */
static const char *token_name(const cm_json *o, const char *key) {
    const cm_json *t = cm_json_get(o, key);
    if (!t) return NULL;
    if (t->type == CM_JSON_STRING) return t->str;
    if (t->type == CM_JSON_OBJECT) return jstr(t, "content");
    return NULL;
}

static int32_t find_id(const tok_vocab *v, const char *s) {
    if (!s) return -1;
    int32_t id = tok__map_get(&v->text_map, &v->text, s, strlen(s));
    return id < v->n ? id : -1;
}

int tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, tok_vocab **out, char *err, size_t errlen) {
    if (!tokenizer_json || !out) return CM_EINVAL;
    *out = NULL;
    char *text = NULL, *ctext = NULL;
    size_t len = 0, clen = 0;
    int rc = read_file(tokenizer_json, &text, &len, err, errlen);
    if (rc) return rc;
    if (tokenizer_config && (rc = read_file(tokenizer_config, &ctext, &clen, err, errlen))) {
        free(text);
        return rc;
    }
    rc = tok_load_hf_mem(tokenizer_json, text, len, tokenizer_config, ctext, clen, out, err, errlen);
    free(text);
    free(ctext);
    return rc;
}

int tok_load_hf_mem(const char *name, const char *json, size_t json_len, const char *config_name, const char *config,
                    size_t config_len, tok_vocab **out, char *err, size_t errlen) {
    if (!name || (!json && json_len) || !out) return CM_EINVAL;
    *out = NULL;
    const char *tokenizer_json = name, *tokenizer_config = config ? (config_name ? config_name : "tokenizer_config.json") : NULL;
    hf_state h;
    memset(&h, 0, sizeof h);
    h.path = tokenizer_json;
    h.err = err;
    h.errlen = errlen;
    const char *text = json;
    size_t len = json_len;
    char *key = NULL;
    size_t kcap = 0, klen;
    tok_vocab *v = NULL;
    cm_json_doc *added = NULL, *norm = NULL, *pre = NULL, *post = NULL, *cfg = NULL;
    int32_t *n_of = NULL;
    int rc;

    /* top level: the model is read in place, the small parts go to cm_json */
    span s_added = { 0 }, s_norm = { 0 }, s_pre = { 0 }, s_post = { 0 };
    int have_model = 0;
    tok__tj j;
    char jerr[200] = "";
    tok__tj_init(&j, text, len, jerr, sizeof jerr);
    if ((rc = tok__tj_obj_begin(&j))) goto json_error;
    for (int first = 1;; first = 0) {
        int more = tok__tj_obj_next(&j, first, &key, &kcap, &klen);
        if (more < 0) { rc = more; goto json_error; }
        if (!more) break;
        span *sp = !strcmp(key, "added_tokens") ? &s_added : !strcmp(key, "normalizer") ? &s_norm
                 : !strcmp(key, "pre_tokenizer") ? &s_pre : !strcmp(key, "post_processor") ? &s_post : NULL;
        if (!strcmp(key, "model")) {
            if ((rc = parse_model(&h, &j))) {
                if (rc == CM_EFORMAT && j.failed) goto json_error;
                goto done;
            }
            have_model = 1;
            continue;
        }
        tok__tj_peek(&j);
        const char *a = j.p;
        if ((rc = tok__tj_skip(&j))) goto json_error;
        if (sp) { sp->p = a; sp->n = (size_t)(j.p - a); }
    }
    if (tok__tj_peek(&j) != -1) { rc = tok__tj_fail(&j, "trailing data"); goto json_error; }
    if (!have_model) { rc = hf_fail(&h, CM_EFORMAT, "no model"); goto done; }
    if ((rc = parse_span(&h, s_added, "added_tokens", &added)) || (rc = parse_span(&h, s_norm, "normalizer", &norm)) ||
        (rc = parse_span(&h, s_pre, "pre_tokenizer", &pre)) || (rc = parse_span(&h, s_post, "post_processor", &post)))
        goto done;
    if (tokenizer_config) {
        char cerr[160];
        rc = cm_json_parse(config, config_len, &cfg, cerr, sizeof cerr);
        if (rc) {
            snprintf(err, errlen, "%s: %s", tokenizer_config, cerr);
            goto done;
        }
        if (cm_json_root(cfg)->type != CM_JSON_OBJECT) {
            rc = CM_EFORMAT;
            snprintf(err, errlen, "%s: not an object", tokenizer_config);
            goto done;
        }
    }
    h.pre = TOK__PRE_NONE;
    if ((rc = apply_normalizer(&h, cm_json_root(norm))) || (rc = apply_pre(&h, cm_json_root(pre)))) goto done;
    if (h.byte_level && (h.escape || h.prefix)) {
        rc = hf_fail(&h, CM_EUNSUPPORTED, "ByteLevel mixed with '\xe2\x96\x81' handling is not supported");
        goto done;
    }

    /* vocabulary size: the largest id of vocab and added tokens */
    int64_t n = 0;
    for (int32_t i = 0; i < h.vocab.n; i++)
        if (h.vocab_id[i] + 1 > n) n = h.vocab_id[i] + 1;
    const cm_json *alist = cm_json_root(added);
    if (alist && alist->type != CM_JSON_ARRAY && alist->type != CM_JSON_NULL) {
        rc = hf_fail(&h, CM_EFORMAT, "added_tokens is not an array");
        goto done;
    }
    for (const cm_json *a = alist && alist->type == CM_JSON_ARRAY ? alist->child : NULL; a; a = a->next) {
        int64_t id;
        const char *content = jstr(a, "content");
        if (cm_json_get_int(a, "id", &id) || !content || id < 0 || id >= HF_MAX_ID) {
            rc = hf_fail(&h, CM_EFORMAT, "added token without a valid id and content");
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    if (n == 0) { rc = hf_fail(&h, CM_EFORMAT, "empty vocabulary"); goto done; }

    if ((rc = tok__vocab_new(&v))) goto done;
    v->n = (int)n;
    v->kind = h.byte_level ? TOK_KIND_BPE : TOK_KIND_SPM;
    v->algo = h.byte_level ? TOK__ALGO_BPE_BYTES : TOK__ALGO_BPE_CHARS;
    v->pre = h.pre;
    v->escape_spaces = h.escape;
    v->prefix = h.prefix;
    v->prefix_if_absent = h.prefix_if_absent;
    v->bl_prefix = h.bl_prefix;
    v->decode_user = !h.byte_level;
    v->byte_fallback = h.byte_fallback;
    v->fuse_unk = h.fuse_unk;
    v->ignore_merges = h.ignore_merges;
    v->type = malloc((size_t)n);
    n_of = malloc((size_t)n * sizeof *n_of); /* id -> index in h.vocab, or -1 */
    if (!v->type || !n_of) { rc = CM_ENOMEM; goto done; }
    for (int64_t i = 0; i < n; i++) { n_of[i] = -1; v->type[i] = TOK_TYPE_NORMAL; }
    for (int32_t i = 0; i < h.vocab.n; i++) n_of[h.vocab_id[i]] = i;
    /* added tokens override the text and type of their id */
    const char **added_text = calloc((size_t)n, sizeof *added_text);
    if (!added_text) { rc = CM_ENOMEM; goto done; }
    for (const cm_json *a = alist && alist->type == CM_JSON_ARRAY ? alist->child : NULL; a; a = a->next) {
        int64_t id;
        cm_json_get_int(a, "id", &id);
        int special = 0;
        cm_json_get_bool(a, "special", &special);
        added_text[id] = jstr(a, "content");
        v->type[id] = special ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *p = added_text[i];
        size_t pl = p ? strlen(p) : 0;
        if (!p && n_of[i] >= 0) { p = h.vocab.blob + h.vocab.off[n_of[i]]; pl = h.vocab.len[n_of[i]]; }
        if (!p) { p = ""; v->type[i] = TOK_TYPE_UNUSED; }
        if ((rc = tok__strs_add(&v->text, p, pl)) < 0) { free(added_text); goto done; }
        if (v->type[i] == TOK_TYPE_NORMAL && h.byte_fallback && pl == 6 && !memcmp(p, "<0x", 3) && p[5] == '>') v->type[i] = TOK_TYPE_BYTE;
    }
    free(added_text);
    rc = 0;
    if ((rc = tok__map_init(&v->text_map, (size_t)n + h.merges.n / 8 + 16))) goto done;
    /* HF: the vocab's own entry wins over an empty hole; the first id of a duplicate stays */
    for (int32_t i = 0; i < (int32_t)n; i++)
        if ((v->text.len[i] || v->type[i] != TOK_TYPE_UNUSED) && (rc = tok__map_put(&v->text_map, &v->text, i, 0))) goto done;

    if ((rc = tok__merges_reserve(v, (size_t)h.merges.n / 2 + 1))) goto done;
    for (int32_t m = 0; m + 1 < h.merges.n; m += 2) {
        rc = tok__add_merge(v, h.merges.blob + h.merges.off[m], h.merges.len[m], h.merges.blob + h.merges.off[m + 1],
                            h.merges.len[m + 1], (uint32_t)(m / 2), err, errlen);
        if (rc) {
            if (rc == CM_EFORMAT) hf_fail(&h, rc, "merge %d has an empty side", m / 2);
            goto done;
        }
    }

    /* special tokens and defaults: tokenizer_config.json first, then the post-processor */
    const cm_json *c = cfg ? cm_json_root(cfg) : NULL;
    v->unk = find_id(v, h.unk_token);
    if (c) {
        v->bos = find_id(v, token_name(c, "bos_token"));
        v->eos = find_id(v, token_name(c, "eos_token"));
        v->pad = find_id(v, token_name(c, "pad_token"));
        int32_t u = find_id(v, token_name(c, "unk_token"));
        if (u >= 0) v->unk = u;
    }
    int add_bos = -1, add_eos = -1, b;
    const cm_json *pp = cm_json_root(post);
    const char *ptype = pp ? jstr(pp, "type") : NULL;
    if (ptype && !strcmp(ptype, "TemplateProcessing")) {
        const cm_json *single = cm_json_get(pp, "single");
        const cm_json *firstp = single ? single->child : NULL, *lastp = firstp;
        while (lastp && lastp->next) lastp = lastp->next;
        const cm_json *fs = firstp ? cm_json_get(firstp, "SpecialToken") : NULL;
        const cm_json *ls = lastp && lastp != firstp ? cm_json_get(lastp, "SpecialToken") : NULL;
        add_bos = fs != NULL;
        add_eos = ls != NULL;
        if (fs && v->bos < 0) v->bos = find_id(v, jstr(fs, "id"));
        if (ls && v->eos < 0) v->eos = find_id(v, jstr(ls, "id"));
    } else if (ptype && strcmp(ptype, "ByteLevel")) {
        CM_LOG_WARN("tok", "post_processor not understood: no special tokens added", "path=%s type=%s", h.path, ptype);
    }
    if (c && cm_json_get_bool(c, "add_bos_token", &b) == 0) add_bos = b;
    if (c && cm_json_get_bool(c, "add_eos_token", &b) == 0) add_eos = b;
    v->add_bos = add_bos == 1 && v->bos >= 0;
    v->add_eos = add_eos == 1 && v->eos >= 0;
    if (v->unk >= 0 && v->type[v->unk] == TOK_TYPE_NORMAL) v->type[v->unk] = TOK_TYPE_UNKNOWN;

    if ((rc = tok__vocab_finish(v, err, errlen))) goto done;
    /* lstrip/rstrip/single_word of added tokens */
    for (const cm_json *a = alist && alist->type == CM_JSON_ARRAY ? alist->child : NULL; a; a = a->next) {
        int64_t id;
        cm_json_get_int(a, "id", &id);
        int ls = 0, rs = 0, sw = 0;
        cm_json_get_bool(a, "lstrip", &ls);
        cm_json_get_bool(a, "rstrip", &rs);
        cm_json_get_bool(a, "single_word", &sw);
        if (!(ls || rs || sw)) continue;
        const char *t = v->text.blob + v->text.off[id];
        int32_t cur = v->trie.root[(uint8_t)t[0]];
        for (size_t k = 1; cur >= 0 && k < v->text.len[id]; k++) {
            int32_t ch = v->trie.nodes[cur].child;
            while (ch >= 0 && v->trie.nodes[ch].byte != (uint8_t)t[k]) ch = v->trie.nodes[ch].sibling;
            cur = ch;
        }
        if (cur >= 0 && v->trie.nodes[cur].token == id)
            v->trie.nodes[cur].flags |= (uint8_t)((ls ? TOK__SP_LSTRIP : 0) | (rs ? TOK__SP_RSTRIP : 0) | (sw ? TOK__SP_SINGLE_WORD : 0));
    }
    *out = v;
    v = NULL;
    rc = 0;
    goto done;
json_error:
    snprintf(err, errlen, "%s: %s", tokenizer_json, jerr[0] ? jerr : "malformed JSON");
    if (rc != CM_ENOMEM) rc = CM_EFORMAT;
done:
    if (rc == CM_ENOMEM || (rc == CM_ETOOBIG && !(err && err[0]))) snprintf(err, errlen, "%s: %s", tokenizer_json, cm_err_str(rc));
    tok_free(v);
    free(n_of);
    cm_json_free(added);
    cm_json_free(norm);
    cm_json_free(pre);
    cm_json_free(post);
    cm_json_free(cfg);
    tok__strs_free(&h.vocab);
    tok__strs_free(&h.merges);
    free(h.vocab_id);
    free(h.unk_token);
    free(key);
    return rc;
}

int tok_load_file(const char *path, tok_vocab **out, char *err, size_t errlen) {
    if (!path || !out) return CM_EINVAL;
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: no such file or directory", path);
        return CM_ENOENT;
    }
    char json[4096], cfg[4096];
    if (S_ISDIR(st.st_mode)) {
        snprintf(json, sizeof json, "%s/tokenizer.json", path);
    } else {
        unsigned char magic[4] = { 0 };
        FILE *f = fopen(path, "rb");
        if (!f) {
            snprintf(err, errlen, "%s: cannot open", path);
            return CM_EIO;
        }
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && !memcmp(magic, "GGUF", 4)) {
            gguf_ctx *g;
            int rc = gguf_open(path, &g, err, errlen);
            if (rc) return rc;
            rc = tok_load_gguf(g, out, err, errlen);
            gguf_close(g);
            return rc;
        }
        snprintf(json, sizeof json, "%s", path);
    }
    /* the config sits next to tokenizer.json */
    snprintf(cfg, sizeof cfg, "%s", json);
    char *slash = strrchr(cfg, '/');
    size_t dirlen = slash ? (size_t)(slash - cfg + 1) : 0;
    snprintf(cfg + dirlen, sizeof cfg - dirlen, "tokenizer_config.json");
    return tok_load_hf(json, stat(cfg, &st) == 0 ? cfg : NULL, out, err, errlen);
}
