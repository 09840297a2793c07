#!/usr/bin/env bash
# arka serve end to end, real processes on loopback: the gateway with its CPU executor on
# stories260K. curl for every endpoint and error (the reference greedy continuation exactly,
# SSE framing, stop strings, context length, 404/405, bad JSON and values), a client that
# disconnects mid-stream frees its sequence (seen on /metrics), an executor killed mid-stream
# is restarted and the stream resumes on it, chat on a model without a template is a
# 400 naming --chat-template, `arka bench serve` against the server, then the official `openai`
# and `ws` npm clients (tests/integration/serve_clients.mjs, installed into a cache outside the
# repository). Prints "N passed, N failed" last.
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
command -v curl >/dev/null || { echo "FAIL: curl missing"; echo "0 passed, 1 failed"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

. "$ROOT/tests/integration/serve_lib.sh"
# req METHOD PATH [BODY]: sets CODE and BODY (response)
req() {
    if [ $# -ge 3 ]; then CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' -X "$1" "$URL$2" -H 'Content-Type: application/json' --data-binary "$3")
    else CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' -X "$1" "$URL$2"); fi
    BODY=$(cat "$TMP/body")
}
jget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$TMP/body" "$1" 2>/dev/null; }
metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {print $2; exit}'; }

start main --log-level warn --chat-template chatml || { echo "0 passed, 1 failed"; exit 1; }
SERVER=$SPID

# ---- endpoints ----
req GET /health; check '[ "$CODE" = 200 ] && [ "$BODY" = "{\"status\":\"ok\"}" ]' "/health: $CODE $BODY"
req GET /ready; check '[ "$CODE" = 200 ]' "/ready: $CODE"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -I "$URL/health"); check '[ "$CODE" = 200 ]' "HEAD /health: $CODE"
req GET /v1/models; check '[ "$CODE" = 200 ] && [ "$(jget "d[\"data\"][0][\"id\"]")" = stories260K ]' "/v1/models: $BODY"
req GET /v1/models/stories260K; check '[ "$CODE" = 200 ]' "/v1/models/stories260K: $CODE"
req GET /v1/models/other; check '[ "$CODE" = 404 ]' "/v1/models/other: $CODE"
req GET /metrics; check '[ "$CODE" = 200 ] && grep -q "^arka:num_requests_running{model_name=\"stories260K\"} 0" "$TMP/body"' "/metrics: $CODE"

# ---- the reference continuation (../shared/models/README.md), 200 greedy tokens ----
python3 - "$ROOT/../shared/models/README.md" >"$TMP/ref.txt" <<'EOF'
import sys
t = open(sys.argv[1]).read()
blk = t.split("Reference:", 1)[1].split("```", 2)[1]
sys.stdout.write(blk.split("\n", 1)[1])
EOF
req POST /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":200,"temperature":0}'
python3 -c 'import json,sys; print("Once upon a time" + json.load(open(sys.argv[1]))["choices"][0]["text"], end="")' "$TMP/body" >"$TMP/got.txt"
check 'python3 -c "import sys; a=open(sys.argv[1]).read().rstrip(\"\n\"); b=open(sys.argv[2]).read().rstrip(\"\n\"); sys.exit(a != b)" "$TMP/ref.txt" "$TMP/got.txt"' \
    "200 greedy tokens differ from the reference: $(head -c 300 "$TMP/got.txt")"
check '[ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 200 ] && [ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = length ]' "usage/finish: $BODY"
check '[ "$(metric prompt_tokens_total)" -ge 5 ] && [ "$(metric generation_tokens_total)" -ge 200 ]' "metrics count tokens: prompt $(metric prompt_tokens_total) generated $(metric generation_tokens_total)"

# ---- a live scrape passes promtool (vLLM-style `prefix:` names draw one lint each, the only
# finding tolerated: promtool's linter flags every colon, which Prometheus itself allows) ----
if command -v promtool >/dev/null; then
    curl -s "$URL/metrics" >"$TMP/scrape"
    promtool check metrics <"$TMP/scrape" >"$TMP/promtool" 2>&1
    grep -v "metric names should not contain ':'" "$TMP/promtool" >"$TMP/promtool.rest"
    check '[ ! -s "$TMP/promtool.rest" ] && grep -q "^arka:time_to_first_token_seconds_bucket" "$TMP/scrape"' \
        "promtool check metrics: $(head -5 "$TMP/promtool.rest")"
else
    bad "promtool missing (scripts/setup.sh installs Debian's prometheus package)"
fi

curl -s "$URL/metrics" >"$TMP/scrape2"
check 'grep -q "^arka:http_requests_total{model_name=\"stories260K\",route=\"/v1/completions\",status=\"200\"} [1-9]" "$TMP/scrape2" && grep -q "route=\"/v1/models/{id}\",status=\"404\"" "$TMP/scrape2"' \
    "http_requests_total: $(grep '^arka:http_requests_total' "$TMP/scrape2" | head -5)"

# ---- SSE framing ----
curl -sN "$URL/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":6,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' >"$TMP/sse"
check 'python3 - "$TMP/sse" <<EOF
import json, sys
raw = open(sys.argv[1]).read()
events = raw.split("\n\n")
assert events[-1] == "", "stream must end with a blank line"
ev = [e for e in events[:-1]]
assert all(e.startswith("data: ") and "\n" not in e for e in ev), "data lines only"
assert ev[-1] == "data: [DONE]"
chunks = [json.loads(e[6:]) for e in ev[:-1]]
assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
assert chunks[-2]["choices"][0]["finish_reason"] == "length"
EOF' "SSE framing: $(head -c 400 "$TMP/sse")"

# ---- stop strings, logit bias, n ----
req POST /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":[" girl"]}'
check '[ "$(jget "d[\"choices\"][0][\"text\"]")" = ", there was a little" ] && [ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = stop ]' "stop: $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":3,"temperature":0,"n":3}'
check '[ "$(jget "len(d[\"choices\"])")" = 3 ] && [ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 9 ]' "n=3: $BODY"

