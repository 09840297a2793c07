/* openai: request validation and response JSON for the OpenAI-compatible API. */
#include "gateway/openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <cjson/cJSON.h>

#include "common/cm_err.h"
#include "gateway/openai_internal.h"

/* ---- errors ------------------------------------------------------------------------------- */

void gw_oai_err_set(gw_oai_err *e, int status, const char *type, const char *param, const char *code,
                    const char *fmt, ...) {
    va_list ap;
    e->status = status;
    e->type = type ? type : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void gw_oai_err_context(gw_oai_err *e, int kind, int ctx, int prompt_tokens, int completion_tokens) {
    long long total = (long long)prompt_tokens + completion_tokens;
    if (kind == GW_OAI_CHAT)
        gw_oai_err_set(e, 400, "invalid_request_error", "messages", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                       "(%d in the messages, %d in the completion). Please reduce the length of the messages or "
                       "completion.",
                       ctx, total, prompt_tokens, completion_tokens);
    else
        gw_oai_err_set(e, 400, "invalid_request_error", "prompt", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                       "(%d in your prompt; %d for the completion). Please reduce your prompt; or completion "
                       "length.",
                       ctx, total, prompt_tokens, completion_tokens);
}

char *gw_oai_error_json(const gw_oai_err *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    if (!err) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code[0]) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

void gw_oai_make_id(char *dst, size_t cap, const char *prefix) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[24];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        /* no entropy available: still unique within the process */
        static unsigned long long ctr;
        unsigned long long v = ++ctr * 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (unsigned char)(v >> (8 * (i % 8))) ^ (unsigned char)i;
    }
    char tail[25];
    for (size_t i = 0; i < 24; i++) tail[i] = al[rnd[i] % 62];
    tail[24] = 0;
    snprintf(dst, cap, "%s%s", prefix, tail);
}

/* ---- parsing ------------------------------------------------------------------------------ */

static const char *jtype(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

static int bad_type(gw_oai_err *e, const char *param, const char *want, const cJSON *v) {
    gw_oai_err_set(e, 400, "invalid_request_error", param, "invalid_type",
                   "Invalid type for '%s': expected %s, but got %s instead.", param, want, jtype(v));
    return CM_EINVAL;
}

static int bad_value(gw_oai_err *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad_value(gw_oai_err *e, const char *param, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gw_oai_err_set(e, 400, "invalid_request_error", param, "invalid_value", "Invalid '%s': %s", param, msg);
    return CM_EINVAL;
}

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number in [lo, hi] (open ends with lo_open/hi_open). 0: absent or ok, else CM_EINVAL. */
static int get_num(const cJSON *o, const char *name, double lo, int lo_open, double hi, int hi_open, float *dst,
                   gw_oai_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(e, name, "a number", v);
    double d = v->valuedouble;
    if (!isfinite(d) || (lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi))
        return bad_value(e, name, "expected a value %s %g and %s %g, but got %g instead.", lo_open ? ">" : ">=", lo,
                         hi_open ? "<" : "<=", hi, d);
    *dst = (float)d;
    return 0;
}

static int is_integral(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble) &&
           v->valuedouble >= lo && v->valuedouble <= hi;
}

static int get_int(const cJSON *o, const char *name, long long lo, long long hi, int *dst, gw_oai_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return bad_type(e, name, "an integer", v);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return bad_value(e, name, "expected an integer between %lld and %lld, but got %.17g instead.", lo, hi,
                         v->valuedouble);
    *dst = (int)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *dst, gw_oai_err *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_type(e, name, "a boolean", v);
    *dst = cJSON_IsTrue(v);
    return 0;
}

static int dup_str(const char *s, char **dst, gw_oai_err *e) {
    *dst = strdup(s);
    if (*dst) return 0;
    gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return CM_ENOMEM;
}

static int oom(gw_oai_err *e) {
    gw_oai_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return CM_ENOMEM;
}

static int parse_stop(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    const cJSON *one[1] = {v};
    int n = 1;
    if (cJSON_IsArray(v)) {
        n = cJSON_GetArraySize(v);
        if (n > GW_OAI_STOP_MAX)
            return bad_value(e, "stop", "expected an array with maximum length %d, but got an array with length %d instead.",
                             GW_OAI_STOP_MAX, n);
    } else if (!cJSON_IsString(v)) {
        return bad_type(e, "stop", "a string or an array of strings", v);
    }
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, i) : one[0];
        if (!cJSON_IsString(s)) return bad_type(e, "stop", "a string", s);
        size_t len = strlen(s->valuestring);
        if (len == 0) continue; /* an empty stop string can never match anything useful */
        if (len > GW_OAI_STOP_LEN_MAX)
            return bad_value(e, "stop", "each stop string may be at most %d bytes, but got %zu.", GW_OAI_STOP_LEN_MAX, len);
        if (dup_str(s->valuestring, &q->stop[q->n_stop], e)) return CM_ENOMEM;
        q->n_stop++;
    }
    return 0;
}

static int parse_bias(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v = field(o, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return bad_type(e, "logit_bias", "an object", v);
    int n = cJSON_GetArraySize(v);
    if (n > GW_OAI_BIAS_MAX) return bad_value(e, "logit_bias", "at most %d entries are allowed, got %d.", GW_OAI_BIAS_MAX, n);
    if (n == 0) return 0;
    q->logit_bias = calloc((size_t)n, sizeof *q->logit_bias);
    if (!q->logit_bias) return oom(e);
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        const char *k = it->string;
        char *end;
        if (!k || !*k || *k == '-' || *k == '+' || *k == ' ') return bad_value(e, "logit_bias", "keys must be token ids, got '%.64s'.", k ? k : "");
        long long id = strtoll(k, &end, 10);
        if (*end || id < 0 || id > INT32_MAX) return bad_value(e, "logit_bias", "keys must be token ids, got '%.64s'.", k);
        if (!cJSON_IsNumber(it)) return bad_type(e, "logit_bias", "a number", it);
        double b = it->valuedouble;
        if (!isfinite(b) || b < -100 || b > 100)
            return bad_value(e, "logit_bias", "bias values must be between -100 and 100, got %g for token %lld.", b, id);
        q->logit_bias[q->n_logit_bias].token = (int32_t)id;
        q->logit_bias[q->n_logit_bias].bias = (float)b;
        q->n_logit_bias++;
    }
    return 0;
}

/* Reads an array of token ids. */
static int token_array(const cJSON *a, gw_oai_req *q, gw_oai_err *e) {
    int n = cJSON_GetArraySize(a);
    if (n == 0) return bad_value(e, "prompt", "a token array must not be empty.");
    q->prompt_tokens = malloc((size_t)n * sizeof *q->prompt_tokens);
    if (!q->prompt_tokens) return oom(e);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, a) {
        if (!is_integral(t, 0, INT32_MAX)) return bad_value(e, "prompt", "token ids must be integers >= 0 (item %d).", i);
        q->prompt_tokens[i++] = (int32_t)t->valuedouble;
    }
    q->n_prompt_tokens = n;
    return 0;
}

static int parse_prompt(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v || cJSON_IsNull(v)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "prompt", "missing_required_parameter",
                       "Missing required parameter: 'prompt'.");
        return CM_EINVAL;
    }
    if (cJSON_IsString(v)) return dup_str(v->valuestring, &q->prompt, e);
    if (!cJSON_IsArray(v)) return bad_type(e, "prompt", "a string, an array of strings, or an array of token ids", v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad_value(e, "prompt", "the prompt must not be an empty array.");
    const cJSON *first = cJSON_GetArrayItem(v, 0);
    if (cJSON_IsNumber(first)) return token_array(v, q, e);
    if (n > 1) {
        gw_oai_err_set(e, 400, "invalid_request_error", "prompt", "unsupported_value",
                       "Batched prompts (%d prompts in one request) are not supported; send one prompt per request.", n);
        return CM_EINVAL;
    }
    if (cJSON_IsString(first)) return dup_str(first->valuestring, &q->prompt, e);
    if (cJSON_IsArray(first)) return token_array(first, q, e);
    return bad_type(e, "prompt", "a string, an array of strings, or an array of token ids", first);
}

