/* tools: tool-call formats, the streaming output parser and the grammar of calls (see tools.h). */
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_err.h"

/* ---- formats --------------------------------------------------------------------------------- */

int tok_tools_parse(const char *name) {
    static const char *const n[] = { "none", "hermes", "llama3", "mistral" };
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, n[i])) return i;
    if (!strcmp(name, "qwen") || !strcmp(name, "qwen3")) return TOK_TOOLS_HERMES;
    if (!strcmp(name, "llama3_json")) return TOK_TOOLS_LLAMA3;
    return -1;
}

const char *tok_tools_name(int fmt) {
    static const char *const n[] = { "none", "hermes", "llama3", "mistral" };
    return fmt >= 0 && fmt < 4 ? n[fmt] : "?";
}

int tok_tools_detect(const char *src) {
    if (!src) return TOK_TOOLS_NONE;
    if (strstr(src, "<tool_call>")) return TOK_TOOLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return TOK_TOOLS_MISTRAL;
    if (strstr(src, "<|python_tag|>") || (strstr(src, "\"parameters\"") && strstr(src, "<|start_header_id|>")))
        return TOK_TOOLS_LLAMA3;
    return TOK_TOOLS_NONE;
}

const char *const *tok_tools_markers(int fmt) {
    static const char *const hermes[] = { "<tool_call>", "</tool_call>", NULL };
    static const char *const llama3[] = { "<|python_tag|>", NULL };
    static const char *const mistral[] = { "[TOOL_CALLS]", "[ARGS]", NULL };
    static const char *const none[] = { NULL };
    return fmt == TOK_TOOLS_HERMES ? hermes : fmt == TOK_TOOLS_LLAMA3 ? llama3 : fmt == TOK_TOOLS_MISTRAL ? mistral : none;
}

/* ---- grammar -------------------------------------------------------------------------------- */

/* A marker: its token when the vocabulary holds it as a control token, else its text. */
static void marker(tok_gbnf *d, const tok_vocab *v, const char *m) {
    int32_t id = v ? tok_find(v, m, strlen(m)) : -1;
    if (id >= 0 && tok_type(v, id) == TOK_TYPE_CONTROL) tok_gbnf_add(d, "<[%d]>", id);
    else tok_gbnf_lit(d, m, strlen(m));
}

int tok_tools_gbnf(tok_gbnf *d, const char *name, int fmt, const tok_tool_fn *fns, int n, int parallel,
                   const tok_vocab *v, char *err, size_t errlen) {
    if (n < 1 || fmt == TOK_TOOLS_NONE) {
        snprintf(err, errlen, "no functions, or no tool-call format");
        return CM_EINVAL;
    }
    const char *argkey = fmt == TOK_TOOLS_LLAMA3 ? "parameters" : "arguments";
    char rn[128];
    /* one call: {"name": "f", "arguments": <f's schema>} per function */
    tok_gbnf_add(d, "%s-call ::= ", name);
    for (int i = 0; i < n; i++) tok_gbnf_add(d, i ? " | %s-fn%d" : "%s-fn%d", name, i);
    tok_gbnf_add(d, "\n");
    for (int i = 0; i < n; i++) {
        snprintf(rn, sizeof rn, "%s-args%d", name, i);
        int rc;
        if (fns[i].params) rc = tok_gbnf_schema(d, rn, fns[i].params, fns[i].params_len, err, errlen);
        else rc = tok_gbnf_json(d, rn, 1);
        if (rc) {
            if (rc == CM_EINVAL) {
                char tmp[512];
                snprintf(tmp, sizeof tmp, "function '%.60s' parameters: %s", fns[i].name, err);
                snprintf(err, errlen, "%s", tmp);
            }
            return rc;
        }
        /* the name as JSON: names are [a-zA-Z0-9_-] (OpenAI's rule), so no escapes */
        char lit[160];
        snprintf(lit, sizeof lit, "{\"name\": \"%s\", \"%s\": ", fns[i].name, argkey);
        tok_gbnf_add(d, "%s-fn%d ::= ", name, i);
        tok_gbnf_lit(d, lit, strlen(lit));
        tok_gbnf_add(d, " %s \"}\"\n", rn);
    }
    /* more calls, when parallel: ( separator call )* */
    char more[256] = "";
    switch (fmt) {
    case TOK_TOOLS_HERMES:
        tok_gbnf_add(d, "%s-one ::= ", name);
        marker(d, v, "<tool_call>");
        tok_gbnf_add(d, " \"\\n\" %s-call \"\\n\" ", name);
        marker(d, v, "</tool_call>");
        if (parallel) snprintf(more, sizeof more, " ( \"\\n\" %s-one )*", name);
        tok_gbnf_add(d, "\n%s ::= %s-one%s\n", name, name, more);
        break;
    case TOK_TOOLS_LLAMA3:
        if (parallel) snprintf(more, sizeof more, " ( \"; \" %s-call )*", name);
        tok_gbnf_add(d, "%s ::= %s-call%s\n", name, name, more);
        break;
    case TOK_TOOLS_MISTRAL:
        tok_gbnf_add(d, "%s ::= ", name);
        marker(d, v, "[TOOL_CALLS]");
        if (parallel) snprintf(more, sizeof more, " ( \", \" %s-call )*", name);
        tok_gbnf_add(d, " \"[\" %s-call%s \"]\"\n", name, more);
        break;
    }
    return d->oom ? CM_ENOMEM : 0;
}

