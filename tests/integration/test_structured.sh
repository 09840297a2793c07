#!/usr/bin/env bash
# Structured outputs, tool calls, the Responses API, embeddings and the small conveniences end
# to end on stories260K (a model that cannot write JSON on its own), real processes on loopback:
# tests/integration/structured_check.py (100 sampled completions under a strict JSON schema
# parse and validate, required and named tool_choice give valid calls streamed and not, the
# Responses API and its event stream, tokenize/detokenize, x-request-id, max_model_len), CORS
# preflight and headers, x-api-key with auth on, a template without tool markers, --task embed,
# then the real npm clients (tests/integration/structured_clients.mjs: openai's
# chat.completions.parse, responses.create and responses.stream; LangChain's
# withStructuredOutput and bindTools; the AI SDK's generateObject and tool calls), installed into
# a cache outside the repository. Prints "N passed, N failed" last.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
[ -x "$BIN" ] || { echo "FAIL: $BIN not built"; echo "0 passed, 1 failed"; exit 1; }
[ -f "$MODEL" ] || { echo "FAIL: $MODEL missing"; echo "0 passed, 1 failed"; exit 1; }
python3 -c 'import jsonschema' 2>/dev/null || { echo "FAIL: python3-jsonschema missing (scripts/setup.sh installs it)"; echo "0 passed, 1 failed"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
. "$ROOT/tests/integration/serve_lib.sh"

# runs a check script and adds its "N passed, N failed" to ours
script_checks() {
    "$@" >"$TMP/out.txt" 2>&1
    grep -v "passed, .* failed" "$TMP/out.txt" | head -40
    local np nf
    np=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/out.txt")
    nf=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/out.txt")
    if [ -n "$np" ]; then pass=$((pass + np)); fail=$((fail + nf)); else fail=$((fail + 1)); echo "FAIL $2 did not finish"; fi
}

start main --log-level warn --threads 2 --chat-template chatml --cors-origin "http://app.example, http://b.example" ||
    { echo "0 passed, 1 failed"; exit 1; }
MAIN=$URL
script_checks python3 "$ROOT/tests/integration/structured_check.py" "$URL" stories260K

# ---- CORS: preflight and headers, only for the listed origins ----
curl -s -D "$TMP/h1" -o /dev/null -X OPTIONS "$URL/v1/chat/completions" -H "Origin: http://app.example" \
    -H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization, content-type"
check 'grep -q "^HTTP/1.1 204" "$TMP/h1" && grep -qi "^Access-Control-Allow-Origin: http://app.example" "$TMP/h1" &&
       grep -qi "^Access-Control-Allow-Headers: authorization, content-type" "$TMP/h1" && grep -qi "^Access-Control-Allow-Methods: .*POST" "$TMP/h1"' \
    "preflight: $(cat "$TMP/h1")"
curl -s -D "$TMP/h2" -o /dev/null "$URL/v1/models" -H "Origin: http://b.example"
check 'grep -qi "^Access-Control-Allow-Origin: http://b.example" "$TMP/h2" && grep -qi "^Vary: Origin" "$TMP/h2"' "CORS on GET: $(cat "$TMP/h2")"
curl -s -D "$TMP/h3" -o /dev/null "$URL/v1/completions" -H "Origin: http://evil.example" -d '{"model":"stories260K","prompt":"x","max_tokens":1}'
check '! grep -qi "^Access-Control-Allow-Origin" "$TMP/h3"' "CORS for an origin not listed: $(cat "$TMP/h3")"
curl -sN -D "$TMP/h4" -o /dev/null "$URL/v1/chat/completions" -H "Origin: http://app.example" \
    -d '{"model":"stories260K","messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":true}'
check 'grep -qi "^Access-Control-Allow-Origin: http://app.example" "$TMP/h4"' "CORS on a stream: $(cat "$TMP/h4")"

# ---- reasoning: <think>...</think> split off as reasoning_content (a grammar makes the tiny model
# write one), streamed and not ----
start think --log-level warn --chat-template chatml --reasoning-parser think || bad "reasoning server did not start"
python3 - "$URL" >"$TMP/think.txt" 2>&1 <<'EOF'
import json, sys, urllib.request
url = sys.argv[1]
G = 'root ::= "<think>" [a-c]{3} "</think>" "\\n\\n" "Hello" [!.]'
body = {"model": "stories260K", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "grammar": G, "seed": 5}
def post(path, b):
    req = urllib.request.Request(url + path, data=json.dumps(b).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r: return r.read().decode()
p = f = 0
def check(c, what):
    global p, f
    if c: p += 1
    else: f += 1; print("FAIL", what)
m = json.loads(post("/v1/chat/completions", body))["choices"][0]["message"]
check(len(m.get("reasoning_content", "")) == 3 and set(m["reasoning_content"]) <= set("abc") and m["content"] in ("Hello!", "Hello."), f"split: {m}")
rs, cs = "", ""
for line in post("/v1/chat/completions", {**body, "stream": True}).split("\n"):
    if line.startswith("data: {"):
        d = json.loads(line[6:])["choices"]
        if d: rs += d[0]["delta"].get("reasoning_content", ""); cs += d[0]["delta"].get("content", "") or ""
check(rs == m["reasoning_content"] and cs == m["content"], f"streamed split: {rs!r} {cs!r}")
r = json.loads(post("/v1/responses", {"model": "stories260K", "input": "Hi", "max_output_tokens": 8}))
check(r["object"] == "response", "responses on a reasoning server")
print(f"{p} passed, {f} failed")
EOF
script_checks cat "$TMP/think.txt"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- a template without tool markers: tools need --tool-parser ----
start nofmt --log-level warn --chat-template llama2 || bad "llama2 server did not start"
CODE=$(curl -s -o "$TMP/b1" -w '%{http_code}' "$URL/v1/chat/completions" \
    -d '{"model":"stories260K","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}')
check '[ "$CODE" = 400 ] && grep -q -- "--tool-parser" "$TMP/b1"' "tools without a format: $CODE $(cat "$TMP/b1")"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- auth: x-api-key like a bearer; x-request-id echoed or generated ----
K=$TMP/keys.conf
key=$("$BIN" keys create --tenant t1 --keys-file "$K" 2>/dev/null)
start auth --log-level warn --keys-file "$K" || bad "auth server did not start"
CODE=$(curl -s -D "$TMP/h5" -o "$TMP/b5" -w '%{http_code}' "$URL/v1/completions" -H "x-api-key: $key" -H "x-request-id: trace-7" \
    -d '{"model":"stories260K","prompt":"x","max_tokens":1}')
check '[ "$CODE" = 200 ] && grep -qi "^x-request-id: trace-7" "$TMP/h5" && [ "$(grep -ci "^x-request-id" "$TMP/h5")" = 1 ]' "x-api-key: $CODE $(cat "$TMP/h5")"
CODE=$(curl -s -D "$TMP/h6" -o /dev/null -w '%{http_code}' "$URL/v1/completions" -H "x-api-key: ak-000" -d '{"model":"stories260K","prompt":"x"}')
check '[ "$CODE" = 401 ] && grep -qi "^x-request-id: req_" "$TMP/h6"' "bad x-api-key: $CODE $(cat "$TMP/h6")"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- embeddings (--task embed) ----
start embed --log-level warn --task embed || bad "embedding server did not start"
python3 - "$URL" >"$TMP/emb.txt" 2>&1 <<'EOF'
import base64, json, math, struct, sys, urllib.request, urllib.error
url = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())
p = f = 0
def check(c, what):
    global p, f
    if c: p += 1
    else: f += 1; print("FAIL", what)
texts = ["Once upon a time", "there was a little girl named Lily", "She liked to play"]
st, one = post("/v1/embeddings", {"model": "stories260K", "input": texts[1]})
st2, many = post("/v1/embeddings", {"model": "stories260K", "input": texts})
st3, b64 = post("/v1/embeddings", {"model": "stories260K", "input": texts, "encoding_format": "base64"})
v1 = one["data"][0]["embedding"]
check(st == 200 and st2 == 200 and len(many["data"]) == 3 and [d["index"] for d in many["data"]] == [0, 1, 2], f"batch: {st} {st2}")
check(abs(math.sqrt(sum(x * x for x in v1)) - 1) < 1e-5, "L2-normalised")
check(max(abs(a - b) for a, b in zip(v1, many["data"][1]["embedding"])) < 1e-6, "batched == alone")
dec = struct.unpack("<%df" % len(v1), base64.b64decode(b64["data"][1]["embedding"]))
check(max(abs(a - b) for a, b in zip(dec, many["data"][1]["embedding"])) < 1e-6, "base64 == float")
check(many["usage"]["prompt_tokens"] > 10 and many["model"] == "stories260K", f"usage {many['usage']}")
st, d8 = post("/v1/embeddings", {"model": "stories260K", "input": texts[0], "dimensions": 8})
v8 = d8["data"][0]["embedding"]
check(st == 200 and len(v8) == 8 and abs(math.sqrt(sum(x * x for x in v8)) - 1) < 1e-5, f"dimensions 8: {st} {v8}")
st, e = post("/v1/embeddings", {"model": "stories260K", "input": "x", "dimensions": 100000})
check(st == 400 and e["error"]["param"] == "dimensions", f"dimensions too large: {e}")
st, e = post("/v1/completions", {"model": "stories260K", "prompt": "x"})
check(st == 400 and "embeddings" in e["error"]["message"], f"generation on an embedding server: {e}")
st, e = post("/v1/embeddings", {"model": "stories260K", "input": [[1, 2, 3], [4, 5]]})
check(st == 200 and len(e["data"]) == 2, f"token-id inputs: {st}")
print(f"{p} passed, {f} failed")
EOF
script_checks cat "$TMP/emb.txt"
kill "$SPID"; wait "$SPID" 2>/dev/null
CODE=$(curl -s -o "$TMP/b7" -w '%{http_code}' "$MAIN/v1/embeddings" -d '{"model":"stories260K","input":"x"}')
check '[ "$CODE" = 400 ] && grep -q -- "--task embed" "$TMP/b7"' "embeddings on a generation server: $CODE $(cat "$TMP/b7")"

# ---- the real clients ----
SCACHE=${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-structured
# the newest releases that still run on Node 18 (Debian 12's): openai 7, @langchain/openai 1.6 and the
# AI SDK 7 need Node 22
SPKGS="openai@6.49.0 zod@3.25.76 @langchain/openai@0.6.17 @langchain/core@0.3.80 ai@6.0.326 @ai-sdk/openai@3.0.141"
if command -v node >/dev/null && command -v npm >/dev/null; then
    mkdir -p "$SCACHE"
    if [ ! -f "$SCACHE/.installed-$(echo "$SPKGS" | md5sum | cut -c1-12)" ]; then
        exec 9>"$SCACHE/.install.lock"; flock 9
        if [ ! -f "$SCACHE/.installed-$(echo "$SPKGS" | md5sum | cut -c1-12)" ]; then
            # shellcheck disable=SC2086
            npm install --prefix "$SCACHE" --no-audit --no-fund --silent $SPKGS >"$SCACHE/npm-install.log" 2>&1 &&
                touch "$SCACHE/.installed-$(echo "$SPKGS" | md5sum | cut -c1-12)" || cat "$SCACHE/npm-install.log"
        fi
        exec 9>&-
    fi
    if [ -f "$SCACHE/.installed-$(echo "$SPKGS" | md5sum | cut -c1-12)" ]; then
        script_checks node "$ROOT/tests/integration/structured_clients.mjs" "$SCACHE" "$MAIN" stories260K
    else bad "the npm clients ($SPKGS) could not be installed"; fi
else
    bad "node/npm missing (scripts/setup.sh installs them)"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
