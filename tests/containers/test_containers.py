"""What only the container backends do: kill by name, sweep by label, warm session containers,
the docker dialect's socket channel. Runs on podman and on docker, both for real."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import anyio
import pytest

from container_helpers import DOCKER_WRAPPER, PODMAN_WRAPPER, remove_containers
from mcp_sandbox.config import HttpSettings
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.events import RunFinished
from mcp_sandbox.sandbox.backends import get_backend
from mcp_sandbox.sandbox.backends.container import LABEL, OWNER_LABEL, ContainerBackend, container_name
from mcp_sandbox.sandbox.cgroups.hierarchy import PREFIX, mounts
from mcp_sandbox.server.metrics import Metrics
from mcp_test_helpers import poll

from .conftest import EngineFactory

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

HOST_BOUND = 30.0


def _containers(label: str, kind: str) -> list[str]:
    cli = DOCKER_WRAPPER if kind == "docker" else PODMAN_WRAPPER
    done = subprocess.run(
        [str(cli), "ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.split()


def _ours(kind: str) -> list[str]:
    return _containers(f"{OWNER_LABEL}={os.getpid()}", kind)


async def _execute(
    engine: Engine, code: str, *, limit: float = 10.0, session: str | None = None, language: str = "python"
) -> ExecutionResult:
    with anyio.fail_after(limit + HOST_BOUND):
        return await engine.execute(ExecutionRequest(code=code, timeout=limit, session=session, language=language))


def _dead_pid() -> int:
    child = subprocess.Popen(["/bin/true"])
    child.wait()
    return child.pid


async def test_a_run_works_and_leaves_no_container(
    make_container_engine: EngineFactory, container_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_container_engine()
    backend = engine.backend
    assert isinstance(backend, ContainerBackend)
    by_name: list[list[str]] = []
    remove = backend.engine.remove

    async def removal_by_name(names: list[str]) -> None:
        by_name.append(names)
        await remove(names)

    monkeypatch.setattr(backend.engine, "remove", removal_by_name)

    result = await _execute(engine, "import numpy, os\nprint(numpy.arange(3).sum(), os.getuid() != 0)")

    assert (result.status, result.stdout) == ("success", "3 True\n")
    assert _ours(container_kind) == []
    if backend.nests_cgroups:  # ended through our cgroup: the engine's `run --rm` removed it, no `rm` process
        assert by_name == []


async def test_a_timed_out_run_leaves_no_container_running(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    engine = make_container_engine()

    result = await _execute(engine, "import time\ntime.sleep(600)", limit=2)

    assert result.status == "timeout"
    assert _ours(container_kind) == []  # killing the client alone would have left it running


def _our_cgroups() -> list[Path]:
    """This process's per-run cgroups left in any hierarchy (container runtimes nest theirs in them)."""
    prefix = f"{PREFIX}{os.getpid()}-"
    return [d for point, _, _ in mounts() for d in Path(point).glob(f"**/{prefix}*") if d.is_dir()]


