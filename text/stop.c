/* stop: stop-string matcher across token boundaries. */
#include "stop.h"

#include <stdint.h>
#include <string.h>

#include "common/cm_err.h"
#include "detok.h"

static int valid_utf8(const char *p, size_t n) {
    uint8_t pend[4];
    int np = 0;
    char tmp[3 * TOK_STOP_MAX_LEN];
    size_t w = tok_detok_utf8(pend, &np, p, n, tmp);
    return np == 0 && w == n && memcmp(tmp, p, n) == 0;
}

int tok_stop_init(tok_stop *s, const char *const *stops, const size_t *lens, int n) {
    if (!s || n < 0 || (n && !stops)) return CM_EINVAL;
    if (n > TOK_STOP_MAX) return CM_ERANGE;
    memset(s, 0, sizeof *s);
    s->hit = -1;
    for (int i = 0; i < n; i++) {
        if (!stops[i]) return CM_EINVAL;
        size_t l = lens ? lens[i] : strlen(stops[i]);
        if (l == 0) return CM_EINVAL;
        if (l > TOK_STOP_MAX_LEN) return CM_ETOOBIG;
        if (!valid_utf8(stops[i], l)) return CM_EUTF8;
        memcpy(s->str[i], stops[i], l);
        s->len[i] = l;
    }
    s->n = n;
    return 0;
}

/* Earliest match in hay[0..n): sets *at and returns the stop index, or -1. */
static int find_first(const tok_stop *s, const char *hay, size_t n, size_t *at) {
    int best = -1;
    size_t best_at = 0;
    for (int i = 0; i < s->n; i++) {
        size_t lim = best >= 0 ? best_at + s->len[i] : n; /* only look where it could win */
        if (lim > n) lim = n;
        const char *p = memmem(hay, lim, s->str[i], s->len[i]);
        if (!p) continue;
        size_t off = (size_t)(p - hay);
        if (best < 0 || off < best_at || (off == best_at && s->len[i] < s->len[best])) { best = i; best_at = off; }
    }
    *at = best_at;
    return best;
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of some stop string. */
static size_t held_suffix(const tok_stop *s, const char *t, size_t n) {
    size_t best = 0;
    for (int i = 0; i < s->n; i++) {
        size_t m = s->len[i] - 1; /* proper prefix */
        if (m > n) m = n;
        for (size_t k = m; k > best; k--) {
            if (t[n - k] == s->str[i][0] && memcmp(t + n - k, s->str[i], k) == 0) { best = k; break; }
        }
    }
    return best;
}

int tok_stop_feed(tok_stop *s, const char *text, size_t len, char *out, size_t cap, size_t *n_out, int *hit) {
    if (n_out) *n_out = 0;
    if (!s || !n_out || !hit || (!text && len) || (!out && cap)) return CM_EINVAL;
    *hit = s->hit;
    if (s->hit >= 0) return 0;
    if (cap < len + TOK_STOP_MAX_LEN) return CM_EFULL;
    if (s->n == 0) { memcpy(out, text, len); *n_out = len; return 0; }

    /* A match starting inside the held text ends within the first TOK_STOP_MAX_LEN bytes of
     * the new text: search that junction in a small window, then the new text alone. */
    char win[2 * TOK_STOP_MAX_LEN];
    size_t head = len < TOK_STOP_MAX_LEN ? len : TOK_STOP_MAX_LEN;
    memcpy(win, s->held, s->nheld);
    memcpy(win + s->nheld, text, head);
    size_t wn = s->nheld + head, at;
    int i = find_first(s, win, wn, &at);
    if (i >= 0 && at < s->nheld) {
        memcpy(out, s->held, at);
        *n_out = at;
        s->hit = *hit = i;
        s->nheld = 0;
        return 0;
    }
    i = find_first(s, text, len, &at);
    if (i >= 0) {
        memcpy(out, s->held, s->nheld);
        memcpy(out + s->nheld, text, at);
        *n_out = s->nheld + at;
        s->hit = *hit = i;
        s->nheld = 0;
        return 0;
    }
    /* No match: hold back the longest suffix of held+text that may still become one. */
    size_t keep;
    if (len >= TOK_STOP_MAX_LEN) {
        keep = held_suffix(s, text, len);
        memcpy(out, s->held, s->nheld);
        memcpy(out + s->nheld, text, len - keep);
        *n_out = s->nheld + len - keep;
        memcpy(s->held, text + len - keep, keep);
    } else { /* the whole of held+text is in win */
        keep = held_suffix(s, win, wn);
        memcpy(out, win, wn - keep);
        *n_out = wn - keep;
        memmove(s->held, win + wn - keep, keep);
    }
    s->nheld = keep;
    return 0;
}

int tok_stop_flush(tok_stop *s, char *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!s || !n_out || (!out && cap)) return CM_EINVAL;
    if (s->hit >= 0) { s->nheld = 0; return 0; }
    if (cap < s->nheld) return CM_EFULL;
    memcpy(out, s->held, s->nheld);
    *n_out = s->nheld;
    s->nheld = 0;
    return 0;
}
