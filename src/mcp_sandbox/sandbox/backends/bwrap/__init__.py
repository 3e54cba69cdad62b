"""The bubblewrap backend: unprivileged namespaces + seccomp + cgroups + rlimits, no daemon.

``argv.py`` turns a policy into bwrap's command line (pure, snapshot-tested) and finds the
binary; ``sandbox.py`` starts and closes sandboxes; ``runner.py`` reads from /proc how a
sandbox's runner ended, before the sandbox is torn down; ``probe.py`` starts a real one to say
what this host enforces.
"""

from __future__ import annotations

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings
from mcp_sandbox.sandbox.backends.bwrap.argv import bwrap_argv, find_bwrap
from mcp_sandbox.sandbox.backends.bwrap.sandbox import BwrapBackend, BwrapSandbox
from mcp_sandbox.state import StateLayout

__all__ = ["BwrapBackend", "BwrapSandbox", "bwrap_argv", "create", "find_bwrap"]


def create(
    name: str, sandbox: SandboxSettings, paths: PathSettings, limits: LimitSettings, layout: StateLayout
) -> BwrapBackend:
    """The registry's constructor (``name`` is ``bwrap``, its one name)."""
    return BwrapBackend(sandbox, paths, limits, layout)
