#!/usr/bin/env bash
# `arka bench serve` against a fake streaming server with known timing
# (tests/integration/sse_timing_server.py: first token after 80 ms, then one every 20 ms):
# the measured TTFT, ITL and TPOT, token counts, the model taken from /v1/models, distinct
# prompts, Poisson arrivals and the concurrency bound, chunked and close-delimited bodies,
# injected failures (HTTP 500 and error events), a timeout, warm-up, the workloads (shared
# prefix, multi-turn conversations, two tenants) with the usage's cached tokens, and usage
# errors.
set -uo pipefail
ARKA_BIN=${ARKA_BIN:-build/bin/arka}
ROOT=${ARKA_ROOT:-$(pwd)}
SERVER=$ROOT/tests/integration/sse_timing_server.py
tmp=$(mktemp -d /tmp/arka-bench-serve-XXXXXX)
pids=
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0 failed=0
ok()   { passed=$((passed + 1)); }
bad()  { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
# jq-like reads of the JSON report: j FILE EXPR (a Python expression over r; a tuple prints
# space-separated).
j() {
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); v=eval(sys.argv[2])
print(" ".join(map(str, v)) if isinstance(v, tuple) else v)' "$1" "$2" 2>/dev/null
}
# in_range VALUE LO HI
in_range() { python3 -c 'import sys; v,lo,hi=map(float,sys.argv[1:]); sys.exit(0 if lo <= v <= hi else 1)' "$1" "$2" "$3" 2>/dev/null; }

# start NAME ARGS...: a server with its own log; sets PORT_<NAME>.
start() {
    local name=$1; shift
    python3 "$SERVER" --port-file "$tmp/$name.port" --log "$tmp/$name.log" "$@" &
    pids="$pids $!"
    for _ in $(seq 100); do [ -s "$tmp/$name.port" ] && break; sleep 0.05; done
    [ -s "$tmp/$name.port" ] || { echo "server $name did not start" >&2; echo "0 passed, 1 failed"; exit 1; }
    eval "PORT_$name=$(cat "$tmp/$name.port")"
}
start main
start faults --fail-every 5 --error-every 7
start close --close-delimited
start empty --empty-every 4
URL=http://127.0.0.1:$PORT_main
bs() { "$ARKA_BIN" bench serve "$@"; }

# 0. Empty answers are answers: every 4th stream ends with no text (finish "stop", 0 completion
#    tokens); all 12 complete, 3 of them without text, and TTFT counts only the 9 with text.
bs --url "http://127.0.0.1:$PORT_empty" --requests 12 --rate 0 --prompt-len 8 --max-tokens 4 --json "$tmp/e.json" >"$tmp/e.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(j "$tmp/e.json" "r[\"completed\"], r[\"completed_without_text\"], r[\"failed\"]")" = "12 3 0" ]' \
    "empty answers: rc $rc, completed/without text/failed $(j "$tmp/e.json" "r[\"completed\"], r[\"completed_without_text\"], r[\"failed\"]") $(cat "$tmp/err")"
check '[ "$(j "$tmp/e.json" "r[\"ttft_ms\"][\"n\"]")" = 9 ]' "TTFT over the 9 streams with text only: n = $(j "$tmp/e.json" "r[\"ttft_ms\"][\"n\"]")"

