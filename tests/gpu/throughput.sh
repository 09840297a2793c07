#!/usr/bin/env bash
# Serving-throughput checks and benchmarks on a GPU host, in parts that fit one call each:
#
#   tests/gpu/throughput.sh sample OUT    the device sampler against the CPU sampler (test_gpu_sample)
#   tests/gpu/throughput.sh kernels OUT   attention kernels against the CPU reference (test_gpu_kernels),
#                                         the attention kernels alone (gpu_bench_attn); starts the
#                                         llama.cpp build in the background when its sources are carried
#   tests/gpu/throughput.sh engine OUT    llama3-8b F16 engine: 128 and 256 x (1,024 + 128), 64 x (8,192 + 64),
#                                         prefill 8,192 / 32,768 and decode there (batch 1), the 128 x 1,152
#                                         step's per-kernel breakdown with the tensor-core attention and without
#   tests/gpu/throughput.sh regress OUT   batch 1 of llama2-7b F16 / Q4_0 (must not regress), end to end
#                                         CUDA vs CPU (test_gpu_e2e)
#   tests/gpu/throughput.sh e2e OUT       only regress's end-to-end part (test_gpu_e2e: also embeddings, CUDA vs CPU)
#   tests/gpu/throughput.sh peer OUT      llama.cpp on the same llama3-8b GGUF (llama-bench, llama-batched-bench)
#   tests/gpu/throughput.sh gemm OUT      F16 matmuls at llama3-8b's shapes: cublasGemmEx against cublasLt's algorithms
#   tests/gpu/throughput.sh serve OUT     `arka serve --backend cuda` with default flags on llama3-8b F16: `arka bench serve`
#                                         (SERVE_ARGS adds serve options, e.g. "--quantize fp8 --kv-cache-dtype fp8";
#                                         ARKA_SERVE_POISSON= (empty) skips the Poisson run)
#                                         512 requests of ~1,000 in / 1,000 out at concurrency 256, then Poisson
#                                         arrivals at 70 % of the measured capacity (TTFT, ITL); needs the gateway
#                                         build (.carry/arka-srv: cmake -DARKA_WITH_CURL=OFF, target arka) and
#                                         .carry/debs (apt-get download libuv1 libcjson1 libhiredis0.14)
#   tests/gpu/throughput.sh workloads OUT the prefix-cache and fair-share workloads (bench/serve_workloads.sh: shared
#                                         prefix with the cache on and off, two tenants) on llama3-8b F16, cuda backend;
#                                         WORKLOADS picks them (default "shared-prefix tenants"), sizes as that script's
#   tests/gpu/throughput.sh longctx OUT   `arka serve --ctx 131072` on llama3.1-8b F16: TTFT of 8k / 32k / 127k-token
#                                         prompts (`arka bench serve`), a prompt past the context (400), and the ITL of
#                                         64 decoding streams alone and while a 120k-token prompt is prefilled beside them
#                                         (LONGCTX_PARTS picks among "ttft over itl"; LONGCTX_SERVE_ARGS adds serve options)
#   tests/gpu/throughput.sh resume OUT    tests/integration/test_resume.sh cuda (generations through executor kill -9 /
#                                         SIGSTOP on stories260K, identical to the undisturbed run)
#   tests/gpu/throughput.sh fp8refs OUT   tests/models/fp8/make_fp8_refs.py (PyTorch's float8_e4m3fn checkpoints), packed as
#                                         OUT/fp8refs.tar.gz for tests/models/fp8/
#   tests/gpu/throughput.sh refs OUT      tests/models/make_refs.py with transformers (checked by arka's CPU backend),
#                                         packed as OUT/refs.tar.gz for tests/models/
#
# Binaries: .carry/bin.tar.xz (built on the CPU machine: cmake -S . -B build-gpu -DARKA_WITH_CURL=OFF
# -DARKA_WITH_GATEWAY=OFF; tar of build-gpu/bin) or $ARKA_GPU_BIN; models: arka mkmodel into
# $ARKA_GPU_MODELS (default /tmp/arka-models, kept between calls on one machine); llama.cpp: the
# sources as .carry/llama.cpp.tar.xz, built in /tmp/llama.cpp (setsid, outlives the call).
# Every figure is printed with the copy bandwidth bench_engine measures in the same process.
set -uo pipefail
MODE=${1:?usage: throughput.sh kernels|engine|regress|peer OUT}
OUT=${2:?usage: throughput.sh kernels|engine|regress|peer OUT}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BIN=${ARKA_GPU_BIN:-/tmp/arka-bin}
MODELS=${ARKA_GPU_MODELS:-/tmp/arka-models}
mkdir -p "$MODELS" "$BIN"
if [ ! -x "$BIN/bench_engine" ] && [ -f .carry/bin.tar.xz ]; then tar -xJf .carry/bin.tar.xz -C "$BIN"; fi
VOCAB=.carry/ggml-vocab-llama-spm.gguf
step() { echo "== $* ($(date +%T))"; }
mk() { # mk SHAPE TYPE -> path
  local f="$MODELS/$1-$2.gguf"
  [ -f "$f" ] || "$BIN/arka" mkmodel "$1" "$f" --type "$2" --seed 1 --vocab "$VOCAB" >/dev/null 2>"$OUT/mkmodel-$1-$2.log" ||
    { echo "mkmodel $1 $2 failed"; tail -3 "$OUT/mkmodel-$1-$2.log"; }
  echo "$f"
}
eng() { # eng NAME ARGS...: one bench_engine run, its output kept, the figures printed
  local name=$1; shift
  timeout 300 "$BIN/bench_engine" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
  local rc=$?
  echo "-- $name (rc=$rc): $*"
  grep -E '^(prefill|decode|roofline)|step breakdown|graph replays' "$OUT/$name.txt" "$OUT/$name.err" | sed 's/^[^:]*://'
  grep -E 'msg="kernel plan"' "$OUT/$name.err" | head -1 | sed 's/^.*msg="kernel plan" //' >"$OUT/$name.plan"
  [ $rc = 0 ] || tail -5 "$OUT/$name.err"
}

