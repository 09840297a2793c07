#!/usr/bin/env bash
# Generations survive an executor crash or hang: `arka serve` with 44 generations in flight (20
# greedy streams, 20 seeded sampling streams, 4 non-streaming; tests/integration/resume_clients.py)
# while the executor is killed (SIGKILL), then hung (SIGSTOP: the heartbeat check kills it). Every
# generation completes, identical to the same request on the undisturbed server (run twice first:
# the baseline must itself be identical; on cuda, where a row's arithmetic depends on its batch,
# continuous instead: resume_clients.py --continuity), and arka:requests_resumed_total and
# arka:executor_restarts_total count it; requests that arrive while the executor restarts wait for
# it. Then what cannot resume gets the error it got before:
# --max-resumes 0, a second death past --max-resumes 1, and no executor back within
# --resume-timeout.
#
# Usage: test_resume.sh [cpu|cuda]   (default cpu; ARKA_RESUME_BACKEND also sets it)
# Environment: ARKA_BIN (the arka binary), ARKA_RESUME_MODEL (default ../shared/models/stories260K.gguf),
# OUT (when set, the JSON results and server logs are copied there). Prints "N passed, N failed" last.
# On a GPU host (the binary built elsewhere, its libraries unpacked as tests/gpu/serve_cuda.sh does):
#   ARKA_BIN=build-gpusrv/bin/arka ARKA_RESUME_MODEL=.carry/models/stories260K.gguf OUT=$OUT/resume \
#     bash tests/integration/test_resume.sh cuda
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
BACKEND=${1:-${ARKA_RESUME_BACKEND:-cpu}}
MODEL=${ARKA_RESUME_MODEL:-$ROOT/../shared/models/stories260K.gguf}
CLIENTS=$ROOT/tests/integration/resume_clients.py
. "$ROOT/tests/integration/serve_lib.sh"
serve_require
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do pkill -CONT -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$TMP"/*.json "$TMP"/*.log "$OUT"/ 2>/dev/null; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
metric() { curl -s "$URL/metrics" | awk -v n="arka:$1" '$1 ~ "^"n"[{ ]" || $1 == n {s += $2} END {print s + 0}'; }
exec_pid() { pgrep -P "$SPID" -f " executor" | head -1; } # the server's child (any binary name)
wait_up() { for _ in $(seq 600); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && return 0; sleep 0.1; done; return 1; }
# clients NAME ARGS...: runs resume_clients.py, adds its counts, keeps its summary line in SUMMARY
clients() {
    local name=$1; shift
    python3 "$CLIENTS" "$URL" stories260K "$TMP/$name.json" "$@" >"$TMP/$name.txt" 2>&1
    grep -v "passed, .* failed" "$TMP/$name.txt" | head -20
    local np nf
    np=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/$name.txt")
    nf=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/$name.txt")
    if [ -n "$np" ]; then pass=$((pass + np)); fail=$((fail + nf)); else bad "$name: the clients did not finish"; fi
    SUMMARY=$(grep '^fault' "$TMP/$name.txt")
}
# stream_bg BODY: a stream in the background into $TMP/stream (emptied first); its pid in CPID
stream_bg() { : >"$TMP/stream"; curl -sN --max-time 120 "$URL/v1/completions" -d "$1" >>"$TMP/stream" 2>/dev/null & CPID=$!; }
first_text() { for _ in $(seq 400); do grep -q '"text":"[^"]' "$TMP/stream" 2>/dev/null && return 0; sleep 0.01; done; return 1; }
LONG='{"model":"stories260K","prompt":"Once upon a time","max_tokens":480,"temperature":0,"ignore_eos":true,"stream":true,"n":16}'

ARGS=(--log-level warn --chat-template chatml --backend "$BACKEND" --served-model-name stories260K)
CMP=()
if [ "$BACKEND" = cuda ]; then
    ARGS+=(--cuda-graph-budget-s 10) # each (re)start captures graphs: keep it short
    export ARKA_START_S=${ARKA_START_S:-180}
    # a row's logits depend on its step's kernels (the batch): two undisturbed runs differ, so
    # the resumed ones are checked for continuity (finish, token counts), not for the same text
    CMP=(--continuity)
fi
start main "${ARGS[@]}" || { echo "$pass passed, $((fail + 1)) failed"; exit 1; }
echo "backend $BACKEND, model $MODEL"

# ---- the reference: the undisturbed server, twice ----
clients ref
clients ref2 --ref "$TMP/ref.json" "${CMP[@]}"
echo "undisturbed twice: $(tail -1 "$TMP/ref2.txt")"

