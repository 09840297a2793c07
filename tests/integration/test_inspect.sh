#!/usr/bin/env bash
# arka inspect: the real stories260K model reads back with its known hyper-parameters, and
# broken files (truncated at many points, empty, wrong magic, missing) fail with exit status 1
# and one line on stderr that names the file.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

out=$("$ARKA" inspect "$MODEL" 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && ok || bad "inspect stories260K exited $rc: $(cat "$TMP/err")"
for want in "architecture: llama" "dim (n_embd): 64" "layers: 5" "heads: 8" "kv heads: 4" "head dim: 8" \
            "ffn dim: 172" "vocab: 512" "tensors: 48," "tokenizer: llama" "bos=1" "eos=2"; do
    grep -qF -- "$want" <<<"$out" && ok || bad "inspect output lacks '$want'"
done
out=$("$ARKA" inspect --verbose "$MODEL" 2>/dev/null)
[ "$(grep -c '^  tensor ' <<<"$out")" -eq 48 ] && ok || bad "--verbose does not list 48 tensors"
grep -q '^  tensor token_embd.weight *F32 *\[64, 512, 1, 1\]' <<<"$out" && ok || bad "token_embd shape not [64, 512]"

# expect_fail FILE WHAT: exit status 1, exactly one stderr line, naming FILE
expect_fail() {
    "$ARKA" inspect "$1" >"$TMP/out" 2>"$TMP/err"; local rc=$?
    local lines; lines=$(wc -l <"$TMP/err")
    if [ $rc -ne 1 ]; then bad "$2: exit status $rc (want 1)"; return; fi
    if [ "$lines" -ne 1 ]; then bad "$2: $lines lines on stderr (want 1): $(cat "$TMP/err")"; return; fi
    if ! grep -qF -- "$1" "$TMP/err"; then bad "$2: message does not name the file: $(cat "$TMP/err")"; return; fi
    ok
}

size=$(stat -c %s "$MODEL")
# offsets in the header (magic, counts, first keys, the big token array, tensor infos) and the data
for n in 0 1 3 4 7 8 15 16 23 24 40 100 1000 5000 20000 50000 80000 100000 $((size / 2)) $((size - 4096)) $((size - 1)); do
    head -c "$n" "$MODEL" >"$TMP/trunc_$n.gguf"
    expect_fail "$TMP/trunc_$n.gguf" "truncated at $n"
done
head -c 4096 /dev/urandom >"$TMP/random.gguf"
expect_fail "$TMP/random.gguf" "random bytes"
{ printf 'GGUF'; printf '\x03\x00\x00\x00'; printf '\xff\xff\xff\xff\xff\xff\xff\x7f'; printf '\x00\x00\x00\x00\x00\x00\x00\x00'; } >"$TMP/absurd.gguf"
expect_fail "$TMP/absurd.gguf" "absurd tensor count"
expect_fail "$TMP/does-not-exist.gguf" "missing file"
msg=$("$ARKA" inspect "$TMP/random.gguf" 2>&1)
grep -q "bad magic" <<<"$msg" && ok || bad "random bytes: message does not say bad magic: $msg"
msg=$("$ARKA" inspect "$TMP/trunc_100000.gguf" 2>&1)
grep -q "truncated" <<<"$msg" && ok || bad "truncated file: message does not say truncated: $msg"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
