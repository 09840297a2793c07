/* shm proto: encoding and bounds-checked decoding of the records that cross the rings.
 *
 * Wire layouts (all offsets 8-byte aligned; the ring hands out 8-byte aligned payloads):
 *   header  {u32 type, u32 flags = 0}                                                   8 bytes
 *   SUBMIT  header, u64 req_id, i32 priority, u32 reserved = 0, shm_sampling (56),
 *           u32 n_prompt, u16 n_stop, u16 n_bias, u32 n_generated (version 4),
           u32 reserved2 = 0                                                          96 bytes
 *           then i32 prompt[n_prompt] (padded to 8), i32 stop[n_stop] (padded to 8),
 *           shm_logit_bias bias[n_bias],
 *           then (version 5) u64 tenant, u32 weight, u32 reserved = 0                   16 bytes
 *           then (version 3) u32 flags, u8 pooling, u8 normalize, u16 reserved = 0,
 *           u32 grammar_len, u32 reserved = 0                                           16 bytes
 *           and the grammar program (grammar_len bytes, padded to 8)
 *   VOCAB   header, u32 n_total, u32 first, u32 count, u32 bytes_len                    24 bytes
 *           then u32 off[count + 1] (padded to 8), bytes (padded to 8)
 *   EMBED   header, u64 req_id, u32 n_embd, u32 prompt_tokens                           24 bytes
 *           then f32 v[n_embd] (padded to 8)
 *   CANCEL  header, u64 req_id                                                          16 bytes
 *   TOKENS  header, u32 n, u32 reserved = 0, u64 step                                   24 bytes
 *           then n entries: shm_tok (24 bytes), shm_top top[n_top] (8 bytes each),
 *           (version 5) shm_tok_admit (16 bytes) when the entry's flags have SHM_TOK_ADMIT
 *   DONE    header, shm_done                                                            56 bytes
 *   ERROR   header, u64 req_id, i32 code, u32 msg_len, msg bytes (no NUL, padded to 8)  24+ bytes
 *
 * Decoders copy each fixed part into a local struct once (a buggy peer scribbling on the record
 * cannot make a check and a use see different values) and require the length to be exact.
 */
#include "shm/shm.h"

#include <math.h>
#include <string.h>

struct wire_hdr {
    uint32_t type;
    uint32_t flags;
};

struct wire_submit {
    struct wire_hdr h;
    uint64_t req_id;
    int32_t  priority;
    uint32_t reserved;      /* 0 */
    struct shm_sampling sp;
    uint32_t n_prompt;
    uint16_t n_stop;
    uint16_t n_bias;
    uint32_t n_generated;   /* version 4 */
    uint32_t reserved2;     /* 0 */
};

struct wire_submit_ext {
    uint32_t flags;
    uint8_t  pooling;
    uint8_t  normalize;
    uint16_t reserved;      /* 0 */
    uint32_t grammar_len;
    uint32_t reserved2;     /* 0 */
};

struct wire_vocab {
    struct wire_hdr h;
    uint32_t n_total, first, count, bytes_len;
};

struct wire_embed {
    struct wire_hdr h;
    uint64_t req_id;
    uint32_t n_embd, prompt_tokens;
};

struct wire_submit_tenant { /* version 5: after the bias list, before wire_submit_ext */
    uint64_t tenant;
    uint32_t weight;
    uint32_t reserved;      /* 0 */
};

struct wire_tokens {
    struct wire_hdr h;
    uint32_t n;
    uint32_t reserved;
    uint64_t step;
};

struct wire_error {
    struct wire_hdr h;
    uint64_t req_id;
    int32_t  code;
    uint32_t msg_len;
};

