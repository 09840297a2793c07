/* tmpl against reference renderings: @huggingface/jinja on the real chat templates of Llama 3,
 * Qwen3 and Gemma 3 (tests/integration/tmpl_ref.mjs), and Python Jinja2 configured like
 * transformers on the same plus feature snippets (tests/integration/tmpl_ref.py).
 *
 * Reads a reference file (templates, contexts and expected outputs or errors), renders every
 * case with our engine and compares byte for byte. tests/integration/test_tmpl_real.sh makes
 * the references and runs this binary with ARKA_TMPL_REF set. Without ARKA_TMPL_REF it uses the reference a previous run
 * left in ${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-tmpl/ref.json, and skips (0 checks) when
 * there is none. */
#include "common/cm_err.h"
#include "common/cm_json.h"
#include "text/tmpl.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

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

/* First differing byte, for the failure message. */
static void show_diff(const char *name, const char *got, size_t gn, const char *want, size_t wn) {
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: differs at byte %zu (got %zu bytes, want %zu)\n    got:  \"", name, i, gn, wn);
    for (size_t k = from; k < gn && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fprintf(stderr, "\"\n    want: \"");
    for (size_t k = from; k < wn && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fprintf(stderr, "\"\n");
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
    if (cm_json_parse(text, len, &doc, err, sizeof err)) { fprintf(stderr, "%s: %s\n", path, err); T_CHECK(0); free(text); return t_done(); }
    const cm_json *root = cm_json_root(doc), *templates = cm_json_get(root, "templates"), *cases = cm_json_get(root, "cases");
    T_CHECK(templates && cases && cases->n >= 20);
    if (!templates || !cases) { cm_json_free(doc); free(text); return t_done(); }

    /* compile each model's template once, as the gateway does at load */
    enum { MAXM = 256 };
    const char *names[MAXM];
    tmpl *compiled[MAXM];
    int nm = 0;
    for (const cm_json *t = templates->child; t && nm < MAXM; t = t->next) {
        names[nm] = t->key;
        int rc = tmpl_compile(t->str, t->str_len, &compiled[nm], err, sizeof err);
        T_CHECKF(rc == 0, "compile %s: %s", t->key, err);
        if (rc) compiled[nm] = NULL;
        nm++;
    }
    int matched = 0, total = 0;
    for (const cm_json *c = cases->child; c; c = c->next) {
        const char *name = "?", *model = "", *want = NULL, *want_err = NULL;
        cm_json_get_str(c, "name", &name);
        cm_json_get_str(c, "model", &model);
        const cm_json *out = cm_json_get(c, "output"), *eo = cm_json_get(c, "error");
        if (out) want = out->str;
        if (eo) want_err = eo->str;
        tmpl *t = NULL;
        for (int i = 0; i < nm; i++)
            if (!strcmp(names[i], model)) t = compiled[i];
        total++;
        if (!t) { T_CHECKF(0, "%s: no template for %s", name, model); continue; }
        tmpl_arena *a = tmpl_arena_create();
        tmpl_value *ctx;
        T_EQ_INT(tmpl_from_json(a, cm_json_get(c, "context"), &ctx), 0);
        char *got = NULL;
        size_t gn = 0;
        int rc = tmpl_render(t, ctx, NULL, &got, &gn, err, sizeof err);
        if (want) {
            int ok = rc == 0 && gn == out->str_len && memcmp(got, want, gn) == 0;
            T_CHECKF(ok, "%s: %s", name, rc ? err : "output differs");
            if (!rc && !ok) show_diff(name, got, gn, want, out->str_len);
            matched += ok;
        } else {
            /* the reference raised: so must we, with the template's own message (a "PY:"
             * error is Python's own exception: any template error of ours matches) */
            int ok = rc == CM_ETEMPLATE && want_err && (strncmp(want_err, "PY:", 3) == 0 || strcmp(err, want_err) == 0);
            T_CHECKF(ok, "%s: want error \"%s\", got rc %d \"%s\"", name, want_err ? want_err : "?", rc, err);
            matched += ok;
        }
        free(got);
        tmpl_arena_destroy(a);
    }
    printf("%d of %d reference renderings matched byte for byte\n", matched, total);
    for (int i = 0; i < nm; i++) tmpl_free(compiled[i]);
    cm_json_free(doc);
    free(text);
    return t_done();
}
