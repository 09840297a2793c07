#!/usr/bin/env bash
# The prefix cache and the scheduling fields through `arka serve` (stories260K, CPU executor):
# usage.prompt_tokens_details.cached_tokens exact in non-streaming and streaming final usage
# (also when a stop string ends the request before the executor's DONE, and with n choices),
# the same greedy text with the cache on and off (--no-prefix-cache), the prefix-cache and
# queue-time metrics, the `priority` field (integers only), and requests under keys of two
# tenants with weights. Prints "N passed, N failed" last.
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
"$BIN" serve --help >/dev/null 2>&1 || { echo "arka serve is not part of this build"; exit 77; }
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
. "$ROOT/tests/integration/serve_lib.sh"

# post PATH BODY [HEADER]: sets CODE; the response in $TMP/body
post() { CODE=$(curl -s -o "$TMP/body" -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' ${3:+-H "$3"} --data-binary "$2"); }
jget() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {"d": d}))' "$TMP/body" "$1" 2>/dev/null; }
metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {print $2; exit}'; }
# the final usage chunk of an SSE body in $TMP/body: "prompt cached completion"
sse_usage() {
    python3 - "$TMP/body" <<'EOF'
import json, sys
u = None
for line in open(sys.argv[1]):
    if line.startswith("data: {"):
        d = json.loads(line[6:])
        if d.get("usage"): u = d["usage"]
print(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], u["completion_tokens"] if u else "none")
EOF
}
# what the cache gives a prompt of n tokens seen before in full: its whole 16-token blocks, the
# last token always computed (all but one when n is a multiple of 16: the last block's first 15
# positions are copied)
expect_cached() { local n=$1; if [ $((n % 16)) = 0 ]; then echo $((n - 1)); else echo $((n / 16 * 16)); fi; }

PROMPT="Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day after school and then"
BODY='{"model":"stories260K","prompt":"'"$PROMPT"'","max_tokens":24,"temperature":0}'

start on --log-level info --chat-template chatml || { echo "0 passed, 1 failed"; exit 1; }
check 'grep -q "prefix_cache=on" "$TMP/on.log"' "the executor logs the prefix cache on: $(grep ready "$TMP/on.log")"
post /v1/completions "$BODY"
check '[ "$CODE" = 200 ]' "first request: $CODE $(cat "$TMP/body")"
N=$(jget 'd["usage"]["prompt_tokens"]')
TEXT1=$(jget 'd["choices"][0]["text"]')
check '[ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = 0 ]' "first request cached: $(cat "$TMP/body")"
WANT=$(expect_cached "$N")
post /v1/completions "$BODY"
check '[ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = "$WANT" ]' "second request: want cached $WANT of $N: $(cat "$TMP/body")"
check '[ "$(jget "d[\"choices\"][0][\"text\"]")" = "$TEXT1" ]' "a cache hit changed the text: $(cat "$TMP/body")"
# streaming: the final usage chunk
post /v1/completions "${BODY%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
check '[ "$(sse_usage)" = "$N $WANT 24" ]' "streamed usage: $(sse_usage) (want $N $WANT 24)"
# a stop string ends it in the gateway, before the executor's DONE: cached_tokens still exact
STOP=$(python3 -c 'import sys; t=sys.argv[1]; print(t[len(t)//3:len(t)//3+6])' "$TEXT1")
post /v1/completions "${BODY%\}},\"stop\":[\"$STOP\"]}"
check '[ "$(jget "d[\"choices\"][0][\"finish_reason\"]")" = stop ] && [ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = "$WANT" ]' \
    "stop string '$STOP': $(cat "$TMP/body")"