_Static_assert(sizeof(struct shm_sampling) == 56, "shm_sampling wire size");
_Static_assert(sizeof(struct wire_submit) == 96, "SUBMIT fixed part");
_Static_assert(sizeof(struct wire_submit_tenant) == 16, "SUBMIT tenant part");
_Static_assert(sizeof(struct wire_tokens) == 24, "TOKENS fixed part");
_Static_assert(sizeof(struct shm_tok) == 24, "TOKENS entry");
_Static_assert(sizeof(struct shm_top) == 8, "TOKENS alternative");
_Static_assert(sizeof(struct shm_tok_admit) == 16, "TOKENS admission");
_Static_assert(sizeof(struct shm_logit_bias) == 8, "logit bias entry");
_Static_assert(sizeof(struct wire_hdr) + sizeof(struct shm_done) == SHM_DONE_SIZE, "DONE size");
_Static_assert(sizeof(struct wire_error) == 24, "ERROR fixed part");
_Static_assert(sizeof(struct wire_submit_ext) == 16, "SUBMIT version-3 part");
_Static_assert(sizeof(struct wire_vocab) == 24, "VOCAB fixed part");
_Static_assert(sizeof(struct wire_embed) == 24, "EMBED fixed part");

static inline uint64_t align8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

static void put_hdr(void *buf, uint32_t type) {
    struct wire_hdr h = { type, 0 };
    memcpy(buf, &h, sizeof h);
}

/* Reads the header of a record of the wanted type. */
static int get_hdr(const void *buf, size_t len, uint32_t want) {
    struct wire_hdr h;
    if (!buf || len < sizeof h) return CM_EFORMAT;
    memcpy(&h, buf, sizeof h);
    return h.type == want && h.flags == 0 ? 0 : CM_EFORMAT;
}

int shm_msg_type(const void *buf, size_t len, uint32_t *type) {
    struct wire_hdr h;
    if (!buf || len < sizeof h) return CM_EFORMAT;
    memcpy(&h, buf, sizeof h);
    if (h.type < SHM_MSG_SUBMIT || h.type >= SHM_MSG_COUNT || h.flags != 0) return CM_EFORMAT;
    *type = h.type;
    return 0;
}

/* ---- SUBMIT ------------------------------------------------------------------------------ */

static uint64_t submit_size(uint64_t n_prompt, uint64_t n_stop, uint64_t n_bias, uint64_t grammar_len) {
    return sizeof(struct wire_submit) + align8(4 * n_prompt) + align8(4 * n_stop) +
           sizeof(struct shm_logit_bias) * n_bias + sizeof(struct wire_submit_tenant) + sizeof(struct wire_submit_ext) +
           align8(grammar_len);
}

size_t shm_submit_size(const struct shm_submit *s) {
    if (s->n_stop > SHM_MAX_STOP || s->n_bias > SHM_MAX_LOGIT_BIAS || s->grammar_len > SHM_MAX_GRAMMAR) return 0;
    return (size_t)submit_size(s->n_prompt, s->n_stop, s->n_bias, s->grammar_len);
}

uint32_t shm_submit_ring_cap_for(uint32_t max_prompt) {
    uint64_t rec = 8 + submit_size(max_prompt, SHM_MAX_STOP, SHM_MAX_LOGIT_BIAS, SHM_MAX_GRAMMAR);
    uint64_t cap = SHM_RING_CAP_MIN;
    while (cap / 4 < rec) {
        cap <<= 1;
        if (cap > SHM_RING_CAP_MAX) return 0;
    }
    return (uint32_t)cap;
}

void shm_sampling_default(struct shm_sampling *p) {
    memset(p, 0, sizeof *p);
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = 64;
}

int shm_sampling_check(const struct shm_sampling *p) {
    if (!isfinite(p->temperature) || !isfinite(p->top_p) || !isfinite(p->min_p) || !isfinite(p->repeat_penalty) ||
        !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return CM_EINVAL;
    if (p->temperature < 0 || !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) ||
        !(p->repeat_penalty > 0) || p->top_k < 0 || p->penalty_last_n < -1)
        return CM_EINVAL;
    if (p->has_seed > 1 || p->logprobs > 1 || p->top_logprobs > SHM_MAX_TOP_LOGPROBS || p->ignore_eos > 1) return CM_EINVAL;
    return 0;
}

static int sampling_ok(const struct shm_sampling *p) {
    if (shm_sampling_check(p) || p->max_tokens < 1 || p->min_tokens > p->max_tokens) return 0;
    for (size_t i = 0; i < sizeof p->reserved; i++)
        if (p->reserved[i]) return 0;
    return 1;
}

