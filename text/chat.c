/* chat: finding, compiling and rendering a model's chat template (see chat.h). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/cm_err.h"
#include "common/cm_file.h"
#include "common/cm_json.h"
#include "model/gguf.h"
#include "tmpl.h"
#include "tools.h"

#define CHAT_FILE_MAX ((size_t)64 << 20) /* tokenizer_config.json / chat_template.jinja */

struct tok_chat {
    tmpl *t;               /* NULL: the model has none and none was named */
    char source[64];
    char *bos, *eos;       /* texts of the vocabulary's BOS / EOS, "" when none */
    int tool_format;       /* enum tok_tools of the template's source */
    int thinks;            /* the source mentions <think> */
};

static int read_file(const char *path, char **out, size_t *len, char *err, size_t errlen) {
    return cm_file_read(path, CHAT_FILE_MAX, out, len, err, errlen);
}

/* chat_template from tokenizer_config.json: a string, or a list of {name, template} (the
 * "default" entry). *src stays NULL when the file has none. */
static int hf_config_template(const char *dir, char **src, char *err, size_t errlen) {
    char path[4096], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    int rc = read_file(path, &text, &len, err, errlen);
    if (rc == CM_ENOENT) return 0;
    if (rc) return rc;
    cm_json_doc *d;
    char jerr[128];
    if ((rc = cm_json_parse(text, len, &d, jerr, sizeof jerr))) {
        snprintf(err, errlen, "%s: %s", path, jerr);
        free(text);
        return CM_EFORMAT;
    }
    const cm_json *t = cm_json_get(cm_json_root(d), "chat_template");
    const char *s = NULL;
    if (t && t->type == CM_JSON_STRING) s = t->str;
    else if (t && t->type == CM_JSON_ARRAY)
        for (size_t i = 0; i < t->n; i++) {
            const cm_json *e = cm_json_at(t, i);
            const char *name = NULL, *body = NULL;
            if (cm_json_get_str(e, "name", &name) == 0 && cm_json_get_str(e, "template", &body) == 0 &&
                strcmp(name, "default") == 0)
                s = body;
        }
    if (s && !(*src = strdup(s))) rc = CM_ENOMEM;
    cm_json_free(d);
    free(text);
    return rc;
}

/* The model's own template source, or *src NULL. */
static int model_template(const char *path, char **src, char *source, size_t srclen, char *err, size_t errlen) {
    *src = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: no such file or directory", path);
        return CM_ENOENT;
    }
    if (!S_ISDIR(st.st_mode)) {
        gguf_ctx *g;
        int rc = gguf_open(path, &g, err, errlen);
        if (rc) return rc;
        if (gguf_find(g, "tokenizer.chat_template")) {
            rc = gguf_get_strdup(g, "tokenizer.chat_template", src);
            if (rc) snprintf(err, errlen, "%s: tokenizer.chat_template is not a string", path);
            else snprintf(source, srclen, "gguf:tokenizer.chat_template");
        }
        gguf_close(g);
        return rc;
    }
    /* Hugging Face directory: chat_template.jinja (newer transformers) before tokenizer_config.json */
    char p[4096];
    size_t len;
    snprintf(p, sizeof p, "%s/chat_template.jinja", path);
    int rc = read_file(p, src, &len, err, errlen);
    if (rc == 0) {
        snprintf(source, srclen, "chat_template.jinja");
        return 0;
    }
    if (rc != CM_ENOENT) return rc;
    if ((rc = hf_config_template(path, src, err, errlen)) == 0 && *src) snprintf(source, srclen, "tokenizer_config.json");
    return rc;
}

static char *vocab_text(const tok_vocab *v, int32_t id) {
    const char *s = v && id >= 0 ? tok_text(v, id) : NULL;
    return strdup(s ? s : "");
}

int tok_chat_load(const char *path, const char *builtin, const tok_vocab *v, tok_chat **out, char *err, size_t errlen) {
    if (!path || !out) return CM_EINVAL;
    *out = NULL;
    tok_chat *c = calloc(1, sizeof *c);
    if (!c) return CM_ENOMEM;
    char *src = NULL;
    int rc = 0;
    snprintf(c->source, sizeof c->source, "none");
    if (builtin && *builtin) {
        const char *b = tmpl_builtin(builtin);
        if (!b) {
            snprintf(err, errlen, "unknown chat template '%s' (built-in templates: %s)", builtin, tmpl_builtin_names());
            rc = CM_EINVAL;
            goto fail;
        }
        if (!(src = strdup(b))) goto oom;
        snprintf(c->source, sizeof c->source, "builtin:%s", builtin);
    } else if ((rc = model_template(path, &src, c->source, sizeof c->source, err, errlen))) {
        goto fail;
    }
    if (src) {
        c->tool_format = tok_tools_detect(src);
        c->thinks = strstr(src, "<think>") != NULL;
        char terr[256];
        if ((rc = tmpl_compile(src, strlen(src), &c->t, terr, sizeof terr))) {
            snprintf(err, errlen, "%s: chat template (%s) does not compile: %s", path, c->source, terr);
            goto fail;
        }
    }
    if (!(c->bos = vocab_text(v, v ? tok_bos(v) : -1)) || !(c->eos = vocab_text(v, v ? tok_eos(v) : -1))) goto oom;
    free(src);
    *out = c;
    return 0;
oom:
    rc = CM_ENOMEM;
    snprintf(err, errlen, "out of memory");
fail:
    free(src);
    tok_chat_free(c);
    return rc;
}

