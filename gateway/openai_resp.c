/* openai_resp: the Responses API's objects and streamed events, and the embeddings answer (see
 * openai.h). */
#include "gateway/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway/openai_internal.h"

static char *print(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

/* A JSON text of the request (schema, tool_choice) as a value; null when absent or broken. */
static cJSON *parsed(const char *json) {
    cJSON *v = json ? cJSON_Parse(json) : NULL;
    return v ? v : cJSON_CreateNull();
}

static cJSON *item_obj(const gw_rsp_item *it) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", it->id);
    const char *status = it->done ? "completed" : "in_progress";
    if (it->type == 0) {
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "status", status);
        cJSON_AddStringToObject(o, "role", "assistant");
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        if (it->done) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "output_text");
            cJSON_AddItemToObject(p, "text", gw__oai_str(it->text ? it->text : "", it->len));
            cJSON_AddArrayToObject(p, "annotations");
            cJSON_AddArrayToObject(p, "logprobs");
            cJSON_AddItemToArray(content, p);
        }
    } else if (it->type == 1) {
        cJSON_AddStringToObject(o, "type", "function_call");
        cJSON_AddStringToObject(o, "status", status);
        cJSON_AddItemToObject(o, "arguments", gw__oai_str(it->done && it->text ? it->text : "", it->done ? it->len : 0));
        cJSON_AddStringToObject(o, "call_id", it->call_id ? it->call_id : "");
        cJSON_AddItemToObject(o, "name", gw__oai_str(it->name ? it->name : "", it->name ? strlen(it->name) : 0));
    } else {
        cJSON_AddStringToObject(o, "type", "reasoning");
        cJSON_AddArrayToObject(o, "summary");
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        if (it->done) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "reasoning_text");
            cJSON_AddItemToObject(p, "text", gw__oai_str(it->text ? it->text : "", it->len));
            cJSON_AddItemToArray(content, p);
        }
    }
    return o;
}

