#!/usr/bin/env bash
# The shm rings under ThreadSanitizer: configures a small TSan build next to the build that runs
# this test ($ARKA_BUILD/../build-tsan, -DARKA_SANITIZE=thread -DARKA_CUDA=OFF), builds only the
# test_shm_* targets, runs test_shm_ring and the two-thread variant of test_shm_stress (the
# fork variant is invisible to TSan: it cannot see across processes), and fails on any TSan report
# or failed check.
#
# Skips (exit 77, which ctest reports as skipped; one line saying why) when ARKA_SANITIZE is set
# in the environment (we are already inside a sanitizer run: no recursion) or when the calling
# build is itself a sanitizer build (`make test` runs ctest in build/ and build-asan/; one TSan
# run per `make test` is enough).
# The build dir is locked so that two ctest runs at once do not build it concurrently.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${ARKA_BUILD:-$ROOT/build}

if [ -n "${ARKA_SANITIZE:-}" ]; then
    echo "SKIP test_shm_tsan: ARKA_SANITIZE=$ARKA_SANITIZE is set (already inside a sanitizer run)"
    exit 77
fi
if [ -f "$BUILD/CMakeCache.txt" ] && grep -q '^ARKA_SANITIZE:STRING=..*' "$BUILD/CMakeCache.txt"; then
    echo "SKIP test_shm_tsan: $BUILD is a sanitizer build; the TSan run belongs to the plain build's ctest"
    exit 77
fi
if ! command -v cmake >/dev/null; then
    echo "FAIL test_shm_tsan: cmake not found"
    exit 1
fi

TSAN=$(cd "$BUILD/.." && pwd)/build-tsan
mkdir -p "$TSAN"
if command -v flock >/dev/null; then
    exec 9>"$TSAN/.lock"
    flock 9
fi

t0=$(date +%s)
# The gateway (libuv, llhttp, ...) is not needed by the shm tests: pointing LLHTTP_DIR nowhere keeps
# it out of this build so that only arka_core is compiled. Debug (-O0) compiles fastest; the test
# scales its record counts down under TSan by itself.
if ! cmake -S "$ROOT" -B "$TSAN" -DCMAKE_BUILD_TYPE=Debug -DARKA_SANITIZE=thread -DARKA_CUDA=OFF \
        -DLLHTTP_DIR=/nonexistent-not-needed-for-shm >"$TSAN/configure.log" 2>&1; then
    echo "FAIL test_shm_tsan: configure failed:"; tail -20 "$TSAN/configure.log"
    exit 1
fi
targets=()
for src in "$ROOT"/tests/unit/test_shm_*.c; do
    targets+=("$(basename "$src" .c)")
done
if ! cmake --build "$TSAN" -j2 --target "${targets[@]}" >"$TSAN/build.log" 2>&1; then
    echo "FAIL test_shm_tsan: TSan build failed:"; grep -E "error|Error" "$TSAN/build.log" | head -20
    exit 1
fi
t1=$(date +%s)
echo "TSan build of ${targets[*]}: $((t1 - t0)) s"

pass=0 fail=0
# run NAME ARGS...: exit status 0, a "0 failed" summary, and no ThreadSanitizer report.
run() {
    local name=$1; shift
    local log="$TSAN/$name.log"
    ARKA_SANITIZE=thread TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
        "$TSAN/bin/$name" "$@" >"$log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] || grep -q "ThreadSanitizer" "$log" || ! tail -1 "$log" | grep -q " 0 failed$"; then
        echo "FAIL: $name $* (exit status $rc)"; tail -40 "$log"
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
        echo "ok: $name $*: $(tail -1 "$log")"
        grep -E "^(threads|fork|per direction)" "$log" | sed 's/^/    /'
    fi
}
run test_shm_ring
run test_shm_stress threads
echo "TSan runs: $(( $(date +%s) - t1 )) s"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