void tok_chat_free(tok_chat *c) {
    if (!c) return;
    tmpl_free(c->t);
    free(c->bos);
    free(c->eos);
    free(c);
}

int tok_chat_ready(const tok_chat *c) { return c && c->t; }
int tok_chat_tool_format(const tok_chat *c) { return c ? c->tool_format : TOK_TOOLS_NONE; }
int tok_chat_thinks(const tok_chat *c) { return c && c->thinks; }
const char *tok_chat_source(const tok_chat *c) { return c ? c->source : "none"; }

static tmpl_value *str_or_empty(tmpl_arena *a, const char *s) { return tmpl_str(a, s ? s : "", s ? strlen(s) : 0); }

/* JSON text -> value; CM_EINVAL when it does not parse. */
static int json_value(tmpl_arena *a, const char *json, const char *what, tmpl_value **out, char *err, size_t errlen) {
    cm_json_doc *d;
    char jerr[128];
    if (cm_json_parse(json, strlen(json), &d, jerr, sizeof jerr)) {
        snprintf(err, errlen, "%s: %s", what, jerr);
        return CM_EINVAL;
    }
    int rc = tmpl_from_json(a, cm_json_root(d), out);
    cm_json_free(d);
    return rc;
}

/* tool_calls JSON -> values, each call's function.arguments string turned into the object it
 * encodes when it parses (vLLM's convention; templates write arguments with tojson). */
static int tool_calls_value(tmpl_arena *a, const char *json, tmpl_value **out, char *err, size_t errlen) {
    cm_json_doc *d;
    char jerr[128];
    if (cm_json_parse(json, strlen(json), &d, jerr, sizeof jerr)) {
        snprintf(err, errlen, "tool_calls: %s", jerr);
        return CM_EINVAL;
    }
    const cm_json *root = cm_json_root(d);
    int rc = 0;
    if (root->type != CM_JSON_ARRAY) {
        rc = tmpl_from_json(a, root, out);
        cm_json_free(d);
        return rc;
    }
    tmpl_value *list = tmpl_list(a);
    for (const cm_json *call = root->child; call && !rc; call = call->next) {
        tmpl_value *cv;
        if (call->type != CM_JSON_OBJECT) { rc = tmpl_from_json(a, call, &cv); if (!rc) rc = tmpl_list_push(a, list, cv); continue; }
        cv = tmpl_dict(a);
        for (const cm_json *k = call->child; k && !rc; k = k->next) {
            tmpl_value *kv = NULL;
            if (!strcmp(k->key, "function") && k->type == CM_JSON_OBJECT) {
                kv = tmpl_dict(a);
                for (const cm_json *f = k->child; f && !rc; f = f->next) {
                    tmpl_value *fv = NULL;
                    cm_json_doc *ad = NULL;
                    if (!strcmp(f->key, "arguments") && f->type == CM_JSON_STRING &&
                        cm_json_parse(f->str, f->str_len, &ad, jerr, sizeof jerr) == 0)
                        rc = tmpl_from_json(a, cm_json_root(ad), &fv);
                    else rc = tmpl_from_json(a, f, &fv);
                    cm_json_free(ad);
                    if (!rc) rc = tmpl_dict_set(a, kv, f->key, f->key_len, fv);
                }
            } else rc = tmpl_from_json(a, k, &kv);
            if (!rc) rc = tmpl_dict_set(a, cv, k->key, k->key_len, kv);
        }
        if (!rc) rc = tmpl_list_push(a, list, cv);
    }
    cm_json_free(d);
    if (!rc) *out = list;
    return rc;
}

int tok_chat_render(const tok_chat *c, const tok_chat_msg *msgs, int n, const char *tools_json, int add_generation_prompt,
                    char **out, size_t *out_len, char *err, size_t errlen) {
    return tok_chat_render_ex(c, msgs, n, tools_json, NULL, NULL, add_generation_prompt, out, out_len, err, errlen);
}

