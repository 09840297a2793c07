#!/usr/bin/env bash
# The weight types the cuda backend keeps quantized (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
# Q6_K, and fused Q|K|V matrices that mix them as Q4_K_M / Q5_K_M files do), on a GPU host, in
# parts that fit one call each:
#
#   tests/gpu/quant_types.sh kernels OUT the layouts on the host (test_gpu_layout), every kernel
#                                        against the CPU reference (test_gpu_kernels: each type's
#                                        GEMV at 1..8 tokens, kc_gemmq and dequantize + cuBLAS at
#                                        9..512, mixed matrices)
#   tests/gpu/quant_types.sh models OUT  random models of the small shape rewritten as Q4_K_M,
#                                        Q5_K_M and each type: the start-up line `weight types`
#                                        (kept, converted, GPU bytes against the file's tensor
#                                        bytes: a Q4_K_M file must keep everything and be within
#                                        5 %), and cuda against cpu logits for the types the cpu
#                                        backend reads (Q4_K_M, Q6_K)
#   tests/gpu/quant_types.sh bench OUT   one-token GEMVs per type at llama2-7b shapes against
#                                        bandwidth, kc_gemmq's configurations per type (2..512
#                                        tokens) against the GEMV / dequantize + cuBLAS
#   tests/gpu/quant_types.sh engine OUT  llama2-7b Q4_K_M and Q6_K (random weights): the `weight
#                                        types` line, prefill 512 and decode batch 1, decode
#                                        batches 4 and 64 (bench_engine); llama.cpp's llama-bench
#                                        on the same files when /tmp/llama.cpp is built (see
#                                        throughput.sh kernels)
#
# Binaries: $ARKA_GPU_BIN (default /tmp/arka-bin), unpacked from .carry/bin.tar.xz when absent
# (built on the CPU machine: cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release
# -DARKA_WITH_CURL=OFF -DARKA_WITH_GATEWAY=OFF && cmake --build build-gpu -j2 && tar -cJf
# .carry/bin.tar.xz -C build-gpu/bin .), or built here into build-gpu when neither is there.
# Data: .carry/ggml-vocab-llama-spm.gguf and .carry/stories260K.gguf (from ../shared/models).
# Models go to $ARKA_GPU_MODELS (default /tmp/arka-models, kept between calls on one machine).
set -uo pipefail
MODE=${1:?usage: quant_types.sh kernels|models|bench|engine OUT}
OUT=${2:?usage: quant_types.sh kernels|models|bench|engine OUT}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_GPU_BIN:-/tmp/arka-bin}
MODELS=${ARKA_GPU_MODELS:-/tmp/arka-models}
VOCAB=${ARKA_VOCAB:-.carry/ggml-vocab-llama-spm.gguf}
STORIES=${ARKA_STORIES:-.carry/stories260K.gguf}
mkdir -p "$MODELS" "$BIN"
if [ ! -x "$BIN/test_gpu_kernels" ] && [ -f .carry/bin.tar.xz ]; then tar -xJf .carry/bin.tar.xz -C "$BIN"; fi
if [ ! -x "$BIN/test_gpu_kernels" ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DARKA_WITH_CURL=OFF -DARKA_WITH_GATEWAY=OFF >"$OUT/cmake.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" >>"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  BIN=build-gpu/bin
fi
fail=0
step() { echo "== $* ($(date +%T))"; }
# model SHAPE RECIPE -> path: `arka mkmodel` (random weights) in a type, or for q4_k_m / q5_k_m its
# Q8_0 model rewritten by gpu_requant
model() {
  local f="$MODELS/$1-$2.gguf" src=$2
  case $2 in q4_k_m|q5_k_m) src=q8_0 ;; esac
  local g="$MODELS/$1-$src.gguf"
  [ -f "$g" ] || "$BIN/arka" mkmodel "$1" "$g" --type "$src" --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel-$1-$src.log" ||
    echo "mkmodel $1 $src failed: $(tail -2 "$OUT/mkmodel-$1-$src.log")" >&2
  [ -f "$f" ] || "$BIN/gpu_requant" "$g" "$f" "$2" "$(nproc)" >>"$OUT/requant.log" 2>&1 || echo "requant $1 $2 failed" >&2
  echo "$f"
}
# types_line MODEL: the `weight types` start-up line of the cuda backend on MODEL
types_line() {
  "$BIN/arka" generate -m "$1" --backend cuda -p "Once upon a time" -n 4 --temp 0 --ids --cuda-graph-budget-s 0 \
    >/dev/null 2>"$OUT/gen-$(basename "$1" .gguf).log"
  grep 'msg="weight types"' "$OUT/gen-$(basename "$1" .gguf).log" | sed 's/^.*msg="weight types" //'
}

