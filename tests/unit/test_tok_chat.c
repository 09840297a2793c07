/* test_tok_chat: finding, compiling and rendering a model's chat template (text/chat.h).
 *
 * Sources: GGUF tokenizer.chat_template (written here with gguf_write), a Hugging Face directory
 * with chat_template.jinja or tokenizer_config.json (a string, or a list with a "default"
 * entry), a built-in name replacing the model's own; a template that does not compile is a load
 * error naming its source; a model without one loads and render refuses with a message naming
 * --chat-template; the render context (null content as "", bos/eos texts, tools,
 * add_generation_prompt, tool_calls as values, raise_exception). */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cm_err.h"
#include "model/gguf_write.h"
#include "text/tmpl.h"
#include "tests/unit/t.h"

static char dir[256];

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    T_CHECK(f != NULL);
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

/* A GGUF with only metadata (no tensors): enough for the chat loader. tmpl may be NULL. */
static void write_gguf(const char *path, const char *tmpl) {
    gguf_writer *w;
    T_EQ_INT(gguf_w_create(&w), 0);
    gguf_w_set_str(w, "general.architecture", "llama");
    if (tmpl) gguf_w_set_str(w, "tokenizer.chat_template", tmpl);
    T_EQ_INT(gguf_w_begin(w, path), 0);
    T_EQ_INT(gguf_w_finish(w), 0);
    gguf_w_destroy(w);
}

static char *render(const tok_chat *c, const tok_chat_msg *m, int n, const char *tools, int gen, int *rc, char *err, size_t errlen) {
    char *out = NULL;
    size_t len = 0;
    *rc = tok_chat_render(c, m, n, tools, gen, &out, &len, err, errlen);
    if (*rc == 0) T_EQ_INT(strlen(out), len);
    return out;
}

