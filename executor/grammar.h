/* grammar: constrained decoding in the executor. A grammar program (a context-free grammar over
 * bytes, compiled by the gateway from a JSON schema, a GBNF grammar or a tool-call format:
 * text/grammar.h) becomes, at every step of a sequence, the mask of the tokens it allows; the
 * sampler draws only among them (executor/sampler.h), and the sequence's parse state then
 * advances by the token drawn.
 *
 * Where the grammar lives, and why. The gateway owns text: it tokenizes, detokenizes and knows
 * what bytes each token stands for (text/tok.h tok_piece_ref, the very bytes the client will
 * see). The executor speaks token ids. Masks must be computed where the logits are, next to the
 * sampler, every step, so the matcher runs here; what it needs from the text side is small and
 * fixed: (1) the program, a few KB per request (SUBMIT carries it, with its hash: shm/shm.h), and
 * (2) the vocabulary's token bytes, sent once per executor start in VOCAB records before the
 * first SUBMIT that needs them. The alternative, compiling schemas here from the model's own
 * tokenizer files, would put a second tokenizer (GGUF and tokenizer.json readers, byte-level BPE
 * and SentencePiece decoding rules) into the executor and let its idea of a token's bytes drift
 * from the gateway's; and a malformed schema must be a 400 before any response header is sent,
 * which only the gateway can do. So: the gateway parses, validates and compiles (cached by schema
 * hash), the executor validates the program again (it is untrusted input to this process), binds
 * it to the vocabulary and keeps it, with every mask it computed, in a cache keyed by the
 * program's hash, so a schema used again costs nothing.
 *
 * The program: rules of alternatives, each a sequence of elements: a byte class (256-bit set), a
 * reference to a rule, or one special token by id (for formats whose markers are control tokens,
 * such as Mistral's [TOOL_CALLS]). Left recursion is refused (ex_gram_check). Multi-byte UTF-8
 * characters are sequences of byte classes, so the matcher never splits a token's bytes.
 *
 * The matcher (the approach of XGrammar and llguidance, written here): a parse state is a set of
 * stacks of grammar positions (a pushdown automaton; the top of each stack is the terminal it
 * expects next; rule references in tail position do not grow the stack). Stacks are hash-consed
 * nodes (position, parent), sets of stacks are interned, and the transition of a set by a byte
 * is memoised, so after warm-up advancing is a table lookup. Masks:
 *  - For each terminal position P the tokens are classified once, walking the token trie from a
 *    stack holding P alone above a sentinel: accepted (the bytes are consumed inside P's rule,
 *    whatever lies below: context-independent), rejected, or uncertain (the rule ends inside the
 *    token and the rest depends on the caller). For a JSON string's characters nearly every token
 *    is decided here and only the few that close the string stay uncertain.
 *  - The mask of a state is the union over its stacks of the accepted set of the top position,
 *    plus its uncertain tokens checked against the real stack by a walk of the trie restricted to
 *    them, plus the end-of-generation ids when the grammar may end here. It is cached per state:
 *    inside a string, a number or a repeated structure the state repeats and the mask is a lookup.
 * The end ids (the request's stop ids: the gateway's end-of-generation tokens) are allowed exactly
 * when the grammar accepts; a token with no bytes (a control token) only where a token element
 * asks for it.
 *
 * Memory: every table grows on demand, the first time a state is seen; between steps
 * ex_gram_compact() rebuilds a grammar's tables from the live states when they pass their soft
 * size (the masks per position stay), and a computation past the hard size fails with CM_ENOMEM
 * (the request then fails; nothing else does).
 *
 * Threads: one thread at a time per ex_gram (the executor's step thread); an ex_gram_vocab is
 * immutable once built and may be shared.
 *
 *   ex_gram_vocab *v; ex_gram_vocab_create(n_vocab, n_tok, off, bytes, &v);  // from VOCAB records
 *   ex_gram *g; ex_gram_create(prog, len, v, end_ids, n_end, &g, err, sizeof err);
 *   ex_gram_state st; ex_gram_state_init(g, &st);
 *   each step: const uint32_t *m; ex_gram_mask(g, &st, &m);   // bit t of m: token t allowed
 *              ... sample among them ...; ex_gram_advance(g, &st, tok);
 *   ex_gram_state_free(&st); ex_gram_destroy(g); ex_gram_vocab_destroy(v);
 */
#ifndef EX_GRAMMAR_H
#define EX_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* ---- the program (wire format, little-endian u32 words) ------------------------------------
 *   u32 magic EX_GRAM_MAGIC, u32 version EX_GRAM_VERSION
 *   u32 n_classes, u32 n_rules, u32 n_elems, u32 root (rule index)
 *   u32 classes[n_classes][8]     256-bit byte sets, bit b of word b/32
 *   u32 rule_start[n_rules]       index into elems of the rule's first alternative
 *   u32 elems[n_elems]            kind << 24 | arg; a rule is its alternatives, each ended by
 *                                 EX_GE_END, the last followed by EX_GE_RULE_END
 */
#define EX_GRAM_MAGIC   0x31524741u  /* "AGR1" */
#define EX_GRAM_VERSION 1u
#define EX_GRAM_MAX_BYTES ((size_t)4 << 20) /* largest program accepted */

