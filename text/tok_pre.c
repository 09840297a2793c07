/* tok_pre: pre-tokenizers of byte-level BPE vocabularies, as hand-written matchers (no regex
 * library). Each pre-tokenizer is a list of stages, like llama.cpp's list of regexes: a stage
 * splits every piece the previous stage produced into the leftmost-first matches of its
 * pattern and the gaps between them (gaps are pieces too), and the last stage's pieces are the
 * words BPE runs on. Patterns see only their piece: lookahead stops at the piece's end.
 *
 * The matchers for the GPT-2 and Llama-3/Qwen2 patterns follow regex semantics (leftmost
 * alternative that matches, greedy quantifiers with backtracking) on Unicode classes from
 * tok_unicode_tables.c; the small patterns of the other pre-tokenizers are written out below,
 * each next to the pattern it implements. Every matcher runs in time linear in what it
 * consumes, except that a position where no pattern starts costs O(1). */
#include "tok_internal.h"
#include "../common/cm_err.h"

#include <string.h>

#define IN_RANGE 0x100u /* flag added by fl(): the position is inside the piece */

typedef size_t (*match_fn)(const uint8_t *s, size_t p, size_t e);

/* flags of the code point at p (0 at or past e); *l its length */
static inline unsigned fl(const uint8_t *s, size_t p, size_t e, int *l) {
    if (p >= e) { *l = 0; return 0; }
    if (s[p] < 0x80) { *l = 1; return tok__uflags(s[p]) | IN_RANGE; }
    uint32_t cp = tok__utf8_dec(s + p, e - p, l);
    return tok__uflags(cp) | IN_RANGE;
}

static inline size_t run_of(const uint8_t *s, size_t q, size_t e, unsigned mask) {
    int l;
    while (q < e && (fl(s, q, e, &l) & mask)) q += (size_t)l;
    return q;
}

