"""Each tenant's sandboxes run as a host uid of their own (issue 35, finding 3), seen through a real
HTTP server with two tenants: one tenant exhausting a per-user kernel counter (pipe buffer pages,
``fs.pipe-user-pages-soft``) leaves the other's intact; their sandboxes' processes have different
host uids (``/proc/<pid>/status``, looked at from the host), warm sandboxes of the default uid
serve neither, and each tenant's workspace files are its own uid's. On bwrap, and on rootful podman.

As root only: where the server is not root, every sandbox is the server's uid (doctor says so).
"""

from __future__ import annotations

import json
import os
import pwd
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from container_helpers import backend_flags
from mcp_test_helpers import (
    auth_tokens,
    host_processes,
    host_uid,
    http_server,
    mcp_sandbox_cli,
    new_conversation,
    poll,
    run_over_http,
    upload,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server"),
]

ALICE = "alice-token-0123456789abcdef"  # the attacker
BOB = "bob-token-0123456789abcdef0000"  # the victim
RANGE = (1879048192, 1879113727)  # the default tenant_uid_range


@pytest.fixture(scope="module", params=["bwrap", "podman"])
async def base(
    request: pytest.FixtureRequest, module_state_dir: Path, sandbox_runtime: Path | None
) -> AsyncIterator[str]:
    env: dict[str, str] = {}
    if request.param == "podman":  # rootful: --user is the tenant's uid (a pre-started container the default's)
        runtime = backend_flags("podman").get("container_runtime")
        if runtime is None:
            if "podman" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
                pytest.fail("podman is required (MCP_SANDBOX_TEST_REQUIRE) but unavailable")
            pytest.skip("no podman here")
        env = {"MCP_SANDBOX_BACKEND": "podman", "MCP_SANDBOX_CONTAINER_RUNTIME": str(runtime)}
    config = module_state_dir.parent / f"uids-{uuid.uuid4().hex[:8]}.toml"
    # pool_size 1: a warm sandbox of the default uid is there to be (wrongly) taken.
    config.write_text("pool_size = 1\npool_min = 1\npool_preload = []\n" + auth_tokens({"alice": ALICE, "bob": BOB}))
    async with http_server(module_state_dir, "--config", str(config), env=env, runtime=sandbox_runtime) as url:
        yield url


def _files_named(state_dir: Path, name: str) -> list[Path]:
    """The files called ``name`` in any conversation's workspace, as the host sees them."""
    workspaces = state_dir / "workspaces"
    if not workspaces.is_dir():
        return []
    return [directory / name for directory in workspaces.iterdir() if (directory / name).exists()]


def _assigned(state_dir: Path) -> dict[str, int]:
    return dict(json.loads((state_dir / "tenant-uids.json").read_text()))


async def test_one_tenant_exhausting_pipe_buffers_leaves_the_other_tenants_own(
    base: str, module_state_dir: Path
) -> None:
    alice_conversation = new_conversation()
    marker = f"exhausted-{uuid.uuid4().hex}"
    # Grow pipes to 1 MiB each until the kernel refuses more pages to this uid (EPERM past
    # pipe-user-pages-soft), say so, and hold them until the host uploads `release`.
    hog = f"""
        import errno, fcntl, os, time
        pipes, refused = [], None
        for _ in range(200):
            reader, writer = os.pipe()
            pipes.append((reader, writer))
            try:
                fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError as exc:
                refused = errno.errorcode[exc.errno]
                break
        open("/workspace/{marker}", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists("/workspace/release") and time.monotonic() < deadline:
            time.sleep(0.05)
        print(len(pipes), refused)
    """
    probe = """
        import fcntl, os
        reader, writer = os.pipe()
        fresh = fcntl.fcntl(writer, fcntl.F_GETPIPE_SZ)
        try:
            grown = fcntl.fcntl(writer, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError as exc:
            grown = exc.strerror
        print(fresh, grown, sep="|")
    """
    results: dict[str, dict[str, object]] = {}

    async def alice() -> None:
        results["alice"] = await run_over_http(base, ALICE, hog, conversationId=alice_conversation, timeout=90)

    with anyio.fail_after(150):
        async with anyio.create_task_group() as group:
            group.start_soon(alice)
            await poll(lambda: bool(_files_named(module_state_dir, marker)))
            # Alice's uid holds every pipe page it may have: Bob's run is served meanwhile.
            results["bob"] = await run_over_http(base, BOB, probe, timeout=30)
            released = await upload(base, ALICE, alice_conversation, "release", b"")
            assert released.status_code == 201, released.text

    pipes, refused = str(results["alice"]["stdout"]).split()
    assert refused == "EPERM", results["alice"]  # Alice did exhaust her uid's pipe pages
    assert int(pipes) < 200
    bob_fresh, bob_grown = str(results["bob"]["stdout"]).strip().split("|")
    assert (bob_fresh, bob_grown) == ("65536", str(1 << 20)), results["bob"]


