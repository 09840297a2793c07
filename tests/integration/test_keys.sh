#!/usr/bin/env bash
# arka keys against a keys file: create prints the key once and stores only its HMAC (file and
# secret 0600), list/revoke/usage, argument errors, and a keys file the server's parser accepts
# (config/keys.conf's documented example line). Admission itself is covered by test_gw_auth.
set -uo pipefail
ROOT=${ARKA_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
ARKA=${ARKA_BIN:-$ROOT/build/bin/arka}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "$1 ${2:-}"; fi; }
unset ARKA_CONFIG ARKA_AUTH_SECRET ARKA_KEYS_FILE ARKA_REDIS
if ! "$ARKA" keys --help >/dev/null 2>&1; then echo "arka keys is not part of this build"; exit 77; fi
K=$TMP/keys.conf

k1=$("$ARKA" keys create --tenant acme --rpm 5 --tpm 1000 --concurrency 2 --daily-tokens 5000 --models m1,m2 --keys-file "$K" 2>"$TMP/err")
check '[ $? -eq 0 ]'
check '[[ "$k1" =~ ^ak-[0-9a-f]{48}$ ]]' "key: $k1"
k2=$("$ARKA" keys create --tenant beta --keys-file "$K" 2>/dev/null)
check '[[ "$k2" =~ ^ak-[0-9a-f]{48}$ ]] && [ "$k1" != "$k2" ]'
check '[ "$(stat -c %a "$K")" = 600 ] && [ "$(stat -c %a "$K.secret")" = 600 ]'
check '! grep -q "${k1#ak-}" "$K" && ! grep -q "${k2#ak-}" "$K"' "the key text is in the file"
check '[ "$(grep -c "^hash=" "$K")" = 2 ]'
# the stored hash is HMAC-SHA256(secret, key)
want=$(printf '%s' "$k1" | openssl dgst -sha256 -hmac "$(cat "$K.secret")" -r | cut -d' ' -f1)
check 'grep -q "^hash=$want tenant=acme models=m1,m2 rpm=5 tpm=1000 concurrency=2 daily-tokens=5000 weight=1 enabled=1" "$K"'
id1=${want:0:12}

"$ARKA" keys list --keys-file "$K" >"$TMP/list"
check 'grep -qE "^$id1 +acme +yes +5 +1000 +2 +5000 .* m1,m2$" "$TMP/list"' "$(cat "$TMP/list")"
check 'grep -qE " beta +yes +60 +100000 +8 +- " "$TMP/list"'
check '! grep -q "ak-" "$TMP/list"'
# a fair-share weight: stored, listed, bounded
"$ARKA" keys create --tenant heavy --weight 3 --keys-file "$TMP/w.conf" >/dev/null 2>&1
check '[ $? -eq 0 ] && grep -q "tenant=heavy .* weight=3 " "$TMP/w.conf"'
check '"$ARKA" keys list --keys-file "$TMP/w.conf" | grep -qE " heavy +yes +60 +100000 +8 +- +3 "'
for w in 0 1001; do
    "$ARKA" keys create --tenant heavy --weight $w --keys-file "$TMP/w.conf" >/dev/null 2>"$TMP/e"
    check '[ $? -eq 2 ] && grep -q "weight" "$TMP/e"' "weight $w"
done
sed 's/weight=3/weight=0/' "$TMP/w.conf" >"$TMP/w0.conf"
"$ARKA" keys list --keys-file "$TMP/w0.conf" >/dev/null 2>"$TMP/e"; check '[ $? -eq 1 ] && grep -q "weight: expected 1..1000" "$TMP/e"'

# revoke by id, then by the key itself
"$ARKA" keys revoke "$id1" --keys-file "$K" 2>/dev/null
check '[ $? -eq 0 ]'
check 'grep -q "^hash=$want .* enabled=0" "$K"'
"$ARKA" keys revoke "$k2" --keys-file "$K" 2>/dev/null
check '[ $? -eq 0 ] && [ "$(grep -c "enabled=0" "$K")" = 2 ]'
"$ARKA" keys list --keys-file "$K" | grep -c revoked >"$TMP/n"
check '[ "$(cat "$TMP/n")" = 2 ]'
check '[ "$(stat -c %a "$K")" = 600 ]'
"$ARKA" keys revoke 000000000000 --keys-file "$K" 2>/dev/null
check '[ $? -eq 1 ]'

# usage: today's settled tokens from FILE.usage (written by the server)
today=$(( $(date +%s) / 86400 ))
echo "$id1 $today 1234 7" >"$K.usage"
"$ARKA" keys usage --keys-file "$K" >"$TMP/usage"
check 'grep -qE "^$id1 +acme +1234 +7 +5000$" "$TMP/usage"' "$(cat "$TMP/usage")"

