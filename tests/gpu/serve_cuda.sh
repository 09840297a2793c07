#!/usr/bin/env bash
# `arka serve --backend cuda` on a GPU host, in one go:
#   1. stories260K served by a CUDA executor and by a CPU executor: the same greedy completions
#      (200 tokens, three prompts, and a streamed chat), /health, /metrics;
#   2. `arka mkmodel llama2-7b` F16 served on the GPU: `arka bench serve` at batch 1 and with 128
#      concurrent streams, JSON reports in OUTDIR.
# The GPU host has none of the gateway's Debian libraries: libuv and cJSON come from Debian's
# .deb files carried in .carry/debs (`apt-get download libuv1 libcjson1 libhiredis0.14`), unpacked here. The
# binary: $ARKA_SERVE_BIN (default build-gpusrv/bin/arka, built on the CPU machine with
# `cmake -S . -B build-gpusrv -DARKA_WITH_CURL=OFF && cmake --build build-gpusrv --target arka`).
# Usage: tests/gpu/serve_cuda.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: serve_cuda.sh OUTDIR}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_SERVE_BIN:-build-gpusrv/bin/arka}
STORIES=.carry/models/stories260K.gguf
VOCAB=.carry/models/ggml-vocab-llama-spm.gguf
LIBS=/tmp/arka-debs
mkdir -p "$LIBS"
for d in .carry/debs/*.deb; do dpkg -x "$d" "$LIBS"; done
export LD_LIBRARY_PATH="$LIBS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fail=0
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done' EXIT

start() { # start NAME ARGS... -> URL
    local name=$1
    shift
    "$BIN" serve --port 0 --log-level warn "$@" >"$OUT/$name.log" 2>&1 &
    local pid=$!
    PIDS+=($pid)
    URL=""
    for _ in $(seq 1200); do
        URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/$name.log" | head -1)
        [ -n "$URL" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && return 0
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not come up"; tail -5 "$OUT/$name.log"; fail=1; return 1
}
complete() { # complete URL PROMPT N -> text
    curl -s "$1/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"$2\",\"max_tokens\":$3,\"temperature\":0}" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["choices"][0]["text"] if "choices" in d else d)'
}

echo "== stories260K: cuda executor vs cpu executor"
UC=; UP=
start cuda -m "$STORIES" --backend cuda --devices 0 --served-model-name m --chat-template chatml && UC=$URL
start cpu -m "$STORIES" --backend cpu --threads 4 --served-model-name m --chat-template chatml && UP=$URL
same=0
for p in "Once upon a time" "The little dog" "Lily and Ben went to the park"; do
    a=$(complete "$UC" "$p" 200); b=$(complete "$UP" "$p" 200)
    if [ "$a" = "$b" ] && [ ${#a} -gt 100 ]; then same=$((same + 1)); else echo "DIFFERENT for '$p':"; echo " cuda: ${a:0:160}"; echo " cpu:  ${b:0:160}"; fi
done
sc=$(curl -sN "$UC/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":30,"temperature":0,"stream":true}' | grep -c '^data: ')
sp=$(curl -sN "$UP/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":30,"temperature":0,"stream":true}' | sed 's/"id":"[^"]*",//; s/"created":[0-9]*,//' | md5sum)
sq=$(curl -sN "$UC/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":30,"temperature":0,"stream":true}' | sed 's/"id":"[^"]*",//; s/"created":[0-9]*,//' | md5sum)
echo "greedy completions identical: $same/3; streamed chat chunks: $sc; chat streams identical: $([ "$sp" = "$sq" ] && echo yes || echo no)"
[ $same = 3 ] && [ "$sp" = "$sq" ] || fail=1
curl -s "$UC/metrics" | grep -E '^arka:(generation_tokens_total|kv_cache_usage_perc)' 
for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait 2>/dev/null; PIDS=()

echo "== llama2-7b F16 served on the GPU"
M=/tmp/arka-models/llama2-7b-f16.gguf
mkdir -p /tmp/arka-models
[ -f $M ] || "$BIN" mkmodel llama2-7b $M --type f16 --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel.log" || { echo "mkmodel failed"; fail=1; }
if start big -m $M --backend cuda --devices 0 --served-model-name llama2-7b --max-batch 128 --max-batch-tokens 4096 ${ARKA_SERVE_CTX:+--ctx $ARKA_SERVE_CTX}; then
    steps() { # mean engine step and batch since the last call, from /metrics
        curl -s "$URL/metrics" >"$OUT/metrics-$1.txt"
        python3 - "$OUT/metrics-$1.txt" ${2:+"$OUT/metrics-$2.txt"} <<'PY'
import re, sys
def read(f):
    v = {}
    for l in open(f):
        m = re.match(r'arka:(step_time_seconds|batch_size|batch_tokens)_(sum|count)\{[^}]*\} (\S+)', l)
        if m: v[m[1] + '_' + m[2]] = float(m[3])
    return v
v = read(sys.argv[1])
if len(sys.argv) > 2:  # since the previous snapshot
    p = read(sys.argv[2])
    v = {k: v[k] - p.get(k, 0) for k in v}
n = v.get('step_time_seconds_count', 0) or 1
print("engine steps %d: mean step %.2f ms, mean batch %.1f sequences, %.1f tokens" % (n, 1e3 * v.get('step_time_seconds_sum', 0) / n,
      v.get('batch_size_sum', 0) / n, v.get('batch_tokens_sum', 0) / n))
PY
    }
    "$BIN" bench serve --url "$URL" --requests 8 --rate inf --concurrency 1 --prompt-len 512 --max-tokens 128 --seed 1 --json "$OUT/b1.json" 2>&1 | tail -9
    steps b1
    "$BIN" bench serve --url "$URL" --requests 256 --rate inf --concurrency 128 --prompt-len 128 --max-tokens 128 --seed 2 --json "$OUT/b128.json" 2>&1 | tail -9
    steps b128 b1
    curl -s "$URL/metrics" | grep -E '^arka:(generation_tokens_total|num_preemptions_total)'
fi
echo "serve_cuda.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
