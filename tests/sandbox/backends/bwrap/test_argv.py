"""bwrap_argv: the pure policy -> bwrap command line function.

A snapshot pins the whole argv; the property tests below say what must hold for the sandbox to
be a sandbox, whatever the snapshot says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_sandbox.config import EngineSettings, load_settings
from mcp_sandbox.engine.runtimes import policy_for, with_egress
from mcp_sandbox.sandbox.backends.bwrap import bwrap_argv
from mcp_sandbox.sandbox.backends.bwrap.argv import args_file, etc_entries
from mcp_sandbox.sandbox.policy import Limits, Mount, SandboxPolicy

from ..argv_processes import argv_in_other_processes

BWRAP = "/usr/bin/bwrap"
SECCOMP_FD = 9

# Every option bwrap_argv may emit, with its number of arguments. An option missing here fails
# the tests on purpose: a new option wants a security review before it joins this table.
ARITY = {
    "--unshare-all": 0,
    "--unshare-user": 0,
    "--disable-userns": 0,
    "--die-with-parent": 0,
    "--new-session": 0,
    "--clearenv": 0,
    "--share-net": 0,
    "--uid": 1,
    "--gid": 1,
    "--hostname": 1,
    "--cap-drop": 1,
    "--proc": 1,
    "--dev": 1,
    "--size": 1,
    "--tmpfs": 1,
    "--remount-ro": 1,
    "--chdir": 1,
    "--seccomp": 1,
    "--bind": 2,
    "--ro-bind": 2,
    "--dev-bind": 2,
    "--perms": 1,
    "--symlink": 2,
    "--setenv": 2,
}

Option = tuple[str, tuple[str, ...]]
Snapshot = Callable[[str, object], None]  # the `snapshot` fixture in conftest.py


def make_policy(*, network: bool = False) -> SandboxPolicy:
    return SandboxPolicy(
        command=("/usr/bin/python3", "-I", "-B", "/opt/mcp-sandbox/python/boot.py"),
        mounts=(
            Mount(Path("/usr"), "/usr"),
            Mount(Path("/etc/ssl/certs"), "/etc/ssl/certs"),
            Mount(Path("/srv/cache"), "/cache", writable=True),
            Mount(Path("/opt/mcp-sandbox"), "/opt/mcp-sandbox"),
        ),
        symlinks=(("usr/lib", "/lib"), ("usr/lib64", "/lib64"), ("usr/bin", "/bin")),
        workspace=Path("/srv/state/runs/c0ffee"),
        # Deliberately not in sorted order.
        environment={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "FILE_BASE_URL": "http://h/f"},
        network=network,
        uid=65534,
        gid=65534,
        hostname="sandbox",
        cwd="/workspace",
        limits=Limits(tmp_size=32 << 20),
    )


def split(argv: list[str]) -> tuple[list[Option], list[str]]:
    """Parse argv into bwrap's options (in order) and the command after ``--``."""
    assert argv[0] == BWRAP
    options: list[Option] = []
    index = 1
    while argv[index] != "--":
        flag = argv[index]
        assert flag in ARITY, f"bwrap_argv emits {flag!r}, which these tests do not know: review it"
        arity = ARITY[flag]
        options.append((flag, tuple(argv[index + 1 : index + 1 + arity])))
        index += 1 + arity
    return options, argv[index + 1 :]


def options_of(argv: list[str]) -> list[Option]:
    return split(argv)[0]


def test_the_argv_matches_the_committed_snapshot(snapshot: Snapshot) -> None:
    snapshot("bwrap_argv.json", bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))