async def test_a_start_cancelled_at_any_moment_leaves_no_container_process_or_cgroup(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    # Cancelled while the client is still creating the container, a start once left the container
    # created, or podman's conmon and `crun create` waiting forever in our cgroup (cgroup v1).
    engine = make_container_engine()
    for step in range(120):  # twice at every 5 ms of the first 0.3 s of a start
        with anyio.move_on_after(0.005 * (step % 60)):
            await engine.execute(ExecutionRequest(code="print(1)", timeout=10))

    assert _ours(container_kind) == []
    assert _our_cgroups() == []  # a cgroup still holding a process cannot be removed


async def test_the_channel_survives_the_container_boundary_with_fd_passing(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    # Each run's stdout/stderr are pipes sent over the channel with SCM_RIGHTS.
    engine = make_container_engine()

    result = await _execute(engine, "import sys\nprint('x' * 100_000)\nprint('err', file=sys.stderr)")

    assert result.status == "success"
    assert result.stdout == "x" * 100_000 + "\n"
    assert result.stderr == "err\n"


async def test_a_docker_runs_channel_directory_is_this_servers_in_runs_and_removed_after(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    # Under runs/, named after this server's pid, a server killed mid-run leaves it for the next
    # server to sweep (StateLayout.stale_runs), never for good in the system's temporary directory.
    if container_kind != "docker":
        pytest.skip("podman is given the channel as a descriptor: it has no directory")
    engine = make_container_engine()
    seen: list[Path] = []

    def channel_seen() -> bool:
        seen.extend(engine.layout.runs.glob(f"{os.getpid()}-*/channel"))
        return bool(seen)

    async with anyio.create_task_group() as group:
        group.start_soon(_execute, engine, "import time\ntime.sleep(1)")
        with anyio.fail_after(HOST_BOUND):
            await poll(channel_seen)

    assert not seen[0].parent.exists()


async def test_containers_of_dead_servers_are_swept_at_start_and_live_ones_kept(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    if container_kind != "podman":
        pytest.skip("the sweep is the same code for both dialects; once is enough")
    dead = container_name(_dead_pid())
    alive = container_name(os.getppid())  # another server, still running
    image = make_container_engine().backend.image_for("python")  # type: ignore[attr-defined]
    for name, owner in ((dead, dead.split("-")[2]), (alive, alive.split("-")[2])):
        labels = ("--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}={owner}")
        await anyio.run_process(
            [str(PODMAN_WRAPPER), "create", "--name", name, *labels, "--network", "none", image, "sleep", "600"]
        )
    try:
        made = make_container_engine()
        pieces, layout, http = made.settings, made.layout, HttpSettings()
        backend = get_backend("podman", sandbox=pieces.sandbox, paths=pieces.paths, limits=pieces.limits, layout=layout)
        egress = TenantEgress(pieces.egress, (http.host, http.port))
        engine = Engine(pieces, backend, layout=layout, egress=egress)  # a container engine of its own: it sweeps
        engine.prepare()
        result = await _execute(engine, "print('after the sweep')")
        left = _containers(f"{LABEL}=1", "podman")
    finally:
        remove_containers([dead, alive])

    assert result.stdout == "after the sweep\n"
    assert dead not in left
    assert alive in left


async def test_a_session_keeps_one_warm_container_for_all_its_runs(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    engine = make_container_engine()
    async with engine.running():
        first = await _execute(engine, "import socket\ncount = 1\nprint(socket.gethostname())", session="s")
        during = _ours(container_kind)
        second = await _execute(engine, "count += 1\nprint(count)", session="s")
        still = _ours(container_kind)

    assert (first.status, second.status) == ("success", "success")
    assert (first.session, second.session, second.stdout) == ("new", "kept", "2\n")
    assert len(during) == 1 and still == during  # the same container served both runs
    assert _ours(container_kind) == []  # and went with the session


async def test_workspace_files_belong_to_the_sandbox_uid(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    engine = make_container_engine()
    workspace = engine.settings.paths.state_dir / f"ws-{uuid.uuid4().hex}"
    workspace.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    with anyio.fail_after(HOST_BOUND):
        result = await engine.execute(
            ExecutionRequest(code="open('/workspace/out.json', 'w').write('{}')", timeout=10, workspace=workspace)
        )

    assert result.status == "success"
    expected = engine.settings.sandbox.sandbox_uid if os.geteuid() == 0 else os.geteuid()
    assert (workspace / "out.json").stat().st_uid == expected
    assert json.loads((workspace / "out.json").read_text()) == {}


@pytest.mark.parametrize("js_runtime", ["bun", "deno"])
async def test_typescript_and_javascript_run_with_the_limits_and_leave_no_container(
    make_container_engine: EngineFactory, container_kind: str, js_runtime: str
) -> None:
    engine = make_container_engine(js_runtime=js_runtime, memory="128m")
    typescript = ExecutionRequest(
        code="const n: number = 6 * 7;\nconsole.log(n, process.getuid?.() !== 0);", timeout=30, language="typescript"
    )
    bomb = ExecutionRequest(
        code="const hog = []; for (let i = 0; i < 64; i++) hog.push(new Uint8Array(64 << 20).fill(1));",
        timeout=30,
        language="javascript",
    )
    with anyio.fail_after(60 + HOST_BOUND):
        ran = await engine.execute(typescript)
        bombed = await engine.execute(bomb)

    assert (ran.status, ran.stdout) == ("success", "42 true\n"), ran.stderr
    assert bombed.status == "error" and bombed.exit_code != 0
    assert _ours(container_kind) == []


async def test_the_typescript_runtimes_packages_import_in_a_container(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    engine = make_container_engine(js_runtime="bun")
    code = (
        "import Papa from 'papaparse';\nimport pg from 'pg';\n"
        "console.log(JSON.stringify(Papa.parse('a,b').data), typeof pg.Client);"
    )
    with anyio.fail_after(30 + HOST_BOUND):
        result = await engine.execute(ExecutionRequest(code=code, timeout=30, language="typescript"))

    assert (result.status, result.stdout) == ("success", '[["a","b"]] function\n'), result.stderr


# Per language: a first run, one that leaves a file in /tmp, one that looks for it.
_PRESTART_CODE = {
    "python": ("print(1)", "open('/tmp/left', 'w').write('x')", "import os\nprint(os.path.exists('/tmp/left'))"),
    "typescript": (
        "console.log(1);",
        "import * as fs from 'node:fs';\nfs.writeFileSync('/tmp/left', 'x');",
        "import * as fs from 'node:fs';\nconsole.log(fs.existsSync('/tmp/left') ? 'True' : 'False');",
    ),
}


@pytest.mark.parametrize("language", ["python", "typescript"])
async def test_a_prestarted_container_serves_one_run_and_is_replaced(
    make_container_engine: EngineFactory, container_kind: str, language: str
) -> None:
    engine = make_container_engine(prestart_size=1)
    limit = engine.settings.limits.timeout  # the pool's containers have the default timeout's limits
    opening, leaving, looking = _PRESTART_CODE[language]

    async def ready() -> list[str]:
        with anyio.fail_after(120):
            while engine.prestart.ready(language) < 1:  # noqa: ASYNC110 - the pool has no event to wait on
                await anyio.sleep(0.1)
        return _ours(container_kind)

    async with engine.running():
        await _execute(engine, opening, limit=limit, language=language)  # its containers start on the first run
        serving = await ready()
        first = await _execute(engine, leaving, limit=limit, language=language)
        after = await ready()
        second = await _execute(engine, looking, limit=limit, language=language)

    assert (first.status, first.warm, second.status, second.warm) == ("success", True, "success", True)
    assert second.stdout == "False\n"
    assert len(serving) == 1 and serving[0] not in after  # the container that served a run is gone
    with anyio.fail_after(60):
        while _ours(container_kind):  # noqa: ASYNC110 - and all of them went with the engine
            await anyio.sleep(0.2)


async def test_a_run_past_the_memory_limit_is_a_memory_limit_failure_in_the_metrics(
    make_container_engine: EngineFactory, container_kind: str
) -> None:
    engine = make_container_engine(memory="128m")
    metrics = Metrics(dict, dict)

    result = await _execute(engine, "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1")
    # Counted as the server counts every run (server/tools/run.py): from the engine's verdict.
    metrics.observe(RunFinished("alice", None, "python", container_kind, result.status, 0.1, limits=result.limits,
                                exit_code=result.exit_code, path=result.path))  # fmt: skip

    assert result.status == "error" and "memory" in result.limits, result
    assert result.error is not None and "memory limit" in result.error
    labels = f'backend="{container_kind}",cause="memory_limit",language="python",tenant="alice"'
    assert f"mcp_sandbox_run_failures_total{{{labels}}} 1.0" in metrics.render().decode()