static int is_role(const char *r) {
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (strcmp(r, roles[i]) == 0) return 1;
    return 0;
}

static int parse_content(const cJSON *c, int i, gw_oai_msg *m, gw_oai_err *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c || cJSON_IsNull(c)) return 0;
    if (cJSON_IsString(c)) return dup_str(c->valuestring, &m->content, e);
    if (!cJSON_IsArray(c)) return bad_type(e, param, "a string or an array of content parts", c);
    size_t total = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type)) return bad_type(e, param, "an array of content parts", p);
        if (strcmp(type->valuestring, "text") != 0) {
            gw_oai_err_set(e, 400, "invalid_request_error", param, "unsupported_value",
                           "Content parts of type '%.40s' are not supported; only 'text' parts are.", type->valuestring);
            return CM_EINVAL;
        }
        if (!cJSON_IsString(text)) return bad_type(e, param, "a text part with a string 'text'", text);
        total += strlen(text->valuestring);
    }
    m->content = malloc(total + 1);
    if (!m->content) return oom(e);
    size_t off = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(m->content + off, t, l);
        off += l;
    }
    m->content[off] = 0;
    return 0;
}

/* An assistant message's tool_calls: [{id, type: "function", function: {name, arguments}}]. */
static int check_tool_calls(const cJSON *tc, const char *param, gw_oai_err *e) {
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, tc) {
        char p[96];
        snprintf(p, sizeof p, "%s[%d]", param, k++);
        const cJSON *f = cJSON_IsObject(c) ? field(c, "function") : NULL, *type = cJSON_IsObject(c) ? field(c, "type") : NULL;
        const cJSON *name = f ? field(f, "name") : NULL, *args = f ? field(f, "arguments") : NULL, *id = cJSON_IsObject(c) ? field(c, "id") : NULL;
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f)) return bad_type(e, p, "a tool call {id, type, function: {name, arguments}}", c);
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))
            return bad_value(e, p, "only tool calls of type 'function' are supported.");
        if (!cJSON_IsString(name)) return bad_type(e, p, "a function name string", name);
        if (args && !cJSON_IsString(args)) return bad_type(e, p, "arguments as a JSON string", args);
        if (id && !cJSON_IsString(id)) return bad_type(e, p, "a string id", id);
    }
    return 0;
}

static int parse_messages(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!v || cJSON_IsNull(v)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "messages", "missing_required_parameter",
                       "Missing required parameter: 'messages'.");
        return CM_EINVAL;
    }
    if (!cJSON_IsArray(v)) return bad_type(e, "messages", "an array", v);
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad_value(e, "messages", "empty array. Expected an array with minimum length 1, but got an empty array instead.");
    q->msgs = calloc((size_t)n, sizeof *q->msgs);
    if (!q->msgs) return oom(e);
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, v) {
        char param[64];
        gw_oai_msg *dst = &q->msgs[i];
        q->n_msgs = i + 1;
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return bad_type(e, param, "an object", m);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!role || cJSON_IsNull(role)) {
            gw_oai_err_set(e, 400, "invalid_request_error", param, "missing_required_parameter",
                           "Missing required parameter: '%s'.", param);
            return CM_EINVAL;
        }
        if (!cJSON_IsString(role)) return bad_type(e, param, "a string", role);
        if (!is_role(role->valuestring))
            return bad_value(e, param, "value must be one of 'system', 'developer', 'user', 'assistant', 'tool', got '%.40s'.",
                             role->valuestring);
        if (dup_str(role->valuestring, &dst->role, e)) return CM_ENOMEM;
        int err = parse_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, dst, e);
        if (err) return err;
        const cJSON *name = field(m, "name"), *tcid = field(m, "tool_call_id"), *tc = field(m, "tool_calls");
        snprintf(param, sizeof param, "messages[%d].name", i);
        if (name && !cJSON_IsString(name)) return bad_type(e, param, "a string", name);
        if (name && dup_str(name->valuestring, &dst->name, e)) return CM_ENOMEM;
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        if (tcid && !cJSON_IsString(tcid)) return bad_type(e, param, "a string", tcid);
        if (tcid && dup_str(tcid->valuestring, &dst->tool_call_id, e)) return CM_ENOMEM;
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        if (tc && !cJSON_IsArray(tc)) return bad_type(e, param, "an array", tc);
        if (tc && (err = check_tool_calls(tc, param, e))) return err;
        if (tc && !(dst->tool_calls = cJSON_PrintUnformatted(tc))) return oom(e);
        const cJSON *rc = field(m, "reasoning_content");
        snprintf(param, sizeof param, "messages[%d].reasoning_content", i);
        if (rc && !cJSON_IsString(rc)) return bad_type(e, param, "a string", rc);
        if (rc && dup_str(rc->valuestring, &dst->reasoning, e)) return CM_ENOMEM;
        if (!strcmp(dst->role, "tool") && !dst->tool_call_id) {
            snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
            gw_oai_err_set(e, 400, "invalid_request_error", param, "missing_required_parameter",
                           "Missing required parameter: '%s'.", param);
            return CM_EINVAL;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, m) {
            static const char *const known[] = { "role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content",
                                                 "refusal", "annotations", NULL };
            int ok = 0;
            for (int j = 0; known[j] && !ok; j++) ok = !strcmp(k->string, known[j]);
            if (!ok) {
                snprintf(param, sizeof param, "messages[%d].%.30s", i, k->string);
                gw_oai_err_set(e, 400, "invalid_request_error", param, "unknown_parameter",
                               "Unrecognized message field supplied: %.60s (messages[%d]).", k->string, i);
                return CM_EINVAL;
            }
        }
        if (!dst->content && !dst->tool_calls && strcmp(dst->role, "assistant") != 0) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            gw_oai_err_set(e, 400, "invalid_request_error", param, "missing_required_parameter",
                           "Missing required parameter: '%s'.", param);
            return CM_EINVAL;
        }
        i++;
    }
    if (!(q->messages_json = cJSON_PrintUnformatted(v))) return oom(e);
    return 0;
}

/* ---- fields: every one implemented, a documented no-op, or refused --------------------------- */

static const char *const FIELDS_COMMON[] = { "model", "user", "service_tier", "store", "metadata", NULL };
static const char *const FIELDS_SAMPLING[] = { "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                               "frequency_penalty", "repetition_penalty", "seed", "stop", "n", "logit_bias",
                                               "stream", "stream_options", "max_tokens", "min_tokens", "ignore_eos",
                                               "response_format", "grammar", "priority", NULL };
static const char *const FIELDS_CHAT[] = { "messages", "logprobs", "top_logprobs", "max_completion_tokens", "tools",
                                           "tool_choice", "parallel_tool_calls", "chat_template_kwargs", NULL };
static const char *const FIELDS_CMPL[] = { "prompt", "logprobs", "echo", "suffix", "best_of", "max_completion_tokens", NULL };
static const char *const FIELDS_RESP[] = { "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                                           "text", "temperature", "top_p", "max_output_tokens", "stream", "store", "metadata",
                                           "user", "service_tier", "truncation", "include", "background",
                                           "chat_template_kwargs", "top_k", "min_p", "seed", "presence_penalty",
                                           "frequency_penalty", "reasoning", "priority", NULL };
static const char *const FIELDS_EMBD[] = { "model", "input", "encoding_format", "dimensions", "user", NULL };

