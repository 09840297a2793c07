#!/usr/bin/env bash
# Long prompts on the cuda backend: the greedy continuation of one ~32k-token prompt is the same
# whether the prompt is prefilled whole (one forward pass), in chunks of several sizes, or through
# `arka serve` after a request that leaves a 20,000-token prefix in the prefix cache.
#
#   tests/gpu/longctx_check.sh OUT [N]        (N prompt tokens, default 32,000; llama3.1-8b F16, random weights)
#
# Every check prints one PASS or FAIL line; the last line is "longctx_check.sh: N passed, M failed".
# A mismatch prints the first differing position and both tokens. Binaries: .carry/bin.tar.xz and
# .carry/arka-srv.xz with .carry/debs (as tests/gpu/throughput.sh); models under $ARKA_GPU_MODELS.
set -uo pipefail
OUT=${1:?usage: longctx_check.sh OUT [N]}
N=${2:-32000}
GEN=32
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_GPU_BIN:-/tmp/arka-bin}
MODELS=${ARKA_GPU_MODELS:-/tmp/arka-models}
VOCAB=${ARKA_VOCAB:-.carry/ggml-vocab-llama-spm.gguf}
mkdir -p "$MODELS" "$BIN"
if [ ! -x "$BIN/arka" ] && [ -f .carry/bin.tar.xz ]; then tar -xJf .carry/bin.tar.xz -C "$BIN"; fi
npass=0; nfail=0
check() { if [ "$1" = 0 ]; then echo "PASS: $2"; npass=$((npass + 1)); else echo "FAIL: $2"; nfail=$((nfail + 1)); fi; }
step() { echo "== $* ($(date +%T))"; }
M="$MODELS/llama3.1-8b-f16.gguf"
[ -f "$M" ] || "$BIN/arka" mkmodel llama3.1-8b "$M" --type f16 --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel.log"
CTX=$(( (N + GEN + 255) / 256 * 256 ))
python3 -c "import random; random.seed(25); print(' '.join(str(random.randrange(1, 32000)) for _ in range($N)))" >"$OUT/ids.txt"

# first difference of two id lists (files)
cmp_ids() {
  python3 - "$1" "$2" <<'EOF'
import sys
a, b = (open(p).read().split() for p in sys.argv[1:3])
if not a or not b: print("empty output"); sys.exit(1)
for i, (x, y) in enumerate(zip(a, b)):
    if x != y: print(f"first difference at generated token {i}: {x} vs {y}"); sys.exit(1)
if len(a) != len(b): print(f"lengths {len(a)} vs {len(b)}"); sys.exit(1)
print(f"{len(a)} tokens identical")
EOF
}
gen() { # gen NAME BATCH [ARGS...]: greedy ids of the prompt, prefilled in forwards of BATCH tokens
  local name=$1 b=$2; shift 2
  local t0=$(date +%s.%N)
  timeout 240 "$BIN/arka" generate -m "$M" --backend cuda --prompt-ids "@$OUT/ids.txt" -n $GEN --temp 0 --ids --ctx $CTX \
    --batch "$b" --cuda-graph-budget-s 0 "$@" >"$OUT/gen-$name.txt" 2>"$OUT/gen-$name.err"
  echo "rc=$? $name (--batch $b $*): $(grep -o 'prefill:[^|]*' "$OUT/gen-$name.err" | head -1) $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
}
step "arka generate, llama3.1-8b F16, $N-token prompt, $GEN greedy tokens"
gen whole $(( (N + 255) / 256 * 256 ))
for b in 2048 1000 512; do
  gen c$b $b
  r=$(cmp_ids "$OUT/gen-whole.txt" "$OUT/gen-c$b.txt")
  check $? "prefilled whole = in chunks of $b: $r"
done

LIBS=/tmp/arka-debs; mkdir -p "$LIBS"
for d in .carry/debs/*.deb; do dpkg -x "$d" "$LIBS"; done
export LD_LIBRARY_PATH="$LIBS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
SRV=/tmp/arka-srv; [ -x $SRV ] || { xz -dc .carry/arka-srv.xz >$SRV && chmod +x $SRV; }
step "arka serve --ctx $CTX: the prompt after a request that caches its first 20,000 tokens"
$SRV serve --port 0 -m "$M" --backend cuda --ctx $CTX --no-auth --log-level info >"$OUT/serve.log" 2>&1 &
SP=$!
URL=""
for _ in $(seq 900); do
  URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.log" | head -1)
  [ -n "$URL" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && break
  kill -0 $SP 2>/dev/null || break
  URL=""
  sleep 0.2
done
if [ -n "$URL" ]; then
  python3 - "$URL" "$OUT" $GEN <<'EOF' >"$OUT/serve-check.txt" 2>&1
import json, sys, time, urllib.request
url, out, gen = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = [int(t) for t in open(f"{out}/ids.txt").read().split()]
with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as r:
    model = json.load(r)["data"][0]["id"]
def complete(prompt, n):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.load(r)
    c = d["choices"][0]
    cached = (d.get("usage", {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return c["text"], cached, time.time() - t0
complete(ids[:20000], 1)
t, c0, s0 = complete(ids, gen)
print(f"after a 20,000-token prefix: cached_tokens {c0}, {s0:.2f} s")
open(f"{out}/serve-cached.txt", "w").write(t)
t2, c2, s2 = complete(ids, gen)
print(f"the whole prompt again: cached_tokens {c2}, {s2:.2f} s")
open(f"{out}/serve-again.txt", "w").write(t2)
print("cached_tokens_ok", 1 if 19984 <= c0 <= 20000 and c2 >= len(ids) - 16 else 0)
EOF
  echo "rc=$?"; cat "$OUT/serve-check.txt"
  grep -q "cached_tokens_ok 1" "$OUT/serve-check.txt"; check $? "prefix cache hits: $(grep -o 'cached_tokens [0-9]*' "$OUT/serve-check.txt" | tr '\n' ' ')"
  cmp -s "$OUT/serve-cached.txt" "$OUT/serve-again.txt"; check $? "serve: the same text after a 20,000-token cached prefix and with the whole prompt cached"
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
  # the text of generate's ids, for the server's texts
  timeout 240 "$BIN/arka" generate -m "$M" --backend cuda --prompt-ids "@$OUT/ids.txt" -n $GEN --temp 0 --ctx $CTX \
    --batch 2048 --cuda-graph-budget-s 0 >"$OUT/gen-text.txt" 2>"$OUT/gen-text.err"
  cmp -s <(head -c -1 "$OUT/gen-text.txt") "$OUT/serve-cached.txt"; check $? "serve (cached prefix) = arka generate (chunks of 2048; its final newline aside)"
else
  check 1 "arka serve did not come up: $(tail -3 "$OUT/serve.log")"
  kill $SP 2>/dev/null
fi
echo "longctx_check.sh: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
