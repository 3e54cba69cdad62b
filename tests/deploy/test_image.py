"""The server's image (`make image`) on the docker engine the tests start, run with deploy/compose.yaml's options.

No compose tool is installed here: the container is started by hand with the same options as
the compose file (checked line by line below), except ``--network host`` in place of the port
mapping, since the tests' engine runs without a bridge. The SDK's client then drives it over HTTP.
Also: the committed seccomp profile is the one the code generates, and the systemd unit passes
``systemd-analyze verify``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from container_helpers import DOCKER_WRAPPER, docker_daemon, server_image_in_docker, server_ready
from mcp_sandbox.sandbox.seccomp import server_oci_profile
from mcp_test_helpers import CALL_BOUND, free_port, http_client

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
IMAGE = "localhost/mcp-sandbox:latest"
TOKEN = "image-token-0123456789abcdef"
METRICS = "image-metrics-0123456789abcdef"

# deploy/compose.yaml's options, as `docker run` flags (each is checked to be in the compose file).
SECURITY = ["seccomp=./seccomp-server.json", "systempaths=unconfined", "no-new-privileges=true"]


def _installed(tool: str, how: str) -> str:
    """``tool``'s path; missing, the test fails under ``make test`` and CI, else it is skipped."""
    found = shutil.which(tool)
    if found is None:
        why = f"{tool} is not installed ({how})"
        if os.environ.get("MCP_SANDBOX_TEST_REQUIRE") or os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return found


def test_the_committed_seccomp_profile_is_the_generated_one() -> None:
    committed = json.loads((DEPLOY / "seccomp-server.json").read_text())
    assert committed == server_oci_profile()
    names = {name for rule in committed["syscalls"] for name in rule["names"]}
    assert {"mount", "unshare", "pivot_root"}.isdisjoint(names)  # bwrap needs them
    assert {"ptrace", "bpf", "kexec_load", "init_module", "keyctl"} <= names


def test_the_systemd_unit_verifies() -> None:
    analyze = _installed("systemd-analyze", "apt package systemd; make test installs it")
    unit = (DEPLOY / "mcp-sandbox.service").read_text()
    assert "Delegate=yes" in unit and "NoNewPrivileges=yes" in unit and "ProtectSystem=strict" in unit
    # The binary must exist for verify: point ExecStart at this checkout's.
    here = Path(sys.prefix) / "bin" / "mcp-sandbox"
    directory = Path(os.environ.get("TMPDIR", "/tmp")) / f"unit-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        copy = directory / "mcp-sandbox.service"
        copy.write_text(unit.replace("/opt/mcp-sandbox/.venv/bin/mcp-sandbox", str(here)))
        done = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(directory)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # unknown keys only warn: none allowed


def test_bwrap_without_setuid_makes_a_sandbox_under_no_new_privs_as_an_unprivileged_user() -> None:
    """What NoNewPrivileges=yes in the unit (and no-new-privileges in compose) rely on."""
    bwrap, setpriv = shutil.which("bwrap"), shutil.which("setpriv")
    if os.geteuid() != 0 or bwrap is None or setpriv is None:
        pytest.skip("needs root (to become an unprivileged user), bwrap and setpriv")
    assert not os.stat(bwrap).st_mode & 0o4000, "this check is about a bwrap that is not setuid"
    done = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs", bwrap, "--unshare-all",
         "--die-with-parent", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib",
         "/lib", "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "/bin/sh", "-c",
         "grep NoNewPrivs /proc/self/status; id -u"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["NoNewPrivs:", "1", "65534"]


@pytest.fixture(scope="module")
def docker() -> Iterator[None]:
    with docker_daemon() as why:
        if why is not None:
            if os.environ.get("MCP_SANDBOX_TEST_REQUIRE") or os.environ.get("CI"):
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
        server_image_in_docker(IMAGE)
        yield


def test_compose_has_the_options_the_test_runs_with() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    for option in SECURITY:
        assert f"- {option}" in compose, option
    for line in ("cap_drop: [ALL]", "read_only: true", "MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION", "/readyz", "restart:"):
        assert line in compose, line
    assert "privileged" not in compose.replace("--privileged", "").replace("unprivileged", "")
    # The YAML itself parses, where Debian's python3-yaml is there to parse it (no PyYAML in .venv).
    checked = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys, yaml; yaml.safe_load(open(sys.argv[1]))", str(DEPLOY / "compose.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0 or "No module named 'yaml'" in checked.stderr, checked.stderr