static int in_list(const char *const *l, const char *k) {
    for (; l && *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int check_fields(int kind, const cJSON *o, gw_oai_err *e) {
    const cJSON *k;
    cJSON_ArrayForEach(k, o) {
        int ok;
        if (kind == GW_OAI_RESPONSES) ok = in_list(FIELDS_RESP, k->string);
        else if (kind == GW_OAI_EMBEDDINGS) ok = in_list(FIELDS_EMBD, k->string);
        else ok = in_list(FIELDS_COMMON, k->string) || in_list(FIELDS_SAMPLING, k->string) ||
                  in_list(kind == GW_OAI_CHAT ? FIELDS_CHAT : FIELDS_CMPL, k->string);
        if (!ok) {
            gw_oai_err_set(e, 400, "invalid_request_error", k->string, "unknown_parameter",
                           "Unrecognized request argument supplied: %.100s", k->string);
            return CM_EINVAL;
        }
    }
    return 0;
}

/* The accepted no-ops: their types are still checked. */
static int parse_noops(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v;
    if ((v = field(o, "service_tier")) && !cJSON_IsString(v)) return bad_type(e, "service_tier", "a string", v);
    if ((v = field(o, "store")) && !cJSON_IsBool(v)) return bad_type(e, "store", "a boolean", v);
    q->store = v ? cJSON_IsTrue(v) : 1;
    if ((v = field(o, "metadata"))) {
        if (!cJSON_IsObject(v)) return bad_type(e, "metadata", "an object", v);
        const cJSON *m;
        cJSON_ArrayForEach(m, v) if (!cJSON_IsString(m)) return bad_type(e, "metadata", "an object of strings", m);
        if (!(q->metadata_json = cJSON_PrintUnformatted(v))) return oom(e);
    }
    return 0;
}

/* A function name: [a-zA-Z0-9_-]{1,64}. */
static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* tools: chat's [{type: "function", function: {name, description, parameters, strict}}], or
 * (responses) [{type: "function", name, description, parameters, strict}]; kept in chat's form
 * for the template. */
static int parse_tools(const cJSON *o, gw_oai_req *q, int flat, gw_oai_err *e) {
    const cJSON *v = field(o, "tools");
    if (!v) return 0;
    if (!cJSON_IsArray(v)) return bad_type(e, "tools", "an array", v);
    int n = cJSON_GetArraySize(v);
    if (n > GW_OAI_TOOLS_MAX) return bad_value(e, "tools", "at most %d tools are supported, got %d.", GW_OAI_TOOLS_MAX, n);
    if (n == 0) return 0;
    q->tools = calloc((size_t)n, sizeof *q->tools);
    cJSON *chat = cJSON_CreateArray();
    if (!q->tools || !chat) { cJSON_Delete(chat); return oom(e); }
    const cJSON *t;
    int i = 0, rc = 0;
    cJSON_ArrayForEach(t, v) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i);
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        if (!cJSON_IsObject(t)) { rc = bad_type(e, p, "an object", t); break; }
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            gw_oai_err_set(e, 400, "invalid_request_error", p, "unsupported_value",
                           "Only tools of type 'function' are supported (tools[%d] is '%.40s').", i,
                           cJSON_IsString(type) ? type->valuestring : "missing");
            rc = CM_EINVAL;
            break;
        }
        const cJSON *f = flat ? t : field(t, "function");
        if (!cJSON_IsObject(f)) { rc = bad_type(e, p, "a function tool {type, function: {name, ...}}", f); break; }
        const cJSON *k;
        cJSON_ArrayForEach(k, f) {
            static const char *const known[] = { "type", "name", "description", "parameters", "strict", NULL };
            if (!in_list(known, k->string) || (!flat && !strcmp(k->string, "type"))) {
                snprintf(p, sizeof p, "tools[%d].%.30s", i, k->string);
                gw_oai_err_set(e, 400, "invalid_request_error", p, "unknown_parameter", "Unrecognized tool field supplied: %.60s",
                               k->string);
                rc = CM_EINVAL;
                break;
            }
        }
        if (rc) break;
        if (!flat) {
            cJSON_ArrayForEach(k, t) if (strcmp(k->string, "type") && strcmp(k->string, "function")) {
                snprintf(p, sizeof p, "tools[%d].%.30s", i, k->string);
                gw_oai_err_set(e, 400, "invalid_request_error", p, "unknown_parameter", "Unrecognized tool field supplied: %.60s",
                               k->string);
                rc = CM_EINVAL;
                break;
            }
            if (rc) break;
        }
        const cJSON *name = field(f, "name"), *params = field(f, "parameters"), *desc = field(f, "description"), *strict = field(f, "strict");
        snprintf(p, sizeof p, "tools[%d].%sname", i, flat ? "" : "function.");
        if (!cJSON_IsString(name)) { rc = bad_type(e, p, "a string", name); break; }
        if (!name_ok(name->valuestring)) { rc = bad_value(e, p, "'%.80s' does not match '^[a-zA-Z0-9_-]{1,64}$'.", name->valuestring); break; }
        for (int j = 0; j < i; j++)
            if (!strcmp(q->tools[j].name, name->valuestring)) { rc = bad_value(e, p, "duplicate function name '%s'.", name->valuestring); break; }
        if (rc) break;
        snprintf(p, sizeof p, "tools[%d].%sparameters", i, flat ? "" : "function.");
        if (params && !cJSON_IsObject(params)) { rc = bad_type(e, p, "an object (a JSON schema)", params); break; }
        if (desc && !cJSON_IsString(desc)) { rc = bad_type(e, "tools", "a string description", desc); break; }
        if (strict && !cJSON_IsBool(strict)) { rc = bad_type(e, "tools", "a boolean strict", strict); break; }
        q->n_tools = i + 1;
        if ((rc = dup_str(name->valuestring, &q->tools[i].name, e))) break;
        if (params && !(q->tools[i].params_json = cJSON_PrintUnformatted(params))) { rc = oom(e); break; }
        /* chat's form for the template */
        cJSON *ct = cJSON_CreateObject(), *cf = cJSON_CreateObject();
        cJSON_AddStringToObject(ct, "type", "function");
        cJSON_AddStringToObject(cf, "name", name->valuestring);
        if (desc) cJSON_AddStringToObject(cf, "description", desc->valuestring);
        if (params) cJSON_AddItemToObject(cf, "parameters", cJSON_Duplicate(params, 1));
        if (strict) cJSON_AddBoolToObject(cf, "strict", cJSON_IsTrue(strict));
        cJSON_AddItemToObject(ct, "function", cf);
        cJSON_AddItemToArray(chat, ct);
        i++;
    }
    if (!rc && !(q->tools_json = cJSON_PrintUnformatted(chat))) rc = oom(e);
    cJSON_Delete(chat);
    return rc;
}

/* tool_choice: "none" | "auto" | "required" | {type: "function", function: {name}} (responses:
 * {type: "function", name}). */
static int parse_tool_choice(const cJSON *o, gw_oai_req *q, int flat, gw_oai_err *e) {
    q->parallel_tool_calls = 1;
    int err = get_bool(o, "parallel_tool_calls", &q->parallel_tool_calls, e);
    if (err) return err;
    const cJSON *v = field(o, "tool_choice");
    q->tool_choice = GW_TC_AUTO;
    if (!v) return 0;
    if (!(q->tool_choice_json = cJSON_PrintUnformatted(v))) return oom(e);
    if (cJSON_IsString(v)) {
        const char *c = v->valuestring;
        if (!strcmp(c, "none")) q->tool_choice = GW_TC_NONE;
        else if (!strcmp(c, "auto")) q->tool_choice = GW_TC_AUTO;
        else if (!strcmp(c, "required")) q->tool_choice = GW_TC_REQUIRED;
        else return bad_value(e, "tool_choice", "expected 'none', 'auto', 'required' or a named function, got '%.40s'.", c);
    } else if (cJSON_IsObject(v)) {
        const cJSON *type = field(v, "type"), *f = flat ? v : field(v, "function"), *name = cJSON_IsObject(f) ? field(f, "name") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
            return bad_value(e, "tool_choice", "a named choice is {\"type\": \"function\", %s}.",
                             flat ? "\"name\": NAME" : "\"function\": {\"name\": NAME}");
        q->tool_choice = GW_TC_NAMED;
        if (dup_str(name->valuestring, &q->tool_choice_name, e)) return CM_ENOMEM;
    } else {
        return bad_type(e, "tool_choice", "a string or an object", v);
    }
    if (q->tool_choice != GW_TC_NONE && q->tool_choice != GW_TC_AUTO && !q->n_tools)
        return bad_value(e, "tool_choice", "'tool_choice' is only allowed when 'tools' are specified.");
    if (q->tool_choice == GW_TC_NAMED) {
        int found = 0;
        for (int i = 0; i < q->n_tools; i++) found |= !strcmp(q->tools[i].name, q->tool_choice_name);
        if (!found) return bad_value(e, "tool_choice", "function '%.64s' is not among the tools.", q->tool_choice_name);
    }
    return 0;
}

