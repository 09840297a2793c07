/* Tools and chat_template_kwargs through the gateway's chat path against the reference renderings (the real Qwen3
 * template, Hermes tool format, rendered by @huggingface/jinja: tests/integration/tmpl_ref.mjs,
 * and by Python Jinja2: tmpl_ref.py): every reference case with tools or tool calls is sent the
 * way an OpenAI client sends it — tools as JSON text, each call's arguments as a JSON *string* —
 * through tok_chat_render_ex (which turns the arguments back into objects, as vLLM does) and
 * must equal the reference byte for byte; and the assistant turns the reference wrote are parsed
 * back with the tool-call parser (text/tools.h), giving the same calls.
 *
 * Reads ARKA_TMPL_REF (or the reference a previous test_tmpl_real.sh run left in the cache);
 * skips when there is none. */
#include "common/cm_err.h"
#include "common/cm_json.h"
#include "t.h"
#include "text/chat.h"
#include "text/tools.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; *len = (size_t)n; }
    return buf;
}

typedef struct sb { char *s; size_t n, cap; } sb;
static void put(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) b->s = realloc(b->s, b->cap = (b->n + n + 1) * 2);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(sb *b, const char *s) { put(b, s, strlen(s)); }
static void jstr(sb *b, const char *s, size_t n) {
    puts_(b, "\"");
    for (size_t i = 0; i < n; i++) {
        char e[8];
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { e[0] = '\\'; e[1] = (char)c; put(b, e, 2); }
        else if (c == '\n') puts_(b, "\\n");
        else if (c < 0x20) { snprintf(e, sizeof e, "\\u%04x", c); puts_(b, e); }
        else put(b, (const char *)&s[i], 1);
    }
    puts_(b, "\"");
}
static void jval(sb *b, const cm_json *v) {
    char t[40];
    switch (v->type) {
    case CM_JSON_NULL: puts_(b, "null"); break;
    case CM_JSON_BOOL: puts_(b, v->boolean ? "true" : "false"); break;
    case CM_JSON_NUMBER: if (v->is_int) snprintf(t, sizeof t, "%lld", (long long)v->i); else snprintf(t, sizeof t, "%.17g", v->num); puts_(b, t); break;
    case CM_JSON_STRING: jstr(b, v->str, v->str_len); break;
    case CM_JSON_ARRAY:
        puts_(b, "[");
        for (const cm_json *e = v->child; e; e = e->next) { if (e != v->child) puts_(b, ","); jval(b, e); }
        puts_(b, "]");
        break;
    case CM_JSON_OBJECT:
        puts_(b, "{");
        for (const cm_json *e = v->child; e; e = e->next) {
            if (e != v->child) puts_(b, ",");
            jstr(b, e->key, e->key_len);
            puts_(b, ":");
            jval(b, e);
        }
        puts_(b, "}");
        break;
    }
}

