"""container_argv: the pure policy -> podman/docker run command line.

Snapshots pin the whole argv of each dialect; the property tests say what must hold whatever
the snapshot says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_sandbox.sandbox.backends.container import ContainerRun, container_argv, container_name, owner_of
from mcp_sandbox.sandbox.backends.container.sandbox import with_connector
from mcp_sandbox.sandbox.policy import Limits, Mount, SandboxPolicy

from ..argv_processes import argv_in_other_processes

Snapshot = Callable[[str, object], None]


def make_policy(*, network: bool = False) -> SandboxPolicy:
    return SandboxPolicy(
        command=("/srv/runtime/bin/python3", "-I", "-B", "/opt/mcp-sandbox/python/boot.py"),
        mounts=(
            Mount(Path("/usr"), "/usr", system=True),
            Mount(Path("/etc/ssl/certs"), "/etc/ssl/certs", system=True),
            Mount(Path("/srv/runtime"), "/srv/runtime"),
            Mount(Path("/srv/cache"), "/cache", writable=True),
            Mount(Path("/opt/runner"), "/opt/mcp-sandbox/python"),
        ),
        symlinks=(("usr/lib", "/lib"),),
        workspace=Path("/srv/state/runs/c0ffee"),
        environment={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
        network=network,
        limits=Limits(memory=256 << 20, pids=64, cpus=1.5, cpu_seconds=31, tmp_size=32 << 20),
    )


def make_run(flavour: str = "podman", **changes: object) -> ContainerRun:
    run = ContainerRun(
        cli=f"/usr/bin/{flavour}",
        flavour="podman" if flavour == "podman" else "docker",
        name="mcp-sandbox-4242-0123456789ab",
        owner=4242,
        image="localhost/mcp-sandbox-python:latest",
        seccomp_profile="/run/mcp-sandbox-seccomp/seccomp.json",
        user=(999, 995),
        channel="fd" if flavour == "podman" else "socket",
        channel_dir=None if flavour == "podman" else "/tmp/mcp-sandbox-channel-x",
        cgroup_parent="/mcp-sandbox-4242-0123456789ab" if flavour == "podman" else None,
    )
    return dataclasses.replace(run, **changes)  # type: ignore[arg-type]


def pairs(argv: list[str]) -> list[tuple[str, str]]:
    """(flag, value) for each option that takes a value, before the image."""
    end = argv.index("--")
    return [(argv[i], argv[i + 1]) for i in range(2, end - 1) if argv[i].startswith("--") and "=" not in argv[i]]


@pytest.mark.parametrize("flavour", ["podman", "docker"])
def test_the_argv_matches_the_committed_snapshot(snapshot: Snapshot, flavour: str) -> None:
    snapshot(f"{flavour}_argv.json", container_argv(make_policy(), make_run(flavour)))


@pytest.mark.parametrize("flavour", ["podman", "docker"])
def test_the_same_policy_always_gives_the_same_argv(flavour: str) -> None:
    """Equal policies give one argv: whatever order their environment was filled in, in any process."""
    policy = make_policy()
    refilled = dataclasses.replace(policy, environment=dict(reversed(list(policy.environment.items()))))
    assert refilled == policy and list(refilled.environment) != list(policy.environment)
    expected = container_argv(policy, make_run(flavour))

    assert container_argv(refilled, make_run(flavour)) == expected
    assert argv_in_other_processes(
        "from mcp_sandbox.sandbox.backends.container import container_argv\n"
        "from sandbox.backends.container.test_argv import make_policy, make_run\n"
        f"print(json.dumps(container_argv(make_policy(), make_run({flavour!r}))))"
    ) == [expected, expected]


@pytest.mark.parametrize(
    "option",
    [
        ("--network", "none"),
        ("--cap-drop", "ALL"),
        ("--security-opt", "no-new-privileges"),
        ("--security-opt", "seccomp=/run/mcp-sandbox-seccomp/seccomp.json"),
        ("--user", "999:995"),
        ("--memory", str(256 << 20)),
        ("--memory-swap", str(256 << 20)),
        ("--pids-limit", "64"),
        ("--cpus", "1.5"),
        ("--tmpfs", f"/tmp:rw,nosuid,nodev,size={32 << 20},mode=1777"),
        ("--ulimit", "cpu=31:31"),
        ("--ulimit", "core=0:0"),
        ("--label", "io.mcp-sandbox=1"),
        ("--label", "io.mcp-sandbox.owner=4242"),
        ("--name", "mcp-sandbox-4242-0123456789ab"),
        ("--pull", "never"),
    ],
    ids=lambda option: " ".join(option),
)
@pytest.mark.parametrize("flavour", ["podman", "docker"])
def test_every_container_gets_the_isolation_options(option: tuple[str, str], flavour: str) -> None:
    argv = container_argv(make_policy(), make_run(flavour))

    assert option in pairs(argv)
    assert "--read-only" in argv[: argv.index("--")]


@pytest.mark.parametrize("flavour", ["podman", "docker"])
def test_the_network_is_left_on_only_when_the_policy_allows_it(flavour: str) -> None:
    offline = pairs(container_argv(make_policy(), make_run(flavour)))
    online = pairs(container_argv(make_policy(network=True), make_run(flavour)))

    assert ("--network", "none") in offline
    assert [v for f, v in online if f == "--network"] == []


def test_system_mounts_come_from_the_image_and_the_rest_is_bound() -> None:
    argv = container_argv(make_policy(), make_run())

    mounts = [v for f, v in pairs(argv) if f == "--mount"]
    assert not any("target=/usr," in m or "target=/etc/ssl/certs," in m for m in mounts)
    assert "type=bind,source=/srv/runtime,target=/srv/runtime,nosuid,nodev,readonly" in mounts
    assert "type=bind,source=/srv/cache,target=/cache,nosuid,nodev" in mounts
    assert "type=bind,source=/srv/state/runs/c0ffee,target=/workspace,nosuid,nodev" in mounts
    assert "type=bind,source=/srv/state/runs/c0ffee,target=/data,nosuid,nodev" in mounts


def test_podman_gets_the_channel_as_fd_3_and_the_runner_is_told_so() -> None:
    argv = container_argv(make_policy(), make_run())

    assert ("--preserve-fds", "1") in pairs(argv)
    assert argv[argv.index("--") + 1 :] == [
        "localhost/mcp-sandbox-python:latest",
        *make_policy().command,
        "3",
    ]


def test_docker_connects_the_channel_through_a_bound_socket_directory() -> None:
    argv = container_argv(make_policy(), make_run("docker"))

    assert "--preserve-fds" not in argv
    # read-only: the run may connect to the socket, not create files beside it
    assert ("--mount", "type=bind,source=/tmp/mcp-sandbox-channel-x,target=/run/mcp-sandbox,readonly") in pairs(argv)
    command = argv[argv.index("--") + 2 :]
    assert command[:5] == [
        "/srv/runtime/bin/python3",
        "-I",
        "-S",
        "/opt/mcp-sandbox/python/connect.py",
        "/run/mcp-sandbox/channel.sock",
    ]
    assert command[5:] == ["--", *make_policy().command]


def test_docker_connects_a_javascript_runtimes_channel_with_the_images_python() -> None:
    bun = ("/opt/mcp-sandbox/bun/bun", "run", "/opt/mcp-sandbox/typescript/bun.js", "typescript")
    policy = dataclasses.replace(make_policy(), command=bun, language="typescript")

    argv = container_argv(policy, make_run("docker"))

    command = argv[argv.index("--") + 2 :]
    assert command == [
        "/usr/bin/python3", "-I", "-S", "/opt/mcp-sandbox/python/connect.py", "/run/mcp-sandbox/channel.sock",
        "--", *bun,
    ]  # fmt: skip


def test_a_javascript_sandbox_on_docker_gets_the_connector_bound_once() -> None:
    js = dataclasses.replace(make_policy(), mounts=make_policy().mounts[:-1], language="typescript")

    bound = with_connector(js)

    added = [mount for mount in bound.mounts if mount.target == "/opt/mcp-sandbox/python"]
    assert [(mount.source / "connect.py").is_file() and not mount.writable for mount in added] == [True]
    assert with_connector(make_policy()) == make_policy()  # Python's runner, with the connector, is there


def test_podman_only_dialect_stays_out_of_docker_argv() -> None:
    argv = container_argv(make_policy(), make_run("docker"))

    for podman_only in ("--read-only-tmpfs=false", "--unsetenv-all", "--userns", "--preserve-fds"):
        assert podman_only not in argv


def test_rootless_podman_maps_the_servers_uid_to_65534() -> None:
    argv = container_argv(make_policy(), make_run(user=(65534, 65534), keep_id=True))

    assert ("--user", "65534:65534") in pairs(argv)
    assert ("--userns", "keep-id:uid=65534,gid=65534") in pairs(argv)


def test_a_nested_rootless_podman_container_names_its_cgroup_manager_before_run() -> None:
    parent = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-x.scope/mcp-sandbox-4242-0123456789ab"
    argv = container_argv(make_policy(), make_run(cgroup_parent=parent, cgroup_manager="cgroupfs"))

    assert argv[:4] == ["/usr/bin/podman", "--cgroup-manager", "cgroupfs", "run"]
    assert ("--cgroup-parent", parent) in pairs(argv)
    assert "--cgroup-manager" not in container_argv(make_policy(), make_run())
    assert "--cgroup-manager" not in container_argv(make_policy(), make_run("docker", cgroup_manager="cgroupfs"))


def test_a_command_that_looks_like_options_cannot_add_options() -> None:
    policy = SandboxPolicy(command=("/bin/echo", "--privileged", "--network", "host"))

    argv = container_argv(policy, make_run())

    before = argv[: argv.index("--")]
    assert "--privileged" not in before
    assert ("--network", "host") not in pairs(argv)
    assert argv[argv.index("--") + 2 : -1] == list(policy.command)


def test_a_path_with_a_comma_cannot_inject_mount_options() -> None:
    policy = SandboxPolicy(command=("/bin/true",), workspace=Path("/srv/x,readonly=false,target=/etc"))

    with pytest.raises(ValueError, match="comma"):
        container_argv(policy, make_run())


def test_container_names_carry_the_owner_pid() -> None:
    name = container_name(4242)

    assert owner_of(name) == 4242
    assert container_name(4242) != name
    assert owner_of("somebody-else") is None
    assert owner_of("mcp-sandbox-notapid-x") is None
