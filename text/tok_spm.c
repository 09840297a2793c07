/* tok_spm: SentencePiece-style BPE driven by token scores, as llama.cpp's llm_tokenizer_spm:
 * spaces become '▁', a '▁' is prepended to raw fragments (add_space_prefix), the text is split
 * into UTF-8 characters, and the adjacent pair whose concatenation is the highest-scoring token
 * is merged first (ties: leftmost), until no pair is a token. Symbols that are not tokens are
 * emitted as byte-fallback tokens <0xNN>.
 *
 * Cost: O(n log n) per chunk with a binary heap of candidate bigrams (stale entries are
 * skipped when popped). Long texts are cut between two characters that never occur next to
 * each other inside any token (tok_vocab.joins): no merge can cross such a cut, so chunks are
 * independent and the result is the same as for the whole text. */
#include "tok_internal.h"
#include "../common/cm_err.h"

#include <stdlib.h>

#define SPM_CHUNK 1024 /* bytes before we look for a cut */
#define SPM_SMALL 32   /* symbols up to which a chunk is merged by scanning instead of a heap */

/* The token that symbols (ls, ll, lid) and (.., rl, rid) adjacent in buf form, and its rank
 * (lower is better: ~score); 0 when they form none. */
static inline int bigram(const tok_vocab *v, const char *buf, uint32_t ls, uint32_t ll, int32_t lid, uint32_t rl, int32_t rid,
                         uint32_t *rank, int32_t *id) {
    if (rl == 1 && v->ascii_pair) {
        uint8_t a = (uint8_t)buf[ls], b = (uint8_t)buf[ls + ll];
        const struct tok__pair_hit *h = NULL;
        if (ll == 1 && a < 128 && b < 128) h = &v->ascii_pair[a << 7 | b];
        else if (ll == 3 && b < 128 && !memcmp(buf + ls, "\xe2\x96\x81", 3)) h = &v->ascii_pair[128 * 128 + b];
        if (h) {
            if (h->id < 0) return 0;
            *rank = h->rank;
            *id = h->id;
            return 1;
        }
    }
    if (lid >= 0 && rid >= 0) {
        /* both sides are tokens: the pair table has every token split into two tokens */
        const tok__merge_slot *m = tok__merges_get(&v->merges, lid, rid);
        if (!m) return 0;
        *id = m->res;
        *rank = m->rank;
        return 1;
    }
    if ((int)(ll + rl) > v->max_len) return 0;
    int32_t t = tok__map_get(&v->text_map, &v->text, buf + ls, ll + rl);
    if (t < 0 || t >= v->n) return 0;
    *id = t;
    *rank = ~tok__score_key(v->score[t]);
    return 1;
}

static int try_bigram(const tok_vocab *v, tok__scratch *s, const char *buf, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const tok__sym *L = &s->sym[l], *R = &s->sym[r];
    uint32_t rank;
    int32_t id;
    if (!bigram(v, buf, L->start, L->len, L->id, R->len, R->id, &rank, &id)) return 0;
    /* highest score first, then leftmost: a min-heap on (~score, left) */
    return tok__heap_push(s, ((uint64_t)rank << 32) | (uint32_t)l, L->len + R->len, id);
}

static void emit_byte(const tok_vocab *v, uint8_t b, tok__out *o) {
    if (v->byte_tok[b] >= 0) { tok__emit(o, v->byte_tok[b]); return; }
    char c = (char)b;
    int32_t id = tok__map_get(&v->text_map, &v->text, &c, 1);
    if (id >= 0 && id < v->n) tok__emit(o, id);
    else if (v->unk >= 0) tok__emit(o, v->unk);
}

static void emit_sym(const tok_vocab *v, const char *buf, uint32_t start, uint32_t len, int32_t id, tok__out *o) {
    if (id >= 0 && id < v->n) {
        tok__emit(o, id);
    } else {
        for (uint32_t k = 0; k < len; k++) emit_byte(v, (uint8_t)buf[start + k], o);
    }
}