/* 's|'t|'re|'ve|'m|'ll|'d, case-insensitive when ci (only ASCII letters can fold to these) */
static inline size_t contraction(const uint8_t *s, size_t p, size_t e, int ci) {
    if (s[p] != '\'' || p + 1 >= e) return p;
    uint8_t a = s[p + 1], b = p + 2 < e ? s[p + 2] : 0;
    if (ci) {
        if (a >= 'A' && a <= 'Z') a |= 0x20;
        if (b >= 'A' && b <= 'Z') b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return p;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (HF's ByteLevel pattern; llama.cpp's, without the final \s+, yields the same pieces). */
static size_t m_gpt2(const uint8_t *s, size_t p, size_t e) {
    size_t q = contraction(s, p, e, 0);
    if (q > p) return q;
    int l, l2;
    unsigned f = fl(s, p, e, &l);
    size_t a = p;
    unsigned f2 = f;
    if (s[p] == ' ') { a = p + 1; f2 = fl(s, a, e, &l2); }
    if (f2 & TOK__U_L) return run_of(s, a, e, TOK__U_L);
    if (f2 & TOK__U_N) return run_of(s, a, e, TOK__U_N);
    if ((f2 & IN_RANGE) && !(f2 & (TOK__U_WS | TOK__U_L | TOK__U_N))) {
        q = a;
        while (q < e) {
            unsigned g = fl(s, q, e, &l2);
            if (g & (TOK__U_WS | TOK__U_L | TOK__U_N)) break;
            q += (size_t)l2;
        }
        return q;
    }
    /* whitespace: \s+(?!\S) leaves the last one for the next piece unless the run ends the piece */
    size_t last = p;
    int nws = 0;
    q = p;
    while (q < e && (fl(s, q, e, &l2) & TOK__U_WS)) { last = q; q += (size_t)l2; nws++; }
    if (nws > 1 && q < e) return last;
    if (nws > 0) return q;
    return p + (size_t)l;
}

/* Llama 3 (maxd 3) and Qwen2 (maxd 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxd}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static inline size_t m_llama3_common(const uint8_t *s, size_t p, size_t e, int maxd) {
    size_t q = contraction(s, p, e, 1);
    if (q > p) return q;
    int l, l2;
    unsigned f = fl(s, p, e, &l);
    uint8_t c = s[p];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (f & TOK__U_L) return run_of(s, p + (size_t)l, e, TOK__U_L);
    if (c != '\r' && c != '\n' && !(f & TOK__U_N) && (fl(s, p + (size_t)l, e, &l2) & TOK__U_L))
        return run_of(s, p + (size_t)l, e, TOK__U_L);
    /* \p{N}{1,maxd} */
    if (f & TOK__U_N) {
        q = p;
        for (int k = 0; k < maxd && q < e && (fl(s, q, e, &l2) & TOK__U_N); k++) q += (size_t)l2;
        return q;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t a = p;
    unsigned f2 = f;
    if (c == ' ') { a = p + 1; f2 = fl(s, a, e, &l2); }
    if ((f2 & IN_RANGE) && !(f2 & (TOK__U_WS | TOK__U_L | TOK__U_N))) {
        q = a;
        while (q < e) {
            unsigned g = fl(s, q, e, &l2);
            if (g & (TOK__U_WS | TOK__U_L | TOK__U_N)) break;
            q += (size_t)l2;
        }
        while (q < e && (s[q] == '\r' || s[q] == '\n')) q++;
        return q;
    }
    /* \s*[\r\n]+ (up to the last CR/LF of the whitespace run), \s+(?!\S), \s+ */
    size_t last = p, last_rn = 0;
    int nws = 0;
    q = p;
    while (q < e && (fl(s, q, e, &l2) & TOK__U_WS)) {
        if (s[q] == '\r' || s[q] == '\n') last_rn = q + 1;
        last = q;
        q += (size_t)l2;
        nws++;
    }
    if (last_rn) return last_rn;
    if (nws > 1 && q < e) return last;
    if (nws > 0) return q;
    return p + (size_t)l;
}
static size_t m_llama3(const uint8_t *s, size_t p, size_t e) { return m_llama3_common(s, p, e, 3); }
static size_t m_qwen2(const uint8_t *s, size_t p, size_t e) { return m_llama3_common(s, p, e, 1); }

static size_t run_cp(const uint8_t *s, size_t q, size_t e, int (*in)(uint32_t));

/* deepseek-v3, third stage:
 * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (the whitespace alternatives as in Llama 3); p where nothing matches. */
static size_t m_deepseek3(const uint8_t *s, size_t p, size_t e) {
    int l, l2;
    uint8_t c = s[p];
    int ascii_punct = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
    if (ascii_punct && p + 1 < e && ((s[p + 1] | 0x20) >= 'a' && (s[p + 1] | 0x20) <= 'z')) {
        size_t q = p + 1;
        while (q < e && (s[q] | 0x20) >= 'a' && (s[q] | 0x20) <= 'z') q++;
        return q;
    }
    unsigned f = fl(s, p, e, &l);
    if (f & (TOK__U_L | TOK__U_M)) return run_of(s, p, e, TOK__U_L | TOK__U_M);
    if (c != '\r' && c != '\n' && !(f & (TOK__U_L | TOK__U_P | TOK__U_S)) && (fl(s, p + (size_t)l, e, &l2) & (TOK__U_L | TOK__U_M)))
        return run_of(s, p + (size_t)l, e, TOK__U_L | TOK__U_M);
    size_t a = p;
    unsigned f2 = f;
    if (c == ' ') { a = p + 1; f2 = fl(s, a, e, &l2); }
    if (f2 & (TOK__U_P | TOK__U_S)) {
        size_t q = run_of(s, a, e, TOK__U_P | TOK__U_S);
        while (q < e && (s[q] == '\r' || s[q] == '\n')) q++;
        return q;
    }
    if (!(f & TOK__U_WS)) return p;
    size_t last = p, last_rn = 0, q = p;
    int nws = 0;
    while (q < e && (fl(s, q, e, &l2) & TOK__U_WS)) {
        if (s[q] == '\r' || s[q] == '\n') last_rn = q + 1;
        last = q;
        q += (size_t)l2;
        nws++;
    }
    if (last_rn) return last_rn;
    if (nws > 1 && q < e) return last;
    return q;
}

/* \p{N}{1,3} */
static size_t m_digits3(const uint8_t *s, size_t p, size_t e) {
    int l;
    size_t q = p;
    for (int k = 0; k < 3 && (fl(s, q, e, &l) & TOK__U_N); k++) q += (size_t)l;
    return q;
}

/* [一-龥぀-ゟ゠-ヿ]+ */
static int cjk_kana(uint32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF); }
static size_t m_cjk_kana(const uint8_t *s, size_t p, size_t e) { return run_cp(s, p, e, cjk_kana); }

/* GPT-4o / Llama 4 (maxd 3, contractions) and Tekken (maxd 1, none), as llama.cpp adapts them
 * (letter cases by ASCII only: a letter is "upper" unless in a-z, "lower" unless in A-Z):
 * [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,maxd}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with U = (?=\p{L})[^a-z], W = (?=\p{L})[^A-Z], C = (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]). */
static inline size_t m_gpt4o_common(const uint8_t *s, size_t p, size_t e, int maxd, int contractions) {
    int l, l2;
    unsigned f = fl(s, p, e, &l);
    uint8_t c = s[p];
    size_t q = p;
    if (!(f & TOK__U_L) && c != '\r' && c != '\n' && !(f & TOK__U_N) && (fl(s, p + (size_t)l, e, &l2) & TOK__U_L)) q = p + (size_t)l;
    if (fl(s, q, e, &l2) & TOK__U_L) {
        /* the run of letters from q: U* stops at the first a-z; W+ runs from there over letters not in A-Z */
        size_t r = q, first_lower = 0, last_wide_end = 0;
        int have_lower = 0;
        while (r < e) {
            unsigned g = fl(s, r, e, &l2);
            if (!(g & TOK__U_L)) break;
            if (s[r] >= 'a' && s[r] <= 'z') { first_lower = r; have_lower = 1; break; }
            if (s[r] >= 0x80) last_wide_end = r + (size_t)l2; /* a non-ASCII letter is both U and W */
            r += (size_t)l2;
        }
        size_t end;
        if (have_lower) {
            end = first_lower;
            while (end < e) {
                unsigned g = fl(s, end, e, &l2);
                if (!(g & TOK__U_L) || (s[end] >= 'A' && s[end] <= 'Z')) break;
                end += (size_t)l2;
            }
        } else if (last_wide_end) {
            end = last_wide_end; /* U* gives back up to the last letter that is also W */
        } else {
            end = r;             /* second alternative: U+ (all ASCII capitals), W* empty */
        }
        if (contractions && end < e) {
            size_t k = contraction(s, end, e, 1);
            if (k > end) end = k;
        }
        return end;
    }
    if (f & TOK__U_N) {
        q = p;
        for (int k = 0; k < maxd && q < e && (fl(s, q, e, &l2) & TOK__U_N); k++) q += (size_t)l2;
        return q;
    }
    size_t a = p;
    unsigned f2 = f;
    if (c == ' ') { a = p + 1; f2 = fl(s, a, e, &l2); }
    if ((f2 & IN_RANGE) && !(f2 & (TOK__U_WS | TOK__U_L | TOK__U_N))) {
        q = a;
        while (q < e) {
            unsigned g = fl(s, q, e, &l2);
            if (g & (TOK__U_WS | TOK__U_L | TOK__U_N)) break;
            q += (size_t)l2;
        }
        while (q < e && (s[q] == '\r' || s[q] == '\n' || s[q] == '/')) q++;
        return q;
    }
    size_t last = p, last_rn = 0;
    int nws = 0;
    q = p;
    while (q < e && (fl(s, q, e, &l2) & TOK__U_WS)) {
        if (s[q] == '\r' || s[q] == '\n') last_rn = q + 1;
        last = q;
        q += (size_t)l2;
        nws++;
    }
    if (last_rn) return last_rn;
    if (nws > 1 && q < e) return last;
    if (nws > 0) return q;
    return p + (size_t)l;
}
static size_t m_gpt4o(const uint8_t *s, size_t p, size_t e) { return m_gpt4o_common(s, p, e, 3, 1); }
static size_t m_tekken(const uint8_t *s, size_t p, size_t e) { return m_gpt4o_common(s, p, e, 1, 0); }

/* [\r\n] */
static size_t m_crlf(const uint8_t *s, size_t p, size_t e) { return (s[p] == '\r' || s[p] == '\n') ? p + 1 : p; }

/* \s?X+ for a class X given as flags */
static inline size_t ws_opt_run(const uint8_t *s, size_t p, size_t e, unsigned mask) {
    int l, l2;
    unsigned f = fl(s, p, e, &l);
    if (f & mask) return run_of(s, p, e, mask);
    if ((f & TOK__U_WS) && (fl(s, p + (size_t)l, e, &l2) & mask)) return run_of(s, p + (size_t)l, e, mask);
    return p;
}
/* \s?\p{L}+ */
static size_t m_ws_letters(const uint8_t *s, size_t p, size_t e) { return ws_opt_run(s, p, e, TOK__U_L); }
/* \s?\p{P}+ */
static size_t m_ws_punct(const uint8_t *s, size_t p, size_t e) { return ws_opt_run(s, p, e, TOK__U_P); }
/* \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+ (deepseek-llm's cased letters) */
static size_t m_ds_letters(const uint8_t *s, size_t p, size_t e) { return ws_opt_run(s, p, e, TOK__U_DSL); }

/* [!-/:-~！-／：-～‘-‟　-。] */
static inline int ds_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E) || (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF5E) ||
           (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
}
static size_t run_cp(const uint8_t *s, size_t q, size_t e, int (*in)(uint32_t)) {
    int l;
    while (q < e && in(tok__utf8_dec(s + q, e - q, &l))) q += (size_t)l;
    return q;
}
/* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
static size_t m_ds_punct(const uint8_t *s, size_t p, size_t e) {
    int l, l2;
    uint32_t c = tok__utf8_dec(s + p, e - p, &l);
    if ((tok__uflags(c) & TOK__U_WS) && p + (size_t)l < e && ds_punct(tok__utf8_dec(s + p + l, e - p - (size_t)l, &l2)))
        return run_cp(s, p + (size_t)l, e, ds_punct);
    if (ds_punct(c)) return run_cp(s, p, e, ds_punct);
    return p;
}

/* [一-龥ࠀ-一가-퟿]+ */
static int cjk(uint32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) || (c >= 0xAC00 && c <= 0xD7FF); }
static size_t m_cjk(const uint8_t *s, size_t p, size_t e) { return run_cp(s, p, e, cjk); }

