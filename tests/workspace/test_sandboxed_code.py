"""Real sandboxed code builds traps in its workspace, also while the host is reading it; the host stays inside."""

from __future__ import annotations

import contextlib
import os
import textwrap
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mcp_sandbox.config import Settings, load_settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace import WorkspaceStore, load_secret
from settings_helpers import store_of

pytestmark = [pytest.mark.anyio, pytest.mark.sandbox]

_PASSWD = Path("/etc/passwd").read_bytes()
_RUN_TIMEOUT = 20.0


@pytest.fixture
def sandboxed_settings(state_dir: Path, sandbox_runtime: Path | None) -> Settings:
    flags: dict[str, object] = {"state_dir": str(state_dir)}
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    return load_settings(env={}, flags=flags)


@pytest.fixture
def engine(sandboxed_settings: Settings) -> Engine:
    backend = backend_for(sandboxed_settings, "bwrap")
    probe = backend.probe()
    if not probe.available:
        pytest.skip(f"bwrap is unavailable here: {probe.reason}")
    engine = engine_for(sandboxed_settings, backend)
    engine.prepare()
    return engine


@pytest.fixture
def sandboxed_store(sandboxed_settings: Settings) -> WorkspaceStore:
    return store_of(sandboxed_settings, load_secret(sandboxed_settings.paths.state_dir))


async def _run(engine: Engine, workspace: Path, code: str) -> ExecutionResult:
    with anyio.fail_after(_RUN_TIMEOUT + 15):
        return await engine.execute(
            ExecutionRequest(code=textwrap.dedent(code), timeout=_RUN_TIMEOUT, workspace=workspace)
        )


def _wait_for_writer(fifo: Path) -> None:
    """Block until the sandboxed code opens ``fifo`` for writing and closes it."""
    with open(fifo, "rb") as reader:
        reader.read()


def _release(fifo: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


async def test_traps_the_code_builds_are_skipped_refused_and_deleted(
    engine: Engine, sandboxed_store: WorkspaceStore
) -> None:
    key = sandboxed_store.key("alice", "traps")
    workspace = sandboxed_store.ensure(key)
    result = await _run(
        engine,
        workspace,
        """
        import os, socket
        os.chdir("/workspace")
        os.symlink("/etc/passwd", "data.csv")
        os.symlink("/etc", "etc")
        os.mkfifo("pipe.csv")
        socket.socket(socket.AF_UNIX).bind("sock")
        open("line\\nbreak.txt", "w").write("x")
        os.makedirs("plots")
        open("plots/p.png", "wb").write(b"PNG")
        open("out.txt", "w").write("hello")
        os.mkdir("locked"); open("locked/in.txt", "w").write("x"); os.chmod("locked", 0)
        for _ in range(300):
            os.mkdir("n"); os.chdir("n")
        print("built")
        """,
    )
    assert (result.status, result.stdout) == ("success", "built\n"), result

    listing = await anyio.to_thread.run_sync(sandboxed_store.list_files, key)
    assert [entry.name for entry in listing] == ["out.txt", "plots/p.png"]
    with anyio.fail_after(5):
        for name in ("data.csv", "etc/passwd", "pipe.csv", "sock", "locked", "n"):
            with pytest.raises(WorkspaceError):
                await anyio.to_thread.run_sync(sandboxed_store.open_file, key, name, abandon_on_cancel=True)
    with sandboxed_store.open_file(key, "out.txt") as opened:
        assert b"".join(opened.chunks()) == b"hello"

    await anyio.to_thread.run_sync(sandboxed_store.delete, key)
    assert not workspace.exists()
    assert await anyio.Path("/etc/passwd").read_bytes() == _PASSWD


async def test_code_swapping_a_directory_for_a_symlink_while_the_host_reads_and_writes_never_leads_out(
    engine: Engine, sandboxed_store: WorkspaceStore, sandboxed_settings: Settings
) -> None:
    key = sandboxed_store.key("alice", "race")
    workspace = sandboxed_store.ensure(key)
    sandboxed_store.write_file(key, "d/passwd", b"INSIDE")
    flipper = """
        import ctypes, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        os.chdir("/workspace")
        os.symlink("/etc", "swap")
        open("ready", "w").close()  # a FIFO the host waits on
        deadline = time.monotonic() + 15
        flips = 0
        while not os.path.exists("stop") and time.monotonic() < deadline:
            # renameat2(AT_FDCWD, "d", AT_FDCWD, "swap", RENAME_EXCHANGE)
            assert libc.renameat2(-100, b"d", -100, b"swap", 2) == 0, ctypes.get_errno()
            flips += 1
        print(flips > 0)
    """
    seen: set[bytes] = set()
    result: list[ExecutionResult] = []

    async def run() -> None:
        result.append(await _run(engine, workspace, flipper))

    ready = workspace / "ready"
    os.mkfifo(ready, 0o600)
    if os.geteuid() == 0:  # root runs the sandbox as its own uid
        os.chown(ready, sandboxed_settings.sandbox.sandbox_uid, sandboxed_settings.sandbox.sandbox_gid)
    async with anyio.create_task_group() as group:
        group.start_soon(run)
        try:
            with anyio.fail_after(15):
                await anyio.to_thread.run_sync(_wait_for_writer, ready, abandon_on_cancel=True)
        finally:
            _release(ready)
        for index in range(500):
            try:
                opened = await anyio.to_thread.run_sync(sandboxed_store.open_file, key, "d/passwd")
                with opened:
                    seen.add(b"".join(opened.chunks()))
            except WorkspaceError:
                pass  # the symlink was in place
            try:
                await anyio.to_thread.run_sync(sandboxed_store.write_file, key, f"d/upload-{index}", b"up")
            except WorkspaceError:
                pass
        sandboxed_store.write_file(key, "stop", b"")

    assert (result[0].status, result[0].stdout) == ("success", "True\n"), result[0]
    assert seen <= {b"INSIDE"}
    assert await anyio.Path("/etc/passwd").read_bytes() == _PASSWD
    assert not [path async for path in anyio.Path("/etc").glob("upload-*")]