static int ids_ok(const int32_t *ids, uint32_t n) {
    int32_t neg = 0;
    for (uint32_t i = 0; i < n; i++) neg |= ids[i];   /* any negative id sets the sign bit */
    return neg >= 0;
}

static int bias_ok(const struct shm_logit_bias *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (b[i].token < 0 || !isfinite(b[i].bias)) return 0;
    return 1;
}

/* The version-3 fields: flags known, a grammar exactly when flagged, embedding options only
 * for embeddings, never both. */
static int ext_ok(uint32_t flags, uint32_t pooling, uint32_t normalize, uint32_t grammar_len) {
    if (flags & ~(SHM_SUBMIT_EMBED | SHM_SUBMIT_GRAMMAR)) return 0;
    if ((flags & SHM_SUBMIT_EMBED) && (flags & SHM_SUBMIT_GRAMMAR)) return 0;
    if (!!(flags & SHM_SUBMIT_GRAMMAR) != (grammar_len > 0) || grammar_len % 4 || grammar_len > SHM_MAX_GRAMMAR) return 0;
    if (flags & SHM_SUBMIT_EMBED) return pooling >= 1 && pooling <= 3 && normalize <= 1;
    return pooling == 0 && normalize == 0;
}

/* A resumed generation's earlier output: inside the prompt (at least one real prompt id before
 * it) and short of max_tokens (else it was finished). */
static int generated_ok(uint32_t n_generated, uint32_t n_prompt, const struct shm_sampling *sp) {
    return n_generated == 0 || (n_generated < n_prompt && n_generated < sp->max_tokens);
}

int shm_submit_encode(const struct shm_submit *s, void *buf, size_t cap, size_t *len) {
    if (s->n_stop > SHM_MAX_STOP || s->n_bias > SHM_MAX_LOGIT_BIAS || s->grammar_len > SHM_MAX_GRAMMAR) return CM_ETOOBIG;
    if (s->req_id == 0 || s->n_prompt < 1 || !s->prompt || (s->n_bias && !s->bias) ||
        !generated_ok(s->n_generated, s->n_prompt, &s->sp) || !sampling_ok(&s->sp) || !ids_ok(s->prompt, s->n_prompt) ||
        !ids_ok(s->stop, s->n_stop) || !bias_ok(s->bias, s->n_bias) || !ext_ok(s->flags, s->pooling, s->normalize, s->grammar_len) ||
        (s->grammar_len && !s->grammar) || s->weight > SHM_MAX_WEIGHT)
        return CM_EINVAL;
    uint64_t need = submit_size(s->n_prompt, s->n_stop, s->n_bias, s->grammar_len);
    if (need > cap) return CM_ERANGE;
    struct wire_submit w;
    memset(&w, 0, sizeof w);
    w.h.type = SHM_MSG_SUBMIT;
    w.req_id = s->req_id;
    w.priority = s->priority;
    w.sp = s->sp;
    w.n_prompt = s->n_prompt;
    w.n_stop = (uint16_t)s->n_stop;
    w.n_bias = (uint16_t)s->n_bias;
    w.n_generated = s->n_generated;
    uint8_t *p = buf;
    memcpy(p, &w, sizeof w);
    p += sizeof w;
    size_t n = 4 * (size_t)s->n_prompt;
    memcpy(p, s->prompt, n);
    memset(p + n, 0, align8(n) - n);
    p += align8(n);
    n = 4 * (size_t)s->n_stop;
    if (n) memcpy(p, s->stop, n);
    memset(p + n, 0, align8(n) - n);
    p += align8(n);
    if (s->n_bias) memcpy(p, s->bias, sizeof(struct shm_logit_bias) * s->n_bias);
    p += sizeof(struct shm_logit_bias) * s->n_bias;
    struct wire_submit_tenant t = { s->tenant, s->weight ? s->weight : 1, 0 };
    memcpy(p, &t, sizeof t);
    p += sizeof t;
    struct wire_submit_ext x = { s->flags, s->pooling, s->normalize, 0, s->grammar_len, 0 };
    memcpy(p, &x, sizeof x);
    p += sizeof x;
    if (s->grammar_len) memcpy(p, s->grammar, s->grammar_len);
    memset(p + s->grammar_len, 0, align8(s->grammar_len) - s->grammar_len);
    *len = (size_t)need;
    return 0;
}

