#!/usr/bin/env bash
# arka tokenize on the Llama SPM vocabulary: the default "id piece" lines, --ids, BOS by default
# and --no-bos, text from an argument, -f FILE and stdin, --parse-special, --split; ids equal
# llama.cpp's for the vocabulary's test cases (.inp/.out) and --decode gives the texts back;
# invalid UTF-8, bad ids and a missing model get a one-line error and a non-zero exit.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
V=$ROOT/../shared/models/vocab/ggml-vocab-llama-spm.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if [ "$1" = "$2" ]; then ok; else bad "$3"; echo "  got:      $(printf %q "$1" | head -c 400)"; echo "  expected: $(printf %q "$2" | head -c 400)"; fi; }
tok() { "$ARKA" tokenize -m "$V" "$@"; }

# Default output: one "id piece" line per token, BOS first (the vocabulary asks for it).
out=$(tok "Hello world" 2>"$TMP/e")
check "$?" 0 "tokenize exit status"
check "$out" "$(printf '     1 "<s>"\n 15043 " Hello"\n  3186 " world"')" "default id-and-piece output"
check "$(tok --ids "Hello world")" "1 15043 3186" "--ids"
check "$(tok --ids --no-bos "Hello world")" "15043 3186" "--no-bos"
check "$(tok --no-bos "Hello world" | wc -l | tr -d ' ')" 2 "--no-bos: two lines"
# pieces that are not printable come out escaped; the output stays one token per line
check "$(tok --no-bos "$(printf 'a\tb')")" "$(printf '   263 " a"\n    12 "\\t"\n 29890 "b"')" "escaped pieces"

# Text from -f FILE and from stdin: the bytes as they are (here with the trailing newline).
printf 'Hello world\n' >"$TMP/in.txt"
check "$(tok --ids -f "$TMP/in.txt")" "1 15043 3186 13" "-f FILE"
check "$(printf 'Hello world\n' | tok --ids)" "1 15043 3186 13" "stdin"
check "$(tok --ids </dev/null)" "1" "empty stdin: BOS only"

# --parse-special: "<s>" and "</s>" in the text are the special tokens only when asked.
check "$(tok --ids --parse-special "<s>hi</s>")" "1 1 7251 2" "--parse-special"
check "$(tok --ids "<s>hi</s>")" "1 529 29879 29958 2918 829 29879 29958" "special text is plain text by default"

# llama.cpp's ids for the vocabulary's test inputs (no BOS), every case through --split, and two
# cases on their own through -f (leading space, digits and a non-ASCII character; an emoji).
# Then --decode gives every input back (decode(encode(x)) == x: this vocabulary is lossless on them).
SEP=$'\n__ggml_vocab_test__\n'
tok --no-bos --split "$SEP" -f "$V.inp" >"$TMP/all.out" 2>"$TMP/e"
check "$?" 0 "--split over the test inputs"
n_ref=$(wc -l <"$V.out")
[ "$n_ref" -ge 40 ] && ok || bad "only $n_ref reference lines"
diff <(head -n "$n_ref" "$TMP/all.out" | sed 's/^\(.\)/ \1/') "$V.out" >"$TMP/diff" && ok \
    || bad "ids differ from $V.out: $(head -6 "$TMP/diff")"
python3 - "$V.inp" "$TMP" <<'PY'
import sys
cases = open(sys.argv[1], 'rb').read().split(b'\n__ggml_vocab_test__\n')
for i in (1, 17):
    open(f"{sys.argv[2]}/case{i}.txt", 'wb').write(cases[i - 1])
PY
for i in 1 17; do
    want=$(sed -n "${i}p" "$V.out" | sed 's/^ //')
    check "$(tok --ids --no-bos -f "$TMP/case$i.txt")" "$want" "test case $i ($(head -c 40 "$TMP/case$i.txt"))"
    check "$(tok --ids -f "$TMP/case$i.txt")" "1 $want" "test case $i with BOS"
done

tok --decode --split "$SEP" -f "$TMP/all.out" >"$TMP/all.dec" 2>"$TMP/e"
check "$?" 0 "--decode of the test inputs' ids"
cmp -s "$TMP/all.dec" "$V.inp" && ok || bad "decode(encode(x)) != x on $V.inp: $(cmp "$TMP/all.dec" "$V.inp" 2>&1)"
check "$(tok --decode "1 15043 3186")" "<s>Hello world" "--decode: BOS as its text, the space prefix dropped"
check "$(printf '15043 3186\n\n29871 243 162 169 156\n' | tok --decode)" "$(printf 'Hello world\n\n\xf0\x9f\xa6\x99')" \
    "--decode: one text per input line, byte pieces joined into one character"
check "$(tok --decode "243 162")" "$(printf '\xef\xbf\xbd')" "--decode: a cut UTF-8 sequence becomes U+FFFD"

# Errors: one line, non-zero exit, nothing on stdout.
expect_err() { # pattern, args...
    local pat=$1; shift
    "$ARKA" tokenize "$@" >"$TMP/o" 2>"$TMP/e" <"$TMP/stdin"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -gt 128 ]; then bad "exit $rc for: $*"; return; fi
    [ "$(wc -l <"$TMP/e")" -eq 1 ] && ok || bad "not one error line for: $* ($(cat "$TMP/e"))"
    grep -qF -- "$pat" "$TMP/e" && ok || bad "error for '$*' lacks '$pat': $(cat "$TMP/e")"
    [ -s "$TMP/o" ] && bad "stdout not empty for: $*" || ok
}
: >"$TMP/stdin"
printf 'ok \xff\xfe bytes' >"$TMP/bad.txt"
expect_err "not valid UTF-8" -m "$V" -f "$TMP/bad.txt"
expect_err "not valid UTF-8" -m "$V" "$(printf 'a\xc3(')"
cp "$TMP/bad.txt" "$TMP/stdin"
expect_err "not valid UTF-8" -m "$V" --ids
: >"$TMP/stdin"
expect_err "$TMP/missing-model.gguf" -m "$TMP/missing-model.gguf" "hi"
expect_err "$TMP/missing-text.txt" -m "$V" -f "$TMP/missing-text.txt"
expect_err "'32000' is not a token id" -m "$V" --decode "32000"
expect_err "'x1' is not a token id" -m "$V" --decode "1 x1"
"$ARKA" tokenize "hi" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "no -m is not a usage error"
"$ARKA" tokenize -m "$V" --decode --ids "1" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--decode --ids is not a usage error"
out=$("$ARKA" tokenize --help 2>/dev/null); rc=$?
[ $rc -eq 0 ] && grep -q "^usage: arka tokenize" <<<"$out" && ok || bad "tokenize --help: exit $rc"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
