#!/usr/bin/env bash
# FP8 checkpoints built by PyTorch (torch.float8_e4m3fn codes and scales in the layouts of
# llm-compressor, FBGEMM and AutoFP8 / transformers' fp8) against PyTorch's logits of the same
# dequantized network: for every tests/models/fp8/<layout>/ holding reference data (written by
# tests/models/fp8/make_fp8_refs.py on a machine with PyTorch and committed), arka's CPU logits
# must match: relative error of every position's logit row <= 1e-3, top-1 agreement 100 %.
# ARKA_FP8_BACKEND=cuda (on a GPU host, tests/gpu): the cuda backend's logits in forwards of 8
# tokens (its FP8 GEMV, which sums half activations as the F16 one does), within the GPU's bounds
# against a reference: relative error <= 1e-2, top-1 >= 99 %. (Longer forwards take cuBLASLt's FP8
# GEMM, whose activations are FP8 codes too: ~0.1-0.3 relative error on these tiny models, H200.)
# Skips (exit 77) with a message while no data has been committed.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
BACKEND=${ARKA_FP8_BACKEND:-cpu}
if [ "$BACKEND" = cpu ]; then TOP1_MIN=100; REL_MAX=1e-3; BATCH=512; else TOP1_MIN=99; REL_MAX=1e-2; BATCH=8; fi
DATA=${ARKA_FP8_REFS:-$ROOT/tests/models/fp8}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

shopt -s nullglob
refs=("$DATA"/*/logits.bin)
if [ ${#refs[@]} -eq 0 ]; then
    echo "SKIP: no FP8 reference data under tests/models/fp8/ (run tests/models/fp8/make_fp8_refs.py OUT on a machine with PyTorch and commit OUT/* there)"
    exit 77
fi
for want in ct-channel ct-tensor fbgemm autofp8 scale-inv qwen3 mixtral phi3; do
    [ -f "$DATA/$want/logits.bin" ] && ok || bad "reference data for $want is missing (the set is committed whole)"
done
for ref in "${refs[@]}"; do
    d=$(dirname "$ref")
    name=$(basename "$d")
    n=$(wc -w <"$d/ids.txt")
    out=$("$ARKA" perplexity -m "$d" --ids "$d/ids.txt" --ctx "$n" --first 0 --kl-divergence-base "$ref" --threads 2 --backend "$BACKEND" --batch "$BATCH" 2>&1) \
        || { bad "$name: $out"; continue; }
    line=$(grep '^kl-divergence' <<<"$out")
    top1=$(sed -n 's/.*top-1 agreement: \([0-9.]*\) %.*/\1/p' <<<"$line")
    rel=$(sed -n 's/.*relative error of logits: mean [^,]*, max \([0-9.e+-]*\)$/\1/p' <<<"$line")
    echo "$name: $line"
    awk -v t="$top1" -v m="$TOP1_MIN" 'BEGIN { exit !(t != "" && t + 0 >= m) }' && ok || bad "$name: top-1 agreement $top1 % < $TOP1_MIN %"
    awk -v r="$rel" -v m="$REL_MAX" 'BEGIN { exit !(r != "" && r <= m) }' && ok || bad "$name: relative error $rel > $REL_MAX"
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
