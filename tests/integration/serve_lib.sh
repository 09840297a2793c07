# Helpers shared by the tests that run `arka serve` (sourced, not a test). The servers expect BIN,
# MODEL, TMP and an array PIDS (killed by the test's cleanup) to be set.

# A test's counters and checks, unless the script defined its own before sourcing (it keeps
# them and its counts): ok; bad MSG; check EXPR MSG (EXPR eval'ed); the script prints
# "$pass passed, $fail failed" last.
: "${pass:=0}" "${fail:=0}"
declare -F ok >/dev/null || ok() { pass=$((pass + 1)); }
declare -F bad >/dev/null || bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
declare -F check >/dev/null || check() { if eval "$1"; then ok; else bad "$2"; fi; }

# serve_require: BIN built, MODEL present, curl and python3 installed, or the test fails at once.
serve_require() {
    [ -x "$BIN" ] || { echo "FAIL: $BIN not built"; echo "0 passed, 1 failed"; exit 1; }
    [ -f "$MODEL" ] || { echo "FAIL: $MODEL missing"; echo "0 passed, 1 failed"; exit 1; }
    command -v curl >/dev/null && command -v python3 >/dev/null || { echo "FAIL: curl or python3 missing"; echo "0 passed, 1 failed"; exit 1; }
}

# start NAME ARGS...: a server on a free port with ARGS; sets URL and SPID; waits for /health
# 200 (ARKA_START_S seconds, default 30). Returns 1 (after printing its log) when it does not come up.
start() {
    local name=$1; shift
    "$BIN" serve -m "$MODEL" --port 0 --threads 1 "$@" >"$TMP/$name.log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    URL=""
    for _ in $(seq $(( ${ARKA_START_S:-30} * 10 ))); do
        URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$TMP/$name.log" 2>/dev/null | head -1)
        [ -n "$URL" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && return 0
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.1
    done
    echo "server $name did not come up:"; cat "$TMP/$name.log"
    return 1
}

# npm_clients: installs the npm clients the serve tests use into NPM_CACHE (once; the normal and
# sanitizer runs may race here, so one installs under a lock). Returns 1 when they are missing.
NPM_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/arka-npm-serve
npm_clients() {
    command -v node >/dev/null && command -v npm >/dev/null || { echo "node/npm missing (scripts/setup.sh installs them)"; return 1; }
    mkdir -p "$NPM_CACHE"
    if [ ! -f "$NPM_CACHE/node_modules/openai/package.json" ] || [ ! -f "$NPM_CACHE/node_modules/ws/package.json" ]; then
        exec 9>"$NPM_CACHE/.install.lock"; flock 9
        [ -f "$NPM_CACHE/node_modules/openai/package.json" ] && [ -f "$NPM_CACHE/node_modules/ws/package.json" ] ||
            npm install --prefix "$NPM_CACHE" --no-audit --no-fund --silent openai@4.104.0 ws@8.18.3 >"$NPM_CACHE/npm-install.log" 2>&1 ||
            cat "$NPM_CACHE/npm-install.log"
        exec 9>&-
    fi
    [ -f "$NPM_CACHE/node_modules/openai/package.json" ] && [ -f "$NPM_CACHE/node_modules/ws/package.json" ]
}

# node_checks SCRIPT ARGS...: runs a node check script and adds its "N passed, N failed" to the
# caller's pass/fail counts.
node_checks() {
    node "$@" >"$TMP/node.txt" 2>&1
    grep -v "passed, .* failed" "$TMP/node.txt" | head -40
    local np nf
    np=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/node.txt")
    nf=$(sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/node.txt")
    if [ -n "$np" ]; then pass=$((pass + np)); fail=$((fail + nf)); else fail=$((fail + 1)); echo "FAIL $1 did not finish"; fi
}