int tok_chat_render_ex(const tok_chat *c, const tok_chat_msg *msgs, int n, const char *tools_json,
                       const char *tool_choice_json, const char *kwargs_json, int add_generation_prompt, char **out,
                       size_t *out_len, char *err, size_t errlen) {
    if (!c || (!msgs && n) || n < 0 || !out || !out_len) return CM_EINVAL;
    if (!c->t) {
        snprintf(err, errlen, "this model has no chat template; start the server with --chat-template NAME (one of: %s)",
                 tmpl_builtin_names());
        return CM_ESTATE;
    }
    tmpl_arena *a = tmpl_arena_create();
    if (!a) return CM_ENOMEM;
    int rc = 0;
    tmpl_value *ctx = tmpl_dict(a), *list = tmpl_list(a);
    for (int i = 0; i < n && rc == 0; i++) {
        const tok_chat_msg *m = &msgs[i];
        tmpl_value *d = tmpl_dict(a);
        rc = tmpl_dict_set(a, d, "role", 4, str_or_empty(a, m->role));
        if (!rc) rc = tmpl_dict_set(a, d, "content", 7, str_or_empty(a, m->content));
        if (!rc && m->name) rc = tmpl_dict_set(a, d, "name", 4, str_or_empty(a, m->name));
        if (!rc && m->tool_call_id) rc = tmpl_dict_set(a, d, "tool_call_id", 12, str_or_empty(a, m->tool_call_id));
        if (!rc && m->reasoning_content)
            rc = tmpl_dict_set(a, d, "reasoning_content", 17, str_or_empty(a, m->reasoning_content));
        if (!rc && m->tool_calls_json) {
            tmpl_value *tc;
            if (!(rc = tool_calls_value(a, m->tool_calls_json, &tc, err, errlen))) rc = tmpl_dict_set(a, d, "tool_calls", 10, tc);
        }
        if (!rc) rc = tmpl_list_push(a, list, d);
    }
    if (!rc) rc = tmpl_dict_set(a, ctx, "messages", 8, list);
    if (!rc && tools_json) {
        tmpl_value *tools;
        if (!(rc = json_value(a, tools_json, "tools", &tools, err, errlen))) rc = tmpl_dict_set(a, ctx, "tools", 5, tools);
    }
    if (!rc) rc = tmpl_dict_set(a, ctx, "add_generation_prompt", 21, tmpl_bool(a, add_generation_prompt));
    if (!rc) rc = tmpl_dict_set(a, ctx, "bos_token", 9, str_or_empty(a, c->bos));
    if (!rc) rc = tmpl_dict_set(a, ctx, "eos_token", 9, str_or_empty(a, c->eos));
    if (!rc && tool_choice_json) {
        tmpl_value *tcv;
        if (!(rc = json_value(a, tool_choice_json, "tool_choice", &tcv, err, errlen))) rc = tmpl_dict_set(a, ctx, "tool_choice", 11, tcv);
    }
    if (!rc && kwargs_json) {
        cm_json_doc *kd;
        char jerr[128];
        if (cm_json_parse(kwargs_json, strlen(kwargs_json), &kd, jerr, sizeof jerr)) {
            snprintf(err, errlen, "chat_template_kwargs: %s", jerr);
            rc = CM_EINVAL;
        } else {
            static const char *const reserved[] = { "messages", "tools", "tool_choice", "add_generation_prompt", "bos_token",
                                                    "eos_token", NULL };
            const cm_json *root = cm_json_root(kd);
            if (root->type != CM_JSON_OBJECT) {
                snprintf(err, errlen, "chat_template_kwargs: expected an object");
                rc = CM_EINVAL;
            }
            for (const cm_json *k = root->type == CM_JSON_OBJECT ? root->child : NULL; k && !rc; k = k->next) {
                for (int r = 0; reserved[r]; r++)
                    if (!strcmp(k->key, reserved[r])) {
                        snprintf(err, errlen, "chat_template_kwargs: '%s' is set by the request itself", k->key);
                        rc = CM_EINVAL;
                    }
                tmpl_value *kv;
                if (!rc && !(rc = tmpl_from_json(a, k, &kv))) rc = tmpl_dict_set(a, ctx, k->key, k->key_len, kv);
            }
            cm_json_free(kd);
        }
    }
    if (rc == CM_ENOMEM) snprintf(err, errlen, "out of memory");
    if (!rc) rc = tmpl_render(c->t, ctx, NULL, out, out_len, err, errlen);
    tmpl_arena_destroy(a);
    return rc;
}