int shm_submit_decode(const void *buf, size_t len, struct shm_submit *out) {
    struct wire_submit w;
    if (get_hdr(buf, len, SHM_MSG_SUBMIT) || len < sizeof w) return CM_EFORMAT;
    memcpy(&w, buf, sizeof w);
    if (w.req_id == 0 || w.reserved || w.reserved2 || w.n_prompt < 1 || w.n_stop > SHM_MAX_STOP ||
        w.n_bias > SHM_MAX_LOGIT_BIAS || !sampling_ok(&w.sp) || !generated_ok(w.n_generated, w.n_prompt, &w.sp) ||
        submit_size(w.n_prompt, w.n_stop, w.n_bias, 0) > len)
        return CM_EFORMAT;
    struct wire_submit_ext x;
    uint64_t xoff = submit_size(w.n_prompt, w.n_stop, w.n_bias, 0) - sizeof x;
    memcpy(&x, (const uint8_t *)buf + xoff, sizeof x);
    if (x.reserved || x.reserved2 || !ext_ok(x.flags, x.pooling, x.normalize, x.grammar_len) ||
        submit_size(w.n_prompt, w.n_stop, w.n_bias, x.grammar_len) != len)
        return CM_EFORMAT;
    const uint8_t *p = (const uint8_t *)buf + sizeof w;
    memset(out, 0, sizeof *out);
    out->req_id = w.req_id;
    out->priority = w.priority;
    out->sp = w.sp;
    out->n_prompt = w.n_prompt;
    out->n_generated = w.n_generated;
    out->prompt = (const int32_t *)p;
    p += align8(4 * (uint64_t)w.n_prompt);
    out->n_stop = w.n_stop;
    memcpy(out->stop, p, 4 * (size_t)w.n_stop);
    p += align8(4 * (uint64_t)w.n_stop);
    out->n_bias = w.n_bias;
    out->bias = w.n_bias ? (const struct shm_logit_bias *)p : NULL;
    struct wire_submit_tenant t;
    memcpy(&t, p + sizeof(struct shm_logit_bias) * w.n_bias, sizeof t);
    if (t.weight < 1 || t.weight > SHM_MAX_WEIGHT || t.reserved) return CM_EFORMAT;
    out->tenant = t.tenant;
    out->weight = t.weight;
    out->flags = x.flags;
    out->pooling = x.pooling;
    out->normalize = x.normalize;
    out->grammar_len = x.grammar_len;
    out->grammar = x.grammar_len ? (const uint8_t *)buf + xoff + sizeof x : NULL;
    if (!ids_ok(out->prompt, out->n_prompt) || !ids_ok(out->stop, out->n_stop) ||
        !bias_ok(out->bias, out->n_bias))
        return CM_EFORMAT;
    return 0;
}

/* ---- CANCEL ------------------------------------------------------------------------------ */

int shm_cancel_encode(uint64_t req_id, void *buf, size_t cap, size_t *len) {
    if (req_id == 0) return CM_EINVAL;
    if (cap < SHM_CANCEL_SIZE) return CM_ERANGE;
    put_hdr(buf, SHM_MSG_CANCEL);
    memcpy((uint8_t *)buf + 8, &req_id, 8);
    *len = SHM_CANCEL_SIZE;
    return 0;
}

int shm_cancel_decode(const void *buf, size_t len, uint64_t *req_id) {
    if (get_hdr(buf, len, SHM_MSG_CANCEL) || len != SHM_CANCEL_SIZE) return CM_EFORMAT;
    uint64_t id;
    memcpy(&id, (const uint8_t *)buf + 8, 8);
    if (id == 0) return CM_EFORMAT;
    *req_id = id;
    return 0;
}

/* ---- DONE -------------------------------------------------------------------------------- */

