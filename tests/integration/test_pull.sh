#!/usr/bin/env bash
# `arka pull` against a local Range-capable server (tests/integration/range_server.py) serving
# ../shared/models: full download + digest, resume of a truncated .part (and of a transfer cut
# by the server), a server that ignores Range, an already-complete .part (416), wrong digest,
# 404, refused connection, a write error, usage errors, the default cache directory.
set -uo pipefail
ARKA_BIN=${ARKA_BIN:-build/bin/arka}
ROOT=${ARKA_ROOT:-$(pwd)}
MODELS=$ROOT/../shared/models
SHA=270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d
SIZE=1185376
tmp=$(mktemp -d /tmp/arka-pull-XXXXXX)
server_pid= server2_pid=
cleanup() {
    for pid in $server_pid $server2_pid; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0 failed=0
ok()   { passed=$((passed + 1)); }
bad()  { failed=$((failed + 1)); echo "FAIL: $*" >&2; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

grep -q "$SHA" "$MODELS/README.md" || { echo "digest not in $MODELS/README.md" >&2; echo "0 passed, 1 failed"; exit 1; }

python3 "$ROOT/tests/integration/range_server.py" --root "$MODELS" --port-file "$tmp/port" --log "$tmp/log" &
server_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "server did not start" >&2; echo "0 passed, 1 failed"; exit 1; }
PORT=$(cat "$tmp/port")
URL=http://127.0.0.1:$PORT/stories260K.gguf
pull() { "$ARKA_BIN" pull "$@"; }

# 1. Full download with the published digest; stdout is the path; nothing left behind.
out=$(pull "$URL" -o "$tmp/a" --sha256 "$SHA" 2>"$tmp/err"); rc=$?
check '[ $rc = 0 ]' "full download exited $rc: $(cat "$tmp/err")"
check '[ "$out" = "$tmp/a/stories260K.gguf" ]' "stdout '$out'"
check '[ "$(sha_of "$tmp/a/stories260K.gguf")" = $SHA ]' "digest of the downloaded file"
check '[ ! -e "$tmp/a/stories260K.gguf.part" ]' ".part left after success"
check 'grep -q "sha256 $SHA" "$tmp/err"' "digest not reported: $(cat "$tmp/err")"
# Again: already present, verified, no request.
n_before=$(wc -l <"$tmp/log")
pull "$URL" -o "$tmp/a" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && grep -q "already present" "$tmp/err"' "second pull: rc $rc $(cat "$tmp/err")"
check '[ "$(wc -l <"$tmp/log")" = "$n_before" ]' "second pull made a request"

# 2. Resume from a truncated .part: one Range request, the file is complete and correct.
mkdir -p "$tmp/b"
head -c 500000 "$MODELS/stories260K.gguf" >"$tmp/b/stories260K.gguf.part"
pull "$URL" -o "$tmp/b" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ]' "resume exited $rc: $(cat "$tmp/err")"
check '[ "$(sha_of "$tmp/b/stories260K.gguf")" = $SHA ]' "digest after resume"
check 'grep -q "range=bytes=500000- status=206 sent=$((SIZE - 500000))" "$tmp/log"' "no 206 Range request in the log: $(tail -3 "$tmp/log")"
check 'grep -q "685376 downloaded, resumed" "$tmp/err"' "resume not reported: $(cat "$tmp/err")"

# 3. The server cuts the connection: non-zero exit, .part kept; the next pull resumes it.
pull "$URL?cut=300000" -o "$tmp/c" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "interrupted" "$tmp/err"' "cut transfer: rc $rc $(cat "$tmp/err")"
check '[ "$(stat -c %s "$tmp/c/stories260K.gguf.part" 2>/dev/null)" = 300000 ]' ".part after cut: $(ls -l "$tmp/c")"
check '[ ! -e "$tmp/c/stories260K.gguf" ]' "final file after a cut transfer"
pull "$URL" -o "$tmp/c" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/c/stories260K.gguf")" = $SHA ]' "resume after cut: rc $rc $(cat "$tmp/err")"
check 'grep -q "range=bytes=300000- status=206" "$tmp/log"' "no Range request after the cut"

# 4. A server that ignores Range (200 with the whole file) over a .part of garbage: restart.
mkdir -p "$tmp/d"
head -c 400000 /dev/urandom >"$tmp/d/stories260K.gguf.part"
pull "$URL?norange=1" -o "$tmp/d" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/d/stories260K.gguf")" = $SHA ]' "range ignored: rc $rc $(cat "$tmp/err")"
check 'grep -q "norange=1 range=bytes=400000- status=200 sent=$SIZE" "$tmp/log"' "no ignored-Range request in the log"
check 'grep -q "server ignored the resume request" "$tmp/err"' "restart not reported: $(cat "$tmp/err")"

