#!/bin/sh
# `docker compose` for a Docker CLI without the Compose v2 plugin (Debian 12 packages only Compose
# v1, `docker-compose` 1.29): a CLI plugin that hands its arguments to docker-compose.
# tests/docker/run.sh installs it into a private DOCKER_CONFIG (cli-plugins/docker-compose) only
# when `docker compose` is missing.
if [ "$1" = docker-cli-plugin-metadata ]; then
    echo '{"SchemaVersion":"0.1.0","Vendor":"ArkaTensor tests","Version":"v1","ShortDescription":"docker-compose (v1) as docker compose"}'
    exit 0
fi
[ "$1" = compose ] && shift
exec docker-compose "$@"
