"""Filesystem attacks: a read-only root, two writable places, nothing of the host's secrets.

Host-side checks follow each run where the attack aims at the host: symlinks and hard links
planted in the workspace, the files' owner on the host, the server's own state directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from .harness import RunnerFactory, SandboxRunner, left_in_runs

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

MiB = 1 << 20
READ_ONLY_DIRS = ["/", "/usr", "/usr/lib", "/bin", "/etc", "/opt", "/opt/mcp-sandbox", "/opt/mcp-sandbox/python"]
# An interpreter any uid may run (the test's own may live under /root).
_SYSTEM_PYTHON = "/usr/bin/python3"
NOT_PRESENT = ["/root", "/home", "/etc/shadow", "/etc/passwd", "/var", "/run", "/sys", "/boot"]
CONTAINER_BACKENDS = ("podman", "docker")
IMAGE_ROOT = ["/etc/passwd", "/var", "/run", "/sys"]


async def test_system_directories_are_read_only(sandbox: SandboxRunner) -> None:
    report = await sandbox.report(f"""
        for directory in {READ_ONLY_DIRS!r}:
            report[directory] = outcome(lambda: open(os.path.join(directory, "planted"), "x").close())
    """)
    assert report == dict.fromkeys(READ_ONLY_DIRS, "OSError:EROFS")


async def test_mkdir_at_the_root_fails_with_erofs(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        report["mkdir"] = outcome(lambda: os.mkdir("/foo"))
    """)
    assert report["mkdir"] == "OSError:EROFS"


async def test_in_sandbox_runtime_cannot_be_modified_for_later_runs(sandbox: SandboxRunner) -> None:
    # The runner's source is bound from the host: a writable bind would backdoor every later run.
    report = await sandbox.report("""
        boot = "/opt/mcp-sandbox/python/boot.py"
        report["append"] = outcome(lambda: open(boot, "a").close())
        report["chmod"] = outcome(lambda: os.chmod(boot, 0o777))
        report["unlink"] = outcome(lambda: os.unlink(boot))
        report["rename"] = outcome(lambda: os.rename(boot, "/opt/mcp-sandbox/python/moved.py"))
    """)
    denied = {"OSError:EROFS", "PermissionError:EACCES", "PermissionError:EPERM"}
    assert set(report) == {"append", "chmod", "unlink", "rename"}
    assert set(report.values()) <= denied, report


async def test_proc_sys_and_sysrq_are_not_writable(sandbox: SandboxRunner) -> None:
    # Opened for writing only; nothing is ever written, so a broken sandbox cannot hurt the host.
    targets = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/drop_caches",
        "/proc/sysrq-trigger",
    ]
    report = await sandbox.report(f"""
        for target in {targets!r}:
            report[target] = outcome(lambda: os.close(os.open(target, os.O_WRONLY)))
    """)
    denied = {"PermissionError:EACCES", "OSError:EROFS", "PermissionError:EPERM", "FileNotFoundError:ENOENT"}
    assert set(report) == set(targets)
    assert set(report.values()) <= denied, report


async def test_workspace_and_tmp_are_writable(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        for directory in ("/workspace", "/tmp"):
            path = os.path.join(directory, "note.txt")
            with open(path, "w") as note:
                note.write("written")
            with open(path) as note:
                report[directory] = note.read()
        report["cwd"] = os.getcwd()
    """)
    assert report == {"/workspace": "written", "/tmp": "written", "cwd": "/workspace"}


async def test_data_is_the_same_directory_as_workspace(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        with open("/data/through-data.txt", "w") as note:
            note.write("same")
        report["samefile"] = os.path.samefile("/data", "/workspace")
        report["listing"] = os.listdir("/workspace")
    """)
    assert report == {"samefile": True, "listing": ["through-data.txt"]}