# 5. A .part that is already complete: the server answers 416 with the same size.
mkdir -p "$tmp/e"
cp "$MODELS/stories260K.gguf" "$tmp/e/stories260K.gguf.part"
pull "$URL" -o "$tmp/e" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/e/stories260K.gguf")" = $SHA ]' "complete .part: rc $rc $(cat "$tmp/err")"
check 'grep -q "range=bytes=$SIZE- status=416" "$tmp/log"' "no 416 in the log"
# A .part longer than the file: 416 with another size, start over.
mkdir -p "$tmp/e2"
{ cat "$MODELS/stories260K.gguf"; echo junk; } >"$tmp/e2/stories260K.gguf.part"
pull "$URL" -o "$tmp/e2" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/e2/stories260K.gguf")" = $SHA ]' "overlong .part: rc $rc $(cat "$tmp/err")"

# 6. Wrong digest: exit 1, no final file, .part removed.
WRONG=0000000000000000000000000000000000000000000000000000000000000000
pull "$URL" -o "$tmp/f" --sha256 $WRONG >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "checksum mismatch" "$tmp/err"' "wrong digest: rc $rc $(cat "$tmp/err")"
check '[ ! -e "$tmp/f/stories260K.gguf" ] && [ ! -e "$tmp/f/stories260K.gguf.part" ]' "files left after a mismatch: $(ls "$tmp/f")"
# An existing final file with another digest is refused, not overwritten.
pull "$URL" -o "$tmp/a" --sha256 $WRONG >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "remove it" "$tmp/err" && [ "$(sha_of "$tmp/a/stories260K.gguf")" = $SHA ]' "existing file, wrong digest: rc $rc"

# 7. 404: exit 1, one line naming the status.
pull "http://127.0.0.1:$PORT/missing.gguf" -o "$tmp/g" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "HTTP 404" "$tmp/err" && [ "$(wc -l <"$tmp/err")" = 1 ]' "404: rc $rc $(cat "$tmp/err")"
check '[ ! -e "$tmp/g/missing.gguf" ] && [ ! -e "$tmp/g/missing.gguf.part" ]' "404 left files: $(ls "$tmp/g")"

# 8. A redirect is followed.
pull "$URL?redirect=1" -o "$tmp/h" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && grep -q "status=302" "$tmp/log"' "redirect: rc $rc $(cat "$tmp/err")"

# 9. Connection refused (a port nobody listens on).
FREE=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
pull "http://127.0.0.1:$FREE/stories260K.gguf" -o "$tmp/i" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "Connection refused" "$tmp/err" && [ "$(wc -l <"$tmp/err")" = 1 ]' "refused: rc $rc $(cat "$tmp/err")"

# 10. A write error (file size limit of 100 KiB): exit 1, clear message, .part kept.
( ulimit -f 100; trap '' XFSZ; "$ARKA_BIN" pull "$URL" -o "$tmp/j" >/dev/null 2>"$tmp/err" ); rc=$?
check '[ $rc = 1 ] && grep -q "write failed: File too large" "$tmp/err"' "write error: rc $rc $(cat "$tmp/err")"
check '[ -e "$tmp/j/stories260K.gguf.part" ] && [ ! -e "$tmp/j/stories260K.gguf" ]' "files after write error"

# 11. Usage errors: exit 2.
pull >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "no URL: rc $rc"
pull "$URL" --sha256 abc -o "$tmp/k" >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "bad digest: rc $rc"
pull "ftp://127.0.0.1/x.gguf" -o "$tmp/k" >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "ftp URL: rc $rc"
pull "http://127.0.0.1:$PORT/" -o "$tmp/k" >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "URL without a file name: rc $rc"
pull "$URL" --bogus >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "unknown flag: rc $rc"

# 12. The name comes from the percent-decoded last path segment, without the query; a
# segment that decodes to a path is refused.
out=$(pull "http://127.0.0.1:$PORT/stories260K%2Egguf?x=1#frag" -o "$tmp/l" --sha256 "$SHA" 2>"$tmp/err"); rc=$?
check '[ $rc = 0 ] && [ "$out" = "$tmp/l/stories260K.gguf" ]' "percent-encoded name: rc $rc out '$out' $(cat "$tmp/err")"
pull "http://127.0.0.1:$PORT/x%2F..%2Fstories260K.gguf" -o "$tmp/l" >/dev/null 2>&1; rc=$?
check '[ $rc = 2 ]' "encoded slash: rc $rc"