int tok_gbnf_until(tok_gbnf *d, const char *name, const char *end) {
    size_t m = strlen(end);
    if (!m || m > 64) return CM_EINVAL;
    /* state j: end[0..j) matched. S_j ::= c S_next for the marker's characters | [^them] S_0,
     * where next is the longest suffix of end[0..j) + c that is a prefix of end (m: done) */
    char chars[65];
    size_t nc = 0;
    for (size_t i = 0; i < m; i++)
        if (!memchr(chars, end[i], nc)) chars[nc++] = end[i];
    char buf[66];
    for (size_t j = 0; j < m; j++) {
        tok_gbnf_add(d, "%s-s%zu ::= ", name, j);
        for (size_t k = 0; k < nc; k++) {
            memcpy(buf, end, j);
            buf[j] = chars[k];
            size_t st = j + 1;
            while (st > 0 && memcmp(buf + j + 1 - st, end, st) != 0) st--;
            if (k) tok_gbnf_add(d, " | ");
            tok_gbnf_lit(d, &chars[k], 1);
            if (st < m) tok_gbnf_add(d, " %s-s%zu", name, st);
        }
        tok_gbnf_add(d, " | [^");
        for (size_t k = 0; k < nc; k++) {
            char c = chars[k];
            if (c == ']' || c == '\\' || c == '^' || c == '-') tok_gbnf_add(d, "\\%c", c);
            else tok_gbnf_add(d, "%c", c);
        }
        tok_gbnf_add(d, "] %s-s0\n", name);
    }
    tok_gbnf_add(d, "%s ::= %s-s0\n", name, name);
    return d->oom ? CM_ENOMEM : 0;
}

/* ---- the parser ----------------------------------------------------------------------------- */

enum {
    ST_START = 0,   /* the reply's start: <think>? */
    ST_REASON,      /* inside the reasoning */
    ST_AFTER_REASON,/* whitespace after </think> */
    ST_CONTENT,     /* content, looking for the format's call marker */
    ST_L3_START,    /* llama3: the content's first characters decide */
    ST_PLAIN,       /* content to the end */
    ST_CALL,        /* a call object (or mistral's arguments) being scanned */
    ST_AFTER_CALL,  /* after a call: the format's separator or closer */
    ST_M_START,     /* mistral: after [TOOL_CALLS] */
    ST_M_NAME,      /* mistral v11: the name before [ARGS] */
    ST_BETWEEN,     /* hermes: after </tool_call> */
};

