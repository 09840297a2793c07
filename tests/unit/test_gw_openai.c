/* test_gw_openai: OpenAI request validation (every parameter, every error body) and the shapes
 * of the responses, streamed chunks and WebSocket events, field by field. */
#include "gateway/openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/cm_err.h"
#include "tests/unit/t.h"

static int parse(int kind, const char *body, gw_oai_req *q, gw_oai_err *e) {
    memset(e, 0, sizeof *e);
    return gw_oai_parse(kind, body, strlen(body), q, e);
}

/* Expects a 400 whose error body names param (NULL: null) and code (NULL: null) and whose
 * message contains needle. */
static void expect_err(int kind, const char *body, const char *param, const char *code, const char *needle, int line) {
    gw_oai_req q;
    gw_oai_err e;
    int r = parse(kind, body, &q, &e);
    T_CHECKF(r == CM_EINVAL, "line %d: parse returned %d for %s", line, r, body);
    if (r == 0) {
        gw_oai_req_free(&q);
        return;
    }
    T_CHECKF(e.status == 400, "line %d: status %d", line, e.status);
    char *js = gw_oai_error_json(&e);
    cJSON *j = cJSON_Parse(js);
    cJSON *err = cJSON_GetObjectItem(j, "error");
    T_CHECKF(cJSON_IsObject(err), "line %d: %s", line, js);
    cJSON *msg = cJSON_GetObjectItem(err, "message"), *type = cJSON_GetObjectItem(err, "type");
    cJSON *p = cJSON_GetObjectItem(err, "param"), *c = cJSON_GetObjectItem(err, "code");
    T_CHECKF(cJSON_IsString(msg) && strstr(msg->valuestring, needle), "line %d: message %s (want '%s')", line, js, needle);
    T_CHECKF(cJSON_IsString(type) && strcmp(type->valuestring, "invalid_request_error") == 0, "line %d: %s", line, js);
    if (param) T_CHECKF(cJSON_IsString(p) && strcmp(p->valuestring, param) == 0, "line %d: param %s (want %s)", line, js, param);
    else T_CHECKF(cJSON_IsNull(p), "line %d: param not null: %s", line, js);
    if (code) T_CHECKF(cJSON_IsString(c) && strcmp(c->valuestring, code) == 0, "line %d: code %s (want %s)", line, js, code);
    else T_CHECKF(cJSON_IsNull(c), "line %d: code not null: %s", line, js);
    T_CHECKF(cJSON_GetArraySize(err) == 4, "line %d: error has %d fields", line, cJSON_GetArraySize(err));
    cJSON_Delete(j);
    free(js);
}
#define ERR_C(body, param, code, needle) expect_err(GW_OAI_COMPLETION, body, param, code, needle, __LINE__)
#define ERR_CH(body, param, code, needle) expect_err(GW_OAI_CHAT, body, param, code, needle, __LINE__)

#define CH(extra) "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" extra "}"
#define CO(extra) "{\"model\":\"m\",\"prompt\":\"hi\"" extra "}"