# 13. Two pulls of the same file at once: the second is refused while the first holds the
# .part, and the first still completes correctly. The first takes ~5 s (300 ms a 64 KiB
# chunk): at 50 ms (~1 s) a loaded machine once started the second after the first had ended.
pull "$URL?slow=300" -o "$tmp/m" --sha256 "$SHA" >/dev/null 2>"$tmp/err1" &
first=$!
for _ in $(seq 100); do [ -s "$tmp/m/stories260K.gguf.part" ] && break; sleep 0.02; done
pull "$URL" -o "$tmp/m" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 1 ] && grep -q "another download" "$tmp/err"' "concurrent pull: rc $rc $(cat "$tmp/err")"
wait $first; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/m/stories260K.gguf")" = $SHA ]' "first of two pulls: rc $rc $(cat "$tmp/err1")"

# 14. The file changes on the server between an interrupted pull and its resume: the resume
# sends If-Range with the old ETag, gets the whole new file (200), and keeps nothing of the old.
mkdir -p "$tmp/srv"
cp "$MODELS/stories260K.gguf" "$tmp/srv/v.bin"
python3 "$ROOT/tests/integration/range_server.py" --root "$tmp/srv" --port-file "$tmp/port2" --log "$tmp/log2" &
server2_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port2" ] && break; sleep 0.05; done
URL2=http://127.0.0.1:$(cat "$tmp/port2")/v.bin
pull "$URL2?cut=200000" -o "$tmp/n" >/dev/null 2>&1; rc=$?
check '[ $rc = 1 ] && [ -s "$tmp/n/v.bin.part.etag" ]' "interrupted pull kept no validator: rc $rc $(ls "$tmp/n")"
# Unchanged: the resume is a 206 under If-Range.
pull "$URL2" -o "$tmp/n" --sha256 "$SHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && grep -q "range=bytes=200000- status=206 sent=$((SIZE - 200000)) ifrange=\"" "$tmp/log2"' "If-Range resume: rc $rc $(cat "$tmp/err"; tail -2 "$tmp/log2")"
check '[ ! -e "$tmp/n/v.bin.part.etag" ]' "validator left after success"
pull "$URL2?cut=200000" -o "$tmp/o" >/dev/null 2>&1
{ head -c 1000 /dev/urandom; tail -c +1001 "$MODELS/stories260K.gguf"; } >"$tmp/srv/v.new" && mv "$tmp/srv/v.new" "$tmp/srv/v.bin"
NEWSHA=$(sha_of "$tmp/srv/v.bin")
pull "$URL2" -o "$tmp/o" --sha256 "$NEWSHA" >/dev/null 2>"$tmp/err"; rc=$?
check '[ $rc = 0 ] && [ "$(sha_of "$tmp/o/v.bin")" = "$NEWSHA" ]' "changed file: rc $rc $(cat "$tmp/err")"
check 'tail -1 "$tmp/log2" | grep -q "range=bytes=200000- status=200 sent=$SIZE ifrange=\""' "changed file not re-sent whole: $(tail -1 "$tmp/log2")"
kill $server2_pid 2>/dev/null; wait $server2_pid 2>/dev/null

# 15. Default directory from ARKA_CACHE_DIR; --progress draws a progress line.
out=$(ARKA_CACHE_DIR="$tmp/cache" "$ARKA_BIN" pull "$URL" --progress 2>"$tmp/err"); rc=$?
check '[ $rc = 0 ] && [ "$out" = "$tmp/cache/models/stories260K.gguf" ] && [ -s "$out" ]' "default dir: rc $rc out '$out'"
check 'grep -q "MB/s" "$tmp/err" && grep -q "100%" "$tmp/err"' "no progress line: $(cat "$tmp/err")"
out=$(env -u ARKA_CACHE_DIR XDG_CACHE_HOME="$tmp/xdg" "$ARKA_BIN" pull "$URL" 2>"$tmp/err"); rc=$?
check '[ $rc = 0 ] && [ "$out" = "$tmp/xdg/arka/models/stories260K.gguf" ]' "XDG dir: rc $rc out '$out'"
check '! grep -q "MB/s" "$tmp/err"' "progress shown without a tty or --progress"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
