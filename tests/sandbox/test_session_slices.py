"""A slice of the conformance suite on sessions: each attack runs as a session's first run.

The tests are the suite's own, collected here again with ``sandbox_kind``:

- "fork" (``harness.SandboxRunner.fork``): the fork's interpreter loads its source's variables,
  then the attack runs in it. On every backend, as the suite: on podman and docker the fork is a
  session container of its own;
- "born" (``harness.SandboxRunner.born``): the session-ready sandbox's runner, started ahead,
  serves the attack as its session's first run. On bwrap only: the container backends keep no
  session-ready sandboxes;
- "resumed" (``harness.SandboxRunner.resumed``): a conversation's session set a variable and was
  parked (as at idle); the attack is the first run of the session that resumes it, born of a
  session-ready sandbox with its state mapped and loaded first. On bwrap only: on podman and
  docker a resume starts its session container as a fork's first run does (the "fork" kind),
  and the mapping is the runtime's own, the same on every backend.

Each must see exactly what a sandbox started for the run sees.
"""

from __future__ import annotations

import pytest

from .test_filesystem import (
    test_host_secrets_are_not_visible,
    test_no_mount_point_outside_the_writable_places_takes_a_new_file,
    test_proc_sys_and_sysrq_are_not_writable,
    test_server_state_is_invisible_and_unreadable_to_the_sandbox_uid,
    test_symlinks_to_host_paths_lead_nowhere,
    test_system_directories_are_read_only,
    test_workspace_and_tmp_are_writable,
)
from .test_privileges import (
    test_code_runs_as_the_unprivileged_uid,
    test_dangerous_syscall_is_denied,
    test_device_nodes_cannot_be_created,
    test_kernel_memory_and_logs_are_unreadable,
    test_process_has_no_new_privs_no_capabilities_and_a_seccomp_filter,
    test_setuid_su_does_not_give_root,
)
from .test_processes import test_double_forked_orphan_does_not_outlive_the_run, test_signalling_host_processes_fails

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

__all__ = [
    "test_code_runs_as_the_unprivileged_uid",
    "test_dangerous_syscall_is_denied",
    "test_device_nodes_cannot_be_created",
    "test_double_forked_orphan_does_not_outlive_the_run",
    "test_host_secrets_are_not_visible",
    "test_kernel_memory_and_logs_are_unreadable",
    "test_no_mount_point_outside_the_writable_places_takes_a_new_file",
    "test_proc_sys_and_sysrq_are_not_writable",
    "test_process_has_no_new_privs_no_capabilities_and_a_seccomp_filter",
    "test_server_state_is_invisible_and_unreadable_to_the_sandbox_uid",
    "test_setuid_su_does_not_give_root",
    "test_signalling_host_processes_fails",
    "test_symlinks_to_host_paths_lead_nowhere",
    "test_system_directories_are_read_only",
    "test_workspace_and_tmp_are_writable",
]


@pytest.fixture(params=["fork", "born", "resumed"])
def sandbox_kind(request: pytest.FixtureRequest, backend_name: str) -> str:
    """Every attack here runs as the first run of a forked session, of a born one (bwrap's), or of
    one resumed from its parked state (bwrap's)."""
    kind: str = request.param
    if kind == "born" and backend_name != "bwrap":
        pytest.skip("only bwrap keeps session-ready sandboxes")
    if kind == "resumed" and backend_name != "bwrap":
        pytest.skip("podman and docker resume in a session container started as a fork's (the fork kind)")
    return kind