/* response_format (chat, completions) or text.format (responses, flat): text | json_object |
 * json_schema; and llama-server's grammar. */
static int parse_format(const cJSON *o, gw_oai_req *q, int kind, gw_oai_err *e) {
    const cJSON *v, *g = field(o, "grammar");
    const char *param = "response_format";
    if (kind == GW_OAI_RESPONSES) {
        const cJSON *t = field(o, "text");
        if (t && !cJSON_IsObject(t)) return bad_type(e, "text", "an object", t);
        const cJSON *k;
        if (t) cJSON_ArrayForEach(k, t) if (strcmp(k->string, "format") && !(strcmp(k->string, "verbosity") == 0 && cJSON_IsNull(k))) {
            gw_oai_err_set(e, 400, "invalid_request_error", "text", "unknown_parameter", "Unrecognized argument supplied: text.%.60s", k->string);
            return CM_EINVAL;
        }
        v = t ? field(t, "format") : NULL;
        param = "text.format";
    } else {
        v = field(o, "response_format");
    }
    if (g) {
        if (!cJSON_IsString(g)) return bad_type(e, "grammar", "a string (GBNF)", g);
        if (v && !(cJSON_IsObject(v) && cJSON_IsString(field(v, "type")) && !strcmp(field(v, "type")->valuestring, "text")))
            return bad_value(e, "grammar", "'grammar' and '%s' cannot be combined.", param);
        q->fmt = GW_FMT_GRAMMAR;
        return dup_str(g->valuestring, &q->grammar, e);
    }
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return bad_type(e, param, "an object", v);
    const cJSON *type = field(v, "type");
    char p[64];
    snprintf(p, sizeof p, "%s.type", param);
    if (!cJSON_IsString(type)) return bad_type(e, p, "a string", type);
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) { q->fmt = GW_FMT_TEXT; return 0; }
    if (!strcmp(t, "json_object")) { q->fmt = GW_FMT_JSON_OBJECT; return 0; }
    if (strcmp(t, "json_schema")) return bad_value(e, p, "expected 'text', 'json_object' or 'json_schema', got '%.40s'.", t);
    q->fmt = GW_FMT_JSON_SCHEMA;
    const cJSON *js = kind == GW_OAI_RESPONSES ? v : field(v, "json_schema");
    snprintf(p, sizeof p, "%s%s", param, kind == GW_OAI_RESPONSES ? "" : ".json_schema");
    if (!cJSON_IsObject(js)) {
        gw_oai_err_set(e, 400, "invalid_request_error", p, "missing_required_parameter", "Missing required parameter: '%s'.", p);
        return CM_EINVAL;
    }
    const cJSON *k;
    cJSON_ArrayForEach(k, js) {
        static const char *const known[] = { "name", "schema", "strict", "description", "type", NULL };
        if (!in_list(known, k->string) || (kind != GW_OAI_RESPONSES && !strcmp(k->string, "type"))) {
            gw_oai_err_set(e, 400, "invalid_request_error", p, "unknown_parameter", "Unrecognized argument supplied: %s.%.60s", p, k->string);
            return CM_EINVAL;
        }
    }
    const cJSON *name = field(js, "name"), *schema = field(js, "schema"), *strict = field(js, "strict");
    if (name && !cJSON_IsString(name)) return bad_type(e, p, "a string name", name);
    if (name && !name_ok(name->valuestring)) return bad_value(e, p, "the name '%.80s' does not match '^[a-zA-Z0-9_-]{1,64}$'.", name->valuestring);
    if (!name && kind != GW_OAI_RESPONSES) {
        snprintf(p, sizeof p, "%s.json_schema.name", param);
        gw_oai_err_set(e, 400, "invalid_request_error", p, "missing_required_parameter", "Missing required parameter: '%s'.", p);
        return CM_EINVAL;
    }
    if (strict && !cJSON_IsBool(strict)) return bad_type(e, p, "a boolean strict", strict);
    q->schema_strict = strict && cJSON_IsTrue(strict);
    if (dup_str(name ? name->valuestring : "", &q->schema_name, e)) return CM_ENOMEM;
    if (schema && !cJSON_IsObject(schema) && !cJSON_IsBool(schema)) return bad_type(e, p, "a JSON schema object", schema);
    /* no schema: any JSON (OpenAI requires one in strict mode) */
    if (!schema) { q->fmt = GW_FMT_JSON_OBJECT; return 0; }
    if (!(q->schema_json = cJSON_PrintUnformatted(schema))) return oom(e);
    return 0;
}

static int parse_kwargs(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    const cJSON *v = field(o, "chat_template_kwargs");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return bad_type(e, "chat_template_kwargs", "an object", v);
    return (q->template_kwargs_json = cJSON_PrintUnformatted(v)) ? 0 : oom(e);
}

/* ---- /v1/responses ------------------------------------------------------------------------- */

/* Text of a responses content: a string, or parts {type: input_text | output_text | text, text}. */
static int resp_text(const cJSON *c, const char *param, char **out, gw_oai_err *e) {
    if (cJSON_IsString(c)) return dup_str(c->valuestring, out, e);
    if (!cJSON_IsArray(c)) return bad_type(e, param, "a string or an array of content parts", c);
    size_t total = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_IsObject(p) ? field(p, "type") : NULL, *text = cJSON_IsObject(p) ? field(p, "text") : NULL;
        if (!cJSON_IsString(type)) return bad_type(e, param, "content parts with a type", p);
        const char *t = type->valuestring;
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "reasoning_text") &&
            strcmp(t, "summary_text")) {
            gw_oai_err_set(e, 400, "invalid_request_error", param, "unsupported_value",
                           "Content parts of type '%.40s' are not supported; only text parts are.", t);
            return CM_EINVAL;
        }
        if (!cJSON_IsString(text)) return bad_type(e, param, "a text part with a string 'text'", text);
        total += strlen(text->valuestring);
    }
    if (!(*out = malloc(total + 1))) return oom(e);
    size_t off = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = field(p, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(*out + off, t, l);
        off += l;
    }
    (*out)[off] = 0;
    return 0;
}

