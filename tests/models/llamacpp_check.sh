#!/usr/bin/env bash
# llama.cpp against transformers on the reference models (issue 20's GGUF route): every
# tests/models/<name>/model.gguf, written by make_refs.py with llama.cpp's names and keys, must
# load in llama.cpp, and llama.cpp's logits for ids.txt must match transformers' (logits.bin).
# Not part of CI: llama.cpp is not a dependency of the project. Run it by hand on the CPU:
#
#   cmake -S $LLAMA_SRC -B $LLAMA_BUILD -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
#         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF
#   cmake --build $LLAMA_BUILD -j2 --target llama
#   LLAMA_COMMIT=... tests/models/llamacpp_check.sh $LLAMA_SRC $LLAMA_BUILD
#
# It builds llamacpp_logits.c (llama.h's public API; F32 KV cache, flash attention off) against
# that build, runs it on each model and compares with logits.bin by tests/gpu/logits_cmp.py (the
# definitions of arka perplexity --kl-divergence-base): top-1 agreement, relative error
# |llama.cpp - transformers| / |transformers| of each logit row, KL(transformers || llama.cpp).
# One line per model, then a trailer, go to tests/models/check-llamacpp.txt (or $OUT).
# Exit status 1 when a model does not load (qwen3moe-mixed does not), else 0 whatever the figures:
# they are a record, not a gate.
#
# Precision: llama.cpp's CPU backend rounds the activations to F16 before every F16 matrix
# product (ggml-cpu.c: type_traits_cpu[GGML_TYPE_F16].vec_dot_type = GGML_TYPE_F16; tinyBLAS
# likewise takes F16 x F16), accumulating in F32, and computes GELU through an F16 table
# (ggml-cpu/vec.h: GGML_GELU_FP16): expect relative errors near 1e-3 here, where arka's CPU
# backend gives 1e-6 (check.txt). With the GGUFs' matrices widened to F32 (a copy outside the
# tree) llama.cpp matches to 1e-6 as well, gemma2 to 1e-4 (the GELU table).
#
# Result (llama.cpp 0.5.0, check-llamacpp.txt): every GGUF but qwen3moe-mixed loads, and
# llama3, qwen2, qwen3, qwen3-yarn, qwen3moe, mixtral and gemma2 match (top-1 100 %, relative
# error <= 3.1e-3, all from the F16 roundings above). None of the differences comes from our
# GGUF writer's names or keys; each is something llama.cpp does not model, and each was
# reproduced exactly by giving arka the same behaviour on a copy of the GGUF (then llama.cpp
# and arka agree to 1e-6 in F32):
#   qwen3moe-mixed  does not load: "check_tensor_dims: tensor 'blk.1.ffn_gate_inp.weight' not
#                   found". llama.cpp's qwen3moe requires a router in every layer
#                   (src/models/qwen3moe.cpp, ffn_gate_inp created with flags 0) and has no dense
#                   layer (mlp_only_layers); it also renormalises the top-k always (build_moe_ffn's
#                   norm_w = true) and never reads <arch>.expert_weights_norm, its own key name.
#   gemma3          top-1 100 %, relative error 2.4e-2: llama.cpp sets the attention scale to
#                   1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 27B) in
#                   src/models/gemma3.cpp load_arch_hparams and ignores gemma3.attention.scale;
#                   this model's query_pre_attn_scalar is 24, not head_dim 16. Real Gemma 3
#                   checkpoints satisfy llama.cpp's rule.
#   phi3, phi3-long top-1 54 % / 38 %: llama.cpp disables phi3's sliding window
#                   (src/models/phi3.cpp: "Phi SWA is currently disabled", n_swa = 0; PR 13676),
#                   and the window of 10 bites over 24 / 40 tokens. phi3 (24 tokens) moreover gets
#                   the long rope factors: llama.cpp picks them when the context exceeds the
#                   original 32 (llama-model.cpp get_rope_factors: n_ctx_seq > n_ctx_orig_yarn),
#                   and pads every context to a multiple of 256 (llama-context.cpp:
#                   GGML_PAD(cparams.n_ctx, 256)); transformers picks by sequence length.
# One gap in make_refs.py, with no effect here: it does not write gemma3.rope.freq_base_swa, which
# llama.cpp's converter writes from rope_local_base_freq (conversion/base.py); both llama.cpp and
# arka default to 10000, the value these models use.
set -uo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 LLAMA_SRC LLAMA_BUILD   (LLAMA_COMMIT=... names the llama.cpp version in the trailer)" >&2
    exit 2
fi
SRC=$1 BUILD=$2
DIR=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$DIR/check-llamacpp.txt}
COMMIT=${LLAMA_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)}
LIB=$(dirname "$(find "$BUILD" -name 'libllama.so' -print -quit)")
[ -n "$LIB" ] && [ "$LIB" != . ] || { echo "no libllama.so under $BUILD" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

cc -O2 -Wall -o "$TMP/llamacpp_logits" "$DIR/llamacpp_logits.c" -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$LIB" -lllama -Wl,-rpath,"$LIB" || exit 1

rc=0
: >"$OUT"
for g in "$DIR"/*/model.gguf; do
    d=$(dirname "$g")
    name=$(basename "$d")
    [ -f "$d/logits.bin" ] || continue
    if "$TMP/llamacpp_logits" "$g" "$d/ids.txt" "$TMP/$name.bin" 2 >"$TMP/$name.log" 2>&1; then
        line="$name llama.cpp: $(python3 "$DIR/../gpu/logits_cmp.py" "$TMP/$name.bin" "$d/logits.bin" 2>&1)"
    else
        line="$name llama.cpp: FAILED: $(grep -iE 'error|failed|missing|wrong' "$TMP/$name.log" | head -2 | paste -sd' ')"
        rc=1
    fi
    echo "$line" | tee -a "$OUT"
done
echo "llama.cpp $COMMIT; CPU backend (GGML_CUDA=OFF), 2 threads, one batch of all positions, F32 KV cache, no flash attention; F16 matrices multiply activations rounded to F16 (F32 accumulation), GELU from an F16 table, the rest F32. Against transformers float32 logits (logits.bin); causes of the differences: llamacpp_check.sh" | tee -a "$OUT"
exit $rc
