#!/usr/bin/env bash
# arka mkmodel: tiny random models of each --type are valid GGUF for our reader (arka inspect)
# and for an independent one (the npm package @huggingface/gguf, installed into a cache outside
# the repository); metadata keys/values and tensor infos agree between the two. Also: the same
# seed gives the same bytes, the vocabulary is padded with <extra_N> user-defined tokens when the
# shape needs more tokens than the vocab file has, and bad arguments are refused.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
MODELS=$ROOT/../shared/models
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

NPM_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm
HAVE_NODE=0
if command -v npm >/dev/null && command -v node >/dev/null; then
    if [ ! -d "$NPM_DIR/node_modules/@huggingface/gguf" ]; then
        mkdir -p "$NPM_DIR"
        npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error @huggingface/gguf@0.4.6 >&2 \
            || bad "npm install @huggingface/gguf failed"
    fi
    [ -d "$NPM_DIR/node_modules/@huggingface/gguf" ] && HAVE_NODE=1
else
    echo "NOTICE: npm/node not available: skipping the @huggingface/gguf cross-check"
fi

# Canonical listing from @huggingface/gguf: "kv KEY VALUE" (arrays as [n]) and
# "tensor NAME TYPE ne0 ne1 ne2 ne3".
cat >"$TMP/list.mjs" <<'JS'
import { createRequire } from "module";
const require = createRequire(process.env.NPM_DIR + "/node_modules/");
const { gguf } = require("@huggingface/gguf");
const types = { 0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16" };
const r = await gguf(process.argv[2], { allowLocalFile: true });
for (const [k, v] of Object.entries(r.metadata)) {
  if (k === "version" || k === "tensor_count" || k === "kv_count") continue;
  console.log("kv", k, Array.isArray(v) ? `[${v.length}]` : String(v));
}
for (const t of r.tensorInfos) {
  const ne = t.shape.map(Number); while (ne.length < 4) ne.push(1);
  console.log("tensor", t.name, types[t.dtype] ?? `type${t.dtype}`, ...ne);
}
console.log("count", r.tensorInfos.length, r.metadata.kv_count);
const tok = r.metadata["tokenizer.ggml.tokens"], tt = r.metadata["tokenizer.ggml.token_type"];
if (process.argv[3]) { const i = Number(process.argv[3]); console.log("token", i, tok[i], tt[i], tok.length); }
JS

# Same listing from `arka inspect --verbose`.
arka_list() {
    "$ARKA" inspect --verbose "$1" | awk '
        /^  tensor / { gsub(/[\[\],]/, " "); print "tensor", $2, $3, $4, $5, $6, $7 }
        /^  kv /     { sub(/:$/, "", $2); print "kvkey", $2 }'
}

check_model() { # FILE TYPE VOCAB_SIZE
    local f=$1 type=$2 nv=$3 out
    out=$("$ARKA" inspect "$f" 2>&1) || { bad "$type: arka inspect failed: $out"; return; }
    for want in "dim (n_embd): 256" "layers: 2" "heads: 4" "kv heads: 2" "ffn dim: 512" "vocab: $nv" \
                "tensors: 21," "tokenizer: llama" "bos=1" "rope: dim 64, base 10000"; do
        grep -qF -- "$want" <<<"$out" && ok || bad "$type: inspect lacks '$want'"
    done
    local T=${type^^}
    if [ "$type" = f32 ]; then
        grep -qE "^  F32 +21 tensors" <<<"$out" && ok || bad "f32: not 21 F32 tensors"
    else
        grep -qE "^  $T +16 tensors" <<<"$out" && ok || bad "$type: not 16 tensors of $T"
        grep -qE "^  F32 +5 tensors" <<<"$out" && ok || bad "$type: norms are not 5 F32 tensors"
    fi
    [ $HAVE_NODE -eq 1 ] || return
    if ! NPM_DIR=$NPM_DIR node "$TMP/list.mjs" "$f" >"$TMP/hf.txt" 2>"$TMP/hf.err"; then
        bad "$type: @huggingface/gguf could not read the file: $(head -3 "$TMP/hf.err")"; return
    fi
    arka_list "$f" >"$TMP/arka.txt"
    diff <(grep '^tensor' "$TMP/hf.txt") <(grep '^tensor' "$TMP/arka.txt") >"$TMP/diff" \
        && ok || bad "$type: tensor infos differ between @huggingface/gguf and arka: $(head -5 "$TMP/diff")"
    diff <(awk '/^kv /{print $2}' "$TMP/hf.txt") <(awk '/^kvkey /{print $2}' "$TMP/arka.txt") >"$TMP/diff" \
        && ok || bad "$type: metadata keys differ: $(head -5 "$TMP/diff")"
    grep -q "^count 21 " "$TMP/hf.txt" && ok || bad "$type: @huggingface/gguf counts $(grep ^count "$TMP/hf.txt")"
    local ft; case $type in f32) ft=0;; f16) ft=1;; q4_0) ft=2;; q8_0) ft=7;; q4_k) ft=14;; bf16) ft=32;; esac
    for kv in "general.architecture llama" "llama.embedding_length 256" "llama.block_count 2" \
              "llama.feed_forward_length 512" "llama.attention.head_count 4" "llama.attention.head_count_kv 2" \
              "llama.rope.dimension_count 64" "llama.rope.freq_base 10000" "llama.vocab_size $nv" \
              "llama.context_length 2048" "general.alignment 32" "general.file_type $ft" \
              "tokenizer.ggml.model llama" "tokenizer.ggml.tokens [$nv]" "tokenizer.ggml.scores [$nv]"; do
        grep -qxF "kv $kv" "$TMP/hf.txt" && ok || bad "$type: @huggingface/gguf does not see '$kv'"
    done
}

