"""Per-sandbox cgroups: memory, pids and CPU limits where the host lets us set them.

Two layouts are supported:

- cgroup v1 (as root): one directory per controller under the server's own cgroup, so any
  limit the server itself runs under still applies;
- cgroup v2 with a delegated subtree: a child of the server's own cgroup whose parent already
  enables the controllers (``cgroup.subtree_control``).

The sandbox's first process joins the cgroup itself, before it execs bwrap (see
``launcher.py``), so nothing of the sandbox ever runs outside its limits.

``support.py`` finds what the host lets us limit, ``run.py`` is one sandbox's cgroup,
``sweep.py`` removes what crashed servers left, ``hierarchy.py`` reads and prunes the cgroup
filesystem for all three.
"""

from __future__ import annotations

from mcp_sandbox.sandbox.cgroups.run import RunCgroup
from mcp_sandbox.sandbox.cgroups.support import CgroupSupport, detect_cgroups, detect_root_cgroups
from mcp_sandbox.sandbox.cgroups.sweep import sweep_stale, sweep_stale_everywhere

__all__ = [
    "CgroupSupport",
    "RunCgroup",
    "detect_cgroups",
    "detect_root_cgroups",
    "sweep_stale",
    "sweep_stale_everywhere",
]