enum { K_OTHER = 0, K_NAME = 1, K_ARGS = 2 };

static int ob_put(tok_out *o, tok_obuf *b, const char *s, size_t n) {
    if (o->err) return o->err;
    if (b->n + n + 1 > b->cap) {
        if (b->n + n > TOK_OUT_MAX_CALL) return o->err = CM_ETOOBIG;
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *ns = realloc(b->s, c);
        if (!ns) return o->err = CM_ENOMEM;
        b->s = ns;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

void tok_out_init(tok_out *o, int fmt, int reasoning, int in_reasoning, const tok_out_cb *cb, void *ud) {
    memset(o, 0, sizeof *o);
    o->fmt = fmt;
    o->reasoning = reasoning;
    o->cb = cb;
    o->ud = ud;
    o->state = reasoning ? (in_reasoning ? ST_REASON : ST_START) : fmt == TOK_TOOLS_LLAMA3 ? ST_L3_START : ST_CONTENT;
}

void tok_out_free(tok_out *o) {
    free(o->pend.s);
    free(o->c.raw.s);
    free(o->c.key.s);
    free(o->c.name.s);
    free(o->c.args.s);
    memset(o, 0, sizeof *o);
}

static int content_state(const tok_out *o) { return o->fmt == TOK_TOOLS_LLAMA3 ? ST_L3_START : ST_CONTENT; }

static void emit_content(tok_out *o, const char *s, size_t n) {
    if (n && o->cb->content) o->cb->content(o->ud, s, n);
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Where lit starts in s[0..n): its index, or -1 with *safe the bytes that cannot be part of a
 * match that continues past n. */
static long find_lit(const char *s, size_t n, const char *lit, size_t *safe) {
    size_t m = strlen(lit);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < m && i + k < n && s[i + k] == lit[k]) k++;
        if (k == m) return (long)i;
        if (i + k == n) { *safe = i; return -1; } /* a prefix of lit reaches the end */
    }
    *safe = n;
    return -1;
}

static void call_reset(tok_out *o) {
    o->c.depth = o->c.in_str = o->c.esc = o->c.expect = o->c.kind = o->c.probe = o->c.margs = 0;
    o->c.raw.n = o->c.key.n = o->c.name.n = o->c.args.n = 0;
    o->c.named = o->c.begun = o->c.args_started = o->c.args_string = o->c.args_done = 0;
}

/* JSON string content (escapes) -> UTF-8 in place; returns the new length. */
static size_t json_unescape(char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { s[o++] = s[i]; continue; }
        char c = s[++i];
        if (c == 'n') s[o++] = '\n';
        else if (c == 't') s[o++] = '\t';
        else if (c == 'r') s[o++] = '\r';
        else if (c == 'b') s[o++] = '\b';
        else if (c == 'f') s[o++] = '\f';
        else if (c == 'u' && i + 4 < n) {
            unsigned v = 0;
            for (int k = 1; k <= 4; k++) {
                char h = s[i + (size_t)k];
                v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
            }
            i += 4;
            if (v >= 0xD800 && v <= 0xDBFF && i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u') {
                unsigned lo = 0;
                for (int k = 3; k <= 6; k++) {
                    char h = s[i + (size_t)k];
                    lo = lo * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
                }
                if (lo >= 0xDC00 && lo <= 0xDFFF) { v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00); i += 6; }
            }
            if (v < 0x80) s[o++] = (char)v;
            else if (v < 0x800) { s[o++] = (char)(0xC0 | v >> 6); s[o++] = (char)(0x80 | (v & 63)); }
            else if (v < 0x10000) { s[o++] = (char)(0xE0 | v >> 12); s[o++] = (char)(0x80 | ((v >> 6) & 63)); s[o++] = (char)(0x80 | (v & 63)); }
            else { s[o++] = (char)(0xF0 | v >> 18); s[o++] = (char)(0x80 | ((v >> 12) & 63)); s[o++] = (char)(0x80 | ((v >> 6) & 63)); s[o++] = (char)(0x80 | (v & 63)); }
        } else s[o++] = c;
    }
    return o;
}

