#!/usr/bin/env python3
"""HTTP checks of structured outputs, tool calls, the Responses API and the small conveniences
against a running `arka serve` on stories260K (--chat-template chatml, whose built-in template
writes Hermes tool calls). Run by test_structured.sh.

    python3 structured_check.py URL MODEL

Prints "N passed, N failed" last; exit 1 on any failure."""
import base64
import concurrent.futures
import json
import struct
import sys
import urllib.error
import urllib.request

import jsonschema

URL, MODEL = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL", what)


def post(path, body, headers=None, raw=False):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, (text if raw else json.loads(text)), dict(r.headers)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text), dict(e.headers)
        except ValueError:
            return e.code, text, dict(e.headers)


def sse(path, body):
    """The data payloads (and event names) of an SSE response."""
    status, text, _ = post(path, body, raw=True)
    events = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            events.append((name, data))
    return status, events


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "fish"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "zip": {"type": ["integer", "null"]}},
                 "required": ["city", "zip"], "additionalProperties": False},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["name", "age", "pet", "tags", "home", "when"],
    "additionalProperties": False,
}


def schema_request(seed):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 400,
            "temperature": 1.0, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}}


# ---- 100 sampled completions under a strict schema parse and validate ----
with concurrent.futures.ThreadPoolExecutor(8) as ex:
    results = list(ex.map(lambda s: post("/v1/chat/completions", schema_request(s)), range(100)))
ok = stop = 0
for st, body, _ in results:
    try:
        c = body["choices"][0]
        jsonschema.validate(json.loads(c["message"]["content"]), SCHEMA, format_checker=jsonschema.FormatChecker())
        ok += 1
        stop += c["finish_reason"] == "stop"
    except Exception as e:  # noqa: BLE001
        print("invalid:", st, str(body)[:300], e)
check(ok == 100 and stop == 100, f"json_schema strict: {ok}/100 valid, {stop} finished by the grammar")

# streamed, the same document
st, ev = sse("/v1/chat/completions", {**schema_request(7), "stream": True})
text = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for _, d in ev if d != "[DONE]" and json.loads(d)["choices"])
st2, body, _ = post("/v1/chat/completions", schema_request(7))
check(st == 200 and text == body["choices"][0]["message"]["content"], f"streamed schema output equals the JSON one: {text!r}")

# json_object: some JSON object
st, body, _ = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 300,
                                             "seed": 3, "response_format": {"type": "json_object"}})
try:
    obj = json.loads(body["choices"][0]["message"]["content"])
    check(isinstance(obj, dict), "json_object gives an object")
except Exception:  # noqa: BLE001
    check(body["choices"][0]["finish_reason"] == "length", f"json_object: {body}")

# a GBNF grammar (llama-server's field), on completions
st, body, _ = post("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 30, "seed": 1,
                                        "grammar": "root ::= (\"yes\" | \"no\") \", \" [0-9]{2,3}"})
t = body["choices"][0]["text"] if st == 200 else ""
check(st == 200 and (t.startswith("yes, ") or t.startswith("no, ")) and t.split(", ")[1].isdigit() and 2 <= len(t.split(", ")[1]) <= 3,
      f"GBNF grammar output: {st} {t!r}")

# ---- errors name the problem ----
bad = schema_request(1)
bad["response_format"]["json_schema"]["schema"] = {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}
st, body, _ = post("/v1/chat/completions", bad)
check(st == 400 and "pattern" in body["error"]["message"] and "#/properties/a/pattern" in body["error"]["message"]
      and body["error"]["param"] == "response_format", f"unsupported keyword: {st} {body}")
st, body, _ = post("/v1/completions", {"model": MODEL, "prompt": "x", "grammar": "root ::= \"a\" (b"})
check(st == 400 and "line 1" in body["error"]["message"] and body["error"]["param"] == "grammar", f"malformed grammar: {st} {body}")
st, body, _ = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "bogus": 1})
check(st == 400 and body["error"]["param"] == "bogus", f"unknown field: {st} {body}")
st, body, _ = post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "bogus",
                                             "tools": [{"type": "function", "function": {"name": "f"}}]})
