#!/usr/bin/env bash
# The prefix-cache and fair-share workloads of `arka bench serve` against `arka serve`, each with
# the prefix cache on and off (--no-prefix-cache), one server at a time; JSON reports in OUT.
#
#   bench/serve_workloads.sh OUT MODEL [WHICH...] [-- SERVE ARGS...]
#
# WHICH: shared-prefix multi-turn tenants (default all three). SERVE ARGS go to `arka serve`
# (e.g. --backend cuda, --threads 2, --ctx 4096). Sizes come from the environment (defaults for a
# GPU; RESULTS.md gives the CPU ones): CONC (64), N (512), MAXTOK (128), PREFIX (2000), PROMPT
# (200), USERS (64), TURNS (4), TURN_PREFIX (500), A_N (2000), B_INTERVAL (0.5), B_N (20).
# ARKA (build/bin/arka) is the binary. Prints each run's summary; exits 1 when a run failed.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,11p' "$0"; exit 2; }
OUT=$1 MODEL=$2
shift 2
WHICH=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do WHICH+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
SERVE_ARGS=("$@")
[ ${#WHICH[@]} -gt 0 ] || WHICH=(shared-prefix multi-turn tenants)
ARKA=${ARKA:-build/bin/arka}
CONC=${CONC:-64} N=${N:-512} MAXTOK=${MAXTOK:-128} PREFIX=${PREFIX:-2000} PROMPT=${PROMPT:-200}
USERS=${USERS:-64} TURNS=${TURNS:-4} TURN_PREFIX=${TURN_PREFIX:-500}
A_N=${A_N:-2000} B_INTERVAL=${B_INTERVAL:-0.5} B_N=${B_N:-20}
PORT=${PORT:-18771}
mkdir -p "$OUT"
SPID=
cleanup() { [ -n "$SPID" ] && kill "$SPID" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT

# serve NAME ARGS...: a server on PORT with ARGS, waits for /health (10 min: CUDA graphs)
serve() {
    local name=$1; shift
    "$ARKA" serve -m "$MODEL" --port "$PORT" --log-level warn "${SERVE_ARGS[@]}" "$@" >"$OUT/$name.serve.log" 2>&1 &
    SPID=$!
    for _ in $(seq 6000); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && return 0
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not come up:"; tail -20 "$OUT/$name.serve.log"; return 1
}
stop() { kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; SPID=; }

rc=0
bench() { # NAME ARGS...
    local name=$1; shift
    echo "== $name: $*"
    "$ARKA" bench serve --url "http://127.0.0.1:$PORT" --seed 1 --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1 || rc=1
    grep -E "requests|cached tokens|duration|output throughput|^TTFT|^ITL|^E2E|tenant B|first error" "$OUT/$name.txt"
    curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/$name.metrics"
}

for w in "${WHICH[@]}"; do
    for mode in on off; do
        flags=(); [ $mode = off ] && flags=(--no-prefix-cache)
        case $w in
        shared-prefix)
            serve "$w-$mode" "${flags[@]}" || { rc=1; continue; }
            bench "$w-$mode" --workload shared-prefix --prefix-len "$PREFIX" --prompt-len "$PROMPT" --requests "$N" \
                --concurrency "$CONC" --max-tokens "$MAXTOK" ;;
        multi-turn)
            serve "$w-$mode" "${flags[@]}" || { rc=1; continue; }
            bench "$w-$mode" --workload multi-turn --users "$USERS" --turns "$TURNS" --prefix-len "$TURN_PREFIX" \
                --prompt-len "$PROMPT" --max-tokens "$MAXTOK" ;;
        tenants)
            [ $mode = off ] && continue # fair share does not depend on the cache
            rm -f "$OUT/keys.conf" "$OUT/keys.conf.secret"
            KA=$("$ARKA" keys create --tenant a --rpm 0 --tpm 0 --concurrency 0 --keys-file "$OUT/keys.conf" 2>/dev/null)
            KB=$("$ARKA" keys create --tenant b --rpm 0 --tpm 0 --concurrency 0 --keys-file "$OUT/keys.conf" 2>/dev/null)
            serve "$w" --keys-file "$OUT/keys.conf" || { rc=1; continue; }
            bench "$w" --workload tenants --api-key "$KA" --api-key-b "$KB" --requests "$A_N" --prompt-len 128 \
                --max-tokens "$MAXTOK" --b-interval "$B_INTERVAL" --b-requests "$B_N" ;;
        *) echo "unknown workload $w"; rc=1 ;;
        esac
        stop
    done
done
# the ratios the issue asks for
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
for w in ("shared-prefix", "multi-turn"):
    on, off = load(w + "-on"), load(w + "-off")
    if on and off and on["ttft_ms"] and off["ttft_ms"]:
        print("%s: TTFT p50 %.1f ms with the cache, %.1f without: %.2fx lower; output throughput %.1f vs %.1f tok/s: %.2fx; "
              "cached %.1f of %.1f prompt tokens" % (w, on["ttft_ms"]["p50"], off["ttft_ms"]["p50"],
              off["ttft_ms"]["p50"] / on["ttft_ms"]["p50"], on["output_throughput"], off["output_throughput"],
              on["output_throughput"] / off["output_throughput"], on["mean_cached_tokens"] or 0, on["mean_prompt_tokens"] or 0))
t = load("tenants")
if t and "b_ttft_ratio" in t:
    print("tenants: B's TTFT beside A / alone: p50 %.2fx, p99 %.2fx (B alone p99 %.1f ms, beside A p99 %.1f ms)" % (
        t["b_ttft_ratio"]["p50"], t["b_ttft_ratio"]["p99"], t["b_alone"]["ttft_ms"]["p99"], t["b_beside_a"]["ttft_ms"]["p99"]))
EOF
exit $rc
