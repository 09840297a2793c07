/* test_tools: the streaming output parser (text/tools.h) for every tool-call format and the
 * reasoning split, fed whole and in every split into two pieces and in random pieces (the
 * events must not depend on how the text arrives); and the grammars of calls (each format, a
 * named function, parallel or not) and tok_gbnf_until, through the byte-level matcher. */
#include "t.h"

#include <stdlib.h>

#include "common/cm_err.h"
#include "executor/grammar.h"
#include "text/grammar.h"
#include "text/tools.h"

typedef struct rec {
    char content[2048], reasoning[2048];
    char names[8][64], args[8][512];
    int n_calls, begun, ended, bad_order;
    int split_utf8; /* argument deltas that ended inside a UTF-8 character */
} rec;

static void on_content(void *ud, const char *s, size_t n) { strncat(((rec *)ud)->content, s, n); }
static void on_reasoning(void *ud, const char *s, size_t n) { strncat(((rec *)ud)->reasoning, s, n); }
static void on_begin(void *ud, int i, const char *name, size_t n) {
    rec *r = ud;
    if (i != r->n_calls || i >= 8) { r->bad_order = 1; return; }
    snprintf(r->names[i], sizeof r->names[i], "%.*s", (int)n, name);
    r->n_calls++;
    r->begun++;
}
static void on_args(void *ud, int i, const char *s, size_t n) {
    rec *r = ud;
    if (i < 0 || i >= r->n_calls) { r->bad_order = 1; return; }
    strncat(r->args[i], s, n);
    size_t k = n; /* the last character of the delta must be whole */
    while (k > 0 && ((unsigned char)s[k - 1] & 0xC0) == 0x80) k--;
    if (k > 0) {
        const unsigned char c = (unsigned char)s[k - 1];
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        r->split_utf8 += n - (k - 1) != need;
    }
}
static void on_end(void *ud, int i) {
    rec *r = ud;
    if (i != r->n_calls - 1) r->bad_order = 1;
    r->ended++;
}
static const tok_out_cb CB = { on_content, on_reasoning, on_begin, on_args, on_end };

static void parse(rec *r, int fmt, int reasoning, int in_reasoning, const char *text, const size_t *cuts, int n_cuts) {
    memset(r, 0, sizeof *r);
    tok_out o;
    tok_out_init(&o, fmt, reasoning, in_reasoning, &CB, r);
    size_t prev = 0, len = strlen(text);
    for (int k = 0; k <= n_cuts; k++) {
        size_t at = k < n_cuts ? cuts[k] : len;
        tok_out_feed(&o, text + prev, at - prev);
        prev = at;
    }
    tok_out_end(&o);
    tok_out_free(&o);
}

typedef struct ccase {
    const char *name;
    int fmt, reasoning, in_reasoning;
    const char *text;
    const char *content, *reasoning_text;
    int n_calls;
    const char *names[3], *args[3];
} ccase;

static const ccase CASES[] = {
    { "plain", TOK_TOOLS_HERMES, 0, 0, "Hello <b>there</b>", "Hello <b>there</b>", NULL, 0, { 0 }, { 0 } },
    { "hermes one call", TOK_TOOLS_HERMES, 0, 0,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>", "", NULL, 1,
      { "get_weather" }, { "{\"city\": \"Paris\", \"days\": [1, 2]}" } },
    { "hermes content then two calls", TOK_TOOLS_HERMES, 0, 0,
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"}{\\\"\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>",
      "Let me check.\n", NULL, 2, { "a", "b" }, { "{\"x\": \"}{\\\"\"}", "{}" } },
    { "hermes arguments as a string", TOK_TOOLS_HERMES, 0, 0, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}</tool_call>", "",
      NULL, 1, { "f" }, { "{\"a\": 1}" } },
    { "hermes not a call", TOK_TOOLS_HERMES, 0, 0, "x <tool_call>{\"foo\": 1}</tool_call> y", "x <tool_call>{\"foo\": 1}</tool_call> y", NULL, 0, { 0 }, { 0 } },
    { "hermes cut short", TOK_TOOLS_HERMES, 0, 0, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,", "", NULL, 1, { "f" }, { "{\"a\": [1," } },
    { "llama3 call", TOK_TOOLS_LLAMA3, 0, 0, "{\"name\": \"search\", \"parameters\": {\"q\": \"cats\"}}", "", NULL, 1, { "search" }, { "{\"q\": \"cats\"}" } },
    { "llama3 python_tag, two calls", TOK_TOOLS_LLAMA3, 0, 0,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": null}}", "", NULL, 2, { "a", "b" },
      { "{}", "{\"k\": null}" } },
    { "llama3 json content", TOK_TOOLS_LLAMA3, 0, 0, "{\"answer\": 42}", "{\"answer\": 42}", NULL, 0, { 0 }, { 0 } },
    { "llama3 text", TOK_TOOLS_LLAMA3, 0, 0, "The answer is {\"name\": 1}", "The answer is {\"name\": 1}", NULL, 0, { 0 }, { 0 } },
    { "mistral array", TOK_TOOLS_MISTRAL, 0, 0,
      "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {\"b\": \"]\"}}]", "", NULL, 2, { "f", "g" },
      { "{\"a\": 1}", "{\"b\": \"]\"}" } },
    { "mistral v11", TOK_TOOLS_MISTRAL, 0, 0, "Sure.[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}[TOOL_CALLS]f[ARGS]{}", "Sure.", NULL, 2,
      { "get_time", "f" }, { "{\"tz\": \"UTC\"}", "{}" } },
    { "reasoning then content", TOK_TOOLS_NONE, 1, 0, "<think>\nSo 2+2 is 4.\n</think>\n\nIt is 4.", "It is 4.", "\nSo 2+2 is 4.\n", 0, { 0 }, { 0 } },
    { "reasoning from the prompt", TOK_TOOLS_HERMES, 1, 1,
      "hmm </thin k> ok</think>\n\nDone <tool_call>{\"name\":\"z\",\"arguments\":{}}</tool_call>", "Done ", "hmm </thin k> ok", 1, { "z" }, { "{}" } },
    { "no reasoning tag", TOK_TOOLS_NONE, 1, 0, "  plain <think> later", "  plain <think> later", "", 0, { 0 }, { 0 } },
    { "unfinished reasoning", TOK_TOOLS_NONE, 1, 0, "<think>still going </thi", "", "still going </thi", 0, { 0 }, { 0 } },
};