# a given secret instead of the file; env and flag agree
k3=$(ARKA_AUTH_SECRET=an-explicit-secret-of-some-length "$ARKA" keys create --tenant gamma --keys-file "$TMP/k2.conf" 2>/dev/null)
h3=$(printf '%s' "$k3" | openssl dgst -sha256 -hmac an-explicit-secret-of-some-length -r | cut -d' ' -f1)
check 'grep -q "^hash=$h3 tenant=gamma" "$TMP/k2.conf" && [ ! -e "$TMP/k2.conf.secret" ]'

# errors: exit 2 with a message
"$ARKA" keys create --keys-file "$K" >/dev/null 2>"$TMP/e"; check '[ $? -eq 2 ] && grep -q tenant "$TMP/e"'
"$ARKA" keys create --tenant "a b" --keys-file "$K" >/dev/null 2>&1; check '[ $? -eq 2 ]'
"$ARKA" keys list >/dev/null 2>"$TMP/e"; check '[ $? -eq 2 ] && grep -q keys-file "$TMP/e"'
"$ARKA" keys frob --keys-file "$K" >/dev/null 2>&1; check '[ $? -eq 2 ]'
chmod 644 "$K.secret"
"$ARKA" keys create --tenant x --keys-file "$K" >/dev/null 2>"$TMP/e"; check '[ $? -eq 1 ] && grep -q "chmod 600" "$TMP/e"'

# the documented example line in config/keys.conf parses
grep '^# hash=' "$ROOT/config/keys.conf" | sed 's/^# //' >"$TMP/example.conf"
"$ARKA" keys list --keys-file "$TMP/example.conf" | grep -qE "^[0-9a-f]{12} +acme +yes"
check '[ $? -eq 0 ]'
"$ARKA" keys list --keys-file "$ROOT/config/keys.conf" >/dev/null; check '[ $? -eq 0 ]'

# the same commands against Redis (a redis-server on a free loopback port), when installed
if command -v redis-server >/dev/null 2>&1; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" >/dev/null 2>&1 &
    rpid=$!
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
    R=redis://127.0.0.1:$port/3
    S=a-shared-secret-for-redis-keys
    rk=$("$ARKA" keys create --tenant acme --rpm 7 --weight 5 --models m1 --redis "$R" --auth-secret "$S" 2>/dev/null)
    check '[[ "$rk" =~ ^ak-[0-9a-f]{48}$ ]]'
    rh=$(printf '%s' "$rk" | openssl dgst -sha256 -hmac "$S" -r | cut -d' ' -f1)
    check '[ "$(redis-cli -p "$port" -n 3 get "arka:keyidx:$rh")" = "acme ${rh:0:12}" ]'
    check '[ "$(redis-cli -p "$port" -n 3 hget "arka:{acme}:key:${rh:0:12}" rpm)" = 7 ]'
    check '[ "$(redis-cli -p "$port" -n 3 hget "arka:{acme}:key:${rh:0:12}" weight)" = 5 ]'
    check '[ -z "$(redis-cli -p "$port" -n 3 --scan | xargs -r -n1 redis-cli -p "$port" -n 3 dump 2>/dev/null | grep -a "${rk#ak-}")" ]'
    "$ARKA" keys list --redis "$R" >"$TMP/rlist"
    check 'grep -qE "^${rh:0:12} +acme +yes +7 .* 5 +[0-9-]+T" "$TMP/rlist"' "$(cat "$TMP/rlist")"
    redis-cli -p "$port" -n 3 hset "arka:{acme}:k:${rh:0:12}:d:$today" tok 321 req 4 >/dev/null
    "$ARKA" keys usage --redis "$R" >"$TMP/rusage"
    check 'grep -qE "^${rh:0:12} +acme +321 +4 " "$TMP/rusage"' "$(cat "$TMP/rusage")"
    "$ARKA" keys revoke "$rk" --redis "$R" --auth-secret "$S" 2>/dev/null
    check '[ "$(redis-cli -p "$port" -n 3 hget "arka:{acme}:key:${rh:0:12}" enabled)" = 0 ]'
    "$ARKA" keys create --tenant x --redis "$R" >/dev/null 2>"$TMP/e"; check '[ $? -eq 1 ] && grep -q auth-secret "$TMP/e"'
    "$ARKA" keys list --redis "$R" --keys-file "$K" >/dev/null 2>&1; check '[ $? -eq 2 ]'
    "$ARKA" keys list --redis redis://127.0.0.1:1 >/dev/null 2>"$TMP/e"; check '[ $? -eq 1 ] && grep -q "cannot connect" "$TMP/e"'
    kill "$rpid"; wait "$rpid" 2>/dev/null
else
    echo "redis-server not installed: Redis part skipped"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