/* \p{N}+ */
static size_t m_digits(const uint8_t *s, size_t p, size_t e) { return run_of(s, p, e, TOK__U_N); }
/* \p{N} */
static size_t m_digit(const uint8_t *s, size_t p, size_t e) {
    int l;
    return (fl(s, p, e, &l) & TOK__U_N) ? p + (size_t)l : p;
}
/* [0-9][0-9][0-9] */
static size_t m_three_digits(const uint8_t *s, size_t p, size_t e) {
    if (p + 3 <= e && s[p] - '0' < 10u && s[p + 1] - '0' < 10u && s[p + 2] - '0' < 10u) return p + 3;
    return p;
}

/* [\p{P}\$\+<=>\^~\|]+ (default) and [\p{P}\$\+<=>\^~\|`]+ (falcon) */
static int punct_default(uint32_t c) { return (tok__uflags(c) & TOK__U_P) || (c < 0x80 && strchr("$+<=>^~|", (int)c) && c); }
static int punct_falcon(uint32_t c) { return punct_default(c) || c == '`'; }
static size_t m_punct_default(const uint8_t *s, size_t p, size_t e) { return run_cp(s, p, e, punct_default); }
static size_t m_punct_falcon(const uint8_t *s, size_t p, size_t e) { return run_cp(s, p, e, punct_falcon); }

