#!/usr/bin/env bash
# What constrained decoding costs on the GPU: `arka serve --backend cuda` on llama3-8b F16 (arka
# mkmodel, random weights: the output is noise, but under a grammar every step computes a mask
# and samples among the allowed tokens), `arka bench serve` at 1 and 64 concurrent streams, each
# with and without a JSON schema (--response-format; the two schemas are described below). The
# issue's bar: decode throughput under the schema >= 95 % of the plain one at both batch sizes,
# compared here as the mean time per output token (TPOT), since outputs under a schema may end
# before --max-tokens.
#
# The CUDA backend applies the masks in its device sampler (EX_SAMPLE_CAP_MASK): each step
# uploads the masked rows' bitmasks with the sampling rows (the executor computes the masks on
# its step thread, as on the CPU backend).
#
# Setup as tests/gpu/serve_cuda.sh: the gateway binary $ARKA_SERVE_BIN (default
# build-gpusrv/bin/arka), Debian's libuv/cJSON .debs in .carry/debs, the vocabulary
# .carry/models/ggml-vocab-llama-spm.gguf. Usage: tests/gpu/structured_bench.sh OUTDIR
# Prints the output throughputs and the ratios; OUTDIR gets the bench JSON reports.
set -uo pipefail
OUT=${1:?usage: structured_bench.sh OUTDIR}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_SERVE_BIN:-build-gpusrv/bin/arka}
VOCAB=.carry/models/ggml-vocab-llama-spm.gguf
[ -f $VOCAB ] || VOCAB=.carry/ggml-vocab-llama-spm.gguf
LIBS=/tmp/arka-debs
mkdir -p "$LIBS"
for d in .carry/debs/*.deb; do dpkg -x "$d" "$LIBS"; done
export LD_LIBRARY_PATH="$LIBS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null' EXIT

M=/tmp/arka-models/llama3-8b-f16.gguf
mkdir -p /tmp/arka-models
[ -f $M ] || "$BIN" mkmodel llama3-8b $M --type f16 --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel.log" ||
    { echo "mkmodel failed: $(tail -3 "$OUT/mkmodel.log")"; exit 1; }
"$BIN" serve --port 0 --log-level warn -m $M --backend cuda --devices 0 --served-model-name m --max-batch 128 >"$OUT/serve.log" 2>&1 &
PID=$!
URL=
for _ in $(seq 1800); do
    URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.log" | head -1)
    [ -n "$URL" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && break
    kill -0 $PID 2>/dev/null || { echo "server died: $(tail -5 "$OUT/serve.log")"; exit 1; }
    sleep 0.1
done
# Two schemas. "integers": an object holding an array of integers, with no bounds: the parse
# state repeats (inside a number, between numbers), so after the first tokens every mask is a
# cache hit, as in most structured outputs (records, tool arguments); a noise model rarely draws
# the closing bracket, so requests run long. "long-string": a string of at least 4,000
# characters: every character position is a new grammar position whose tokens are classified
# the first time a request reaches it (the worst case: the bounded repetition is unrolled).
cat >"$OUT/integers.json" <<'EOF'
{"type": "json_schema", "json_schema": {"name": "ints", "strict": true, "schema": {"type": "object",
 "properties": {"values": {"type": "array", "items": {"type": "integer"}}}, "required": ["values"], "additionalProperties": false}}}
EOF
cat >"$OUT/long-string.json" <<'EOF'
{"type": "json_schema", "json_schema": {"name": "long", "strict": true, "schema": {"type": "object",
 "properties": {"text": {"type": "string", "minLength": 4000}}, "required": ["text"], "additionalProperties": false}}}
EOF
run() { # run NAME CONCURRENCY REQUESTS [--response-format FILE]: prints "output_tok_s tpot_mean_ms mean_output_tokens"
    local name=$1 c=$2 n=$3
    shift 3
    "$BIN" bench serve --url "$URL" --requests "$n" --concurrency "$c" --prompt-len 128 --max-tokens 256 --seed 1 --warmup 2 \
        --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["output_throughput"], d["tpot_ms"]["mean"], d["total_output_tokens"] / max(1, d["completed"]))' \
        "$OUT/$name.json" 2>/dev/null || echo "0 0 0"
}
for c in 1 64; do
    n=$((c == 1 ? 6 : 192))
    plain=$(run plain-c$c $c $n)
    for sc in integers long-string; do
        json=$(run $sc-c$c $c $n --response-format "$OUT/$sc.json")
        # shellcheck disable=SC2086
        python3 - "$c" "$sc" $plain $json <<'PY'
import sys
c, sc = sys.argv[1], sys.argv[2]
p, pt, pn, j, jt, jn = map(float, sys.argv[3:9])
print("concurrency %s, %-11s: output %.1f tok/s plain (TPOT %.2f ms, %.0f tokens a request), %.1f tok/s under the schema "
      "(TPOT %.2f ms, %.0f tokens a request): decode speed (1/TPOT) %.1f %% of plain (bar: >= 95 %%)"
      % (c, sc, p, pt, pn, j, jt, jn, 100 * pt / jt if jt else 0))
PY
    done
done
curl -s "$URL/metrics" | grep -E '^arka:(generation_tokens_total|num_preemptions_total)'