post /v1/completions "${BODY%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":[\"$STOP\"]}"
check '[ "$(sse_usage | cut -d" " -f1,2)" = "$N $WANT" ]' "streamed with a stop string: $(sse_usage)"
# n choices: the prompt is billed once, its cached tokens the first choice's
post /v1/completions '{"model":"stories260K","prompt":"'"$PROMPT"'","max_tokens":16,"temperature":0.9,"seed":7,"n":3}'
check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"prompt_tokens\"]")" = "$N" ] && [ "$(jget "d[\"usage\"][\"completion_tokens\"]")" = 48 ]' "n=3: $(cat "$TMP/body")"
check '[ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = "$WANT" ]' "n=3 cached: $(cat "$TMP/body")"
N3=$(jget 'len(set(c["text"] for c in d["choices"]))')
check '[ "$N3" -ge 2 ]' "n=3 seeded choices are all the same: $(cat "$TMP/body")"
# chat: the template's fixed head is shared across different conversations
CHAT='{"model":"stories260K","messages":[{"role":"system","content":"You are a storyteller who tells short happy stories about animals in the forest and the sea."},{"role":"user","content":"MSG"}],"max_tokens":8,"temperature":0}'
post /v1/chat/completions "${CHAT/MSG/Tell me about a cat}"
post /v1/chat/completions "${CHAT/MSG/Tell me about a dog}"
check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" -ge 16 ]' "chat with a shared system prompt: $(cat "$TMP/body")"

# metrics: prefix-cache queries and hits (tokens), queue time observed
check '[ "$(metric prefix_cache_queries_total)" -ge $((N * 6)) ] && [ "$(metric prefix_cache_hits_total)" -ge $((WANT * 4)) ]' \
    "prefix cache counters: queries $(metric prefix_cache_queries_total) hits $(metric prefix_cache_hits_total)"
check '[ "$(metric request_queue_time_seconds_count)" -ge 9 ]' "queue time observations: $(metric request_queue_time_seconds_count)"

# priority: vLLM's integer field
post /v1/completions '{"model":"stories260K","prompt":"Hi","max_tokens":2,"priority":-3}'
check '[ "$CODE" = 200 ]' "priority -3: $CODE $(cat "$TMP/body")"
post /v1/completions '{"model":"stories260K","prompt":"Hi","max_tokens":2,"priority":"high"}'
check '[ "$CODE" = 400 ] && [ "$(jget "d[\"error\"][\"param\"]")" = priority ]' "priority \"high\": $CODE $(cat "$TMP/body")"
post /v1/completions '{"model":"stories260K","prompt":"Hi","max_tokens":2,"priority":1.5}'
check '[ "$CODE" = 400 ]' "priority 1.5: $CODE"
kill "$SPID"; wait "$SPID" 2>/dev/null

# --no-prefix-cache: nothing cached, the same text
start off --log-level info --no-prefix-cache || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
check 'grep -q "prefix_cache=off" "$TMP/off.log"' "the executor logs the prefix cache off"
post /v1/completions "$BODY"
post /v1/completions "$BODY"
check '[ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = 0 ] && [ "$(jget "d[\"choices\"][0][\"text\"]")" = "$TEXT1" ]' \
    "--no-prefix-cache: $(cat "$TMP/body")"
check '[ "$(metric prefix_cache_queries_total)" = 0 ]' "--no-prefix-cache counts queries: $(metric prefix_cache_queries_total)"
kill "$SPID"; wait "$SPID" 2>/dev/null

# two tenants' keys with weights: both served, per-tenant usage counted
K=$TMP/keys.conf
KA=$("$BIN" keys create --tenant alpha --weight 1 --rpm 0 --tpm 0 --concurrency 0 --keys-file "$K" 2>/dev/null)
KB=$("$BIN" keys create --tenant beta --weight 4 --rpm 0 --tpm 0 --concurrency 0 --keys-file "$K" 2>/dev/null)
start keys --log-level warn --keys-file "$K" || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
post /v1/completions "$BODY" "Authorization: Bearer $KA"
check '[ "$CODE" = 200 ] && [ "$(jget "d[\"choices\"][0][\"text\"]")" = "$TEXT1" ]' "tenant alpha: $CODE $(cat "$TMP/body")"
post /v1/completions "$BODY" "Authorization: Bearer $KB"
check '[ "$CODE" = 200 ] && [ "$(jget "d[\"usage\"][\"prompt_tokens_details\"][\"cached_tokens\"]")" = "$WANT" ]' "tenant beta (the cache is shared): $CODE $(cat "$TMP/body")"
check 'curl -s "$URL/metrics" | grep "^arka:tenant_requests_total{.*tenant=\"beta\"} 1$" >/dev/null' "per-tenant requests: $(curl -s "$URL/metrics" | grep tenant_requests)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