static int done_ok(const struct shm_done *d) {
    return d->req_id != 0 && d->finish > SHM_FINISH_NONE && d->finish < SHM_FINISH_COUNT &&
           d->cached_prompt_tokens <= d->prompt_tokens;
}

const char *shm_finish_name(int finish) {
    static const char *const names[SHM_FINISH_COUNT] = { "none", "stop", "length", "ctx", "cancelled", "error" };
    return finish >= 0 && finish < SHM_FINISH_COUNT ? names[finish] : "?";
}

int shm_done_encode(const struct shm_done *d, void *buf, size_t cap, size_t *len) {
    if (!done_ok(d)) return CM_EINVAL;
    if (cap < SHM_DONE_SIZE) return CM_ERANGE;
    put_hdr(buf, SHM_MSG_DONE);
    memcpy((uint8_t *)buf + 8, d, sizeof *d);
    *len = SHM_DONE_SIZE;
    return 0;
}

int shm_done_decode(const void *buf, size_t len, struct shm_done *out) {
    if (get_hdr(buf, len, SHM_MSG_DONE) || len != SHM_DONE_SIZE) return CM_EFORMAT;
    memcpy(out, (const uint8_t *)buf + 8, sizeof *out);
    return done_ok(out) ? 0 : CM_EFORMAT;
}

/* ---- ERROR ------------------------------------------------------------------------------- */

/* Message length after truncation to SHM_ERR_MSG_MAX, backing off so a UTF-8 sequence is not cut. */
static size_t msg_clip(const char *msg) {
    size_t n = msg ? strnlen(msg, SHM_ERR_MSG_MAX + 1) : 0;
    if (n > SHM_ERR_MSG_MAX) {
        n = SHM_ERR_MSG_MAX;
        while (n > 0 && ((unsigned char)msg[n] & 0xC0) == 0x80) n--;
    }
    return n;
}

size_t shm_error_size(size_t msg_len) {
    if (msg_len > SHM_ERR_MSG_MAX) msg_len = SHM_ERR_MSG_MAX;
    return sizeof(struct wire_error) + (size_t)align8(msg_len);
}

int shm_error_encode(uint64_t req_id, int code, const char *msg, void *buf, size_t cap, size_t *len) {
    if (code >= 0) return CM_EINVAL;
    size_t n = msg_clip(msg);
    size_t need = shm_error_size(n);
    if (need > cap) return CM_ERANGE;
    struct wire_error w = { { SHM_MSG_ERROR, 0 }, req_id, code, (uint32_t)n };
    uint8_t *p = buf;
    memcpy(p, &w, sizeof w);
    if (n) memcpy(p + sizeof w, msg, n);
    memset(p + sizeof w + n, 0, need - sizeof w - n);
    *len = need;
    return 0;
}

int shm_error_decode(const void *buf, size_t len, struct shm_error *out) {
    struct wire_error w;
    if (get_hdr(buf, len, SHM_MSG_ERROR) || len < sizeof w) return CM_EFORMAT;
    memcpy(&w, buf, sizeof w);
    if (w.code >= 0 || w.msg_len > SHM_ERR_MSG_MAX || len != sizeof w + align8(w.msg_len)) return CM_EFORMAT;
    out->req_id = w.req_id;
    out->code = w.code;
    out->msg_len = w.msg_len;
    memcpy(out->msg, (const uint8_t *)buf + sizeof w, w.msg_len);
    out->msg[w.msg_len] = 0;
    if (memchr(out->msg, 0, w.msg_len)) return CM_EFORMAT;   /* no NUL inside the message */
    return 0;
}

/* ---- TOKENS ------------------------------------------------------------------------------ */

size_t shm_tokens_size(uint32_t n_tok, uint32_t n_top) {
    return sizeof(struct wire_tokens) + (size_t)n_tok * sizeof(struct shm_tok) + (size_t)n_top * sizeof(struct shm_top);
}

int shm_tokens_begin(struct shm_tokens_w *w, void *buf, size_t cap, uint64_t step) {
    if (cap < sizeof(struct wire_tokens)) return CM_ERANGE;
    struct wire_tokens t = { { SHM_MSG_TOKENS, 0 }, 0, 0, step };
    memcpy(buf, &t, sizeof t);
    w->buf = buf;
    w->cap = cap;
    w->len = sizeof t;
    w->n = 0;
    return 0;
}

