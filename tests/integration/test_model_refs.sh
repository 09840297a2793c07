#!/usr/bin/env bash
# The CPU backend against transformers: for every tests/models/<name>/ that holds reference data
# (written by tests/models/make_refs.py on a machine with PyTorch and transformers), arka's
# logits from the Hugging Face directory and from its GGUF must match transformers' float32
# logits: relative error of every position's logit row <= 1e-3 and top-1 agreement 100 %.
# Skips (exit 77) with a message while no data has been committed.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
DATA=${ARKA_MODEL_REFS:-$ROOT/tests/models}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

shopt -s nullglob
refs=("$DATA"/*/logits.bin)
if [ ${#refs[@]} -eq 0 ]; then
    echo "SKIP: no reference data under tests/models/ (run tests/models/make_refs.py OUT on a machine with transformers and commit OUT/* there)"
    exit 77
fi
for want in llama3 qwen2 qwen3 qwen3-yarn qwen3moe qwen3moe-mixed mixtral gemma2 gemma3 phi3 phi3-long; do
    [ -f "$DATA/$want/logits.bin" ] && ok || bad "reference data for $want is missing (the set is committed whole)"
done
for ref in "${refs[@]}"; do
    d=$(dirname "$ref")
    name=$(basename "$d")
    n=$(wc -w <"$d/ids.txt")
    for m in "$d" "$d/model.gguf"; do
        what="$name $( [ "$m" = "$d" ] && echo safetensors || echo gguf )"
        out=$("$ARKA" perplexity -m "$m" --ids "$d/ids.txt" --ctx "$n" --first 0 --kl-divergence-base "$ref" --threads 2 2>&1) \
            || { bad "$what: $out"; continue; }
        line=$(grep '^kl-divergence' <<<"$out")
        top1=$(sed -n 's/.*top-1 agreement: \([0-9.]*\) %.*/\1/p' <<<"$line")
        rel=$(sed -n 's/.*relative error of logits: mean [^,]*, max \([0-9.e+-]*\)$/\1/p' <<<"$line")
        echo "$what: $line"
        [ "$top1" = "100.000" ] && ok || bad "$what: top-1 agreement $top1 %"
        awk -v r="$rel" 'BEGIN { exit !(r != "" && r <= 1e-3) }' && ok || bad "$what: relative error $rel > 1e-3"
    done
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