enum ex_gram_elem {
    EX_GE_END = 0,      /* end of an alternative */
    EX_GE_CLASS = 1,    /* arg: byte class index */
    EX_GE_REF = 2,      /* arg: rule index */
    EX_GE_TOKEN = 3,    /* arg: token id (a special token matched by id) */
    EX_GE_RULE_END = 4, /* after a rule's last alternative */
};
#define EX_GE(kind, arg) ((uint32_t)(kind) << 24 | (uint32_t)(arg))
#define EX_GE_KIND(e)    ((e) >> 24)
#define EX_GE_ARG(e)     ((e) & 0xFFFFFFu)

/* Checks a program: sizes, every index in range, every rule terminated, a root, and no left
 * recursion (a rule reachable from itself without consuming input, which the matcher could not
 * expand). Returns 0 or CM_EFORMAT with the reason in err. Any thread. */
int ex_gram_check(const void *prog, size_t len, char *err, size_t errlen);

/* A 64-bit hash of the program's bytes (the caches' key). Can't fail. */
uint64_t ex_gram_hash(const void *prog, size_t len);

/* ---- the vocabulary ------------------------------------------------------------------------ */

typedef struct ex_gram_vocab ex_gram_vocab;

/* Builds the token table and trie: tokens [0, n_tok) with bytes[off[i] .. off[i+1]) (an empty
 * token is a control token: never matched by bytes); n_vocab >= n_tok is the model's vocabulary
 * size (the masks' width; ids past n_tok have no bytes). Returns 0, CM_EINVAL, CM_ENOMEM. */
int  ex_gram_vocab_create(int n_vocab, int n_tok, const uint32_t *off, const uint8_t *bytes, ex_gram_vocab **out);
void ex_gram_vocab_destroy(ex_gram_vocab *v); /* accepts NULL */
int  ex_gram_vocab_n(const ex_gram_vocab *v); /* the masks' width in tokens */
/* u32 words of a mask: ceil(n_vocab / 32). */
static inline int ex_gram_mask_words(int n_vocab) { return (n_vocab + 31) / 32; }
static inline int ex_gram_mask_test(const uint32_t *m, int32_t t) { return (m[t >> 5] >> (t & 31)) & 1; }

/* ---- a grammar bound to a vocabulary --------------------------------------------------------- */

typedef struct ex_gram ex_gram;

/* Checks prog (ex_gram_check), copies it and binds it to v (which must outlive g). end_ids: the
 * tokens allowed where the grammar may end (the request's stop ids; copied). Returns 0,
 * CM_EFORMAT (err says why) or CM_ENOMEM. */
int  ex_gram_create(const void *prog, size_t len, const ex_gram_vocab *v, const int32_t *end_ids, int n_end,
                    ex_gram **out, char *err, size_t errlen);
void ex_gram_destroy(ex_gram *g); /* accepts NULL */

/* A sequence's parse state (caller-owned; valid for the grammar it was made for). */
typedef struct ex_gram_state {
    uint32_t set;     /* interned set of stacks in the grammar's tables */
    uint32_t gen;     /* the tables' generation it was made in (ex_gram_compact renumbers) */
    int      done;    /* an end id was accepted: nothing more is allowed */
} ex_gram_state;

/* The state before any token. Returns 0 or CM_ENOMEM. */
int ex_gram_state_init(ex_gram *g, ex_gram_state *st);
/* The mask of st: bit t set when token t is allowed; ex_gram_mask_words(n_vocab) words owned by
 * g, valid until the next ex_gram_* call on g other than ex_gram_mask (so the masks of several
 * states of one step may be held at once) and ex_gram_compact. Returns 0 or CM_ENOMEM. */
int ex_gram_mask(ex_gram *g, ex_gram_state *st, const uint32_t **mask);
/* Advances st by token tok. Returns 0, or CM_EINVAL when the grammar does not allow tok (st is
 * unchanged), CM_ENOMEM. */
int ex_gram_advance(ex_gram *g, ex_gram_state *st, int32_t tok);
/* 1 when the grammar may end in st (an end id is allowed), 0 otherwise. */
int ex_gram_accepting(ex_gram *g, const ex_gram_state *st);
/* 1 when st allows no token at all (complete, or an end id was taken). */
int ex_gram_finished(ex_gram *g, ex_gram_state *st);

/* Between steps: when g's tables have passed their soft size (or force is set), rebuilds them
 * holding only the live states (every state of g still in use must be passed; the others become
 * invalid: CM_ESTATE) and drops the cached masks of states. Returns 1 when it did, 0 when not
 * needed, CM_ENOMEM. */
int ex_gram_compact(ex_gram *g, ex_gram_state *const *live, int n_live, int force);
/* 1 when g's tables have passed their soft size (ex_gram_compact would rebuild them). */
int ex_gram_wants_compact(const ex_gram *g);

/* Statistics, for logs and benchmarks. */
typedef struct ex_gram_stats {
    uint64_t nodes, sets, trans;      /* table sizes */
    uint64_t masks_cached;            /* states whose mask is cached */
    uint64_t positions_done;          /* terminal positions classified */
    uint64_t mask_hits, mask_misses;  /* ex_gram_mask calls answered from the cache or computed */
    uint64_t bytes;                   /* memory held by the tables and masks */
    uint64_t compactions;
} ex_gram_stats;
void ex_gram_stats_get(const ex_gram *g, ex_gram_stats *st);

#endif