async def test_the_image_has_what_replicas_need(docker: None) -> None:
    """database_url and object_store_url work in the image the Kubernetes manifests run."""
    probe = "import boto3, psycopg; print(psycopg.pq.version() > 0, boto3.__name__)"
    done = await _docker("run", "--rm", "--network", "none", "--entrypoint", "/opt/mcp-sandbox/.venv/bin/python",
                         IMAGE, "-c", probe)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "True boto3"), done.stderr


async def test_the_image_serves_runs_uploads_downloads_and_code_mode_over_http(docker: None) -> None:
    port = free_port()
    name = f"mcp-sandbox-image-test-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-state"
    options = [opt.replace("./", f"{DEPLOY}/") for opt in SECURITY]
    command = [
        str(DOCKER_WRAPPER), "run", "--detach", "--name", name, "--network", "host",
        *[arg for opt in options for arg in ("--security-opt", opt)],
        "--cap-drop", "ALL", "--read-only", "--tmpfs", "/tmp:size=64m", "--memory", "4g", "--pids-limit", "1024",
        "--volume", f"{volume}:/var/lib/mcp-sandbox",
        "--env", f"MCP_SANDBOX_TOKEN={TOKEN}", "--env", f"MCP_SANDBOX_METRICS_TOKEN={METRICS}",
        "--env", f"MCP_SANDBOX_PORT={port}", "--env", f"MCP_SANDBOX_PUBLIC_URL=http://127.0.0.1:{port}",
        "--env", "MCP_SANDBOX_DISCOVER_SERVERS=false", "--env", "MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION=1",
        # Code mode: a downstream server inside the container (the image's own python, a stdio server).
        "--entrypoint", "/bin/sh", IMAGE, "-c", _entry(),
    ]  # fmt: skip
    started = await _docker(*command[1:])
    assert started.returncode == 0, started.stderr
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:
            await server_ready(web, base)
            async with http_client(base, TOKEN) as client:
                ran = await client.call_tool("run_python", {"code": "import numpy; print(numpy.arange(4).sum())"})
                assert ran.structured_content is not None and ran.structured_content["stdout"].strip() == "6", ran
                up = await client.call_tool(
                    "upload_file", {"conversationId": "c", "filename": "a.txt", "content": "aGk="}
                )
                assert not up.is_error, up
                made = await client.call_tool(
                    "run_python", {"code": "print(open('/workspace/a.txt').read())", "conversationId": "c"}
                )
                assert made.structured_content is not None and made.structured_content["stdout"].strip() == "hi"
                url = next(f["url"] for f in made.structured_content["files"] if f["name"] == "a.txt")
                js = await client.call_tool("run_code", {"code": "console.log(1 + 1)", "language": "typescript"})
                assert js.structured_content is not None and js.structured_content["stdout"].strip() == "2", js
                tool = await client.call_tool(
                    "run_python", {"code": "print(await mcp_echoer.echo(text='via tool'))", "servers": ["echoer"]}
                )
                assert tool.structured_content is not None and "via tool" in tool.structured_content["stdout"], tool
                # No cgroup in the container: RLIMIT_AS stands in, and the hog's MemoryError is
                # said and counted as the memory limit, as a cgroup's kill is on a host.
                # RLIMIT_NPROC stands in for a pids cgroup too, and counts every thread of the server's
                # uid: a program of 150 threads beside it must not stop sandboxes from starting.
                beside = await _docker("exec", "--detach", "--user", "10001", name, "/usr/bin/python3", "-c", _CROWD)
                assert beside.returncode == 0, beside.stderr
                await _wait_for_threads(name, 150)
                crowded = await client.call_tool("run_python", {"code": "print('started')"})
                assert crowded.structured_content is not None, crowded
                assert crowded.structured_content["stdout"] == "started\n", crowded
                hog = await client.call_tool("run_python", {"code": "hog = b'1' * (8 << 30)"})
                assert hog.structured_content is not None and hog.structured_content["status"] == "error", hog
                assert "memory limit of" in hog.structured_content["error"], hog
            download = await web.get(url)
            assert download.status_code == 200 and download.content == b"hi"
            scrape = await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})
            assert 'mcp_sandbox_tool_calls_total{outcome="ok",server="echoer"} 1.0' in scrape.text
            assert 'cause="memory_limit",language="python"' in scrape.text
        audit = await _docker("exec", name, "cat", "/var/lib/mcp-sandbox/logs/audit.jsonl")
        events = [json.loads(line)["event"] for line in audit.stdout.splitlines()]
        assert events.count("run") == 6 and "upload" in events and "download" in events and "tool_call" in events
        assert TOKEN not in audit.stdout
        whoami = await _docker("exec", name, "/usr/bin/id", "-u")
        assert whoami.stdout.strip() == "10001"
    finally:
        with anyio.CancelScope(shield=True):
            logs = await _docker("logs", name)
            print(logs.stdout[-3000:], logs.stderr[-3000:])
            await _docker("rm", "--force", name)
            await _docker("volume", "rm", "--force", volume)