/* \s+$ : handled by the runner (the trailing whitespace of the piece) */
static size_t m_trailing_ws(const uint8_t *s, size_t p, size_t e) { (void)s; (void)e; return p; }

/* HF Metaspace(split=true): a word starts at each '▁' */
static size_t m_metaspace(const uint8_t *s, size_t p, size_t e) {
    size_t q = p;
    if (e - q >= 3 && !memcmp(s + q, "\xe2\x96\x81", 3)) q += 3;
    while (q < e && !(e - q >= 3 && !memcmp(s + q, "\xe2\x96\x81", 3))) q++;
    return q;
}

typedef struct pre_def {
    const char *name;
    int         n;
    match_fn    stage[6];
} pre_def;

static const pre_def pre_defs[TOK__PRE_COUNT] = {
    [TOK__PRE_NONE] = { "none", 0, { 0 } },
    [TOK__PRE_DEFAULT] = { "default", 4, { m_punct_default, m_gpt2, m_digits, m_three_digits } },
    [TOK__PRE_GPT2] = { "gpt-2", 1, { m_gpt2 } },
    [TOK__PRE_LLAMA3] = { "llama-bpe", 1, { m_llama3 } },
    [TOK__PRE_QWEN2] = { "qwen2", 1, { m_qwen2 } },
    [TOK__PRE_DEEPSEEK_LLM] = { "deepseek-llm", 6, { m_crlf, m_ds_letters, m_ds_punct, m_trailing_ws, m_cjk, m_digits } },
    [TOK__PRE_DEEPSEEK_CODER] = { "deepseek-coder", 5, { m_crlf, m_ws_letters, m_ws_punct, m_cjk, m_digit } },
    [TOK__PRE_FALCON] = { "falcon", 3, { m_punct_falcon, m_gpt2, m_three_digits } },
    [TOK__PRE_STARCODER] = { "starcoder", 2, { m_digit, m_gpt2 } },
    [TOK__PRE_METASPACE] = { "metaspace", 1, { m_metaspace } },
    [TOK__PRE_DEEPSEEK3] = { "deepseek-v3", 3, { m_digits3, m_cjk_kana, m_deepseek3 } },
    [TOK__PRE_GPT4O] = { "gpt-4o", 1, { m_gpt4o } },
    [TOK__PRE_TEKKEN] = { "tekken", 1, { m_tekken } },
};