static int parse_input_items(const cJSON *in, gw_oai_req *q, gw_oai_err *e) {
    int n = cJSON_GetArraySize(in), i = 0, err;
    gw_oai_msg *m = q->msgs;
    char *pending_reasoning = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, in) {
        char p[64];
        snprintf(p, sizeof p, "input[%d]", i++);
        if (!cJSON_IsObject(it)) { free(pending_reasoning); return bad_type(e, p, "an input item object", it); }
        const cJSON *type = field(it, "type"), *role = field(it, "role");
        const char *t = cJSON_IsString(type) ? type->valuestring : role ? "message" : "";
        err = 0;
        if (!strcmp(t, "message")) {
            if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant") &&
                                          strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer"))) {
                err = bad_value(e, p, "a message needs a role: user, assistant, system or developer.");
            } else {
                gw_oai_msg *d = &m[q->n_msgs++];
                err = dup_str(role->valuestring, &d->role, e);
                if (!err) err = resp_text(field(it, "content"), p, &d->content, e);
                if (!err && !strcmp(d->role, "assistant") && pending_reasoning) { d->reasoning = pending_reasoning; pending_reasoning = NULL; }
            }
        } else if (!strcmp(t, "function_call")) {
            const cJSON *cid = field(it, "call_id"), *name = field(it, "name"), *args = field(it, "arguments");
            if (!cJSON_IsString(cid) || !cJSON_IsString(name) || !cJSON_IsString(args)) {
                err = bad_value(e, p, "a function_call item needs string call_id, name and arguments.");
            } else {
                /* calls in a row are one assistant turn */
                gw_oai_msg *d = q->n_msgs && !strcmp(m[q->n_msgs - 1].role, "assistant") && m[q->n_msgs - 1].tool_calls ? &m[q->n_msgs - 1] : NULL;
                cJSON *calls = d ? cJSON_Parse(d->tool_calls) : cJSON_CreateArray(), *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
                cJSON_AddStringToObject(c, "id", cid->valuestring);
                cJSON_AddStringToObject(c, "type", "function");
                cJSON_AddStringToObject(f, "name", name->valuestring);
                cJSON_AddStringToObject(f, "arguments", args->valuestring);
                cJSON_AddItemToObject(c, "function", f);
                cJSON_AddItemToArray(calls, c);
                char *txt = cJSON_PrintUnformatted(calls);
                cJSON_Delete(calls);
                if (!txt) err = oom(e);
                else if (d) { free(d->tool_calls); d->tool_calls = txt; }
                else {
                    d = &m[q->n_msgs++];
                    d->tool_calls = txt;
                    err = dup_str("assistant", &d->role, e);
                    if (pending_reasoning) { d->reasoning = pending_reasoning; pending_reasoning = NULL; }
                }
            }
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *cid = field(it, "call_id"), *out = field(it, "output");
            if (!cJSON_IsString(cid) || !out) err = bad_value(e, p, "a function_call_output item needs a string call_id and an output.");
            else {
                gw_oai_msg *d = &m[q->n_msgs++];
                err = dup_str("tool", &d->role, e);
                if (!err) err = dup_str(cid->valuestring, &d->tool_call_id, e);
                if (!err) err = resp_text(out, p, &d->content, e);
            }
        } else if (!strcmp(t, "reasoning")) {
            /* earlier reasoning goes with the assistant turn it preceded */
            const cJSON *c = field(it, "content"), *sum = field(it, "summary");
            char *txt = NULL;
            if (c) err = resp_text(c, p, &txt, e);
            else if (sum) err = resp_text(sum, p, &txt, e);
            if (!err) { free(pending_reasoning); pending_reasoning = txt; }
        } else {
            gw_oai_err_set(e, 400, "invalid_request_error", p, "unsupported_value",
                           "Input items of type '%.40s' are not supported (message, function_call, function_call_output and "
                           "reasoning are; responses are not stored, so item_reference cannot be resolved).", t);
            err = CM_EINVAL;
        }
        if (err) { free(pending_reasoning); return err; }
    }
    (void)n;
    free(pending_reasoning);
    return 0;
}

static int parse_responses(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    int err;
    q->kind = GW_OAI_RESPONSES;
    struct shm_sampling *sp = &q->sp;
    const cJSON *in = field(o, "input"), *ins = field(o, "instructions"), *v;
    if (!in) {
        gw_oai_err_set(e, 400, "invalid_request_error", "input", "missing_required_parameter", "Missing required parameter: 'input'.");
        return CM_EINVAL;
    }
    if (!cJSON_IsString(in) && !cJSON_IsArray(in)) return bad_type(e, "input", "a string or an array of input items", in);
    if (ins && !cJSON_IsString(ins)) return bad_type(e, "instructions", "a string", ins);
    int n_items = cJSON_IsArray(in) ? cJSON_GetArraySize(in) : 1;
    if (!(q->msgs = calloc((size_t)n_items + 1, sizeof *q->msgs))) return oom(e);
    if (ins) {
        if ((err = dup_str(ins->valuestring, &q->instructions, e)) || (err = dup_str("system", &q->msgs[0].role, e)) ||
            (err = dup_str(ins->valuestring, &q->msgs[0].content, e)))
            return err;
        q->n_msgs = 1;
    }
    if (cJSON_IsString(in)) {
        gw_oai_msg *d = &q->msgs[q->n_msgs++];
        if ((err = dup_str("user", &d->role, e)) || (err = dup_str(in->valuestring, &d->content, e))) return err;
    } else if ((err = parse_input_items(in, q, e))) {
        return err;
    }
    if (q->n_msgs == 0) return bad_value(e, "input", "the input is empty.");
    if ((err = parse_tools(o, q, 1, e)) || (err = parse_tool_choice(o, q, 1, e)) || (err = parse_format(o, q, GW_OAI_RESPONSES, e)) ||
        (err = parse_kwargs(o, q, e)))
        return err;
    int mt = -1;
    if ((err = get_int(o, "max_output_tokens", 1, INT32_MAX, &mt, e))) return err;
    sp->max_tokens = (uint32_t)(mt > 0 ? mt : 0);
    if ((err = get_num(o, "temperature", 0, 0, 2, 0, &sp->temperature, e))) return err;
    if ((err = get_num(o, "top_p", 0, 1, 1, 0, &sp->top_p, e))) return err;
    if ((err = get_int(o, "top_k", -1, INT32_MAX, &sp->top_k, e))) return err;
    if (sp->top_k < 0) sp->top_k = 0;
    if ((err = get_num(o, "min_p", 0, 0, 1, 0, &sp->min_p, e))) return err;
    if ((err = get_num(o, "presence_penalty", -2, 0, 2, 0, &sp->presence_penalty, e))) return err;
    if ((err = get_num(o, "frequency_penalty", -2, 0, 2, 0, &sp->frequency_penalty, e))) return err;
    if ((err = get_int(o, "priority", INT32_MIN, INT32_MAX, &q->priority, e))) return err; /* vLLM's: lower first */
    if ((v = field(o, "seed"))) {
        if (!is_integral(v, -9007199254740992.0, 9007199254740992.0)) return bad_type(e, "seed", "an integer", v);
        sp->has_seed = 1;
        sp->seed = (uint64_t)(int64_t)v->valuedouble;
    }
    if ((err = get_bool(o, "stream", &q->stream, e))) return err;
    if ((v = field(o, "truncation")) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
        return bad_value(e, "truncation", "only 'disabled' is supported (a prompt longer than the context is refused).");
    if ((v = field(o, "background")) && !(cJSON_IsBool(v) && !cJSON_IsTrue(v)))
        return bad_value(e, "background", "background responses are not supported.");
    if ((v = field(o, "include")) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return bad_value(e, "include", "no additional output data is supported (the array must be empty).");
    if ((v = field(o, "reasoning"))) {
        const cJSON *k;
        if (!cJSON_IsObject(v)) return bad_type(e, "reasoning", "an object", v);
        cJSON_ArrayForEach(k, v) if (!cJSON_IsNull(k))
            return bad_value(e, "reasoning", "'reasoning.%.40s' is not supported (use chat_template_kwargs, e.g. enable_thinking).", k->string);
    }
    const cJSON *user = field(o, "user");
    if (user && !cJSON_IsString(user)) return bad_type(e, "user", "a string", user);
    if (user && (err = dup_str(user->valuestring, &q->user, e))) return err;
    return 0;
}

/* ---- /v1/embeddings ------------------------------------------------------------------------- */

static int ids_of(const cJSON *a, const char *param, int32_t **out, int *n, gw_oai_err *e) {
    int k = cJSON_GetArraySize(a);
    if (k == 0) return bad_value(e, param, "a token array must not be empty.");
    if (!(*out = malloc(sizeof(int32_t) * (size_t)k))) return oom(e);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, a) {
        if (!is_integral(t, 0, INT32_MAX)) return bad_value(e, param, "token ids must be integers >= 0 (item %d).", i);
        (*out)[i++] = (int32_t)t->valuedouble;
    }
    *n = k;
    return 0;
}

static int parse_embeddings(const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    int err;
    const cJSON *in = field(o, "input"), *v;
    if (!in) {
        gw_oai_err_set(e, 400, "invalid_request_error", "input", "missing_required_parameter", "Missing required parameter: 'input'.");
        return CM_EINVAL;
    }
    int n = 1, ids = 0;
    if (cJSON_IsArray(in)) {
        n = cJSON_GetArraySize(in);
        if (n == 0) return bad_value(e, "input", "the input must not be an empty array.");
        const cJSON *first = cJSON_GetArrayItem(in, 0);
        if (cJSON_IsNumber(first)) { ids = 1; n = 1; }
    } else if (!cJSON_IsString(in)) {
        return bad_type(e, "input", "a string, an array of strings, an array of token ids or an array of them", in);
    }
    if (n > GW_OAI_INPUTS_MAX) return bad_value(e, "input", "at most %d inputs per request, got %d.", GW_OAI_INPUTS_MAX, n);
    if ((v = field(o, "encoding_format"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "float") && strcmp(v->valuestring, "base64")))
            return bad_value(e, "encoding_format", "expected 'float' or 'base64'.");
        q->encoding_base64 = !strcmp(v->valuestring, "base64");
    }
    if ((err = get_int(o, "dimensions", 1, 1 << 20, &q->dimensions, e))) return err;
    const cJSON *user = field(o, "user");
    if (user && !cJSON_IsString(user)) return bad_type(e, "user", "a string", user);
    if (user && (err = dup_str(user->valuestring, &q->user, e))) return err;
    q->inputs = calloc((size_t)n, sizeof *q->inputs);
    q->input_ids = calloc((size_t)n, sizeof *q->input_ids);
    q->n_input_ids = calloc((size_t)n, sizeof *q->n_input_ids);
    if (!q->inputs || !q->input_ids || !q->n_input_ids) return oom(e);
    q->n = n;
    if (cJSON_IsString(in)) {
        if (!in->valuestring[0]) return bad_value(e, "input", "the input must not be empty.");
        return dup_str(in->valuestring, &q->inputs[0], e);
    }
    if (ids) return ids_of(in, "input", &q->input_ids[0], &q->n_input_ids[0], e);
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, in) {
        char p[48];
        snprintf(p, sizeof p, "input[%d]", i);
        if (cJSON_IsString(it)) {
            if (!it->valuestring[0]) return bad_value(e, p, "an input must not be empty.");
            if ((err = dup_str(it->valuestring, &q->inputs[i], e))) return err;
        } else if (cJSON_IsArray(it)) {
            if ((err = ids_of(it, p, &q->input_ids[i], &q->n_input_ids[i], e))) return err;
        } else {
            return bad_type(e, p, "a string or an array of token ids", it);
        }
        i++;
    }
    return 0;
}