# The cheap types at the full tiny shape with the Llama 2 vocabulary; Q4_K's reference quantizer
# is slow in the sanitizer build, so it gets a 2048-token vocabulary (stories260K's, padded).
for type in f32 f16 bf16 q8_0 q4_0 q4_k; do
    args=() nv=32000
    [ $type = q4_k ] && args=(--vocab-size 2048 --vocab "$MODELS/stories260K.gguf") nv=2048
    if "$ARKA" mkmodel tiny "$TMP/tiny-$type.gguf" --type "$type" --seed 7 "${args[@]}" 2>"$TMP/mk.err"; then
        ok
        check_model "$TMP/tiny-$type.gguf" "$type" $nv
    else
        bad "mkmodel tiny --type $type: $(cat "$TMP/mk.err")"
    fi
done
[ ! -e "$TMP/tiny-q8_0.gguf.part" ] && ok || bad "the .part file was left behind"

# Same seed: same bytes, whatever the thread count. Other seed: other weights.
"$ARKA" mkmodel tiny "$TMP/again.gguf" --type q8_0 --seed 7 --threads 1 2>/dev/null
cmp -s "$TMP/again.gguf" "$TMP/tiny-q8_0.gguf" && ok || bad "same seed, one thread: different file"
"$ARKA" mkmodel tiny "$TMP/other.gguf" --type q8_0 --seed 8 2>/dev/null
cmp -s "$TMP/other.gguf" "$TMP/tiny-q8_0.gguf" && bad "different seeds gave the same file" || ok

# Vocabulary padding: stories260K has 512 tokens; the tiny shape needs 32000.
if "$ARKA" mkmodel tiny "$TMP/padded.gguf" --type q4_0 --vocab "$MODELS/stories260K.gguf" 2>"$TMP/mk.err"; then
    grep -q "padded to 32000" "$TMP/mk.err" && ok || bad "no notice about the padding: $(cat "$TMP/mk.err")"
    out=$("$ARKA" inspect "$TMP/padded.gguf" 2>&1)
    grep -qF "vocab: 32000" <<<"$out" && grep -qF "32000 tokens" <<<"$out" && ok || bad "padded model: $out"
    if [ $HAVE_NODE -eq 1 ]; then
        NPM_DIR=$NPM_DIR node "$TMP/list.mjs" "$TMP/padded.gguf" 512 >"$TMP/hf.txt" 2>&1
        grep -qx "token 512 <extra_0> 4 32000" "$TMP/hf.txt" && ok || bad "token 512 is not <extra_0> USER_DEFINED: $(grep ^token "$TMP/hf.txt")"
        grep -qx "kv tokenizer.ggml.scores \[32000\]" "$TMP/hf.txt" && ok || bad "scores not padded"
    fi
else
    bad "mkmodel with a small vocab: $(cat "$TMP/mk.err")"
fi
# A vocab larger than the shape's is refused. --vocab none writes no tokenizer.
"$ARKA" mkmodel tiny "$TMP/x.gguf" --vocab "$MODELS/vocab/ggml-vocab-gpt-2.gguf" 2>"$TMP/mk.err"
[ $? -eq 1 ] && grep -q "more than the shape" "$TMP/mk.err" && ok || bad "a 50257-token vocab for a 32000 shape was not refused"
[ ! -e "$TMP/x.gguf" ] && [ ! -e "$TMP/x.gguf.part" ] && ok || bad "a failed mkmodel left a file"
"$ARKA" mkmodel tiny "$TMP/novocab.gguf" --type q8_0 --vocab none 2>/dev/null && \
    "$ARKA" inspect "$TMP/novocab.gguf" 2>&1 | grep -F "vocab: 32000" >/dev/null && ok || bad "--vocab none"

