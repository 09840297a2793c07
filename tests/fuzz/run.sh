#!/usr/bin/env bash
# One libFuzzer target's run, as a ctest test of the fuzz build (CMakeLists.txt, ARKA_FUZZ):
# 30 s by default, 300 s with ARKA_LONG_TESTS=1 (ARKA_FUZZ_SECONDS overrides both), from a corpus
# kept in OUTDIR/NAME between runs (fuzz_gguf's seeded with the small models of tests/models/);
# an input that crashes is written to OUTDIR/crashes/ and fails the test.
# Usage: tests/fuzz/run.sh FUZZ_BINARY OUTDIR   (from the repository root)
set -uo pipefail
BIN=${1:?usage: run.sh FUZZ_BINARY OUTDIR}
OUT=${2:?usage: run.sh FUZZ_BINARY OUTDIR}
name=$(basename "$BIN")
secs=30
[ "${ARKA_LONG_TESTS:-0}" = 1 ] && secs=300
secs=${ARKA_FUZZ_SECONDS:-$secs}
mkdir -p "$OUT/$name" "$OUT/crashes"
case $name in
fuzz_gguf) len=400000
    for m in tests/models/*/model.gguf; do [ -f "$m" ] && cp -n "$m" "$OUT/$name/seed-$(basename "$(dirname "$m")").gguf"; done ;;
fuzz_ws) len=16384 ;;
fuzz_http) len=8192 ;;
*) len=4096 ;;
esac
"$BIN" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -max_len=$len -print_final_stats=1 \
    -artifact_prefix="$OUT/crashes/$name-" "$OUT/$name" >"$OUT/$name.log" 2>&1
rc=$?
grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)" "$OUT/$name.log" | tr '\n' ' '
echo
if [ $rc != 0 ]; then
    tail -40 "$OUT/$name.log"
    echo "FAIL: $name exited $rc; the input is in $OUT/crashes/"
    exit 1
fi
echo "$name: $secs s without a finding"
