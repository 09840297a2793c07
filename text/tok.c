/* tok: vocabulary construction (shared by the GGUF and tokenizer.json loaders), the GGUF
 * loader, special-token partitioning, the encode driver and decoding. The merge algorithms live
 * in tok_spm.c and tok_bpe.c, the pre-tokenizers in tok_pre.c, tokenizer.json in tok_hf.c. */
#include "tok_internal.h"
#include "../common/cm_err.h"
#include "../common/cm_log.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define TOK_MAX_VOCAB (1 << 24)

/* ---- UTF-8 ------------------------------------------------------------------------------- */

int tok__utf8_enc(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t tok__utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        uint32_t min;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; min = 0x10000; }
        else return i;
        uint32_t cp = c & (need == 1 ? 0x1f : need == 2 ? 0x0f : 0x07);
        for (size_t k = 1; k <= need; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += need + 1;
    }
    return n;
}

/* ---- GPT-2 byte <-> unicode ---------------------------------------------------------------- */

static int byte_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t tok__byte_to_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33 + (b - 0x7F);
    return 256u + 67; /* 0xAD */
}

int tok__cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(0x7F + k - 33);
    return 0xAD;
}

/* ---- strings and maps ------------------------------------------------------------------ */

int tok__strs_add(tok__strs *s, const char *p, size_t n) {
    if (n > UINT32_MAX / 2 || s->n >= INT32_MAX - 1) return CM_ETOOBIG;
    if (s->n == s->ncap) {
        int32_t nc = s->ncap ? s->ncap * 2 : 1024;
        uint32_t *o = realloc(s->off, (size_t)nc * sizeof *o);
        if (!o) return CM_ENOMEM;
        s->off = o;
        uint32_t *l = realloc(s->len, (size_t)nc * sizeof *l);
        if (!l) return CM_ENOMEM;
        s->len = l;
        s->ncap = nc;
    }
    if (s->used + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 65536;
        while (nc < s->used + n + 1) nc *= 2;
        if (nc > UINT32_MAX) return CM_ETOOBIG;
        char *b = realloc(s->blob, nc);
        if (!b) return CM_ENOMEM;
        s->blob = b;
        s->cap = nc;
    }
    if (n) memcpy(s->blob + s->used, p, n);
    s->blob[s->used + n] = 0; /* every string is NUL-terminated too */
    s->off[s->n] = (uint32_t)s->used;
    s->len[s->n] = (uint32_t)n;
    s->used += n + 1;
    return s->n++;
}

void tok__strs_free(tok__strs *s) {
    free(s->blob);
    free(s->off);
    free(s->len);
    memset(s, 0, sizeof *s);
}

static inline void key16(const char *p, size_t n, uint64_t *k0, uint64_t *k1) {
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        memcpy(&a, p, 8);
        for (size_t i = 8; i < n; i++) b |= (uint64_t)(uint8_t)p[i] << (8 * (i - 8));
    } else {
        for (size_t i = 0; i < n; i++) a |= (uint64_t)(uint8_t)p[i] << (8 * i);
    }
    *k0 = a;
    *k1 = b;
}

static inline uint64_t hash16(uint64_t k0, uint64_t k1, size_t n) {
    return tok__hash64(k0 * 0x9E3779B97F4A7C15ull ^ tok__hash64(k1 + n));
}

static int alloc_tables(tok__map *m, size_t small_cap, size_t big_cap) {
    m->small = calloc(small_cap, sizeof *m->small);
    m->slots = calloc(big_cap, sizeof *m->slots);
    if (!m->small || !m->slots) {
        free(m->small);
        free(m->slots);
        m->small = NULL;
        m->slots = NULL;
        return CM_ENOMEM;
    }
    m->smask = small_cap - 1;
    m->mask = big_cap - 1;
    m->n_small = m->n_big = 0;
    return 0;
}

int tok__map_init(tok__map *m, size_t expected) {
    size_t cap = 64;
    while (cap < expected * 2 + 1) cap *= 2;
    return alloc_tables(m, cap, 64);
}

static void put_small(tok__map *m, uint64_t k0, uint64_t k1, uint32_t n, int32_t id, int replace) {
    for (uint64_t i = hash16(k0, k1, n) & m->smask;; i = (i + 1) & m->smask) {
        tok__sslot *sl = &m->small[i];
        if (!sl->len) {
            sl->k0 = k0;
            sl->k1 = k1;
            sl->len = n;
            sl->id = id;
            m->n_small++;
            return;
        }
        if (sl->k0 == k0 && sl->k1 == k1 && sl->len == n) {
            if (replace) sl->id = id;
            return;
        }
    }
}

static void put_big(tok__map *m, const tok__strs *s, int32_t id, int replace) {
    const char *p = s->blob + s->off[id];
    size_t n = s->len[id];
    uint64_t h = tok__hash(p, n), tag = h & 0xffffffff00000000ull;
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t v = m->slots[i];
        if (!v) { m->slots[i] = tag | ((uint64_t)id + 1); m->n_big++; return; }
        uint32_t o = (uint32_t)v - 1;
        if ((v & 0xffffffff00000000ull) == tag && s->len[o] == n && !memcmp(s->blob + s->off[o], p, n)) {
            if (replace) m->slots[i] = tag | ((uint64_t)id + 1);
            return;
        }
    }
}

