/* stop: stop-string matcher for streamed text.
 *
 * The gateway feeds the text of each generated token (complete UTF-8 from tok_detok) and gets
 * back the part that is safe to send now. Text that could still be the beginning of a stop
 * string is held back; once a stop string appears (possibly spread over several tokens), the
 * text before it is released, the stop string and everything after it are dropped, and the
 * matcher reports the stop (finish_reason "stop"). At the end of generation, tok_stop_flush
 * releases what was held back.
 *
 *   tok_stop s; const char *stops[] = {"\nUser:", "###"};
 *   tok_stop_init(&s, stops, NULL, 2);
 *   char out[TOK_STOP_MAX_LEN + 64]; size_t n; int hit;
 *   tok_stop_feed(&s, piece, piece_len, out, sizeof out, &n, &hit);  // send out[0..n)
 *   if (hit >= 0) finish("stop");
 *   ...
 *   tok_stop_flush(&s, out, sizeof out, &n);
 *
 * Rule: a stop string is reported as soon as its last byte has been fed; when several
 * complete within the same feed, the one starting earliest wins (same start: the shortest is
 * reported; the cut is the same). A longer stop that began earlier but is still incomplete
 * does not delay a shorter one that completes ("abcd" and "bc" over "za|bc|d" stop at "bc",
 * releasing "za"), which is what a client streaming the text would expect. Held back is
 * exactly the longest suffix of the unreleased text that is a proper prefix of some stop
 * string; when the fed text is valid UTF-8 and the stop strings are too (checked at init),
 * every cut falls on a character boundary.
 *
 * No allocation: the struct holds everything (about 4.5 KB). One thread at a time.
 */
#ifndef TXT_STOP_H
#define TXT_STOP_H

#include <stddef.h>

#define TOK_STOP_MAX     16  /* stop strings (OpenAI allows 4) */
#define TOK_STOP_MAX_LEN 256 /* bytes per stop string */

typedef struct tok_stop {
    int    n;
    size_t len[TOK_STOP_MAX];
    char   str[TOK_STOP_MAX][TOK_STOP_MAX_LEN];
    char   held[TOK_STOP_MAX_LEN]; /* unreleased text: a proper prefix of some stop string */
    size_t nheld;
    int    hit;                    /* index of the stop string that matched, or -1 */
} tok_stop;

/* Copies n stop strings (lens[i] bytes each, or strlen when lens is NULL). Returns 0,
 * CM_EINVAL (NULL arguments, an empty string), CM_ERANGE (n > TOK_STOP_MAX),
 * CM_ETOOBIG (a string longer than TOK_STOP_MAX_LEN) or CM_EUTF8 (not valid UTF-8).
 * n == 0 is valid: everything passes through. */
int tok_stop_init(tok_stop *s, const char *const *stops, const size_t *lens, int n);

/* Feeds len bytes. Writes the text that can be released now into out[0..*n_out) and sets
 * *hit to the index of the stop string that matched (-1: none yet). After a hit every further
 * feed releases nothing. cap must be at least len + TOK_STOP_MAX_LEN (CM_EFULL otherwise,
 * state unchanged). Returns 0, CM_EFULL or CM_EINVAL. */
int tok_stop_feed(tok_stop *s, const char *text, size_t len, char *out, size_t cap, size_t *n_out, int *hit);

/* End of generation without a stop: releases the held text (nothing after a hit). cap must
 * be at least TOK_STOP_MAX_LEN. Returns 0, CM_EFULL or CM_EINVAL. */
int tok_stop_flush(tok_stop *s, char *out, size_t cap, size_t *n_out);

#endif
