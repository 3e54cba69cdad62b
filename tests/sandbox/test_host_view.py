"""What other users of the host and runs can read of each other (issue 21, finding 12).

bwrap's options (state directory, workspace paths) travel through a descriptor, so neither the
host's process list nor ``/proc/1/cmdline`` inside shows them; workspaces stay closed to other
host users even when a run opens its own ``/workspace``; host-wide counters are masked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import uuid
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.state import StateLayout

from .harness import SandboxRunner, wait_until_running

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# A host user that is neither the server nor the sandbox (nor in their groups).
_OTHER_ID = 47_123
_SYSTEM_PYTHON = "/usr/bin/python3"


def _as_other_user(script: str) -> str:
    """Run ``script`` with the system Python as another host uid; its stdout."""
    done = subprocess.run(
        [_SYSTEM_PYTHON, "-I", "-c", textwrap.dedent(script)],
        user=_OTHER_ID,
        group=_OTHER_ID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def _workspace_under(state_root: Path, sandbox: SandboxRunner) -> Path:
    directory = state_root / f"conversation-{uuid.uuid4().hex}"
    directory.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(directory, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    return directory


_SCAN = """
    import os
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    print(cmdline.read().replace(b"\\0", b" ").decode(errors="replace"))
            except OSError:
                pass
"""


async def test_the_host_process_list_names_no_state_or_workspace_path(
    sandbox: SandboxRunner, backend_name: str, state_root: Path
) -> None:
    # Every local user reads every /proc/<pid>/cmdline while a run lasts: bwrap's options come
    # through --args, a container's binds through per-run aliases (no workspace key in them).
    if os.geteuid() != 0:
        pytest.skip("reading the process list as another uid needs root to switch to it")
    layout = StateLayout.of(sandbox.settings.paths, sandbox.settings.sandbox, sandbox.settings.workspaces)
    key = f"key{uuid.uuid4().hex}"
    workspace = layout.prepare_workspaces() / key
    workspace.mkdir(mode=0o700)
    os.chown(workspace, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    marker = f"host-view-{uuid.uuid4().hex}"
    code = f"""
        import subprocess
        subprocess.run([{marker!r}, "3"], executable="/bin/sleep")
    """
    seen = ""

    async def look() -> None:
        nonlocal seen
        await wait_until_running(marker)
        seen = await anyio.to_thread.run_sync(_as_other_user, _SCAN)

    async with anyio.create_task_group() as group:
        group.start_soon(look)
        result = await sandbox.run(code, workspace=workspace, time_limit=30)
    assert result.status == "success", result.error
    assert marker in seen  # the other user did read the sandbox's command lines
    assert key not in seen
    assert str(layout.workspaces) not in seen
    if backend_name == "bwrap":
        assert "--args" in seen  # bwrap's own, with its options elsewhere
        assert str(state_root) not in seen
    else:
        assert "-alias-" in seen  # the container CLI's command line, its binds aliased


async def test_proc_1_cmdline_inside_names_no_host_path(sandbox: SandboxRunner, state_root: Path) -> None:
    workspace = _workspace_under(state_root, sandbox)
    result = await sandbox.run(_SCAN, workspace=workspace)
    assert result.status == "success", result.error
    assert result.stdout.strip()  # pid 1 at least
    assert str(state_root) not in result.stdout
    assert str(sandbox.settings.paths.state_dir) not in result.stdout


async def test_a_workspace_a_run_opened_stays_closed_to_other_host_users(sandbox: SandboxRunner) -> None:
    # The attack of the issue: the run makes /workspace 0777 and a local user plants a file
    # there that the next run reads. The directory above it is closed to that user.
    if os.geteuid() != 0:
        pytest.skip("acting as another host uid needs root (a non-root server's workspaces are 0700 and its own)")
    layout = StateLayout.of(sandbox.settings.paths, sandbox.settings.sandbox, sandbox.settings.workspaces)
    workspace = layout.prepare_workspaces() / uuid.uuid4().hex
    workspace.mkdir(mode=0o700)
    os.chown(workspace, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    result = await sandbox.run("os.chmod('/workspace', 0o777)", workspace=workspace)
    assert result.status == "success", result.error
    attempt = _as_other_user(f"""
        try:
            open({str(workspace / "planted")!r}, "x").close()
            print("planted")
        except OSError as error:
            print(type(error).__name__)
    """)
    assert attempt.strip() == "PermissionError"
    assert not (workspace / "planted").exists()


async def test_host_wide_counters_are_masked(sandbox: SandboxRunner, backend_name: str) -> None:
    report = await sandbox.report("""
        def read(path):
            with open(path, "rb") as counters:
                return len(counters.read())
        report["diskstats"] = outcome(lambda: read("/proc/diskstats"))
        if report["diskstats"] == "ok":
            report["diskstats"] = read("/proc/diskstats")
        report["pressure"] = sorted(os.listdir("/proc/pressure")) if os.path.isdir("/proc/pressure") else []
    """)
    assert report["diskstats"] in (0, "PermissionError:EACCES")
    if backend_name == "docker":
        pytest.xfail("docker's runc refuses a mount over /proc/pressure (docs/security.md, limits of the model)")
    assert report["pressure"] == []


_NAMES_AND_CGROUPS = """
    import json
    def read(path):
        try:
            with open(path) as file:
                return file.read()
        except OSError as error:
            return type(error).__name__
    print(json.dumps({"hosts": read("/etc/hosts"), "cgroup": read("/proc/self/cgroup")}))
"""


def _host_names() -> set[str]:
    """The names the host's /etc/hosts gives, but localhost's."""
    names: set[str] = set()
    with open("/etc/hosts") as hosts:
        for line in hosts:
            names.update(line.split("#", 1)[0].split()[1:])
    return {name for name in names if not name.startswith(("localhost", "ip6-"))}


async def test_a_run_sees_neither_the_hosts_etc_hosts_nor_the_servers_pid(sandbox: SandboxRunner) -> None:
    result = await sandbox.run(_NAMES_AND_CGROUPS)
    assert result.status == "success", result.error
    seen = json.loads(result.stdout)
    hosts = set(seen["hosts"].split())
    assert not hosts & _host_names(), seen["hosts"]  # podman copied the host's /etc/hosts in
    assert "host.containers.internal" not in hosts and not any(name.startswith("mcp-sandbox-") for name in hosts)
    # The server is this process; the run's cgroup was named after it (mcp-sandbox-<pid>-<hex>).
    assert not re.search(rf"(?<![0-9]){os.getpid()}(?![0-9])", seen["cgroup"]), seen["cgroup"]
    assert "mcp-sandbox" not in seen["cgroup"], seen["cgroup"]