# 1. All at once: 20 requests, 32-word prompts, 10 tokens each. The model comes from /v1/models.
N=20 M=10
bs --url "$URL" --requests $N --rate 0 --prompt-len 32 --max-tokens $M --json "$tmp/a.json" >"$tmp/a.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ ! -s "$tmp/err" ]' "all-at-once run: rc $rc $(cat "$tmp/err")"
check '[ "$(j "$tmp/a.json" "r[\"completed\"], r[\"failed\"], r[\"first_error\"]")" = "20 0 None" ]' "completed/failed: $(j "$tmp/a.json" "r[\"completed\"], r[\"failed\"], r[\"first_error\"]")"
check '[ "$(j "$tmp/a.json" "r[\"model\"]")" = fake-model ]' "model not taken from /v1/models"
check '[ "$(j "$tmp/a.json" "r[\"total_output_tokens\"]")" = $((N * M)) ]' "output tokens $(j "$tmp/a.json" "r[\"total_output_tokens\"]") != $((N * M))"
check '[ "$(j "$tmp/a.json" "r[\"mean_prompt_tokens\"]")" = 33.0 ]' "mean prompt tokens $(j "$tmp/a.json" "r[\"mean_prompt_tokens\"]") (server counts words + 1)"
ttft=$(j "$tmp/a.json" 'r["ttft_ms"]["p50"]'); itl=$(j "$tmp/a.json" 'r["itl_ms"]["p50"]')
tpot=$(j "$tmp/a.json" 'r["tpot_ms"]["p50"]'); e2e=$(j "$tmp/a.json" 'r["e2e_ms"]["p50"]')
check 'in_range "$ttft" 75 160' "TTFT p50 $ttft ms, expected about 80"
check 'in_range "$itl" 17 30' "ITL p50 $itl ms, expected about 20"
check 'in_range "$tpot" 17 30' "TPOT p50 $tpot ms, expected about 20"
check 'in_range "$e2e" 255 420' "E2E p50 $e2e ms, expected about 80 + 9 x 20"
check '[ "$(j "$tmp/a.json" "r[\"itl_ms\"][\"n\"]")" = $((N * (M - 1))) ]' "ITL samples $(j "$tmp/a.json" "r[\"itl_ms\"][\"n\"]") != $((N * (M - 1)))"
check 'in_range "$(j "$tmp/a.json" "r[\"duration_s\"]")" 0.25 1.5' "duration of an all-at-once run: $(j "$tmp/a.json" "r[\"duration_s\"]")"
check '[ "$(grep -c status=200 "$tmp/main.log")" = $N ]' "server saw $(grep -c status=200 "$tmp/main.log") requests"
check '[ "$(grep -o "prompt=[0-9a-f]*" "$tmp/main.log" | sort -u | wc -l)" = $N ]' "prompts are not all distinct"
check '[ "$(grep -o "words=[0-9]*" "$tmp/main.log" | sort -u)" = words=32 ]' "prompt word counts: $(grep -o "words=[0-9]*" "$tmp/main.log" | sort -u | tr "\n" " ")"
maxin=$(grep -o "inflight=[0-9]*" "$tmp/main.log" | cut -d= -f2 | sort -n | tail -1)
check '[ "${maxin:-0}" -ge 10 ]' "all-at-once run had at most ${maxin:-0} requests in flight"
check 'grep -q "^TTFT " "$tmp/a.out" && grep -q "^ITL " "$tmp/a.out" && grep -q "^TPOT " "$tmp/a.out" && grep -q "^E2E " "$tmp/a.out"' "table rows missing: $(cat "$tmp/a.out")"

# 2. Poisson arrivals at 20 req/s: 20 requests span about a second; with the same seed the
# server sees the same prompts again.
: >"$tmp/main.log"
bs --url "$URL" -n $N --rate 20 --seed 7 --prompt-len 8 --max-tokens 4 --json "$tmp/b.json" >/dev/null 2>"$tmp/err"; rc=$?
dur=$(j "$tmp/b.json" 'r["duration_s"]')
check '[ $rc = 0 ] && [ "$(j "$tmp/b.json" "r[\"completed\"]")" = $N ]' "Poisson run: rc $rc $(cat "$tmp/err")"
check 'in_range "$dur" 0.45 4' "Poisson run at 20 req/s lasted $dur s"
check '[ "$(j "$tmp/b.json" "r[\"rate\"]")" = 20 ]' "rate in the JSON: $(j "$tmp/b.json" "r[\"rate\"]")"
grep -o "prompt=[0-9a-f]*" "$tmp/main.log" | sort >"$tmp/p1"
: >"$tmp/main.log"
bs --url "$URL" -n $N --rate 20 --seed 7 --prompt-len 8 --max-tokens 4 >/dev/null 2>&1
grep -o "prompt=[0-9a-f]*" "$tmp/main.log" | sort >"$tmp/p2"
check 'cmp -s "$tmp/p1" "$tmp/p2" && [ -s "$tmp/p1" ]' "same seed, different prompts"

# 3. --concurrency 1: one request at a time, so 4 requests take 4 x ~260 ms.
: >"$tmp/main.log"
bs --url "$URL" -n 4 -c 1 --prompt-len 4 --max-tokens $M --json "$tmp/c.json" >/dev/null 2>"$tmp/err"; rc=$?
maxin=$(grep -o "inflight=[0-9]*" "$tmp/main.log" | cut -d= -f2 | sort -n | tail -1)
check '[ $rc = 0 ] && [ "$maxin" = 1 ]' "concurrency 1: rc $rc, $maxin in flight $(cat "$tmp/err")"
check 'in_range "$(j "$tmp/c.json" "r[\"duration_s\"]")" 1.0 3' "concurrency 1 run lasted $(j "$tmp/c.json" "r[\"duration_s\"]") s"
check 'in_range "$(j "$tmp/c.json" "r[\"ttft_ms\"][\"p99\"]")" 75 160' "TTFT of queued requests should count from their send, not their arrival: $(j "$tmp/c.json" "r[\"ttft_ms\"][\"p99\"]")"