static void test_gguf_source(void) {
    char p[512], err[512];
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    write_gguf(p, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
    tok_chat *c;
    T_EQ_INT(tok_chat_load(p, NULL, NULL, &c, err, sizeof err), 0);
    T_CHECK(tok_chat_ready(c));
    T_EQ_STR(tok_chat_source(c), "gguf:tokenizer.chat_template");
    tok_chat_msg m[] = { { .role = "system", .content = "S" }, { .role = "user", .content = NULL } };
    int rc;
    char *out = render(c, m, 2, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strcmp(out, "<system>S<user><assistant>") == 0, "render: rc=%d %s", rc, out ? out : err);
    free(out);
    out = render(c, m, 2, NULL, 0, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strcmp(out, "<system>S<user>") == 0, "no generation prompt: %s", out ? out : err);
    free(out);
    tok_chat_free(c);

    /* the built-in replaces the model's own */
    T_EQ_INT(tok_chat_load(p, "chatml", NULL, &c, err, sizeof err), 0);
    T_EQ_STR(tok_chat_source(c), "builtin:chatml");
    tok_chat_msg u[] = { { .role = "user", .content = "Hi" } };
    out = render(c, u, 1, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strstr(out, "<|im_start|>user\nHi<|im_end|>") && strstr(out, "<|im_start|>assistant"),
             "chatml: %s", out ? out : err);
    free(out);
    tok_chat_free(c);

    /* unknown built-in: error listing the names */
    T_EQ_INT(tok_chat_load(p, "nosuch", NULL, &c, err, sizeof err), CM_EINVAL);
    T_CHECKF(strstr(err, "nosuch") && strstr(err, "chatml"), "%s", err);

    /* a template that does not compile: a load error naming the file and the source */
    write_gguf(p, "{% for m in messages %}{{ m.content }");
    T_EQ_INT(tok_chat_load(p, NULL, NULL, &c, err, sizeof err), CM_ETEMPLATE);
    T_CHECKF(strstr(err, "m.gguf") && strstr(err, "tokenizer.chat_template") && strstr(err, "line"), "%s", err);

    /* none at all: loads, not ready, render says how to name one */
    write_gguf(p, NULL);
    T_EQ_INT(tok_chat_load(p, NULL, NULL, &c, err, sizeof err), 0);
    T_CHECK(!tok_chat_ready(c));
    T_EQ_STR(tok_chat_source(c), "none");
    out = render(c, u, 1, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == CM_ESTATE && !out && strstr(err, "--chat-template"), "rc=%d %s", rc, err);
    tok_chat_free(c);

    /* a missing file */
    snprintf(p, sizeof p, "%s/none.gguf", dir);
    T_CHECK(tok_chat_load(p, NULL, NULL, &c, err, sizeof err) != 0 && strstr(err, "none.gguf"));
}

static void test_hf_dir(void) {
    char d[300], p[512], err[512];
    snprintf(d, sizeof d, "%s/hf", dir);
    mkdir(d, 0700);
    tok_chat *c;
    int rc;
    char *out;
    /* tokenizer_config.json with a string */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
    write_text(p, "{\"bos_token\":\"<s>\",\"chat_template\":\"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}\"}");
    T_EQ_INT(tok_chat_load(d, NULL, NULL, &c, err, sizeof err), 0);
    T_EQ_STR(tok_chat_source(c), "tokenizer_config.json");
    tok_chat_msg m[] = { { .role = "user", .content = "a" }, { .role = "assistant", .content = "b" } };
    out = render(c, m, 2, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strcmp(out, "[user:a][assistant:b]") == 0, "config string (no vocabulary: empty bos): %s", out ? out : err);
    free(out);
    tok_chat_free(c);
    /* a list of named templates: "default" */
    write_text(p, "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D{{ messages|length }}\"}]}");
    T_EQ_INT(tok_chat_load(d, NULL, NULL, &c, err, sizeof err), 0);
    out = render(c, m, 2, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strcmp(out, "D2") == 0, "named list: %s", out ? out : err);
    free(out);
    tok_chat_free(c);
    /* malformed JSON: a load error naming the file */
    write_text(p, "{\"chat_template\": ");
    T_EQ_INT(tok_chat_load(d, NULL, NULL, &c, err, sizeof err), CM_EFORMAT);
    T_CHECKF(strstr(err, "tokenizer_config.json") != NULL, "%s", err);
    /* chat_template.jinja wins over the config */
    char j[512];
    snprintf(j, sizeof j, "%s/chat_template.jinja", d);
    write_text(j, "J{% if tools %}{{ tools[0].function.name }}{% endif %}{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% endif %}{% endfor %}");
    T_EQ_INT(tok_chat_load(d, NULL, NULL, &c, err, sizeof err), 0);
    T_EQ_STR(tok_chat_source(c), "chat_template.jinja");
    tok_chat_msg tc[] = { { .role = "assistant", .content = NULL,
                            .tool_calls_json = "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{}\"}}]" } };
    out = render(c, tc, 1, "[{\"type\":\"function\",\"function\":{\"name\":\"weather\"}}]", 1, &rc, err, sizeof err);
    T_CHECKF(rc == 0 && out && strcmp(out, "Jweatherget") == 0, "tools and tool_calls as values: %s", out ? out : err);
    free(out);
    out = render(c, tc, 1, "[{\"bad\":", 1, &rc, err, sizeof err);
    T_CHECKF(rc == CM_EINVAL && !out && strstr(err, "tools"), "bad tools JSON: rc=%d %s", rc, err);
    tok_chat_free(c);
    /* raise_exception reaches the caller as the template's message */
    write_text(j, "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok");
    T_EQ_INT(tok_chat_load(d, NULL, NULL, &c, err, sizeof err), 0);
    out = render(c, tc, 1, NULL, 1, &rc, err, sizeof err);
    T_CHECKF(rc == CM_ETEMPLATE && !out && strcmp(err, "Conversation must start with user") == 0, "raise_exception: rc=%d %s", rc, err);
    tok_chat_free(c);
    unlink(j);
    unlink(p);
    rmdir(d);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/arka-test-chat-XXXXXX");
    T_CHECK(mkdtemp(dir) != NULL);
    test_gguf_source();
    test_hf_dir();
    char p[512];
    snprintf(p, sizeof p, "%s/m.gguf", dir);
    unlink(p);
    rmdir(dir);
    return t_done();
}
