#!/usr/bin/env bash
# GPU-host checks and benchmarks in one go (the GPU machine has nvcc, cmake, PyTorch and
# transformers, but none of our Debian libraries: only the executor side is used here).
#
#   tests/gpu/run.sh check OUTDIR   kernels vs CPU references, the device sampler vs the CPU sampler,
#                                   end-to-end cuda vs cpu (stories260K greedy text, random F16/Q8_0
#                                   logits), batch invariance, HF transformers cross-check,
#                                   compute-sanitizer memcheck (and racecheck of the sampler)
#   tests/gpu/run.sh bench OUTDIR   llama2-7b F16/Q8_0/Q4_0 decode and prefill, batched decode (also
#                                   with device sampling), llama3-8b F16 decode
#
# Copy the data first (../shared does not travel): mkdir -p .carry/models && cp
# ../shared/models/stories260K.gguf ../shared/models/vocab/ggml-vocab-llama-spm.gguf .carry/models/
# Binaries: $ARKA_GPU_BIN (default build-gpu/bin: built on the CPU machine with
# `cmake -S . -B build-gpu -DARKA_WITH_CURL=OFF -DARKA_WITH_GATEWAY=OFF && cmake --build build-gpu`
# and carried), or
# built here when absent. Models: stories260K from .carry/models (copied from ../shared/models,
# which does not travel), random-weight models written by `arka mkmodel` into $ARKA_GPU_MODELS.
set -uo pipefail
MODE=${1:?usage: run.sh check|bench OUTDIR}
OUT=${2:?usage: run.sh check|bench OUTDIR}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_GPU_BIN:-build-gpu/bin}
MODELS=${ARKA_GPU_MODELS:-/tmp/arka-models}
STORIES=${ARKA_STORIES:-.carry/models/stories260K.gguf}
VOCAB=${ARKA_VOCAB:-.carry/models/ggml-vocab-llama-spm.gguf}
mkdir -p "$MODELS"
if [ ! -x "$BIN/arka" ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DARKA_WITH_CURL=OFF -DARKA_WITH_GATEWAY=OFF >"$OUT/cmake.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" >>"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  BIN=build-gpu/bin
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$OUT/device.txt" 2>&1
fail=0
step() { echo "== $*"; }

mk() { # mk SHAPE TYPE -> path
  local f="$MODELS/$1-$2.gguf"
  [ -f "$f" ] || "$BIN/arka" mkmodel "$1" "$f" --type "$2" --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel-$1-$2.log" || { echo "mkmodel $1 $2 failed"; tail -3 "$OUT/mkmodel-$1-$2.log"; }
  echo "$f"
}

if [ "$MODE" = check ]; then
  step "kernels vs references"
  "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1 || fail=1
  tail -1 "$OUT/kernels.log"; grep FAIL "$OUT/kernels.log" | head -5
  step "device sampler vs CPU sampler (tokens, logprobs, backend path, timing)"
  "$BIN/test_gpu_sample" "$STORIES" >"$OUT/sample.log" 2>&1 || fail=1
  grep -E '^(device|host emulation|backend path|kc_sample|test_gpu_sample)' "$OUT/sample.log"
  grep -E 'FAIL|differs' "$OUT/sample.log" | head -5
  SF16=$(mk small f16); SQ8=$(mk small q8_0)
  step "end to end: cuda vs cpu"
  "$BIN/test_gpu_e2e" "$STORIES" "$SF16" "$SQ8" >"$OUT/e2e.log" 2>&1 || fail=1
  grep -v '^ts=' "$OUT/e2e.log" | tail -15
  step "transformers cross-check (small F16 and Q8_0, 256 positions)"
  python3 -c 'import random; random.seed(3); print(" ".join(str(random.randrange(32000)) for _ in range(256)))' >"$OUT/ids.txt"
  for m in "$SF16" "$SQ8"; do
    b=$(basename "$m" .gguf)
    "$BIN/gpu_dump_logits" "$m" cuda "$OUT/ids.txt" "/tmp/$b-cuda.f32" 2>>"$OUT/dump.log" &&
    "$BIN/gpu_dump_logits" "$m" cpu "$OUT/ids.txt" "/tmp/$b-cpu.f32" 2>>"$OUT/dump.log" &&
    python3 tests/gpu/hf_compare.py "$m" "$OUT/ids.txt" "/tmp/$b-cuda.f32" "/tmp/$b-cpu.f32" 2>&1 | grep -v Warning | tee -a "$OUT/hf.log" || fail=1
  done
  step "compute-sanitizer memcheck (stories260K end to end)"
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_gpu_e2e" "$STORIES" >"$OUT/memcheck.log" 2>&1
  rc=$?; tail -3 "$OUT/memcheck.log"; [ $rc = 0 ] || { echo "memcheck rc=$rc"; fail=1; }
  step "compute-sanitizer memcheck + racecheck (device sampler, V=257)"
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_gpu_sample" --quick >"$OUT/sample-$tool.log" 2>&1
    rc=$?; tail -2 "$OUT/sample-$tool.log"; [ $rc = 0 ] || { echo "sample $tool rc=$rc"; fail=1; }
  done
fi

if [ "$MODE" = bench ]; then
  for ty in f16 q8_0 q4_0; do
    f=$(mk llama2-7b $ty)
    step "llama2-7b $ty: prefill 512, decode 128 (batch 1)"
    "$BIN/bench_engine" -m "$f" --backend cuda --prompt 512 --gen 128 --batch 1 2>"$OUT/bench-7b-$ty.err" | tee "$OUT/bench-7b-$ty.txt"
  done
  f="$MODELS/llama2-7b-f16.gguf"
  step "llama2-7b f16: 128 sequences of 128 + 128"
  "$BIN/bench_engine" -m "$f" --backend cuda --prompt 128 --gen 128 --batch 128 2>"$OUT/bench-7b-b128.err" | tee "$OUT/bench-7b-b128.txt"
  step "llama2-7b f16: the same, every decode step sampling on the device (T=0.8, top_p=0.95)"
  "$BIN/bench_engine" -m "$f" --backend cuda --prompt 128 --gen 128 --batch 128 --sample 2>"$OUT/bench-7b-b128-sample.err" | tee "$OUT/bench-7b-b128-sample.txt"
  rm -f "$MODELS"/llama2-7b-q*.gguf
  f=$(mk llama3-8b f16)
  step "llama3-8b f16: decode batch 1"
  "$BIN/bench_engine" -m "$f" --backend cuda --prompt 512 --gen 128 --batch 1 2>"$OUT/bench-8b.err" | tee "$OUT/bench-8b.txt"
fi
echo "run.sh $MODE: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