# 4. Injected failures: of 20 requests, numbers 5, 10, 15, 20 get HTTP 500 and 7, 14 an error
# event after two tokens. The rest complete with all their tokens.
bs --url "http://127.0.0.1:$PORT_faults/v1/" -n $N --prompt-len 8 --max-tokens $M --json "$tmp/d.json" >"$tmp/d.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ]' "run with failures: rc $rc $(cat "$tmp/err")"
check '[ "$(j "$tmp/d.json" "r[\"completed\"], r[\"failed\"]")" = "14 6" ]' "completed/failed: $(j "$tmp/d.json" "r[\"completed\"], r[\"failed\"]")"
check '[ "$(j "$tmp/d.json" "r[\"total_output_tokens\"]")" = $((14 * M)) ]' "output tokens with failures: $(j "$tmp/d.json" "r[\"total_output_tokens\"]")"
check 'j "$tmp/d.json" "r[\"first_error\"]" | grep -Eq "^(HTTP 500: injected failure|error event: injected stream error) [0-9]+$"' "first error: $(j "$tmp/d.json" "r[\"first_error\"]")"
check 'grep -q "^first error .*injected" "$tmp/d.out"' "first error not in the table"

# 5. A close-delimited (HTTP/1.0, no length) body; warm-up requests are sent but not counted.
bs --url "http://127.0.0.1:$PORT_close" -n 5 --warmup 3 --prompt-len 8 --max-tokens 6 --json "$tmp/e.json" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(j "$tmp/e.json" "r[\"completed\"], r[\"total_output_tokens\"]")" = "5 30" ]' "close-delimited: rc $rc $(cat "$tmp/err") $(j "$tmp/e.json" "r[\"completed\"], r[\"total_output_tokens\"]")"
check '[ "$(grep -c status=200 "$tmp/close.log")" = 8 ]' "warm-up: server saw $(grep -c status=200 "$tmp/close.log") requests, expected 3 + 5"

# 6. Every request failing: exit 1 with one line on stderr naming the cause.
bs --url "$URL" -n 3 --model nosuch --prompt-len 4 --max-tokens 2 --json "$tmp/f.json" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "HTTP 404: The model .nosuch. does not exist" "$tmp/err"' "unknown model: rc $rc $(cat "$tmp/err")"
check '[ "$(j "$tmp/f.json" "r[\"failed\"]")" = 3 ]' "JSON of an all-failed run: $(j "$tmp/f.json" "r[\"failed\"]")"
bs --url "$URL" -n 2 --timeout 0.04 --prompt-len 4 --max-tokens 2 >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "timed out" "$tmp/err"' "timeout: rc $rc $(cat "$tmp/err")"

# 8. Workloads. shared-prefix: every prompt starts with the same 32 words, then its own 8; the
#    server's cached_tokens (its 16-word blocks shared with an earlier prompt) are reported.
: >"$tmp/main.log"
bs --url "$URL" -n 6 -c 1 --workload shared-prefix --prefix-len 32 --prompt-len 8 --max-tokens 3 --json "$tmp/s.json" >"$tmp/s.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(j "$tmp/s.json" "r[\"workload\"], r[\"prefix_len\"], r[\"completed\"]")" = "shared-prefix 32 6" ]' "shared-prefix: rc $rc $(cat "$tmp/err")"
check '[ "$(grep -o "words=[0-9]*" "$tmp/main.log" | sort -u)" = words=40 ] && [ "$(grep -o "head=[0-9a-f]*" "$tmp/main.log" | sort -u | wc -l)" = 1 ]' "shared-prefix prompts: $(cat "$tmp/main.log")"
check '[ "$(grep -o "prompt=[0-9a-f]*" "$tmp/main.log" | sort -u | wc -l)" = 6 ]' "shared-prefix: each prompt its own after the prefix"
check '[ "$(j "$tmp/s.json" "round(r[\"mean_cached_tokens\"], 3)")" = 26.667 ] && grep -q "^cached tokens  *mean 26.7" "$tmp/s.out"' "cached tokens: $(j "$tmp/s.json" "r[\"mean_cached_tokens\"]") $(cat "$tmp/s.out")"
#    multi-turn: 3 conversations of 3 turns, each turn the conversation so far (16 new words and
#    the 4-word answer per turn) plus 16 new words
: >"$tmp/main.log"
bs --url "$URL" --seed 99 --workload multi-turn --users 3 --turns 3 --prompt-len 16 --max-tokens 4 --json "$tmp/m.json" >"$tmp/m.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(j "$tmp/m.json" "r[\"requests\"], r[\"completed\"], r[\"users\"], r[\"turns\"]")" = "9 9 3 3" ]' "multi-turn: rc $rc $(cat "$tmp/err") $(cat "$tmp/m.out")"
check '[ "$(grep -o "words=[0-9]*" "$tmp/main.log" | sort | uniq -c | tr -s " " | tr "\n" ";")" = " 3 words=16; 3 words=36; 3 words=56;" ]' "multi-turn word counts: $(grep -o "words=[0-9]*" "$tmp/main.log" | tr "\n" " ")"
check '[ "$(j "$tmp/m.json" "r[\"mean_cached_tokens\"]")" = 16.0 ]' "multi-turn cached: $(j "$tmp/m.json" "r[\"mean_cached_tokens\"]")"
maxin=$(grep -o "inflight=[0-9]*" "$tmp/main.log" | cut -d= -f2 | sort -n | tail -1)
check '[ "$maxin" -le 3 ]' "multi-turn: $maxin requests in flight for 3 conversations"
#    tenants: B alone (3 requests 50 ms apart), then A's 6 at once with B beside until A ends
: >"$tmp/main.log"
bs --url "$URL" -n 6 --workload tenants --api-key aaaaaaaaaa --api-key-b bbbbbbbbbb --b-interval 0.05 --b-requests 3 \
    --prompt-len 4 --max-tokens 10 --json "$tmp/t.json" >"$tmp/t.out" 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(grep -c key=aaaaaa "$tmp/main.log")" = 6 ]' "tenants: rc $rc $(cat "$tmp/err") A sent $(grep -c key=aaaaaa "$tmp/main.log")"
