"""The `mcp-sandbox` command run as a real process: `run` and `doctor`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.runtimes import js_binary
from mcp_sandbox.sandbox.backends.base import BackendProbe, Capability
from mcp_sandbox.sandbox.backends.container.engine import engine_failure_advice
from mcp_test_helpers import COMMAND_BOUND, cli_environment, mcp_sandbox_cli, own_processes

pytestmark = pytest.mark.e2e


def test_run_dash_c_prints_the_output_and_exits_zero(state_dir: Path, sandbox_runtime: Path | None) -> None:
    done = mcp_sandbox_cli("run", "-c", "print(1)", state_dir=state_dir, runtime=sandbox_runtime)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"


def test_a_port_in_use_is_one_line_before_the_service_opens(state_dir: Path, sandbox_runtime: Path | None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(port))
        done = mcp_sandbox_cli(*args, state_dir=state_dir, runtime=sandbox_runtime)

    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"mcp-sandbox: cannot listen on 127.0.0.1:{port}: address already in use"
        " (another server on it? choose another with --port)"
    ]
    assert not state_dir.exists()  # said before the service (and its state directory) opened


@pytest.mark.parametrize("setting", ["MCP_SANDBOX_SANDBOX_UID", "MCP_SANDBOX_SANDBOX_GID"])
@pytest.mark.parametrize("command", [["run", "-c", "print(1)"], ["serve"]])
def test_a_sandbox_id_of_root_is_refused_at_start(
    state_dir: Path, sandbox_runtime: Path | None, setting: str, command: list[str]
) -> None:
    done = mcp_sandbox_cli(*command, state_dir=state_dir, runtime=sandbox_runtime, env={setting: "0"})

    assert done.returncode != 0 and done.stdout == ""
    name = setting.removeprefix("MCP_SANDBOX_").lower()
    assert f"{name}: must not be 0" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_run_file_runs_the_file(state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("print('from a file')\n", encoding="utf-8")

    done = mcp_sandbox_cli("run", str(script), state_dir=state_dir, runtime=sandbox_runtime)

    assert done.returncode == 0, done.stderr
    assert done.stdout == "from a file\n"


def test_run_exits_with_the_codes_exit_code(state_dir: Path, sandbox_runtime: Path | None) -> None:
    done = mcp_sandbox_cli("run", "-c", "import sys; sys.exit(5)", state_dir=state_dir, runtime=sandbox_runtime)

    assert done.returncode == 5, done.stderr


def _bun_processes() -> list[int]:
    found = []
    for pid in own_processes("bun"):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "bun":
                found.append(pid)
        except OSError:  # exited while we looked
            continue
    return found


def test_run_starts_no_sandbox_beyond_its_own(state_dir: Path, sandbox_runtime: Path | None) -> None:
    # A server pre-starts TypeScript sandboxes on the first TypeScript run; one `run` would only
    # throw them away.
    if not os.access(js_binary(load_settings(env={}, flags={}).paths, "bun"), os.X_OK):
        pytest.skip("bun is not installed: run `make runtime`")
    code = "await new Promise((done) => setTimeout(done, 3000)); console.log('waited');"
    command = [sys.executable, "-m", "mcp_sandbox", "run", "--language", "typescript", "-c", code]
    with subprocess.Popen(
        [*command, "--state-dir", str(state_dir)], env=cli_environment(sandbox_runtime),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as cli:  # fmt: skip
        seen = []
        deadline = time.monotonic() + COMMAND_BOUND
        while cli.poll() is None and time.monotonic() < deadline:
            seen.append(len(_bun_processes()))
            time.sleep(0.05)
        stdout, stderr = cli.communicate(timeout=COMMAND_BOUND)
    assert (cli.returncode, stdout) == (0, "waited\n"), stderr
    assert max(seen) == 1, seen  # the run's own bun, for seconds, and never another


def test_doctor_exits_zero_and_reports_bwrap_and_its_memory_limit(state_dir: Path, packaged_runtime: Path) -> None:
    value = "sk-" + "doctor-never-shows-it"
    secret = {"KEY": value, "MCP_SANDBOX_SECRET_API": '{ value_from = "env:KEY", hosts = ["api.example.test"] }'}
    done = mcp_sandbox_cli("doctor", state_dir=state_dir, runtime=packaged_runtime, env=secret)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "bwrap" in done.stdout
    assert "memory limit" in done.stdout
    assert "bwrap version      bubblewrap " in done.stdout, done.stdout  # GHSA-pxhw-h44j-8pfx is fixed in 0.12.0
    # The host's escape history: every sandbox program's version and the kernel's, on one line.
    versions = next(line for line in done.stdout.splitlines() if line.startswith("versions: "))
    assert all(f"{name} " in versions for name in ("bwrap", "podman", "crun", "runc", "kernel")), versions
    # `make runtime` bundled the TypeScript runner (provision/bundles.py): no slower start to report.
    assert "ok: ran TypeScript in a sandbox" in done.stdout and "SLOWER start" not in done.stdout, done.stdout
    # ... and built the sandbox's gate (provision/gate.py), which every sandbox started through.
    assert f"sandbox gate: {load_settings(env={}, flags={}).paths.gate_dir}/" in done.stdout, done.stdout
    # A secret is named with a short hash of its value, never the value.
    digest = load_settings(env=secret).egress.secrets[0].value.digest
    assert f"secret api (tenant default): Authorization to api.example.test, value {digest}" in done.stdout
    assert value not in done.stdout + done.stderr


def test_doctor_says_when_the_sandbox_gate_is_not_built(state_dir: Path, packaged_runtime: Path) -> None:
    environment = {**cli_environment(packaged_runtime), "MCP_SANDBOX_GATE_DIR": str(state_dir.parent / "gate")}

    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "doctor", "--state-dir", str(state_dir)],
        env=environment, capture_output=True, text=True, timeout=COMMAND_BOUND, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr  # sandboxes start through sh and setpriv
    assert "sandbox gate: sh and setpriv" in done.stdout, done.stdout
    assert "SLOWER start: no gate of ours to run (not built for this version" in done.stdout
    assert "`mcp-sandbox setup`" in done.stdout and "python 3." in done.stdout


def test_doctor_says_when_the_typescript_runner_is_not_bundled(state_dir: Path, packaged_runtime: Path) -> None:
    installed = load_settings(env={}, flags={}).paths.js_runtime_dir
    runtime_dir = state_dir.parent / "js"  # the runtimes without setup's bundles
    runtime_dir.mkdir()
    runtime_dir.chmod(0o755)
    (runtime_dir / "node_modules").symlink_to(installed / "node_modules")
    environment = {**cli_environment(packaged_runtime), "MCP_SANDBOX_JS_RUNTIME_DIR": str(runtime_dir)}

    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "doctor", "--state-dir", str(state_dir)],
        env=environment, capture_output=True, text=True, timeout=COMMAND_BOUND, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SLOWER start: the runner is not bundled" in done.stdout and "`mcp-sandbox setup`" in done.stdout
    assert "ok: ran TypeScript in a sandbox" in done.stdout, done.stdout  # from its sources


def _under_hard_open_files_limit(limit: int, *args: str, state_dir: Path, runtime: Path | None, **env: str) -> Any:
    """``mcp-sandbox ARGS`` started by ``prlimit`` with ``limit`` as its soft and hard limit on open files."""
    return subprocess.run(
        [
            "prlimit",
            f"--nofile={limit}:{limit}",
            sys.executable,
            "-m",
            "mcp_sandbox",
            *args,
            "--state-dir",
            str(state_dir),
        ],
        env=cli_environment(runtime, env),
        capture_output=True,
        text=True,
        timeout=COMMAND_BOUND,
        check=False,
    )


def test_a_hard_open_files_limit_below_the_setting_is_named_at_start(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    # Issue 34, finding 6: with `ulimit -Hn 200` the run failed with "bwrap could not be started:
    # Operation not permitted", naming neither the limit nor the setting.
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    done = _under_hard_open_files_limit(200, "run", "-c", code, state_dir=state_dir, runtime=sandbox_runtime)
    if done.returncode == 0:  # a server with CAP_SYS_RESOURCE raises the sandbox's hard limit itself
        assert done.stdout == "256\n"
    else:
        assert done.returncode == 2, done.stderr
        assert "open_files: 256" in done.stderr and "hard limit of 200" in done.stderr, done.stderr
        assert "set open_files to at most 200" in done.stderr
    lowered = _under_hard_open_files_limit(
        200, "run", "-c", code, state_dir=state_dir, runtime=sandbox_runtime, MCP_SANDBOX_OPEN_FILES="150"
    )
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout == "150\n"


def test_the_weaker_isolation_warning_says_each_reason_once() -> None:
    # bwrap's three cgroup limits, as its probe reports them on a host without a user manager.
    reason = "no systemd user manager for alice (user@1000.service): cannot delegate controllers"
    probe = BackendProbe(
        "bwrap",
        available=True,
        capabilities=(
            Capability("network", True, "empty network namespace"),
            Capability("memory limit", False, f"RLIMIT_AS only: {reason}"),
            Capability("pids limit", False, f"RLIMIT_NPROC per host uid: {reason}"),
            Capability("cpu quota", False, f"CPU-seconds rlimit only: {reason}"),
            Capability("tmp size", False, "no tmpfs"),
        ),
    )
    summary = probe.missing_summary()
    assert summary.count(reason) == 1 and summary.count("no tmpfs") == 1
    assert summary.startswith("memory limit (RLIMIT_AS only), pids limit (RLIMIT_NPROC per host uid), cpu quota")


def test_podman_without_newuidmap_is_told_to_install_uidmap() -> None:
    # What podman 4 prints for `podman info` as a user with subordinate ids and no uidmap package.
    said = 'command required for rootless mode with multiple IDs: exec: "newuidmap": executable file not found in $PATH'
    advice = engine_failure_advice(said)
    assert (
        advice.startswith("newuidmap is missing (as root: apt install uidmap)")
        and "is the engine running" not in advice
    )
    assert engine_failure_advice("Cannot connect to the Docker daemon").startswith("is the engine running?")