static void test_defaults(void) {
    gw_oai_req q;
    gw_oai_err e;
    /* no field is silently ignored: an unknown one is a 400 naming it */
    ERR_C(CO(",\"unknown_field\":{\"x\":[1,2]}"), "unknown_field", "unknown_parameter", "Unrecognized request argument supplied: unknown_field");
    ERR_CH(CH(",\"functions\":[]"), "functions", "unknown_parameter", "Unrecognized request argument supplied: functions");
    ERR_CH(CH(",\"echo\":true"), "echo", "unknown_parameter", "Unrecognized request argument supplied: echo");
    T_EQ_INT(parse(GW_OAI_COMPLETION, CO(",\"temperature\":null,\"user\":\"u\",\"service_tier\":\"auto\",\"store\":false,\"metadata\":{\"k\":\"v\"}"), &q, &e), 0);
    gw_oai_req_free(&q);
    ERR_C(CO(",\"metadata\":{\"k\":1}"), "metadata", "invalid_type", "an object of strings");
    T_EQ_INT(parse(GW_OAI_COMPLETION, CO(",\"temperature\":null"), &q, &e), 0);
    T_EQ_STR(q.model, "m");
    T_EQ_STR(q.prompt, "hi");
    T_CHECK(q.prompt_tokens == NULL);
    T_EQ_INT(q.sp.max_tokens, 0); /* not given */
    T_EQ_INT(q.sp.min_tokens, 0);
    T_EQ_INT(q.sp.ignore_eos, 0);
    T_NEAR(q.sp.temperature, 1.0, 0);
    T_NEAR(q.sp.top_p, 1.0, 0);
    T_EQ_INT(q.sp.top_k, 0);
    T_NEAR(q.sp.min_p, 0, 0);
    T_NEAR(q.sp.presence_penalty, 0, 0);
    T_NEAR(q.sp.frequency_penalty, 0, 0);
    T_NEAR(q.sp.repeat_penalty, 1.0, 0);
    T_EQ_INT(q.sp.has_seed, 0);
    T_EQ_INT(q.n_stop, 0);
    T_EQ_INT(q.n, 1);
    T_EQ_INT(q.sp.logprobs, 0);
    T_EQ_INT(q.sp.top_logprobs, 0);
    T_EQ_INT(q.sp.penalty_last_n, 64);
    T_EQ_INT(q.n_logit_bias, 0);
    T_EQ_INT(q.stream, 0);
    T_EQ_INT(q.include_usage, 0);
    T_CHECK(q.user == NULL);
    gw_oai_req_free(&q);

    /* every parameter given */
    const char *full = "{\"model\":\"tiny\",\"prompt\":[[1,2,3]],\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
                       "\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":-1.5,\"frequency_penalty\":2,"
                       "\"repetition_penalty\":1.1,\"seed\":-5,\"stop\":[\"a\",\"\",\"bc\"],\"n\":3,\"logprobs\":5,"
                       "\"logit_bias\":{\"42\":-100,\"7\":3.5},\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"user\":\"u1\",\"echo\":false,\"best_of\":3,\"min_tokens\":2,\"ignore_eos\":true}";
    T_EQ_INT(parse(GW_OAI_COMPLETION, full, &q, &e), 0);
    T_EQ_STR(q.model, "tiny");
    T_CHECK(q.prompt == NULL);
    T_EQ_INT(q.n_prompt_tokens, 3);
    T_EQ_INT(q.prompt_tokens[2], 3);
    T_EQ_INT(q.sp.max_tokens, 7);
    T_EQ_INT(q.sp.min_tokens, 2);
    T_EQ_INT(q.sp.ignore_eos, 1);
    T_NEAR(q.sp.temperature, 0.5, 1e-7);
    T_NEAR(q.sp.top_p, 0.9, 1e-7);
    T_EQ_INT(q.sp.top_k, 40);
    T_NEAR(q.sp.min_p, 0.05, 1e-7);
    T_NEAR(q.sp.presence_penalty, -1.5, 0);
    T_NEAR(q.sp.frequency_penalty, 2, 0);
    T_NEAR(q.sp.repeat_penalty, 1.1, 1e-6);
    T_EQ_INT(q.sp.has_seed, 1);
    T_CHECK(q.sp.seed == (uint64_t)(int64_t)-5);
    T_EQ_INT(q.n_stop, 2); /* the empty stop string is dropped */
    T_EQ_STR(q.stop[1], "bc");
    T_EQ_INT(q.n, 3);
    T_EQ_INT(q.sp.logprobs, 1);
    T_EQ_INT(q.sp.top_logprobs, 5);
    T_EQ_INT(q.n_logit_bias, 2);
    T_EQ_INT(q.logit_bias[0].token, 42);
    T_NEAR(q.logit_bias[0].bias, -100, 0);
    T_EQ_INT(q.logit_bias[1].token, 7);
    T_NEAR(q.logit_bias[1].bias, 3.5, 0);
    T_EQ_INT(q.stream, 1);
    T_EQ_INT(q.include_usage, 1);
    T_EQ_STR(q.user, "u1");
    gw_oai_req_free(&q);

    /* prompt forms */
    T_EQ_INT(parse(GW_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"one\"]}", &q, &e), 0);
    T_EQ_STR(q.prompt, "one");
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":[5,6]}", &q, &e), 0);
    T_EQ_INT(q.n_prompt_tokens, 2);
    T_EQ_INT(q.prompt_tokens[0], 5);
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_COMPLETION, "{\"model\":\"m\",\"prompt\":\"\"}", &q, &e), 0);
    T_EQ_STR(q.prompt, "");
    gw_oai_req_free(&q);
    /* stop as a single string; top_k -1 means off; max_completion_tokens wins */
    T_EQ_INT(parse(GW_OAI_COMPLETION, CO(",\"stop\":\"\\n\",\"top_k\":-1,\"max_tokens\":5,\"max_completion_tokens\":9"), &q, &e), 0);
    T_EQ_INT(q.n_stop, 1);
    T_EQ_STR(q.stop[0], "\n");
    T_EQ_INT(q.sp.top_k, 0);
    T_EQ_INT(q.sp.max_tokens, 9);
    gw_oai_req_free(&q);

    /* chat: messages, parts, names, tool calls */
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be nice\"},"
                       "{\"role\":\"user\",\"name\":\"bob\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},{\"type\":\"text\",\"text\":\"lo\"}]},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
                       "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"logprobs\":true,\"top_logprobs\":3}";
    T_EQ_INT(parse(GW_OAI_CHAT, chat, &q, &e), 0);
    T_EQ_INT(q.n_msgs, 4);
    T_EQ_STR(q.msgs[0].role, "system");
    T_EQ_STR(q.msgs[0].content, "be nice");
    T_EQ_STR(q.msgs[1].content, "Hello");
    T_EQ_STR(q.msgs[1].name, "bob");
    T_CHECK(q.msgs[2].content == NULL);
    T_CHECK(q.msgs[2].tool_calls && strstr(q.msgs[2].tool_calls, "\"arguments\":\"{}\""));
    T_EQ_STR(q.msgs[3].tool_call_id, "c1");
    T_CHECK(q.messages_json && q.messages_json[0] == '[');
    T_CHECK(q.tools_json && strstr(q.tools_json, "\"name\":\"f\""));
    T_EQ_INT(q.sp.logprobs, 1);
    T_EQ_INT(q.sp.top_logprobs, 3);
    gw_oai_req_free(&q);
}