static int check(const ccase *c, const rec *r, const char *how) {
    int ok = !r->bad_order && !strcmp(r->content, c->content) && !strcmp(r->reasoning, c->reasoning_text ? c->reasoning_text : "") &&
             r->n_calls == c->n_calls && r->ended == c->n_calls;
    for (int i = 0; ok && i < c->n_calls; i++) ok = !strcmp(r->names[i], c->names[i]) && !strcmp(r->args[i], c->args[i]);
    if (!ok)
        fprintf(stderr, "%s (%s): content '%s' reasoning '%s' calls %d ended %d order %d, first '%s' '%s'\n", c->name, how, r->content,
                r->reasoning, r->n_calls, r->ended, r->bad_order, r->names[0], r->args[0]);
    return ok;
}

static void test_parser(void) {
    rec r;
    uint64_t seed = 7;
    for (size_t k = 0; k < sizeof CASES / sizeof *CASES; k++) {
        const ccase *c = &CASES[k];
        size_t len = strlen(c->text);
        parse(&r, c->fmt, c->reasoning, c->in_reasoning, c->text, NULL, 0);
        T_CHECKF(check(c, &r, "whole"), "%s", c->name);
        int bad = 0;
        for (size_t cut = 1; cut < len; cut++) { /* every split in two */
            parse(&r, c->fmt, c->reasoning, c->in_reasoning, c->text, &cut, 1);
            bad += !check(c, &r, "split");
        }
        for (int it = 0; it < 50; it++) { /* random pieces */
            size_t cuts[16];
            int n = 0;
            for (size_t at = 0; n < 16;) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                at += 1 + (size_t)((seed >> 33) % 6);
                if (at >= len) break;
                cuts[n++] = at;
            }
            parse(&r, c->fmt, c->reasoning, c->in_reasoning, c->text, cuts, n);
            bad += !check(c, &r, "pieces");
        }
        T_CHECKF(bad == 0, "%s: %d splits differ", c->name, bad);
    }
    /* the arguments stream: the first fragment comes before the object ends */
    memset(&r, 0, sizeof r);
    tok_out o;
    tok_out_init(&o, TOK_TOOLS_HERMES, 0, 0, &CB, &r);
    const char *p1 = "<tool_call>{\"name\": \"f\", \"arguments\": {\"text\": \"a long", *p2 = " story\"}}</tool_call>";
    tok_out_feed(&o, p1, strlen(p1));
    T_CHECK(r.n_calls == 1 && strstr(r.args[0], "a long") && r.ended == 0);
    tok_out_feed(&o, p2, strlen(p2));
    tok_out_end(&o);
    T_CHECK(r.ended == 1 && !strcmp(r.args[0], "{\"text\": \"a long story\"}"));
    tok_out_free(&o);
    /* a multi-byte character split between two pieces: no delta ends inside it */
    memset(&r, 0, sizeof r);
    r.split_utf8 = 0;
    tok_out_init(&o, TOK_TOOLS_HERMES, 0, 0, &CB, &r);
    const char *q1 = "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Malm\xc3", *q2 = "\xb6 \xe2\x82", *q3 = "\xac\"}}</tool_call>";
    tok_out_feed(&o, q1, strlen(q1));
    tok_out_feed(&o, q2, strlen(q2));
    tok_out_feed(&o, q3, strlen(q3));
    tok_out_end(&o);
    T_CHECKF(r.split_utf8 == 0 && !strcmp(r.args[0], "{\"city\": \"Malm\xc3\xb6 \xe2\x82\xac\"}"), "utf-8 split: %d deltas ended inside a character; args %s",
             r.split_utf8, r.args[0]);
    tok_out_free(&o);
}