/* A short chunk (a word) without the heap: scan the few adjacent pairs for the best one. The
 * same order as the heap: lowest rank, then leftmost. */
static int spm_small(const tok_vocab *v, tok__scratch *s, const char *buf, int32_t n, tok__out *o) {
    uint32_t st[SPM_SMALL], ln[SPM_SMALL], rk[SPM_SMALL];
    int32_t id[SPM_SMALL], pid[SPM_SMALL];
    uint8_t has[SPM_SMALL];
    for (int32_t i = 0; i < n; i++) { st[i] = s->sym[i].start; ln[i] = s->sym[i].len; id[i] = s->sym[i].id; }
    for (int32_t i = 0; i + 1 < n; i++) has[i] = (uint8_t)bigram(v, buf, st[i], ln[i], id[i], ln[i + 1], id[i + 1], &rk[i], &pid[i]);
    for (;;) {
        int32_t best = -1;
        for (int32_t i = 0; i + 1 < n; i++)
            if (has[i] && (best < 0 || rk[i] < rk[best])) best = i;
        if (best < 0) break;
        ln[best] += ln[best + 1];
        id[best] = pid[best];
        for (int32_t i = best + 1; i + 1 < n; i++) { st[i] = st[i + 1]; ln[i] = ln[i + 1]; id[i] = id[i + 1]; }
        for (int32_t i = best + 1; i + 2 < n; i++) { rk[i] = rk[i + 1]; pid[i] = pid[i + 1]; has[i] = has[i + 1]; }
        n--;
        if (best > 0) has[best - 1] = (uint8_t)bigram(v, buf, st[best - 1], ln[best - 1], id[best - 1], ln[best], id[best], &rk[best - 1], &pid[best - 1]);
        if (best + 1 < n) has[best] = (uint8_t)bigram(v, buf, st[best], ln[best], id[best], ln[best + 1], id[best + 1], &rk[best], &pid[best]);
    }
    for (int32_t i = 0; i < n; i++) emit_sym(v, buf, st[i], ln[i], id[i], o);
    return 0;
}

static int spm_chunk(const tok_vocab *v, tok__scratch *s, const char *buf, size_t a, size_t b, tok__out *o) {
    int rc = tok__sym_reserve(s, b - a);
    if (rc) return rc;
    int32_t n = 0;
    for (size_t p = a; p < b;) {
        uint32_t l = (uint32_t)tok__utf8_len((uint8_t)buf[p]);
        if (p + l > b) l = (uint32_t)(b - p);
        tok__sym *y = &s->sym[n];
        y->start = (uint32_t)p;
        y->len = l;
        y->prev = n - 1;
        y->next = n + 1;
        y->id = l == 1 ? v->ascii_id[(uint8_t)buf[p]]
                : (l == 3 && !memcmp(buf + p, "\xe2\x96\x81", 3)) ? v->sp_id
                : tok__map_get(&v->text_map, &v->text, buf + p, l);
        p += l;
        n++;
    }
    if (!n) return 0;
    if (n <= SPM_SMALL) return spm_small(v, s, buf, n, o);
    s->sym[n - 1].next = -1;
    s->heap_n = 0;
    for (int32_t i = 1; i < n; i++)
        if ((rc = try_bigram(v, s, buf, i - 1, i))) return rc;
    while (s->heap_n) {
        tok__heap_ent top;
        tok__heap_pop(s, &top);
        int32_t li = (int32_t)(uint32_t)top.key;
        tok__sym *L = &s->sym[li];
        if (!L->len || L->next < 0) continue;
        tok__sym *R = &s->sym[L->next];
        if (L->len + R->len != top.size) continue; /* one side changed since this entry was queued */
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0) s->sym[R->next].prev = li;
        L->id = top.id;
        if ((rc = try_bigram(v, s, buf, L->prev, li)) || (rc = try_bigram(v, s, buf, li, L->next))) return rc;
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) {
        const tok__sym *y = &s->sym[i];
        if (y->id >= 0 && y->id < v->n) {
            tok__emit(o, y->id);
        } else {
            for (uint32_t k = 0; k < y->len; k++) emit_byte(v, (uint8_t)buf[y->start + k], o);
        }
    }
    return 0;
}

