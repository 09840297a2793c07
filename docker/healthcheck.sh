#!/bin/sh
# HEALTHCHECK of the ArkaTensor images (installed as /usr/local/bin/arka-healthcheck): GET /health
# on ARKA_PORT when the container runs `arka serve`; 200 once an executor is ready. A container
# running another command (generate, bench, keys) has no server, and counts as healthy.
tr '\0' '\n' </proc/1/cmdline | grep -qx serve || exit 0
exec curl -fsS -o /dev/null --max-time 3 "http://127.0.0.1:${ARKA_PORT:-8080}/health"