/* Bytes of s[0..n) up to the last whole UTF-8 character: a multi-byte character whose bytes have
 * not all arrived stays behind (a delta must not end inside one: a client decodes each alone). */
static size_t utf8_whole(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte */
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

/* Begins the call once its name is known, then passes on the argument text held so far (all of
 * it at the end of the call; before, up to the last whole UTF-8 character). */
static void call_flush_at(tok_out *o, int end) {
    if (!o->c.named) return;
    if (!o->c.begun) {
        o->c.begun = 1;
        if (o->cb->call_begin) o->cb->call_begin(o->ud, o->n_calls, o->c.name.s ? o->c.name.s : "", o->c.name.n);
        o->n_calls++;
    }
    if (!o->c.args_string && o->c.args.n) {
        const size_t m = end ? o->c.args.n : utf8_whole(o->c.args.s, o->c.args.n);
        if (m && o->cb->call_args) o->cb->call_args(o->ud, o->n_calls - 1, o->c.args.s, m);
        memmove(o->c.args.s, o->c.args.s + m, o->c.args.n - m);
        o->c.args.n -= m;
    }
}
static void call_flush(tok_out *o) { call_flush_at(o, 0); }

/* The call object ended: a call when it had a name, else its text is content. */
static void call_done(tok_out *o) {
    if (!o->c.named) {
        emit_content(o, o->c.raw.s, o->c.raw.n);
        call_reset(o);
        o->state = o->fmt == TOK_TOOLS_LLAMA3 ? ST_PLAIN : ST_CONTENT;
        return;
    }
    call_flush_at(o, 1);
    int idx = o->n_calls - 1;
    if (o->c.args_string) {
        size_t n = json_unescape(o->c.args.s ? o->c.args.s : (char *)"", o->c.args.n);
        if (n && o->cb->call_args) o->cb->call_args(o->ud, idx, o->c.args.s, n);
    } else if (!o->c.args_started && o->cb->call_args) {
        o->cb->call_args(o->ud, idx, "{}", 2);
    }
    if (o->cb->call_end) o->cb->call_end(o->ud, idx);
    call_reset(o);
    o->state = ST_AFTER_CALL;
}

static void call_abort(tok_out *o) { /* not a call after all: its text is content */
    emit_content(o, o->c.raw.s, o->c.raw.n);
    call_reset(o);
    o->state = o->fmt == TOK_TOOLS_LLAMA3 ? ST_PLAIN : ST_CONTENT;
}

/* One character of a call object. Returns 1 when the object is complete (or abandoned). */
static int call_char(tok_out *o, char ch) {
    typeof(o->c) *c = &o->c;
    if (ob_put(o, &c->raw, &ch, 1)) return 1;
    if (c->depth == 0) { /* before the object */
        if (is_ws(ch)) return 0;
        if (ch != '{') { call_abort(o); return 1; }
        c->depth = 1;
        c->expect = 0;
        return 0;
    }
    if (c->in_str) {
        int closing = !c->esc && ch == '"';
        int esc = !c->esc && ch == '\\';
        c->esc = esc;
        if (c->depth > 1) { /* inside a container value: the arguments keep their quotes */
            if (c->kind == K_ARGS) { ob_put(o, &c->args, &ch, 1); call_flush(o); }
            if (closing) c->in_str = 0;
            return 0;
        }
        if (!closing) {
            if (c->expect == 0) ob_put(o, &c->key, &ch, 1);
            else if (c->kind == K_NAME) ob_put(o, &c->name, &ch, 1);
            else if (c->kind == K_ARGS) ob_put(o, &c->args, &ch, 1); /* a string: decoded at the end */
            return 0;
        }
        c->in_str = 0;
        if (c->expect == 0) { /* a key */
            c->expect = 1;
            if (c->probe) { /* llama3: a call only when the first key is the name */
                if (!(c->key.n == 4 && !memcmp(c->key.s, "name", 4))) { call_abort(o); return 1; }
                c->probe = 0;
            }
            return 0;
        }
        if (c->kind == K_NAME) {
            c->name.n = json_unescape(c->name.s ? c->name.s : (char *)"", c->name.n);
            if (c->name.s) c->name.s[c->name.n] = 0;
            c->named = 1;
            call_flush(o);
        }
        c->expect = 4;
        return 0;
    }
    if (c->depth > 1) { /* inside a container value */
        if (c->kind == K_ARGS) ob_put(o, &c->args, &ch, 1);
        if (ch == '"') c->in_str = 1;
        else if (ch == '{' || ch == '[') c->depth++;
        else if ((ch == '}' || ch == ']') && --c->depth == 1) c->expect = 4;
        if (c->kind == K_ARGS) call_flush(o);
        return 0;
    }
    switch (c->expect) { /* at the object's top level */
    case 0: /* a key or the end */
        if (is_ws(ch) || ch == ',') return 0;
        if (ch == '}') { call_done(o); return 1; }
        if (ch == '"') { c->in_str = 1; c->key.n = 0; return 0; }
        call_abort(o);
        return 1;
    case 1:
        if (is_ws(ch)) return 0;
        if (ch != ':') { call_abort(o); return 1; }
        c->expect = 2;
        c->kind = c->key.n == 4 && !memcmp(c->key.s, "name", 4) ? K_NAME
                  : (c->key.n == 9 && !memcmp(c->key.s, "arguments", 9)) || (c->key.n == 10 && !memcmp(c->key.s, "parameters", 10))
                      ? K_ARGS
                      : K_OTHER;
        return 0;
    case 2: /* the value starts */
        if (is_ws(ch)) return 0;
        c->expect = 3;
        if (c->kind == K_NAME && ch != '"') c->kind = K_OTHER; /* a name must be a string */
        if (c->kind == K_ARGS) c->args_started = 1;
        if (ch == '"') {
            c->in_str = 1;
            if (c->kind == K_NAME) c->name.n = 0;
            if (c->kind == K_ARGS) c->args_string = 1;
            return 0;
        }
        if (ch == '{' || ch == '[') c->depth++;
        if (c->kind == K_ARGS) { ob_put(o, &c->args, &ch, 1); call_flush(o); }
        return 0;
    case 3: /* a scalar goes on until , } or whitespace */
        if (ch == ',' || ch == '}' || is_ws(ch)) {
            c->expect = ch == ',' ? 0 : 4;
            c->kind = ch == ',' ? K_OTHER : c->kind;
            if (ch == '}') { call_done(o); return 1; }
            return 0;
        }
        if (c->kind == K_ARGS) { ob_put(o, &c->args, &ch, 1); call_flush(o); }
        return 0;
    default: /* after a value */
        if (is_ws(ch)) return 0;
        if (ch == ',') { c->expect = 0; c->kind = K_OTHER; return 0; }
        if (ch == '}') { call_done(o); return 1; }
        call_abort(o);
        return 1;
    }
}

/* Mistral v11: [ARGS] is followed by the bare arguments object. */
static int args_char(tok_out *o, char ch) {
    typeof(o->c) *c = &o->c;
    if (c->depth == 0) {
        if (is_ws(ch)) return 0;
        if (ch != '{') { /* not an object: the call ends with what it has; ch is read again */
            call_done(o);
            return -1;
        }
        c->args_started = 1;
    }
    ob_put(o, &c->args, &ch, 1);
    if (c->in_str) {
        if (c->esc) c->esc = 0;
        else if (ch == '\\') c->esc = 1;
        else if (ch == '"') c->in_str = 0;
    } else if (ch == '"') c->in_str = 1;
    else if (ch == '{' || ch == '[') c->depth++;
    else if (ch == '}' || ch == ']') {
        if (--c->depth == 0) {
            call_flush(o);
            call_done(o);
            return 1;
        }
    }
    call_flush(o);
    return 0;
}

/* Runs the state machine over the pending text. final: no more text comes. */
static void run(tok_out *o, int final) {
    tok_obuf *p = &o->pend;
    size_t i = 0;
    while (i < p->n && !o->err) {
        const char *s = p->s + i;
        size_t n = p->n - i, safe;
        long at;
        switch (o->state) {
        case ST_START: {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            const char *tag = "<think>";
            size_t m = 0;
            while (m < 7 && k + m < n && s[k + m] == tag[m]) m++;
            if (m == 7) { i += k + 7; o->state = ST_REASON; break; }
            if (k + m == n && !final) goto wait;
            o->state = content_state(o);
            break;
        }
        case ST_REASON:
            at = find_lit(s, n, "</think>", &safe);
            if (at >= 0) {
                if (at && o->cb->reasoning) o->cb->reasoning(o->ud, s, (size_t)at);
                i += (size_t)at + 8;
                o->state = ST_AFTER_REASON;
                break;
            }
            if (final) safe = n;
            if (safe && o->cb->reasoning) o->cb->reasoning(o->ud, s, safe);
            i += safe;
            if (safe < n) goto wait;
            break;
        case ST_AFTER_REASON: {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            i += k;
            if (k == n) goto wait;
            o->state = content_state(o);
            break;
        }
        case ST_CONTENT: {
            const char *lit = o->fmt == TOK_TOOLS_HERMES ? "<tool_call>" : o->fmt == TOK_TOOLS_MISTRAL ? "[TOOL_CALLS]" : NULL;
            if (!lit) { emit_content(o, s, n); i = p->n; break; }
            at = find_lit(s, n, lit, &safe);
            if (at >= 0) {
                emit_content(o, s, (size_t)at);
                i += (size_t)at;
                call_reset(o);
                ob_put(o, &o->c.raw, lit, strlen(lit));
                i += strlen(lit);
                o->state = o->fmt == TOK_TOOLS_MISTRAL ? ST_M_START : ST_CALL;
                break;
            }
            if (final) safe = n;
            emit_content(o, s, safe);
            i += safe;
            if (safe < n) goto wait;
            break;
        }
        case ST_L3_START: {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            if (k == n) { if (final) { emit_content(o, s, n); i = p->n; } else goto wait; break; }
            const char *tag = "<|python_tag|>";
            size_t m = 0, tl = strlen(tag);
            while (m < tl && k + m < n && s[k + m] == tag[m]) m++;
            if (m == tl) {
                call_reset(o);
                ob_put(o, &o->c.raw, s, k + tl);
                i += k + tl;
                o->state = ST_CALL;
                break;
            }
            if (k + m == n && m > 0 && !final) goto wait;
            if (s[k] == '{') {
                call_reset(o);
                o->c.probe = 1;
                ob_put(o, &o->c.raw, s, k);
                i += k;
                o->state = ST_CALL;
                break;
            }
            o->state = ST_PLAIN;
            break;
        }
        case ST_PLAIN:
            emit_content(o, s, n);
            i = p->n;
            break;
        case ST_CALL:
            if (o->c.margs) {
                int r = args_char(o, *s);
                if (r >= 0) i++; /* < 0: read again in the next state */
                break;
            }
            call_char(o, *s);
            i++;
            break;
        case ST_AFTER_CALL: {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            if (k == n) {
                if (final) i = p->n;
                else goto wait;
                break;
            }
            if (o->fmt == TOK_TOOLS_HERMES) {
                const char *lit = "</tool_call>";
                size_t m = 0, ll = strlen(lit);
                while (m < ll && k + m < n && s[k + m] == lit[m]) m++;
                if (m == ll) { i += k + ll; o->state = ST_BETWEEN; break; }
                if (k + m == n && !final) goto wait;
                o->state = ST_CONTENT; /* no closer: what follows is content */
                i += k;
            } else if (o->fmt == TOK_TOOLS_LLAMA3) {
                if (s[k] == ';') { i += k + 1; call_reset(o); o->state = ST_CALL; break; }
                i += k;
                o->state = ST_PLAIN;
            } else { /* mistral */
                if (o->c.depth == 0 && s[k] == ',' && o->c.array) { i += k + 1; int a = o->c.array; call_reset(o); o->c.array = a; o->state = ST_CALL; break; }
                if (s[k] == ']' && o->c.array) { i += k + 1; o->c.array = 0; o->state = ST_CONTENT; break; }
                if (!o->c.array) { /* v11: another [TOOL_CALLS] or content */
                    i += k;
                    o->state = ST_CONTENT;
                    break;
                }
                i += k;
                o->state = ST_CONTENT;
            }
            break;
        }
        case ST_BETWEEN: { /* hermes, after a call: whitespace before another call is dropped */
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            const char *lit = "<tool_call>";
            size_t m = 0, ll = strlen(lit);
            while (m < ll && k + m < n && s[k + m] == lit[m]) m++;
            if (m == ll || (k == n && final)) { i += k; o->state = ST_CONTENT; break; }
            if (k + m == n && !final) goto wait;
            o->state = ST_CONTENT; /* text follows: the whitespace is content */
            break;
        }
        case ST_M_START: {
            size_t k = 0;
            while (k < n && is_ws(s[k])) k++;
            if (k == n) { if (final) i = p->n; else goto wait; break; }
            if (s[k] == '[') {
                i += k + 1;
                call_reset(o);
                o->c.array = 1;
                o->state = ST_CALL;
                break;
            }
            i += k;
            call_reset(o);
            o->state = ST_M_NAME;
            break;
        }
        case ST_M_NAME:
            at = find_lit(s, n, "[ARGS]", &safe);
            if (at >= 0) {
                ob_put(o, &o->c.name, s, (size_t)at);
                while (o->c.name.n && is_ws(o->c.name.s[o->c.name.n - 1])) o->c.name.n--;
                if (o->c.name.s) o->c.name.s[o->c.name.n] = 0;
                o->c.named = 1;
                call_flush(o);
                i += (size_t)at + 6;
                o->state = ST_CALL;
                o->c.margs = 1;
                break;
            }
            if (final) { /* a name without arguments: not a call */
                emit_content(o, o->c.name.s, o->c.name.n);
                emit_content(o, s, n);
                i = p->n;
                break;
            }
            ob_put(o, &o->c.name, s, safe);
            i += safe;
            if (safe < n) goto wait;
            break;
        }
    }
wait:
    if (i) {
        memmove(p->s, p->s + i, p->n - i);
        p->n -= i;
    }
}

int tok_out_feed(tok_out *o, const char *s, size_t n) {
    if (o->err) return o->err;
    if (ob_put(o, &o->pend, s, n)) return o->err;
    run(o, 0);
    return o->err;
}

int tok_out_end(tok_out *o) {
    if (o->err) return o->err;
    run(o, 1);
    if (o->pend.n) { /* what the states held to the very end */
        if (o->state == ST_REASON && o->cb->reasoning) o->cb->reasoning(o->ud, o->pend.s, o->pend.n);
        else if (o->state != ST_AFTER_CALL && o->state != ST_BETWEEN) emit_content(o, o->pend.s, o->pend.n);
        o->pend.n = 0;
    }
    if (o->state == ST_CALL || o->state == ST_M_NAME) { /* cut short */
        if (o->c.named) {
            call_flush_at(o, 1);
            if (o->cb->call_end) o->cb->call_end(o->ud, o->n_calls - 1);
            call_reset(o);
        } else call_abort(o);
    }
    return o->err;
}
