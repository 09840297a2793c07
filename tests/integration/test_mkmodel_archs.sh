#!/usr/bin/env bash
# arka mkmodel for the architectures beyond llama: each test shape is written (Q8_0), read back
# by arka inspect with its hyper-parameters, and generates greedily on the CPU backend,
# the same tokens twice (prefill in one piece and in chunks of 3, so chunked prefill over
# sliding windows and expert routing agree). Q4_K experts stay Q4_K.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
MODELS=$ROOT/../shared/models
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# shape, architecture line, then lines inspect must print
check() {
    local shape=$1 arch=$2; shift 2
    local f=$TMP/$shape.gguf
    if ! "$ARKA" mkmodel "$shape" "$f" --type q8_0 --seed 3 --vocab-size 2048 --vocab "$MODELS/stories260K.gguf" 2>"$TMP/mk.err"; then
        bad "mkmodel $shape: $(cat "$TMP/mk.err")"; return
    fi
    local out
    out=$("$ARKA" inspect "$f" 2>&1) || { bad "$shape: inspect failed: $out"; return; }
    for want in "architecture: $arch" "$@"; do
        grep -qF -- "$want" <<<"$out" && ok || bad "$shape: inspect lacks '$want'"
    done
    local ids="1 17 230 45 99 7 1200 640 33 5 871 12 400 401 402 3 19 21 1500 2"
    local a b
    a=$("$ARKA" generate -m "$f" --prompt-ids "$ids" --ids -n 12 --temp 0 --ctx 256 2>"$TMP/gen.err") || { bad "$shape: generate: $(cat "$TMP/gen.err")"; return; }
    b=$("$ARKA" generate -m "$f" --prompt-ids "$ids" --ids -n 12 --temp 0 --ctx 256 --batch 3 2>"$TMP/gen.err") || { bad "$shape: generate --batch 3: $(cat "$TMP/gen.err")"; return; }
    [ "$(wc -w <<<"$a")" -eq 12 ] && ok || bad "$shape: generated '$a'"
    [ "$a" = "$b" ] && ok || bad "$shape: chunked prefill gives '$b', whole prefill '$a'"
}

check qwen3-tiny qwen3 "head dim: 128" "qk norm: yes" "features beyond llama: qk-norm, head_dim apart from n_embd/n_head"
check qwen3moe-tiny qwen3moe "experts: 8, 2 per token, expert ffn 256, weights renormalised, 2 of 2 layers sparse" "qk norm: yes"
check qwen3moe-tiny512 qwen3moe "experts: 16, 4 per token, expert ffn 256, weights renormalised, 2 of 2 layers sparse" "head dim: 64"
check mixtral-tiny llama "experts: 4, 2 per token, expert ffn 512" "rope: dim 64, base 1e+06, layout adjacent-pairs"
check gemma2-tiny gemma2 "sliding window: 64 positions on 1 of 2 layers (SF)" "soft-cap: attention 50, logits 30" "embedding scale: 16" \
      "mlp: geglu (tanh gelu)" "post norms: yes" "output: tied to token_embd"
check gemma3-tiny gemma3 "sliding window: 64 positions on 5 of 6 layers (SSSSSF)" "sliding layers: base 10000, unscaled" "qk norm: yes"
check phi3-tiny phi3 "sliding window: 128 positions on 2 of 2 layers (SS)" "kv heads: 4"
check phi3-tiny96 phi3 "sliding window: 128 positions on 2 of 2 layers (SS)" "kv heads: 8" "head dim: 96" "rope: dim 96"
check llama3.1-tiny llama "scaling llama3 factor 8 low 1 high 4 original context 8192" "context (trained): 131072"

# quantized experts stay quantized: every matrix of the file is Q4_K (routers and norms F32)
if "$ARKA" mkmodel qwen3moe-tiny "$TMP/moe-q4k.gguf" --type q4_k --vocab-size 2048 --vocab "$MODELS/stories260K.gguf" 2>"$TMP/mk.err"; then
    out=$("$ARKA" inspect --verbose "$TMP/moe-q4k.gguf" 2>&1)
    grep -qE '^  tensor blk.0.ffn_gate_exps.weight +Q4_K +\[256, 256, 8, 1\]' <<<"$out" && ok || bad "q4_k experts: $(grep exps <<<"$out" | head -2)"
    grep -qE "^  Q4_K +16 tensors" <<<"$out" && ok || bad "q4_k: not 16 Q4_K tensors: $(grep -E '^  [A-Z0-9_]+ +[0-9]+ tensors' <<<"$out")"
    grep -qF "weights read per token" <<<"$out" && grep -qF "the experts a token does not use are skipped" <<<"$out" && ok || bad "q4_k: no per-token figure"
    "$ARKA" generate -m "$TMP/moe-q4k.gguf" --prompt-ids "1 2 3" --ids -n 4 --temp 0 --ctx 64 >/dev/null 2>"$TMP/gen.err" && ok || bad "q4_k moe: $(cat "$TMP/gen.err")"
else
    bad "mkmodel qwen3moe-tiny q4_k: $(cat "$TMP/mk.err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
