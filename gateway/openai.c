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
        if (tc && !(dst->tool_calls = cJSON_PrintUnformatted(tc))) return oom(e);
        if (!dst->content && !dst->tool_calls && strcmp(dst->role, "assistant") != 0) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            gw_oai_err_set(e, 400, "invalid_request_error", param, "missing_required_parameter",
                           "Missing required parameter: '%s'.", param);
            return CM_EINVAL;
        }
        i++;
    }
    if (!(q->messages_json = cJSON_PrintUnformatted(v))) return oom(e);
    const cJSON *tools = field(o, "tools");
    if (tools && !cJSON_IsArray(tools)) return bad_type(e, "tools", "an array", tools);
    if (tools && !(q->tools_json = cJSON_PrintUnformatted(tools))) return oom(e);
    return 0;
}

static int parse_body(int kind, const cJSON *o, gw_oai_req *q, gw_oai_err *e) {
    int err;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!model || cJSON_IsNull(model)) {
        gw_oai_err_set(e, 400, "invalid_request_error", "model", "missing_required_parameter",
                       "you must provide a model parameter");
        return CM_EINVAL;
    }
    if (!cJSON_IsString(model)) return bad_type(e, "model", "a string", model);
    if ((err = dup_str(model->valuestring, &q->model, e))) return err;
    if ((err = kind == GW_OAI_CHAT ? parse_messages(o, q, e) : parse_prompt(o, q, e))) return err;

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
    }
    free(q->msgs);
    free(q->messages_json);
    free(q->tools_json);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    free(q->logit_bias);
    free(q->user);
    int kind = q->kind;
    memset(q, 0, sizeof *q);
    q->kind = kind;
}

/* ---- building ----------------------------------------------------------------------------- */

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
 * U+FFFD so the JSON stays valid UTF-8). */
static cJSON *str_n(const char *s, size_t len) {
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
            cJSON_AddItemToObject(msg, "content", str_n(ch[i].text, ch[i].len));
            cJSON_AddNullToObject(msg, "refusal");
        } else {
            cJSON_AddItemToObject(c, "text", str_n(ch[i].text, ch[i].len));
        }
        if (want_logprobs && ch[i].toks)
            cJSON_AddItemToObject(c, "logprobs", chat ? chat_logprobs(ch[i].toks, ch[i].n_toks)
                                                      : cmpl_logprobs(ch[i].toks, ch[i].n_toks, NULL));
        else cJSON_AddNullToObject(c, "logprobs");
        const char *fr = gw_finish_name(ch[i].finish);
        if (fr) cJSON_AddStringToObject(c, "finish_reason", fr);
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(root, "usage", usage_obj(u));
    return finish_print(root);
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
    const char *fr = gw_finish_name(finish);
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