/* Doubles whichever table is half full (entries keep their ids). */
static int map_grow(tok__map *m, const tok__strs *s) {
    tok__map nm = *m;
    size_t sc = m->smask + 1, bc = m->mask + 1;
    if ((m->n_small + 1) * 2 > sc) sc *= 2;
    if ((m->n_big + 1) * 2 > bc) bc *= 2;
    if (sc == m->smask + 1 && bc == m->mask + 1) return 0;
    if (alloc_tables(&nm, sc, bc)) return CM_ENOMEM;
    for (uint64_t i = 0; i <= m->smask; i++)
        if (m->small[i].len) put_small(&nm, m->small[i].k0, m->small[i].k1, m->small[i].len, m->small[i].id, 0);
    for (uint64_t i = 0; i <= m->mask; i++)
        if (m->slots[i]) put_big(&nm, s, (int32_t)(uint32_t)m->slots[i] - 1, 0);
    free(m->small);
    free(m->slots);
    *m = nm;
    return 0;
}

int tok__map_put(tok__map *m, const tok__strs *s, int32_t id, int replace) {
    if (map_grow(m, s)) return CM_ENOMEM;
    size_t n = s->len[id];
    if (n == 0) return 0; /* empty strings are never looked up */
    if (n <= 16) {
        uint64_t k0, k1;
        key16(s->blob + s->off[id], n, &k0, &k1);
        put_small(m, k0, k1, (uint32_t)n, id, replace);
    } else {
        put_big(m, s, id, replace);
    }
    return 0;
}

int32_t tok__map_get(const tok__map *m, const tok__strs *s, const char *p, size_t n) {
    if (!m->small || n == 0) return -1;
    if (n <= 16) {
        uint64_t k0, k1;
        key16(p, n, &k0, &k1);
        for (uint64_t i = hash16(k0, k1, n) & m->smask;; i = (i + 1) & m->smask) {
            const tok__sslot *sl = &m->small[i];
            if (!sl->len) return -1;
            if (sl->k0 == k0 && sl->k1 == k1 && sl->len == n) return sl->id;
        }
    }
    uint64_t h = tok__hash(p, n), tag = h & 0xffffffff00000000ull;
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint64_t v = m->slots[i];
        if (!v) return -1;
        uint32_t o = (uint32_t)v - 1;
        if ((v & 0xffffffff00000000ull) == tag && s->len[o] == n && !memcmp(s->blob + s->off[o], p, n)) return (int32_t)o;
    }
}

