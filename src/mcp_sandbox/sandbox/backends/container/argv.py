"""Policy -> ``podman run`` / ``docker run`` argv (pure), container names and labels, the CLI's env.

:func:`container_argv` is the container counterpart of ``bwrap_argv``: the same policy, the
earlier bridge's flag set (no network, read-only root, sized ``/tmp``, all capabilities dropped,
``no-new-privileges``, our own seccomp profile, memory / pids / CPU limits, a label and a name).
The image supplies what the policy marks ``system`` (``/usr`` and friends); every other mount,
the workspace and the runner are bound from the host.

The channel reaches the runner one of two ways:

- ``fd`` (podman): ``--preserve-fds 1`` hands the client's fd 3, one end of a socketpair, to the
  container's process; the runner gets ``3`` as its last argument, like under bwrap;
- ``socket`` (docker, which cannot pass fds): the host listens on a unix socket in a private
  directory bound at :data:`CHANNEL_DIR`; ``connect.py`` (the Python runner's own helper, on the
  image's ``/usr/bin/python3`` for a JavaScript runtime) connects and execs the command with the
  connected fd. SCM_RIGHTS works across the container boundary either way: it is one kernel.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mcp_sandbox.runners import RUNTIME_MOUNT
from mcp_sandbox.sandbox.policy import WORKSPACE, WORKSPACE_ALIAS, SandboxPolicy

__all__ = [
    "CHANNEL_DIR",
    "CHANNEL_FD",
    "CHANNEL_SOCKET",
    "CONNECT",
    "CONNECT_PYTHON",
    "LABEL",
    "NAME_PREFIX",
    "OWNER_LABEL",
    "ContainerRun",
    "Flavour",
    "container_argv",
    "container_name",
    "owner_of",
    "server_env",
]

Flavour = Literal["podman", "docker"]

LABEL = "io.mcp-sandbox"  # on every container we start: what the sweep looks for
OWNER_LABEL = "io.mcp-sandbox.owner"  # the server's pid: only a dead server's containers are swept
NAME_PREFIX = "mcp-sandbox-"
CHANNEL_FD = 3  # --preserve-fds passes fds 3.. to the container
CHANNEL_DIR = "/run/mcp-sandbox"
CHANNEL_SOCKET = f"{CHANNEL_DIR}/channel.sock"
CONNECT = f"{RUNTIME_MOUNT}/python/connect.py"
# The interpreter of the connector for a runtime that is not Python's (bun, deno): the image's own.
CONNECT_PYTHON = "/usr/bin/python3"


def container_name(owner: int) -> str:
    """A fresh container name carrying the server's pid (``mcp-sandbox-<pid>-<hex>``)."""
    return f"{NAME_PREFIX}{owner}-{uuid.uuid4().hex[:12]}"


def owner_of(name: str) -> int | None:
    """The server pid in a name made by :func:`container_name`, or None for another name."""
    if not name.startswith(NAME_PREFIX):
        return None
    owner = name[len(NAME_PREFIX) :].split("-", 1)[0]
    return int(owner) if owner.isdigit() else None


@dataclass(frozen=True, slots=True)
class ContainerRun:
    """Everything about one container that is not in the policy.

    Attributes:
        cli: the podman or docker binary (or a wrapper answering like one).
        flavour: which CLI dialect to speak.
        name: the container's name (see :func:`container_name`).
        owner: the server's pid, as a label.
        image: an image reference.
        seccomp_profile: path of the OCI seccomp profile file.
        user: ``uid:gid`` the container's processes run as.
        keep_id: rootless podman: map the server's own uid to ``user`` inside (files it writes
            in the workspace are then the server's).
        channel: ``fd`` or ``socket`` (see the module docstring), or ``none`` (a probe).
        channel_dir: the host directory holding the channel socket (``socket`` only).
        cidfile: where the client writes the container's id once the engine has created it
            (docker's: see ``sandbox.py``, ``ContainerSandbox._created``).
        cgroup_parent: a cgroup (path from the hierarchy's root) to nest the container in.
        cgroup_manager: podman's ``--cgroup-manager`` for this container, when not the engine's
            own (``cgroupfs``: rootless podman nested in our delegated cgroup v2, which a
            systemd-managed container could not be placed under).
    """

    cli: str
    flavour: Flavour
    name: str
    owner: int
    image: str
    seccomp_profile: str
    user: tuple[int, int]
    keep_id: bool = False
    channel: Literal["fd", "socket", "none"] = "fd"
    channel_dir: str | None = None
    cidfile: str | None = None
    cgroup_parent: str | None = None
    cgroup_manager: Literal["cgroupfs"] | None = None


def _bind(source: str, target: str, *, writable: bool, podman: bool) -> list[str]:
    for path in (source, target):
        # --mount is a comma-separated key=value list: such a path would inject options.
        if "," in path or "\n" in path:
            raise ValueError(f"cannot bind {path!r} into a container: it contains a comma or newline")
    spec = f"type=bind,source={source},target={target}"
    if podman:  # docker's --mount has no such options (no_new_privs still ignores setuid bits)
        spec += ",nosuid,nodev"
    return ["--mount", spec if writable else f"{spec},readonly"]


