"""Where the runtimes are looked for, ``runtime_packages``, and what serve and doctor say when one is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.startup import open_engine
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.provision import FIX_COMMAND, js_status, python_status
from mcp_sandbox.provision.status import STAMP, python_digest, write_stamp


def test_a_configured_data_dir_holds_both_runtimes_even_in_a_checkout(tmp_path: Path) -> None:
    settings = load_settings(env={"MCP_SANDBOX_DATA_DIR": str(tmp_path)})
    assert settings.paths.python_runtime == tmp_path / "python"
    assert settings.paths.js_runtime_dir == tmp_path / "js"


@pytest.mark.skipif(os.geteuid() == 0, reason="root's data dir is a system directory (tested below)")
def test_the_data_dir_follows_xdg_for_a_user(tmp_path: Path) -> None:
    assert load_settings(env={"XDG_DATA_HOME": str(tmp_path)}).paths.data_dir == tmp_path / "mcp-sandbox"


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only")
def test_roots_data_dir_is_reachable_by_the_sandbox_uid_not_under_root_home(tmp_path: Path) -> None:
    assert load_settings(env={"XDG_DATA_HOME": str(tmp_path)}).paths.data_dir == Path("/usr/local/lib/mcp-sandbox")


def test_runtime_packages_are_requirements_from_env_or_toml(tmp_path: Path) -> None:
    settings = load_settings(env={"MCP_SANDBOX_RUNTIME_PACKAGES": "scipy==1.14.1, tabulate"})
    assert settings.sandbox.runtime_packages == ("scipy==1.14.1", "tabulate")
    config = tmp_path / "c.toml"
    config.write_text('runtime_packages = ["numpy>=2,<3", "rich[jupyter]"]\n')
    assert load_settings(env={}, config_file=config).sandbox.runtime_packages == ("numpy>=2,<3", "rich[jupyter]")


@pytest.mark.parametrize("bad", ["--index-url=http://127.0.0.1/", "-e .", "not a requirement!", "numpy=="])
def test_a_runtime_package_that_is_not_a_requirement_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match="runtime_packages"):
        load_settings(env={}, flags={"runtime_packages": [bad]})


def test_a_missing_runtime_stops_serve_naming_the_command_that_fixes_it(tmp_path: Path) -> None:
    settings = load_settings(env={"MCP_SANDBOX_DATA_DIR": str(tmp_path), "MCP_SANDBOX_STATE_DIR": str(tmp_path)})
    assert python_status(settings.paths, settings.sandbox).missing and js_status(settings.paths).missing
    with pytest.raises(ConfigError, match=f"run `{FIX_COMMAND}`"):
        open_engine(settings)


def test_a_stamp_from_other_pins_or_packages_is_out_of_date(tmp_path: Path) -> None:
    runtime = tmp_path / "python"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "bin" / "python3").symlink_to("/usr/bin/python3")
    settings = load_settings(env={"MCP_SANDBOX_DATA_DIR": str(tmp_path)})
    write_stamp(runtime, {"digest": python_digest(settings.sandbox)})
    assert python_status(settings.paths, settings.sandbox).problem is None
    with_packages = load_settings(
        env={"MCP_SANDBOX_DATA_DIR": str(tmp_path), "MCP_SANDBOX_RUNTIME_PACKAGES": "tabulate"}
    )
    status = python_status(with_packages.paths, with_packages.sandbox)
    assert status.problem is not None and not status.missing and FIX_COMMAND in status.advice()
    (runtime / STAMP).unlink()  # a runtime `make` built: current, unless runtime_packages ask for more
    assert python_status(settings.paths, settings.sandbox).problem is None
    assert python_status(with_packages.paths, with_packages.sandbox).problem is not None


def test_a_runtime_under_usr_local_is_ours_but_usr_itself_is_the_systems() -> None:
    # Root's data dir is /usr/local/lib/mcp-sandbox: a missing runtime there is missing, not "system".
    ours = load_settings(env={"MCP_SANDBOX_DATA_DIR": "/usr/local/lib/mcp-sandbox-test-absent"})
    assert python_status(ours.paths, ours.sandbox).missing
    system = load_settings(env={"MCP_SANDBOX_PYTHON_RUNTIME": "/usr"})
    assert python_status(system.paths, system.sandbox).problem is None


def test_serve_without_a_runtime_ends_at_once_though_the_client_keeps_stdin_open(tmp_path: Path) -> None:
    """serve answers initialize before its service opens; when that fails it must not linger."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
    env.update({"MCP_SANDBOX_DATA_DIR": str(tmp_path / "absent"), "MCP_SANDBOX_STATE_DIR": str(tmp_path / "s")})
    server = subprocess.Popen(
        [sys.executable, "-m", "mcp_sandbox", "serve"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stderr is not None
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    try:
        server.stdin.write(json.dumps(initialize).encode() + b"\n")
        server.stdin.flush()
        status = server.wait(timeout=60)  # stdin is still open
    finally:
        if server.poll() is None:
            server.kill()
        _, err = server.communicate(timeout=30)  # closes every pipe
    assert status == 2
    assert f"run `{FIX_COMMAND}`" in err.decode()