void tok__map_free(tok__map *m) {
    free(m->small);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- merges ------------------------------------------------------------------------------ */

int tok__merges_reserve(tok_vocab *v, size_t n) {
    size_t cap = 64;
    while (cap < n * 2 + 1) cap *= 2;
    tok__merge_slot *sl = malloc(cap * sizeof *sl);
    if (!sl) return CM_ENOMEM;
    for (size_t i = 0; i < cap; i++) sl[i].key = UINT64_MAX;
    free(v->merges.slots);
    v->merges.slots = sl;
    v->merges.mask = cap - 1;
    v->merges.n = 0;
    return 0;
}

static int32_t intern(tok_vocab *v, const char *p, size_t n) {
    int32_t id = tok__map_get(&v->text_map, &v->text, p, n);
    if (id >= 0) return id;
    id = tok__strs_add(&v->text, p, n);
    if (id < 0) return id;
    return tok__map_put(&v->text_map, &v->text, id, 0) ? CM_ENOMEM : id;
}

static int merges_insert(tok_vocab *v, int32_t ia, int32_t ib, uint32_t rank, int32_t ir) {
    if ((v->merges.n + 1) * 2 > v->merges.mask) {
        size_t cap = (v->merges.mask + 1) * 2;
        tok__merge_slot *sl = malloc(cap * sizeof *sl);
        if (!sl) return CM_ENOMEM;
        for (size_t i = 0; i < cap; i++) sl[i].key = UINT64_MAX;
        for (uint64_t i = 0; i <= v->merges.mask; i++) {
            if (v->merges.slots[i].key == UINT64_MAX) continue;
            uint64_t j = tok__hash64(v->merges.slots[i].key) & (cap - 1);
            while (sl[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
            sl[j] = v->merges.slots[i];
        }
        free(v->merges.slots);
        v->merges.slots = sl;
        v->merges.mask = cap - 1;
    }
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    uint64_t i = tok__hash64(key) & v->merges.mask;
    for (;; i = (i + 1) & v->merges.mask) {
        if (v->merges.slots[i].key == key) return 0; /* duplicate pair: the first (best) rank stays */
        if (v->merges.slots[i].key == UINT64_MAX) break;
    }
    v->merges.slots[i].key = key;
    v->merges.slots[i].rank = rank;
    v->merges.slots[i].res = ir;
    v->merges.n++;
    return 0;
}

int tok__add_merge(tok_vocab *v, const char *a, size_t na, const char *b, size_t nb, uint32_t rank, char *err, size_t errlen) {
    if (!na || !nb) {
        snprintf(err, errlen, "merge %u has an empty side", rank);
        return CM_EFORMAT;
    }
    int32_t ia = intern(v, a, na);
    if (ia < 0) return ia;
    int32_t ib = intern(v, b, nb);
    if (ib < 0) return ib;
    char stackbuf[256];
    char *cat = na + nb <= sizeof stackbuf ? stackbuf : malloc(na + nb);
    if (!cat) return CM_ENOMEM;
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    int32_t ir = intern(v, cat, na + nb);
    if (cat != stackbuf) free(cat);
    if (ir < 0) return ir;
    return merges_insert(v, ia, ib, rank, ir);
}

/* ---- special-token trie ----------------------------------------------------------------- */

static int32_t trie_node(tok__trie *t, uint8_t byte) {
    if (t->n == t->cap) {
        int32_t nc = t->cap ? t->cap * 2 : 256;
        tok__trie_node *nn = realloc(t->nodes, (size_t)nc * sizeof *nn);
        if (!nn) return CM_ENOMEM;
        t->nodes = nn;
        t->cap = nc;
    }
    tok__trie_node *nd = &t->nodes[t->n];
    nd->child = nd->sibling = nd->token = -1;
    nd->byte = byte;
    nd->flags = 0;
    return t->n++;
}

int tok__trie_add(tok__trie *t, const char *p, size_t n, int32_t token, uint8_t flags) {
    if (!n) return 0;
    const uint8_t *s = (const uint8_t *)p;
    int32_t cur = t->root[s[0]];
    if (cur < 0) {
        if ((cur = trie_node(t, s[0])) < 0) return cur;
        t->root[s[0]] = cur;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = t->nodes[cur].child, prev = -1;
        while (c >= 0 && t->nodes[c].byte != s[i]) { prev = c; c = t->nodes[c].sibling; }
        if (c < 0) {
            if ((c = trie_node(t, s[i])) < 0) return c;
            if (prev < 0) t->nodes[cur].child = c;
            else t->nodes[prev].sibling = c;
        }
        cur = c;
    }
    if (t->nodes[cur].token < 0) { /* the first token with a given text wins */
        t->nodes[cur].token = token;
        t->nodes[cur].flags = flags;
    }
    return 0;
}

static int is_word_char(uint32_t cp) { return cp == '_' || (tok__uflags(cp) & (TOK__U_L | TOK__U_N)); }

static uint32_t cp_before(const uint8_t *s, size_t i) {
    size_t j = i;
    while (j > 0 && (s[j - 1] & 0xC0) == 0x80 && i - j < 3) j--;
    if (j == 0) return UINT32_MAX;
    j--;
    int l;
    return tok__utf8_dec(s + j, i - j, &l);
}

/* Leftmost-longest special token in s[from..len). *ms..*me is what the token consumes
 * (lstrip/rstrip whitespace included, never before `from`); *ts is where its text starts. */
static int find_special(const tok_vocab *v, const uint8_t *s, size_t from, size_t len, int parse_special,
                        size_t *ms, size_t *me, int32_t *tok) {
    const tok__trie *t = &v->trie;
    for (size_t i = from; i < len; i++) {
        int32_t cur = t->root[s[i]];
        if (cur < 0) continue;
        int32_t best = -1;
        size_t best_end = 0;
        uint8_t best_flags = 0;
        for (size_t j = i;;) {
            const tok__trie_node *nd = &t->nodes[cur];
            if (nd->token >= 0 && (parse_special || !(nd->flags & TOK__SP_NEEDS_PARSE))) {
                int ok = 1;
                if (nd->flags & TOK__SP_SINGLE_WORD) {
                    int l;
                    if (i > 0 && is_word_char(cp_before(s, i))) ok = 0;
                    if (j + 1 < len && is_word_char(tok__utf8_dec(s + j + 1, len - j - 1, &l))) ok = 0;
                }
                if (ok) { best = nd->token; best_end = j + 1; best_flags = nd->flags; }
            }
            if (++j >= len) break;
            int32_t c = nd->child;
            while (c >= 0 && t->nodes[c].byte != s[j]) c = t->nodes[c].sibling;
            if (c < 0) break;
            cur = c;
        }
        if (best < 0) continue;
        size_t a = i, b = best_end;
        if (best_flags & TOK__SP_LSTRIP)
            while (a > from) {
                size_t k = a - 1;
                while (k > from && (s[k] & 0xC0) == 0x80) k--;
                int l;
                if (!(tok__uflags(tok__utf8_dec(s + k, len - k, &l)) & TOK__U_WS)) break;
                a = k;
            }
        if (best_flags & TOK__SP_RSTRIP)
            while (b < len) {
                int l;
                uint32_t cp = tok__utf8_dec(s + b, len - b, &l);
                if (!(tok__uflags(cp) & TOK__U_WS)) break;
                b += (size_t)l;
            }
        *ms = a;
        *me = b;
        *tok = best;
        return 1;
    }
    return 0;
}

/* ---- vocabulary assembly ---------------------------------------------------------------- */

int tok__vocab_new(tok_vocab **out) {
    tok_vocab *v = calloc(1, sizeof *v);
    if (!v) return CM_ENOMEM;
    v->bos = v->eos = v->eot = v->eom = v->unk = v->pad = -1;
    for (int i = 0; i < 256; i++) { v->byte_sym[i] = -1; v->byte_tok[i] = -1; v->trie.root[i] = -1; }
    *out = v;
    return 0;
}

void tok__eog_add(tok_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n || v->n_eog == TOK_EOG_MAX) return;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return;
    v->eog[v->n_eog++] = id;
}

static int pairset_add(tok__pairset *p, size_t *count, uint32_t a, uint32_t b) {
    if ((*count + 1) * 2 > p->mask) {
        size_t cap = p->mask ? (p->mask + 1) * 2 : 4096;
        uint64_t *k = calloc(cap, sizeof *k);
        if (!k) return CM_ENOMEM;
        for (uint64_t i = 0; p->keys && i <= p->mask; i++) {
            if (!p->keys[i]) continue;
            uint64_t j = tok__hash64(p->keys[i]) & (cap - 1);
            while (k[j]) j = (j + 1) & (cap - 1);
            k[j] = p->keys[i];
        }
        free(p->keys);
        p->keys = k;
        p->mask = cap - 1;
    }
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    uint64_t i = tok__hash64(key) & p->mask;
    for (; p->keys[i]; i = (i + 1) & p->mask)
        if (p->keys[i] == key) return 0;
    p->keys[i] = key;
    (*count)++;
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* <0xNN> -> NN, else -1 */
static int byte_token_value(const char *p, size_t n) {
    if (n != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    int h = hexval((unsigned char)p[3]), l = hexval((unsigned char)p[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<end_of_utterance>",
};

int tok__vocab_finish(tok_vocab *v, char *err, size_t errlen) {
    int rc;
    /* text map over the vocabulary (merge-only strings were interned as merges were added) */
    if (!v->text_map.slots) {
        if ((rc = tok__map_init(&v->text_map, (size_t)v->text.n))) return rc;
        for (int32_t i = 0; i < v->text.n; i++)
            if ((rc = tok__map_put(&v->text_map, &v->text, i, i < v->n))) return rc;
    }
    v->max_len = 0;
    for (int32_t i = 0; i < v->n; i++)
        if ((int)v->text.len[i] > v->max_len) v->max_len = (int)v->text.len[i];

    /* decoded pieces */
    char tmp[8];
    char *d = malloc((size_t)v->max_len + 1);
    if (!d) return CM_ENOMEM;
    uint8_t *pure = calloc((size_t)v->n, 1);
    if (!pure) { free(d); return CM_ENOMEM; }
    for (int32_t i = 0; i < v->n; i++) {
        const uint8_t *p = (const uint8_t *)v->text.blob + v->text.off[i];
        size_t n = v->text.len[i], w = 0;
        int ty = v->type[i], bv;
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || (ty == TOK_TYPE_USER_DEFINED && !v->decode_user)) {
            memcpy(d, p, n); /* special tokens decode to their text */
            w = n;
        } else if (v->algo != TOK__ALGO_BPE_BYTES && (bv = byte_token_value((const char *)p, n)) >= 0 &&
                   (ty == TOK_TYPE_BYTE || v->byte_fallback)) {
            d[w++] = (char)bv;
        } else if (v->algo == TOK__ALGO_BPE_BYTES) {
            pure[i] = 1;
            for (size_t k = 0; k < n;) {
                size_t l = (size_t)tok__utf8_len(p[k]);
                int b = -1;
                if (k + l <= n && tok__utf8_valid_prefix(p + k, l) == l) {
                    int dl;
                    b = tok__cp_to_byte(tok__utf8_dec(p + k, l, &dl));
                } else {
                    l = 1;
                }
                if (b >= 0) d[w++] = (char)b;
                else { memcpy(d + w, p + k, l); w += l; pure[i] = 0; }
                k += l;
            }
        } else {
            for (size_t k = 0; k < n;) {
                if (k + 3 <= n && !memcmp(p + k, "\xe2\x96\x81", 3)) { d[w++] = ' '; k += 3; }
                else d[w++] = (char)p[k++];
            }
        }
        if ((rc = tok__strs_add(&v->piece, d, w)) < 0) { free(d); free(pure); return rc; }
    }
    free(d);

    if (v->algo == TOK__ALGO_BPE_BYTES) {
        int missing = 0, first_missing = -1;
        for (int b = 0; b < 256; b++) {
            int l = tok__utf8_enc(tok__byte_to_cp((uint8_t)b), tmp);
            v->byte_sym[b] = tok__map_get(&v->text_map, &v->text, tmp, (size_t)l);
            if (v->byte_sym[b] < 0 && !missing++) first_missing = b;
        }
        if (missing) /* such bytes encode as <unk>, or not at all without one (as llama.cpp) */
            CM_LOG_WARN("tok", "byte-level vocabulary lacks bytes", "missing=%d first=0x%02x", missing, first_missing);
        if ((rc = tok__map_init(&v->piece_map, (size_t)v->n))) goto done;
        /* NORMAL tokens first so that they win over special tokens with the same bytes */
        for (int pass = 0; pass < 2; pass++)
            for (int32_t i = 0; i < v->n; i++) {
                int normal = v->type[i] == TOK_TYPE_NORMAL;
                if (normal != (pass == 0) || !v->piece.len[i] || !pure[i]) continue;
                if ((rc = tok__map_put(&v->piece_map, &v->piece, i, 0))) goto done;
            }
        v->byte_join = calloc(65536 / 8, 1);
        if (!v->byte_join) { rc = CM_ENOMEM; goto done; }
        for (int32_t i = 0; i < v->text.n; i++) {
            const uint8_t *p = (const uint8_t *)v->text.blob + v->text.off[i];
            size_t n = v->text.len[i];
            if (tok__utf8_valid_prefix(p, n) != n) continue;
            int prev = -1;
            for (size_t k = 0; k < n;) {
                int l;
                int b = tok__cp_to_byte(tok__utf8_dec(p + k, n - k, &l));
                k += (size_t)l;
                if (b < 0) { prev = -1; continue; }
                if (prev >= 0) v->byte_join[(prev << 8 | b) >> 3] |= (uint8_t)(1u << ((prev << 8 | b) & 7));
                prev = b;
            }
        }
    } else {
        for (int b = 0; b < 256; b++) {
            snprintf(tmp, sizeof tmp, "<0x%02X>", b);
            v->byte_tok[b] = tok__map_get(&v->text_map, &v->text, tmp, 6);
            if (v->byte_tok[b] >= v->n) v->byte_tok[b] = -1;
        }
        size_t count = 0;
        for (int32_t i = 0; i < v->text.n; i++) {
            const uint8_t *p = (const uint8_t *)v->text.blob + v->text.off[i];
            size_t n = v->text.len[i];
            uint32_t prev = UINT32_MAX;
            for (size_t k = 0; k < n;) {
                int l;
                uint32_t cp;
                size_t ul = (size_t)tok__utf8_len(p[k]);
                if (k + ul <= n && tok__utf8_valid_prefix(p + k, ul) == ul) {
                    cp = tok__utf8_dec(p + k, n - k, &l);
                } else {
                    cp = 0x110000u + p[k]; /* invalid byte: a unit of its own that never matches text */
                    l = 1;
                }
                k += (size_t)l;
                if (prev != UINT32_MAX && (rc = pairset_add(&v->joins, &count, prev, cp))) goto done;
                prev = cp;
            }
        }
        if (!v->joins.keys && (rc = pairset_add(&v->joins, &count, 0x110001u, 0x110001u))) goto done;
        if (v->algo == TOK__ALGO_SPM) {
            /* every split of a token into two tokens: (left id, right id) -> the concatenation,
             * ranked by score, so that a bigram is one probe instead of a string lookup */
            if ((rc = tok__merges_reserve(v, (size_t)v->n * 2))) goto done;
            for (int32_t i = 0; i < v->n; i++) {
                const char *p = v->text.blob + v->text.off[i];
                size_t n = v->text.len[i];
                for (size_t k = 1; k < n; k++) {
                    if (((uint8_t)p[k] & 0xC0) == 0x80) continue;
                    int32_t l = tok__map_get(&v->text_map, &v->text, p, k);
                    if (l < 0) continue;
                    int32_t r = tok__map_get(&v->text_map, &v->text, p + k, n - k);
                    if (r < 0) continue;
                    int32_t t = tok__map_get(&v->text_map, &v->text, p, n);
                    if ((rc = merges_insert(v, l, r, ~tok__score_key(v->score[t]), t))) goto done;
                }
            }
        }
        for (int c = 0; c < 128; c++) {
            char ch = (char)c;
            v->ascii_id[c] = tok__map_get(&v->text_map, &v->text, &ch, 1);
        }
        v->sp_id = tok__map_get(&v->text_map, &v->text, "\xe2\x96\x81", 3);
        if (v->algo == TOK__ALGO_SPM && (rc = tok__spm_pairs_init(v))) goto done;
        /* can a cut go before every '▁' that follows another character? */
        v->sp_cut = 1;
        for (int32_t i = 0; i < v->text.n && v->sp_cut; i++) {
            const char *p = v->text.blob + v->text.off[i];
            size_t n = v->text.len[i];
            for (size_t k = 1; k + 3 <= n; k++)
                if (!memcmp(p + k, "\xe2\x96\x81", 3) && !(k >= 3 && !memcmp(p + k - 3, "\xe2\x96\x81", 3))) { v->sp_cut = 0; break; }
        }
    }

    rc = 0;
done:
    free(pure);
    if (rc) return rc;

    /* special tokens */
    for (int32_t i = 0; i < v->n; i++) {
        int ty = v->type[i];
        if (ty != TOK_TYPE_CONTROL && ty != TOK_TYPE_USER_DEFINED && ty != TOK_TYPE_UNKNOWN) continue;
        if (!v->text.len[i]) continue;
        if ((rc = tok__trie_add(&v->trie, v->text.blob + v->text.off[i], v->text.len[i], i,
                                                      ty == TOK_TYPE_USER_DEFINED ? 0 : TOK__SP_NEEDS_PARSE)))
            return rc;
        v->n_special++;
    }

    /* end-of-generation tokens */
    tok__eog_add(v, v->eos);
    tok__eog_add(v, v->eot);
    tok__eog_add(v, v->eom);
    for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++) {
        int32_t id = tok__map_get(&v->text_map, &v->text, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && id < v->n && (v->type[id] == TOK_TYPE_CONTROL || v->type[id] == TOK_TYPE_USER_DEFINED)) tok__eog_add(v, id);
    }
    (void)err;
    (void)errlen;
    return 0;
}

void tok_free(tok_vocab *v) {
    if (!v) return;
    tok__strs_free(&v->text);
    tok__strs_free(&v->piece);
    tok__map_free(&v->text_map);
    tok__map_free(&v->piece_map);
    free(v->type);
    free(v->score);
    free(v->merges.slots);
    free(v->joins.keys);
    free(v->byte_join);
    free(v->ascii_pair);
    free(v->trie.nodes);
    free(v);
}

/* ---- GGUF ------------------------------------------------------------------------------- */

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return rc;
}

static int32_t get_id(const gguf_ctx *g, const char *key, int32_t dflt, int n) {
    int64_t x;
    if (gguf_get_i64(g, key, &x) != 0) return dflt;
    if (x < 0 || x >= n) return -1;
    return (int32_t)x;
}

int tok_load_gguf(const gguf_ctx *g, tok_vocab **out, char *err, size_t errlen) {
    if (!g || !out) return CM_EINVAL;
    *out = NULL;
    const char *path = gguf_path(g) ? gguf_path(g) : "gguf";
    const gguf_value *model = gguf_find(g, "tokenizer.ggml.model");
    if (!model || model->type != GGUF_STRING)
        return fail(err, errlen, CM_ENOTFOUND, "%s: no tokenizer (tokenizer.ggml.model missing)", path);
    int algo;
    if (model->v.s.len == 5 && !memcmp(model->v.s.ptr, "llama", 5)) algo = TOK__ALGO_SPM;
    else if (model->v.s.len == 4 && !memcmp(model->v.s.ptr, "gpt2", 4)) algo = TOK__ALGO_BPE_BYTES;
    else
        return fail(err, errlen, CM_EUNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (llama, gpt2 are)", path,
                    (int)(model->v.s.len > 32 ? 32 : model->v.s.len), model->v.s.ptr);
    const gguf_value *toks = NULL, *scores = NULL, *types = NULL, *merges = NULL;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING, &toks) != 0)
        return fail(err, errlen, CM_EFORMAT, "%s: tokenizer.ggml.tokens missing or not a string array", path);
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > TOK_MAX_VOCAB) return fail(err, errlen, CM_EFORMAT, "%s: vocabulary size %llu out of range", path, (unsigned long long)n);
    if (gguf_get_arr(g, "tokenizer.ggml.scores", -1, &scores) == 0 &&
        (scores->v.arr.n != n || !(scores->v.arr.elem_type == GGUF_FLOAT32 || scores->v.arr.elem_type == GGUF_FLOAT64)))
        return fail(err, errlen, CM_EFORMAT, "%s: tokenizer.ggml.scores does not match the tokens", path);
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", -1, &types) == 0 &&
        (types->v.arr.n != n || !gguf_vtype_size(types->v.arr.elem_type)))
        return fail(err, errlen, CM_EFORMAT, "%s: tokenizer.ggml.token_type does not match the tokens", path);
    if (algo == TOK__ALGO_BPE_BYTES && gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_STRING, &merges) != 0)
        return fail(err, errlen, CM_EFORMAT, "%s: gpt2 tokenizer without tokenizer.ggml.merges", path);

    tok_vocab *v;
    int rc = tok__vocab_new(&v);
    if (rc) return rc;
    v->kind = algo == TOK__ALGO_SPM ? TOK_KIND_SPM : TOK_KIND_BPE;
    v->algo = algo;
    v->n = (int)n;
    v->type = malloc(n);
    if (!v->type) { rc = CM_ENOMEM; goto fail_vocab; }
    if (algo == TOK__ALGO_SPM && !(v->score = malloc(n * sizeof *v->score))) { rc = CM_ENOMEM; goto fail_vocab; }
    for (uint64_t i = 0; i < n; i++) {
        const gguf_str *s = &toks->v.arr.strs[i];
        if ((rc = tok__strs_add(&v->text, s->ptr, s->len)) < 0) goto fail_vocab;
        int64_t ty = types ? gguf_arr_i64(types, i) : TOK_TYPE_NORMAL;
        v->type[i] = (uint8_t)(ty >= 0 && ty <= TOK_TYPE_BYTE ? ty : TOK_TYPE_UNDEFINED);
        if (v->score) v->score[i] = scores ? (float)gguf_arr_f64(scores, i) : 0.0f;
    }
    rc = 0;
    if ((rc = tok__map_init(&v->text_map, n + (merges ? merges->v.arr.n / 4 : 0)))) goto fail_vocab;
    for (int32_t i = 0; i < (int32_t)n; i++) /* llama.cpp: the last duplicate wins */
        if ((rc = tok__map_put(&v->text_map, &v->text, i, 1))) goto fail_vocab;

    char *pre = NULL;
    if (algo == TOK__ALGO_SPM) {
        v->pre = TOK__PRE_NONE;
        v->escape_spaces = 1;
        int asp = 1;
        gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &asp);
        v->prefix = asp ? TOK__PREFIX_EACH : TOK__PREFIX_NONE;
        v->add_bos = 1;
        v->bos = get_id(g, "tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1, v->n);
        v->eos = get_id(g, "tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1, v->n);
        v->unk = get_id(g, "tokenizer.ggml.unknown_token_id", 0, v->n);
    } else {
        if (gguf_get_strdup(g, "tokenizer.ggml.pre", &pre) != 0) pre = NULL;
        v->pre = tok__pre_from_name(pre ? pre : "default");
        if (v->pre < 0) {
            rc = fail(err, errlen, CM_EUNSUPPORTED, "%s: unknown pre-tokenizer tokenizer.ggml.pre='%s'", path, pre);
            free(pre);
            goto fail_vocab;
        }
        /* llama.cpp: the Llama-3 family (and tekken) looks whole words up before merging and adds BOS;
         * dbrx, smaug-bpe and chatglm-bpe share the regex only */
        static const char *const l3[] = { "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken" };
        for (size_t k = 0; pre && k < sizeof l3 / sizeof *l3; k++)
            if (!strcmp(pre, l3[k])) v->ignore_merges = v->add_bos = 1;
        free(pre);
        int dflt = n > 11 ? 11 : -1;
        v->bos = get_id(g, "tokenizer.ggml.bos_token_id", dflt, v->n);
        v->eos = get_id(g, "tokenizer.ggml.eos_token_id", dflt, v->n);
        v->unk = get_id(g, "tokenizer.ggml.unknown_token_id", -1, v->n);
        if ((rc = tok__merges_reserve(v, merges->v.arr.n))) goto fail_vocab;
        for (uint64_t i = 0; i < merges->v.arr.n; i++) {
            const gguf_str *m = &merges->v.arr.strs[i];
            const char *sp = m->len > 1 ? memchr(m->ptr + 1, ' ', m->len - 1) : NULL;
            if (!sp) {
                rc = fail(err, errlen, CM_EFORMAT, "%s: merge %llu has no space", path, (unsigned long long)i);
                goto fail_vocab;
            }
            size_t na = (size_t)(sp - m->ptr);
            if ((rc = tok__add_merge(v, m->ptr, na, sp + 1, m->len - na - 1, (uint32_t)i, err, errlen))) goto fail_vocab;
        }
    }
    v->eot = get_id(g, "tokenizer.ggml.eot_token_id", -1, v->n);
    v->eom = get_id(g, "tokenizer.ggml.eom_token_id", -1, v->n);
    v->pad = get_id(g, "tokenizer.ggml.padding_token_id", -1, v->n);
    int b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0) v->add_bos = b;
    if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == 0) v->add_eos = b;
    if ((rc = tok__vocab_finish(v, err, errlen))) goto fail_vocab;
    *out = v;
    return 0;
