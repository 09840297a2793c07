#!/usr/bin/env bash
# FP8 weights and the FP8 KV cache on the cuda backend, on a GPU host, in parts that fit one call each:
#
#   tests/gpu/fp8.sh OUT [kernels] [e2e] [speed]     (no part named: e2e and speed)
#
#   kernels  test_gpu_kernels: every kernel against its CPU reference, the FP8 ones included (FP8 GEMV,
#            cuBLASLt FP8 GEMM and its fallback, kc_quantize_f8 bitwise, FP8 rope+store, attention on an FP8
#            cache: per-head, tensor-core prefill and decode)
#   e2e      a random-weight F16 model (arka mkmodel small): `arka perplexity` logits of the cuda backend against
#            the cpu backend for --kv-cache-dtype fp8, --quantize fp8 (steps of 8 tokens: the FP8 GEMV; steps of
#            512: the cuBLASLt GEMM, whose activations are FP8 too), and both; each also against the F16
#            model on the cpu (KL divergence, top-1 agreement: the issue's report); test_gpu_fp8 (prefix sharing
#            with an FP8 KV cache: shared blocks and kv_copy)
#   speed    llama3-8b (arka mkmodel, F16, --quantize fp8 at load): batch-1 decode (target >= 480 tok/s) and
#            256 x (1,024 + 128) with FP8 weights and the FP8 KV cache (target >= 28,000 generated tok/s), each
#            with the fraction of the bandwidth bound bench_engine measures in the same process
#
# Every check prints one PASS or FAIL line; the last line is "fp8.sh: N passed, M failed".
# Binaries: .carry/bin.tar.xz (built on the CPU machine: cmake -S . -B build-gpu -DARKA_WITH_CURL=OFF
# -DARKA_WITH_GATEWAY=OFF && cmake --build build-gpu; tar -cJf .carry/bin.tar.xz -C build-gpu/bin .) or
# $ARKA_GPU_BIN; nothing is built here. The vocabulary: .carry/ggml-vocab-llama-spm.gguf. Models go to
# $ARKA_GPU_MODELS (default /tmp/arka-models, kept between calls on one machine). Logs under OUT.
set -uo pipefail
OUT=${1:?usage: fp8.sh OUT [kernels] [e2e] [speed]}
shift
PARTS=" ${*:-e2e speed} "
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_GPU_BIN:-/tmp/arka-bin}
MODELS=${ARKA_GPU_MODELS:-/tmp/arka-models}
VOCAB=${ARKA_VOCAB:-.carry/ggml-vocab-llama-spm.gguf}
mkdir -p "$MODELS" "$BIN"
if [ ! -x "$BIN/bench_engine" ] && [ -f .carry/bin.tar.xz ]; then tar -xJf .carry/bin.tar.xz -C "$BIN"; fi
for b in arka bench_engine test_gpu_kernels test_gpu_fp8; do
  [ -x "$BIN/$b" ] || { echo "FAIL: $BIN/$b missing (carry .carry/bin.tar.xz or set ARKA_GPU_BIN)"; echo "fp8.sh: 0 passed, 1 failed"; exit 1; }
done
npass=0; nfail=0
pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
check() { # check COND-STATUS MESSAGE: 0 = pass
  if [ "$1" = 0 ]; then pass "$2"; else fail "$2"; fi
}
step() { echo "== $* ($(date +%T))"; }
want() { [[ "$PARTS" == *" $1 "* ]]; }
mk() { # mk SHAPE TYPE -> path
  local f="$MODELS/$1-$2.gguf"
  [ -f "$f" ] || "$BIN/arka" mkmodel "$1" "$f" --type "$2" --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel-$1-$2.log" ||
    { echo "mkmodel $1 $2 failed" >&2; tail -3 "$OUT/mkmodel-$1-$2.log" >&2; }
  echo "$f"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$OUT/device.txt" 2>&1
# awk comparisons: ge A B / le A B -> exit status 0 when true
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 >= b + 0) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 <= b + 0) }'; }

if want kernels; then
  step "kernels vs CPU references (FP8 included)"
  timeout 400 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
  rc=$?
  grep -E '^fp8:' "$OUT/kernels.log"
  grep -E 'FAIL' "$OUT/kernels.log" | head -20
  nf8=$(grep -cE 'FAIL.*(fp8|f8)' "$OUT/kernels.log")
  check $([ "$nf8" = 0 ] && [ $rc != 124 ] && echo 0 || echo 1) "FP8 kernel checks (test_gpu_kernels: $(tail -1 "$OUT/kernels.log"); FP8 failures: $nf8)"
  check $([ $rc = 0 ] && echo 0 || echo 1) "every kernel check (rc=$rc)"