case "$MODE" in
sample)
  step "device sampler vs CPU sampler"
  timeout 300 "$BIN/test_gpu_sample" .carry/stories260K.gguf >"$OUT/sample.log" 2>&1
  echo "rc=$?"; grep -E '^(device|host emulation|backend path|kc_sample|test_gpu_sample)|passed' "$OUT/sample.log" | tail -8
  grep -E 'FAIL|differs' "$OUT/sample.log" | head -5
  ;;
kernels)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"
  if [ -f .carry/llama.cpp.tar.xz ] && [ ! -d /tmp/llama.cpp ]; then
    step "llama.cpp build started in the background (12 cores)"
    tar -xJf .carry/llama.cpp.tar.xz -C /tmp
    setsid bash -c 'cd /tmp/llama.cpp && cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
      -DCMAKE_BUILD_TYPE=Release >/tmp/llama-build.log 2>&1 && cmake --build build -j12 --target llama-bench llama-batched-bench \
      >>/tmp/llama-build.log 2>&1; echo "exit $?" >>/tmp/llama-build.log' </dev/null >/dev/null 2>&1 &
  fi
  step "kernels vs CPU references"
  timeout 300 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
  echo "rc=$?: $(tail -1 "$OUT/kernels.log")"
  grep -E 'FAIL' "$OUT/kernels.log" | head -20
  step "attention kernels alone"
  timeout 200 "$BIN/gpu_bench_attn" 2>&1 | tee "$OUT/attn.txt"
  ;;