fail_vocab:
    if (rc == CM_ENOMEM || rc == CM_ETOOBIG) fail(err, errlen, rc, "%s: tokenizer: %s", path, cm_err_str(rc));
    tok_free(v);
    return rc;
}

/* ---- encode ----------------------------------------------------------------------------- */

int tok__sym_reserve(tok__scratch *s, size_t n) {
    if (n <= s->sym_cap) return 0;
    size_t nc = s->sym_cap ? s->sym_cap : 256;
    while (nc < n) nc *= 2;
    tok__sym *p = realloc(s->sym, nc * sizeof *p);
    if (!p) return CM_ENOMEM;
    s->sym = p;
    s->sym_cap = nc;
    return 0;
}

int tok__buf_reserve(tok__scratch *s, size_t n) {
    if (n <= s->buf_cap) return 0;
    size_t nc = s->buf_cap ? s->buf_cap : 1024;
    while (nc < n) nc *= 2;
    char *p = realloc(s->buf, nc);
    if (!p) return CM_ENOMEM;
    s->buf = p;
    s->buf_cap = nc;
    return 0;
}

int tok__heap_push(tok__scratch *s, uint64_t key, uint32_t size, int32_t id) {
    if (s->heap_n == s->heap_cap) {
        size_t nc = s->heap_cap ? s->heap_cap * 2 : 256;
        tok__heap_ent *p = realloc(s->heap, nc * sizeof *p);
        if (!p) return CM_ENOMEM;
        s->heap = p;
        s->heap_cap = nc;
    }
    size_t i = s->heap_n++;
    tok__heap_ent e = { key, size, id };
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (s->heap[parent].key <= key) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = e;
    return 0;
}

