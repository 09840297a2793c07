#!/usr/bin/env bash
# arka generate: the greedy continuation of stories260K matches ../shared/models/README.md as
# text, through --prompt-ids and as ids; seeded sampling repeats; stdout carries only the
# continuation; bad input gets a one-line error and a non-zero exit, never a crash; out-of-range
# sampling and thread values name their flag; big models load with a progress bar; stdout
# streams token by token.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
MODELS=$ROOT/../shared/models
M=$MODELS/stories260K.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if [ "$1" = "$2" ]; then ok; else bad "$3"; echo "  got:      $(printf %q "$1" | head -c 400)"; echo "  expected: $(printf %q "$2" | head -c 400)"; fi; }

# The reference: the README's code block after "Reference:", prompt included, trailing blank
# lines dropped.
awk '/^Reference:/ {r=1} r && /^```/ {n++; next} r && n==1 {print}' "$MODELS/README.md" >"$TMP/ref.txt"
REF=$(cat "$TMP/ref.txt")
[ ${#REF} -gt 200 ] && ok || bad "could not read the reference from README.md"

cd "$ROOT"
"$ARKA" generate -m "$M" -p "Once upon a time" -n 200 --temp 0 >"$TMP/out.txt" 2>"$TMP/err.txt"
check "$?" 0 "greedy run exit status"
OUT="Once upon a time$(cat "$TMP/out.txt")"
check "$OUT" "$REF" "greedy continuation differs from README.md"
grep -q "prefill:.*tok/s.*decode: 199 tokens.*tok/s" "$TMP/err.txt" && ok || bad "stderr lacks the timing line: $(cat "$TMP/err.txt")"
grep -q "load:" "$TMP/out.txt" && bad "timings leaked to stdout" || ok

# ids, then the same ids back as a prompt
"$ARKA" generate -m "$M" -p "Once upon a time" -n 200 --temp 0 --ids >"$TMP/ids.txt" 2>/dev/null
check "$(wc -w <"$TMP/ids.txt" | tr -d ' ')" 200 "--ids count"
check "$(cut -d' ' -f1-5 "$TMP/ids.txt")" "432 383 286 261 376" "--ids first ids"
"$ARKA" generate -m "$M" --prompt-ids "1 403 407 261 378" -n 200 --temp 0 >"$TMP/out2.txt" 2>/dev/null
check "$(cat "$TMP/out2.txt")" "$(cat "$TMP/out.txt")" "--prompt-ids gives the same text"
# the prompt from a file: ids (--prompt-ids @FILE) and text (-f FILE)
printf '1 403\n407 261 378\n' >"$TMP/ids.in"
"$ARKA" generate -m "$M" --prompt-ids "@$TMP/ids.in" -n 200 --temp 0 >"$TMP/out2f.txt" 2>/dev/null
check "$(cat "$TMP/out2f.txt")" "$(cat "$TMP/out.txt")" "--prompt-ids @FILE gives the same text"
printf 'Once upon a time' >"$TMP/prompt.in"
"$ARKA" generate -m "$M" -f "$TMP/prompt.in" -n 200 --temp 0 >"$TMP/out2g.txt" 2>/dev/null
check "$(cat "$TMP/out2g.txt")" "$(cat "$TMP/out.txt")" "-f FILE gives the same text"
# chunked prefill and other thread counts and block sizes change nothing
"$ARKA" generate -m "$M" -p "Once upon a time" -n 200 --temp 0 --batch 2 --kv-block-size 4 >"$TMP/out3.txt" 2>/dev/null
check "$(cat "$TMP/out3.txt")" "$(cat "$TMP/out.txt")" "--batch 2 --kv-block-size 4"

# seeded sampling: same seed same text, other seed other text
A=$("$ARKA" generate -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --top-k 40 --top-p 0.95 --seed 7 2>/dev/null)
B=$("$ARKA" generate -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --top-k 40 --top-p 0.95 --seed 7 --batch 3 2>/dev/null)
C=$("$ARKA" generate -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --top-k 40 --top-p 0.95 --seed 8 2>/dev/null)
check "$A" "$B" "same seed, same text"
[ "$A" != "$C" ] && ok || bad "seeds 7 and 8 gave the same text"
D=$("$ARKA" generate -m "$M" -p "Once upon a time" -n 60 --temp 0.7 --min-p 0.1 --repeat-penalty 1.2 --seed 3 2>/dev/null)
[ ${#D} -gt 20 ] && ok || bad "min-p + repeat-penalty run produced nothing"
# the context ends generation: 5 prompt tokens + 11 = 16
"$ARKA" generate -m "$M" -p "Once upon a time" -n 50 --temp 0 --ctx 16 --ids >"$TMP/ctx.txt" 2>"$TMP/ctxerr.txt"
check "$(wc -w <"$TMP/ctx.txt" | tr -d ' ')" 11 "--ctx 16 stops after 11 tokens"
grep -q "finish: ctx" "$TMP/ctxerr.txt" && ok || bad "finish reason ctx: $(cat "$TMP/ctxerr.txt")"

# bad input: one line on stderr, non-zero exit, no crash (exit codes > 128 are signals)
expect_err() { # pattern, args...
    local pat=$1; shift
    "$ARKA" generate "$@" >"$TMP/o" 2>"$TMP/e"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -gt 128 ]; then bad "exit $rc for: $*"; return; fi
    [ "$(wc -l <"$TMP/e")" -le 2 ] && ok || bad "more than one error line for: $* ($(cat "$TMP/e"))"
    grep -qi -- "$pat" "$TMP/e" && ok || bad "error for '$*' lacks '$pat': $(cat "$TMP/e")"
    [ -s "$TMP/o" ] && bad "stdout not empty for: $*" || ok
}
expect_err "must be >= 1" -m "$M" -p "hi" -n 0
expect_err "unknown" -m "$M" -p "hi" --bogus-flag 3
expect_err "context" -m "$M" -p "Once upon a time there was a girl" --ctx 4
expect_err "KV cache" -m "$M" -p "hi" --kv-cache-mb 1 --kv-block-size 1024
expect_err "no model" -p "hi"
expect_err "prompt" -m "$M"
expect_err "token id" -m "$M" --prompt-ids "1 99999"
expect_err "prompt-missing" -m "$M" -f "$TMP/prompt-missing.txt"
expect_err "one of" -m "$M" -p "hi" -f "$TMP/prompt.in"
expect_err "no such file\|stories-missing" -m "$TMP/stories-missing.gguf" -p "hi"
# a model of an unsupported architecture, and one whose weight has a type without a kernel:
# byte patches of the real file (same lengths, so every offset stays valid)
python3 - "$M" "$TMP" <<'PY'
import struct, sys
src, tmp = sys.argv[1], sys.argv[2]
b = bytearray(open(src, 'rb').read())
a = bytearray(b)
key = b"general.architecture"
i = a.find(struct.pack('<Q', len(key)) + key)
j = i + 8 + len(key) + 4 + 8          # key, value type, string length
assert a[j:j + 5] == b"llama"
a[j:j + 5] = b"bloom"
open(tmp + "/arch.gguf", 'wb').write(a)
t = bytearray(b)
name = b"blk.0.attn_q.weight"
i = t.find(struct.pack('<Q', len(name)) + name)
k = i + 8 + len(name)
nd = struct.unpack_from('<I', t, k)[0]
k += 4 + 8 * nd
assert struct.unpack_from('<I', t, k)[0] == 0      # F32
struct.pack_into('<I', t, k, 26)                   # I32: same size, no matmul kernel
open(tmp + "/type.gguf", 'wb').write(t)
PY
expect_err "architecture\|bloom" -m "$TMP/arch.gguf" -p "hi"
expect_err "I32\|type" -m "$TMP/type.gguf" -p "hi"

# Out-of-range sampling and thread values: exactly one line, naming the flag; usage exit 2.
expect_flag() { # flag, args...
    local flag=$1; shift
    expect_err "$flag" -m "$M" -p "hi" "$@"
    "$ARKA" generate -m "$M" -p "hi" "$@" >/dev/null 2>"$TMP/e"
    local rc=$?
    [ $rc -eq 2 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] && ok || bad "$*: exit $rc, $(wc -l <"$TMP/e") lines: $(cat "$TMP/e")"
}
expect_flag --temp --temp -1
expect_flag --temp --temp nan
expect_flag --top-p --top-p -0.5
expect_flag --top-p --top-p 0
expect_flag --top-p --top-p 1.01
expect_flag --min-p --min-p 1.5
expect_flag --min-p --min-p -0.1
expect_flag --top-k --top-k -1
expect_flag --repeat-penalty --repeat-penalty 0
expect_flag --repeat-last-n --repeat-last-n -2
expect_flag --threads --threads 9999
expect_flag --threads --threads -1
# the same check when the value comes from a config file or the environment
printf 'temp = -0.5\n' >"$TMP/neg.conf"
expect_flag --temp --config "$TMP/neg.conf"
ARKA_MIN_P=2 expect_flag --min-p
# the bounds themselves are fine
"$ARKA" generate -m "$M" -p "hi" -n 2 --temp 0 --top-p 1 --min-p 1 --top-k 0 --threads 1 >/dev/null 2>"$TMP/e" \
    && ok || bad "bounds refused: $(cat "$TMP/e")"

# Weights over 64 MiB load with a progress bar on stderr (stories260K, above, without one); a
# random `small` model (~100 MiB of weights at Q8_0) is quick to write.
grep -q "loading \[" "$TMP/err.txt" && bad "a progress bar for a 1 MiB model" || ok
if "$ARKA" mkmodel small "$TMP/small.gguf" --type q8_0 2>"$TMP/mk.err"; then
    "$ARKA" generate -m "$TMP/small.gguf" --prompt-ids "1 450 4996" -n 2 --temp 0 --ids >"$TMP/o" 2>"$TMP/e"
    check "$?" 0 "generate on the small model"
    grep -q "loading \[#*\.*\] *[0-9]*% " "$TMP/e" && grep -q "loading \[#\{50\}\] 100% " "$TMP/e" \
        && ok || bad "no progress bar reaching 100% for a 100 MiB model: $(head -c 300 "$TMP/e")"
    grep -q "loading" "$TMP/o" && bad "the progress bar went to stdout" || ok

    # Output streams: each token is written as it is generated. Read the first id from a FIFO,
    # stop the generator at once, and see that most of the ids are still to come (with stdout
    # left block-buffered, every id would arrive together at exit).
    mkfifo "$TMP/fifo"
    N=48
    "$ARKA" generate -m "$TMP/small.gguf" --prompt-ids "1 450 4996" -n $N --temp 0 --ids --threads 1 >"$TMP/fifo" 2>"$TMP/se" &
    gpid=$!
    exec 3<"$TMP/fifo"
    IFS= read -r -d ' ' -u 3 first
    kill -STOP $gpid 2>/dev/null
    early=$first
    while IFS= read -r -t 0.3 -d ' ' -u 3 w; do early="$early $w"; done
    n_early=$(wc -w <<<"$early")
    kill -CONT $gpid 2>/dev/null
    rest=$(cat <&3)
    exec 3<&-
    wait $gpid
    check "$?" 0 "streamed run exit status"
    n_all=$(wc -w <<<"$early $w $rest")
    check "$n_all" $N "streamed run: ids in all"
    [ "$n_early" -ge 1 ] && [ "$n_early" -lt $((N / 2)) ] && ok \
        || bad "stdout is not streamed per token: $n_early of $N ids were out when the first arrived"
else
    bad "mkmodel small: $(cat "$TMP/mk.err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