static cJSON *response_obj(const gw_rsp_info *ri, const char *status, const gw_rsp_item *items, int n, const gw_oai_usage *u,
                           const gw_oai_err *err) {
    const gw_oai_req *q = ri->q;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", ri->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)ri->created);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddFalseToObject(r, "background");
    if (err) {
        cJSON *e = cJSON_AddObjectToObject(r, "error");
        cJSON_AddStringToObject(e, "code", err->code[0] ? err->code : "server_error");
        cJSON_AddStringToObject(e, "message", err->message);
    } else cJSON_AddNullToObject(r, "error");
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else cJSON_AddNullToObject(r, "incomplete_details");
    if (q->instructions) cJSON_AddItemToObject(r, "instructions", gw__oai_str(q->instructions, strlen(q->instructions)));
    else cJSON_AddNullToObject(r, "instructions");
    if (ri->max_output_tokens) cJSON_AddNumberToObject(r, "max_output_tokens", ri->max_output_tokens);
    else cJSON_AddNullToObject(r, "max_output_tokens");
    cJSON_AddNullToObject(r, "max_tool_calls");
    cJSON_AddStringToObject(r, "model", ri->model);
    cJSON *out = cJSON_AddArrayToObject(r, "output");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(out, item_obj(&items[i]));
    cJSON_AddBoolToObject(r, "parallel_tool_calls", q->parallel_tool_calls);
    cJSON_AddNullToObject(r, "previous_response_id");
    cJSON *rs = cJSON_AddObjectToObject(r, "reasoning");
    cJSON_AddNullToObject(rs, "effort");
    cJSON_AddNullToObject(rs, "summary");
    cJSON_AddStringToObject(r, "service_tier", "default");
    cJSON_AddBoolToObject(r, "store", q->store);
    cJSON_AddNumberToObject(r, "temperature", q->sp.temperature);
    cJSON *text = cJSON_AddObjectToObject(r, "text"), *f = cJSON_AddObjectToObject(text, "format");
    if (q->fmt == GW_FMT_JSON_SCHEMA) {
        cJSON_AddStringToObject(f, "type", "json_schema");
        cJSON_AddStringToObject(f, "name", q->schema_name ? q->schema_name : "");
        cJSON_AddItemToObject(f, "schema", parsed(q->schema_json));
        cJSON_AddBoolToObject(f, "strict", q->schema_strict);
    } else cJSON_AddStringToObject(f, "type", q->fmt == GW_FMT_JSON_OBJECT ? "json_object" : "text");
    cJSON_AddStringToObject(text, "verbosity", "medium");
    if (q->tool_choice_json) cJSON_AddItemToObject(r, "tool_choice", parsed(q->tool_choice_json));
    else cJSON_AddStringToObject(r, "tool_choice", "auto");
    /* tools in the Responses form: flat functions */
    cJSON *tools = cJSON_AddArrayToObject(r, "tools"), *chat = q->tools_json ? cJSON_Parse(q->tools_json) : NULL, *t;
    cJSON_ArrayForEach(t, chat) {
        cJSON *fn = cJSON_DetachItemFromObject(t, "function");
        if (!fn) continue;
        cJSON_AddStringToObject(fn, "type", "function");
        if (!cJSON_GetObjectItem(fn, "strict")) cJSON_AddFalseToObject(fn, "strict");
        if (!cJSON_GetObjectItem(fn, "parameters")) cJSON_AddNullToObject(fn, "parameters");
        cJSON_AddItemToArray(tools, fn);
    }
    cJSON_Delete(chat);
    cJSON_AddNumberToObject(r, "top_logprobs", 0);
    cJSON_AddNumberToObject(r, "top_p", q->sp.top_p);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (u) {
        cJSON *us = cJSON_AddObjectToObject(r, "usage");
        cJSON_AddNumberToObject(us, "input_tokens", u->prompt_tokens);
        cJSON *d = cJSON_AddObjectToObject(us, "input_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
        cJSON_AddNumberToObject(us, "output_tokens", u->completion_tokens);
        d = cJSON_AddObjectToObject(us, "output_tokens_details");
        cJSON_AddNumberToObject(d, "reasoning_tokens", 0);
        cJSON_AddNumberToObject(us, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    } else cJSON_AddNullToObject(r, "usage");
    if (q->user) cJSON_AddStringToObject(r, "user", q->user);
    else cJSON_AddNullToObject(r, "user");
    cJSON *md = q->metadata_json ? cJSON_Parse(q->metadata_json) : NULL;
    cJSON_AddItemToObject(r, "metadata", md ? md : cJSON_CreateObject());
    return r;
}

char *gw_rsp_json(const gw_rsp_info *ri, const char *status, const gw_rsp_item *items, int n, const gw_oai_usage *u) {
    return print(response_obj(ri, status, items, n, u, NULL));
}

static cJSON *event(const char *type, int seq) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", seq);
    return o;
}

char *gw_rsp_event_response(const char *type, int seq, const gw_rsp_info *ri, const char *status, const gw_rsp_item *items,
                            int n, const gw_oai_usage *u, const gw_oai_err *err) {
    cJSON *o = event(type, seq);
    cJSON_AddItemToObject(o, "response", response_obj(ri, status, items, n, u, err));
    return print(o);
}

char *gw_rsp_event_item(const char *type, int seq, int output_index, const gw_rsp_item *it) {
    cJSON *o = event(type, seq);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    cJSON_AddItemToObject(o, "item", item_obj(it));
    return print(o);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

char *gw_rsp_event_text(const char *type, int seq, int output_index, const char *item_id, const char *text, size_t len) {
    cJSON *o = event(type, seq);
    cJSON_AddStringToObject(o, "item_id", item_id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    int args = strstr(type, "function_call_arguments") != NULL;
    if (!args) cJSON_AddNumberToObject(o, "content_index", 0);
    if (strstr(type, "content_part")) {
        cJSON *p = cJSON_AddObjectToObject(o, "part");
        cJSON_AddStringToObject(p, "type", "output_text");
        cJSON_AddItemToObject(p, "text", gw__oai_str(text ? text : "", text ? len : 0));
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    } else if (ends_with(type, ".delta")) {
        cJSON_AddItemToObject(o, "delta", gw__oai_str(text, len));
        if (strstr(type, "output_text")) cJSON_AddArrayToObject(o, "logprobs");
    } else {
        cJSON_AddItemToObject(o, args ? "arguments" : "text", gw__oai_str(text ? text : "", text ? len : 0));
        if (strstr(type, "output_text")) cJSON_AddArrayToObject(o, "logprobs");
    }
    return print(o);
}

char *gw_sse_event(const char *json, size_t *len) {
    cJSON *o = cJSON_Parse(json);
    const cJSON *t = o ? cJSON_GetObjectItem(o, "type") : NULL;
    const char *type = cJSON_IsString(t) ? t->valuestring : "message";
    size_t n = strlen(json), tl = strlen(type);
    char *s = malloc(n + tl + 20);
    if (s) *len = (size_t)sprintf(s, "event: %s\ndata: %s\n\n", type, json);
    cJSON_Delete(o);
    return s;
}

/* ---- embeddings ------------------------------------------------------------------------------ */

static char *base64(const unsigned char *p, size_t n) {
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *w = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *w++ = al[v >> 18];
        *w++ = al[(v >> 12) & 63];
        *w++ = i + 1 < n ? al[(v >> 6) & 63] : '=';
        *w++ = i + 2 < n ? al[v & 63] : '=';
    }
    *w = 0;
    return o;
}

char *gw_oai_embeddings_json(const char *model, const float *const *vecs, int n, int dim, int b64, int prompt_tokens) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "object", "embedding");
        cJSON_AddNumberToObject(e, "index", i);
        if (b64) { /* little-endian float32, as OpenAI sends it */
            char *s = base64((const unsigned char *)vecs[i], sizeof(float) * (size_t)dim);
            if (!s) { cJSON_Delete(root); cJSON_Delete(e); return NULL; }
            cJSON_AddStringToObject(e, "embedding", s);
            free(s);
        } else {
            cJSON *a = cJSON_CreateFloatArray(vecs[i], dim);
            cJSON_AddItemToObject(e, "embedding", a);
        }
        cJSON_AddItemToArray(data, e);
    }
    cJSON_AddStringToObject(root, "model", model);
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", prompt_tokens);
    return print(root);
}