fi

if want e2e; then
  M=$(mk small f16)
  python3 -c 'import random; random.seed(23); print(" ".join(str(random.randrange(32000)) for _ in range(1024)))' >"$OUT/ids.txt"
  P=("$BIN/arka" perplexity -m "$M" --ids "$OUT/ids.txt" --ctx 512 --chunks 2)
  kl() { # kl NAME BASE ARGS...: the cuda or cpu run's logits against BASE; prints "top1 rel kl"
    local name=$1 base=$2; shift 2
    timeout 200 "${P[@]}" --kl-divergence-base "$base" "$@" >"$OUT/ppl-$name.txt" 2>"$OUT/ppl-$name.err"
    local line; line=$(grep '^kl-divergence:' "$OUT/ppl-$name.txt")
    echo "-- $name: ${line:-(no result, see ppl-$name.err)}" >&2
    sed -n 's/.*kl-divergence: mean \([^,]*\),.*top-1 agreement: \([^ ]*\) %.*relative error of logits: mean \([^,]*\),.*/\2 \3 \1/p' <<<"$line"
  }
  save() { # save NAME ARGS...: cpu logits saved as OUT/NAME.lgt
    local name=$1; shift
    timeout 200 "${P[@]}" --backend cpu --save-logits "$OUT/$name.lgt" "$@" >"$OUT/ppl-$name.txt" 2>"$OUT/ppl-$name.err" ||
      { echo "cpu run $name failed: $(tail -2 "$OUT/ppl-$name.err")" >&2; }
  }
  step "cpu references: the F16 model, and with each FP8 option"
  save cpu-f16
  save cpu-kv --kv-cache-dtype fp8
  save cpu-w --quantize fp8
  save cpu-both --quantize fp8 --kv-cache-dtype fp8
  step "cuda vs cpu with the same options (the CPU backend emulates the GPU's FP8 rounding)"
  same() { # same NAME BASE MIN_TOP1 MAX_REL WHAT ARGS...: cuda with ARGS against the cpu's BASE
    local name=$1 base=$2 t1min=$3 relmax=$4 what=$5 t1 rel k; shift 5
    read -r t1 rel k <<<"$(kl "$name" "$OUT/$base.lgt" --backend cuda "$@")"
    check $(ge "$t1" "$t1min" && le "$rel" "$relmax" && echo 0 || echo 1) \
      "$what cuda vs cpu: top-1 ${t1:-?} %, rel err ${rel:-?}, KL ${k:-?} (top-1 >= $t1min %, rel err <= $relmax)"
  }
  same f16 cpu-f16 99 0.01 "F16 (control)"
  same w-gemv cpu-w 99 0.01 "--quantize fp8, FP8 GEMV (steps of 8 tokens)" --quantize fp8 --batch 8
  # FP8 KV: K and V come from the GPU's matmuls (f16 operands for F16 weights), ~1e-3 off the
  # CPU's, so a few percent of the codes land one FP8 step apart: a looser bound than F16's
  same kv cpu-kv 97 0.02 "--kv-cache-dtype fp8" --kv-cache-dtype fp8
  # both: the FP8 GEMV reads half activations (as the F16 GEMV does), so K and V are ~1e-3 off the
  # CPU's like the F16 model's and their codes flip as in the KV-only run (H200: top-1 96.7 %, rel
  # err 1.65e-2; with f32 activations it was 98.6 % / 5.6e-3)
  same both-gemv cpu-both 96 0.02 "both, FP8 GEMV (steps of 8 tokens)" --quantize fp8 --kv-cache-dtype fp8 --batch 8
  # the prefill over the FP8 cache runs on the wgmma kernel through F16 copies of its blocks (plan
  # att_pf_f8_fa3, the default); the mma.sync kernel reading the codes (att_pf_f8_fa3=0, where a
  # step mixes decode and prefill) uses the same dequantized values, so the KV row's bounds
  same kv-mma cpu-kv 97 0.02 "--kv-cache-dtype fp8, prefill on the mma.sync kernel (att_pf_f8_fa3=0)" --kv-cache-dtype fp8 \
    --cuda-plan att_pf_f8_fa3=0
  # 512-token steps: cuBLASLt with the activations quantized to FP8 per token while the CPU keeps
  # them f32: every product carries an FP8 activation's error (~3 % relative), and a random
  # model's flat logits turn that into top-1 changes (the CPU's own FP8 KV against F16: top-1
  # ~84 %, rel err ~6 %). Checked for gross errors here; the kernel checks hold the GEMM to
  # the CPU reference with the same activation codes (rel err 2e-5).
  same w-gemm cpu-w 0 0.15 "--quantize fp8, cuBLASLt FP8 GEMM (steps of 512)" --quantize fp8
  same both-gemm cpu-both 0 0.15 "both, cuBLASLt FP8 GEMM (steps of 512)" --quantize fp8 --kv-cache-dtype fp8
  step "cuda FP8 against the F16 model (cpu): KL divergence and top-1 agreement (report)"
  for cfg in "kv:--kv-cache-dtype fp8" "w:--quantize fp8" "both:--quantize fp8 --kv-cache-dtype fp8"; do
    name=${cfg%%:*}; args=${cfg#*:}
    # shellcheck disable=SC2086
    read -r t1 rel k <<<"$(kl "vsf16-$name" "$OUT/cpu-f16.lgt" --backend cuda $args)"
    echo "report: cuda $args vs F16 model: KL mean ${k:-?}, top-1 ${t1:-?} %, rel err ${rel:-?}"
  done
  step "prefix sharing with an FP8 KV cache (test_gpu_fp8)"
  timeout 200 "$BIN/test_gpu_fp8" "$M" >"$OUT/test_gpu_fp8.log" 2>&1
  rc=$?
  grep -vE '^ts=' "$OUT/test_gpu_fp8.log" | tail -8
  check $([ $rc = 0 ] && echo 0 || echo 1) "test_gpu_fp8 (rc=$rc): $(tail -1 "$OUT/test_gpu_fp8.log")"
  timeout 200 "$BIN/test_gpu_fp8" "$M" att_pf_f8_fa3=0 >"$OUT/test_gpu_fp8-mma.log" 2>&1
  rc=$?
  check $([ $rc = 0 ] && echo 0 || echo 1) "test_gpu_fp8 att_pf_f8_fa3=0 (rc=$rc): $(tail -1 "$OUT/test_gpu_fp8-mma.log")"
fi

if want speed; then
  M=$(mk llama3-8b f16)
  eng() { # eng NAME TARGET ARGS...: one bench_engine run; the generated tok/s against TARGET
    local name=$1 target=$2; shift 2
    timeout 280 "$BIN/bench_engine" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
    local rc=$?
    echo "-- $name (rc=$rc): $*"
    grep -E '^(model|prefill|decode|roofline)|graph replays' "$OUT/$name.txt" "$OUT/$name.err" | sed 's/^[^:]*://'
    grep -E 'weight types|KV pool|FP8|cuBLASLt' "$OUT/$name.err" | sed 's/^.*msg=//' | head -4
    local tps frac
    tps=$(sed -n 's/^decode batch.* \([0-9.]*\) generated tok\/s.*/\1/p' "$OUT/$name.txt")
    frac=$(sed -n 's/^roofline.*achieved \([0-9.]*\)%.*/\1/p' "$OUT/$name.txt")
    check $([ $rc = 0 ] && ge "$tps" "$target" && echo 0 || echo 1) \
      "$name: ${tps:-?} generated tok/s (target >= $target), ${frac:-?} % of the measured bandwidth bound"
  }
  # ARKA_FP8_PLAN: kernel-plan overrides for both runs (e.g. fp8_fast_accum=1, fp8_gemm=0)
  PLAN=(); [ -n "${ARKA_FP8_PLAN:-}" ] && PLAN=(--cuda-plan "$ARKA_FP8_PLAN")
  step "llama3-8b --quantize fp8: batch-1 decode (prompt 512, 128 generated) ${PLAN[*]}"
  eng b1-fp8 480 -m "$M" --backend cuda --quantize fp8 --prompt 512 --gen 128 --batch 1 --cuda-graph-timing "${PLAN[@]}"
  step "llama3-8b --quantize fp8 --kv-cache-dtype fp8: 256 x (1024 + 128), device sampling ${PLAN[*]}"
  eng e256-fp8 28000 -m "$M" --backend cuda --quantize fp8 --kv-cache-dtype fp8 --prompt 1024 --gen 128 --batch 256 --sample \
    --cuda-graph-timing "${PLAN[@]}"
  step "the same, greedy (the device sampler's top-p selection at T > 0 costs ~3.5 ms a step at 256 rows)"
  eng e256-fp8-greedy 28000 -m "$M" --backend cuda --quantize fp8 --kv-cache-dtype fp8 --prompt 1024 --gen 128 --batch 256 \
    --sample --temp 0 --cuda-graph-timing "${PLAN[@]}"
fi
echo "fp8.sh: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