static const struct { const char *name; int pre; } pre_names[] = {
    { "default", TOK__PRE_DEFAULT },       { "gpt-2", TOK__PRE_GPT2 },           { "gpt2", TOK__PRE_GPT2 },
    { "mpt", TOK__PRE_GPT2 },              { "olmo", TOK__PRE_GPT2 },            { "jais", TOK__PRE_GPT2 },
    { "trillion", TOK__PRE_GPT2 },         { "llama3", TOK__PRE_LLAMA3 },        { "llama-v3", TOK__PRE_LLAMA3 },
    { "llama-bpe", TOK__PRE_LLAMA3 },      { "falcon3", TOK__PRE_LLAMA3 },       { "dbrx", TOK__PRE_LLAMA3 },
    { "smaug-bpe", TOK__PRE_LLAMA3 },      { "qwen2", TOK__PRE_QWEN2 },          { "stablelm2", TOK__PRE_QWEN2 },
    { "hunyuan", TOK__PRE_QWEN2 },         { "deepseek-llm", TOK__PRE_DEEPSEEK_LLM }, { "deepseek-coder", TOK__PRE_DEEPSEEK_CODER },
    { "falcon", TOK__PRE_FALCON },         { "starcoder", TOK__PRE_STARCODER },  { "refact", TOK__PRE_STARCODER },
    { "command-r", TOK__PRE_STARCODER },   { "smollm", TOK__PRE_STARCODER },     { "codeshell", TOK__PRE_STARCODER },
    { "exaone", TOK__PRE_STARCODER },      { "minerva-7b", TOK__PRE_STARCODER },
    { "deepseek-r1-qwen", TOK__PRE_QWEN2 }, { "deepseek-v3", TOK__PRE_DEEPSEEK3 }, { "falcon-h1", TOK__PRE_LLAMA3 },
    { "pixtral", TOK__PRE_LLAMA3 },        { "midm-2.0", TOK__PRE_LLAMA3 },      { "lfm2", TOK__PRE_LLAMA3 },
    { "chatglm-bpe", TOK__PRE_LLAMA3 },    { "gpt-4o", TOK__PRE_GPT4O },         { "llama4", TOK__PRE_GPT4O },
    { "tekken", TOK__PRE_TEKKEN },
};

