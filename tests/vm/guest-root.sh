#!/bin/bash
# One vm-test step run in the guest as root, as an operator would (see guest-job.sh): guest-root.sh STEP.
# Exit 0: pass; 77: skip (says why); else fail. Everything comes from the read-only shares: the
# checkout (/mnt/src) and the host's wheelhouse (/mnt/wheelhouse; the guest has no network).
set -euo pipefail
step=$1
src=/mnt/src
wheels=/mnt/wheelhouse
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Python writes its bytecode caches, as on an operator's machine (see guest-user.sh).
export UV_NO_CACHE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
unset PYTHONDONTWRITEBYTECODE
since() { python3 -c "print(round($(date +%s.%N) - $1, 1))"; }

echo "== $step as $(id -un) ($(id -u))"
case $step in
systemd-unit)
    # docs/deployment.md's systemd block, as written, from the checkout. Only where the server
    # comes from differs: the host's wheelhouse (no network here), with uv in place of pip (pip
    # runs 5-10x slower under emulation; the same venv in the same place, and setup then uses uv),
    # compiling the bytecode as pip does: the service's user cannot write it into the root-owned
    # venv, so without it every start of the server compiles all it imports.
    block=$(awk '/^<!-- vm-test: systemd/ {marked = 1; next}
                 marked && /^```sh$/ {inside = 1; next}
                 inside && /^```$/ {exit}
                 inside {print}' "$src/docs/deployment.md")
    [ -n "$block" ] || { echo "FAIL: no block marked 'vm-test: systemd' in docs/deployment.md"; exit 1; }
    venv_line='python3 -m venv /opt/mcp-sandbox/.venv'
    pip_line='/opt/mcp-sandbox/.venv/bin/pip install git+https://'
    setup_line='/opt/mcp-sandbox/.venv/bin/mcp-sandbox setup --data-dir /opt/mcp-sandbox/.runtime'
    for line in "$venv_line" "$pip_line" "$setup_line"; do
        grep -qF -- "$line" <<< "$block" || { echo "FAIL: the docs' block changed (no '$line'): update this step"; exit 1; }
    done
    script=$(awk -v venv="$venv_line" -v pip="$pip_line" -v setup="$setup_line" -v wheels="$wheels" '
        index($0, venv) == 1 { print "uv venv --python /usr/bin/python3 /opt/mcp-sandbox/.venv"; next }
        index($0, pip) == 1 {
            print "uv pip install --python /opt/mcp-sandbox/.venv/bin/python --compile-bytecode --no-index --find-links " wheels " mcp-sandbox"
            next
        }
        index($0, setup) == 1 { print setup " --no-index --find-links " wheels; next }
        { print }' <<< "$block")
    echo "--- the docs' steps, as run here:"
    echo "$script"
    echo "---"
    started=$(date +%s.%N)
    (cd "$src" && bash -euxo pipefail -c "$script")
    echo "TIME the docs' steps (install, setup, unit started): $(since "$started") s"

    unit=mcp-sandbox
    token=$(sed -n 's/^MCP_SANDBOX_TOKEN=//p' /etc/mcp-sandbox/env)
    [ -n "$token" ] || { echo "FAIL: no MCP_SANDBOX_TOKEN in /etc/mcp-sandbox/env"; exit 1; }
    started=$(date +%s.%N)
    if ! python3 - <<'PY'
import subprocess, time, urllib.request
deadline = time.monotonic() + 300  # the server's start, emulated
while True:
    try:
        with urllib.request.urlopen("http://127.0.0.1:8765/healthz", timeout=10) as reply:
            print("healthz:", reply.status, reply.read().decode())
            break
    except OSError as exc:
        restarts = subprocess.run(["systemctl", "show", "-p", "NRestarts", "--value", "mcp-sandbox"],
                                  capture_output=True, text=True).stdout.strip()
        if restarts not in ("", "0"):
            raise SystemExit(f"the server exited and was restarted ({restarts}) before /healthz answered")
        if time.monotonic() > deadline:
            raise SystemExit(f"no /healthz within 300 s: {exc}")
        time.sleep(1)
PY
    then
        systemctl status --no-pager "$unit" || true
        journalctl --no-pager -u "$unit" | tail -n 40
        exit 1
    fi
    echo "TIME unit started to /healthz: $(since "$started") s"
    main_pid=$(systemctl show -p MainPID --value "$unit")
    user=$(stat -c %U "/proc/$main_pid")
    [ "$user" = mcp-sandbox-server ] || { echo "FAIL: the server runs as '$user', not mcp-sandbox-server"; exit 1; }
    # It took the unit's delegated cgroup over (sandboxes go in siblings of this leaf).
    cgroup=$(sed -n 's/^0:://p' "/proc/$main_pid/cgroup")
    echo "server pid $main_pid as $user in $cgroup"
    case $cgroup in
    */mcp-sandbox.service/mcp-sandbox-server) ;;
    *) echo "FAIL: the server is not in a leaf of its unit's delegated cgroup"; exit 1 ;;
    esac

    # One run over HTTP with the token, through the SDK's client the server's venv carries.
    started=$(date +%s.%N)
    /opt/mcp-sandbox/.venv/bin/python - "$token" <<'PY'
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    headers = {"Authorization": f"Bearer {sys.argv[1]}"}
    async with httpx2.AsyncClient(headers=headers, timeout=600) as web:
        target = streamable_http_client("http://127.0.0.1:8765/mcp", http_client=web)
        async with Client(target, read_timeout_seconds=600) as client:
            result = await client.call_tool("run_python", {"code": "import numpy; print(numpy.arange(4).sum())"})
    data = result.structured_content or {}
    print("run:", data.get("status"), repr(data.get("stdout")))
    assert data.get("status") == "success" and data.get("stdout", "").strip() == "6", result
    async with httpx2.AsyncClient(timeout=60) as web:
        refused = await web.post("http://127.0.0.1:8765/mcp", json={})
    assert refused.status_code == 401, refused.status_code


