#!/usr/bin/env bash
# make test-docker: the containers built and run for real. Needs root on Debian 12 (or a machine
# with a Docker engine); not part of `make test` (ARKA_DOCKER_TESTS=1 make test adds it).
#
#  1. engine: installs docker.io (and docker-compose, Compose v1, when the CLI has no `docker
#     compose`: a CLI plugin in a private DOCKER_CONFIG hands it the commands) and starts dockerd
#     when none answers; stops it again at the end if it started it (ARKA_DOCKER_KEEP_DAEMON=1
#     keeps it). Base images: scripts/docker-base-image.sh (debootstrap; skipped when present).
#  2. the secret scheme of the deploy files: no literal secret; env file / Kubernetes Secret.
#  3. the gateway image, built with README.md's command: user arka, a HEALTHCHECK, no compilers
#     in the run stage, its size.
#  4. docker/README.md's `docker run` commands, as written (the official Redis image replaced by
#     one built from Debian's redis-server): with a keys file on a volume, then with Redis:
#     healthy, /health, a completion with the key, 401 without it or with a wrong one; SIGTERM
#     (`docker stop`) while streams run: they all end with [DONE], the container exits 0 within
#     the 30 s drain, new connections are refused meanwhile.
#  5. compose (README.md's and docker/README.md's commands, with tests/docker/compose.test.yml as
#     override through COMPOSE_FILE and the project name arka-test): gateway, Redis and Prometheus
#     up, `docker compose exec gateway arka keys create` prints a key that works, Prometheus has
#     the gateway target up and two dashboard queries return data after some requests, and
#     `docker compose down` leaves no container or network.
#
# The commands run in a copy of the working tree (so docker/arka.env and build trees of the
# checkout are left alone) with HOME pointing at a folder whose models/ holds the model.
# Left behind: the images debian:12, debian:12-slim, arka-gateway (and arka-gateway:build, the
# build stage kept as the compile cache), arka-test-redis, arka-test-prometheus; nothing else.
# Environment: ARKA_TEST_MODEL (default ../shared/models/stories260K.gguf).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${ARKA_TEST_MODEL:-$ROOT/../shared/models/stories260K.gguf}
REDIS_IMAGE=arka-test-redis           # stands in for the official redis:7.2-alpine
PROJECT=arka-test                     # compose project of the test (the shipped .env says arka)
T0=$(date +%s)
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
check() { if eval "$1"; then ok; else bad "${2:-$1}"; fi; }
say() { echo "[$(($(date +%s) - T0)) s] $*"; }
die() { bad "$*"; exit 1; }

[ "$(id -u)" = 0 ] || { echo "tests/docker/run.sh: needs root (installs and starts the Docker engine)"; exit 1; }
[ -f "$MODEL" ] || { echo "tests/docker/run.sh: no model at $MODEL (ARKA_TEST_MODEL)"; exit 1; }
exec 4>&1          # the commands run are shown here even when their output is captured
TMP=$(mktemp -d /var/tmp/arka-docker-test.XXXXXX)
chmod 755 "$TMP"
BG=()              # background processes of this script
CLAIMED=0          # set once nothing of the names the documented commands use exists
DAEMON_PID=""      # dockerd when this script started it
DAEMON_SYSTEMD=0