# ---- errors ----
req POST /v1/completions '{"model":"nope","prompt":"x"}'
check '[ "$CODE" = 404 ] && [ "$(jget "d[\"error\"][\"code\"]")" = model_not_found ]' "unknown model: $CODE $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":"x",'
check '[ "$CODE" = 400 ] && [ "$(jget "d[\"error\"][\"type\"]")" = invalid_request_error ]' "bad JSON: $CODE $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":"x","temperature":-1}'
check '[ "$CODE" = 400 ] && [ "$(jget "d[\"error\"][\"param\"]")" = temperature ]' "temperature -1: $CODE $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":"x","max_tokens":4000}'
check '[ "$CODE" = 400 ] && [ "$(jget "d[\"error\"][\"code\"]")" = context_length_exceeded ]' "context: $CODE $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":[1,2,99999]}'
check '[ "$CODE" = 400 ]' "token id out of vocabulary: $CODE $BODY"
req POST /v1/completions '{"model":"stories260K","prompt":""}'
check '[ "$CODE" = 200 ] || [ "$CODE" = 400 ]' "empty prompt (BOS only or refused): $CODE"
req GET /v1/completions; check '[ "$CODE" = 405 ]' "GET /v1/completions: $CODE"
req GET /v1/nothing; check '[ "$CODE" = 404 ]' "unknown path: $CODE"
CODE=$(curl -sN -o "$TMP/sse400" -w '%{http_code}' "$URL/v1/completions" -d '{"model":"stories260K","prompt":"x","max_tokens":4000,"stream":true}')
check '[ "$CODE" = 400 ] && ! grep -q "^data:" "$TMP/sse400"' "stream with a context error: status before any stream byte ($CODE)"

# ---- a client that disconnects mid-stream frees its sequence ----
g0=$(metric generation_tokens_total)
# 8 choices of 2000 tokens: seconds of work, cut after 0.5 s
curl -sN --max-time 0.5 "$URL/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":2000,"temperature":0,"n":8,"stream":true}' >"$TMP/cut" 2>/dev/null
freed=0
for _ in $(seq 100); do
    [ "$(metric num_requests_running)" = 0 ] && [ "$(metric gateway_requests_in_flight)" = 0 ] &&
        python3 -c "import sys; sys.exit(float(sys.argv[1]) != 0)" "$(metric kv_cache_usage_perc)" && { freed=1; break; }
    sleep 0.1
done
g1=$(metric generation_tokens_total); sleep 0.5; g2=$(metric generation_tokens_total)
check '[ $freed = 1 ] && [ "$g1" = "$g2" ] && [ $((g1 - g0)) -lt 16000 ] && grep -q "^data: {" "$TMP/cut"' \
    "disconnect: freed=$freed generated $((g1 - g0)) then $((g2 - g1)) more"