anyio.run(main)
PY
    echo "TIME one run over HTTP: $(since "$started") s"

    # The documented reload (SIGHUP) keeps the same process serving.
    systemctl reload "$unit"
    sleep 2
    [ "$(systemctl show -p MainPID --value "$unit")" = "$main_pid" ] || { echo "FAIL: reload restarted the server"; exit 1; }
    systemctl is-active --quiet "$unit" || { echo "FAIL: not active after reload"; exit 1; }

    # `systemctl stop` while a run is in flight: the drain lets it finish (KillMode=mixed), and
    # the unit then ends cleanly.
    metrics=$(sed -n 's/^MCP_SANDBOX_METRICS_TOKEN=//p' /etc/mcp-sandbox/env)
    started=$(date +%s.%N)
    /opt/mcp-sandbox/.venv/bin/python - "$token" "$metrics" <<'PY'
import re
import subprocess
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

BASE = "http://127.0.0.1:8765"
result = {}


async def long_run(client: Client) -> None:
    code = "import time\nprint('begun', flush=True)\ntime.sleep(5)\nprint('finished')"
    result["run"] = await client.call_tool("run_python", {"code": code})


async def main() -> None:
    headers = {"Authorization": f"Bearer {sys.argv[1]}"}
    async with httpx2.AsyncClient(headers=headers, timeout=600) as web:
        target = streamable_http_client(f"{BASE}/mcp", http_client=web)
        async with Client(target, read_timeout_seconds=600) as client:
            await client.list_tools()  # before the drain: the client asks for them with the first result
            async with anyio.create_task_group() as group:
                group.start_soon(long_run, client)
                with anyio.fail_after(300):
                    while True:
                        scrape = await web.get(f"{BASE}/metrics", headers={"Authorization": f"Bearer {sys.argv[2]}"})
                        if re.search(r"^mcp_sandbox_runs_running 1\.0$", scrape.text, flags=re.MULTILINE):
                            break
                        await anyio.sleep(0.2)
                subprocess.run(["systemctl", "stop", "--no-block", "mcp-sandbox"], check=True)
                print("systemctl stop sent while the run was in flight")
    data = result["run"].structured_content or {}
    print("run during stop:", data.get("status"), repr(data.get("stdout")))
    assert data.get("status") == "success" and "finished" in data.get("stdout", ""), result["run"]


anyio.run(main)
PY
    for _ in $(seq 120); do
        systemctl is-active --quiet "$unit" || break
        sleep 0.5
    done
    echo "TIME a run in flight, systemctl stop, the unit stopped: $(since "$started") s"
    if systemctl is-active --quiet "$unit"; then echo "FAIL: still $(systemctl is-active "$unit") 60 s after stop"; exit 1; fi
    result=$(systemctl show -p Result --value "$unit")
    status=$(systemctl show -p ExecMainStatus --value "$unit")
    echo "stopped: Result=$result ExecMainStatus=$status"
    if [ "$result" != success ] || [ "$status" != 0 ]; then
        journalctl --no-pager -u "$unit" | tail -n 40
        exit 1
    fi
    left=$(pgrep -u mcp-sandbox-server -a || true)
    [ -z "$left" ] || { echo "FAIL: processes left behind:"; echo "$left"; exit 1; }
    journalctl --no-pager -u "$unit" | tail -n 15
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