void tok__heap_pop(tok__scratch *s, tok__heap_ent *top) {
    *top = s->heap[0];
    tok__heap_ent last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    if (!n) return;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1].key < s->heap[c].key) c++;
        if (s->heap[c].key >= last.key) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    s->heap[i] = last;
}

int tok__cache_get(tok__scratch *s, const char *p, size_t n, tok__out *o) {
    tok__cache *c = &s->cache;
    if (!c->slots || n > TOK__CACHE_MAXLEN) return 0;
    uint64_t h = tok__hash(p, n);
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        uint32_t e = c->slots[i];
        if (!e) return 0;
        const tok__cache_ent *en = &c->ent[e - 1];
        if (en->hash == h && en->text_len == n && !memcmp(c->text + en->text_off, p, n)) {
            for (uint32_t k = 0; k < en->n_ids; k++) tok__emit(o, c->ids[en->ids_off + k]);
            return 1;
        }
    }
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return CM_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

void tok__cache_put(tok__scratch *s, const char *p, size_t n, const tok__out *o, int64_t from) {
    tok__cache *c = &s->cache;
    int64_t k = o->n - from;
    if (n > TOK__CACHE_MAXLEN || o->n > o->cap || k <= 0 || k > 0xffff || c->n >= TOK__CACHE_MAX) return;
    if (!c->slots || (c->n + 1) * 2 > c->mask + 1) { /* start small (most prompts are short), double */
        uint32_t cap = c->slots ? (c->mask + 1) * 2 : 1024;
        uint32_t *ns = calloc(cap, sizeof *ns);
        if (!ns) return;
        for (uint32_t e = 0; e < c->n; e++) {
            uint32_t j = (uint32_t)c->ent[e].hash & (cap - 1);
            while (ns[j]) j = (j + 1) & (cap - 1);
            ns[j] = e + 1;
        }
        free(c->slots);
        c->slots = ns;
        c->mask = cap - 1;
    }
    size_t ecap = c->cap;
    if (grow((void **)&c->ent, &ecap, c->n + 1, sizeof *c->ent)) return;
    c->cap = (uint32_t)ecap;
    if (grow((void **)&c->text, &c->text_cap, c->text_n + n, 1) || grow((void **)&c->ids, &c->ids_cap, c->ids_n + (size_t)k, sizeof *c->ids))
        return;
    uint64_t h = tok__hash(p, n);
    uint32_t i = (uint32_t)h & c->mask;
    while (c->slots[i]) i = (i + 1) & c->mask;
    tok__cache_ent *en = &c->ent[c->n];
    en->hash = h;
    en->text_off = (uint32_t)c->text_n;
    en->text_len = (uint16_t)n;
    en->ids_off = (uint32_t)c->ids_n;
    en->n_ids = (uint16_t)k;
    memcpy(c->text + c->text_n, p, n);
    c->text_n += n;
    memcpy(c->ids + c->ids_n, o->ids + from, (size_t)k * sizeof *c->ids);
    c->ids_n += (size_t)k;
    c->slots[i] = ++c->n;
}

