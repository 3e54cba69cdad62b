"""A sandbox granted network keeps its empty namespace on every backend: only the relay and the socket change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mcp_sandbox.config import EngineSettings, load_settings
from mcp_sandbox.egress import SOCKET_DIRECTORY_INSIDE, sandbox_environment
from mcp_sandbox.engine.runtimes import policy_for, with_egress
from mcp_sandbox.sandbox.backends.bwrap.argv import bwrap_argv
from mcp_sandbox.sandbox.backends.container.argv import ContainerRun, container_argv
from mcp_sandbox.sandbox.seccomp import compiled_bpf, oci_profile

_WORKSPACE = Path("/srv/ws")
_SOCKETS = Path("/srv/state/runs/1-egress-abc")


@pytest.mark.parametrize("language", ["python", "typescript"])
def test_with_egress_adds_the_socket_read_only_and_the_proxy_variables_only(language: str) -> None:
    settings = load_settings(env={}, flags={})
    plain = policy_for(EngineSettings.of(settings), language, workspace=_WORKSPACE, timeout=5)
    granted = with_egress(plain, _SOCKETS)
    assert (granted.network, granted.egress) == (False, True)
    (added,) = set(granted.mounts) - set(plain.mounts)
    assert (added.source, added.target, added.writable) == (_SOCKETS, SOCKET_DIRECTORY_INSIDE, False)
    assert dict(granted.environment) == {**plain.environment, **sandbox_environment(language)}
    assert granted.environment["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert dataclasses.replace(granted, mounts=plain.mounts, environment=plain.environment, egress=False) == plain


def test_deno_gets_net_permission_and_the_socket_directory_only_with_egress() -> None:
    settings = load_settings(env={}, flags={"js_runtime": "deno"})
    plain = policy_for(EngineSettings.of(settings), "typescript", workspace=_WORKSPACE, timeout=5)
    granted = with_egress(plain, _SOCKETS)
    assert "--allow-net" not in plain.command and "--allow-net" in granted.command
    assert f"--allow-write=/workspace,/data,/tmp,{SOCKET_DIRECTORY_INSIDE}" in granted.command


def test_the_backends_keep_the_empty_network_namespace_with_egress() -> None:
    settings = load_settings(env={}, flags={})
    granted = with_egress(policy_for(EngineSettings.of(settings), "python", workspace=_WORKSPACE, timeout=5), _SOCKETS)
    argv = bwrap_argv(granted, bwrap="/usr/bin/bwrap", seccomp_fd=3)
    assert "--unshare-all" in argv and "--share-net" not in argv
    run = ContainerRun(
        cli="/usr/bin/docker",
        flavour="docker",
        name="n",
        owner=1,
        image="i",
        seccomp_profile="/p.json",
        user=(999, 995),
        channel="socket",
        channel_dir="/tmp/c",
        cgroup_parent=None,
    )
    container = container_argv(granted, run)
    assert container[container.index("--network") + 1] == "none"


def test_the_egress_filter_differs_and_keeps_udp_refused() -> None:
    assert compiled_bpf(egress=True) != compiled_bpf()
    rules = oci_profile(egress=True)["syscalls"]
    socket_rules = [rule for rule in rules if rule["names"] == ["socket"]]
    refused_types = {rule["args"][1]["valueTwo"] for rule in socket_rules if len(rule.get("args", [])) == 2}
    assert 2 in refused_types and 3 in refused_types and 1 not in refused_types  # DGRAM, RAW refused; STREAM not
    plain = oci_profile()["syscalls"]
    assert next(rule for rule in plain if rule["names"] == ["socket"])["args"][0]["op"] == "SCMP_CMP_NE"