static void test_errors(void) {
    /* body */
    ERR_C("not json", NULL, NULL, "We could not parse the JSON body");
    ERR_C("[1,2]", NULL, NULL, "We could not parse the JSON body");
    ERR_C("{\"model\":\"m\",\"prompt\":\"x\"", NULL, NULL, "We could not parse");
    /* model */
    ERR_C("{\"prompt\":\"x\"}", "model", "missing_required_parameter", "you must provide a model parameter");
    ERR_C("{\"model\":3,\"prompt\":\"x\"}", "model", "invalid_type", "expected a string, but got a number");
    /* prompt */
    ERR_C("{\"model\":\"m\"}", "prompt", "missing_required_parameter", "'prompt'");
    ERR_C("{\"model\":\"m\",\"prompt\":7}", "prompt", "invalid_type", "Invalid type for 'prompt'");
    ERR_C("{\"model\":\"m\",\"prompt\":[]}", "prompt", "invalid_value", "empty array");
    ERR_C("{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt", "unsupported_value", "Batched prompts");
    ERR_C("{\"model\":\"m\",\"prompt\":[[1],[2]]}", "prompt", "unsupported_value", "Batched prompts");
    ERR_C("{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt", "invalid_value", "token ids");
    ERR_C("{\"model\":\"m\",\"prompt\":[1,2.5]}", "prompt", "invalid_value", "token ids");
    ERR_C("{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt", "invalid_value", "token ids");
    ERR_C("{\"model\":\"m\",\"prompt\":[[]]}", "prompt", "invalid_value", "must not be empty");
    ERR_C("{\"model\":\"m\",\"prompt\":[{}]}", "prompt", "invalid_type", "Invalid type");
    /* max_tokens / max_completion_tokens */
    ERR_C(CO(",\"max_tokens\":0"), "max_tokens", "invalid_value", "between 1 and");
    ERR_C(CO(",\"max_tokens\":-3"), "max_tokens", "invalid_value", "but got -3");
    ERR_C(CO(",\"max_tokens\":1.5"), "max_tokens", "invalid_type", "an integer");
    ERR_C(CO(",\"max_tokens\":\"9\""), "max_tokens", "invalid_type", "got a string");
    ERR_C(CO(",\"max_tokens\":1e300"), "max_tokens", "invalid_value", "between 1 and");
    ERR_CH(CH(",\"max_completion_tokens\":0"), "max_completion_tokens", "invalid_value", "between 1 and");
    /* temperature 0..2 */
    ERR_C(CO(",\"temperature\":2.5"), "temperature", "invalid_value", "<= 2");
    ERR_C(CO(",\"temperature\":-0.1"), "temperature", "invalid_value", ">= 0");
    ERR_C(CO(",\"temperature\":\"hot\""), "temperature", "invalid_type", "expected a number, but got a string");
    ERR_C(CO(",\"temperature\":true"), "temperature", "invalid_type", "got a boolean");
    /* top_p (0,1] */
    ERR_C(CO(",\"top_p\":0"), "top_p", "invalid_value", "> 0");
    ERR_C(CO(",\"top_p\":1.01"), "top_p", "invalid_value", "<= 1");
    ERR_C(CO(",\"top_p\":[1]"), "top_p", "invalid_type", "got an array");
    /* top_k, min_p */
    ERR_C(CO(",\"top_k\":-2"), "top_k", "invalid_value", "between -1 and");
    ERR_C(CO(",\"top_k\":2.5"), "top_k", "invalid_type", "an integer");
    ERR_C(CO(",\"min_p\":1.5"), "min_p", "invalid_value", "<= 1");
    ERR_C(CO(",\"min_p\":-0.5"), "min_p", "invalid_value", ">= 0");
    /* penalties */
    ERR_C(CO(",\"presence_penalty\":2.01"), "presence_penalty", "invalid_value", "<= 2");
    ERR_C(CO(",\"presence_penalty\":-3"), "presence_penalty", "invalid_value", ">= -2");
    ERR_C(CO(",\"frequency_penalty\":-2.5"), "frequency_penalty", "invalid_value", ">= -2");
    ERR_C(CO(",\"frequency_penalty\":{}"), "frequency_penalty", "invalid_type", "got an object");
    ERR_C(CO(",\"repetition_penalty\":0"), "repetition_penalty", "invalid_value", "> 0");
    ERR_C(CO(",\"repetition_penalty\":-1"), "repetition_penalty", "invalid_value", "> 0");
    ERR_C(CO(",\"min_tokens\":-1"), "min_tokens", "invalid_value", "between 0 and");
    ERR_C(CO(",\"min_tokens\":1.5"), "min_tokens", "invalid_type", "an integer");
    ERR_C(CO(",\"ignore_eos\":1"), "ignore_eos", "invalid_type", "a boolean");
    /* seed */
    ERR_C(CO(",\"seed\":1.5"), "seed", "invalid_type", "an integer");
    ERR_C(CO(",\"seed\":\"1\""), "seed", "invalid_type", "an integer");
    ERR_C(CO(",\"seed\":1e300"), "seed", "invalid_value", "2^53");
    /* stop */
    ERR_C(CO(",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), "stop", "invalid_value", "maximum length 4");
    ERR_C(CO(",\"stop\":5"), "stop", "invalid_type", "a string or an array of strings");
    ERR_C(CO(",\"stop\":[\"a\",5]"), "stop", "invalid_type", "expected a string, but got a number");
    {
        char body[1024], longs[300];
        memset(longs, 'x', 299);
        longs[299] = 0;
        snprintf(body, sizeof body, CO(",\"stop\":\"%s\""), longs);
        ERR_C(body, "stop", "invalid_value", "at most 256 bytes");
    }
    /* n */
    ERR_C(CO(",\"n\":0"), "n", "invalid_value", "between 1 and 16");
    ERR_C(CO(",\"n\":17"), "n", "invalid_value", "between 1 and 16");
    ERR_C(CO(",\"n\":\"2\""), "n", "invalid_type", "an integer");
    /* logprobs: int 0..20 for completions, bool for chat; top_logprobs 0..20 with logprobs */
    ERR_C(CO(",\"logprobs\":21"), "logprobs", "invalid_value", "between 0 and 20");
    ERR_C(CO(",\"logprobs\":-1"), "logprobs", "invalid_value", "between 0 and 20");
    ERR_C(CO(",\"logprobs\":true"), "logprobs", "invalid_type", "an integer");
    ERR_CH(CH(",\"logprobs\":1"), "logprobs", "invalid_type", "a boolean");
    ERR_CH(CH(",\"logprobs\":true,\"top_logprobs\":21"), "top_logprobs", "invalid_value", "between 0 and 20");
    ERR_CH(CH(",\"top_logprobs\":2"), "top_logprobs", "invalid_value", "'logprobs' must be set to true");
    ERR_CH(CH(",\"logprobs\":false,\"top_logprobs\":2"), "top_logprobs", "invalid_value", "'logprobs' must be set to true");
    /* logit_bias */
    ERR_C(CO(",\"logit_bias\":[1]"), "logit_bias", "invalid_type", "an object");
    ERR_C(CO(",\"logit_bias\":{\"x\":1}"), "logit_bias", "invalid_value", "token ids");
    ERR_C(CO(",\"logit_bias\":{\"-1\":1}"), "logit_bias", "invalid_value", "token ids");
    ERR_C(CO(",\"logit_bias\":{\"12a\":1}"), "logit_bias", "invalid_value", "token ids");
    ERR_C(CO(",\"logit_bias\":{\"99999999999\":1}"), "logit_bias", "invalid_value", "token ids");
    ERR_C(CO(",\"logit_bias\":{\"5\":101}"), "logit_bias", "invalid_value", "between -100 and 100");
    ERR_C(CO(",\"logit_bias\":{\"5\":-100.5}"), "logit_bias", "invalid_value", "between -100 and 100");
    ERR_C(CO(",\"logit_bias\":{\"5\":\"1\"}"), "logit_bias", "invalid_type", "a number");
    /* stream, stream_options */
    ERR_C(CO(",\"stream\":\"yes\""), "stream", "invalid_type", "a boolean");
    ERR_C(CO(",\"stream_options\":{\"include_usage\":true}"), "stream_options", "invalid_value", "only allowed when 'stream' is enabled");
    ERR_C(CO(",\"stream\":true,\"stream_options\":3"), "stream_options", "invalid_type", "an object");
    ERR_C(CO(",\"stream\":true,\"stream_options\":{\"include_usage\":1}"), "stream_options.include_usage", "invalid_type", "a boolean");
    /* user; unsupported completions features */
    ERR_C(CO(",\"user\":5"), "user", "invalid_type", "a string");
    ERR_C(CO(",\"echo\":true"), "echo", "unsupported_value", "not supported");
    ERR_C(CO(",\"suffix\":\"x\""), "suffix", "unsupported_value", "not supported");
    ERR_C(CO(",\"best_of\":2"), "best_of", "unsupported_value", "not supported");
    /* messages */
    ERR_CH("{\"model\":\"m\"}", "messages", "missing_required_parameter", "'messages'");
    ERR_CH("{\"model\":\"m\",\"messages\":{}}", "messages", "invalid_type", "an array");
    ERR_CH("{\"model\":\"m\",\"messages\":[]}", "messages", "invalid_value", "empty array");
    ERR_CH("{\"model\":\"m\",\"messages\":[5]}", "messages[0]", "invalid_type", "an object");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "missing_required_parameter", "messages[0].role");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"robot\",\"content\":\"x\"}]}", "messages[1].role",
           "invalid_value", "robot");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "missing_required_parameter", "messages[0].content");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "invalid_type", "content parts");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
           "messages[0].content", "unsupported_value", "'image_url'");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages[0].content", "invalid_type",
           "Invalid type");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":1}]}", "messages[0].name", "invalid_type", "a string");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":{}}]}", "messages[0].tool_calls",
           "invalid_type", "an array");
    ERR_CH(CH(",\"tools\":{}"), "tools", "invalid_type", "an array");
}