void tok__scratch_free(tok__scratch *s) {
    free(s->sym);
    free(s->heap);
    free(s->buf);
    free(s->cache.slots);
    free(s->cache.ent);
    free(s->cache.text);
    free(s->cache.ids);
    memset(s, 0, sizeof *s);
}

static int encode_raw(const tok_vocab *v, tok__scratch *s, const char *text, size_t len, int first, tok__out *o) {
    if (!len) return 0;
    switch (v->algo) {
    case TOK__ALGO_SPM: return tok__spm_encode(v, s, text, len, first, o);
    case TOK__ALGO_BPE_CHARS: return tok__bpe_chars_encode(v, s, text, len, first, o);
    case TOK__ALGO_BPE_BYTES: return tok__bpe_bytes_encode(v, s, text, len, o);
    }
    return CM_ESTATE;
}

int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special, int32_t *ids, int cap,
               int *n_out) {
    if (n_out) *n_out = 0;
    if (!v || (!text && len) || cap < 0 || (!ids && cap) || !n_out) return CM_EINVAL;
    if (len > TOK_MAX_TEXT) return CM_ETOOBIG;
    const uint8_t *s = (const uint8_t *)text;
    if (tok__utf8_valid_prefix(s, len) != len) return CM_EUTF8;
    tok__out o = { ids, cap, 0 };
    tok__scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = 0;
    if (add_bos && v->bos >= 0) tok__emit(&o, v->bos);
    size_t pos = 0;
    while (pos < len && !rc) {
        size_t ms, me;
        int32_t tid;
        if (v->n_special && find_special(v, s, pos, len, parse_special, &ms, &me, &tid)) {
            rc = encode_raw(v, &sc, text + pos, ms - pos, pos == 0, &o);
            tok__emit(&o, tid);
            pos = me;
        } else {
            rc = encode_raw(v, &sc, text + pos, len - pos, pos == 0, &o);
            pos = len;
        }
    }
    if (!rc && add_bos && v->add_eos && v->eos >= 0) tok__emit(&o, v->eos);
    tok__scratch_free(&sc);
    if (rc) return rc;
    if (o.n > INT_MAX) return CM_ETOOBIG;
    *n_out = (int)o.n;
    return o.n > cap ? CM_EFULL : 0;
}