engine)
  # ARKA_ENGINE_RUNS: which of the runs below (default all)
  RUNS=" ${ARKA_ENGINE_RUNS:-e128 e128-greedy e128-ph e256 e64-8k p8k p32k prof128} "
  want() { [[ "$RUNS" == *" $1 "* ]]; }
  M=$(mk llama3-8b f16)
  step "llama3-8b F16, 128 x (1024 + 128), device sampling: tensor-core attention, greedy, then the per-head kernels"
  want e128 && eng e128 -m "$M" --backend cuda --prompt 1024 --gen 128 --batch 128 --sample --cuda-graph-timing
  want e128-greedy && eng e128-greedy -m "$M" --backend cuda --prompt 1024 --gen 128 --batch 128 --sample --temp 0 --cuda-graph-timing
  want e128-ph && eng e128-ph -m "$M" --backend cuda --prompt 1024 --gen 128 --batch 128 --sample --cuda-graph-timing --cuda-plan att_tc=0
  step "256 x (1024 + 128)"
  want e256 && eng e256 -m "$M" --backend cuda --prompt 1024 --gen 128 --batch 256 --sample --cuda-graph-timing
  want e256-greedy && eng e256-greedy -m "$M" --backend cuda --prompt 1024 --gen 128 --batch 256 --sample --temp 0 --cuda-graph-timing
  step "64 x (8192 + 64)"
  want e64-8k && eng e64-8k -m "$M" --backend cuda --prompt 8192 --gen 64 --batch 64 --sample --cuda-graph-timing
  step "batch 1: prefill 8192 and 32768, decode there"
  want p8k && eng p8k -m "$M" --backend cuda --prompt 8192 --gen 64 --batch 1 --cuda-graph-timing
  want p8k-w8 && eng p8k-w8 -m "$M" --backend cuda --prompt 8192 --gen 16 --batch 1 --cuda-plan att_pf_warps=8
  want p32k && eng p32k -m "$M" --backend cuda --prompt 32768 --gen 64 --batch 1 --cuda-graph-timing --reps 2
  want p32k-w8 && eng p32k-w8 -m "$M" --backend cuda --prompt 32768 --gen 64 --batch 1 --cuda-graph-timing --reps 2 --cuda-plan att_pf_warps=8
  step "per-kernel breakdown of the 128 x 1,152 step (eager, events per launch), after and before"
  want prof128 && eng prof128 -m "$M" --backend cuda --prompt 1024 --gen 12 --batch 128 --sample --cuda-profile
  want prof128-ph && eng prof128-ph -m "$M" --backend cuda --prompt 1024 --gen 12 --batch 128 --sample --cuda-profile --cuda-plan att_tc=0
  ;;
regress|e2e)
  [ "$MODE" = e2e ] || for ty in f16 q4_0; do
    M=$(mk llama2-7b $ty)
    step "llama2-7b $ty batch 1 (prompt 512, 128 generated)"
    eng b1-$ty -m "$M" --backend cuda --prompt 512 --gen 128 --batch 1 --cuda-graph-timing
    eng b1-$ty-ph -m "$M" --backend cuda --prompt 512 --gen 128 --batch 1 --cuda-graph-timing --cuda-plan att_tc_min_tok=9
  done
  step "end to end: cuda vs cpu (stories260K greedy, small F16 / Q8_0 logits, batch invariance)"
  SF16=$(mk small f16); SQ8=$(mk small q8_0)
  timeout 300 "$BIN/test_gpu_e2e" .carry/stories260K.gguf "$SF16" "$SQ8" >"$OUT/e2e.log" 2>&1
  echo "rc=$?"; grep -v '^ts=' "$OUT/e2e.log" | tail -15
  ;;