static int tok_ok(const struct shm_tok *t) {
    return t->token >= 0 && t->n_top <= SHM_MAX_TOP_LOGPROBS && !(t->flags & ~(SHM_TOK_LOGPROB | SHM_TOK_ADMIT)) &&
           t->reserved == 0 && !((t->flags & SHM_TOK_LOGPROB) && isnan(t->logprob));
}

static int tops_ok(const struct shm_top *top, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (top[i].token < 0 || isnan(top[i].logprob)) return 0;
    return 1;
}

int shm_tokens_add_admit(struct shm_tokens_w *w, const struct shm_tok *t, const struct shm_top *top,
                         const struct shm_tok_admit *a) {
    struct shm_tok e = *t;
    e.reserved = 0;
    if (!(e.flags & SHM_TOK_LOGPROB)) e.logprob = 0;
    if (!tok_ok(&e) || (e.n_top && !top) || !tops_ok(top, e.n_top) || !(e.flags & SHM_TOK_ADMIT) != !a ||
        (a && a->reserved))
        return CM_EINVAL;
    size_t tops = (size_t)e.n_top * sizeof *top, need = sizeof e + tops + (a ? sizeof *a : 0);
    if (need > w->cap - w->len) return CM_EFULL;
    memcpy(w->buf + w->len, &e, sizeof e);
    if (e.n_top) memcpy(w->buf + w->len + sizeof e, top, tops);
    if (a) memcpy(w->buf + w->len + sizeof e + tops, a, sizeof *a);
    w->len += need;
    w->n++;
    return 0;
}

int shm_tokens_add(struct shm_tokens_w *w, const struct shm_tok *t, const struct shm_top *top) {
    return shm_tokens_add_admit(w, t, top, NULL);
}

size_t shm_tokens_end(struct shm_tokens_w *w) {
    memcpy(w->buf + offsetof(struct wire_tokens, n), &w->n, sizeof w->n);
    return w->len;
}

/* Reads the entry at rd->off into *t after bounds and sanity checks; returns its size or 0. */
static size_t entry_at(const struct shm_tokens_r *rd, size_t off, struct shm_tok *t) {
    if (rd->len - off < sizeof *t) return 0;
    memcpy(t, rd->buf + off, sizeof *t);
    size_t tops = (size_t)t->n_top * sizeof(struct shm_top);
    size_t sz = sizeof *t + tops + (t->flags & SHM_TOK_ADMIT ? sizeof(struct shm_tok_admit) : 0);
    if (!tok_ok(t) || rd->len - off < sz) return 0;
    if (!tops_ok((const struct shm_top *)(rd->buf + off + sizeof *t), t->n_top)) return 0;
    if (t->flags & SHM_TOK_ADMIT) {
        struct shm_tok_admit a;
        memcpy(&a, rd->buf + off + sizeof *t + tops, sizeof a);
        if (a.reserved) return 0;
    }
    return sz;
}

int shm_tokens_open(struct shm_tokens_r *rd, const void *buf, size_t len) {
    struct wire_tokens w;
    if (get_hdr(buf, len, SHM_MSG_TOKENS) || len < sizeof w) return CM_EFORMAT;
    memcpy(&w, buf, sizeof w);
    if (w.reserved != 0 || w.n > (len - sizeof w) / sizeof(struct shm_tok)) return CM_EFORMAT;
    rd->buf = buf;
    rd->len = len;
    rd->off = sizeof w;
    rd->n = w.n;
    rd->i = 0;
    rd->step = w.step;
    rd->adm = NULL;
    /* Validate every entry now so that a consumer never acts on half of a corrupt record. */
    size_t off = sizeof w;
    struct shm_tok t;
    for (uint32_t i = 0; i < w.n; i++) {
        size_t sz = entry_at(rd, off, &t);
        if (!sz) return CM_EFORMAT;
        off += sz;
    }
    return off == len ? 0 : CM_EFORMAT;
}

