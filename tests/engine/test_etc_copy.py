"""The sandbox's ``/etc`` as one bind of a copy of the host entries it shows (``sandbox/backends/bwrap/etc.py``).

The copy must show exactly what the binds showed, follow the host's changes in the sandboxes
started after them, leave a running sandbox what it started with, fall back to the binds when
it cannot be made, and be gone with the backend.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.engine import Engine
from mcp_sandbox.sandbox import hostfs
from mcp_sandbox.sandbox.backends import Sandbox
from mcp_sandbox.sandbox.backends.bwrap import etc
from mcp_sandbox.sandbox.backends.bwrap.sandbox import BwrapBackend
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.policy import Mount, SandboxPolicy

from .conftest import EngineFactory
from .helpers import HOST_BOUND

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

_CERTS = "/etc/ssl/certs"
# Every entry below the /etc entries (type, mode, link target), then every file's digest: the
# same listing is taken inside (of /etc/...) and on the host (of the bound paths, followed at
# the top as a bind follows them).
_LISTING = (
    "find {roots} -printf '%p %y %m %l\\n' | sort; "
    "find {roots} -type f -exec sha256sum {{}} + | sort -k 2; "
    "sha256sum {files}"
)
# The mounts a sandbox sees at /etc or below it.
_ETC_MOUNTS = "cut -d ' ' -f 5 /proc/self/mountinfo | grep -E '^/etc(/|$)'"


def _backend(engine: Engine) -> BwrapBackend:
    backend = engine.backend
    assert isinstance(backend, BwrapBackend)
    return backend


def _policy(script: str, mounts: tuple[Mount, ...] | None = None, workspace: Path | None = None) -> SandboxPolicy:
    system, links = system_mounts()
    return SandboxPolicy(
        command=("/bin/sh", "-c", script),
        mounts=system if mounts is None else mounts,
        symlinks=links,
        workspace=workspace,
        cwd="/",
    )


async def _output(sandbox: Sandbox) -> str:
    with anyio.fail_after(HOST_BOUND):
        out = await sandbox.stdout.read()
        await sandbox.wait()
    outcome = await sandbox.aclose()
    assert outcome.returncode == 0, out
    return out.decode()


def _etc_copies(engine: Engine) -> list[Path]:
    return sorted(engine.layout.runs.glob("*-etc-*"))


def _split(entries: list[tuple[Path, str]]) -> tuple[list[str], list[str]]:
    """The directories and the plain files among the policy's /etc entries (host path, target)."""
    directories = [target for source, target in entries if source.is_dir()]
    files = [target for source, target in entries if not source.is_dir()]
    return directories, files


async def _from_a_copy(
    backend: BwrapBackend, script: str, mounts: tuple[Mount, ...] | None = None, workspace: Path | None = None
) -> str:
    """What ``script`` prints in the first sandbox started that binds a copy at /etc.

    The copy is made in the background (from the second start on): until it is, starts bind
    the entries one by one.
    """
    with anyio.fail_after(HOST_BOUND):
        while True:
            out = await _output(await backend.start(_policy(f"{script}; echo ---; {_ETC_MOUNTS}", mounts, workspace)))
            seen, _, etc_mounts = out.rpartition("---\n")
            if etc_mounts == "/etc\n":
                return seen
            await anyio.sleep(0.02)