async def test_tmp_cannot_hold_more_than_tmp_size(make_sandbox: RunnerFactory) -> None:
    sandbox = make_sandbox(tmp_size="8m", max_file_size="64m")
    report = await sandbox.report(f"""
        written = 0
        def fill():
            global written
            with open("/tmp/fill", "wb") as out:
                while written < {32 * MiB}:
                    out.write(b"\\0" * {MiB})
                    out.flush()
                    written += {MiB}
        report["fill"] = outcome(fill)
        report["written"] = written
    """)
    assert report["fill"] == "OSError:ENOSPC"
    assert report["written"] <= 8 * MiB


async def test_dev_shm_cannot_hold_more_than_tmp_size(make_sandbox: RunnerFactory) -> None:
    # Several files, each under the file-size rlimit, so only a size limit on the mount can stop them.
    sandbox = make_sandbox(tmp_size="8m", max_file_size="4m")
    report = await sandbox.report(f"""
        written = 0
        def fill():
            global written
            for index in range(8):
                with open(f"/dev/shm/fill{{index}}", "wb") as out:
                    for _ in range(4):
                        out.write(b"\\0" * {MiB})
                        out.flush()
                        written += {MiB}
        report["fill"] = outcome(fill)
        report["written"] = written
    """)
    assert report["written"] <= 8 * MiB
    assert report["fill"] in {"OSError:ENOSPC", "OSError:EROFS", "PermissionError:EACCES", "FileNotFoundError:ENOENT"}


