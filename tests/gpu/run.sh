#!/usr/bin/env bash
# GPU-host checks and benchmarks in one go (the GPU machine has nvcc, cmake, PyTorch and
# transformers, but none of our Debian libraries: only the executor side is used here).
#
#   tests/gpu/run.sh check OUTDIR   kernels vs CPU references, the device sampler vs the CPU sampler,
#                                   end-to-end cuda vs cpu (stories260K greedy text, random F16/Q8_0
#                                   logits, decode steps of 6 and 12 sequences, also Q4_K), batch
#                                   invariance (also of a Q4_K_M MoE), HF transformers
#                                   cross-check, KV pool
#                                   sizing from --gpu-memory-fraction and its start-up errors, the
#                                   graph capture budget, a device fault inside a step (the process
#                                   ends naming the call, file and line), compute-sanitizer
#                                   memcheck (and racecheck of the sampler)
#   tests/gpu/run.sh bench OUTDIR   one-token GEMVs against bandwidth, the quantized tensor-core
#                                   matmul's configurations, llama2-7b F16/Q8_0/Q4_0/Q4_K
#                                   decode (with the device time per graph replay) and prefill with
#                                   the in-graph cost of each stage, quantized batches 2..128, batched
#                                   decode (also with device sampling), llama3-8b F16 decode
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
  # decode steps of 6 and 12 sequences against the CPU (also inside the e2e run above for F16 and
  # Q8_0): a Q4_K model's matrices past the integer GEMV, wo reading the decode attention's int8 blocks
  SQ4K=$(mk small q4_k)
  step "decode steps of 6 and 12 sequences: cuda vs cpu (small Q4_K)"
  "$BIN/test_gpu_e2e" --decode-batches "$SQ4K" >"$OUT/e2e-batches.log" 2>&1 || fail=1
  grep -a -v '^ts=' "$OUT/e2e-batches.log" | grep -a -E 'decode steps of|FAIL|passed' | tail -4
  # a MoE's decode steps alone (the fused one-token MoE launches) and together (the grouped
  # ones) must give the same bits; its shared prefill is held to the MoE bounds (routing
  # near-ties: test_batch_invariance)
  SMOE=$(mk qwen3moe-tiny512 q4_k_m)
  step "batch invariance of a MoE model (qwen3moe-tiny512 Q4_K_M: one-token steps take the fused MoE launches)"
  "$BIN/test_gpu_e2e" --invariance "$SMOE" >"$OUT/e2e-moe.log" 2>&1 || fail=1
  grep -a -v '^ts=' "$OUT/e2e-moe.log" | grep -a -E 'decode steps|one prefill|FAIL|passed' | tail -6
  step "transformers cross-check (small F16 and Q8_0, 256 positions)"
  python3 -c 'import random; random.seed(3); print(" ".join(str(random.randrange(32000)) for _ in range(256)))' >"$OUT/ids.txt"
  for m in "$SF16" "$SQ8"; do
    b=$(basename "$m" .gguf)
    "$BIN/gpu_dump_logits" "$m" cuda "$OUT/ids.txt" "/tmp/$b-cuda.f32" 2>>"$OUT/dump.log" &&
    "$BIN/gpu_dump_logits" "$m" cpu "$OUT/ids.txt" "/tmp/$b-cpu.f32" 2>>"$OUT/dump.log" &&
    python3 tests/gpu/hf_compare.py "$m" "$OUT/ids.txt" "/tmp/$b-cuda.f32" "/tmp/$b-cpu.f32" 2>&1 | grep -v Warning | tee -a "$OUT/hf.log" || fail=1
  done
  step "KV pool from --gpu-memory-fraction, start-up errors, graph capture budget (stories260K, arka generate)"
  G=("$BIN/arka" generate -m "$STORIES" --backend cuda -p "Once upon a time" -n 24 --temp 0 --ids)
  # (a) fraction 0.5: the pool line, its budget = 0.5 x total - in use at start - weights - workspaces
  # (to the logged 2 decimals), the pool within it, and at least one 2048-position sequence
  "${G[@]}" --gpu-memory-fraction 0.5 >"$OUT/frac-05.out" 2>"$OUT/frac-05.log"; rc=$?
  line=$(grep 'msg="KV pool"' "$OUT/frac-05.log")
  echo "fraction 0.5 (rc=$rc): ${line#*msg=}"
  kv=() ; for k in fraction total_gib in_use_at_start_gib weights_gib workspaces_gib budget_gib kv_gib blocks; do
    kv+=("$(sed -n "s/.* $k=\([^ ]*\).*/\1/p" <<<"$line")"); done
  if [ $rc = 0 ] && [ "$(wc -w <"$OUT/frac-05.out")" = 24 ] && grep -q "sizing=fraction fraction=0.50 " <<<"$line" &&
     awk -v f="${kv[0]}" -v t="${kv[1]}" -v u="${kv[2]}" -v w="${kv[3]}" -v a="${kv[4]}" -v b="${kv[5]}" -v k="${kv[6]}" -v n="${kv[7]}" \
       'BEGIN { d = f * t - u - w - a - b; exit !(d < 0.05 && d > -0.05 && k <= b + 0.001 && n >= 128) }'; then :
  else echo "FAIL: --gpu-memory-fraction 0.5: no consistent KV pool line"; tail -5 "$OUT/frac-05.log"; fail=1; fi
  # (b) a fraction spent before the pool: one clear start-up error, a clean non-zero exit
  "${G[@]}" --gpu-memory-fraction 0.0001 >"$OUT/frac-tiny.out" 2>"$OUT/frac-tiny.log"; rc=$?
  echo "fraction 0.0001 (rc=$rc): $(grep -v '^ts=' "$OUT/frac-tiny.log" | head -2)"
  if [ $rc != 0 ] && [ $rc -lt 128 ] && grep -q "gpu-memory-fraction 0.0001 .*leaves .*GiB for the KV pool.*raise --gpu-memory-fraction or lower --ctx" "$OUT/frac-tiny.log" &&
     ! grep -q 'msg="KV pool"' "$OUT/frac-tiny.log" && [ ! -s "$OUT/frac-tiny.out" ]; then :
  else echo "FAIL: --gpu-memory-fraction 0.0001 did not fail at start-up with the expected error"; fail=1; fi
  # (c) an exact pool larger than the device: needed vs free GiB, the flag to change
  "${G[@]}" --kv-cache-mb 10000000 >"$OUT/kv-huge.out" 2>"$OUT/kv-huge.log"; rc=$?
  echo "kv-cache-mb 10000000 (rc=$rc): $(grep -v '^ts=' "$OUT/kv-huge.log" | head -2)"
  if [ $rc != 0 ] && [ $rc -lt 128 ] && grep -q "the KV pool of [0-9]* blocks needs [0-9.]* GiB, [0-9.]* GiB free on device .*lower --kv-cache-mb" "$OUT/kv-huge.log"; then :
  else echo "FAIL: --kv-cache-mb 10000000 did not fail at start-up with the expected error"; fail=1; fi
  # (d) graphs: all captured by default; none with budget 0; a budget spent at once leaves every
  # bucket to the eager path; the tokens are the same every way
  "${G[@]}" --cuda-graph-budget-s 0 >"$OUT/graphs-0.out" 2>"$OUT/graphs-0.log"
  "${G[@]}" --cuda-graph-budget-s 0.000001 >"$OUT/graphs-tiny.out" 2>"$OUT/graphs-tiny.log"
  grep -h "decode graph" "$OUT/frac-05.log" "$OUT/graphs-0.log" "$OUT/graphs-tiny.log" | sed 's/^ts=[^ ]* //'
  if grep -q 'msg="decode graphs captured" graphs=[1-9]' "$OUT/frac-05.log" &&
     grep -q 'msg="decode graphs off.*reason="--cuda-graph-budget-s 0"' "$OUT/graphs-0.log" &&
     grep -q 'msg="decode graph budget spent.*skipped=[1-9]' "$OUT/graphs-tiny.log" &&
     [ -s "$OUT/frac-05.out" ] && cmp -s "$OUT/frac-05.out" "$OUT/graphs-0.out" && cmp -s "$OUT/frac-05.out" "$OUT/graphs-tiny.out"; then :
  else echo "FAIL: --cuda-graph-budget-s: graphs not captured/skipped as asked, or the tokens differ"; fail=1; fi
  # (e) a CUDA error inside a step (a trapping kernel injected at step 3): the process ends at
  # the next synchronizing call, its log naming the call, the error, file and line
  "${G[@]}" --cuda-fault-at-step 3 >"$OUT/fault.out" 2>"$OUT/fault.log"; rc=$?
  line=$(grep 'msg="CUDA call failed"' "$OUT/fault.log" | sed 's/^ts=[^ ]* //')
  echo "fault at step 3 (rc=$rc): $line"
  if [ $rc != 0 ] && grep -q 'msg="injecting a device fault' "$OUT/fault.log" &&
     grep -Eq 'msg="CUDA call failed" call="[^"]+" err="[^"]+" file=[^ ]*backend_cuda.c line=[0-9]+' <<<"$line"; then :
  else echo "FAIL: a device fault did not end the process with the failing call, file and line"; fail=1; fi
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
  step "one-token GEMVs at llama2-7b shapes against bandwidth"
  "$BIN/gpu_bench_gemv" 2>&1 | grep -v '^ts=' | tee "$OUT/gemv.txt"
  step "quantized weights x 2..512 tokens: kc_gemmq's tile configurations against the GEMV / dequantize + cuBLAS"
  "$BIN/gpu_bench_gemmq" 2>&1 | grep -v '^ts=' | tee "$OUT/gemmq.txt"
  for ty in f16 q8_0 q4_0 q4_k; do
    f=$(mk llama2-7b $ty)
    step "llama2-7b $ty: prefill 512, decode 128 (batch 1)"
    "$BIN/bench_engine" -m "$f" --backend cuda --prompt 512 --gen 128 --batch 1 --cuda-graph-timing 2>"$OUT/bench-7b-$ty.err" | tee "$OUT/bench-7b-$ty.txt"
    grep 'graph replays' "$OUT/bench-7b-$ty.err" # device time per step: the rest of the wall time is the host's
    if [ $ty != f16 ]; then
      # quantized batched decode (integer GEMV up to 8 sequences, kc_gemmq above) and a 128-token prefill
      step "llama2-7b $ty: decode batches 2..128 (prompt 128, 32 generated), prefill 128"
      for b in 2 4 8 16 64 128; do
        echo "$("$BIN/bench_engine" -m "$f" --backend cuda --prompt 128 --gen 32 --batch $b 2>/dev/null | grep 'decode batch')"
      done
      "$BIN/bench_engine" -m "$f" --backend cuda --prompt 128 --gen 2 --batch 1 2>/dev/null | grep '^prefill'
      rm -f "$f"
    fi
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