serve|workloads|resume|longctx)
  LIBS=/tmp/arka-debs; mkdir -p "$LIBS"
  for d in .carry/debs/*.deb; do dpkg -x "$d" "$LIBS"; done
  export LD_LIBRARY_PATH="$LIBS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  SRV=/tmp/arka-srv; [ -x $SRV ] || { xz -dc .carry/arka-srv.xz >$SRV && chmod +x $SRV; }
  srv() { # srv ARGS...: `arka serve --port 0 ARGS` logging to OUT/serve.log; SP, and URL once /health is 200 (3 min)
    $SRV serve --port 0 "$@" >"$OUT/serve.log" 2>&1 &
    SP=$!
    URL=""
    for _ in $(seq 900); do
      URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.log" | head -1)
      [ -n "$URL" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && return
      kill -0 $SP 2>/dev/null || break
      sleep 0.2
    done
    URL=""
  }
  if [ "$MODE" = resume ]; then
    step "resume after executor kill -9 / SIGSTOP, cuda backend, stories260K"
    ARKA_BIN=$SRV ARKA_RESUME_MODEL=.carry/stories260K.gguf timeout 400 bash tests/integration/test_resume.sh cuda \
      >"$OUT/resume.log" 2>&1; echo "rc=$?"; tail -15 "$OUT/resume.log"
    exit 0
  fi
  if [ "$MODE" = longctx ]; then
    M=$(mk llama3.1-8b f16)
    step "arka serve --ctx 131072, llama3.1-8b F16"
    # no prefix cache: the load generator's prompts of one seed share their first words
    # shellcheck disable=SC2086
    srv -m "$M" --backend cuda --ctx 131072 --no-prefix-cache --no-auth --log-level info ${LONGCTX_SERVE_ARGS:-}
    grep -E 'kernel plan|KV pool|KV cache|graphs captured|listening' "$OUT/serve.log" | sed 's/^ts=[^ ]* //' | cut -c1-300
    bs() { timeout 300 $SRV bench serve --url "$URL" --seed 1 "$@"; }
    PARTS=${LONGCTX_PARTS:-ttft over itl}
    case " $PARTS " in *" ttft "*) ;; *) false ;; esac && for L in 8000 32000 127000; do
      step "TTFT, one prompt of $L words at a time"
      bs --requests 2 --concurrency 1 --prompt-len $L --max-tokens 8 --json "$OUT/ttft-$L.json" >"$OUT/ttft-$L.txt" 2>&1
      echo "rc=$?"; grep -E '^requests|^TTFT|prompt tokens' "$OUT/ttft-$L.txt"
    done
    case " $PARTS " in *" over "*)
      step "a prompt past the context"
      bs --requests 1 --concurrency 1 --prompt-len 140000 --max-tokens 8 >"$OUT/over.txt" 2>&1; grep -E '^requests|first error|failed' "$OUT/over.txt" | head -3
    ;; esac
    case " $PARTS " in *" itl "*)
      step "64 streams decoding alone, then beside a 120k-token prompt"
      bs --requests 64 --concurrency 64 --prompt-len 128 --max-tokens 1500 --json "$OUT/itl-alone.json" >"$OUT/itl-alone.txt" 2>&1
      grep -E '^ITL|^TPOT|duration' "$OUT/itl-alone.txt"
      bs --requests 64 --concurrency 64 --prompt-len 128 --max-tokens 1500 --json "$OUT/itl-beside.json" >"$OUT/itl-beside.txt" 2>&1 &
      AP=$!
      sleep 4
      bs --requests 1 --concurrency 1 --prompt-len 120000 --max-tokens 4 >"$OUT/long-beside.txt" 2>&1
      wait $AP
      grep -E '^ITL|^TPOT|duration' "$OUT/itl-beside.txt"; grep -E '^TTFT' "$OUT/long-beside.txt"
      python3 -c "
import json; a=json.load(open('$OUT/itl-alone.json'))['itl_ms']; b=json.load(open('$OUT/itl-beside.json'))['itl_ms']
print('ITL p99 of 64 streams: alone %.2f ms, beside the 120k prompt %.2f ms: %.2fx (target <= 2x); p50 %.2f -> %.2f' % (a['p99'], b['p99'], b['p99'] / a['p99'], a['p50'], b['p50']))"
    ;; esac
    kill $SP 2>/dev/null; wait $SP 2>/dev/null
    exit 0
  fi
  if [ "$MODE" = workloads ]; then
    M=$(mk llama3-8b f16)
    step "prefix cache and fair share workloads, llama3-8b F16, cuda"
    # shellcheck disable=SC2086
    ARKA=$SRV timeout 560 bash bench/serve_workloads.sh "$OUT/workloads" "$M" ${WORKLOADS:-shared-prefix tenants} -- --backend cuda
    echo "rc=$?"
    exit 0
  fi
  M=$(mk llama3-8b f16)
  step "arka serve --backend cuda -m llama3-8b-f16 (default flags) ${SERVE_ARGS:-}"
  # shellcheck disable=SC2086
  srv -m "$M" --backend cuda --no-auth --log-level info ${SERVE_ARGS:-}
  grep -E 'kernel plan|KV pool|graphs captured|listening' "$OUT/serve.log" | sed 's/^ts=[^ ]* //' | cut -c1-400
  if [ -n "$URL" ]; then
    step "512 requests, ~1000 in / 1000 out, concurrency 256"
    timeout 420 $SRV bench serve --url "$URL" --requests 512 --concurrency 256 --rate 0 --prompt-len 1000 --max-tokens 1000 \
      --json "$OUT/serve-c256.json" >"$OUT/serve-c256.txt" 2>&1; echo "rc=$?"; cat "$OUT/serve-c256.txt"
    cap=$(python3 -c "import json; d=json.load(open('$OUT/serve-c256.json')); print(d['output_throughput'] if 'output_throughput' in d else d.get('output_tok_s', 0))" 2>/dev/null)
    rate=$(python3 -c "print(round(0.7 * float('${cap:-0}') / 1000, 2))" 2>/dev/null)
    if [ -n "${ARKA_SERVE_POISSON-1}" ] && python3 -c "import sys; sys.exit(0 if float('${rate:-0}') > 0 else 1)"; then
      step "Poisson arrivals at $rate req/s (70 % of $cap output tok/s), 200 requests"
      timeout 300 $SRV bench serve --url "$URL" --requests 200 --rate "$rate" --prompt-len 1000 --max-tokens 1000 \
        --json "$OUT/serve-poisson.json" >"$OUT/serve-poisson.txt" 2>&1; echo "rc=$?"; cat "$OUT/serve-poisson.txt"
    fi
  fi
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
  ;;
fp8refs)
  PYTHONUNBUFFERED=1 timeout 300 python3 tests/models/fp8/make_fp8_refs.py /tmp/fp8refs >"$OUT/fp8refs.log" 2>&1
  echo "make_fp8_refs rc=$?"; tail -12 "$OUT/fp8refs.log"
  tar czf "$OUT/fp8refs.tar.gz" -C /tmp/fp8refs . && ls -la "$OUT/fp8refs.tar.gz"
  ;;
refs)
  PYTHONUNBUFFERED=1 timeout 400 python3 tests/models/make_refs.py /tmp/refs --check "$BIN/arka" >"$OUT/refs.log" 2>&1
  echo "make_refs rc=$?"; tail -15 "$OUT/refs.log"; cat /tmp/refs/check.txt 2>/dev/null
  tar czf "$OUT/refs.tar.gz" -C /tmp/refs . && ls -la "$OUT/refs.tar.gz"
  ;;
gemm)
  timeout 240 "$BIN/gpu_bench_gemm" 2>&1 | tee "$OUT/gemm.txt"
  ;;
peer)
  M=$(mk llama3-8b f16)
  tail -3 /tmp/llama-build.log
  LB=/tmp/llama.cpp/build/bin
  if [ -x "$LB/llama-bench" ]; then
    step "llama.cpp llama-bench: prefill 8192 / 32768 (-ub 2048), decode 128, -fa 1"
    timeout 240 "$LB/llama-bench" -m "$M" -ngl 99 -fa 1 -ub 2048 -p 8192,32768 -n 128 -r 2 2>&1 | tee "$OUT/llama-bench.txt" | grep -E '^\|'
    step "llama.cpp llama-batched-bench: 128 and 256 x (1024 + 128)"
    timeout 240 "$LB/llama-batched-bench" -m "$M" -ngl 99 -fa 1 -c 300000 -b 2048 -ub 512 -npp 1024 -ntg 128 -npl 128,256 2>&1 |
      tee "$OUT/llama-batched.txt" | grep -E '^\|'
  else echo "llama.cpp not built (yet)"; fi
  ;;
esac