static void test_context_error(void) {
    gw_oai_err e;
    gw_oai_err_context(&e, GW_OAI_CHAT, 2048, 2000, 100);
    T_EQ_INT(e.status, 400);
    T_EQ_STR(e.message, "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the "
                        "messages, 100 in the completion). Please reduce the length of the messages or completion.");
    char *js = gw_oai_error_json(&e);
    cJSON *j = cJSON_Parse(js), *err = cJSON_GetObjectItem(j, "error");
    T_EQ_STR(cJSON_GetObjectItem(err, "code")->valuestring, "context_length_exceeded");
    T_EQ_STR(cJSON_GetObjectItem(err, "param")->valuestring, "messages");
    T_EQ_STR(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error");
    cJSON_Delete(j);
    free(js);
    gw_oai_err_context(&e, GW_OAI_COMPLETION, 512, 500, 20);
    T_CHECK(strstr(e.message, "maximum context length is 512 tokens") && strstr(e.message, "520 tokens"));
    T_EQ_STR(e.param, "prompt");
}

static cJSON *J(char *s) {
    cJSON *j = cJSON_Parse(s);
    T_CHECKF(j != NULL, "not JSON: %s", s);
    free(s);
    return j;
}

static const char *S(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "(not a string)";
}

static void test_responses(void) {
    gw_oai_meta m = {.kind = GW_OAI_CHAT, .id = "chatcmpl-abc", .created = 1700000000, .model = "tiny", .fingerprint = "fp_x"};
    gw_oai_top tops[2] = {{"Hi", 2, -0.1f}, {"Hey", 3, -2.5f}};
    gw_oai_tok toks[2] = {{"Hi", 2, -0.1f, 2, tops}, {"\xC3", 1, -0.5f, 0, NULL}};
    gw_oai_choice ch[2] = {{"Hi there", 8, SHM_FINISH_STOP, toks, 2}, {"Yo", 2, SHM_FINISH_LENGTH, NULL, 0}};
    gw_oai_usage u = {.prompt_tokens = 5, .completion_tokens = 3};

    cJSON *j = J(gw_oai_response_json(&m, ch, 2, &u, 1));
    T_EQ_STR(S(j, "id"), "chatcmpl-abc");
    T_EQ_STR(S(j, "object"), "chat.completion");
    T_NEAR(cJSON_GetObjectItem(j, "created")->valuedouble, 1700000000, 0);
    T_EQ_STR(S(j, "model"), "tiny");
    T_EQ_STR(S(j, "system_fingerprint"), "fp_x");
    cJSON *choices = cJSON_GetObjectItem(j, "choices");
    T_EQ_INT(cJSON_GetArraySize(choices), 2);
    cJSON *c0 = cJSON_GetArrayItem(choices, 0);
    T_NEAR(cJSON_GetObjectItem(c0, "index")->valuedouble, 0, 0);
    cJSON *msg = cJSON_GetObjectItem(c0, "message");
    T_EQ_STR(S(msg, "role"), "assistant");
    T_EQ_STR(S(msg, "content"), "Hi there");
    T_EQ_STR(S(c0, "finish_reason"), "stop");
    cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
    cJSON *content = cJSON_GetObjectItem(lp, "content");
    T_EQ_INT(cJSON_GetArraySize(content), 2);
    cJSON *t0 = cJSON_GetArrayItem(content, 0);
    T_EQ_STR(S(t0, "token"), "Hi");
    T_NEAR(cJSON_GetObjectItem(t0, "logprob")->valuedouble, -0.1, 1e-6);
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(t0, "bytes")), 2);
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(t0, "bytes"), 0)->valuedouble, 'H', 0);
    cJSON *tl = cJSON_GetObjectItem(t0, "top_logprobs");
    T_EQ_INT(cJSON_GetArraySize(tl), 2);
    T_EQ_STR(S(cJSON_GetArrayItem(tl, 1), "token"), "Hey");
    cJSON *t1 = cJSON_GetArrayItem(content, 1);
    T_EQ_STR(S(t1, "token"), "\xEF\xBF\xBD"); /* a partial UTF-8 byte is shown as U+FFFD, its byte kept */
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "bytes"), 0)->valuedouble, 0xC3, 0);
    cJSON *c1 = cJSON_GetArrayItem(choices, 1);
    T_EQ_STR(S(c1, "finish_reason"), "length");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(c1, "logprobs")));
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    T_NEAR(cJSON_GetObjectItem(us, "prompt_tokens")->valuedouble, 5, 0);
    T_NEAR(cJSON_GetObjectItem(us, "completion_tokens")->valuedouble, 3, 0);
    T_NEAR(cJSON_GetObjectItem(us, "total_tokens")->valuedouble, 8, 0);
    cJSON_Delete(j);

    /* completions, with logprobs in the legacy layout */
    m.kind = GW_OAI_COMPLETION;
    m.id = "cmpl-xyz";
    m.fingerprint = NULL;
    j = J(gw_oai_response_json(&m, ch, 1, &u, 1));
    T_EQ_STR(S(j, "object"), "text_completion");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "system_fingerprint")));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    T_EQ_STR(S(c0, "text"), "Hi there");
    T_CHECK(cJSON_GetObjectItem(c0, "message") == NULL);
    lp = cJSON_GetObjectItem(c0, "logprobs");
    T_EQ_STR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 0)->valuestring, "Hi");
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble, -0.5, 1e-6);
    T_NEAR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0), "Hey")->valuedouble, -2.5, 1e-6);
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valuedouble, 2, 0);
    cJSON_Delete(j);

    /* chat chunks: role chunk, content chunk, finish chunk, usage chunk */
    m.kind = GW_OAI_CHAT;
    m.id = "chatcmpl-s";
    m.fingerprint = "fp_x";
    m.include_usage = 1;
    j = J(gw_oai_chunk_json(&m, 0, 1, NULL, 0, SHM_FINISH_NONE, NULL, 0, NULL));
    T_EQ_STR(S(j, "object"), "chat.completion.chunk");
    T_EQ_STR(S(j, "id"), "chatcmpl-s");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *d = cJSON_GetObjectItem(c0, "delta");
    T_EQ_STR(S(d, "role"), "assistant");
    T_EQ_STR(S(d, "content"), "");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs")));
    cJSON_Delete(j);
    j = J(gw_oai_chunk_json(&m, 1, 0, "tok\"en\n", 7, SHM_FINISH_NONE, toks, 1, NULL));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    T_NEAR(cJSON_GetObjectItem(c0, "index")->valuedouble, 1, 0);
    d = cJSON_GetObjectItem(c0, "delta");
    T_EQ_STR(S(d, "content"), "tok\"en\n");
    T_CHECK(cJSON_GetObjectItem(d, "role") == NULL);
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content")), 1);
    cJSON_Delete(j);
    j = J(gw_oai_chunk_json(&m, 0, 0, NULL, 0, SHM_FINISH_LENGTH, NULL, 0, NULL));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    d = cJSON_GetObjectItem(c0, "delta");
    T_CHECK(cJSON_IsObject(d) && cJSON_GetArraySize(d) == 0);
    T_EQ_STR(S(c0, "finish_reason"), "length");
    cJSON_Delete(j);
    j = J(gw_oai_usage_chunk_json(&m, &u));
    T_EQ_STR(S(j, "id"), "chatcmpl-s");
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    T_CHECK(cJSON_IsArray(cJSON_GetObjectItem(j, "choices")));
    T_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valuedouble, 8, 0);
    cJSON_Delete(j);
    /* without include_usage there is no usage key on chunks */
    m.include_usage = 0;
    j = J(gw_oai_chunk_json(&m, 0, 0, "x", 1, SHM_FINISH_NONE, NULL, 0, NULL));
    T_CHECK(cJSON_GetObjectItem(j, "usage") == NULL);
    cJSON_Delete(j);

    /* completion chunks: text and finish_reason on the same choice object */
    m.kind = GW_OAI_COMPLETION;
    size_t off = 10;
    j = J(gw_oai_chunk_json(&m, 0, 0, "abc", 3, SHM_FINISH_NONE, toks, 2, &off));
    T_EQ_STR(S(j, "object"), "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    T_EQ_STR(S(c0, "text"), "abc");
    T_NEAR(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "text_offset"), 1)->valuedouble, 12, 0);
    T_EQ_INT(off, 13);
    cJSON_Delete(j);
    j = J(gw_oai_chunk_json(&m, 0, 0, NULL, 0, SHM_FINISH_STOP, NULL, 0, NULL));
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    T_EQ_STR(S(c0, "text"), "");
    T_EQ_STR(S(c0, "finish_reason"), "stop");
    cJSON_Delete(j);

    /* SSE framing */
    size_t n;
    char *sse = gw_sse_data("{\"a\":1}", &n);
    T_EQ_STR(sse, "data: {\"a\":1}\n\n");
    T_EQ_INT(n, strlen(sse));
    free(sse);
    T_EQ_STR(GW_SSE_DONE, "data: [DONE]\n\n");

    /* error JSON with nulls */
    gw_oai_err e;
    gw_oai_err_set(&e, 500, "server_error", NULL, NULL, "boom %d", 1);
    j = J(gw_oai_error_json(&e));
    cJSON *er = cJSON_GetObjectItem(j, "error");
    T_EQ_STR(S(er, "message"), "boom 1");
    T_EQ_STR(S(er, "type"), "server_error");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(er, "param")));
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(er, "code")));
    cJSON_Delete(j);

    /* ids */
    char id1[GW_OAI_ID_LEN], id2[GW_OAI_ID_LEN];
    gw_oai_make_id(id1, sizeof id1, "chatcmpl-");
    gw_oai_make_id(id2, sizeof id2, "chatcmpl-");
    T_EQ_INT(strlen(id1), 9 + 24);
    T_CHECK(strncmp(id1, "chatcmpl-", 9) == 0 && strcmp(id1, id2) != 0);

    /* Realtime events */
    m.kind = GW_OAI_CHAT;
    m.id = "resp_1";
    j = J(gw_rt_created_json("event_1", &m));
    T_EQ_STR(S(j, "type"), "response.created");
    T_EQ_STR(S(j, "event_id"), "event_1");
    T_EQ_STR(S(cJSON_GetObjectItem(j, "response"), "id"), "resp_1");
    T_EQ_STR(S(cJSON_GetObjectItem(j, "response"), "status"), "in_progress");
    T_EQ_STR(S(cJSON_GetObjectItem(j, "response"), "object"), "realtime.response");
    cJSON_Delete(j);
    j = J(gw_rt_delta_json("event_2", "resp_1", 1, "hey", 3));
    T_EQ_STR(S(j, "type"), "response.output_text.delta");
    T_EQ_STR(S(j, "response_id"), "resp_1");
    T_NEAR(cJSON_GetObjectItem(j, "output_index")->valuedouble, 1, 0);
    T_NEAR(cJSON_GetObjectItem(j, "content_index")->valuedouble, 0, 0);
    T_EQ_STR(S(j, "delta"), "hey");
    cJSON_Delete(j);
    j = J(gw_rt_done_json("event_3", &m, "cancelled", "client_cancelled", ch, 2, &u));
    T_EQ_STR(S(j, "type"), "response.done");
    cJSON *r = cJSON_GetObjectItem(j, "response");
    T_EQ_STR(S(r, "status"), "cancelled");
    T_EQ_STR(S(cJSON_GetObjectItem(r, "status_details"), "reason"), "client_cancelled");
    T_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(r, "output")), 2);
    T_EQ_STR(S(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "output"), 1), "text"), "Yo");
    T_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "input_tokens")->valuedouble, 5, 0);
    T_NEAR(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "output_tokens")->valuedouble, 3, 0);
    cJSON_Delete(j);
    gw_oai_err_set(&e, 400, "invalid_request_error", "response.temperature", "invalid_value", "bad");
    j = J(gw_rt_error_json("event_4", &e, "client_ev"));
    T_EQ_STR(S(j, "type"), "error");
    er = cJSON_GetObjectItem(j, "error");
    T_EQ_STR(S(er, "type"), "invalid_request_error");
    T_EQ_STR(S(er, "code"), "invalid_value");
    T_EQ_STR(S(er, "param"), "response.temperature");
    T_EQ_STR(S(er, "event_id"), "client_ev");
    cJSON_Delete(j);
}