# ---- cleanup: everything this run made, except the images it reuses ------------------------
cleanup() {
    local rc=$?
    for p in "${BG[@]}"; do kill "$p" 2>/dev/null; done
    if [ $CLAIMED = 1 ] && docker info >/dev/null 2>&1; then
        docker rm -f arka arka-redis >/dev/null 2>&1
        docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | xargs -r docker rm -f >/dev/null 2>&1
        # containers made during the run (a failed build leaves its intermediate ones)
        comm -13 <(sort "$TMP/containers.before" 2>/dev/null) <(docker ps -aq --no-trunc | sort) |
            xargs -r docker rm -f >/dev/null 2>&1
        docker network rm arka "${PROJECT}_default" >/dev/null 2>&1
        docker volume rm arka-keys >/dev/null 2>&1
        docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | xargs -r docker volume rm >/dev/null 2>&1
        # images superseded by this run's builds (their tags moved on)
        comm -13 <(sort "$TMP/dangling.before" 2>/dev/null) <(docker images -q --no-trunc -f dangling=true | sort) |
            xargs -r docker rmi >/dev/null 2>&1
    fi
    if [ -n "$DAEMON_PID" ] && [ "${ARKA_DOCKER_KEEP_DAEMON:-0}" != 1 ]; then
        kill "$DAEMON_PID" 2>/dev/null
        for _ in $(seq 60); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.5; done
        say "stopped the dockerd this run started"
    elif [ $DAEMON_SYSTEMD = 1 ] && [ "${ARKA_DOCKER_KEEP_DAEMON:-0}" != 1 ]; then
        systemctl stop docker.socket docker.service >/dev/null 2>&1
    fi
    rm -rf "$TMP"
    say "total $(($(date +%s) - T0)) s"
    echo "$pass passed, $fail failed"
    # the script's status: an EXIT trap's last command does not set it, exit does
    if [ $fail -eq 0 ] && [ $rc -eq 0 ]; then exit 0; fi
    exit 1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. engine, compose, base images -------------------------------------------------------
pkgs=()
command -v dockerd >/dev/null || pkgs+=(docker.io)
for c in curl openssl python3 script; do
    command -v $c >/dev/null || pkgs+=("$([ $c = script ] && echo bsdutils || echo $c)")
done
python3 -c 'import yaml' 2>/dev/null || pkgs+=(python3-yaml)
compose_v2=0
command -v docker >/dev/null && docker compose version >/dev/null 2>&1 && compose_v2=1
[ $compose_v2 = 0 ] && ! command -v docker-compose >/dev/null && pkgs+=(docker-compose)
if [ ${#pkgs[@]} -gt 0 ]; then
    say "installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; } >"$TMP/apt.log" 2>&1 ||
        { tail -20 "$TMP/apt.log"; die "apt-get install ${pkgs[*]} failed"; }
fi
command -v docker >/dev/null && docker compose version >/dev/null 2>&1 && compose_v2=1

if ! docker info >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        systemctl start docker.service && DAEMON_SYSTEMD=1
    else
        setsid dockerd >/var/log/arka-test-dockerd.log 2>&1 </dev/null &
    fi
    for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { tail -20 /var/log/arka-test-dockerd.log 2>/dev/null; die "dockerd did not start"; }
    [ $DAEMON_SYSTEMD = 1 ] || DAEMON_PID=$(cat /var/run/docker.pid)
    say "started dockerd $(docker version -f '{{.Server.Version}}')"
fi
docker ps -aq --no-trunc >"$TMP/containers.before"
docker images -q --no-trunc -f dangling=true >"$TMP/dangling.before"

# `docker compose`: the CLI plugin when there is one, else Compose v1 behind a plugin shim
if [ $compose_v2 = 1 ]; then
    export DOCKER_CONFIG=${DOCKER_CONFIG:-$HOME/.docker}
else
    src_cfg=${DOCKER_CONFIG:-$HOME/.docker}
    export DOCKER_CONFIG=$TMP/docker-config
    mkdir -p "$DOCKER_CONFIG/cli-plugins"
    [ -f "$src_cfg/config.json" ] && cp "$src_cfg/config.json" "$DOCKER_CONFIG/"
    cp "$ROOT/tests/docker/compose-v1-plugin.sh" "$DOCKER_CONFIG/cli-plugins/docker-compose"
    chmod 755 "$DOCKER_CONFIG/cli-plugins/docker-compose"
fi
docker compose version >/dev/null 2>&1 || die "docker compose does not run"
say "engine $(docker version -f '{{.Server.Version}}'), $(docker compose version | head -1)"

t=$(date +%s)
bash "$ROOT/scripts/docker-base-image.sh" || die "scripts/docker-base-image.sh failed"
[ $(($(date +%s) - t)) -gt 2 ] && say "base images made in $(($(date +%s) - t)) s"

# What the documented commands would collide with: refuse rather than clobber.
for c in arka arka-redis; do
    docker container inspect "$c" >/dev/null 2>&1 && die "a container named $c exists (docker rm -f $c)"
done
docker network inspect arka >/dev/null 2>&1 && die "a network named arka exists (docker network rm arka)"
docker volume inspect arka-keys >/dev/null 2>&1 && die "a volume named arka-keys exists (docker volume rm arka-keys)"
[ -n "$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ] &&
    die "containers of compose project $PROJECT exist (docker compose -p $PROJECT down)"
for port in 8080 9090; do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && die "port $port is in use; the documented commands publish it"
done
CLAIMED=1

# ---- helpers: the documented commands ------------------------------------------------------
# The one command in FILE's ```sh blocks that is NEEDLE or else contains it (backslash
# continuations joined; the same command may appear more than once). Fails when there is none or
# several differ.
doc_line() {
    python3 - "$1" "$2" <<'EOF'
import sys
path, needle = sys.argv[1], sys.argv[2]
cmds, cur, lang = [], None, None
for line in open(path).read().split("\n"):
    if lang is None and line.startswith("```"):
        lang = line[3:].strip()
        continue
    if lang is not None and line.strip() == "```":
        lang = None
        continue
    if lang not in ("sh", "bash"):
        continue
    cur = line.strip() if cur is None else cur + " " + line.strip()
    if cur.endswith("\\"):
        cur = cur[:-1].rstrip()
        continue
    cmds.append(cur)
    cur = None
hits = [needle] if needle in cmds else sorted({c for c in cmds if needle in c})
if len(hits) != 1:
    sys.exit(f"{path}: {len(hits)} different commands contain '{needle}': {hits}")
print(hits[0])
EOF
}
KEY=""
# doc_run FILE NEEDLE DIR: runs that command in DIR (of the copy) as written, with only the
# official Redis image swapped for the local one and ak-... for the current key; stdout passes.
doc_run() {
    local cmd
    cmd=$(doc_line "$SRC/$1" "$2") || { bad "$1: no command with '$2'"; return 1; }
    cmd=${cmd//redis:7.2-alpine/$REDIS_IMAGE}
    [ -n "$KEY" ] && cmd=${cmd//ak-.../$KEY}
    echo "+ ($1, in .${3#"$SRC"}) $cmd" >&4
    (cd "$3" && HOME=$TESTHOME bash -c "$cmd")
}
# the same, under a pseudo-terminal (what `docker compose exec` gets in a shell)
doc_run_tty() {
    local cmd
    cmd=$(doc_line "$SRC/$1" "$2") || { bad "$1: no command with '$2'"; return 1; }
    echo "+ ($1, in .${3#"$SRC"}, on a terminal) $cmd" >&4
    (cd "$3" && HOME=$TESTHOME script -qec "$cmd" /dev/null </dev/null)
}
# both READMEs give this command identically
doc_same() {
    local a b
    a=$(doc_line "$SRC/README.md" "$1") && b=$(doc_line "$SRC/docker/README.md" "$1") && [ "$a" = "$b" ] && ok ||
        bad "README.md and docker/README.md differ on '$1': '$a' vs '$b'"
}
# wait_healthy CONTAINER: the image's HEALTHCHECK reports healthy (90 s at most)
wait_healthy() {
    local s=""
    for _ in $(seq 180); do
        s=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$1" 2>/dev/null) || s=gone
        [ "$s" = healthy ] || [ "$s" = gone ] || [ "$s" = none ] && break
        sleep 0.5
    done
    check '[ "$s" = healthy ]' "$1: health $s after 90 s; logs: $(docker logs --tail 20 "$1" 2>&1)"
}
code() { curl -s -o "$TMP/body" -w '%{http_code}' --max-time 30 "$@"; }
# the API with a key on localhost:8080: /health, a completion with the key, 401 without or wrong
api_checks() { # what
    local c
    c=$(code localhost:8080/health)
    check '[ "$c" = 200 ] && grep -q "\"ok\"" "$TMP/body"' "$1: /health $c $(cat "$TMP/body")"
    c=$(code localhost:8080/v1/completions -H "Authorization: Bearer $KEY" \
        -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":24,"temperature":0}')
    check '[ "$c" = 200 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d[\"choices\"][0][\"text\"]) > 20 and d[\"usage\"][\"completion_tokens\"] == 24" "$TMP/body"' \
        "$1: completion with the key: $c $(head -c 300 "$TMP/body")"
    c=$(code localhost:8080/v1/completions -d '{"model":"stories260K","prompt":"Hi","max_tokens":4}')
    check '[ "$c" = 401 ] && grep -q invalid_api_key "$TMP/body"' "$1: no key: $c $(head -c 300 "$TMP/body")"
    c=$(code localhost:8080/v1/completions -H "Authorization: Bearer ak-000000000000000000000000000000000000000000000000" \
        -d '{"model":"stories260K","prompt":"Hi","max_tokens":4}')
    check '[ "$c" = 401 ]' "$1: a wrong key: $c $(head -c 300 "$TMP/body")"
}

# ---- the copy of the tree, and HOME with the model -----------------------------------------
SRC=$TMP/src
TESTHOME=$TMP/home
mkdir -p "$SRC" "$TESTHOME/models"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
        [ -e "$f" ] && printf '%s\0' "$f"; done | tar --null -T - -cf -) | tar -xf - -C "$SRC"
else
    (cd "$ROOT" && tar --exclude=./.git --exclude=./build --exclude='./build-*' -cf - .) | tar -xf - -C "$SRC"
fi
rm -f "$SRC/docker/arka.env"
cp "$MODEL" "$TESTHOME/models/stories260K.gguf"
chmod 755 "$TESTHOME" "$TESTHOME/models"
chmod 644 "$TESTHOME/models/stories260K.gguf"

# ---- 2. the secret scheme of the deploy files ----------------------------------------------
python3 - "$SRC" >"$TMP/secret.out" 2>&1 <<'EOF'
import os, re, sys, yaml
root = sys.argv[1]
fails = []
c = yaml.safe_load(open(os.path.join(root, "docker/compose.yml")))
for s in ("gateway", "gateway-cuda"):
    sv = c["services"][s]
    ef = sv.get("env_file")
    ef = [ef] if isinstance(ef, str) else (ef or [])
    if "arka.env" not in ef: fails.append(f"compose {s}: env_file is not arka.env: {ef}")
    if "ARKA_AUTH_SECRET" in (sv.get("environment") or {}): fails.append(f"compose {s}: ARKA_AUTH_SECRET in environment")
for d, _, fs in os.walk(os.path.join(root, "docker")):
    for f in fs:
        if not f.endswith((".yml", ".yaml", ".conf")) and not f.startswith(("Dockerfile", ".env")): continue
        for i, line in enumerate(open(os.path.join(d, f)), 1):
            code = line.split("#")[0]
            if re.search(r"AUTH_SECRET\s*[:=]\s*\S|auth-secret\s*=", code):
                fails.append(f"{os.path.relpath(os.path.join(d, f), root)}:{i}: a literal auth secret: {line.strip()}")
dep = next(x for x in yaml.safe_load_all(open(os.path.join(root, "docker/k8s/deployment.yaml"))) if x)
ct = dep["spec"]["template"]["spec"]["containers"][0]
if {"secretRef": {"name": "arka-auth"}} not in ct.get("envFrom", []): fails.append("k8s deployment: no envFrom secretRef arka-auth")
if any(e.get("name") == "ARKA_AUTH_SECRET" and "value" in e for e in ct.get("env", [])): fails.append("k8s deployment: ARKA_AUTH_SECRET has a value")
if "arka-auth --from-env-file=docker/arka.env" not in open(os.path.join(root, "docker/README.md")).read():
    fails.append("docker/README.md: no `kubectl create secret generic arka-auth --from-env-file=docker/arka.env`")
for ign in (".dockerignore", "docker/.gitignore"):
    if "arka.env" not in open(os.path.join(root, ign)).read(): fails.append(f"{ign} does not keep arka.env out")
for m in fails: print(m)
sys.exit(1 if fails else 0)
EOF
check '[ $? -eq 0 ]' "secret scheme: $(cat "$TMP/secret.out")"

# The CUDA image cannot be built here: its run stage must match the gateway image's where they
# serve alike (user, workdir, port, stop signal, health check, entrypoint, files, ARKA_* defaults).
python3 - "$SRC" >"$TMP/cuda.out" 2>&1 <<'EOF'
import os, re, sys
def run_stage(path):
    text = re.sub(r"\\\n\s*", " ", open(path).read())
    lines = [l.strip() for l in text.split("\n") if l.strip() and not l.lstrip().startswith("#")]
    last = max(i for i, l in enumerate(lines) if l.startswith("FROM "))
    out = set()
    for l in lines[last + 1:]:
        op, _, rest = l.partition(" ")
        if op in ("USER", "WORKDIR", "EXPOSE", "STOPSIGNAL", "ENTRYPOINT") or (op == "COPY" and not rest.startswith("--from=")):
            out.add(l)
        elif op == "COPY":
            out.add("COPY " + rest.split(" ", 1)[1])   # the build stage's name may differ
        elif op == "HEALTHCHECK":
            out.add("HEALTHCHECK " + rest[rest.index("CMD"):])
        elif op == "ENV":
            out.update("ENV " + kv for kv in rest.split() if kv.split("=")[0] in ("ARKA_CONFIG", "ARKA_HOST", "ARKA_PORT"))
        elif op == "RUN" and "useradd" in rest:
            out.add("RUN " + rest[rest.index("useradd"):].split("&&")[0].strip())
    return out
g = run_stage(os.path.join(sys.argv[1], "docker/Dockerfile.gateway"))
c = run_stage(os.path.join(sys.argv[1], "docker/Dockerfile.executor-cuda"))
if g != c or len(g) < 10:
    sys.exit(f"gateway only: {sorted(g - c)}; cuda only: {sorted(c - g)}")
EOF
check '[ $? -eq 0 ]' "Dockerfile.executor-cuda's run stage differs from Dockerfile.gateway's: $(cat "$TMP/cuda.out")"

# ---- 3. the gateway image ------------------------------------------------------------------
doc_same 'docker build -f docker/Dockerfile.gateway -t arka-gateway .'
t=$(date +%s)
# the build stage under a tag: kept as the compile cache of the next run
(cd "$SRC" && docker build -q -f docker/Dockerfile.gateway --target build -t arka-gateway:build . >"$TMP/build.log" 2>&1) ||
    { tail -30 "$TMP/build.log"; die "the build stage of Dockerfile.gateway failed"; }
doc_run README.md 'docker build -f docker/Dockerfile.gateway' "$SRC" >"$TMP/build.log" 2>&1 ||
    { tail -30 "$TMP/build.log"; die "docker build -f docker/Dockerfile.gateway failed"; }
say "gateway image built in $(($(date +%s) - t)) s"
user=$(docker image inspect -f '{{.Config.User}}' arka-gateway)
uid=$(docker run --rm --entrypoint id arka-gateway -u)
check '[ "$user" = arka ] && [ "$uid" = 10001 ]' "image user '$user' uid '$uid' (want arka, 10001)"
hc=$(docker image inspect -f '{{json .Config.Healthcheck.Test}}' arka-gateway)
check '[[ "$hc" == *arka-healthcheck* ]]' "image HEALTHCHECK: $hc"
ep=$(docker image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' arka-gateway)
check '[ "$ep" = "[\"arka\"] [\"serve\"]" ]' "entrypoint and command: $ep"
comp=$(docker run --rm --entrypoint sh arka-gateway -c \
    'for c in cc gcc g++ c++ clang cpp cmake make ld as nvcc; do command -v $c; done; ls /usr/include 2>/dev/null | head -3')
check '[ -z "$comp" ]' "the run stage has compilers or headers: $comp"
size=$(docker image inspect -f '{{.Size}}' arka-gateway)
say "arka-gateway: $((size / 1000000)) MB (base debian:12-slim $(($(docker image inspect -f '{{.Size}}' debian:12-slim) / 1000000)) MB)"
check '[ "$size" -lt 150000000 ]' "arka-gateway is $size bytes (over 150 MB)"

t=$(date +%s)
for s in redis prometheus; do
    docker build -q -f "$SRC/tests/docker/$s.Dockerfile" -t "arka-test-$s" "$SRC/tests/docker" >"$TMP/build.log" 2>&1 ||
        { tail -20 "$TMP/build.log"; die "tests/docker/$s.Dockerfile failed"; }
done
say "test images (Redis, Prometheus from Debian packages) in $(($(date +%s) - t)) s"

# ---- 4a. docker run with a keys file, and SIGTERM while streams run -----------------------
say "docker run with a keys file"
D=$SRC/docker
doc_run docker/README.md 'docker volume create arka-keys' "$D" >/dev/null || die "docker volume create failed"
KEY=$(doc_run docker/README.md 'keys create --tenant demo --keys-file' "$D" 2>"$TMP/err")
check '[[ "$KEY" =~ ^ak-[0-9a-f]{48}$ ]]' "keys create (keys file) printed '$KEY': $(cat "$TMP/err")"
doc_run docker/README.md 'ARKA_KEYS_FILE=' "$D" >/dev/null || die "docker run (keys file) failed"
docker logs -f arka >"$TMP/arka-keys.log" 2>&1 &
BG+=($!)
wait_healthy arka
api_checks "keys file"
c=$(doc_run docker/README.md 'curl -s localhost:8080/v1/completions' "$D" 2>/dev/null)
check '[[ "$c" == *"\"finish_reason\":\"length\""* ]]' "docker/README.md's curl: $c"

# eight streams (the key's concurrency), then docker stop while they run
for i in 1 2 3 4 5 6 7 8; do
    curl -sN --max-time 60 localhost:8080/v1/completions -H "Authorization: Bearer $KEY" \
        -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":2000,"stream":true,"stream_options":{"include_usage":true}}' \
        >"$TMP/stream$i" 2>&1 &
    BG+=($!)
    spids[$i]=$!
done
for _ in $(seq 100); do
    n=0
    for i in 1 2 3 4 5 6 7 8; do grep -q '^data: {' "$TMP/stream$i" && n=$((n + 1)); done
    [ $n = 8 ] && break
    sleep 0.1
done
unfinished=0
for i in 1 2 3 4 5 6 7 8; do grep -q '^data: \[DONE\]' "$TMP/stream$i" || unfinished=$((unfinished + 1)); done
docker wait arka >"$TMP/exit" 2>&1 &
wpid=$!
BG+=($wpid)
t=$(date +%s.%N)
doc_run docker/README.md 'docker stop arka' "$D" >/dev/null 2>&1 &
stop_pid=$!
# the drain starts when the gateway sees SIGTERM (docker stop's delivery can take a moment on a
# busy machine): /health must stop answering 200 (refused, or 503) within 5 s
c=200
for _ in $(seq 50); do
    sleep 0.1
    c=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 localhost:8080/health)
    [ "$c" != 200 ] && break
done
wait $stop_pid
stop_s=$(python3 -c "import time; print(f'{time.time() - $t:.1f}')")
wait $wpid
for i in 1 2 3 4 5 6 7 8; do wait "${spids[$i]}"; done
say "docker stop with $unfinished of 8 streams running took $stop_s s"
check '[ $unfinished -ge 1 ]' "drain: every stream had finished before docker stop (nothing in flight to drain)"
check '[ "$c" != 200 ]' "drain: /health still answered 200 5 s after SIGTERM (must be refused or 503)"
check 'python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 30 else 1)" $stop_s' "drain: docker stop took $stop_s s (drain timeout 30 s)"
check '[ "$(cat "$TMP/exit")" = 0 ]' "drain: container exit status '$(cat "$TMP/exit")' (want 0)"
for i in 1 2 3 4 5 6 7 8; do
    check 'grep -q "\"finish_reason\":\"length\"" "$TMP/stream$i" && grep -q "\"completion_tokens\":2000" "$TMP/stream$i" && tail -n 2 "$TMP/stream$i" | grep -qx "data: \[DONE\]"' \
        "drain: stream $i did not end cleanly: $(tail -c 400 "$TMP/stream$i")"
done
check 'grep -q "signal received" "$TMP/arka-keys.log" && grep -q "shutting down" "$TMP/arka-keys.log" && grep -q "executor stopped" "$TMP/arka-keys.log"' \
    "drain: the gateway log lacks signal / shutting down / executor stopped: $(tail -5 "$TMP/arka-keys.log")"
docker volume rm arka-keys >/dev/null

# ---- 4b. docker run with Redis -------------------------------------------------------------
say "docker run with Redis"
KEY=""
doc_run docker/README.md 'echo "ARKA_AUTH_SECRET=' "$D" || die "making arka.env failed"
check '[ "$(stat -c %a "$D/arka.env")" = 600 ] && grep -Eq "^ARKA_AUTH_SECRET=[0-9a-f]{64}$" "$D/arka.env"' "arka.env: $(stat -c %a "$D/arka.env")"
doc_run docker/README.md 'docker network create arka' "$D" >/dev/null || die "docker network create failed"
doc_run docker/README.md 'docker run -d --rm --name arka-redis' "$D" >/dev/null || die "docker run redis failed"
sleep 1
KEY=$(doc_run docker/README.md '-e ARKA_REDIS=redis://arka-redis:6379 arka-gateway keys create' "$D" 2>"$TMP/err")
check '[[ "$KEY" =~ ^ak-[0-9a-f]{48}$ ]]' "keys create (Redis) printed '$KEY': $(cat "$TMP/err")"
doc_run docker/README.md 'ARKA_MODEL=/models/stories260K.gguf -e ARKA_REDIS=' "$D" >/dev/null || die "docker run (Redis) failed"
wait_healthy arka
api_checks "Redis"
nk=$(docker exec arka-redis redis-cli dbsize 2>&1)
check '[ "$nk" -ge 1 ] 2>/dev/null' "Redis holds no keys after keys create: $nk"
doc_run docker/README.md 'docker stop arka arka-redis' "$D" >/dev/null 2>&1
check '! docker container inspect arka arka-redis >/dev/null 2>&1 && ! docker network inspect arka >/dev/null 2>&1' \
    "docker stop arka arka-redis && docker network rm arka left something"

# ---- 5. compose ----------------------------------------------------------------------------
say "compose"
KEY=""
export COMPOSE_FILE=compose.yml:../tests/docker/compose.test.yml COMPOSE_PROJECT_NAME=$PROJECT
doc_same 'docker compose --profile cpu up'
doc_same 'docker compose exec gateway arka keys create'
doc_run README.md 'cd docker && echo "ARKA_AUTH_SECRET=' "$SRC" || die "README.md's arka.env command failed"
t=$(date +%s)
doc_run README.md 'docker compose --profile cpu up' "$D" >"$TMP/up.log" 2>&1 ||
    { tail -30 "$TMP/up.log"; die "docker compose --profile cpu up failed"; }
say "compose up in $(($(date +%s) - t)) s"
svc() { docker ps --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1" -q; }
running=$(docker ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Label "com.docker.compose.service"}}' | sort | tr '\n' ' ')
check '[ "$running" = "gateway prometheus redis " ]' "compose services running: '$running' (want gateway prometheus redis)"
gw=$(svc gateway)
[ -n "$gw" ] || die "no gateway container"
wait_healthy "$gw"
KEY=$(doc_run_tty README.md 'docker compose exec gateway arka keys create' "$D" 2>&1 | grep -Eo 'ak-[0-9a-f]{48}' | head -1)
check '[ -n "$KEY" ]' "docker compose exec gateway arka keys create printed no key"
c=$(doc_run docker/README.md 'curl -H "Authorization: Bearer ak-...' "$D" 2>/dev/null)
check '[[ "$c" == *"\"id\":\"stories260K\""* ]]' "docker/README.md's /v1/models with the key: $c"
api_checks "compose"

# Prometheus: the gateway target up, then dashboard queries with data once requests have come
prom() { curl -s --max-time 5 "localhost:9090/api/v1/$1" "${@:2}"; }
up=""
for _ in $(seq 60); do
    up=$(prom targets | python3 -c 'import json,sys; print(" ".join(t["labels"]["job"] + "=" + t["health"] for t in json.load(sys.stdin)["data"]["activeTargets"]))' 2>/dev/null)
    [ "$up" = "arka=up" ] && break
    sleep 1
done
check '[ "$up" = "arka=up" ]' "Prometheus targets: '$up' (want arka=up)"
# two of the dashboard's queries (Grafana's variables filled in) after a few requests: tokens/s,
# and requests/s with tenant demo among them, above 0
cat >"$TMP/dash.py" <<'EOF'
import json, sys, urllib.parse, urllib.request
d = json.load(open(sys.argv[1]))
want = {"Tokens/s": "generation_tokens_total", "Requests/s per tenant": "tenant_requests_total"}
qs = []
def walk(ps):
    for p in ps:
        if p.get("type") == "row":
            walk(p.get("panels", []))
            continue
        qs.extend(t["expr"] for t in p.get("targets", []) if want.get(p.get("title"), "-") in t["expr"])
walk(d["panels"])
if len(qs) != 2:
    sys.exit(f"the dashboard's Tokens/s and per-tenant queries: found {qs}")
out = []
for q in qs:
    q = q.replace("$__rate_interval", "1m").replace("$model_name", ".*")
    r = json.load(urllib.request.urlopen("http://localhost:9090/api/v1/query?" + urllib.parse.urlencode({"query": q}), timeout=5))
    res = r["data"]["result"]
    out.append(f"{q} -> " + ", ".join(f"{x['metric']} {float(x['value'][1]):.2f}" for x in res))
    if not res or not all(float(x["value"][1]) > 0 for x in res) or \
            ("tenant" in q and not any(x["metric"].get("tenant") == "demo" for x in res)):
        sys.exit("no data (yet): " + "; ".join(out))
print("; ".join(out))
EOF
for _ in $(seq 30); do
    for _ in 1 2 3; do
        code localhost:8080/v1/completions -H "Authorization: Bearer $KEY" -d '{"model":"stories260K","prompt":"Once","max_tokens":16}' >/dev/null
    done
    sleep 2
    python3 "$TMP/dash.py" "$SRC/dashboards/grafana/arka.json" >"$TMP/dash.out" 2>&1 && break
done
check 'python3 "$TMP/dash.py" "$SRC/dashboards/grafana/arka.json" >"$TMP/dash.out" 2>&1' "dashboard queries: $(cat "$TMP/dash.out")"
say "dashboard queries: $(cat "$TMP/dash.out")"

t=$(date +%s)
doc_run docker/README.md 'docker compose down' "$D" >"$TMP/down.log" 2>&1 || { tail -20 "$TMP/down.log"; bad "docker compose down failed"; }
say "compose down in $(($(date +%s) - t)) s"
left=$(docker ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}')
check '[ -z "$left" ] && ! docker network inspect ${PROJECT}_default >/dev/null 2>&1' "after docker compose down: containers '$left', network ${PROJECT}_default: $(docker network ls -q --filter name=${PROJECT})"