int shm_tokens_next(struct shm_tokens_r *rd, struct shm_tok *t, const struct shm_top **top) {
    if (rd->i >= rd->n) return CM_EEMPTY;
    size_t sz = entry_at(rd, rd->off, t);
    if (!sz) return CM_EFORMAT;
    *top = t->n_top ? (const struct shm_top *)(rd->buf + rd->off + sizeof *t) : NULL;
    rd->adm = t->flags & SHM_TOK_ADMIT ? rd->buf + rd->off + sizeof *t + (size_t)t->n_top * sizeof(struct shm_top) : NULL;
    rd->off += sz;
    rd->i++;
    return 0;
}

/* ---- VOCAB ------------------------------------------------------------------------------- */

size_t shm_vocab_size(uint32_t count, uint32_t bytes_len) {
    return sizeof(struct wire_vocab) + (size_t)align8(4 * ((uint64_t)count + 1)) + (size_t)align8(bytes_len);
}

static int vocab_ok(uint32_t n_total, uint32_t first, uint32_t count, const uint32_t *off, uint32_t bytes_len) {
    if (n_total < 1 || count < 1 || first >= n_total || count > n_total - first) return 0;
    if (off) {
        uint32_t prev = 0;
        if (off[0] != 0 || off[count] != bytes_len) return 0;
        for (uint32_t i = 1; i <= count; i++) {
            if (off[i] < prev) return 0;
            prev = off[i];
        }
    }
    return 1;
}

int shm_vocab_encode(const struct shm_vocab *v, void *buf, size_t cap, size_t *len) {
    if (!v->off || (v->bytes_len && !v->bytes) || !vocab_ok(v->n_total, v->first, v->count, v->off, v->bytes_len))
        return CM_EINVAL;
    size_t need = shm_vocab_size(v->count, v->bytes_len);
    if (need > cap) return CM_ERANGE;
    struct wire_vocab w = { { SHM_MSG_VOCAB, 0 }, v->n_total, v->first, v->count, v->bytes_len };
    uint8_t *p = buf;
    memcpy(p, &w, sizeof w);
    p += sizeof w;
    size_t n = 4 * ((size_t)v->count + 1);
    memcpy(p, v->off, n);
    memset(p + n, 0, align8(n) - n);
    p += align8(n);
    if (v->bytes_len) memcpy(p, v->bytes, v->bytes_len);
    memset(p + v->bytes_len, 0, align8(v->bytes_len) - v->bytes_len);
    *len = need;
    return 0;
}

int shm_vocab_decode(const void *buf, size_t len, struct shm_vocab *out) {
    struct wire_vocab w;
    if (get_hdr(buf, len, SHM_MSG_VOCAB) || len < sizeof w) return CM_EFORMAT;
    memcpy(&w, buf, sizeof w);
    if (!vocab_ok(w.n_total, w.first, w.count, NULL, w.bytes_len) || shm_vocab_size(w.count, w.bytes_len) != len)
        return CM_EFORMAT;
    const uint8_t *p = (const uint8_t *)buf + sizeof w;
    out->n_total = w.n_total;
    out->first = w.first;
    out->count = w.count;
    out->bytes_len = w.bytes_len;
    out->off = (const uint32_t *)p;
    out->bytes = p + align8(4 * ((uint64_t)w.count + 1));
    return vocab_ok(w.n_total, w.first, w.count, out->off, w.bytes_len) ? 0 : CM_EFORMAT;
}

int shm_send_vocab(struct shm_ring *r, const struct shm_vocab *v) {
    size_t need = shm_vocab_size(v->count, v->bytes_len), len;
    void *p;
    int rc = shm_ring_reserve(r, need, &p);
    if (rc) return rc;
    rc = shm_vocab_encode(v, p, need, &len);
    return rc ? rc : shm_ring_commit(r, len);
}

/* ---- EMBED ------------------------------------------------------------------------------- */

size_t shm_embed_size(uint32_t n_embd) { return sizeof(struct wire_embed) + (size_t)align8(4 * (uint64_t)n_embd); }