async def test_a_sandbox_sees_the_host_etc_entries_as_they_are_on_the_host_through_one_mount(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    entries = [(m.source, m.target) for m in system_mounts()[0] if m.target.startswith("/etc/")]
    # The host's own paths, but /etc/hosts: the sandbox's own, shipped with the package.
    own = [(source, target) for source, target in entries if str(source) != target]
    assert own == [(Path(hostfs.__file__).with_name("etc") / "hosts", "/etc/hosts")]
    directories, files = _split([entry for entry in entries if entry not in own])
    assert directories and files  # this host has both kinds (certificates, the linker's cache)
    listing = _LISTING.format(roots=" ".join(directories), files=" ".join(files))

    async with _backend(engine).running() as backend:
        first = await _output(await backend.start(_policy(_ETC_MOUNTS)))
        script = f"{listing}; echo ---; ls -A /etc; echo ---; cat /etc/hosts"
        seen, names, hosts = (await _from_a_copy(backend, script)).split("---\n")
        copies = _etc_copies(engine)

    assert sorted(first.split()) == sorted(target for _, target in entries)  # the first start: binds
    # find -H: the paths named are followed, as a bind follows them (/etc/localtime is a link).
    host = await anyio.run_process(["/bin/sh", "-c", listing.replace("find ", "find -H ")])
    assert seen == host.stdout.decode()
    assert names.split() == sorted({target.split("/")[2] for _, target in entries})
    assert hosts == own[0][0].read_text()
    assert len(copies) == 1
    assert _etc_copies(engine) == []  # gone with the backend


async def test_a_host_change_shows_in_sandboxes_started_after_it_not_in_one_already_running(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    reachable = engine.layout.prepare_workspaces()  # by the sandbox uid (binds)
    certs = reachable / "certs"
    certs.mkdir(mode=0o755)
    (certs / "a.pem").write_text("first\n")
    workspace = reachable / "workspace"
    workspace.mkdir()
    if os.geteuid() == 0:
        os.chown(workspace, engine.settings.sandbox.sandbox_uid, engine.settings.sandbox.sandbox_gid)
    # This test's directory stands for the host's certificates.
    mounts = (*(m for m in system_mounts()[0] if m.target != _CERTS), Mount(certs, _CERTS, system=True))
    show = f"cat {_CERTS}/a.pem; ls {_CERTS}"
    wait = "while [ ! -e /workspace/go ]; do sleep 0.02; done"

    async with _backend(engine).running() as backend:
        assert await _from_a_copy(backend, show, mounts) == "first\na.pem\n"
        # Started from that copy (its last look was just now: CHECK_INTERVAL is 2 s).
        before = await backend.start(_policy(f"{show}; {_ETC_MOUNTS}; {wait}; {show}", mounts, workspace))
        (certs / "a.pem").write_text("second, longer\n")  # in place: same inode
        (certs / "b.pem").write_text("new\n")
        os.mkfifo(certs / "c.fifo")  # neither copied nor waited on
        (certs / "d.pem").symlink_to("b.pem")
        # Every copy bound from CHECK_INTERVAL after the change on shows it.
        monkeypatch.setattr(etc, "CHECK_INTERVAL", 0.2)
        await anyio.sleep(etc.CHECK_INTERVAL)
        after = await _from_a_copy(backend, show, mounts)
        copies = _etc_copies(engine)
        (workspace / "go").touch()
        running = await _output(before)

    assert after == "second, longer\na.pem\nb.pem\nd.pem\n"
    assert running == "first\na.pem\n/etc\nfirst\na.pem\n"
    assert len(copies) == 2  # the first stays while its sandbox runs
    assert _etc_copies(engine) == []


async def test_without_a_copy_the_entries_are_bound_one_by_one_with_one_warning(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine()
    runs = engine.layout.runs
    shutil.rmtree(runs)
    runs.write_text("")  # no copy can be made under it
    entries = sorted(m.target for m in system_mounts()[0] if m.target.startswith("/etc/"))
    conf = await anyio.Path("/etc/ld.so.conf").read_text()

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    async with _backend(engine).running() as backend:
        with anyio.fail_after(HOST_BOUND):
            while not warnings():  # the second start has a copy tried, in the background
                await _output(await backend.start(_policy("true")))
                await anyio.sleep(0.02)
        seen = [await _output(await backend.start(_policy(f"cat /etc/ld.so.conf; {_ETC_MOUNTS}"))) for _ in range(3)]

    for mounts in seen:
        assert mounts.startswith(conf)  # the sandbox sees the entries
        assert sorted(mounts.removeprefix(conf).split()) == entries  # each bound on its own
    assert warnings() == [
        f"binding the host's /etc entries one by one: they could not be copied: [Errno 17] File exists: '{runs}'"
    ]


async def test_a_backend_that_stops_while_a_copy_is_being_made_leaves_none(make_engine: EngineFactory) -> None:
    engine = make_engine()
    async with _backend(engine).running() as backend:
        for _ in range(2):  # the second start has a copy made, in the background
            await _output(await backend.start(_policy("true")))

    assert _etc_copies(engine) == []