#define ERR_K(kind, body, param, code, needle) expect_err(kind, body, param, code, needle, __LINE__)
#define TOOLS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_w\",\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":\"b\"}}]"

static void test_structured_parse(void) {
    gw_oai_req q;
    gw_oai_err e;
    /* response_format */
    T_EQ_INT(parse(GW_OAI_CHAT, CH(",\"response_format\":{\"type\":\"json_object\"}"), &q, &e), 0);
    T_EQ_INT(q.fmt, GW_FMT_JSON_OBJECT);
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_CHAT, CH(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}"), &q, &e), 0);
    T_CHECK(q.fmt == GW_FMT_JSON_SCHEMA && q.schema_strict && !strcmp(q.schema_name, "p") && !strcmp(q.schema_json, "{\"type\":\"object\"}"));
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_COMPLETION, CO(",\"grammar\":\"root ::= \\\"a\\\"\""), &q, &e), 0);
    T_CHECK(q.fmt == GW_FMT_GRAMMAR && !strcmp(q.grammar, "root ::= \"a\""));
    gw_oai_req_free(&q);
    ERR_CH(CH(",\"response_format\":{\"type\":\"xml\"}"), "response_format.type", "invalid_value", "expected 'text', 'json_object' or 'json_schema'");
    ERR_CH(CH(",\"response_format\":{\"type\":\"json_schema\"}"), "response_format.json_schema", "missing_required_parameter", "Missing");
    ERR_CH(CH(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}"), "response_format.json_schema.name", "missing_required_parameter", "Missing");
    ERR_CH(CH(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schemas\":{}}}"), "response_format.json_schema", "unknown_parameter", "schemas");
    ERR_CH(CH(",\"grammar\":\"root ::= x\",\"response_format\":{\"type\":\"json_object\"}"), "grammar", "invalid_value", "cannot be combined");
    /* tools and tool_choice */
    T_EQ_INT(parse(GW_OAI_CHAT, CH(TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}},\"parallel_tool_calls\":false"), &q, &e), 0);
    T_CHECK(q.n_tools == 2 && !strcmp(q.tools[0].name, "get_w") && q.tools[0].params_json && !q.tools[1].params_json);
    T_CHECK(q.tool_choice == GW_TC_NAMED && !strcmp(q.tool_choice_name, "b") && !q.parallel_tool_calls && q.tool_choice_json);
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_CHAT, CH(TOOLS ",\"tool_choice\":\"required\""), &q, &e), 0);
    T_CHECK(q.tool_choice == GW_TC_REQUIRED && q.parallel_tool_calls);
    gw_oai_req_free(&q);
    ERR_CH(CH(TOOLS ",\"tool_choice\":\"bogus\""), "tool_choice", "invalid_value", "expected 'none', 'auto', 'required'");
    ERR_CH(CH(",\"tool_choice\":\"required\""), "tool_choice", "invalid_value", "only allowed when 'tools' are specified");
    ERR_CH(CH(TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"zz\"}}"), "tool_choice", "invalid_value", "'zz' is not among the tools");
    ERR_CH(CH(",\"tools\":[{\"type\":\"code_interpreter\"}]"), "tools[0]", "unsupported_value", "Only tools of type 'function'");
    ERR_CH(CH(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]"), "tools[0].function.name", "invalid_value", "does not match");
    ERR_CH(CH(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":{\"name\":\"a\"}}]"), "tools[1].function.name", "invalid_value", "duplicate");
    ERR_CH(CH(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"params\":{}}}]"), "tools[0].params", "unknown_parameter", "params");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].tool_call_id", "missing_required_parameter", "Missing");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}",
           "messages[0].tool_calls[0]", "invalid_type", "arguments as a JSON string");
    ERR_CH("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"audio\":1}]}", "messages[0].audio", "unknown_parameter", "audio");
    T_EQ_INT(parse(GW_OAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"r\",\"refusal\":null}],\"chat_template_kwargs\":{\"enable_thinking\":false}}", &q, &e), 0);
    T_CHECK(!strcmp(q.msgs[0].reasoning, "r") && q.template_kwargs_json && strstr(q.template_kwargs_json, "enable_thinking"));
    gw_oai_req_free(&q);
    ERR_CH(CH(",\"chat_template_kwargs\":[]"), "chat_template_kwargs", "invalid_type", "an object");

    /* responses: input items, instructions, flat tools, text.format */
    const char *rq = "{\"model\":\"m\",\"instructions\":\"sys\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]},"
                     "{\"type\":\"reasoning\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"think\"}]},"
                     "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
                     "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
                     "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"}],"
                     "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
                     "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\",\"schema\":{\"type\":\"object\"},\"strict\":true}},\"max_output_tokens\":50,\"store\":false}";
    T_EQ_INT(parse(GW_OAI_RESPONSES, rq, &q, &e), 0);
    T_EQ_INT(q.n_msgs, 4);
    T_CHECK(!strcmp(q.msgs[0].role, "system") && !strcmp(q.msgs[0].content, "sys") && !strcmp(q.msgs[1].content, "hi"));
    T_CHECK(!strcmp(q.msgs[2].role, "assistant") && q.msgs[2].tool_calls && strstr(q.msgs[2].tool_calls, "\"c2\"") && !strcmp(q.msgs[2].reasoning, "think"));
    T_CHECK(!strcmp(q.msgs[3].role, "tool") && !strcmp(q.msgs[3].tool_call_id, "c1") && !strcmp(q.msgs[3].content, "42"));
    T_CHECK(q.n_tools == 1 && q.tool_choice == GW_TC_NAMED && q.fmt == GW_FMT_JSON_SCHEMA && q.sp.max_tokens == 50 && !q.store);
    T_CHECK(q.tools_json && strstr(q.tools_json, "\"function\":{\"name\":\"f\""));
    gw_oai_req_free(&q);
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":\"r\"}", "previous_response_id", "unknown_parameter", "previous_response_id");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0]", "unsupported_value", "item_reference");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\"}", "input", "missing_required_parameter", "input");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"truncation\":\"auto\"}", "truncation", "invalid_value", "disabled");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"include\":[\"reasoning.encrypted_content\"]}", "include", "invalid_value", "must be empty");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"reasoning\":{\"effort\":\"high\"}}", "reasoning", "invalid_value", "reasoning.effort");
    ERR_K(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\"}]}]}", "input[0]", "unsupported_value", "input_image");

    /* embeddings */
    T_EQ_INT(parse(GW_OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":[\"a\",[1,2,3]],\"encoding_format\":\"base64\",\"dimensions\":8}", &q, &e), 0);
    T_CHECK(q.n == 2 && !strcmp(q.inputs[0], "a") && q.n_input_ids[1] == 3 && q.input_ids[1][2] == 3 && q.encoding_base64 && q.dimensions == 8);
    gw_oai_req_free(&q);
    T_EQ_INT(parse(GW_OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":[5,6]}", &q, &e), 0);
    T_CHECK(q.n == 1 && q.n_input_ids[0] == 2);
    gw_oai_req_free(&q);
    ERR_K(GW_OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":[]}", "input", "invalid_value", "empty");
    ERR_K(GW_OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format", "invalid_value", "'float' or 'base64'");
    ERR_K(GW_OAI_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"a\",\"temperature\":1}", "temperature", "unknown_parameter", "temperature");
}