async def test_dev_is_not_writable(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        report["create"] = outcome(lambda: open("/dev/planted", "x").close())
        report["mkdir"] = outcome(lambda: os.mkdir("/dev/planted-dir"))
    """)
    denied = {"OSError:EROFS", "PermissionError:EACCES", "PermissionError:EPERM"}
    assert set(report.values()) <= denied, report


async def test_file_size_is_limited_by_rlimit_fsize(make_sandbox: RunnerFactory, state_root: Path) -> None:
    # The write past RLIMIT_FSIZE is refused and SIGXFSZ ends the run (the runtime does not
    # ignore it, as Python otherwise would): the code cannot catch EFBIG and go on writing.
    sandbox = make_sandbox(max_file_size="4m")
    workspace = state_root / "ws"
    workspace.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(workspace, sandbox.settings.sandbox.sandbox_uid, sandbox.settings.sandbox.sandbox_gid)
    result = await sandbox.run_reporting(
        f"""
        written = 0
        def grow():
            global written
            with open("/workspace/big", "wb") as out:
                while written < {16 * MiB}:
                    out.write(b"\\0" * {MiB})
                    out.flush()
                    written += {MiB}
        report["grow"] = outcome(grow)
        """,
        workspace=workspace,
    )
    assert result.status == "error" and "file_size" in result.limits
    assert result.error is not None and "SIGXFSZ" in result.error and "max_file_size" in result.error
    assert (workspace / "big").stat().st_size == 4 * MiB


async def test_host_secrets_are_not_visible(sandbox: SandboxRunner, backend_name: str) -> None:
    state_dir = str(sandbox.settings.paths.state_dir)
    # A container's root is its image's: it has an /etc/passwd, /var and /run of its own, and
    # the engine's read-only sysfs. There, what must hold is that none of them is the host's.
    own_root = IMAGE_ROOT if backend_name in CONTAINER_BACKENDS else []
    absent = [p for p in [*NOT_PRESENT, state_dir] if p not in own_root]
    report = await sandbox.report(f"""
        report["present"] = [p for p in {absent!r} if os.path.lexists(p)]
        report["shadow"] = outcome(lambda: open("/etc/shadow").read())
        report["root"] = outcome(lambda: os.listdir("/root"))
        report["hosts_passwd"] = os.path.exists("/etc/passwd") and open("/etc/passwd").read() == {_host_passwd()!r}
        report["hosts_var"] = [d for d in {_host_listing("/var")!r} if os.path.lexists(os.path.join("/var", d))]
        report["hosts_run"] = [d for d in {_host_listing("/run")!r} if os.path.lexists(os.path.join("/run", d))]
    """)
    assert report == {
        "present": [],
        "shadow": "FileNotFoundError:ENOENT",
        "root": "FileNotFoundError:ENOENT",
        "hosts_passwd": False,
        "hosts_var": [],
        "hosts_run": [],
    }


def _host_passwd() -> str:
    with open("/etc/passwd", encoding="utf-8") as passwd:
        return passwd.read()


def _host_listing(directory: str) -> list[str]:
    # tmp is everybody's (and a sandbox's /var/tmp may legitimately exist): not a host secret.
    return sorted(set(os.listdir(directory)) - {"tmp", ".containerenv"})


async def test_server_environment_does_not_leak(sandbox: SandboxRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"s3cret-{os.urandom(8).hex()}"
    monkeypatch.setenv("MCP_SANDBOX_TEST_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    result = await sandbox.run("""
        import glob
        print(repr(dict(os.environ)))
        for path in ["/proc/self/environ", *sorted(glob.glob("/proc/[0-9]*/environ"))]:
            try:
                print(path, open(path, "rb").read())
            except OSError as exc:
                print(path, type(exc).__name__)
    """)
    assert result.status == "success", result.stderr
    assert "/proc/1/environ" in result.stdout
    assert "PATH=" in result.stdout  # the environment was read (and it is the policy's)
    assert secret not in result.stdout
    assert "MCP_SANDBOX_TEST_SECRET" not in result.stdout


async def test_pid_1_inside_is_not_the_host_init(sandbox: SandboxRunner) -> None:
    host_init = await anyio.Path("/proc/1/cmdline").read_bytes()
    report = await sandbox.report("""
        report["cmdline"] = open("/proc/1/cmdline", "rb").read().hex()
        report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    """)
    assert bytes.fromhex(report["cmdline"]) != host_init
    assert os.getpid() not in report["pids"]
    assert len(report["pids"]) <= 4, report["pids"]  # the sandbox's own few processes only


async def test_symlinks_to_host_paths_lead_nowhere(sandbox: SandboxRunner, state_root: Path) -> None:
    outside = state_root / "outside.txt"
    outside.write_text("host file")
    outside.chmod(0o644)
    targets = {"shadow": "/etc/shadow", "bashrc": "/root/.bashrc", "outside": str(outside)}
    report = await sandbox.report(f"""
        for name, target in {targets!r}.items():
            os.symlink(target, f"/workspace/{{name}}")
            report[name] = outcome(lambda: open(f"/workspace/{{name}}").read())
    """)
    assert report == dict.fromkeys(targets, "FileNotFoundError:ENOENT")


async def test_cleanup_does_not_follow_symlinks_planted_in_the_workspace(
    sandbox: SandboxRunner, state_root: Path
) -> None:
    # After each run the engine deletes its scratch workspace as root: planted links must not
    # make it delete (or chmod) what they point at on the host.
    outside = state_root / "outside"
    (outside / "keep").mkdir(parents=True)
    precious = outside / "precious.txt"
    precious.write_text("keep me")
    before = sorted(p.name for p in outside.rglob("*"))
    result = await sandbox.run(f"""
        os.symlink({str(precious)!r}, "/workspace/file-link")
        os.symlink({str(outside)!r}, "/workspace/dir-link")
        os.mkdir("/workspace/locked")
        os.symlink({str(outside / "keep")!r}, "/workspace/locked/nested-link")
        os.chmod("/workspace/locked", 0)
        os.chmod("/workspace", 0)
    """)
    assert result.status == "success", result.stderr
    assert precious.read_text() == "keep me"
    assert sorted(p.name for p in outside.rglob("*")) == before
    assert left_in_runs(sandbox.settings) == []  # the scratch workspace is gone (or was a tmpfs, never on the host)


async def test_deep_directory_tree_does_not_break_cleanup(sandbox: SandboxRunner) -> None:
    result = await sandbox.run("""
        os.chdir("/workspace")
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
    """)
    assert result.status == "success", result.stderr
    assert left_in_runs(sandbox.settings) == []


async def test_hard_links_to_files_outside_the_workspace_fail(sandbox: SandboxRunner) -> None:
    sources = ["/usr/bin/env", "/etc/ld.so.cache", "/opt/mcp-sandbox/python/boot.py", "/proc/self/status"]
    report = await sandbox.report(f"""
        for index, source in enumerate({sources!r}):
            report[source] = outcome(lambda: os.link(source, f"/workspace/hard{{index}}"))
    """)
    assert set(report) == set(sources)
    assert set(report.values()) <= {"OSError:EXDEV", "PermissionError:EPERM"}, report


async def test_files_written_in_the_workspace_belong_to_the_sandbox_uid_on_the_host(
    sandbox: SandboxRunner, workspace: Path
) -> None:
    result = await sandbox.run(
        """
        open("/workspace/made-inside.txt", "w").close()
        os.mkdir("/workspace/made-inside")
    """,
        workspace=workspace,
    )
    assert result.status == "success", result.stderr
    expected = sandbox.settings.sandbox.sandbox_uid if os.geteuid() == 0 else os.geteuid()
    assert (workspace / "made-inside.txt").stat().st_uid == expected
    assert (workspace / "made-inside").stat().st_uid == expected


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the sandbox runs as the server's own uid otherwise")
@pytest.mark.skipif(not os.path.exists(_SYSTEM_PYTHON), reason=f"no {_SYSTEM_PYTHON} to run as the sandbox uid")
async def test_server_state_is_invisible_and_unreadable_to_the_sandbox_uid(sandbox: SandboxRunner) -> None:
    sandbox.engine.prepare()
    secret = sandbox.settings.paths.state_dir / "server-secret"
    secret.write_text("token")
    secret.chmod(0o600)
    report = await sandbox.report(f"""
        report["visible"] = os.path.lexists({str(secret)!r})
    """)
    assert report == {"visible": False}
    # On the host, the sandbox's uid cannot open it either (had it escaped its mount namespace).
    opened = await anyio.run_process(
        [
            _SYSTEM_PYTHON,
            "-c",
            "import sys\ntry:\n open(sys.argv[1])\nexcept OSError as e:\n print(type(e).__name__)",
            str(secret),
        ],
        user=sandbox.settings.sandbox.sandbox_uid,
        group=sandbox.settings.sandbox.sandbox_gid,
        extra_groups=[],
        check=False,
    )
    assert opened.stdout.decode().strip() == "PermissionError"


async def test_state_does_not_leak_between_runs(sandbox: SandboxRunner) -> None:
    first = await sandbox.run("""
        for path in ("/tmp/left-behind", "/workspace/left-behind"):
            open(path, "w").close()
    """)
    assert first.status == "success", first.stderr
    report = await sandbox.report("""
        report["seen"] = [p for p in ("/tmp/left-behind", "/workspace/left-behind") if os.path.exists(p)]
    """)
    assert report == {"seen": []}


# The only places a run may write (issue 21, finding 13): everything else is read-only or closed.
WRITABLE = ("/workspace", "/data", "/tmp", "/dev/shm")


async def test_no_mount_point_outside_the_writable_places_takes_a_new_file(sandbox: SandboxRunner) -> None:
    # Every mount point the run sees, on every backend: a file is created in it, or a mounted
    # file opened for writing (nothing is written); character devices store nothing.
    report = await sandbox.report("""
        import re, stat, uuid
        points = set()
        with open("/proc/self/mountinfo") as table:
            for row in table:
                points.add(re.sub(r"\\\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), row.split()[4]))
        probe = f".mcp-probe-{uuid.uuid4().hex}"
        for point in sorted(points):
            if os.path.isdir(point) and not os.path.islink(point):
                target = os.path.join(point, probe)
                def create():
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                    os.unlink(target)
                report[point] = outcome(create)
            elif stat.S_ISCHR(os.stat(point).st_mode):
                report[point] = "device"  # /dev/null and friends (also bound over masked /proc files)
            else:
                report[point] = outcome(lambda: os.close(os.open(point, os.O_WRONLY)))
    """)
    writable = {point for point, result in report.items() if result == "ok"}
    allowed = {point for point in writable if point in WRITABLE or point.startswith(tuple(p + "/" for p in WRITABLE))}
    assert "/proc" in report and "/" in report  # the walk saw the table
    assert writable - allowed == set(), report
