/* detok: incremental detokenizer (complete UTF-8 only, SentencePiece leading space). */
#include "detok.h"

#include <string.h>

#include "common/cm_err.h"

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Length of the sequence lead byte b starts (0: b cannot start one) and the range its second
 * byte must fall in (RFC 3629 table: excludes overlongs, surrogates, > U+10FFFF). */
static int seq_len(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80; *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b == 0xE0) { *lo = 0xA0; return 3; }
    if (b == 0xED) { *hi = 0x9F; return 3; }
    if (b >= 0xE1 && b <= 0xEF) return 3;
    if (b == 0xF0) { *lo = 0x90; return 4; }
    if (b >= 0xF1 && b <= 0xF3) return 4;
    if (b == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

size_t tok_detok_utf8(uint8_t pend[4], int *npend, const char *in, size_t len, char *out) {
    uint8_t carry[4];
    size_t np = (size_t)*npend, n = np + len, i = 0, w = 0;
    memcpy(carry, pend, np);
#define AT(k) ((k) < np ? carry[(k)] : (uint8_t)in[(k) - np])
    *npend = 0;
    while (i < n) {
        uint8_t b = AT(i), lo, hi;
        int need = seq_len(b, &lo, &hi);
        if (need == 1) { out[w++] = (char)b; i++; continue; }
        if (need == 0) { memcpy(out + w, REPL, 3); w += 3; i++; continue; }
        int k = 1, bad = 0;
        for (; k < need; k++) {
            if (i + (size_t)k >= n) break;
            uint8_t c = AT(i + (size_t)k);
            if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) { bad = 1; break; }
        }
        if (bad) { memcpy(out + w, REPL, 3); w += 3; i += (size_t)k; continue; }
        if (k < need) { /* valid but incomplete prefix at the very end: keep it */
            for (size_t j = i; j < n; j++) pend[(*npend)++] = AT(j);
            break;
        }
        for (int j = 0; j < need; j++) out[w++] = (char)AT(i + (size_t)j);
        i += (size_t)need;
    }
#undef AT
    return w;
}

size_t tok_detok_out_cap(const tok_detok *d) {
    return d ? 3 * (d->max_piece + 4) : 0;
}

int tok_detok_init(tok_detok *d, const tok_vocab *v, int flags) {
    if (!d || !v) return CM_EINVAL;
    memset(d, 0, sizeof *d);
    d->v = v;
    d->flags = flags;
    d->strip_next = (flags & TOK_DETOK_STRIP_LEADING) && tok_add_space_prefix(v);
    int n = tok_n_vocab(v);
    for (int32_t id = 0; id < n; id++) {
        size_t l = 0;
        if (tok_piece_ref(v, id, &l) && l > d->max_piece) d->max_piece = l;
    }
    return 0;
}

int tok_detok_push(tok_detok *d, int32_t id, char *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!d || !d->v || !n_out || (!out && cap)) return CM_EINVAL;
    size_t len = 0;
    const char *p = tok_piece_ref(d->v, id, &len);
    if (!p) return CM_ERANGE;
    int first = !d->started;
    int ty = tok_type(d->v, id);
    if (first && id == tok_bos(d->v) && tok_add_space_prefix(d->v)) d->strip_next = 1;
    if ((d->flags & TOK_DETOK_SKIP_CONTROL) && ty == TOK_TYPE_CONTROL) len = 0;
    if (3 * (len + (size_t)d->npend) > cap) return CM_EFULL;
    d->started = 1;
    if (len && d->strip_next && ty != TOK_TYPE_CONTROL) {
        if (p[0] == ' ') { p++; len--; }
        d->strip_next = 0;
    }
    *n_out = tok_detok_utf8(d->pend, &d->npend, p, len, out);
    return 0;
}

int tok_detok_flush(tok_detok *d, char *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!d || !n_out || (!out && cap)) return CM_EINVAL;
    if (d->npend) {
        if (cap < 3) return CM_EFULL;
        memcpy(out, REPL, 3);
        *n_out = 3;
        d->npend = 0;
    }
    return 0;
}
