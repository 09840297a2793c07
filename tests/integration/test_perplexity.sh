#!/usr/bin/env bash
# arka perplexity on the real stories260K: its own sample scores a low perplexity; saved logits
# have the documented layout and compare with themselves as KL 0, top-1 100 %, relative error 0,
# whatever the batch size (batch invariance); a random-weight model against them is far off;
# ids files work; mismatched or broken inputs are refused with a message.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
MODEL=$ROOT/../shared/models/stories260K.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

"$ARKA" generate -m "$MODEL" -p "Once upon a time" -n 400 --temp 0.8 --seed 5 >"$TMP/story.txt" 2>/dev/null || bad "generate failed"

out=$("$ARKA" perplexity -m "$MODEL" -f "$TMP/story.txt" --ctx 64 --save-logits "$TMP/base.bin" 2>"$TMP/err") && ok || bad "perplexity: $(cat "$TMP/err")"
grep -q '^\[1\][0-9.]*,\[2\]' <<<"$out" && ok || bad "no running estimate: $out"
ppl=$(sed -n 's/^perplexity: \([0-9.]*\) +\/- .*/\1/p' <<<"$out")
chunks=$(sed -n 's/.*(\([0-9]*\) chunks of 64)$/\1/p' <<<"$out")
awk -v p="$ppl" 'BEGIN { exit !(p > 1 && p < 10) }' && ok || bad "its own sample scores perplexity '$ppl' (want 1..10): $out"
[ -n "$chunks" ] && [ "$chunks" -ge 2 ] && ok || bad "chunks '$chunks'"
# header 32 bytes, tokens, then (64 - 32) rows of 512 floats per chunk
want=$((32 + 4 * chunks * 64 + 4 * chunks * 32 * 512))
[ "$(stat -c %s "$TMP/base.bin")" -eq "$want" ] && ok || bad "logits file is $(stat -c %s "$TMP/base.bin") bytes, want $want"
[ "$(head -c 8 "$TMP/base.bin")" = ARKALGT1 ] && ok || bad "magic"

for b in 64 7; do
    out=$("$ARKA" perplexity -m "$MODEL" -f "$TMP/story.txt" --ctx 64 --batch $b --kl-divergence-base "$TMP/base.bin" 2>"$TMP/err") \
        && ok || bad "kl --batch $b: $(cat "$TMP/err")"
    grep -qF "kl-divergence: mean 0, max 0; top-1 agreement: 100.000 %" <<<"$out" && ok || bad "self comparison, batch $b: $out"
    grep -qF "relative error of logits: mean 0, max 0" <<<"$out" && ok || bad "self comparison relative error, batch $b: $out"
    grep -qF "perplexity: $ppl " <<<"$out" && ok || bad "batch $b changes the perplexity: $out"
done

# a random model with the same vocabulary is far from the real one
"$ARKA" mkmodel tiny "$TMP/rand.gguf" --type q8_0 --vocab-size 512 --vocab "$MODEL" 2>/dev/null || bad "mkmodel"
out=$("$ARKA" perplexity -m "$TMP/rand.gguf" -f "$TMP/story.txt" --ctx 64 --kl-divergence-base "$TMP/base.bin" 2>"$TMP/err") \
    && ok || bad "random model: $(cat "$TMP/err")"
kl=$(sed -n 's/^kl-divergence: mean \([0-9.e+-]*\),.*/\1/p' <<<"$out")
awk -v k="$kl" 'BEGIN { exit !(k > 0.1) }' && ok || bad "random model KL '$kl' (want > 0.1): $out"

# ids: 3 chunks of 16 from a file of 50 ids, comma or space separated
seq 1 50 | awk '{ printf "%d%s", ($1 * 37) % 512, NR % 2 ? ", " : "\n" }' >"$TMP/ids.txt"
out=$("$ARKA" perplexity -m "$MODEL" --ids "$TMP/ids.txt" --ctx 16 --first 0 2>"$TMP/err") && ok || bad "--ids: $(cat "$TMP/err")"
grep -qF "over 45 scored tokens (3 chunks of 16)" <<<"$out" && ok || bad "--ids: $out"

# refusals: exit status, a message naming the problem
expect() { # want_status needle args...
    local st=$1 needle=$2; shift 2
    "$ARKA" perplexity "$@" >"$TMP/o" 2>"$TMP/e"; local rc=$?
    [ $rc -eq "$st" ] && grep -qF -- "$needle" "$TMP/e" && ok || bad "perplexity $*: status $rc, stderr: $(cat "$TMP/e")"
}
expect 1 "context 64, first 32; this run has 512, 32, 16" -m "$MODEL" -f "$TMP/story.txt" --ctx 32 --kl-divergence-base "$TMP/base.bin"
head -c 4000 "$TMP/base.bin" >"$TMP/short.bin"
expect 1 "truncated" -m "$MODEL" -f "$TMP/story.txt" --ctx 64 --kl-divergence-base "$TMP/short.bin"
printf 'JUNKJUNK' >"$TMP/junk.bin"
expect 1 "not a logits file" -m "$MODEL" -f "$TMP/story.txt" --ctx 64 --kl-divergence-base "$TMP/junk.bin"
echo "1 2 999999" >"$TMP/bad-ids.txt"
expect 2 "'999999' is not a token id" -m "$MODEL" --ids "$TMP/bad-ids.txt" --ctx 2
expect 2 "fewer than one chunk" -m "$MODEL" --ids "$TMP/ids.txt" --ctx 64
expect 2 "exactly one of -f TEXT and --ids" -m "$MODEL"
expect 2 "--first 64 must be below --ctx 64" -m "$MODEL" -f "$TMP/story.txt" --ctx 64 --first 64

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