case "$MODE" in
kernels)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
  step "layouts on the host"
  "$BIN/test_gpu_layout" >"$OUT/layout.log" 2>&1 || fail=1
  tail -1 "$OUT/layout.log"; grep FAIL "$OUT/layout.log" | head -5
  step "kernels vs CPU references"
  timeout 540 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1 || fail=1
  tail -1 "$OUT/kernels.log"; grep FAIL "$OUT/kernels.log" | head -20
  ;;
models)
  step "GPU memory and types kept, small shape (12 layers, 768 wide)"
  for r in q4_k_m q5_k_m q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k; do
    f=$(model small $r)
    line=$(types_line "$f")
    echo "$r: $line"
    ratio=$(sed -n 's/.* ratio=\([0-9.]*\).*/\1/p' <<<"$line")
    conv=$(sed -n 's/.*converted_to_f16=\([^ ]*\).*/\1/p' <<<"$line")
    # Q4_K_M: everything kept, within 5 % of the file's tensor bytes; the others within 5 % too
    # unless their token table (read by kc_embed) had to be converted
    if [ -z "$ratio" ] || { [ "$r" = q4_k_m ] && [ "$conv" != none ]; } ||
       { [ "$conv" = none ] && ! awk -v x="$ratio" 'BEGIN { exit !(x <= 1.05) }'; }; then
      echo "FAIL: $r: weight types line missing, or types converted / GPU bytes over 1.05 x the file's"; fail=1
    fi
  done
  step "end to end: cuda vs cpu logits (stories260K greedy; small Q4_K_M and Q6_K, 512 positions)"
  timeout 400 "$BIN/test_gpu_e2e" "$STORIES" "$(model small q4_k_m)" "$(model small q6_k)" >"$OUT/e2e.log" 2>&1 || fail=1
  grep -v '^ts=' "$OUT/e2e.log" | tail -15
  ;;
bench)
  step "one-token GEMVs at llama2-7b shapes"
  timeout 300 "$BIN/gpu_bench_gemv" 2>&1 | grep -v '^ts=' | tee "$OUT/gemv.txt"
  step "kc_gemmq per type, 2..512 tokens"
  timeout 500 "$BIN/gpu_bench_gemmq" q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m 2>&1 | grep -v '^ts=' | tee "$OUT/gemmq.txt"
  ;;
engine)
  for r in q4_k_m q6_k; do
    f=$(model llama2-7b $r)
    step "llama2-7b $r: $(types_line "$f")"
    timeout 200 "$BIN/bench_engine" -m "$f" --backend cuda --prompt 512 --gen 128 --batch 1 --cuda-graph-timing \
      2>"$OUT/bench-$r.err" | tee "$OUT/bench-$r.txt" | grep -E '^(prefill|decode|roofline)'
    for b in 4 64; do
      timeout 120 "$BIN/bench_engine" -m "$f" --backend cuda --prompt 128 --gen 32 --batch $b 2>/dev/null | grep 'decode batch'
    done
    # the peer on the same file, when throughput.sh kernels has built llama.cpp on this machine
    LB=/tmp/llama.cpp/build/bin
    if [ -x "$LB/llama-bench" ]; then
      timeout 200 "$LB/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 2 2>&1 | tee "$OUT/llama-bench-$r.txt" | grep -E '^\|'
    fi
  done
  ;;
*) echo "usage: quant_types.sh kernels|models|bench|engine OUT"; exit 2 ;;
esac
echo "quant_types.sh $MODE: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