async def test_tenants_run_and_own_their_files_as_host_uids_of_their_own(base: str, module_state_dir: Path) -> None:
    markers = {"alice": f"uid-alice-{uuid.uuid4().hex}", "bob": f"uid-bob-{uuid.uuid4().hex}"}
    tokens = {"alice": ALICE, "bob": BOB}
    conversations = {"alice": new_conversation(), "bob": new_conversation()}
    seen: dict[tuple[str, bool], int] = {}

    async def run(tenant: str, with_conversation: bool) -> None:
        # A child whose command line carries the marker, for the host to find; the run ends with it.
        marker = f"{markers[tenant]}-{with_conversation}"
        code = f"""
            import subprocess, sys
            open("/workspace/{marker}", "w").write("mine")
            subprocess.run([sys.executable, "-c", "import time; time.sleep(4)", "{marker}"], check=True)
        """
        extra = {"conversationId": conversations[tenant]} if with_conversation else {}
        result = await run_over_http(base, tokens[tenant], textwrap.dedent(code), timeout=60, **extra)
        assert result["exitCode"] == 0, result

    async def look(tenant: str, with_conversation: bool) -> None:
        marker = f"{markers[tenant]}-{with_conversation}"
        await poll(lambda: bool(host_processes(marker)))
        seen[tenant, with_conversation] = host_uid(host_processes(marker)[0])

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for tenant in tokens:
                for with_conversation in (True, False):  # without one, a warm sandbox could take it
                    group.start_soon(run, tenant, with_conversation)
                    group.start_soon(look, tenant, with_conversation)

    assigned = _assigned(module_state_dir)
    alice, bob = assigned["alice"], assigned["bob"]
    assert alice != bob
    assert RANGE[0] <= alice <= RANGE[1] and RANGE[0] <= bob <= RANGE[1]
    assert seen == {("alice", True): alice, ("alice", False): alice, ("bob", True): bob, ("bob", False): bob}
    for tenant, uid in (("alice", alice), ("bob", bob)):
        (written,) = _files_named(module_state_dir, f"{markers[tenant]}-True")
        assert written.stat().st_uid == uid
        assert written.parent.stat().st_uid == uid  # the workspace itself
        # A file the server writes there (an upload) is the tenant's too.
        name = f"up-{uuid.uuid4().hex}"
        response = await upload(base, tokens[tenant], conversations[tenant], name, b"data")
        assert response.status_code == 201, response.text
        (uploaded,) = _files_named(module_state_dir, name)
        assert uploaded.stat().st_uid == uid


def test_doctor_says_whether_tenants_share_onehost_uid(state_dir: Path, sandbox_runtime: Path | None) -> None:
    own = mcp_sandbox_cli("doctor", state_dir=state_dir, runtime=sandbox_runtime)
    shared = mcp_sandbox_cli(
        "doctor", state_dir=state_dir, runtime=sandbox_runtime, env={"MCP_SANDBOX_TENANT_UID_RANGE": "off"}
    )

    assert f"tenant uids: each tenant but `default` runs as its own host uid of {RANGE[0]}-{RANGE[1]}" in own.stdout
    assert "tenant uids: tenants share one host uid and its per-user kernel counters" in shared.stdout, shared.stdout
    assert "tenant_uid_range is off" in shared.stdout


def test_a_range_holding_a_users_uid_refuses_to_start(state_dir: Path, sandbox_runtime: Path | None) -> None:
    uid = next(entry.pw_uid for entry in pwd.getpwall() if entry.pw_uid > 0)
    done = mcp_sandbox_cli(
        "run", "-c", "print(1)", state_dir=state_dir, runtime=sandbox_runtime,
        env={"MCP_SANDBOX_TENANT_UID_RANGE": f"{uid}-{uid}", "MCP_SANDBOX_SANDBOX_UID": str(uid + 1)},
    )  # fmt: skip

    assert done.returncode != 0
    assert f"tenant_uid_range: {uid}-{uid} includes uid {uid}, user " in done.stderr, done.stderr