check(st == 400 and body["error"]["param"] == "tool_choice", f"bogus tool_choice: {st} {body}")
st, body, _ = post("/v1/chat/completions", {**schema_request(1), "ignore_eos": True})
check(st == 400 and body["error"]["param"] == "ignore_eos", f"ignore_eos with a schema: {st} {body}")

# ---- tool calls: required and named, streamed and not ----
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 6}}, "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def tool_request(choice, seed, stream=False, parallel=False):
    return {"model": MODEL, "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "max_tokens": 200,
            "temperature": 1.0, "seed": seed, "tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel, "stream": stream}


def valid_calls(calls, only=None):
    if not calls:
        return False
    for c in calls:
        f = c["function"]
        if f["name"] not in SCHEMAS or (only and f["name"] != only) or not c["id"].startswith("call_"):
            return False
        try:
            jsonschema.validate(json.loads(f["arguments"]), SCHEMAS[f["name"]])
        except Exception:  # noqa: BLE001
            return False
    return True


for choice, only in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
    good = 0
    for seed in range(10):
        st, body, _ = post("/v1/chat/completions", tool_request(choice, seed))
        c = body["choices"][0] if st == 200 else {}
        m = c.get("message", {})
        good += valid_calls(m.get("tool_calls"), only) and m.get("content") is None and c.get("finish_reason") == "tool_calls" \
            and len(m["tool_calls"]) == 1
    check(good == 10, f"tool_choice {choice}: {good}/10 valid single calls")
    # streamed: index, id and name first, then argument fragments; the same call as non-streamed
    st, ev = sse("/v1/chat/completions", tool_request(choice, 5, stream=True))
    calls, finish, frags = {}, None, 0
    for _, d in ev:
        if d == "[DONE]":
            continue
        ch = json.loads(d)["choices"][0]
        finish = ch.get("finish_reason") or finish
        for tc in ch["delta"].get("tool_calls", []):
            k = tc["index"]
            if "id" in tc:
                calls[k] = {"id": tc["id"], "type": tc["type"], "function": {"name": tc["function"]["name"], "arguments": ""}}
            else:
                frags += 1
            calls[k]["function"]["arguments"] += tc["function"]["arguments"]
    st2, body, _ = post("/v1/chat/completions", tool_request(choice, 5))
    ref = body["choices"][0]["message"]["tool_calls"]
    got = [calls[k] for k in sorted(calls)]
    check(st == 200 and finish == "tool_calls" and frags > 1 and valid_calls(got, only)
          and [c["function"] for c in got] == [c["function"] for c in ref], f"streamed calls ({choice}): {got} vs {ref}")

# parallel calls: the grammar allows several, every one valid
st, body, _ = post("/v1/chat/completions", {**tool_request("required", 11, parallel=True), "max_tokens": 400})
calls = body["choices"][0]["message"].get("tool_calls") or []
fin = body["choices"][0]["finish_reason"]
check(st == 200 and len(calls) >= 1 and (valid_calls(calls) or fin == "length"), f"parallel calls: {fin} {calls}")

# tool_choice none: plain text, no calls; auto: whatever the model writes, parsed
st, body, _ = post("/v1/chat/completions", {**tool_request("none", 1), "max_tokens": 20})
check(st == 200 and "tool_calls" not in body["choices"][0]["message"], f"tool_choice none: {body}")

# a history with calls and results renders and runs
hist = [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"}]
st, body, _ = post("/tokenize", {"model": MODEL, "messages": hist, "tools": TOOLS, "return_token_strs": True})
check(st == 200 and body["count"] == len(body["tokens"]) and body["max_model_len"] > 0 and len(body["token_strs"]) == body["count"],
      f"tokenize messages with tools: {st} {str(body)[:200]}")
st, body, _ = post("/v1/chat/completions", {"model": MODEL, "messages": hist, "tools": TOOLS, "max_tokens": 10})
check(st == 200, f"a history with tool calls and results: {st} {body}")

# ---- /v1/responses ----
st, body, _ = post("/v1/responses", {"model": MODEL, "input": "Tell me a story", "instructions": "Be nice", "max_output_tokens": 12,
                                      "store": False})
check(st == 200 and body["object"] == "response" and body["status"] == "incomplete"
      and body["output"][0]["type"] == "message" and body["output"][0]["content"][0]["type"] == "output_text"
      and body["usage"]["output_tokens"] == 12, f"responses create: {st} {str(body)[:300]}")
st, body, _ = post("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": "Describe a person."}], "max_output_tokens": 400,
                                      "text": {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}})
