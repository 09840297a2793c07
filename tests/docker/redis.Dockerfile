# Redis for tests/docker/run.sh, built from debian:12-slim with Debian's redis-server package,
# standing in for the official redis image docker/compose.yml and docker/README.md name (public
# image registries may be unreachable where the test runs). Behaves like it where the project
# relies on it: `redis-server ARGS` as the command, data in /data, not root, protected mode off
# (the official image builds Redis with that default: the container network is the boundary).
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir /data && chown redis:redis /data \
 && printf '#!/bin/sh\nexec /usr/bin/redis-server "$@" --protected-mode no\n' >/usr/local/bin/redis-server \
 && chmod 755 /usr/local/bin/redis-server
USER redis
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]
