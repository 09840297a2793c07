#!/usr/bin/env bash
# config/arka.conf cannot drift from the commands: every `name = value` line in it (commented
# out or not) names an option that some command's --help lists, or is in NOT_OPTIONS below with
# its reason. With every documented line switched on, each command still accepts the file (the
# example values are valid wherever the name is taken). log-level is every command's option:
# listed by each --help, taken from the file, ARKA_LOG_LEVEL and --log-level, and checked.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
CONF=$ROOT/config/arka.conf
VOCAB=$ROOT/../shared/models/vocab/ggml-vocab-llama-spm.gguf
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
unset ARKA_CONFIG ARKA_LOG_LEVEL
cd "$ROOT"

# Names config/arka.conf may document without any command of this binary taking them, each with
# the reason (e.g. a command left out of builds without its library). Empty today.
NOT_OPTIONS=()

# The commands: `arka --help` lists them; a command's usage lines name its subcommands
# (`arka bench decode ...`: a lower-case word after the command).
mapfile -t cmds < <("$ARKA" --help | awk '/^commands:/ {c=1; next} c && /^  [a-z]/ {print $1}')
[ ${#cmds[@]} -ge 5 ] && ok || bad "arka --help lists ${#cmds[@]} commands"
invocations=()
for c in "${cmds[@]}"; do
    subs=$("$ARKA" "$c" --help 2>&1 | grep -oE "arka $c [a-z][a-z0-9-]*( |$)" | awk '{print $3}' | sort -u)
    if [ -n "$subs" ]; then
        for s in $subs; do invocations+=("$c $s"); done
    else
        invocations+=("$c")
    fi
done
: >"$TMP/help.txt"
for inv in "${invocations[@]}"; do
    # shellcheck disable=SC2086
    "$ARKA" $inv --help >"$TMP/h" 2>&1
    grep -q -- "--log-level" "$TMP/h" && ok || bad "'arka $inv --help' does not list --log-level"
    cat "$TMP/h" >>"$TMP/help.txt"
done

# Every documented name is some command's option.
mapfile -t keys < <(sed -nE 's/^#? *([a-z][a-z0-9-]*) *=.*/\1/p' "$CONF" | sort -u)
[ ${#keys[@]} -ge 20 ] && ok || bad "only ${#keys[@]} names found in $CONF"
for k in "${keys[@]}"; do
    if grep -qE -- "--$k( |$)" "$TMP/help.txt"; then ok
    elif printf '%s\n' "${NOT_OPTIONS[@]}" | grep -qxF -- "$k"; then ok
    else bad "config/arka.conf documents '$k', which no command accepts (arka <command> --help)"
    fi
done

# Every example value parses for every command: switch every documented line on. The file is
# read before --help is looked at, so a bad value shows up as an error instead of the usage.
sed -E 's/^# *([a-z][a-z0-9-]* *=)/\1/' "$CONF" >"$TMP/all.conf"
for inv in "${invocations[@]}"; do
    # shellcheck disable=SC2086
    "$ARKA" $inv --config "$TMP/all.conf" --help >"$TMP/h" 2>&1
    rc=$?
    if grep -qE "all.conf:[0-9]+:|invalid value" "$TMP/h" || [ $rc -gt 2 ]; then
        bad "'arka $inv' refuses the documented values: $(grep -E 'all.conf|invalid' "$TMP/h" | head -2)"
    else ok; fi
done
# ... and really runs with them (the file's model, greedy at temp 0 overridden on the command line).
"$ARKA" generate --config "$TMP/all.conf" -p "Once upon a time" -n 4 --temp 0 --ids >"$TMP/o" 2>"$TMP/e"
[ $? -eq 0 ] && [ "$(wc -w <"$TMP/o")" -eq 4 ] && ok || bad "generate with the documented file: $(head -3 "$TMP/e")"
# The check above can fail: a bad value is reported with the file and line.
printf 'threads = 2\nthreads = lots\n' >"$TMP/bad.conf"
"$ARKA" generate --config "$TMP/bad.conf" --help >"$TMP/h" 2>&1
grep -q "bad.conf:2: invalid value 'lots' for option 'threads'" "$TMP/h" && ok || bad "a bad file value: $(head -2 "$TMP/h")"

# A name no command takes is a typo: refused with the file and line (exit 2), whatever the
# command; a name another command takes is not (the file is shared).
printf 'threads = 2\n# a comment\nkv-cache-mbb = 512\n' >"$TMP/typo.conf"
"$ARKA" serve --config "$TMP/typo.conf" --help >"$TMP/h" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "typo.conf:3: unknown option 'kv-cache-mbb'" "$TMP/h" && ok || bad "a typo in a config file: rc=$rc $(head -2 "$TMP/h")"
"$ARKA" generate --config "$TMP/typo.conf" -p x -n 1 >"$TMP/h" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "typo.conf:3: unknown option" "$TMP/h" && ok || bad "a typo for generate: rc=$rc $(head -2 "$TMP/h")"
printf 'max-resumes = 2\n' >"$TMP/other.conf" # serve's, read by generate
"$ARKA" generate --config "$TMP/other.conf" --help >"$TMP/h" 2>&1
! grep -q "unknown option" "$TMP/h" && ok || bad "another command's option refused: $(head -2 "$TMP/h")"
# The list of names every command takes (common/cm_config.c) is exactly the --help options.
grep -oE -- "--[a-z][a-z0-9-]*" "$TMP/help.txt" | sed 's/^--//' | grep -vxE 'config|help' | sort -u >"$TMP/names.help"
sed -n '/all_names\[\] = {/,/^};/p' "$ROOT/common/cm_config.c" | grep -oE '"[a-z][a-z0-9-]*"' | tr -d '"' | sort -u >"$TMP/names.src"
if diff "$TMP/names.help" "$TMP/names.src" >"$TMP/names.diff"; then ok
else bad "common/cm_config.c all_names differs from the commands' --help (< missing from it, > no longer an option): $(tr '\n' ' ' <"$TMP/names.diff")"; fi

# log-level from each source, on a command that never declared it.
out=$("$ARKA" tokenize -m "$VOCAB" --ids --log-level debug "Hello" 2>"$TMP/e")
[ $? -eq 0 ] && [ "$out" = "1 15043" ] && ok || bad "tokenize --log-level debug: $out $(cat "$TMP/e")"
"$ARKA" tokenize -m "$VOCAB" --ids --log-level loud "Hello" >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && grep -q "invalid value 'loud' for option 'log-level'" "$TMP/e" && ok || bad "--log-level loud: $(cat "$TMP/e")"
ARKA_LOG_LEVEL=loud "$ARKA" inspect "$VOCAB" >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && grep -q "ARKA_LOG_LEVEL" "$TMP/e" && ok || bad "ARKA_LOG_LEVEL=loud: $(cat "$TMP/e")"
ARKA_LOG_LEVEL=warn "$ARKA" inspect "$ROOT/../shared/models/stories260K.gguf" >/dev/null 2>"$TMP/e" && ok || bad "ARKA_LOG_LEVEL=warn: $(cat "$TMP/e")"
printf 'log-level = quiet\n' >"$TMP/ll.conf"
"$ARKA" mkmodel tiny "$TMP/x.gguf" --config "$TMP/ll.conf" >/dev/null 2>"$TMP/e"
[ $? -eq 2 ] && grep -q "ll.conf:1:.*log-level" "$TMP/e" && ok || bad "log-level = quiet in a file: $(cat "$TMP/e")"
[ ! -e "$TMP/x.gguf" ] && ok || bad "mkmodel ran despite a bad log-level"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
