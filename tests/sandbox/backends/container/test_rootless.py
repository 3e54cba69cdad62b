"""What rootless podman lacks on a host is named with its fix (checked as the unprivileged user)."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.sandbox.backends.container.rootless import rootless_problems

from ...children import in_child


@pytest.fixture
def etc() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="mcp-sandbox-etc-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _problems_as(uid: int, etc: Path) -> dict[str, list[str]]:
    """``rootless_problems(etc)`` as seen by ``uid`` (a forked child drops to it)."""

    def as_uid() -> dict[str, object]:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        found = rootless_problems(etc)
        return {"ids": found.ids, "limits": found.limits}

    answer: dict[str, list[str]] = in_child(as_uid)["result"]
    return answer


def test_root_needs_nothing_of_this() -> None:
    if os.geteuid() != 0:
        pytest.skip("as root")
    assert rootless_problems() == rootless_problems(Path("/nonexistent"))
    assert not rootless_problems().ids and not rootless_problems().limits


def test_missing_subordinate_ids_are_named_with_the_usermod_that_adds_them(etc: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become another uid")
    uid = load_settings(env={}, flags={}).sandbox.sandbox_uid
    user = pwd.getpwuid(uid).pw_name
    (etc / "subuid").write_text("someoneelse:100000:65536\n")
    (etc / "subgid").write_text(f"{user}:100000:65536\n")

    found = _problems_as(uid, etc)

    assert any(f"usermod --add-subuids 100000-165535 {user}" in p for p in found["ids"])
    assert not any("subgid" in p for p in found["ids"])


def test_subordinate_ids_by_uid_number_count_and_limits_need_cgroup_v2_with_a_user_manager(etc: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become another uid")
    uid = load_settings(env={}, flags={}).sandbox.sandbox_uid
    (etc / "subuid").write_text(f"{uid}:200000:65536\n")
    (etc / "subgid").write_text(f"{uid}:200000:65536\n")

    found = _problems_as(uid, etc)

    assert not any("subordinate" in p for p in found["ids"])
    # This host's memory/pids/cpu are on cgroup v1; a systemd guest's user manager is proven in make vm-test.
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert any("cgroup v1" in p for p in found["limits"])
    else:
        assert found["limits"] == [] or any("user@" in p for p in found["limits"])
