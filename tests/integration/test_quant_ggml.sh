#!/usr/bin/env bash
# Reference quantization (model/quant.c) against ggml itself, byte for byte: ggml's prebuilt
# libggml-base.so comes from the npm package @node-llama-cpp/linux-x64 (installed into a cache
# outside the repository); tests/integration/quant_vs_ggml.c loads it with dlopen and compares
# quantize_row_*_ref / dequantize_row_* with dt_quantize / dt_dequantize for every type.
# Skips (exit 77, "SKIP", reported as skipped by ctest) off Linux x86_64 or without npm.
set -euo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-ggml
PKG=@node-llama-cpp/linux-x64@3.22.1

if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
    echo "SKIP: the prebuilt ggml used as reference is for Linux x86_64 only"
    exit 77
fi
if ! command -v npm >/dev/null; then
    echo "SKIP: npm is not installed; cannot fetch the ggml reference library"
    exit 77
fi
LIB=$CACHE/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so
if [ ! -f "$LIB" ]; then
    mkdir -p "$CACHE"
    npm install --prefix "$CACHE" --no-audit --no-fund --loglevel=error "$PKG" >&2
fi
[ -f "$LIB" ] || { echo "FAIL: $LIB not found after npm install"; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
${CC:-cc} -O2 -I"$ROOT" -o "$TMP/quant_vs_ggml" "$ROOT/tests/integration/quant_vs_ggml.c" \
    "$ROOT/model/quant.c" "$ROOT/model/dtype.c" "$ROOT/common/cm_err.c" -ldl -lm
"$TMP/quant_vs_ggml" "$LIB"
