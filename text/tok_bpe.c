/* tok_bpe: BPE with ranked merges, over bytes (byte-level BPE: GPT-2, Llama 3, Qwen) or over
 * UTF-8 characters with byte fallback (Hugging Face's SentencePiece-converted BPE: Gemma,
 * Llama 2 tokenizer.json).
 *
 * Within a word, the adjacent pair with the lowest merge rank is merged first (ties: leftmost),
 * as llama.cpp's llm_tokenizer_bpe_session and HF tokenizers' Word::merge_all do. Symbols live
 * in a doubly linked list over an array, candidates in a binary heap with lazy deletion, so a
 * word of n units costs O(n log n). Pairs are looked up by (left id, right id) in a hash table.
 * Words longer than a chunk are cut where no token contains the two units across the cut
 * (byte_join / joins): such a boundary is never merged across, so the chunks are independent. */
#include "tok_internal.h"
#include "../common/cm_err.h"

#define BPE_CHUNK 4096

static int try_pair(const tok_vocab *v, tok__scratch *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const tok__merge_slot *m = tok__merges_get(&v->merges, s->sym[l].id, s->sym[r].id);
    if (!m) return 0;
    return tok__heap_push(s, ((uint64_t)m->rank << 32) | (uint32_t)l, s->sym[l].len + s->sym[r].len, m->res);
}

int tok__bpe_merge(const tok_vocab *v, tok__scratch *s, size_t n) {
    int rc;
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        if ((rc = try_pair(v, s, (int32_t)i - 1, (int32_t)i))) return rc;
    while (s->heap_n) {
        tok__heap_ent top;
        tok__heap_pop(s, &top);
        int32_t li = (int32_t)(uint32_t)top.key;
        tok__sym *L = &s->sym[li];
        if (!L->len || L->next < 0) continue;
        tok__sym *R = &s->sym[L->next];
        if (L->len + R->len != top.size) continue; /* stale: one side changed since it was queued */
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0) s->sym[R->next].prev = li;
        L->id = top.id;
        if ((rc = try_pair(v, s, L->prev, li)) || (rc = try_pair(v, s, li, L->next))) return rc;
    }
    return 0;
}

/* ---- byte-level ------------------------------------------------------------------------- */

typedef struct bytes_ctx {
    const tok_vocab *v;
    tok__scratch    *s;
    const uint8_t   *text;
    tok__out        *o;
} bytes_ctx;

static void emit_bytes_sym(const tok_vocab *v, const uint8_t *p, size_t n, int32_t id, tok__out *o) {
    if (id >= 0 && id < v->n) { tok__emit(o, id); return; }
    /* a merge-only string or a byte missing from the vocabulary: one token per byte */
    for (size_t k = 0; k < n; k++) {
        int32_t b = v->byte_sym[p[k]];
        if (b >= 0 && b < v->n) tok__emit(o, b);
        else if (v->unk >= 0) tok__emit(o, v->unk);
    }
}

static int bytes_chunk(bytes_ctx *c, size_t a, size_t b) {
    const tok_vocab *v = c->v;
    tok__scratch *s = c->s;
    size_t n = b - a;
    int rc = tok__sym_reserve(s, n);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        tok__sym *y = &s->sym[i];
        y->start = (uint32_t)(a + i);
        y->len = 1;
        y->prev = (int32_t)i - 1;
        y->next = i + 1 < n ? (int32_t)i + 1 : -1;
        y->id = v->byte_sym[c->text[a + i]];
    }
    if ((rc = tok__bpe_merge(v, s, n))) return rc;
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        emit_bytes_sym(v, c->text + s->sym[i].start, s->sym[i].len, s->sym[i].id, c->o);
    return 0;
}

static int bytes_word(void *ctx, size_t a, size_t b) {
    bytes_ctx *c = ctx;
    const tok_vocab *v = c->v;
    size_t n = b - a;
    if (n == 1) {
        emit_bytes_sym(v, c->text + a, 1, v->byte_sym[c->text[a]], c->o);
        return 0;
    }
    if (v->ignore_merges && n <= (size_t)v->max_len) {
        int32_t id = tok__map_get(&v->piece_map, &v->piece, (const char *)c->text + a, n);
        if (id >= 0) { tok__emit(c->o, id); return 0; }
    }
    if (tok__cache_get(c->s, (const char *)c->text + a, n, c->o)) return 0;
    int64_t from = c->o->n;
    size_t a0 = a;
    while (a < b) {
        size_t e = b;
        if (b - a > BPE_CHUNK) {
            for (e = a + BPE_CHUNK; e < b && e - a < TOK__MAX_CHUNK; e++) {
                unsigned k = (unsigned)c->text[e - 1] << 8 | c->text[e];
                if (!(v->byte_join[k >> 3] & (1u << (k & 7)))) break;
            }
        }
        int rc = bytes_chunk(c, a, e);
        if (rc) return rc;
        a = e;
    }
    tok__cache_put(c->s, (const char *)c->text + a0, n, c->o, from);
    return 0;
}