static int floats_ok(const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

int shm_embed_encode(const struct shm_embed *e, void *buf, size_t cap, size_t *len) {
    if (e->req_id == 0 || e->n_embd < 1 || e->n_embd > SHM_MAX_EMBD || !e->v || !floats_ok(e->v, e->n_embd)) return CM_EINVAL;
    size_t need = shm_embed_size(e->n_embd);
    if (need > cap) return CM_ERANGE;
    struct wire_embed w = { { SHM_MSG_EMBED, 0 }, e->req_id, e->n_embd, e->prompt_tokens };
    uint8_t *p = buf;
    memcpy(p, &w, sizeof w);
    memcpy(p + sizeof w, e->v, 4 * (size_t)e->n_embd);
    memset(p + sizeof w + 4 * (size_t)e->n_embd, 0, need - sizeof w - 4 * (size_t)e->n_embd);
    *len = need;
    return 0;
}

int shm_embed_decode(const void *buf, size_t len, struct shm_embed *out) {
    struct wire_embed w;
    if (get_hdr(buf, len, SHM_MSG_EMBED) || len < sizeof w) return CM_EFORMAT;
    memcpy(&w, buf, sizeof w);
    if (w.req_id == 0 || w.n_embd < 1 || w.n_embd > SHM_MAX_EMBD || shm_embed_size(w.n_embd) != len) return CM_EFORMAT;
    out->req_id = w.req_id;
    out->n_embd = w.n_embd;
    out->prompt_tokens = w.prompt_tokens;
    out->v = (const float *)((const uint8_t *)buf + sizeof w);
    return floats_ok(out->v, w.n_embd) ? 0 : CM_EFORMAT;
}

int shm_send_embed(struct shm_ring *r, const struct shm_embed *e) {
    size_t need = shm_embed_size(e->n_embd), len;
    if (e->n_embd < 1 || e->n_embd > SHM_MAX_EMBD) return CM_EINVAL;
    void *p;
    int rc = shm_ring_reserve(r, need, &p);
    if (rc) return rc;
    rc = shm_embed_encode(e, p, need, &len);
    return rc ? rc : shm_ring_commit(r, len);
}

int shm_tokens_admit(const struct shm_tokens_r *rd, struct shm_tok_admit *out) {
    if (!rd->adm) return CM_ENOENT;
    memcpy(out, rd->adm, sizeof *out);
    return 0;
}

/* ---- ring convenience -------------------------------------------------------------------- */

int shm_send_submit(struct shm_ring *r, const struct shm_submit *s) {
    size_t need = shm_submit_size(s), len;
    if (need == 0) return CM_ETOOBIG;
    void *p;
    int rc = shm_ring_reserve(r, need, &p);
    if (rc) return rc;
    rc = shm_submit_encode(s, p, need, &len);
    return rc ? rc : shm_ring_commit(r, len);
}

int shm_send_cancel(struct shm_ring *r, uint64_t req_id) {
    void *p;
    size_t len;
    if (req_id == 0) return CM_EINVAL;
    int rc = shm_ring_reserve(r, SHM_CANCEL_SIZE, &p);
    if (rc) return rc;
    rc = shm_cancel_encode(req_id, p, SHM_CANCEL_SIZE, &len);
    return rc ? rc : shm_ring_commit(r, len);
}

int shm_send_done(struct shm_ring *r, const struct shm_done *d) {
    void *p;
    size_t len;
    if (!done_ok(d)) return CM_EINVAL;
    int rc = shm_ring_reserve(r, SHM_DONE_SIZE, &p);
    if (rc) return rc;
    rc = shm_done_encode(d, p, SHM_DONE_SIZE, &len);
    return rc ? rc : shm_ring_commit(r, len);
}

int shm_send_error(struct shm_ring *r, uint64_t req_id, int code, const char *msg) {
    void *p;
    size_t len, need = shm_error_size(msg_clip(msg));
    if (code >= 0) return CM_EINVAL;
    int rc = shm_ring_reserve(r, need, &p);
    if (rc) return rc;
    rc = shm_error_encode(req_id, code, msg, p, need, &len);
    return rc ? rc : shm_ring_commit(r, len);
}