# ---- kill -9 of the executor with everything in flight ----
r0=$(metric requests_resumed_total)
clients kill --fault kill --pid "$(exec_pid)" --ref "$TMP/ref.json" "${CMP[@]}"
inflight=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fault"]["in_flight"])' "$TMP/kill.json")
r1=$(metric requests_resumed_total)
check '[ "$inflight" -ge 30 ] && [ $((r1 - r0)) -ge "$inflight" ] && [ "$(metric executor_restarts_total)" = 1 ]' \
    "kill: $inflight in flight, resumed_total $r0 -> $r1, restarts $(metric executor_restarts_total)"
wait_up || bad "no executor after the kill"

# ---- SIGSTOP: the heartbeat check kills the hung executor ----
clients stop --fault stop --pid "$(exec_pid)" --ref "$TMP/ref.json" "${CMP[@]}"
inflight=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fault"]["in_flight"])' "$TMP/stop.json")
r2=$(metric requests_resumed_total)
check '[ "$inflight" -ge 30 ] && [ $((r2 - r1)) -ge "$inflight" ] && [ "$(metric executor_restarts_total)" = 2 ] && grep -q "heartbeat stalled" "$TMP/main.log"' \
    "stop: $inflight in flight, resumed_total $r1 -> $r2, restarts $(metric executor_restarts_total), log: $(grep -c heartbeat "$TMP/main.log")"
wait_up || bad "no executor after the hang"

# ---- requests that arrive while the executor restarts wait for it (not a 503) ----
kill -9 "$(exec_pid)"
APIDS=()
for i in $(seq 20); do
    curl -s -o "$TMP/arr$i.json" -w '%{http_code}' --max-time 60 "$URL/v1/completions" \
        -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}' >"$TMP/arr$i.code" &
    APIDS+=($!)
    sleep 0.02
done
wait "${APIDS[@]}"
codes=$(for f in "$TMP"/arr*.code; do cat "$f"; echo; done | sort | uniq -c | tr -s ' ' | tr '\n' ';')
check '[ "$(for f in "$TMP"/arr*.code; do cat "$f"; echo; done | grep -c "^200$")" = 20 ] && [ "$(grep -l "\"text\":\"[^\"]" "$TMP"/arr*.json | wc -l)" = 20 ]' \
    "20 requests around a restart: statuses $codes"
wait_up || bad "no executor after the third restart"
kill "$SPID"; wait "$SPID" 2>/dev/null

# ---- what cannot resume fails as before ----
# --max-resumes 0: the stream ends with the executor_failed error event at the first death
start nores "${ARGS[@]}" --max-resumes 0 || bad "server --max-resumes 0 did not start"
stream_bg "$LONG"; first_text; kill -9 "$(exec_pid)"; wait $CPID
check 'grep -q "^data: {\"error\".*executor_failed" "$TMP/stream" && ! grep -q "DONE" "$TMP/stream"' "--max-resumes 0: $(tail -c 300 "$TMP/stream")"
kill "$SPID"; wait "$SPID" 2>/dev/null

# --max-resumes 1: the first death resumes, the second fails the stream
start once "${ARGS[@]}" --max-resumes 1 || bad "server --max-resumes 1 did not start"
stream_bg "$LONG"; first_text; kill -9 "$(exec_pid)"
wait_up; n0=$(grep -o '"text"' "$TMP/stream" | wc -l)
for _ in $(seq 400); do [ "$(grep -o '"text"' "$TMP/stream" | wc -l)" -gt $((n0 + 3)) ] && break; sleep 0.01; done
kill -9 "$(exec_pid)"; wait $CPID
check 'grep -q "^data: {\"error\".*executor_failed" "$TMP/stream" && [ "$(grep -o "\"text\"" "$TMP/stream" | wc -l)" -gt $((n0 + 3)) ]' \
    "--max-resumes 1, two deaths: $(tail -c 300 "$TMP/stream")"
kill "$SPID"; wait "$SPID" 2>/dev/null

# --resume-timeout 1: the restarted executor cannot load its model (moved away): the stream fails
# after about a second; with the model back, the server serves again
cp "$MODEL" "$TMP/m.gguf"
MODEL_SAVED=$MODEL; MODEL=$TMP/m.gguf
start late "${ARGS[@]}" --resume-timeout 1 || bad "server --resume-timeout 1 did not start"
MODEL=$MODEL_SAVED
stream_bg "$LONG"; first_text; mv "$TMP/m.gguf" "$TMP/away.gguf"; t0=$(date +%s.%N); kill -9 "$(exec_pid)"; wait $CPID
t1=$(date +%s.%N)
check 'grep -q "^data: {\"error\".*executor_failed" "$TMP/stream" && python3 -c "import sys; sys.exit(not 0.9 < float(sys.argv[2]) - float(sys.argv[1]) < 5)" $t0 $t1' \
    "--resume-timeout 1: after $(python3 -c "print(round($t1 - $t0, 2))") s: $(tail -c 300 "$TMP/stream")"
mv "$TMP/away.gguf" "$TMP/m.gguf"
check 'wait_up' "the executor did not come back once its model was back"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