static int accepts(const uint32_t *prog, size_t plen, const char *s) {
    uint32_t off[258];
    uint8_t bytes[256];
    for (int i = 0; i < 256; i++) { off[i] = (uint32_t)i; bytes[i] = (uint8_t)i; }
    off[256] = off[257] = 256;
    ex_gram_vocab *bv;
    ex_gram_vocab_create(257, 257, off, bytes, &bv);
    int32_t end = 256;
    ex_gram *g;
    char err[200];
    int ok = ex_gram_create(prog, plen, bv, &end, 1, &g, err, sizeof err) == 0;
    ex_gram_state st;
    ok = ok && ex_gram_state_init(g, &st) == 0;
    for (const char *p = s; ok && *p; p++) ok = ex_gram_advance(g, &st, (unsigned char)*p) == 0;
    ok = ok && ex_gram_accepting(g, &st);
    ex_gram_destroy(g);
    ex_gram_vocab_destroy(bv);
    return ok;
}

static uint32_t *build(int fmt, const tok_tool_fn *fns, int n, int parallel, size_t *len) {
    tok_gbnf d;
    tok_gbnf_init(&d);
    char err[300];
    uint32_t *prog = NULL;
    if (tok_tools_gbnf(&d, "root", fmt, fns, n, parallel, NULL, err, sizeof err) ||
        tok_gram_compile(d.s, d.len, NULL, &prog, len, err, sizeof err))
        fprintf(stderr, "tool grammar: %s\n%s\n", err, d.s ? d.s : "");
    tok_gbnf_free(&d);
    return prog;
}

static void test_grammars(void) {
    const char *weather = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}";
    tok_tool_fn fns[2] = { { "get_weather", weather, strlen(weather) }, { "now", NULL, 0 } };
    size_t len;
    uint32_t *p = build(TOK_TOOLS_HERMES, fns, 2, 1, &len);
    T_CHECK(p != NULL);
    if (p) {
        T_CHECK(accepts(p, len, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
        T_CHECK(accepts(p, len, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {\"x\": 1}}\n</tool_call>"));
        T_CHECK(!accepts(p, len, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>")); /* city is required */
        T_CHECK(!accepts(p, len, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
        T_CHECK(!accepts(p, len, "Sure"));
        free(p);
    }
    p = build(TOK_TOOLS_HERMES, fns + 1, 1, 0, &len); /* a named function, one call */
    T_CHECK(p && accepts(p, len, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>") &&
            !accepts(p, len, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    free(p);
    p = build(TOK_TOOLS_LLAMA3, fns, 2, 1, &len);
    T_CHECK(p && accepts(p, len, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; {\"name\": \"now\", \"parameters\": {}}"));
    free(p);
    p = build(TOK_TOOLS_MISTRAL, fns, 2, 0, &len);
    T_CHECK(p && accepts(p, len, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}]"));
    free(p);
    /* a schema the compiler refuses names the function */
    const char *badschema = "{\"type\":\"string\",\"pattern\":\"x\"}";
    tok_tool_fn bad = { "f1", badschema, strlen(badschema) };
    tok_gbnf d;
    tok_gbnf_init(&d);
    char err[300];
    T_CHECK(tok_tools_gbnf(&d, "root", TOK_TOOLS_HERMES, &bad, 1, 0, NULL, err, sizeof err) == CM_EINVAL &&
            strstr(err, "function 'f1'") && strstr(err, "pattern"));
    tok_gbnf_free(&d);
    /* any text up to a marker */
    tok_gbnf_init(&d);
    tok_gbnf_until(&d, "think", "</think>");
    tok_gbnf_add(&d, "root ::= \"<think>\" think \"ok\"\n");
    uint32_t *pu = NULL;
    T_CHECK(tok_gram_compile(d.s, d.len, NULL, &pu, &len, err, sizeof err) == 0);
    if (pu) {
        T_CHECK(accepts(pu, len, "<think></think>ok"));
        T_CHECK(accepts(pu, len, "<think>a </thin </ <<//think>> </think>ok"));
        T_CHECK(accepts(pu, len, "<think>é</</think>ok"));
        T_CHECK(!accepts(pu, len, "<think>x</think>y</think>ok"));
        T_CHECK(!accepts(pu, len, "<think>x</thinkok"));
        free(pu);
    }
    tok_gbnf_free(&d);
    /* detection from template text */
    T_EQ_INT(tok_tools_detect("{{ '<tool_call>' }}"), TOK_TOOLS_HERMES);
    T_EQ_INT(tok_tools_detect("[TOOL_CALLS]"), TOK_TOOLS_MISTRAL);
    T_EQ_INT(tok_tools_detect("<|python_tag|>"), TOK_TOOLS_LLAMA3);
    T_EQ_INT(tok_tools_detect("{{ messages }}"), TOK_TOOLS_NONE);
    T_EQ_INT(tok_tools_parse("hermes"), TOK_TOOLS_HERMES);
    T_EQ_INT(tok_tools_parse("x"), -1);
}

int main(void) {
    test_parser();
    test_grammars();
    return t_done();
}