static void test_structured_build(void) {
    gw_oai_meta m = { GW_OAI_CHAT, "chatcmpl-1", 7, "m", NULL, 0 };
    gw_oai_call calls[2] = { { "call_a", "f", "{\"x\":1}", 7 }, { "call_b", "g", "{}", 2 } };
    gw_oai_choice ch = { .text = "", .len = 0, .finish = SHM_FINISH_STOP, .reasoning = "hmm", .reasoning_len = 3, .calls = calls, .n_calls = 2 };
    gw_oai_usage u = { 3, 4, 0 };
    char *rj = gw_oai_response_json(&m, &ch, 1, &u, 0);
    cJSON *j = cJSON_Parse(rj);
    free(rj);
    cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "message");
    T_CHECK(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
    T_EQ_STR(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "hmm");
    cJSON *tc = cJSON_GetObjectItem(msg, "tool_calls");
    T_CHECK(cJSON_GetArraySize(tc) == 2);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 0), "function"), "arguments")->valuestring, "{\"x\":1}");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(tc, 1), "id")->valuestring, "call_b");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "finish_reason")->valuestring, "tool_calls");
    cJSON_Delete(j);
    char *s = gw_oai_chunk_call_json(&m, 0, 1, "call_b", "g", NULL, 0);
    j = cJSON_Parse(s);
    cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta"), "tool_calls"), 0);
    T_CHECK(cJSON_GetObjectItem(x, "index")->valueint == 1 && !strcmp(cJSON_GetObjectItem(x, "type")->valuestring, "function") &&
            !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(x, "function"), "arguments")->valuestring, ""));
    cJSON_Delete(j);
    free(s);
    s = gw_oai_chunk_call_json(&m, 0, 1, NULL, NULL, "{\"", 2);
    j = cJSON_Parse(s);
    x = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "delta"), "tool_calls"), 0);
    T_CHECK(!cJSON_GetObjectItem(x, "id") && !strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(x, "function"), "arguments")->valuestring, "{\""));
    cJSON_Delete(j);
    free(s);
    s = gw_oai_chunk_json(&m, 0, 0, NULL, 0, GW_FINISH_TOOL_CALLS, NULL, 0, NULL);
    T_CHECK(strstr(s, "\"finish_reason\":\"tool_calls\"") != NULL);
    free(s);
    /* responses */
    gw_oai_req q;
    gw_oai_err e;
    T_EQ_INT(parse(GW_OAI_RESPONSES, "{\"model\":\"m\",\"input\":\"x\",\"metadata\":{\"a\":\"b\"}}", &q, &e), 0);
    gw_rsp_info ri = { &q, "resp_1", 9, "m", 0 };
    gw_rsp_item it[2] = { { .type = 0, .id = "msg_1", .text = "hello", .len = 5, .done = 1 },
                          { .type = 1, .id = "fc_1", .text = "{}", .len = 2, .name = "f", .call_id = "call_1", .done = 1 } };
    s = gw_rsp_json(&ri, "completed", it, 2, &u);
    j = cJSON_Parse(s);
    T_EQ_STR(cJSON_GetObjectItem(j, "object")->valuestring, "response");
    T_EQ_STR(cJSON_GetObjectItem(j, "status")->valuestring, "completed");
    cJSON *out = cJSON_GetObjectItem(j, "output");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 0), "content"), 0), "text")->valuestring, "hello");
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 1), "call_id")->valuestring, "call_1");
    T_CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint == 7);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "metadata"), "a")->valuestring, "b");
    cJSON_Delete(j);
    free(s);
    s = gw_rsp_event_text("response.output_text.delta", 4, 0, "msg_1", "he", 2);
    size_t n;
    char *f = gw_sse_event(s, &n);
    const char *pre = "event: response.output_text.delta\ndata: {";
    T_CHECK(!strncmp(f, pre, strlen(pre)) && f[n - 1] == '\n' && f[n - 2] == '\n');
    j = cJSON_Parse(s);
    T_CHECK(cJSON_GetObjectItem(j, "sequence_number")->valueint == 4 && !strcmp(cJSON_GetObjectItem(j, "delta")->valuestring, "he"));
    cJSON_Delete(j);
    free(s);
    free(f);
    s = gw_rsp_event_text("response.function_call_arguments.done", 5, 1, "fc_1", "{}", 2);
    j = cJSON_Parse(s);
    T_CHECK(!strcmp(cJSON_GetObjectItem(j, "arguments")->valuestring, "{}") && !cJSON_GetObjectItem(j, "content_index"));
    cJSON_Delete(j);
    free(s);
    gw_oai_req_free(&q);
    /* embeddings: floats and base64 of little-endian float32 */
    float v0[2] = { 1.0f, -2.5f };
    const float *vs[1] = { v0 };
    s = gw_oai_embeddings_json("m", vs, 1, 2, 1, 4);
    j = cJSON_Parse(s);
    T_EQ_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "embedding")->valuestring, "AACAPwAAIMA=");
    T_CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens")->valueint == 4);
    cJSON_Delete(j);
    free(s);
    s = gw_oai_embeddings_json("m", vs, 1, 2, 0, 4);
    j = cJSON_Parse(s);
    cJSON *emb = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "embedding");
    T_CHECK(cJSON_GetArraySize(emb) == 2 && cJSON_GetArrayItem(emb, 1)->valuedouble == -2.5);
    cJSON_Delete(j);
    free(s);
}

int main(void) {
    test_structured_parse();
    test_structured_build();
    test_defaults();
    test_errors();
    test_context_error();
    test_responses();
    return t_done();
}