nb=$(grep -c key=bbbbbb "$tmp/main.log")
check '[ "$nb" -ge 6 ] && [ "$nb" -le 12 ]' "tenants: B sent $nb (3 alone, about 5 beside A's 260 ms)"
check '[ "$(j "$tmp/t.json" "r[\"b_alone\"][\"completed\"], r[\"b_beside_a\"][\"completed\"] + 3 == $nb")" = "3 True" ]' "tenants JSON: $(cat "$tmp/t.json")"
check 'in_range "$(j "$tmp/t.json" "r[\"b_ttft_ratio\"][\"p50\"]")" 0.5 2' "B's TTFT beside A vs alone (the fake server does not share): $(j "$tmp/t.json" "r[\"b_ttft_ratio\"]")"
check 'grep -q "^tenant B TTFT beside A / alone: p50" "$tmp/t.out"' "tenants table: $(cat "$tmp/t.out")"

# 7. Usage errors (exit 2) and an unreachable server (exit 1), each one line on stderr.
FREE=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
usage_case() { # EXPECTED_RC WHAT ARGS...
    local want=$1 what=$2; shift 2
    bs "$@" >/dev/null 2>"$tmp/err"; local rc=$?
    check '[ $rc = $want ] && [ "$(wc -l <"$tmp/err")" = 1 ]' "$what: rc $rc, stderr: $(cat "$tmp/err")"
}
usage_case 2 "missing --url" -n 5
usage_case 2 "--requests 0" --url "$URL" -n 0
usage_case 2 "missing --requests" --url "$URL"
usage_case 2 "too many requests" --url "$URL" -n 1000001
usage_case 2 "negative rate" --url "$URL" -n 1 --rate -1
usage_case 2 "concurrency over 1024" --url "$URL" -n 1 -c 2000
usage_case 2 "https URL" --url "https://127.0.0.1:$PORT_main" -n 1
usage_case 2 "URL with a query" --url "$URL/?x=1" -n 1
usage_case 2 "unknown flag" --url "$URL" -n 1 --bogus
usage_case 2 "unknown workload" --url "$URL" -n 1 --workload nosuch
usage_case 2 "multi-turn requests not users x turns" --url "$URL" -n 5 --workload multi-turn --users 2 --turns 2
usage_case 2 "multi-turn with warm-up" --url "$URL" --workload multi-turn --warmup 2
usage_case 2 "tenants without B's key" --url "$URL" -n 2 --workload tenants
usage_case 1 "unreachable URL" --url "http://127.0.0.1:$FREE" -n 1
check 'grep -q "Connection refused" "$tmp/err"' "unreachable: $(cat "$tmp/err")"
usage_case 1 "unreachable URL with --model" --url "http://127.0.0.1:$FREE" -n 2 --model m
check 'grep -q "all 2 requests failed.*Connection refused" "$tmp/err"' "unreachable with --model: $(cat "$tmp/err")"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