static int parse_body(int kind, const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    int err;
    if ((err = check_fields(kind, o, e)) || (err = parse_noops(o, q, e))) return err;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!model || cJSON_IsNull(model)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "model", "missing_required_parameter",
                       "you must provide a model parameter");
        return CM_EINVAL;
    }
    if (!cJSON_IsString(model)) return bad_type(e, "model", "a string", model);
    if ((err = dup_str(model->valuestring, &q->model, e))) return err;
    if (kind == GW_OAI_RESPONSES) return parse_responses(o, q, e);
    if (kind == GW_OAI_EMBEDDINGS) return parse_embeddings(o, q, e);
    if ((err = kind == GW_OAI_CHAT ? parse_messages(o, q, e) : parse_prompt(o, q, e))) return err;
    if (kind == GW_OAI_CHAT && ((err = parse_tools(o, q, 0, e)) || (err = parse_tool_choice(o, q, 0, e)) || (err = parse_kwargs(o, q, e))))
        return err;
    if ((err = parse_format(o, q, kind, e))) return err;

    /* max_tokens; max_completion_tokens (the newer name) wins when both are given */
    struct shm_sampling *sp = &q->sp;
    int mt = -1, mct = -1;
    if ((err = get_int(o, "max_tokens", 1, INT32_MAX, &mt, e))) return err;
    if ((err = get_int(o, "max_completion_tokens", 1, INT32_MAX, &mct, e))) return err;
    sp->max_tokens = (uint32_t)(mct >= 0 ? mct : mt >= 0 ? mt : 0);
    /* vLLM's and llama-server's: at least min_tokens before an end (checked against the
     * max_tokens that applies once the prompt is known: gateway/gen.c) */
    int mint = 0, ieos = 0;
    if ((err = get_int(o, "min_tokens", 0, INT32_MAX, &mint, e))) return err;
    if ((err = get_bool(o, "ignore_eos", &ieos, e))) return err;
    sp->min_tokens = (uint32_t)mint;
    sp->ignore_eos = (uint8_t)ieos;

    if ((err = get_num(o, "temperature", 0, 0, 2, 0, &sp->temperature, e))) return err;
    if ((err = get_num(o, "top_p", 0, 1, 1, 0, &sp->top_p, e))) return err;
    if ((err = get_int(o, "top_k", -1, INT32_MAX, &sp->top_k, e))) return err;
    if (sp->top_k < 0) sp->top_k = 0;
    if ((err = get_num(o, "min_p", 0, 0, 1, 0, &sp->min_p, e))) return err;
    if ((err = get_num(o, "presence_penalty", -2, 0, 2, 0, &sp->presence_penalty, e))) return err;
    if ((err = get_num(o, "frequency_penalty", -2, 0, 2, 0, &sp->frequency_penalty, e))) return err;
    if ((err = get_num(o, "repetition_penalty", 0, 1, 1e9, 0, &sp->repeat_penalty, e))) return err;
    const cJSON *seed = field(o, "seed");
    if (seed) {
        /* doubles hold integers exactly up to 2^53: beyond that the value was already rounded */
        if (!cJSON_IsNumber(seed) || !isfinite(seed->valuedouble) || seed->valuedouble != floor(seed->valuedouble))
            return bad_type(e, "seed", "an integer", seed);
        if (fabs(seed->valuedouble) > 9007199254740992.0)
            return bad_value(e, "seed", "expected an integer of magnitude at most 2^53, but got %.17g instead.", seed->valuedouble);
        sp->has_seed = 1;
        sp->seed = (uint64_t)(int64_t)seed->valuedouble;
    }
    if ((err = parse_stop(o, q, e))) return err;
    if ((err = get_int(o, "n", 1, GW_OAI_N_MAX, &q->n, e))) return err;
    if ((err = get_int(o, "priority", INT32_MIN, INT32_MAX, &q->priority, e))) return err; /* vLLM's: lower first */

    int lp_on = 0, lp_top = 0;
    if (kind == GW_OAI_CHAT) {
        if ((err = get_bool(o, "logprobs", &lp_on, e))) return err;
        if ((err = get_int(o, "top_logprobs", 0, GW_OAI_LOGPROBS_MAX, &lp_top, e))) return err;
        if (field(o, "top_logprobs") && !lp_on)
            return bad_value(e, "top_logprobs", "'logprobs' must be set to true when 'top_logprobs' is used.");
    } else {
        const cJSON *lp = field(o, "logprobs");
        if (lp && cJSON_IsBool(lp)) return bad_type(e, "logprobs", "an integer", lp);
        lp_top = -1;
        if ((err = get_int(o, "logprobs", 0, GW_OAI_LOGPROBS_MAX, &lp_top, e))) return err;
        lp_on = lp_top >= 0; /* logprobs: N asks the token's logprob and N alternatives */
        if (lp_top < 0) lp_top = 0;
        const cJSON *echo = field(o, "echo");
        if (echo && !cJSON_IsBool(echo)) return bad_type(e, "echo", "a boolean", echo);
        if (echo && cJSON_IsTrue(echo)) {
            gw_oai_err_set(e, 400, "invalid_request_error", "echo", "unsupported_value", "'echo' is not supported.");
            return CM_EINVAL;
        }
        const cJSON *suffix = field(o, "suffix");
        if (suffix && (!cJSON_IsString(suffix) || suffix->valuestring[0])) {
            gw_oai_err_set(e, 400, "invalid_request_error", "suffix", "unsupported_value", "'suffix' is not supported.");
            return CM_EINVAL;
        }
        const cJSON *best_of = field(o, "best_of");
        if (best_of && !is_integral(best_of, q->n, q->n)) {
            gw_oai_err_set(e, 400, "invalid_request_error", "best_of", "unsupported_value",
                           "'best_of' other than 'n' is not supported.");
            return CM_EINVAL;
        }
    }
    sp->logprobs = (uint8_t)lp_on;
    sp->top_logprobs = (uint8_t)lp_top;
    if ((err = parse_bias(o, q, e))) return err;
    if ((err = get_bool(o, "stream", &q->stream, e))) return err;
    const cJSON *so = field(o, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return bad_type(e, "stream_options", "an object", so);
        if (!q->stream)
            return bad_value(e, "stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
        if ((err = get_bool(so, "include_usage", &q->include_usage, e))) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return err;
        }
    }
    const cJSON *user = field(o, "user");
    if (user && !cJSON_IsString(user)) return bad_type(e, "user", "a string", user);
    if (user && (err = dup_str(user->valuestring, &q->user, e))) return err;
    return 0;
}

