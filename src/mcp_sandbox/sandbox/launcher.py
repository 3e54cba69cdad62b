"""How a sandbox's first host process starts: behind a gate, so that the server spawns it with vfork.

Before it runs bwrap, that process must be in the sandbox's cgroups, under its rlimits and, when
the server runs as root, the unprivileged sandbox uid/gid (else bwrap, started by real root,
would map the sandbox uid to host root, and the files it writes would be root's). A
``preexec_fn`` could do it between fork and exec, but then Python forks the whole server: its
page tables copied while the event loop, every tenant's, stands still, for every sandbox
started. Without a ``preexec_fn`` the spawn is a vfork. So:

1. the process starts as the gate (:func:`gated`), waiting for a line on its stdin, a pipe from
   the server;
2. the server puts it in its cgroups (``cgroup.procs``) and sets its rlimits (``prlimit``) from
   outside (:func:`admit`), then writes the line (:func:`open_gate`): how many more arguments
   follow, and those, one per line;
3. the gate drops to the sandbox uid/gid and clears the supplementary groups (as root only), then
   execs bwrap, with its command line completed by those arguments; every process of the sandbox
   is a descendant, so all of it is in the cgroups, under the limits and the uid.

The gate is our static program (``gate.c``, see :mod:`.gate`) when setup built it, else
``/bin/sh`` running a few lines of shell that exec ``setpriv`` (util-linux) for the drop: the same
protocol and exit codes, one exec instead of two dynamically linked ones.

The arguments that come through the gate let a process be started and admitted before its
command is known: moving a process into a cgroup waits for an RCU grace period,
which a backend can thus spend ahead of a start (see ``backends/bwrap/sandbox.py``).

When the server cannot do its part it closes the gate without the line: the gate exits with
:data:`GATE_CLOSED` and nothing of the sandbox ran. A server that dies meanwhile closes it too.
bwrap's ``--die-with-parent`` asks for SIGKILL when the server dies, from then on.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from mcp_sandbox.errors import SandboxStartError
from mcp_sandbox.sandbox import kernfs
from mcp_sandbox.sandbox.gate import exec_path

__all__ = ["GATE_CLOSED", "SHELL", "LaunchSpec", "admit", "gated", "open_gate"]

SHELL = "/bin/sh"
GATE_CLOSED = 125  # the gate's exit code when the server closed it without the line (gate.c's too)
# $0 names the process in ps; "$@" is setpriv's command line (or bwrap's), completed by the
# arguments read from the gate (a count, then one per line), run with /dev/null on stdin.
_GATE = (
    'read -r n || exit 125; case $n in ""|*[!0-9]*) exit 125;; esac; '
    'while [ "$n" -gt 0 ]; do IFS= read -r a || exit 125; set -- "$@" "$a"; n=$((n - 1)); done; '
    'exec "$@" </dev/null'
)
_NAME = "mcp-sandbox-gate"


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the sandbox's first process is given before it execs the backend's binary."""

    cgroup_procs: tuple[str, ...]
    rlimits: tuple[tuple[int, int], ...]  # (resource, limit), soft == hard
    uid: int | None  # host uid to become, or None to keep ours
    gid: int | None


def gated(spec: LaunchSpec, command: Sequence[str], gate: int | None = None) -> list[str]:
    """The command line that runs ``command`` once the gate opens, as ``spec``'s uid and gid.

    ``gate``: a descriptor of the static gate program (:func:`.gate.open_checked`), which the
    caller passes to the process (``pass_fds``) and closes once it started; or None for ``sh``
    and ``setpriv``.

    Raises:
        SandboxStartError: a uid or gid is to be dropped, there is no ``gate`` and ``setpriv`` is
            not installed.
    """
    if gate is not None:
        ids: list[str] = []
        if spec.gid is not None:
            ids += ["--gid", str(spec.gid)]
        if spec.uid is not None:
            ids += ["--uid", str(spec.uid)]
        return [exec_path(gate), "--fd", str(gate), *ids, "--", *command]
    drop: list[str] = []
    if spec.uid is not None or spec.gid is not None:
        drop = [_setpriv()]
        if spec.gid is not None:
            drop += [f"--regid={spec.gid}", "--clear-groups"]
        if spec.uid is not None:
            drop.append(f"--reuid={spec.uid}")
        drop.append("--")
    return [SHELL, "-c", _GATE, _NAME, *drop, *command]


@functools.cache  # looked up once found (every sandbox started as root needs it); not while missing
def _setpriv() -> str:
    setpriv = shutil.which("setpriv", path=os.defpath)
    if setpriv is None:
        raise SandboxStartError("setpriv (util-linux) is needed to start sandboxes as root: install util-linux")
    return setpriv


# The rlimits a sandbox gets, as an operator knows them: what it limits, and the setting.
_LIMIT_NAMES = {
    resource.RLIMIT_NOFILE: ("open files", "open_files"),
    resource.RLIMIT_FSIZE: ("file size", "max_file_size"),
    resource.RLIMIT_CPU: ("CPU seconds", "the run's timeout"),
    resource.RLIMIT_NPROC: ("processes", "pids"),
    resource.RLIMIT_AS: ("address space", "memory"),
}


def admit(spec: LaunchSpec, pid: int) -> None:
    """Put process ``pid`` (waiting at the gate) in ``spec``'s cgroups and give it its rlimits.

    Raises:
        OSError: a cgroup or a limit refused it; a limit above the hard limit this server has and
            may not raise (no CAP_SYS_RESOURCE) is a PermissionError naming the limit, the setting
            and both values (callers say "could not be started: <it>").
    """
    for procs in spec.cgroup_procs:
        kernfs.write(procs, str(pid))
    for which, limit in spec.rlimits:
        try:
            resource.prlimit(pid, which, (limit, limit))
        except PermissionError:
            _, hard = resource.getrlimit(which)
            if hard == resource.RLIM_INFINITY or limit <= hard:
                raise
            what, setting = _LIMIT_NAMES.get(which, (f"resource {which}", "its setting"))
            raise PermissionError(
                f"the sandbox's limit on {what} ({setting}: {limit}) is above this server's hard limit"
                f" of {hard}, which it may not raise: set {setting} to at most {hard}, or raise the hard"
                " limit (ulimit -H, prlimit, or LimitNOFILE= and the like in a systemd unit)"
            ) from None


def open_gate(gate: int, *, admitted: bool, then: Sequence[str] = ()) -> None:
    """Let the process waiting on ``gate`` (the pipe's write end, closed here) go on, or end it.

    ``then``: arguments that complete its command line (none may hold a newline).

    Raises:
        ValueError: an argument holds a newline (the gate is closed: the process ends there).
        OSError: the process is gone (its end of the gate is closed).
    """
    try:
        if admitted:
            if any("\n" in argument for argument in then):
                raise ValueError(f"an argument through the gate holds a newline: {then!r}")
            data = "".join(f"{argument}\n" for argument in (str(len(then)), *then)).encode()
            while data:
                data = data[os.write(gate, data) :]
    finally:
        os.close(gate)
