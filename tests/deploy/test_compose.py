"""deploy/compose.yaml brought up by what Debian 12 ships: podman-compose 1.0.3 driving podman 4.3.

Debian 12 packages no Compose v2, and its docker-compose 1.29 cannot run the file (it hands
``systempaths=unconfined`` to the engine, which refuses it: the last test here pins that, on the
docker engine the tests start); podman-compose runs it as written,
with the run arguments docs/deployment.md gives. The test brings it up with deploy/compose-up.sh
(``up -d``, then a wait for /readyz) on a published port other than the default, calls /healthz
and a run over HTTP whose download link must name that port, brings it down without the
variables ``up`` needed, and checks that nothing of the project is left; a server that cannot
start makes compose-up.sh exit non-zero, showing why.

Podman runs on these machines only inside a mount namespace without the hybrid cgroup's v2 mount
(tests/containers/podman-wrapper). Here every podman call of the test enters one such namespace,
held by a process the test starts: the network namespace podman mounts for the published port must
stay visible from one call (``up``) to the next (``down``), which one namespace per call breaks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from container_helpers import (
    DOCKER_RUN,
    PODMAN_WRAPPER,
    docker_daemon,
    server_image_in,
    server_image_in_docker,
    server_ready,
)
from mcp_test_helpers import CALL_BOUND, free_port, http_client, new_conversation

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "compose.yaml"
COMPOSE_UP = REPO / "deploy" / "compose-up.sh"
IMAGE = "localhost/mcp-sandbox:latest"
TOKEN = "compose-token-0123456789abcdef"
METRICS = "compose-metrics-0123456789abcdef"
# What docs/deployment.md runs podman-compose with (1.0.3 reads neither pids_limit nor stop_grace_period).
RUN_ARGS = "--pids-limit=1024 --stop-timeout=40"
DOWN_TIMEOUT = "40"


def _needs(reason: str) -> None:
    if os.environ.get("MCP_SANDBOX_TEST_REQUIRE") or os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A podman for podman-compose's ``--podman-path``: the wrapper's settings, in one held mount namespace."""
    missing = [tool for tool in ("podman", "podman-compose", "unshare", "nsenter") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        _needs(f"needs root and {', '.join(missing) or 'podman'} (apt install podman podman-compose)")
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "umount /sys/fs/cgroup/unified 2>/dev/null; echo ready; exec sleep 3600"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        script = tmp_path_factory.mktemp("podman") / "podman"
        script.write_text(
            "#!/bin/sh\n"
            f"CONTAINERS_CONF={PODMAN_WRAPPER.parent / 'containers.conf'}\n"
            "export CONTAINERS_CONF\n"
            # As the wrapper: podman drops containers.conf's ulimits once a command names one.
            'if [ "${1:-}" = run ]; then shift\n'
            '    set -- run --ulimit nproc=4096:4096 --ulimit nofile=1024:1024 "$@"\n'
            "fi\n"
            f'exec nsenter --target {holder.pid} --mount --wd="$PWD" /usr/bin/podman "$@"\n'
        )
        script.chmod(0o755)
        server_image_in(script, IMAGE)
        yield script
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


def _compose_env(port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MCP_SANDBOX_")}
    return {
        **env,
        "MCP_SANDBOX_TOKEN": TOKEN,
        "MCP_SANDBOX_METRICS_TOKEN": METRICS,
        "MCP_SANDBOX_PUBLISHED_PORT": str(port),
    }


def _without_secrets(env: dict[str, str]) -> dict[str, str]:
    """What a shell that never exported the tokens has: `down` must work with it."""
    return {key: value for key, value in env.items() if not key.endswith("_TOKEN")}


async def test_podman_compose_brings_the_deployment_up_serves_runs_and_leaves_nothing(podman: Path) -> None:
    port = free_port()  # not the default 8765: the links must follow it
    project = f"mcpcompose{uuid.uuid4().hex[:8]}"
    env = _compose_env(port)
    command = ["podman-compose", "--podman-path", str(podman), "-p", project]
    compose = [*command, "-f", str(COMPOSE)]
    label = f"label=io.podman.compose.project={project}"

    async def podman_out(*args: str) -> str:
        with anyio.fail_after(120):
            done = await anyio.run_process([str(podman), *args], check=False)
        return done.stdout.decode(errors="replace").strip()

    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        with anyio.fail_after(300):
            up = await anyio.run_process(
                [str(COMPOSE_UP), *command, f"--podman-run-args={RUN_ARGS}"], env=env, check=False
            )
        assert up.returncode == 0, up.stdout.decode()[-3000:] + up.stderr.decode()[-3000:]
        up_seconds = time.monotonic() - started
        async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
            await server_ready(web, base)
            ready_seconds = time.monotonic() - started
            assert (await web.get(f"{base}/healthz")).json() == {"status": "ok"}
            async with http_client(base, TOKEN) as client:
                ran = await client.call_tool("run_python", {"code": "import numpy; print(numpy.arange(4).sum())"})
                assert ran.structured_content is not None and ran.structured_content["stdout"].strip() == "6", ran
                code = "open('/data/out.txt', 'w').write('made')"
                made = await client.call_tool("run_python", {"code": code, "conversationId": new_conversation()})
            assert made.structured_content is not None, made
            (link,) = [f["url"] for f in made.structured_content["files"] if f["name"] == "out.txt"]
            assert link.startswith(f"{base}/files/"), link  # the published port, not the container's
            assert (await web.get(link)).text == "made"
            assert (await web.post(f"{base}/mcp", json={})).status_code == 401  # no token, no service
            scrape = await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})
            assert scrape.status_code == 200 and "mcp_sandbox_runs_total" in scrape.text
        # What the file and the run args asked for reached the container.
        container = await podman_out("ps", "--all", "--filter", label, "--format", "{{.Names}}")
        shown = await podman_out(
            "inspect", container, "--format",
            "{{.HostConfig.PidsLimit}} {{.Config.StopTimeout}} {{.HostConfig.ReadonlyRootfs}} {{.Config.User}}",
        )  # fmt: skip
        assert shown.split() == ["1024", "40", "true", "10001:10001"], shown
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(300):
            down_started = time.monotonic()
            down = await anyio.run_process(
                [*compose, "down", "-t", DOWN_TIMEOUT, "-v"], env=_without_secrets(env), check=False
            )
            down_seconds = time.monotonic() - down_started
            # podman-compose 1.0.3's `down` leaves the project's network (docs/deployment.md says so).
            await podman_out("network", "rm", f"{project}_default")
    assert down.returncode == 0, down.stdout.decode()[-3000:] + down.stderr.decode()[-3000:]
    assert b"Traceback" not in down.stderr, down.stderr.decode()[-3000:]
    print(f"podman-compose up {up_seconds:.1f} s, ready {ready_seconds:.1f} s, down {down_seconds:.1f} s")
    for kind, name in (("ps --all", "{{.Names}}"), ("volume ls", "{{.Name}}"), ("network ls", "{{.Name}}")):
        left = await podman_out(*kind.split(), "--filter", label, "--format", name)
        assert left == "", f"{kind}: {left}"


