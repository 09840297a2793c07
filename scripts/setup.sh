#!/usr/bin/env bash
# Installs every Debian package ArkaTensor needs to build, test and serve. Idempotent and quiet:
# when everything is present it does nothing; otherwise one `apt-get update` and one install.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git curl ca-certificates
  libuv1-dev node-llhttp libhiredis-dev libcjson-dev libssl-dev libcurl4-openssl-dev
  redis-server python3
  python3-jinja2  # tests/integration/test_tmpl_real.sh: the Python Jinja2 cross-check of chat templates
  python3-jsonschema  # tests/integration/test_structured.sh: outputs validated against their schemas
  prometheus  # promtool: test_gw_metrics checks /metrics text, test_dashboards checks rules and config
  clang libclang-rt-dev
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (integration tests install their npm clients themselves): Debian's packages only
# when no node/npm is on PATH. A machine with another Node.js build (NodeSource's bundles npm)
# keeps it: Debian's npm conflicts with that nodejs and apt refuses the whole install.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
