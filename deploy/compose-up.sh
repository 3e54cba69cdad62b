#!/bin/sh
# Bring deploy/compose.yaml up and wait for the server: exit 0 once /readyz answers on the
# published port, non-zero (with the server's last log lines) when `up` fails or the server is
# not ready in time. podman-compose 1.0.3's `up -d` exits 0 whatever becomes of the container.
#
#   deploy/compose-up.sh docker compose
#   deploy/compose-up.sh podman-compose --podman-run-args='--pids-limit=1024 --stop-timeout=40'
#
# The arguments are the compose command and its global options (-p NAME too); `-f compose.yaml
# up -d` is added. MCP_SANDBOX_PUBLISHED_PORT (8765): where /readyz is asked;
# MCP_SANDBOX_UP_TIMEOUT (120): how many seconds the server has to become ready.
set -eu

if [ $# -eq 0 ]; then
    echo "usage: $0 COMPOSE-COMMAND [GLOBAL-OPTIONS]   (docker compose, or podman-compose ...)" >&2
    exit 2
fi
if [ -z "${MCP_SANDBOX_TOKEN:-}" ]; then
    echo "$0: set MCP_SANDBOX_TOKEN first (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')" >&2
    exit 2
fi
file="$(cd "$(dirname "$0")" && pwd)/compose.yaml"
port="${MCP_SANDBOX_PUBLISHED_PORT:-8765}"
bound="${MCP_SANDBOX_UP_TIMEOUT:-120}"

status=0
"$@" -f "$file" up -d || status=$?
if [ "$status" -ne 0 ]; then
    echo "$0: '$* up -d' failed (exit $status)" >&2
    exit "$status"
fi

if python3 - "$port" "$bound" <<'PY'
import sys, time, urllib.request

port, bound = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + bound
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
then
    echo "ready: http://127.0.0.1:$port"
    exit 0
fi
echo "$0: the server was not ready on port $port within ${bound} s; its last lines:" >&2
"$@" -f "$file" logs --tail 40 >&2 || true
exit 1
