# Prometheus for tests/docker/run.sh, built from debian:12-slim with Debian's prometheus package,
# standing in for the official prom/prometheus image docker/compose.yml names (public image
# registries may be unreachable where the test runs). Same layout as the official image: the
# binary is the entrypoint, flags are the command, config in /etc/prometheus, data under
# /prometheus (also where Debian's default --storage.tsdb.path leads), user nobody.
FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus \
 && rm -rf /var/lib/prometheus/metrics2 && ln -s /prometheus /var/lib/prometheus/metrics2
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