try:
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), SCHEMA)
    check(body["status"] == "completed", "responses json_schema")
except Exception as e:  # noqa: BLE001
    check(False, f"responses json_schema: {e} {str(body)[:300]}")
rtools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"], "strict": True} for t in TOOLS]
st, ev = sse("/v1/responses", {"model": MODEL, "input": "Weather in Rome?", "tools": rtools, "tool_choice": "required",
                               "parallel_tool_calls": False, "stream": True, "max_output_tokens": 200})
types = [n for n, _ in ev]
datas = [json.loads(d) for _, d in ev]
seqs = [d["sequence_number"] for d in datas]
done = datas[-1]["response"] if datas else {}
fc = [o for o in done.get("output", []) if o["type"] == "function_call"]
args = "".join(d["delta"] for d in datas if d["type"] == "response.function_call_arguments.delta")
check(st == 200 and types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
      and types[-1] == "response.completed" and seqs == list(range(len(seqs)))
      and "response.function_call_arguments.done" in types and len(fc) == 1 and fc[0]["arguments"] == args
      and fc[0]["name"] in SCHEMAS and json.loads(args) is not None, f"responses stream with a call: {types} {fc}")
# the call's output goes back as an input item
st, body, _ = post("/v1/responses", {"model": MODEL, "max_output_tokens": 8, "tools": rtools,
                                      "input": [{"role": "user", "content": "Weather?"},
                                                {"type": "function_call", "call_id": fc[0]["call_id"] if fc else "c", "name": "get_weather",
                                                 "arguments": "{\"city\":\"Rome\",\"unit\":\"c\"}"},
                                                {"type": "function_call_output", "call_id": fc[0]["call_id"] if fc else "c", "output": "sunny"}]})
check(st == 200 and body["status"] in ("completed", "incomplete"), f"function_call_output input: {st} {str(body)[:200]}")
st, body, _ = post("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_1"})
check(st == 400 and body["error"]["param"] == "previous_response_id", f"previous_response_id: {st} {body}")
req = urllib.request.Request(URL + "/v1/responses/resp_123")
try:
    urllib.request.urlopen(req, timeout=10)
    check(False, "GET /v1/responses/{id} answered 200")
except urllib.error.HTTPError as e:
    check(e.code == 404 and "not stored" in e.read().decode(), "GET /v1/responses/{id}: 404, not stored")

# ---- tokenize / detokenize ----
st, body, _ = post("/tokenize", {"model": MODEL, "prompt": "Once upon a time"})
st2, body2, _ = post("/detokenize", {"model": MODEL, "tokens": body["tokens"]})
check(st == 200 and body["count"] == 5 and body["tokens"][0] == 1 and st2 == 200 and body2["prompt"] == "<s>Once upon a time",
      f"tokenize round trip (special tokens shown, as HF's decode): {body} {body2}")
st, body, _ = post("/tokenize", {"prompt": "x", "extra": 1})
check(st == 400 and body["error"]["param"] == "extra", f"tokenize unknown field: {body}")
st, body, _ = post("/detokenize", {"tokens": [1, 99999999]})
check(st == 400 and "tokens[1]" in body["error"]["message"], f"detokenize bad id: {body}")

# ---- headers: x-request-id echoed, max_model_len ----
st, body, h = post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}, {"x-request-id": "abc-123"})
check(h.get("x-request-id") == "abc-123", f"x-request-id echoed (auth off): {h}")
with urllib.request.urlopen(URL + "/v1/models", timeout=10) as r:
    m = json.loads(r.read())
check(m["data"][0].get("max_model_len", 0) > 0, f"/v1/models max_model_len: {m}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
