"""What each language's sandbox looks like: interpreter, mounts, environment, command."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from mcp_sandbox.config import EngineSettings, LimitSettings, PathSettings, PoolSettings, SessionSettings
from mcp_sandbox.egress import SOCKET_DIRECTORY_INSIDE, relay_environment, sandbox_environment, trust_environment
from mcp_sandbox.provision.bundles import BUNDLES, ENTRIES, current_bundle
from mcp_sandbox.provision.pins import JS_BINARIES
from mcp_sandbox.runners import JS_LANGUAGES, RUNTIME_MOUNT, runner_dir
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.policy import SANDBOX_HOME, Limits, Mount, SandboxPolicy

__all__ = [
    "BASE_ENVIRONMENT",
    "JS_PACKAGES_MOUNT",
    "js_binary",
    "js_policy",
    "limits_for",
    "policy_for",
    "python_policy",
    "with_egress",
    "with_file_size",
    "zygote_policy",
]

# Headroom left under the memory limit for what is not the JavaScript heap (code, stacks, buffers).
_JS_HEAP_SHARE = 0.75

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


def limits_for(limits: LimitSettings, timeout: float, *, session: SessionSettings | None = None) -> Limits:
    """The per-sandbox limits for one run of at most ``timeout`` seconds, or for a session's sandbox.

    RLIMIT_CPU counts the process's whole life, so a session's interpreter (``session``: the
    sessions' settings) gets ``session_cpu_seconds`` in all; each of its runs stays bounded by its
    wall-clock timeout.
    """
    # CPU seconds can only be spent faster than wall time on several cores; the wall-clock
    # timeout is the real bound, this one catches a spin that outlives a lost host. The soft
    # limit (one below, see the runtime's exec_server.py) stays a second above what the timeout lets a
    # run spend: equal to it, a spin's SIGXCPU raced the host's kill and was reported instead
    # of the timeout.
    per_run = math.ceil(timeout * max(1.0, limits.cpus)) + 2
    return Limits(
        memory=limits.memory,
        pids=limits.pids,
        cpus=limits.cpus,
        cpu_seconds=session.session_cpu_seconds if session is not None else per_run,
        tmp_size=limits.tmp_size,
        workspace_size=limits.scratch_size,
        file_size=limits.max_file_size,
        open_files=limits.open_files,
    )


# Where the sandbox sees the Python runtime (a venv of /usr/bin/python3 built by make or setup).
PYTHON_RUNTIME_MOUNT = f"{RUNTIME_MOUNT}/venv"


def python_policy(
    settings: EngineSettings,
    *,
    workspace: Path | None,
    timeout: float,
    mounts: Sequence[Mount] = (),
    session: bool = False,
) -> SandboxPolicy:
    """The policy of a Python sandbox running the in-sandbox runner, plus ``mounts`` (e.g. the tool stubs).

    ``session``: the sandbox serves a session's runs (see :func:`limits_for`).
    """
    system, links = system_mounts()
    runtime = settings.paths.python_runtime.resolve()
    extra: list[Mount] = [Mount(runner_dir("python"), f"{RUNTIME_MOUNT}/python")]
    inside = str(runtime)
    if not runtime.is_relative_to("/usr"):
        # A venv is bound at a fixed path inside, never at its host path, which would show the
        # host's layout (a user's home, a checkout) to the code. Its interpreter finds its prefix
        # from pyvenv.cfg beside the path it was started by, so the venv works wherever it sits.
        inside = PYTHON_RUNTIME_MOUNT
        extra.append(Mount(runtime, inside))
    extra.extend(mounts)
    env = dict(BASE_ENVIRONMENT)
    env["PATH"] = f"{inside}/bin:{env['PATH']}"
    interpreter = f"{inside}/bin/python3"
    return SandboxPolicy(
        command=(interpreter, "-I", "-B", f"{RUNTIME_MOUNT}/python/boot.py"),
        mounts=(*system, *extra),
        symlinks=links,
        workspace=workspace,
        environment=env,
        limits=limits_for(settings.limits, timeout, session=settings.sessions if session else None),
    )


def zygote_policy(
    settings: EngineSettings,
    *,
    workspace: Path | None,
    mounts: Sequence[Mount] = (),
    preload: Sequence[str] | None = None,
) -> SandboxPolicy:
    """The policy of a warm Python sandbox: a session's, running the runner as a zygote.

    The zygote imports ``preload`` (default ``pool_preload``) once and forks a child per run;
    each child lowers its CPU limit to its run's (the sandbox's own is the session budget, as
    for a session).
    """
    policy = python_policy(
        settings, workspace=workspace, timeout=settings.limits.max_timeout, mounts=mounts, session=True
    )
    preload = ",".join(settings.pool.pool_preload if preload is None else preload)
    return dataclasses.replace(policy, command=(*policy.command, f"--zygote={preload}"))


def needs_preload(pool: PoolSettings, code: str) -> bool:
    """Whether ``code`` names a ``pool_preload`` module (a substring test: a computed name is missed)."""
    return any(module in code for module in pool.pool_preload)


JS_PACKAGES_MOUNT = "/node_modules"


def js_binary(paths: PathSettings, runtime: str) -> Path:
    """The host path of the binary of the JavaScript runtime ``runtime`` (``js_runtime``: the configured one)."""
    return paths.js_runtime_dir / JS_BINARIES[runtime]


def _js_command(js_runtime: str, language: str, binary: str, heap_mib: int, entry: str) -> tuple[str, ...]:
    runner = f"{RUNTIME_MOUNT}/typescript"
    if js_runtime == "deno":
        # Deno's own permissions mirror the sandbox's (which enforces them in any case): no network,
        # writes only where the sandbox has writable space. FFI is the runner's (recvmsg, dup2),
        # and so open to the code too: the OS sandbox, not Deno, is the boundary.
        return (
            binary, "run", "--quiet", "--no-config", "--no-lock", "--no-remote", "--no-npm", "--no-prompt",
            "--allow-read", "--allow-write=/workspace,/data,/tmp", "--allow-env", "--allow-run", "--allow-sys",
            "--allow-ffi", f"--v8-flags=--max-old-space-size={heap_mib}",
            f"{runner}/{entry}", language,
        )  # fmt: skip
    # bun: nothing of the workspace configures the runtime (bunfig.toml, .env, tsconfig.json).
    return (
        binary, "run", "--no-install", "--no-env-file", f"--config={runner}/bunfig.toml",
        f"--tsconfig-override={runner}/tsconfig.json", f"{runner}/{entry}", language,
    )  # fmt: skip


def js_policy(
    settings: EngineSettings,
    *,
    language: str,
    workspace: Path | None,
    timeout: float,
    mounts: Sequence[Mount] = (),
) -> SandboxPolicy:
    """The policy of a TypeScript/JavaScript sandbox on the configured runtime (``js_runtime``).

    The same sandbox as Python's, except memory: V8 and JavaScriptCore reserve far more address
    space than they use, so instead of RLIMIT_AS the heap is capped by the runtime's own flag
    (deno: ``--max-old-space-size``; bun: JavaScriptCore's ``forceRAMSize``, which sizes its
    collector) under the memory cgroup, which is the hard limit.

    Raises:
        ValueError: ``language`` is not one of :data:`JS_LANGUAGES`.
    """
    if language not in JS_LANGUAGES:
        raise ValueError(f"{language!r} is not a JavaScript language")
    system, links = system_mounts()
    package = js_binary(settings.paths, settings.sandbox.js_runtime).parent
    inside = f"{RUNTIME_MOUNT}/{settings.sandbox.js_runtime}"
    # The runner bundled into one file when setup built it for these sources (see provision.bundles).
    bundle = current_bundle(settings.paths, settings.sandbox)
    entry = BUNDLES[settings.sandbox.js_runtime] if bundle is not None else ENTRIES[settings.sandbox.js_runtime]
    extra = [
        Mount(bundle or runner_dir("typescript"), f"{RUNTIME_MOUNT}/typescript"),
        Mount(package, inside),
        # The runtime's packages (pg, postgres, papaparse, ...): a bare import from any file
        # (the code is /tmp/.mcp-sandbox/main.ts) walks up to /node_modules.
        Mount(settings.paths.js_runtime_dir / "node_modules", JS_PACKAGES_MOUNT),
        *mounts,
    ]
    heap_mib = max(16, int(settings.limits.memory * _JS_HEAP_SHARE) >> 20)
    # The runtime's own binary on PATH: code may run `bun add ...` through a shell (execSync).
    env = {**BASE_ENVIRONMENT, "PATH": f"{inside}:{BASE_ENVIRONMENT['PATH']}"}
    if settings.sandbox.js_runtime == "deno":
        env.update({"DENO_DIR": "/tmp/.deno", "DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1"})
    else:
        env.update(
            {
                "BUN_JSC_forceRAMSize": str(heap_mib << 20),
                "BUN_RUNTIME_TRANSPILER_CACHE_PATH": "0",  # no cache to write in a fresh /tmp
                "DO_NOT_TRACK": "1",
                "NO_COLOR": "1",
            }
        )
    binary = f"{inside}/{js_binary(settings.paths, settings.sandbox.js_runtime).name}"
    return SandboxPolicy(
        command=_js_command(settings.sandbox.js_runtime, language, binary, heap_mib, entry),
        mounts=(*system, *extra),
        symlinks=links,
        workspace=workspace,
        environment=env,
        limits=dataclasses.replace(limits_for(settings.limits, timeout), address_space=False),
        language=language,
    )


def policy_for(
    settings: EngineSettings,
    language: str,
    *,
    workspace: Path | None,
    timeout: float,
    mounts: Sequence[Mount] = (),
) -> SandboxPolicy:
    """The policy of a fresh sandbox for ``language`` (python, typescript or javascript)."""
    if language in JS_LANGUAGES:
        return js_policy(settings, language=language, workspace=workspace, timeout=timeout, mounts=mounts)
    return python_policy(settings, workspace=workspace, timeout=timeout, mounts=mounts)


def with_file_size(policy: SandboxPolicy, file_size: int) -> SandboxPolicy:
    """``policy`` with RLIMIT_FSIZE ``file_size`` (what a conversation's quota has left, see :mod:`.disk`)."""
    return dataclasses.replace(policy, limits=dataclasses.replace(policy.limits, file_size=file_size))


def with_egress(
    policy: SandboxPolicy, socket_directory: Path, *, for_life: bool = True, trust: bool = False
) -> SandboxPolicy:
    """``policy`` with network through the egress proxy whose socket is in ``socket_directory``.

    ``for_life=False`` (a session's sandbox): only the relay's variables; the proxy variables
    come with each run that is granted network (in its EXEC frame), and the socket exists only
    during such a run. ``trust``: the run has secrets, and its clients are pointed at the trust
    bundle holding the proxy's CA from the start (some runtimes read it only when they start).

    Still no interface but loopback: TCP sockets become possible (for the runner's relay on the
    loopback), the socket's directory is bound in read-only, and the proxy variables point to the
    relay. Deno gets ``--allow-net`` (the proxy, not Deno, decides what is reached) and may open
    the socket.
    """
    command = policy.command
    if "--allow-net" not in command and any(part.startswith("--allow-write=") for part in command):
        command = tuple(
            f"{part},{SOCKET_DIRECTORY_INSIDE}" if part.startswith("--allow-write=") else part for part in command
        )
        command = (*command[:2], "--allow-net", *command[2:])
    return dataclasses.replace(
        policy,
        command=command,
        egress=True,
        mounts=(*policy.mounts, Mount(socket_directory, SOCKET_DIRECTORY_INSIDE)),
        environment={
            **policy.environment,
            **(sandbox_environment(policy.language) if for_life else relay_environment()),
            **(trust_environment() if trust else {}),
        },
    )
