#!/usr/bin/env bash
# `arka serve` stays reachable and bounded under hostile clients (tests/integration/limits_clients.py),
# on loopback with the CPU executor:
#   1. idle WebSockets and idle keep-alive connections beyond --max-conns: /health and a
#      completion on a new connection are still answered within 50 ms (idle ones make room);
#      default: --max-conns 64 with 70 WebSockets + 130 keep-alives; ARKA_LONG_TESTS=1: the
#      default cap (1024) with 1,100 WebSockets + 2,000 keep-alives;
#   2. 100 connections that announce 8 MiB bodies, send 4 MiB and stall: the gateway's memory
#      grows less than --max-buffered-mb (64), the rest are refused with 503 at once;
#   3. two clients sending 8 MB JSON bodies back to back: /health p99 under 10 ms (the JSON is
#      parsed off the event loop; under sanitizers the bound is 50 ms);
#   4. the drain: SIGTERM with streams running (their executor stopped, so they cannot finish):
#      /health answers 503 meanwhile, new requests get 503, and at --drain-timeout each stream
#      gets an SSE error event server_shutting_down before the close.
# Prints "N passed, N failed" last.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
CLIENTS=$ROOT/tests/integration/limits_clients.py
. "$ROOT/tests/integration/serve_lib.sh"
serve_require
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do pkill -CONT -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
LONG=0
[ "${ARKA_LONG_TESTS:-0}" = 1 ] && LONG=1
SAN=0
grep -q "ARKA_SANITIZE:STRING=.*address" "${ARKA_BUILD:-/nonexistent}/CMakeCache.txt" 2>/dev/null && SAN=1
jq_() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2], {"d": d}))' "$1" "$2"; }
metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {s += $2} END {print s + 0}'; }
hostport() { HOST=${URL#http://}; PORT=${HOST##*:}; HOST=${HOST%:*}; }

# ---- 1. idle connections beyond the cap ----
if [ $LONG = 1 ]; then NWS=1100 NKA=2000 CAP=1024; else NWS=70 NKA=130 CAP=64; fi
want_fds=$((NWS + NKA + 512))
[ "$(ulimit -n)" -lt $want_fds ] && ulimit -n "$(ulimit -Hn)" 2>/dev/null
if [ "$(ulimit -n)" -lt $want_fds ]; then
    bad "the open-files limit ($(ulimit -n)) is below the $want_fds this needs"
else
    start flood --log-level warn --max-conns $CAP || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
    hostport
    python3 "$CLIENTS" flood "$HOST" "$PORT" $NWS $NKA stories260K --probes 20 >"$TMP/flood.json" 2>"$TMP/flood.err"
    F=$(cat "$TMP/flood.json")
    echo "flood ($NWS WebSockets + $NKA keep-alives, cap $CAP): $F"
    check '[ -n "$F" ] && [ "$(jq_ "$F" "d[\"statuses\"]")" = "[200]" ]' "every probe and completion answered 200: $F $(tail -3 "$TMP/flood.err")"
    check '[ -n "$F" ] && python3 -c "import sys; sys.exit(not (float(sys.argv[1]) < 50 and float(sys.argv[2]) < 50))" "$(jq_ "$F" "d[\"health_ms_max\"]")" "$(jq_ "$F" "d[\"completion_ms_max\"]")"' \
        "answers within 50 ms: $F"
    check '[ -n "$F" ] && [ "$(jq_ "$F" "d[\"ws_101\"]")" = $NWS ] && [ "$(jq_ "$F" "d[\"ka_200\"]")" = $NKA ]' "every idle connection was accepted in its turn: $F"
    ev=$(metric http_connections_evicted_total)
    check '[ "$ev" -ge $((NWS + NKA - CAP)) ] && [ "$(metric http_connections)" -le $CAP ]' "evicted $ev, open $(metric http_connections)"
    kill "$SPID"; wait "$SPID" 2>/dev/null
fi

# ---- 2. stalled 8 MiB bodies: memory bounded by --max-buffered-mb ----
start stall --log-level error --max-buffered-mb 64 || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
hostport
python3 "$CLIENTS" stall "$HOST" "$PORT" 100 $((4 << 20)) "$SPID" >"$TMP/stall.json" 2>"$TMP/stall.err"
S=$(cat "$TMP/stall.json")
echo "stalled bodies (--max-buffered-mb 64): $S"
check '[ -n "$S" ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) < 64)" "$(jq_ "$S" "d[\"growth_mib\"]")"' "RSS growth under the 64 MiB cap: $S $(tail -3 "$TMP/stall.err")"
check '[ -n "$S" ] && [ "$(jq_ "$S" "d[\"refused_503\"]")" -ge 90 ]' "the bodies beyond the cap refused with 503: $S"
check '[ "$(curl -s -o /dev/null -w "%{http_code}" "$URL/health")" = 200 ] && [ "$(metric http_buffer_refusals_total)" -ge 90 ]' \
    "health and the refusal counter: $(metric http_buffer_refusals_total)"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- 3. 8 MB JSON bodies do not stall the event loop ----
start big --log-level error || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
hostport
# the sanitizer build parses an 8 MB body several times slower: it gets twice the time to send
# the 4 bodies the check wants beside /health (3 in 4 s on the 2-core machine, now and then)
SECS=4; [ $SAN = 1 ] && SECS=8; [ $LONG = 1 ] && SECS=15
python3 "$CLIENTS" bigbody "$HOST" "$PORT" $SECS >"$TMP/big.json" 2>"$TMP/big.err"
B=$(cat "$TMP/big.json")
LIM=10; [ $SAN = 1 ] && LIM=50
# a run disturbed by other work on a shared machine (a few 12 ms samples make the p99) is
# measured once more; the loop stalling on the parse (hundreds of ms) fails both
if [ -n "$B" ] && ! python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$(jq_ "$B" "d[\"health_ms_p99\"]")" $LIM; then
    echo "8 MB bodies, first run over the bound (measured again): $B"
    python3 "$CLIENTS" bigbody "$HOST" "$PORT" $SECS >"$TMP/big.json" 2>"$TMP/big.err"
    B=$(cat "$TMP/big.json")
fi
echo "8 MB bodies from two clients, /health every 10 ms: $B (bound ${LIM} ms)"
check '[ -n "$B" ] && [ "$(jq_ "$B" "d[\"bodies_sent\"]")" -ge 4 ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$(jq_ "$B" "d[\"health_ms_p99\"]")" $LIM' \
    "/health p99 under $LIM ms: $B $(tail -3 "$TMP/big.err")"
check '[ -n "$B" ] && [ "$(jq_ "$B" "list(d[\"statuses\"]) == [\"400\"]")" = True ]' "8 MB bodies answered 400 (context length): $B"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- 4. the drain: 503 on /health meanwhile, server_shutting_down events at the deadline ----
start drain --log-level warn --drain-timeout 1.5 || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
EXEC=$(pgrep -P "$SPID" -f "arka executor" | head -1)
for i in 1 2 3; do
    curl -sN --max-time 20 "$URL/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":400,"temperature":0,"ignore_eos":true,"stream":true}' >"$TMP/s$i" 2>/dev/null &
done
for _ in $(seq 200); do [ "$(grep -l '"text"' "$TMP"/s1 "$TMP"/s2 "$TMP"/s3 2>/dev/null | wc -l)" = 3 ] && break; sleep 0.01; done
kill -STOP "$EXEC" # the streams cannot finish now (the drain deadline comes before the heartbeat check)
t0=$(date +%s.%N)
kill -TERM "$SPID"
sleep 0.3
H=$(curl -s -w ' %{http_code}' "$URL/health")
P=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" -d '{"model":"stories260K","prompt":"x"}')
check '[ "$H" = "{\"status\":\"draining\"} 503" ] && [ "$P" = 503 ]' "during the drain: /health '$H', a new request $P"
for i in 1 2 3; do
    for _ in $(seq 100); do grep -q "server_shutting_down" "$TMP/s$i" && break; sleep 0.05; done
done
t1=$(date +%s.%N)
kill -CONT "$EXEC" 2>/dev/null
n=0
for i in 1 2 3; do grep -q '^data: {"error".*"code":"server_shutting_down"' "$TMP/s$i" && ! grep -q DONE "$TMP/s$i" && n=$((n + 1)); done
check '[ $n = 3 ] && python3 -c "import sys; sys.exit(not 1.3 < float(sys.argv[2]) - float(sys.argv[1]) < 4)" $t0 $t1' \
    "streams at the deadline: $n of 3 got server_shutting_down after $(python3 -c "print(round($t1 - $t0, 2))") s: $(tail -c 200 "$TMP/s1")"
wait "$SPID"; rc=$?
check '[ $rc = 0 ]' "exit after the drain: $rc"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