async def _wait_for_threads(name: str, count: int) -> None:
    """Until the container runs a process of at least ``count`` threads (bounded)."""
    script = (
        "import glob\nprint(max(int(line.split()[1]) for f in glob.glob('/proc/[0-9]*/status')"
        " for line in open(f) if line.startswith('Threads:')))"
    )
    with anyio.fail_after(60):
        while True:
            shown = await _docker("exec", name, "/usr/bin/python3", "-c", script)
            if shown.returncode == 0 and int(shown.stdout.strip() or 0) >= count:
                return
            await anyio.sleep(0.2)  # a program's threads start on their own time


# A program of 150 threads, each asleep (what a browser or an IDE of the same user holds).
_CROWD = """
import threading, time
for _ in range(150):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
time.sleep(600)
"""


class _Done:
    def __init__(self, returncode: int, stdout: bytes, stderr: bytes) -> None:
        self.returncode = returncode
        self.stdout = stdout.decode(errors="replace")
        self.stderr = stderr.decode(errors="replace")


async def _docker(*args: str) -> _Done:
    with anyio.fail_after(120):
        done = await anyio.run_process([str(DOCKER_WRAPPER), *args], check=False)
    return _Done(done.returncode, done.stdout, done.stderr)


# The container's command: write a servers config naming a tiny stdio MCP server (made with the
# SDK inside the image), then exec the server as the image's entrypoint would.
_ECHO_SERVER = """
from mcp.server import MCPServer

app = MCPServer("echoer")


@app.tool()
def echo(text: str) -> str:
    return text


app.run()
"""


def _entry() -> str:
    servers = {"mcpServers": {"echoer": {"command": "/opt/mcp-sandbox/.venv/bin/python", "args": ["/tmp/echo.py"]}}}
    files = {"/tmp/echo.py": _ECHO_SERVER, "/tmp/servers.json": json.dumps(servers)}
    writes = " && ".join(
        f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path}" for path, text in files.items()
    )
    serve = "exec /usr/bin/tini -- /usr/local/bin/mcp-sandbox serve --transport http"
    return f"{writes} && MCP_SANDBOX_SERVERS_CONFIG=/tmp/servers.json {serve}"


def test_a_rebuild_removes_the_image_it_replaced_unless_something_uses_it(tmp_path: Path) -> None:
    podman = _installed("podman", "make test installs it")
    repository = f"localhost/mcp-sandbox-replaced-{uuid.uuid4().hex[:8]}"
    image = f"{repository}:latest"
    helpers = REPO / "scripts" / "replaced-images.sh"

    def build(content: str, tag: str = image) -> str:
        (tmp_path / "file").write_text(content)
        subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(tmp_path / "fs.tar"), "file"], check=True)
        subprocess.run([podman, "import", "-q", str(tmp_path / "fs.tar"), tag], check=True, capture_output=True)
        return subprocess.run(
            [podman, "image", "inspect", "--format", "{{.Id}}", tag], check=True, text=True, capture_output=True
        ).stdout.strip()

    def helper(*args: str) -> str:
        script = f'. {helpers}; "$@"'
        done = subprocess.run(["bash", "-c", script, "-", *args], check=True, text=True, capture_output=True)
        return done.stderr

    def exists(image_id: str) -> bool:
        return subprocess.run([podman, "image", "exists", image_id], check=False).returncode == 0

    container = f"replaced-{uuid.uuid4().hex[:8]}"
    try:
        first = build("first")
        second = build("second")
        assert "removed the image" in helper("remove_replaced", podman, first, image, "test")
        assert not exists(first) and exists(second)
        # A container (stopped, never started) keeps the image it was made from.
        subprocess.run([podman, "create", "--name", container, image, "/file"], check=True, capture_output=True)
        third = build("third")
        assert "kept the image" in helper("remove_replaced", podman, second, image, "test")
        assert exists(second) and exists(third)
        # An earlier build's tag of a base goes; the tag kept stays.
        build("old base", f"{repository}:old")
        helper("remove_other_tags", podman, repository, image, "test")
        assert not exists(f"{repository}:old") and exists(image)
    finally:
        subprocess.run([podman, "rm", "-f", container], check=False, capture_output=True)
        listed = subprocess.run([podman, "images", "-q", repository], text=True, capture_output=True).stdout.split()
        subprocess.run([podman, "rmi", "-f", *listed, second], check=False, capture_output=True)