int tok__pre_from_name(const char *name) {
    if (!name) return -1;
    for (size_t i = 0; i < sizeof pre_names / sizeof *pre_names; i++)
        if (!strcmp(name, pre_names[i].name)) return pre_names[i].pre;
    return -1;
}

const char *tok__pre_name(int pre) { return pre >= 0 && pre < TOK__PRE_COUNT ? pre_defs[pre].name : "?"; }

typedef struct runner {
    const uint8_t *s;
    const pre_def *def;
    tok__word_fn   word;
    void          *ctx;
} runner;

static int run(const runner *r, int k, size_t a, size_t b) {
    if (a >= b) return 0;
    if (k == r->def->n) return r->word(r->ctx, a, b);
    match_fn m = r->def->stage[k];
    const uint8_t *s = r->s;
    int rc;
    if (m == m_trailing_ws) {
        size_t t = b;
        while (t > a) {
            size_t q = t - 1;
            while (q > a && (s[q] & 0xC0) == 0x80) q--;
            int l;
            if (!(tok__uflags(tok__utf8_dec(s + q, b - q, &l)) & TOK__U_WS)) break;
            t = q;
        }
        if ((rc = run(r, k + 1, a, t))) return rc;
        return run(r, k + 1, t, b);
    }
    size_t p = a, gap = a;
    while (p < b) {
        size_t q = m(s, p, b);
        if (q > p) {
            if (gap < p && (rc = run(r, k + 1, gap, p))) return rc;
            if ((rc = run(r, k + 1, p, q))) return rc;
            p = gap = q;
        } else {
            p += (size_t)tok__utf8_len(s[p]);
        }
    }
    return gap < b ? run(r, k + 1, gap, b) : 0;
}

int tok__pretokenize(int pre, const uint8_t *text, size_t len, tok__word_fn word, void *ctx) {
    if (pre < 0 || pre >= TOK__PRE_COUNT) return CM_EINVAL;
    runner r = { text, &pre_defs[pre], word, ctx };
    /* the single-stage pre-tokenizers (the common ones) skip the recursion */
    if (r.def->n == 1 && r.def->stage[0] != m_trailing_ws) {
        match_fn m = r.def->stage[0];
        size_t p = 0, gap = 0;
        int rc;
        while (p < len) {
            size_t q = m(text, p, len);
            if (q > p) {
                if (gap < p && (rc = word(ctx, gap, p))) return rc;
                if ((rc = word(ctx, p, q))) return rc;
                p = gap = q;
            } else {
                p += (size_t)tok__utf8_len(text[p]);
            }
        }
        return gap < len ? word(ctx, gap, len) : 0;
    }
    return run(&r, 0, 0, len);
}