def test_the_same_policy_always_gives_the_same_argv() -> None:
    """Equal policies give one argv: whatever order their environment was filled in, in any process."""
    policy = make_policy()
    refilled = dataclasses.replace(policy, environment=dict(reversed(list(policy.environment.items()))))
    assert refilled == policy and list(refilled.environment) != list(policy.environment)
    expected = bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD)

    assert bwrap_argv(refilled, bwrap=BWRAP, seccomp_fd=SECCOMP_FD) == expected
    assert argv_in_other_processes(
        "from mcp_sandbox.sandbox.backends.bwrap import bwrap_argv\n"
        "from sandbox.backends.bwrap.test_argv import BWRAP, SECCOMP_FD, make_policy\n"
        "print(json.dumps(bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD)))"
    ) == [expected, expected]


@pytest.mark.parametrize(
    "option",
    [
        ("--unshare-all", ()),
        ("--unshare-user", ()),
        ("--disable-userns", ()),
        ("--die-with-parent", ()),
        ("--new-session", ()),
        ("--cap-drop", ("ALL",)),
        ("--clearenv", ()),
        ("--remount-ro", ("/",)),
        ("--uid", ("65534",)),
        ("--gid", ("65534",)),
    ],
    ids=lambda option: " ".join((option[0], *option[1])),
)
@pytest.mark.parametrize("network", [False, True], ids=["offline", "online"])
def test_every_sandbox_gets_the_isolation_options(option: Option, network: bool) -> None:
    options = options_of(bwrap_argv(make_policy(network=network), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert option in options


@pytest.mark.parametrize("network", [False, True])
def test_the_network_is_shared_only_when_the_policy_allows_it(network: bool) -> None:
    options = options_of(bwrap_argv(make_policy(network=network), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert (("--share-net", ()) in options) is network


def test_writable_mounts_use_bind_and_the_others_ro_bind() -> None:
    policy = make_policy()

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    binds = {args for flag, args in options if flag == "--bind"}
    ro_binds = {args for flag, args in options if flag == "--ro-bind"}
    assert policy.workspace is not None
    assert binds == {(str(m.source), m.target) for m in policy.mounts if m.writable} | {
        (str(policy.workspace), "/workspace")
    }
    assert ro_binds == {(str(m.source), m.target) for m in policy.mounts if not m.writable}
    # /dev/null over a host-wide counter (issue 21, finding 12); a device: writes go nowhere.
    assert {args for flag, args in options if flag == "--dev-bind"} == {("/dev/null", "/proc/diskstats")}


def test_the_workspace_is_also_reachable_as_data() -> None:
    options = options_of(bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert ("--symlink", ("/workspace", "/data")) in options


def test_without_a_workspace_nothing_is_writable_but_the_policys_writable_mounts() -> None:
    policy = SandboxPolicy(command=("/bin/true",), mounts=(Mount(Path("/usr"), "/usr"),))

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert [args for flag, args in options if flag == "--bind"] == []


def test_every_tmpfs_is_sized_by_tmp_size_and_only_tmp_and_dev_shm_get_one() -> None:
    policy = make_policy()

    argv = bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD)

    places = {argv[i + 1]: i for i, arg in enumerate(argv) if arg == "--tmpfs"}
    assert sorted(places) == ["/dev/pts", "/dev/shm", "/proc/pressure", "/tmp"]
    for target in ("/dev/shm", "/tmp"):
        assert argv[places[target] - 2 : places[target]] == ["--size", str(policy.limits.tmp_size)]
    # The masks over host-wide pressure counters and bwrap's devpts: tiny, and read-only once mounted.
    assert argv[places["/proc/pressure"] - 2 : places["/proc/pressure"]] == ["--size", "4096"]
    assert argv[places["/dev/pts"] - 4 : places["/dev/pts"]] == ["--perms", "0555", "--size", "4096"]
    remounted = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--remount-ro"]
    assert remounted[:2] == ["/proc/pressure", "/dev/pts"]


def test_a_scratch_workspace_is_a_private_tmpfs_of_workspace_size() -> None:
    policy = dataclasses.replace(make_policy(), workspace=None)

    argv = bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD)

    at = argv.index("/workspace")
    assert argv[at - 5 : at] == ["--perms", "0700", "--size", str(policy.limits.workspace_size), "--tmpfs"]
    assert ("--symlink", "/workspace", "/data") in zip(argv, argv[1:], argv[2:], strict=False)


def test_the_options_travel_through_a_descriptor_and_the_command_line_keeps_only_the_command() -> None:
    argv = bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD)

    short, data = args_file(argv, 7)

    assert short == [BWRAP, "--args", "7", *argv[argv.index("--") :]]
    assert data.split(b"\0")[:-1] == [arg.encode() for arg in argv[1 : argv.index("--")]]


def test_dev_is_remounted_read_only_after_its_shm_tmpfs() -> None:
    argv = bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD)

    remount = [i for i, arg in enumerate(argv) if arg == "--remount-ro" and argv[i + 1] == "/dev"]
    assert len(remount) == 1
    assert remount[0] > argv.index("/dev/shm")


def test_the_seccomp_filter_is_passed_by_its_fd() -> None:
    options = options_of(bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert [args for flag, args in options if flag == "--seccomp"] == [(str(SECCOMP_FD),)]


def test_the_command_comes_after_the_separator_untouched() -> None:
    policy = make_policy()

    _, command = split(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert command == list(policy.command)


def test_a_command_that_looks_like_options_cannot_add_options() -> None:
    policy = SandboxPolicy(command=("/bin/echo", "--share-net", "--bind", "/", "/host"))

    options, command = split(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert ("--share-net", ()) not in options
    assert ("--bind", ("/", "/host")) not in options
    assert command == list(policy.command)


def test_the_root_is_remounted_read_only_after_every_bind() -> None:
    options = options_of(bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    remount = options.index(("--remount-ro", ("/",)))
    last_bind = max(i for i, (flag, _) in enumerate(options) if flag in ("--bind", "--ro-bind"))
    assert remount > last_bind


def test_exactly_the_policys_environment_is_set_in_sorted_order() -> None:
    policy = make_policy()

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert [args for flag, args in options if flag == "--setenv"] == sorted(policy.environment.items())


def test_the_environment_is_cleared_before_anything_is_set() -> None:
    options = options_of(bwrap_argv(make_policy(), bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    clearenv = options.index(("--clearenv", ()))
    assert all(i > clearenv for i, (flag, _) in enumerate(options) if flag == "--setenv")


def test_an_empty_environment_sets_no_variables() -> None:
    policy = SandboxPolicy(command=("/bin/true",))

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    assert [flag for flag, _ in options if flag == "--setenv"] == []
    assert ("--clearenv", ()) in options


def _with_host_etc(*extra: Mount) -> SandboxPolicy:
    """The snapshot's policy, its /etc entry marked as the host system's, plus a second one and ``extra``."""
    policy = make_policy()
    system = [dataclasses.replace(m, system=True) if m.target.startswith("/etc/") else m for m in policy.mounts]
    system.insert(1, Mount(Path("/etc/localtime"), "/etc/localtime", system=True))
    return dataclasses.replace(policy, mounts=(*system, *extra))


def test_a_copy_of_the_host_etc_entries_is_bound_once_in_their_place() -> None:
    policy = _with_host_etc()
    copy = Path("/srv/state/runs/1-etc-ab")

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD, etc=copy))
    without = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))

    ro_binds = [args for flag, args in options if flag == "--ro-bind"]
    assert ro_binds == [("/usr", "/usr"), (str(copy), "/etc"), ("/opt/mcp-sandbox", "/opt/mcp-sandbox")]
    # Nothing else changes: the same options, the two entries' binds replaced by the copy's.
    etc_binds = [
        ("--ro-bind", ("/etc/localtime", "/etc/localtime")),
        ("--ro-bind", ("/etc/ssl/certs", "/etc/ssl/certs")),
    ]
    assert [o for o in without if o not in etc_binds] == [o for o in options if o != ("--ro-bind", (str(copy), "/etc"))]
    assert etc_entries(policy) == (("/etc/localtime", "/etc/localtime"), ("/etc/ssl/certs", "/etc/ssl/certs"))


@pytest.mark.parametrize(
    "extra",
    [
        Mount(Path("/srv/pip.conf"), "/etc/pip.conf"),  # an operator's: not the host system's
        Mount(Path("/srv/etc"), "/etc/app", writable=True),
    ],
    ids=["read-only", "writable"],
)
def test_nothing_is_copied_when_something_else_is_mounted_under_etc(extra: Mount) -> None:
    # The copy is bound read-only: bwrap could not make a mount point in it for what follows.
    policy = _with_host_etc(extra)

    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD, etc=Path("/srv/copy")))

    assert etc_entries(policy) == ()
    assert ("--ro-bind", ("/srv/copy", "/etc")) not in options
    assert ("--ro-bind", ("/etc/localtime", "/etc/localtime")) in options


def test_nothing_is_copied_when_a_symlink_is_made_under_etc() -> None:
    policy = dataclasses.replace(_with_host_etc(), symlinks=(("/proc/self/mounts", "/etc/mtab"),))

    assert etc_entries(policy) == ()


_WRITABLE_TMPFS = (
    "/tmp",
    "/dev/shm",
    "/workspace",
)  # fresh tmpfs the sandbox writes (not /proc/pressure, remounted ro)
_MOUNTS = ("--bind", "--ro-bind", "--dev-bind", "--tmpfs", "--proc", "--dev", "--symlink")


def _destination(flag: str, args: tuple[str, ...]) -> str:
    return args[-1] if flag in ("--bind", "--ro-bind", "--dev-bind", "--symlink") else args[0]


def _real_policies() -> list[tuple[str, SandboxPolicy]]:
    """The policies the engine builds: each language, a conversation's workspace, with and without network."""
    settings = load_settings(env={}, flags={})
    workspace = Path("/srv/state/workspaces/default/c0ffee")
    policies: list[tuple[str, SandboxPolicy]] = []
    for language in ("python", "typescript", "javascript"):
        plain = policy_for(EngineSettings.of(settings), language, workspace=workspace, timeout=5)
        policies += [
            (f"{language} in a conversation", plain),
            (f"{language} with network", with_egress(plain, Path("/srv/state/egress/run1"))),
            (f"{language} session", with_egress(plain, Path("/srv/state/egress/s1"), for_life=False)),
            (f"{language} scratch", policy_for(EngineSettings.of(settings), language, workspace=None, timeout=5)),
        ]
    policies.append(("synthetic", make_policy()))
    return policies


@pytest.mark.parametrize(
    ("name", "policy"), _real_policies(), ids=lambda value: value if isinstance(value, str) else ""
)
def test_no_mount_destination_lies_under_a_path_the_sandbox_can_write(name: str, policy: SandboxPolicy) -> None:
    """The class of GHSA-pxhw-h44j-8pfx (fixed in bubblewrap 0.12.0; the bundled wheel is 0.11.0).

    A path a tenant can write (a conversation's /workspace outlives its runs) may hold a symlink
    a run left; bwrap mounting something below it would follow it on the host side. So nothing
    is mounted under a writable place: whatever the bwrap version, there is nothing to follow.
    """
    options = options_of(bwrap_argv(policy, bwrap=BWRAP, seccomp_fd=SECCOMP_FD))
    writable = {args[-1] for flag, args in options if flag == "--bind"}
    writable |= {args[0] for flag, args in options if flag == "--tmpfs" and args[0] in _WRITABLE_TMPFS}
    assert "/workspace" in writable and "/tmp" in writable, name

    for flag, args in options:
        if flag not in _MOUNTS:
            continue
        destination = Path(_destination(flag, args))
        for place in writable:
            assert not destination.is_relative_to(place) or str(destination) == place, (
                f"{name}: {flag} {' '.join(args)} mounts under {place}, which the sandbox can write"
            )
