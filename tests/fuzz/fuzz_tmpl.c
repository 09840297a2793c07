/* fuzz_tmpl: arbitrary bytes as a chat template, compiled and rendered against a fixed
 * context (messages with string and list content, tools, tool calls, the usual flags) under
 * tight limits. Anything may be an error; nothing may crash, leak, hang or exceed the limits.
 *
 *   make build-fuzz   (tests/fuzz/README.md)
 *   mkdir -p /tmp/tmpl-corpus && build-fuzz/bin/fuzz_tmpl -max_total_time=120 -max_len=4096 \
 *         -rss_limit_mb=2048 -timeout=10 /tmp/tmpl-corpus
 * Seed the corpus with real templates (the cache of tests/integration/test_tmpl_real.sh holds
 * them in ref.json) for a faster start. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_json.h"
#include "text/tmpl.h"

static const char CONTEXT[] =
    "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,\"enable_thinking\":false,"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"default\":0.5}},\"required\":[\"a\"]}}}],"
    "\"messages\":[{\"role\":\"system\",\"content\":\"sys \\u00e9\"},"
    "{\"role\":\"user\",\"content\":\"Hi <think>x</think> {{ y }}\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
    "\"arguments\":{\"a\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part\"},{\"type\":\"image\"}]},"
    "{\"role\":\"assistant\",\"content\":null}]}";

static tmpl_arena *arena;
static tmpl_value *ctx;

static void setup(void) {
    cm_json_doc *d;
    char err[128];
    arena = tmpl_arena_create();
    if (!arena || cm_json_parse(CONTEXT, sizeof CONTEXT - 1, &d, err, sizeof err)) abort();
    if (tmpl_from_json(arena, cm_json_root(d), &ctx)) abort();
    cm_json_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!arena) setup();
    tmpl *t;
    char err[256];
    if (tmpl_compile((const char *)data, size, &t, err, sizeof err)) return 0;
    tmpl_limits lim = {.max_output = 1 << 20, .max_memory = 64 << 20, .max_steps = 200000, .max_depth = 200};
    char *out = NULL;
    size_t n = 0;
    if (tmpl_render(t, ctx, &lim, &out, &n, err, sizeof err) == 0) {
        if (strlen(out) > n || n > lim.max_output) abort(); /* NUL-terminated, within the cap */
        free(out);
    }
    tmpl_free(t);
    return 0;
}