int gw_oai_parse(int kind, const char *body, size_t len, gw_oai_req *q, gw_oai_err *e) {
    memset(q, 0, sizeof *q);
    q->kind = kind;
    shm_sampling_default(&q->sp);
    q->sp.temperature = 1.0f; /* the API's default (the sampler's is greedy) */
    q->n = 1;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, NULL, 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        gw_oai_err_set(e, 400, "invalid_request_error", NULL, NULL,
                       "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
                       "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
                       "valid JSON.)");
        return CM_EINVAL;
    }
    int err = parse_body(kind, root, q, e);
    cJSON_Delete(root);
    if (err) {
        gw_oai_req_free(q);
        return err;
    }
    return 0;
}

void gw_oai_req_free(gw_oai_req *q) {
    free(q->model);
    free(q->prompt);
    free(q->prompt_tokens);
    for (int i = 0; i < q->n_msgs; i++) {
        free(q->msgs[i].role);
        free(q->msgs[i].content);
        free(q->msgs[i].name);
        free(q->msgs[i].tool_call_id);
        free(q->msgs[i].tool_calls); /* cJSON_Print uses malloc (default hooks) */
        free(q->msgs[i].reasoning);
    }
    free(q->msgs);
    free(q->messages_json);
    free(q->tools_json);
    for (int i = 0; i < q->n_tools; i++) {
        free(q->tools[i].name);
        free(q->tools[i].params_json);
    }
    free(q->tools);
    free(q->tool_choice_name);
    free(q->tool_choice_json);
    free(q->template_kwargs_json);
    free(q->schema_json);
    free(q->schema_name);
    free(q->grammar);
    free(q->instructions);
    free(q->metadata_json);
    for (int i = 0; q->inputs && i < q->n; i++) free(q->inputs[i]);
    for (int i = 0; q->input_ids && i < q->n; i++) free(q->input_ids[i]);
    free(q->inputs);
    free(q->input_ids);
    free(q->n_input_ids);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    free(q->logit_bias);
    free(q->user);
    int kind = q->kind;
    memset(q, 0, sizeof *q);
    q->kind = kind;
}

/* ---- building ----------------------------------------------------------------------------- */

const char *gw_finish_name_chat(int finish, int n_calls) {
    return finish == SHM_FINISH_STOP && n_calls > 0 ? "tool_calls" : gw_finish_name(finish);
}

const char *gw_finish_name(int finish) {
    switch (finish) {
    case SHM_FINISH_STOP: return "stop";
    case SHM_FINISH_LENGTH:
    case SHM_FINISH_CONTEXT: return "length";
    default: return NULL;
    }
}

static char *finish_print(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* Strings with explicit lengths (token text may hold NUL or partial UTF-8: invalid bytes become
 * U+FFFD so the JSON stays valid UTF-8). Shared with openai_resp.c. */
cJSON *gw__oai_str(const char *s, size_t len) {
    char stackbuf[256];
    char *buf = len * 3 + 1 <= sizeof stackbuf ? stackbuf : malloc(len * 3 + 1);
    if (!buf) return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + (size_t)n <= len && c != 0;
        for (int k = 1; ok && k < n; k++) ok = ((unsigned char)s[i + (size_t)k] >> 6) == 2;
        if (ok && n == 2 && c < 0xC2) ok = 0;
        if (ok && n == 3) {
            unsigned char c1 = (unsigned char)s[i + 1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) ok = 0;
        }
        if (ok && n == 4) {
            unsigned char c1 = (unsigned char)s[i + 1];
            if ((c == 0xF0 && c1 < 0x90) || c > 0xF4 || (c == 0xF4 && c1 >= 0x90)) ok = 0;
        }
        if (ok) {
            memcpy(buf + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = 0;
    cJSON *j = cJSON_CreateString(buf);
    if (buf != stackbuf) free(buf);
    return j;
}

#define str_n gw__oai_str

static cJSON *bytes_array(const char *s, size_t len) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < len; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

static void add_head(cJSON *root, const gw_oai_meta *m, const char *object) {
    cJSON_AddStringToObject(root, "id", m->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)m->created);
    cJSON_AddStringToObject(root, "model", m->model);
    if (m->fingerprint) cJSON_AddStringToObject(root, "system_fingerprint", m->fingerprint);
    else cJSON_AddNullToObject(root, "system_fingerprint");
}

static cJSON *usage_obj(const gw_oai_usage *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    return o;
}

/* chat: {"content":[{token,logprob,bytes,top_logprobs:[...]}],"refusal":null} */
static cJSON *chat_logprobs(const gw_oai_tok *t, int n) {
    cJSON *o = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; content && i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", str_n(t[i].text, t[i].len));
        cJSON_AddNumberToObject(e, "logprob", t[i].logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_array(t[i].text, t[i].len));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; tops && k < t[i].n_top; k++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "token", str_n(t[i].top[k].text, t[i].top[k].len));
            cJSON_AddNumberToObject(x, "logprob", t[i].top[k].logprob);
            cJSON_AddItemToObject(x, "bytes", bytes_array(t[i].top[k].text, t[i].top[k].len));
            cJSON_AddItemToArray(tops, x);
        }
        cJSON_AddItemToArray(content, e);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* completions: {"tokens":[...],"token_logprobs":[...],"top_logprobs":[{tok:lp}],"text_offset":[...]} */
static cJSON *cmpl_logprobs(const gw_oai_tok *t, int n, size_t *offset) {
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    size_t off = offset ? *offset : 0;
    for (int i = 0; offs && i < n; i++) {
        cJSON_AddItemToArray(toks, str_n(t[i].text, t[i].len));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t[i].logprob));
        cJSON *m = cJSON_CreateObject();
        for (int k = 0; m && k < t[i].n_top; k++) {
            cJSON *key = str_n(t[i].top[k].text, t[i].top[k].len);
            if (key && !cJSON_GetObjectItemCaseSensitive(m, key->valuestring))
                cJSON_AddNumberToObject(m, key->valuestring, t[i].top[k].logprob);
            cJSON_Delete(key);
        }
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += t[i].len;
    }
    if (offset) *offset = off;
    return o;
}

