#!/usr/bin/env bash
# Makes the Debian 12 base images the Dockerfiles start from, `debian:12` and `debian:12-slim`,
# locally: debootstrap (minbase) from the Debian mirror, then `docker import`. For a machine whose
# Docker engine cannot reach a public image registry but can reach a Debian mirror; elsewhere
# `docker pull debian:12 debian:12-slim` gives the official ones. Like the official images: apt
# sources for bookworm, bookworm-updates and bookworm-security; no package caches or lists; the
# slim one without documentation, man pages and translations (and dpkg told to keep them out).
#
#   scripts/docker-base-image.sh            make both tags (skips one that already exists)
#   scripts/docker-base-image.sh --force    make them again
# Environment: ARKA_DEBIAN_MIRROR (default http://deb.debian.org/debian; the security suite is
# taken from the same host's debian-security). Needs root, debootstrap (installed when missing)
# and a running Docker engine.
set -euo pipefail

MIRROR=${ARKA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
force=0
[ "${1:-}" = --force ] && force=1

have() { docker image inspect "$1" >/dev/null 2>&1; }
if [ $force = 0 ] && have debian:12 && have debian:12-slim; then
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "docker-base-image.sh: debootstrap needs root" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "docker-base-image.sh: no Docker engine answers (docker info failed)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap; } >/dev/null 2>&1 ||
        { echo "docker-base-image.sh: apt-get install debootstrap failed" >&2; exit 1; }
fi

work=$(mktemp -d /var/tmp/arka-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
t0=$(date +%s)
echo "docker-base-image.sh: debootstrap $SUITE from $MIRROR" >&2
if ! debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$work/log" 2>&1; then
    tail -20 "$work/log" >&2
    echo "docker-base-image.sh: debootstrap failed (log above)" >&2
    exit 1
fi

# apt: the three suites, nothing cached (what the official image's apt.conf.d/docker-* do)
host=${MIRROR%/debian}
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $host/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'APT::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
       "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/*
: >"$root/etc/hostname"
: >"$root/etc/resolv.conf"
rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"

import() { # rootfs tag
    tar -C "$1" --numeric-owner -c . |
        docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
                      --change 'CMD ["bash"]' --message "debootstrap $SUITE ($MIRROR)" - "$2" >/dev/null
}
import "$root" debian:12

# slim: the same tree without docs, man pages and translations, and dpkg told to keep them out
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/man/* "$root"/usr/share/groff/* "$root"/usr/share/info/* "$root"/usr/share/lintian/* \
       "$root"/usr/share/linda/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
import "$root" debian:12-slim

echo "docker-base-image.sh: made debian:12 ($(docker image inspect -f '{{.Size}}' debian:12 | awk '{printf "%.0f MB", $1/1e6}')) and debian:12-slim ($(docker image inspect -f '{{.Size}}' debian:12-slim | awk '{printf "%.0f MB", $1/1e6}')) in $(($(date +%s) - t0)) s" >&2