def container_argv(policy: SandboxPolicy, run: ContainerRun) -> list[str]:
    """Turn a policy into a ``podman run`` / ``docker run`` command line. Pure: same input, same argv.

    Raises:
        ValueError: a path cannot be expressed as a bind mount (a comma in it).
    """
    limits = policy.limits
    podman = run.flavour == "podman"
    # A global option of podman's, before the subcommand.
    manager = ["--cgroup-manager", run.cgroup_manager] if podman and run.cgroup_manager else []
    argv = [
        run.cli, *manager, "run",
        "--name", run.name,
        "--rm",  # the engine removes it once it has ended (see ``running.py``)
        *(["--cidfile", run.cidfile] if run.cidfile else []),
        "--label", f"{LABEL}=1",
        "--label", f"{OWNER_LABEL}={run.owner}",
        "--pull", "never",  # no registry behind a missing image: fail, never fetch
        "--log-driver", "none",  # output is the run's: not copied to the engine's log files
        "--stop-timeout", "0",  # removal kills at once (podman's rm otherwise waits 10 s)
        "--hostname", policy.hostname,
        "--user", f"{run.user[0]}:{run.user[1]}",
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        "--security-opt", f"seccomp={run.seccomp_profile}",
        "--read-only",
    ]  # fmt: skip
    if podman:
        # podman's --read-only adds writable tmpfs on /run, /var/tmp: only /tmp may be written.
        argv += ["--read-only-tmpfs=false"]
    if run.keep_id:
        argv += ["--userns", f"keep-id:uid={run.user[0]},gid={run.user[1]}"]
    if not policy.network:
        argv += ["--network", "none"]
    argv += [
        "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_size},mode=1777",
        "--shm-size", str(limits.tmp_size),
        "--memory", str(limits.memory),
        "--memory-swap", str(limits.memory),  # the same: no swap beyond the limit
        "--pids-limit", str(limits.pids),
        "--cpus", f"{limits.cpus:g}",
        "--ulimit", f"cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
        "--ulimit", f"fsize={limits.file_size}:{limits.file_size}",
        "--ulimit", f"nofile={limits.open_files}:{limits.open_files}",
        "--ulimit", "core=0:0",
    ]  # fmt: skip
    # Writable places the engine mounts by default, closed with an empty read-only tmpfs: the
    # mqueue filesystem (message queues outlive a run's view of them) and, on podman, the cgroup
    # tree (a world-writable tmpfs on hybrid-cgroup hosts). Only /workspace, /data, /tmp and
    # /dev/shm take files (the conformance suite walks every mount point to check).
    argv += ["--tmpfs", "/dev/mqueue:ro,nosuid,nodev,noexec,size=4k,mode=0555"]
    # No pseudo-terminals: the engine's devpts draws on the host's one pty pool (docker has no
    # max= for it), so an empty read-only tmpfs takes its place and /dev/ptmx dangles.
    argv += ["--tmpfs", "/dev/pts:ro,nosuid,nodev,noexec,size=4k,mode=0555"]
    if podman:
        argv += ["--tmpfs", "/sys/fs/cgroup:ro,nosuid,nodev,noexec,size=4k,mode=0555"]
        # Host-wide counters other tenants' activity shows in (as under bwrap; /proc/stat stays).
        argv += ["--security-opt", "mask=/proc/diskstats:/proc/pressure"]
    else:  # docker's runc allows a bind over /proc/diskstats, not over /proc/pressure
        argv += ["--mount", "type=bind,source=/dev/null,target=/proc/diskstats,readonly"]
    if run.cgroup_parent is not None:
        argv += ["--cgroup-parent", run.cgroup_parent]
    # A cgroup namespace of its own: /proc/self/cgroup shows "/", not the path of the cgroup
    # it nests in (named after the server's pid); docker's default on cgroup v1 is the host's.
    argv += ["--cgroupns", "private"]
    if podman:
        argv += ["--no-hosts"]  # else podman copies the host's /etc/hosts (its names) in
    for mount in policy.mounts:
        if not mount.system:  # the image has its own /usr
            argv += _bind(str(mount.source), mount.target, writable=mount.writable, podman=podman)
    if policy.workspace is not None:
        # Bound twice rather than linked: the image's root is read-only and may lack the link.
        argv += _bind(str(policy.workspace), WORKSPACE, writable=True, podman=podman)
        argv += _bind(str(policy.workspace), WORKSPACE_ALIAS, writable=True, podman=podman)
    if podman:
        argv += ["--unsetenv-all"]  # no container=podman, TERM, ...: only the policy's environment
    for key in sorted(policy.environment):
        argv += ["--env", f"{key}={policy.environment[key]}"]
    argv += ["--workdir", policy.cwd]
    command: Sequence[str]
    if run.channel == "fd":
        argv += ["--preserve-fds", "1"]
        command = [*policy.command, str(CHANNEL_FD)]
    elif run.channel == "none":
        command = policy.command
    else:
        if run.channel_dir is None:
            raise ValueError("a socket channel needs channel_dir")
        # Read-only: connect() needs only the socket's own permission, and the run must not
        # create files there.
        argv += _bind(run.channel_dir, CHANNEL_DIR, writable=False, podman=podman)
        # Python's connector runs on the run's own interpreter; a JavaScript runtime's, on the image's.
        python = policy.command[0] if policy.language == "python" else CONNECT_PYTHON
        command = [python, "-I", "-S", CONNECT, CHANNEL_SOCKET, "--", *policy.command]
    argv += ["--", run.image, *command]
    return argv


def server_env() -> dict[str, str]:
    """The part of the server's environment the CLI needs (read when a container starts)."""
    keep = (
        "PATH",
        "HOME",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "CONTAINERS_CONF",
        "CONTAINERS_STORAGE_CONF",
        "CONTAINERS_REGISTRIES_CONF",
        "CONTAINER_HOST",
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "DOCKER_CONTEXT",
    )
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
    return env
