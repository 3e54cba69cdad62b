"""SandboxPolicy: frozen once built, environment included."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mcp_sandbox.sandbox.policy import Limits, Mount, SandboxPolicy


def test_a_policy_cannot_be_changed_after_it_is_built() -> None:
    policy = SandboxPolicy(command=("/bin/true",))

    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.network = True  # type: ignore[misc]


def test_the_environment_of_a_policy_is_read_only() -> None:
    policy = SandboxPolicy(command=("/bin/true",), environment={"PATH": "/usr/bin"})

    with pytest.raises(TypeError):
        policy.environment["LD_PRELOAD"] = "/tmp/evil.so"  # type: ignore[index]


def test_changing_the_callers_dict_does_not_change_the_policy() -> None:
    environment = {"PATH": "/usr/bin"}
    policy = SandboxPolicy(command=("/bin/true",), environment=environment)

    environment["LD_PRELOAD"] = "/tmp/evil.so"

    assert dict(policy.environment) == {"PATH": "/usr/bin"}


def test_mounts_and_limits_cannot_be_changed_either() -> None:
    mount = Mount(source=Path("/usr"), target="/usr")
    limits = Limits()

    with pytest.raises(dataclasses.FrozenInstanceError):
        mount.writable = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.memory = 1 << 40  # type: ignore[misc]


def test_an_empty_command_is_rejected() -> None:
    with pytest.raises(ValueError):
        SandboxPolicy(command=())


def test_the_default_policy_denies_network_and_runs_unprivileged() -> None:
    policy = SandboxPolicy(command=("/bin/true",))

    assert (policy.network, policy.uid, policy.gid, policy.mounts, dict(policy.environment)) == (
        False,
        65534,
        65534,
        (),
        {},
    )