/* tool_calls as a client sends them: function.arguments a JSON string. */
static char *client_calls(const cm_json *calls) {
    sb b = { 0 };
    puts_(&b, "[");
    for (const cm_json *c = calls->child; c; c = c->next) {
        if (c != calls->child) puts_(&b, ",");
        const cm_json *f = cm_json_get(c, "function");
        puts_(&b, "{\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":");
        const cm_json *name = cm_json_get(f, "name"), *args = cm_json_get(f, "arguments");
        jval(&b, name);
        puts_(&b, ",\"arguments\":");
        sb a = { 0 };
        if (args && args->type == CM_JSON_STRING) put(&a, args->str, args->str_len);
        else if (args) jval(&a, args);
        jstr(&b, a.s ? a.s : "", a.n);
        free(a.s);
        puts_(&b, "}}");
    }
    puts_(&b, "]");
    return b.s;
}

typedef struct calls_rec { int n, ended; char name[8][64]; sb args[8]; } calls_rec;
static void r_begin(void *ud, int i, const char *n, size_t l) { calls_rec *r = ud; if (i < 8) { snprintf(r->name[i], 64, "%.*s", (int)l, n); r->n = i + 1; } }
static void r_args(void *ud, int i, const char *s, size_t n) { calls_rec *r = ud; if (i < 8) put(&r->args[i], s, n); }
static void r_end(void *ud, int i) { ((calls_rec *)ud)->ended++; (void)i; }

/* The same JSON value (objects compared member by member in order). */
static int json_same(const cm_json *a, const cm_json *b) {
    sb x = { 0 }, y = { 0 };
    jval(&x, a);
    jval(&y, b);
    int same = x.n == y.n && !memcmp(x.s, y.s, x.n);
    free(x.s);
    free(y.s);
    return same;
}

int main(void) {
    char path[1024];
    const char *env = getenv("ARKA_TMPL_REF");
    if (env && *env) snprintf(path, sizeof path, "%s", env);
    else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) snprintf(path, sizeof path, "%s/arka-npm-tmpl/ref.json", xdg);
        else snprintf(path, sizeof path, "%s/.cache/arka-npm-tmpl/ref.json", home ? home : ".");
    }
    size_t len;
    char *text = slurp(path, &len);
    if (!text) {
        if (env && *env) { fprintf(stderr, "cannot read ARKA_TMPL_REF=%s\n", env); T_CHECK(0); return t_done(); }
        printf("SKIP: no reference at %s (tests/integration/test_tmpl_real.sh makes it)\n", path);
        return t_done();
    }
    cm_json_doc *doc;
    char err[512];
    T_CHECK(cm_json_parse(text, len, &doc, err, sizeof err) == 0);
    const cm_json *root = cm_json_root(doc), *tmpls = cm_json_get(root, "templates"), *cases = cm_json_get(root, "cases");
    const cm_json *src = cm_json_get(tmpls, "qwen3");
    if (!src) { printf("SKIP: the reference has no qwen3 template\n"); cm_json_free(doc); free(text); return t_done(); }
    /* the template, loaded as a model directory's chat_template.jinja */
    char dir[] = "/tmp/arka-tools-ref-XXXXXX";
    T_CHECK(mkdtemp(dir) != NULL);
    char tp[1100];
    snprintf(tp, sizeof tp, "%s/chat_template.jinja", dir);
    FILE *f = fopen(tp, "wb");
    fwrite(src->str, 1, src->str_len, f);
    fclose(f);
    tok_chat *chat;
    T_CHECK(tok_chat_load(dir, NULL, NULL, &chat, err, sizeof err) == 0);
    T_EQ_INT(tok_chat_tool_format(chat), TOK_TOOLS_HERMES);
    T_CHECK(tok_chat_thinks(chat));
    int rendered = 0, parsed = 0;
    for (const cm_json *c = cases ? cases->child : NULL; c; c = c->next) {
        const char *model = NULL, *name = NULL, *want = NULL;
        cm_json_get_str(c, "model", &model);
        cm_json_get_str(c, "name", &name);
        cm_json_get_str(c, "output", &want);
        const cm_json *ctx = cm_json_get(c, "context"), *msgs = cm_json_get(ctx, "messages"), *tools = cm_json_get(ctx, "tools");
        if (!model || strcmp(model, "qwen3") || !want || !msgs) continue;
        int has_calls = 0;
        for (const cm_json *m = msgs->child; m; m = m->next) has_calls |= cm_json_get(m, "tool_calls") != NULL;
        /* tools, tool calls, or chat_template_kwargs (enable_thinking) */
        if (!tools && !has_calls && !cm_json_get(ctx, "enable_thinking")) continue;
        int n = (int)msgs->n;
        tok_chat_msg *mm = calloc((size_t)n, sizeof *mm);
        char **owned = calloc((size_t)n, sizeof *owned);
        int i = 0;
        for (const cm_json *m = msgs->child; m; m = m->next, i++) {
            cm_json_get_str(m, "role", &mm[i].role);
            cm_json_get_str(m, "content", &mm[i].content);
            cm_json_get_str(m, "name", &mm[i].name);
            cm_json_get_str(m, "tool_call_id", &mm[i].tool_call_id);
            cm_json_get_str(m, "reasoning_content", &mm[i].reasoning_content);
            const cm_json *tc = cm_json_get(m, "tool_calls");
            if (tc) mm[i].tool_calls_json = owned[i] = client_calls(tc);
        }
        sb tj = { 0 }, kw = { 0 };
        if (tools) jval(&tj, tools);
        const cm_json *et = cm_json_get(ctx, "enable_thinking");
        if (et) { puts_(&kw, "{\"enable_thinking\":"); jval(&kw, et); puts_(&kw, "}"); }
        int agp = 0;
        cm_json_get_bool(ctx, "add_generation_prompt", &agp);
        char *out = NULL;
        size_t olen = 0;
        int rc = tok_chat_render_ex(chat, mm, n, tools ? tj.s : NULL, NULL, et ? kw.s : NULL, agp, &out, &olen, err, sizeof err);
        int same = rc == 0 && olen == strlen(want) && !memcmp(out, want, olen);
        if (!same) fprintf(stderr, "%s: rc %d (%s)\n  got:  %.300s\n  want: %.300s\n", name, rc, rc ? err : "", out ? out : "", want);
        T_CHECKF(same, "%s renders as the reference", name);
        rendered++;
        /* parse back the assistant turns with calls that the reference wrote, in order */
        const char *p = want;
        for (const cm_json *m = msgs->child; m; m = m->next) {
            const cm_json *tc = cm_json_get(m, "tool_calls");
            const char *role = NULL;
            cm_json_get_str(m, "role", &role);
            if (!role || strcmp(role, "assistant") || !tc) continue;
            const char *at = strstr(p, "<|im_start|>assistant\n"), *body = at ? at + 22 : NULL;
            while (at && !strstr(body, "<tool_call>")) { /* a turn without calls */
                at = strstr(body, "<|im_start|>assistant\n");
                body = at ? at + 22 : NULL;
            }
            const char *end = body ? strstr(body, "<|im_end|>") : NULL;
            if (!end) { T_CHECKF(0, "%s: no assistant turn with calls in the reference", name); break; }
            p = end;
            calls_rec r = { 0 };
            tok_out_cb cb = { NULL, NULL, r_begin, r_args, r_end };
            tok_out o;
            tok_out_init(&o, TOK_TOOLS_HERMES, 1, 0, &cb, &r);
            tok_out_feed(&o, body, (size_t)(end - body));
            tok_out_end(&o);
            tok_out_free(&o);
            int ok = r.n == (int)tc->n && r.ended == r.n;
            int k = 0;
            for (const cm_json *x = tc->child; x && ok; x = x->next, k++) {
                const cm_json *fn = cm_json_get(x, "function"), *args = cm_json_get(fn, "arguments");
                const char *nm = NULL;
                cm_json_get_str(fn, "name", &nm);
                cm_json_doc *ad = NULL;
                ok = nm && !strcmp(nm, r.name[k]) && r.args[k].s && cm_json_parse(r.args[k].s, r.args[k].n, &ad, err, sizeof err) == 0;
                if (ok && args && args->type != CM_JSON_STRING) ok = json_same(cm_json_root(ad), args);
                cm_json_free(ad);
            }
            T_CHECKF(ok, "%s: the reference's calls parse back (%d of %zu found)", name, r.n, tc->n);
            for (int q = 0; q < 8; q++) free(r.args[q].s);
            parsed++;
        }
        for (int q = 0; q < n; q++) free(owned[q]);
        free(owned);
        free(mm);
        free(out);
        free(tj.s);
        free(kw.s);
    }
    printf("%d conversations (tools, enable_thinking) rendered through the request path, %d assistant turns parsed back\n", rendered, parsed);
    T_CHECK(rendered >= 6 && parsed >= 2);
    tok_chat_free(chat);
    unlink(tp);
    rmdir(dir);
    cm_json_free(doc);
    free(text);
    return t_done();
}