async def test_compose_up_exits_non_zero_showing_why_when_the_server_cannot_start(podman: Path) -> None:
    port = free_port()
    project = f"mcpcompose{uuid.uuid4().hex[:8]}"
    # A setting the server refuses: it exits at start, and the container's restarts never serve.
    env = {**_compose_env(port), "MCP_SANDBOX_METRICS_TOKEN": "short", "MCP_SANDBOX_UP_TIMEOUT": "15"}
    command = ["podman-compose", "--podman-path", str(podman), "-p", project]
    try:
        with anyio.fail_after(300):
            up = await anyio.run_process([str(COMPOSE_UP), *command], env=env, check=False)
            unset = await anyio.run_process([str(COMPOSE_UP), *command], env=_without_secrets(env), check=False)
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(300):
            down = [*command, "-f", str(COMPOSE), "down", "-t", "1", "-v"]
            await anyio.run_process(down, env=_without_secrets(env), check=False)
            # A container restarting (its policy) while `down` stops it can outlive `down`.
            label = f"label=io.podman.compose.project={project}"
            await anyio.run_process([str(podman), "rm", "--force", "--filter", label], check=False)
            await anyio.run_process([str(podman), "network", "rm", f"{project}_default"], check=False)

    assert up.returncode == 1, up.stdout.decode()[-3000:]
    assert b"metrics_token: must be at least 16 characters" in up.stderr, up.stderr.decode()[-3000:]
    assert unset.returncode == 2 and b"set MCP_SANDBOX_TOKEN" in unset.stderr, unset.stderr.decode()


def test_debians_docker_compose_1_29_cannot_run_the_file_as_the_docs_say() -> None:
    """docs/deployment.md tells Debian 12's docker-compose 1.29 apart: this is the reason it gives."""
    if shutil.which("docker-compose") is None:
        _needs("needs docker-compose (apt install docker-compose)")
    with docker_daemon() as why:
        if why is not None:
            _needs(why)
        server_image_in_docker(IMAGE)  # else `up` stops at pulling it, before the option it refuses
        project = f"mcpcompose{uuid.uuid4().hex[:8]}"
        env = {**_compose_env(free_port()), "DOCKER_HOST": f"unix://{DOCKER_RUN / 'docker.sock'}"}
        compose = ["docker-compose", "-p", project, "-f", str(COMPOSE)]
        try:
            # It reads the file (and the seccomp profile, from the file's directory) ...
            config = subprocess.run(
                [*compose, "config"], cwd=COMPOSE.parent, env=env, capture_output=True, text=True, timeout=120
            )
            assert config.returncode == 0, config.stderr
            # ... but the engine refuses what it hands over for systempaths=unconfined.
            up = subprocess.run(
                [*compose, "up", "-d"], cwd=COMPOSE.parent, env=env, capture_output=True, text=True, timeout=300
            )
            assert up.returncode != 0 and 'invalid --security-opt 2: "systempaths=unconfined"' in up.stderr, up.stderr
        finally:
            subprocess.run([*compose, "down", "-v"], cwd=COMPOSE.parent, env=env, capture_output=True, timeout=300)
