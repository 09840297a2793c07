#!/usr/bin/env bash
# What constrained decoding costs on the GPU: `arka serve --backend cuda` on llama3-8b F16 (arka
# mkmodel, random weights: the output is noise, but under a grammar every step computes a mask
# and samples among the allowed tokens), `arka bench serve` at 1 and 64 concurrent streams, each
# with and without a JSON schema (--response-format: a string of >= 4,000 characters, so every
# request runs to --max-tokens as the runs without one do with ignore_eos). The issue's bar:
# decode throughput under the schema >= 95 % of the plain one at both batch sizes.
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
cat >"$OUT/schema.json" <<'EOF'
{"type": "json_schema", "json_schema": {"name": "long", "strict": true, "schema": {"type": "object",
 "properties": {"text": {"type": "string", "minLength": 4000}}, "required": ["text"], "additionalProperties": false}}}
EOF
run() { # run NAME CONCURRENCY REQUESTS [--response-format FILE]
    local name=$1 c=$2 n=$3
    shift 3
    "$BIN" bench serve --url "$URL" --requests "$n" --concurrency "$c" --prompt-len 128 --max-tokens 256 --seed 1 --warmup 2 \
        --json "$OUT/$name.json" "$@" >"$OUT/$name.txt" 2>&1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get("output_throughput", d.get("summary", {}).get("output_throughput")))' \
        "$OUT/$name.json" 2>/dev/null || grep "output throughput" "$OUT/$name.txt" | awk '{print $3}'
}
for c in 1 64; do
    n=$((c == 1 ? 6 : 192))
    plain=$(run plain-c$c $c $n)
    json=$(run schema-c$c $c $n --response-format "$OUT/schema.json")
    python3 - "$c" "$plain" "$json" <<'PY'
import sys
c, p, j = sys.argv[1], float(sys.argv[2] or 0), float(sys.argv[3] or 0)
print("concurrency %s: output %.1f tok/s plain, %.1f tok/s under the JSON schema: %.1f %% (bar: >= 95 %%)" % (c, p, j, 100 * j / p if p else 0))
PY
done
curl -s "$URL/metrics" | grep -E '^arka:(generation_tokens_total|num_preemptions_total)'