/* Where to end the chunk that starts at a: before the first '▁' whose left neighbour never
 * precedes '▁' inside a token (with sp_cut, no character but '▁' does), and anyway at the first
 * uncrossable boundary at or after a + SPM_CHUNK, at the latest after TOK__MAX_CHUNK bytes;
 * else b. */
size_t tok__chars_cut(const tok_vocab *v, const uint8_t *buf, size_t a, size_t b) {
    for (size_t p = a + 1; p + 3 <= b && p <= a + SPM_CHUNK;) {
        const uint8_t *q = memchr(buf + p, 0xE2, b - p);
        if (!q) break;
        p = (size_t)(q - buf);
        if (p + 3 > b || p > a + SPM_CHUNK) break;
        if (q[1] == 0x96 && q[2] == 0x81 && !(p >= a + 3 && q[-3] == 0xE2 && q[-2] == 0x96 && q[-1] == 0x81)) {
            if (v->sp_cut) return p;
            size_t r = p - 1;
            while (r > a && (buf[r] & 0xC0) == 0x80) r--;
            int l;
            if (!tok__pairset_has(&v->joins, tok__utf8_dec(buf + r, p - r, &l), 0x2581)) return p;
        }
        p++;
    }
    if (b - a <= SPM_CHUNK) return b;
    size_t p = a + SPM_CHUNK;
    while (p < b && (buf[p] & 0xC0) == 0x80) p++;
    if (p >= b) return b;
    size_t q = p - 1;
    while (q > a && (buf[q] & 0xC0) == 0x80) q--;
    int l;
    uint32_t c1 = tok__utf8_dec(buf + q, b - q, &l);
    while (p < b) {
        if (p - a >= TOK__MAX_CHUNK) return p; /* see TOK__MAX_CHUNK */
        uint32_t c2 = tok__utf8_dec(buf + p, b - p, &l);
        if (!tok__pairset_has(&v->joins, c1, c2)) return p;
        c1 = c2;
        p += (size_t)l;
    }
    return b;
}

int tok__spm_pairs_init(tok_vocab *v) {
    v->ascii_pair = malloc((128 * 128 + 128) * sizeof *v->ascii_pair);
    if (!v->ascii_pair) return CM_ENOMEM;
    char buf[4];
    for (int k = 0; k < 128 * 128 + 128; k++) {
        struct tok__pair_hit *h = &v->ascii_pair[k];
        uint32_t ll;
        if (k < 128 * 128) { buf[0] = (char)(k >> 7); buf[1] = (char)(k & 127); ll = 1; }
        else { memcpy(buf, "\xe2\x96\x81", 3); buf[3] = (char)(k - 128 * 128); ll = 3; }
        int32_t lid = ll == 1 ? v->ascii_id[(uint8_t)buf[0]] : v->sp_id, rid = v->ascii_id[(uint8_t)buf[ll]];
        struct tok__pair_hit *save = v->ascii_pair;
        v->ascii_pair = NULL; /* the general path fills the table */
        if (!bigram(v, buf, 0, ll, lid, 1, rid, &h->rank, &h->id)) h->id = -1;
        v->ascii_pair = save;
    }
    return 0;
}

int tok__spm_encode(const tok_vocab *v, tok__scratch *s, const char *text, size_t len, int first, tok__out *o) {
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
    if (prefix) { memcpy(buf, "\xe2\x96\x81", 3); w = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ' && v->escape_spaces) { memcpy(buf + w, "\xe2\x96\x81", 3); w += 3; }
        else buf[w++] = text[i];
    }
    for (size_t a = 0; a < w;) {
        size_t b = tok__chars_cut(v, (const uint8_t *)buf, a, w);
        if (!tok__cache_get(s, buf + a, b - a, o)) {
            int64_t from = o->n;
            if ((rc = spm_chunk(v, s, buf, a, b, o))) return rc;
            tok__cache_put(s, buf + a, b - a, o, from);
        }
        a = b;
    }
    return 0;
}
