"""What each language's sandbox looks like: interpreter, mounts, environment, command."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from mcp_sandbox.config import Settings
from mcp_sandbox.runners import RUNTIME_MOUNT, runner_dir
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.policy import SANDBOX_HOME, Limits, Mount, SandboxPolicy

__all__ = ["BASE_ENVIRONMENT", "limits_for", "python_policy", "zygote_policy"]

# The whole environment of the sandbox, on bwrap's command line. Nothing of the host's, and no
# per-call value: those travel in the EXEC frame (a command line is visible to every host user).
BASE_ENVIRONMENT: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": SANDBOX_HOME,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": "/tmp/.matplotlib",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def limits_for(settings: Settings, timeout: float, *, session: bool = False) -> Limits:
    """The per-sandbox limits for one run of at most ``timeout`` seconds, or for a session's sandbox.

    RLIMIT_CPU counts the process's whole life, so a session's interpreter gets
    ``session_cpu_seconds`` in all; each of its runs stays bounded by its wall-clock timeout.
    """
    # CPU seconds can only be spent faster than wall time on several cores; the wall-clock
    # timeout is the real bound, this one catches a spin that outlives a lost host.
    per_run = int(timeout * max(1.0, settings.cpus)) + 1
    return Limits(
        memory=settings.memory,
        pids=settings.pids,
        cpus=settings.cpus,
        cpu_seconds=settings.session_cpu_seconds if session else per_run,
        tmp_size=settings.tmp_size,
        file_size=settings.max_file_size,
        open_files=settings.open_files,
    )


def python_policy(
    settings: Settings,
    *,
    workspace: Path,
    timeout: float,
    mounts: Sequence[Mount] = (),
    session: bool = False,
) -> SandboxPolicy:
    """The policy of a Python sandbox running the in-sandbox runner, plus ``mounts`` (e.g. the tool stubs).

    ``session``: the sandbox serves a session's runs (see :func:`limits_for`).
    """
    system, links = system_mounts()
    runtime = settings.python_runtime.resolve()
    extra: list[Mount] = [Mount(runner_dir("python"), f"{RUNTIME_MOUNT}/python")]
    if not runtime.is_relative_to("/usr"):
        # A venv must sit at its host path: its interpreter finds its prefix from there.
        extra.append(Mount(runtime, str(runtime)))
    extra.extend(mounts)
    env = dict(BASE_ENVIRONMENT)
    env["PATH"] = f"{runtime}/bin:{env['PATH']}"
    interpreter = str(runtime / "bin" / "python3")
    return SandboxPolicy(
        command=(interpreter, "-I", "-B", f"{RUNTIME_MOUNT}/python/boot.py"),
        mounts=(*system, *extra),
        symlinks=links,
        workspace=workspace,
        environment=env,
        limits=limits_for(settings, timeout, session=session),
    )


def zygote_policy(settings: Settings, *, workspace: Path, mounts: Sequence[Mount] = ()) -> SandboxPolicy:
    """The policy of a warm Python sandbox: a session's, running the runner as a zygote.

    The zygote imports ``pool_preload`` once and forks a child per run; each child lowers its
    CPU limit to its run's (the sandbox's own is the session budget, as for a session).
    """
    policy = python_policy(settings, workspace=workspace, timeout=settings.max_timeout, mounts=mounts, session=True)
    preload = ",".join(settings.pool_preload)
    return dataclasses.replace(policy, command=(*policy.command, f"--zygote={preload}"))
