#!/usr/bin/env bash
# The cuda engine options where CI runs, without a GPU: --gpu-memory-fraction (share of device
# memory, in (0, 1]) and --cuda-graph-budget-s (seconds >= 0). Out-of-range values are one-line
# usage errors naming the flag (exit 2) on generate, executor and serve, from the command line,
# the environment and a config file; the cpu backend takes valid values and produces the same
# tokens; serve hands both to its executors. What the cuda backend does with them (pool
# sizing, start-up errors, the capture budget) is checked on the GPU host: tests/gpu/run.sh check.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
unset ARKA_CONFIG ARKA_GPU_MEMORY_FRACTION ARKA_CUDA_GRAPH_BUDGET_S
cd "$ROOT"

# usage_err FLAG CMD ARGS...: exit 2, one line on stderr, naming FLAG.
usage_err() {
    local flag=$1; shift
    "$BIN" "$@" >/dev/null 2>"$TMP/e" </dev/null
    local rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] && grep -q -- "$flag" "$TMP/e"; then ok
    else bad "arka $*: exit $rc, stderr: $(cat "$TMP/e")"; fi
}

cmds=("generate -m $MODEL -p hi" "executor --shm fd:0:0:0 -m $MODEL")
"$BIN" --help >"$TMP/cmds" 2>&1
grep -q "^  serve" "$TMP/cmds" && cmds+=("serve -m $MODEL --port 0")
for c in "${cmds[@]}"; do
    # shellcheck disable=SC2086
    {
        usage_err --gpu-memory-fraction $c --gpu-memory-fraction 0
        usage_err --gpu-memory-fraction $c --gpu-memory-fraction 1.01
        usage_err --gpu-memory-fraction $c --gpu-memory-fraction -0.5
        usage_err --gpu-memory-fraction $c --gpu-memory-fraction nan
        usage_err --cuda-graph-budget-s $c --cuda-graph-budget-s -1
        ARKA_GPU_MEMORY_FRACTION=2 usage_err --gpu-memory-fraction $c
        printf 'cuda-graph-budget-s = -3\n' >"$TMP/neg.conf"
        usage_err --cuda-graph-budget-s $c --config "$TMP/neg.conf"
    }
    "$BIN" ${c%% *} --help >"$TMP/h" 2>&1
    grep -q -- "--gpu-memory-fraction .*default 0.90" "$TMP/h" && ok || bad "arka ${c%% *} --help lacks --gpu-memory-fraction"
    grep -q -- "--cuda-graph-budget-s .*default 60" "$TMP/h" && ok || bad "arka ${c%% *} --help lacks --cuda-graph-budget-s"
done

# The cpu backend takes the options, at their bounds too, and decodes exactly as without them.
ref=$("$BIN" generate -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --ids 2>/dev/null)
[ "$(wc -w <<<"$ref")" -eq 40 ] && ok || bad "reference run: $ref"
for v in "--gpu-memory-fraction 1 --cuda-graph-budget-s 0" "--gpu-memory-fraction 0.0001 --cuda-graph-budget-s 0.5"; do
    # shellcheck disable=SC2086
    out=$("$BIN" generate -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --ids $v 2>"$TMP/e")
    [ "$out" = "$ref" ] && ok || bad "cpu with $v: $out $(cat "$TMP/e")"
done

# serve passes both options on to each executor it spawns.
if grep -q "^  serve" "$TMP/cmds"; then
    command -v curl >/dev/null || { echo "curl missing"; exit 77; }
    . "$ROOT/tests/integration/serve_lib.sh"
    if start fwd --gpu-memory-fraction 0.42 --cuda-graph-budget-s 7; then
        ex=$(pgrep -P "$SPID" | head -1)
        args=$(tr '\0' ' ' <"/proc/$ex/cmdline" 2>/dev/null)
        grep -q -- "executor .*--gpu-memory-fraction 0.42 .*--cuda-graph-budget-s 7" <<<"$args" && ok \
            || bad "executor arguments lack the cuda options: $args"
        kill "$SPID"; wait "$SPID" 2>/dev/null
    else bad "serve with the cuda options did not start"; fi
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