# Usage errors exit 2.
"$ARKA" mkmodel nosuchshape "$TMP/y.gguf" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "unknown shape not a usage error"
"$ARKA" mkmodel tiny "$TMP/y.gguf" --type q2_k >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "unsupported type not a usage error"
"$ARKA" mkmodel tiny "$TMP/y.gguf" --vocab-size -5 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "negative --vocab-size not a usage error"
"$ARKA" mkmodel tiny "$TMP/y.gguf" --vocab-size 1000 2>"$TMP/mk.err"
[ $? -eq 1 ] && grep -q "more than the shape" "$TMP/mk.err" && ok || bad "--vocab-size below the vocab file's tokens was not refused"
"$ARKA" mkmodel tiny >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "missing OUT not a usage error"
"$ARKA" mkmodel tiny /nonexistent-dir/z.gguf --type q8_0 2>"$TMP/mk.err"
[ $? -eq 1 ] && grep -q "nonexistent-dir" "$TMP/mk.err" && ok || bad "unwritable path: $(cat "$TMP/mk.err")"

# --threads 0 means all CPUs (the config file's default), like the other commands.
"$ARKA" mkmodel tiny "$TMP/t0.gguf" --type q8_0 --seed 7 --threads 0 2>"$TMP/mk.err" && cmp -s "$TMP/t0.gguf" "$TMP/tiny-q8_0.gguf" \
    && ok || bad "--threads 0: $(cat "$TMP/mk.err")"

# --help is not an error (stdout, exit 0), for mkmodel and inspect alike.
out=$("$ARKA" mkmodel --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] && grep -q "^usage: arka mkmodel" <<<"$out" && grep -q "tinyllama-1.1b" <<<"$out" && ok || bad "mkmodel --help: exit $rc"
out=$("$ARKA" inspect --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] && grep -q "^usage: arka inspect" <<<"$out" && ok || bad "inspect --help: exit $rc"
"$ARKA" inspect >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "inspect without FILE not a usage error"

# The default vocabulary is found from the project root, not the current directory: $ARKA_ROOT,
# else two levels above the binary's directory (ROOT/build/bin/arka). A root without it gets an
# error naming the path tried.
ARKA_ABS=$(realpath "$ARKA")
if [ "$(dirname "$(dirname "$(dirname "$ARKA_ABS")")")" = "$(realpath "$ROOT")" ]; then
    (cd "$TMP" && env -u ARKA_ROOT "$ARKA_ABS" mkmodel tiny def.gguf --type q8_0 --seed 7 2>"$TMP/mk.err") \
        && cmp -s "$TMP/def.gguf" "$TMP/tiny-q8_0.gguf" && ok || bad "default vocab from the binary's location: $(cat "$TMP/mk.err")"
else
    echo "NOTICE: $ARKA is not ROOT/<build>/bin/arka: skipping the binary-location default"
fi
(cd "$TMP" && ARKA_ROOT="$ROOT" "$ARKA_ABS" mkmodel tiny def2.gguf --type q8_0 --seed 7 2>"$TMP/mk.err") \
    && cmp -s "$TMP/def2.gguf" "$TMP/tiny-q8_0.gguf" && ok || bad "default vocab from ARKA_ROOT: $(cat "$TMP/mk.err")"
ARKA_ROOT=$TMP/noroot "$ARKA" mkmodel tiny "$TMP/nr.gguf" 2>"$TMP/mk.err"
[ $? -eq 1 ] && [ "$(wc -l <"$TMP/mk.err")" -eq 1 ] && grep -qF "$TMP/noroot/../shared/models/vocab/ggml-vocab-llama-spm.gguf" "$TMP/mk.err" \
    && ok || bad "a root without the vocab: $(cat "$TMP/mk.err")"
[ ! -e "$TMP/nr.gguf" ] && [ ! -e "$TMP/nr.gguf.part" ] && ok || bad "a missing default vocab left a file"

# Long (ARKA_LONG_TESTS=1): the TinyLlama 1.1B shape at Q8_0 (~1.1 GiB on disk) has its shape.
if [ "${ARKA_LONG_TESTS:-0}" = 1 ]; then
    "$ARKA" mkmodel tinyllama-1.1b "$TMP/tl.gguf" --type q8_0 2>"$TMP/mk.err" || bad "mkmodel tinyllama-1.1b: $(cat "$TMP/mk.err")"
    out=$("$ARKA" inspect "$TMP/tl.gguf" 2>&1)
    for want in "dim (n_embd): 2048" "layers: 22" "heads: 32" "kv heads: 4" "ffn dim: 5632" "vocab: 32000"; do
        grep -qxF -- "$want" <<<"$out" && ok || bad "tinyllama-1.1b: inspect lacks the line '$want'"
    done
    grep -qE "^  Q8_0 +156 tensors" <<<"$out" && ok || bad "tinyllama-1.1b: not 156 Q8_0 tensors: $out"
    rm -f "$TMP/tl.gguf"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