char *gw_oai_response_json(const gw_oai_meta *m, const gw_oai_choice *ch, int n, const gw_oai_usage *u,
                           int want_logprobs) {
    cJSON *root = cJSON_CreateObject();
    int chat = m->kind == GW_OAI_CHAT;
    add_head(root, m, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; choices && i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            /* content is null when the reply is tool calls alone */
            if (ch[i].n_calls && !ch[i].len) cJSON_AddNullToObject(msg, "content");
            else cJSON_AddItemToObject(msg, "content", str_n(ch[i].text, ch[i].len));
            if (ch[i].reasoning) cJSON_AddItemToObject(msg, "reasoning_content", str_n(ch[i].reasoning, ch[i].reasoning_len));
            if (ch[i].n_calls) {
                cJSON *tc = cJSON_AddArrayToObject(msg, "tool_calls");
                for (int k = 0; tc && k < ch[i].n_calls; k++) {
                    cJSON *x = cJSON_CreateObject(), *f = cJSON_CreateObject();
                    cJSON_AddStringToObject(x, "id", ch[i].calls[k].id);
                    cJSON_AddStringToObject(x, "type", "function");
                    cJSON_AddItemToObject(f, "name", str_n(ch[i].calls[k].name, strlen(ch[i].calls[k].name)));
                    cJSON_AddItemToObject(f, "arguments", str_n(ch[i].calls[k].args, ch[i].calls[k].args_len));
                    cJSON_AddItemToObject(x, "function", f);
                    cJSON_AddItemToArray(tc, x);
                }
            }
            cJSON_AddNullToObject(msg, "refusal");
        } else {
            cJSON_AddItemToObject(c, "text", str_n(ch[i].text, ch[i].len));
        }
        if (want_logprobs && ch[i].toks)
            cJSON_AddItemToObject(c, "logprobs", chat ? chat_logprobs(ch[i].toks, ch[i].n_toks)
                                                      : cmpl_logprobs(ch[i].toks, ch[i].n_toks, NULL));
        else cJSON_AddNullToObject(c, "logprobs");
        const char *fr = gw_finish_name_chat(ch[i].finish, ch[i].n_calls);
        if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(root, "usage", usage_obj(u));
    return finish_print(root);
}

/* A chat chunk with delta d (taken) for choice index. */
static char *chat_chunk(const gw_oai_meta *m, int index, cJSON *d) {
    cJSON *root = cJSON_CreateObject();
    add_head(root, m, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddItemToObject(c, "delta", d);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (m->include_usage) cJSON_AddNullToObject(root, "usage");
    return finish_print(root);
}

char *gw_oai_chunk_reasoning_json(const gw_oai_meta *m, int index, const char *text, size_t len) {
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "reasoning_content", str_n(text, len));
    return chat_chunk(m, index, d);
}

char *gw_oai_chunk_call_json(const gw_oai_meta *m, int index, int k, const char *id, const char *name, const char *args,
                             size_t args_len) {
    cJSON *d = cJSON_CreateObject(), *tc = cJSON_AddArrayToObject(d, "tool_calls"), *x = cJSON_CreateObject(),
          *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", k);
    if (id) {
        cJSON_AddStringToObject(x, "id", id);
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddItemToObject(f, "name", str_n(name, strlen(name)));
    }
    cJSON_AddItemToObject(f, "arguments", str_n(args ? args : "", args ? args_len : 0));
    cJSON_AddItemToObject(x, "function", f);
    cJSON_AddItemToArray(tc, x);
    return chat_chunk(m, index, d);
}

char *gw_oai_chunk_json(const gw_oai_meta *m, int index, int role, const char *text, size_t len, int finish,
                        const gw_oai_tok *toks, int n_toks, size_t *text_offset) {
    cJSON *root = cJSON_CreateObject();
    int chat = m->kind == GW_OAI_CHAT;
    add_head(root, m, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) {
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
        } else if (text) {
            cJSON_AddItemToObject(d, "content", str_n(text, len));
        }
    } else {
        cJSON_AddItemToObject(c, "text", text ? str_n(text, len) : cJSON_CreateString(""));
    }
    if (toks) cJSON_AddItemToObject(c, "logprobs", chat ? chat_logprobs(toks, n_toks) : cmpl_logprobs(toks, n_toks, text_offset));
    else cJSON_AddNullToObject(c, "logprobs");
    const char *fr = finish == GW_FINISH_TOOL_CALLS ? "tool_calls" : gw_finish_name(finish);
    if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    if (m->include_usage) cJSON_AddNullToObject(root, "usage");
    return finish_print(root);
}

char *gw_oai_usage_chunk_json(const gw_oai_meta *m, const gw_oai_usage *u) {
    cJSON *root = cJSON_CreateObject();
    add_head(root, m, m->kind == GW_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToObject(root, "usage", usage_obj(u));
    return finish_print(root);
}

char *gw_sse_data(const char *json, size_t *len) {
    size_t n = strlen(json);
    char *s = malloc(n + 9);
    if (!s) return NULL;
    memcpy(s, "data: ", 6);
    memcpy(s + 6, json, n);
    memcpy(s + 6 + n, "\n\n", 3);
    if (len) *len = n + 8;
    return s;
}

/* ---- WebSocket events --------------------------------------------------------------------- */

static cJSON *event(const char *type, const char *event_id) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddStringToObject(o, "event_id", event_id);
    return o;
}

static cJSON *rt_response(const gw_oai_meta *m, const char *status) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", m->id);
    cJSON_AddStringToObject(r, "object", "realtime.response");
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddStringToObject(r, "model", m->model);
    cJSON_AddNumberToObject(r, "created_at", (double)m->created);
    return r;
}

char *gw_rt_created_json(const char *event_id, const gw_oai_meta *m) {
    cJSON *o = event("response.created", event_id);
    cJSON_AddItemToObject(o, "response", rt_response(m, "in_progress"));
    return finish_print(o);
}

char *gw_rt_delta_json(const char *event_id, const char *response_id, int output_index, const char *text, size_t len) {
    cJSON *o = event("response.output_text.delta", event_id);
    cJSON_AddStringToObject(o, "response_id", response_id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    cJSON_AddNumberToObject(o, "content_index", 0);
    cJSON_AddItemToObject(o, "delta", str_n(text, len));
    return finish_print(o);
}

char *gw_rt_done_json(const char *event_id, const gw_oai_meta *m, const char *status, const char *reason,
                      const gw_oai_choice *ch, int n, const gw_oai_usage *u) {
    cJSON *o = event("response.done", event_id);
    cJSON *r = rt_response(m, status);
    if (reason) {
        cJSON *sd = cJSON_AddObjectToObject(r, "status_details");
        cJSON_AddStringToObject(sd, "type", status);
        cJSON_AddStringToObject(sd, "reason", reason);
    } else {
        cJSON_AddNullToObject(r, "status_details");
    }
    cJSON *out = cJSON_AddArrayToObject(r, "output");
    for (int i = 0; out && i < n; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        cJSON_AddStringToObject(c, "type", "text");
        cJSON_AddItemToObject(c, "text", str_n(ch[i].text, ch[i].len));
        const char *fr = gw_finish_name(ch[i].finish);
        if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(out, c);
    }
    cJSON *us = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(us, "input_tokens", u ? u->prompt_tokens : 0);
    cJSON_AddNumberToObject(us, "output_tokens", u ? u->completion_tokens : 0);
    cJSON_AddNumberToObject(us, "total_tokens", u ? (double)u->prompt_tokens + u->completion_tokens : 0);
    cJSON_AddItemToObject(o, "response", r);
    return finish_print(o);
}

char *gw_rt_error_json(const char *event_id, const gw_oai_err *e, const char *client_event_id) {
    cJSON *o = event("error", event_id);
    cJSON *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "type", e->type ? e->type : "invalid_request_error");
    if (e->code[0]) cJSON_AddStringToObject(er, "code", e->code);
    else cJSON_AddNullToObject(er, "code");
    cJSON_AddStringToObject(er, "message", e->message);
    if (e->param[0]) cJSON_AddStringToObject(er, "param", e->param);
    else cJSON_AddNullToObject(er, "param");
    if (client_event_id) cJSON_AddStringToObject(er, "event_id", client_event_id);
    else cJSON_AddNullToObject(er, "event_id");
    return finish_print(o);
}
