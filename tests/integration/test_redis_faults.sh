#!/usr/bin/env bash
# `arka serve --redis` through Redis faults, with a real redis-server:
#   - a hang (SIGSTOP, 3 s; 20 s with ARKA_LONG_TESTS=1) while a key of concurrency 1 is used one
#     request at a time: every request during it is served (the local limiter), and right after it
#     Redis admits the key again one at a time (no lease left behind; before, 429s for 40 s);
#   - a key revoked just before a hang is refused during it (401), a key in good standing served;
#   - ARKA_LONG_TESTS=1: an outage of 70 s (past the 60 s after which known keys used to get 401):
#     known keys are still served. (test_gw_auth_redis covers it in the default run with a clock
#     3 hours ahead.)
# Skipped (77) without redis-server. Prints "N passed, N failed" last.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { echo "redis-server not installed: skipped"; exit 77; }
"$BIN" serve --help 2>/dev/null | grep -- --redis >/dev/null || { echo "arka serve has no --redis: skipped"; exit 77; }
[ -f "$MODEL" ] || { echo "FAIL: $MODEL missing"; echo "0 passed, 1 failed"; exit 1; }
unset ARKA_CONFIG ARKA_KEYS_FILE ARKA_REDIS ARKA_NO_AUTH
TMP=$(mktemp -d)
PIDS=()
RPID=""
cleanup() {
    [ -n "$RPID" ] && kill -CONT "$RPID" 2>/dev/null
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
. "$ROOT/tests/integration/serve_lib.sh"
LONG=0
[ "${ARKA_LONG_TESTS:-0}" = 1 ] && LONG=1
B='{"model":"stories260K","prompt":"Once upon a time","max_tokens":4}'
post() { curl -s -o "$TMP/b" -w '%{http_code}' "$URL/v1/completions" -H "Authorization: Bearer $1" --data-binary "$B"; }
metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {s += $2} END {print s + 0}'; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" >/dev/null 2>&1 &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
export ARKA_AUTH_SECRET=secret-for-the-redis-fault-test
R=redis://127.0.0.1:$port
kone=$("$BIN" keys create --tenant solo --concurrency 1 --rpm 0 --redis "$R" 2>/dev/null)
krev=$("$BIN" keys create --tenant soon-revoked --redis "$R" 2>/dev/null)
kok=$("$BIN" keys create --tenant fine --redis "$R" 2>/dev/null)
start main --log-level warn --redis "$R" || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
for k in "$kone" "$krev" "$kok"; do c=$(post "$k"); check '[ "$c" = 200 ]' "warm-up: $c $(cat "$TMP/b")"; done
lease=$(redis-cli -p "$port" --scan --pattern 'arka:{solo}:k:*:lease' | head -1)
[ -n "$lease" ] || lease="arka:{solo}:k:$("$BIN" keys list --redis "$R" 2>/dev/null | awk '$2 == "solo" {print $1}'):lease"

# ---- a hang, a key of concurrency 1 used one request at a time ----
HANG=3; [ $LONG = 1 ] && HANG=20
kill -STOP "$RPID"
end=$(( $(date +%s) + HANG )); during="" n=0
while [ "$(date +%s)" -lt $end ]; do during="$during$(post "$kone") "; n=$((n + 1)); sleep 0.1; done
kill -CONT "$RPID"
check '[ "$(echo $during | tr " " "\n" | sort -u)" = 200 ]' "during a ${HANG} s hang ($n requests): $during"
# back: once the gateway has reconnected (back-off at most 5 s), Redis admits it one at a time
for _ in $(seq 100); do
    f0=$(metric fallback_admissions_total); c=$(post "$kone")
    [ "$c" = 200 ] && [ "$(metric fallback_admissions_total)" = "$f0" ] && break
    sleep 0.1
done
after=""
for i in $(seq 10); do after="$after$(post "$kone") "; done
check '[ "$after" = "200 200 200 200 200 200 200 200 200 200 " ]' "after the hang, one at a time through Redis: $after"
sleep 0.3
check '[ "$(redis-cli -p "$port" zcard "$lease")" = 0 ]' "leases left: $(redis-cli -p "$port" zrange "$lease" 0 -1 withscores)"

# ---- revoked just before a hang ----
"$BIN" keys revoke "$krev" --redis "$R" 2>/dev/null
sleep 2.5 # the gateway's revocation poll runs every second
kill -STOP "$RPID"
c1=$(post "$krev"); c2=$(post "$kok")
kill -CONT "$RPID"
check '[ "$c1" = 401 ] && [ "$c2" = 200 ]' "during a hang: revoked key $c1, good key $c2"

# ---- a long outage: known keys are still served ----
if [ $LONG = 1 ]; then
    kill -STOP "$RPID"
    sleep 70
    c=$(post "$kok"); c1=$(post "$krev")
    kill -CONT "$RPID"
    check '[ "$c" = 200 ] && [ "$c1" = 401 ]' "after 70 s of outage: known key $c ($(cat "$TMP/b")), revoked key $c1"
fi
kill -TERM "$SPID"; wait "$SPID"; rc=$?
check '[ $rc = 0 ]' "exit $rc"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