# ---- an executor killed mid-stream: it restarts and the stream resumes on it (test_resume.sh has
# the details) ----
EXEC=$(pgrep -P "$SERVER" -f "arka executor" | head -1)
curl -sN --max-time 120 "$URL/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":400,"temperature":0,"ignore_eos":true,"n":8,"stream":true}' >"$TMP/crash" &
CPID=$!
for _ in $(seq 400); do grep -q '^data: {' "$TMP/crash" 2>/dev/null && break; sleep 0.05; done
[ -n "$EXEC" ] && kill -9 "$EXEC"
wait $CPID
check '! grep -q "^data: {\"error\"" "$TMP/crash" && [ "$(grep -c "finish_reason\":\"length" "$TMP/crash")" = 8 ] && grep -q "^data: \[DONE\]" "$TMP/crash"' \
    "killed executor: the stream did not resume: $(tail -c 300 "$TMP/crash")"
up=0
for _ in $(seq 200); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && { up=1; break; }; sleep 0.1; done
req POST /v1/completions '{"model":"stories260K","prompt":"Once upon a time","max_tokens":5,"temperature":0}'
check '[ $up = 1 ] && [ "$CODE" = 200 ] && [ "$(metric executor_restarts_total)" = 1 ] && [ "$(metric requests_resumed_total)" = 1 ]' \
    "after the restart: up=$up $CODE restarts=$(metric executor_restarts_total) resumed=$(metric requests_resumed_total)"

# ---- arka bench serve against the real server ----
"$BIN" bench serve --url "$URL" --requests 12 --rate 0 --prompt-len 16 --max-tokens 16 --concurrency 6 --json "$TMP/bench.json" >"$TMP/bench.txt" 2>&1
check 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); c=d.get(\"completed\", d.get(\"summary\",{}).get(\"completed\")); sys.exit(0 if c==12 else 1)" "$TMP/bench.json"' \
    "bench serve: $(tail -5 "$TMP/bench.txt")"

# ---- chat on a model without a chat template ----
start notmpl --log-level warn || bad "second server did not start"
req POST /v1/chat/completions '{"model":"stories260K","messages":[{"role":"user","content":"Hi"}]}'
check '[ "$CODE" = 400 ] && grep -q -- "--chat-template" "$TMP/body"' "chat without a template: $CODE $BODY"
kill "$SPID"; wait "$SPID" 2>/dev/null
URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$TMP/main.log" | head -1)

# ---- bad start-up: one-line errors, non-zero exit ----
"$BIN" serve -m /nonexistent.gguf --port 0 >"$TMP/e1" 2>&1; rc=$?
check '[ $rc != 0 ] && grep -q "nonexistent.gguf" "$TMP/e1"' "missing model: rc=$rc $(cat "$TMP/e1")"
"$BIN" serve -m "$MODEL" --chat-template nosuch --port 0 >"$TMP/e2" 2>&1; rc=$?
check '[ $rc != 0 ] && grep -q "chatml" "$TMP/e2"' "unknown --chat-template: rc=$rc $(cat "$TMP/e2")"
# make run with a MODEL that does not exist: an error naming it (no download of the default)
make -s -C "$ROOT" run-model MODEL=/nonexistent-model.gguf >"$TMP/e4" 2>&1; rc=$?
check '[ $rc != 0 ] && grep -q "MODEL=/nonexistent-model.gguf: no such file" "$TMP/e4"' "make run MODEL=missing: rc=$rc $(cat "$TMP/e4")"
# --backend cuda without a usable GPU (or a build without the cuda backend): the executor's load
# error, once, and exit 1, instead of restarting it forever
if ! nvidia-smi -L >/dev/null 2>&1; then
    timeout 60 "$BIN" serve -m "$MODEL" --backend cuda --port 0 >"$TMP/e3" 2>&1; rc=$?
    check '[ $rc = 1 ] && grep -q "executor 0 failed to start: .*\(cuda\|CUDA\|device\)" "$TMP/e3" && [ "$(grep -c "executor started" "$TMP/e3")" -le 1 ]' \
        "--backend cuda without a GPU: rc=$rc $(tail -3 "$TMP/e3")"
fi

# ---- official clients (npm openai, ws) ----
if npm_clients; then node_checks "$ROOT/tests/integration/serve_clients.mjs" "$NPM_CACHE" "$URL" stories260K
else bad "the openai and ws npm clients could not be installed"; fi

# ---- graceful shutdown ----
EXECS=$(pgrep -P "$SERVER" | tr '\n' ' ')
kill -TERM "$SERVER"
for _ in $(seq 100); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
wait "$SERVER"; rc=$?
left=""
for p in $EXECS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
check '[ $rc = 0 ] && [ -n "$EXECS" ] && [ -z "$left" ]' "SIGTERM: exit $rc, executors ($EXECS) still running: $left"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