/* ---- decode and accessors --------------------------------------------------------------- */

int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap, size_t *len) {
    if (len) *len = 0;
    if (!v || !len || (!buf && cap)) return CM_EINVAL;
    if (id < 0 || id >= v->n) return CM_ERANGE;
    size_t n = v->piece.len[id];
    *len = n;
    if (n > cap) return CM_EFULL;
    memcpy(buf, v->piece.blob + v->piece.off[id], n);
    return 0;
}

const char *tok_piece_ref(const tok_vocab *v, int32_t id, size_t *len) {
    if (!v || id < 0 || id >= v->n) return NULL;
    if (len) *len = v->piece.len[id];
    return v->piece.blob + v->piece.off[id];
}

const char *tok_text(const tok_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n) return NULL;
    return v->text.blob + v->text.off[id];
}

int32_t tok_find(const tok_vocab *v, const char *text, size_t len) {
    if (!v || (!text && len)) return -1;
    int32_t id = tok__map_get(&v->text_map, &v->text, text, len);
    return id < v->n ? id : -1;
}

int tok_type(const tok_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n) return -1;
    return v->type[id];
}

int tok_kind(const tok_vocab *v) { return v ? v->kind : 0; }
int tok_n_vocab(const tok_vocab *v) { return v ? v->n : 0; }
int32_t tok_bos(const tok_vocab *v) { return v ? v->bos : -1; }
int32_t tok_eos(const tok_vocab *v) { return v ? v->eos : -1; }
int tok_add_bos(const tok_vocab *v) { return v ? v->add_bos : 0; }
int tok_add_eos(const tok_vocab *v) { return v ? v->add_eos : 0; }
int tok_add_space_prefix(const tok_vocab *v) { return v ? v->prefix != TOK__PREFIX_NONE : 0; }

int tok_is_eog(const tok_vocab *v, int32_t id) {
    if (!v || id < 0) return 0;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return 1;
    return 0;
}

int tok_eog_ids(const tok_vocab *v, int32_t *ids, int cap) {
    int n = v ? v->n_eog : 0;
    for (int i = 0; i < n && i < cap; i++) ids[i] = v->eog[i];
    return n;
}

const char *tok_pre_name(const tok_vocab *v) { return v ? tok__pre_name(v->pre) : ""; }