int tok__bpe_bytes_encode(const tok_vocab *v, tok__scratch *s, const char *text, size_t len, tok__out *o) {
    if (v->bl_prefix && text[0] != ' ') {
        /* HF ByteLevel(add_prefix_space): the fragment is encoded as if it started with a space */
        int rc = tok__buf_reserve(s, len + 1);
        if (rc) return rc;
        s->buf[0] = ' ';
        memcpy(s->buf + 1, text, len);
        text = s->buf;
        len++;
    }
    bytes_ctx c = { v, s, (const uint8_t *)text, o };
    return tok__pretokenize(v->pre, (const uint8_t *)text, len, bytes_word, &c);
}

/* ---- characters with byte fallback -------------------------------------------------------- */

typedef struct chars_ctx {
    const tok_vocab *v;
    tok__scratch    *s;
    tok__out        *o;
} chars_ctx;

static int chars_chunk(chars_ctx *c, size_t a, size_t b) {
    const tok_vocab *v = c->v;
    tok__scratch *s = c->s;
    int rc = tok__sym_reserve(s, b - a);
    if (rc) return rc;
    const char *buf = s->buf;
    int32_t n = 0;
    for (size_t p = a; p < b;) {
        uint32_t l = (uint32_t)tok__utf8_len((uint8_t)buf[p]);
        if (p + l > b) l = (uint32_t)(b - p);
        int32_t id = tok__map_get(&v->text_map, &v->text, buf + p, l);
        if (id >= v->n) id = -1;
        int bytes_ok = v->byte_fallback;
        for (uint32_t k = 0; id < 0 && bytes_ok && k < l; k++) bytes_ok = v->byte_tok[(uint8_t)buf[p + k]] >= 0;
        if (id >= 0 || bytes_ok) {
            for (uint32_t k = 0; k < (id >= 0 ? 1u : l); k++) {
                tok__sym *y = &s->sym[n];
                y->start = (uint32_t)(p + k);
                y->len = id >= 0 ? l : 1;
                y->prev = n - 1;
                y->next = n + 1;
                y->id = id >= 0 ? id : v->byte_tok[(uint8_t)buf[p + k]];
                n++;
            }
        } else if (v->unk >= 0) {
            if (v->fuse_unk && n > 0 && s->sym[n - 1].id == v->unk) {
                s->sym[n - 1].len += l;
            } else {
                tok__sym *y = &s->sym[n];
                y->start = (uint32_t)p;
                y->len = l;
                y->prev = n - 1;
                y->next = n + 1;
                y->id = v->unk;
                n++;
            }
        } /* else: no way to represent the character; HF fails here, we drop it */
        p += l;
    }
    if (!n) return 0;
    s->sym[n - 1].next = -1;
    if ((rc = tok__bpe_merge(v, s, (size_t)n))) return rc;
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) {
        int32_t id = s->sym[i].id;
        if (id >= 0 && id < v->n) tok__emit(c->o, id);
        else if (v->unk >= 0) tok__emit(c->o, v->unk);
    }
    return 0;
}

static int chars_word(void *ctx, size_t a, size_t b) {
    chars_ctx *c = ctx;
    const tok_vocab *v = c->v;
    const uint8_t *buf = (const uint8_t *)c->s->buf;
    if (v->ignore_merges && b - a <= (size_t)v->max_len) {
        int32_t id = tok__map_get(&v->text_map, &v->text, (const char *)buf + a, b - a);
        if (id >= 0 && id < v->n) { tok__emit(c->o, id); return 0; }
    }
    while (a < b) {
        size_t e = tok__chars_cut(v, buf, a, b);
        if (!tok__cache_get(c->s, (const char *)buf + a, e - a, c->o)) {
            int64_t from = c->o->n;
            int rc = chars_chunk(c, a, e);
            if (rc) return rc;
            tok__cache_put(c->s, (const char *)buf + a, e - a, c->o, from);
        }
        a = e;
    }
    return 0;
}

int tok__bpe_chars_encode(const tok_vocab *v, tok__scratch *s, const char *text, size_t len, int first, tok__out *o) {
    int prefix = v->prefix == TOK__PREFIX_EACH || (v->prefix == TOK__PREFIX_FIRST && first);
    size_t spaces = 0;
    if (v->escape_spaces)
        for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t n = len + 2 * spaces + (prefix ? 3 : 0);
    if (n > UINT32_MAX - 8) return CM_ETOOBIG;
    int rc = tok__buf_reserve(s, n);
    if (rc) return rc;
    char *buf = s->buf;
    size_t w = 0;
    int starts = (len && text[0] == ' ' && v->escape_spaces) || (len >= 3 && !memcmp(text, "\xe2\x96\x81", 3));
    if (prefix && !(v->prefix_if_absent && starts)) { memcpy(buf, "\xe2\x96\x81", 3); w = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ' && v->escape_spaces) { memcpy(buf + w, "\xe2\x96\x81", 3); w += 3; }
        else buf[w++] = text[i];
    }
    chars_ctx c = { v, s, o };
    return tok__pretokenize(v->pre, (const uint8_t *)buf, w, chars_word, &c);
}
