"""The TypeScript/JavaScript sandbox policy: same sandbox as Python's, its own command, memory by heap flag."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from mcp_sandbox.config import EngineSettings, load_settings
from mcp_sandbox.engine.runtimes import BASE_ENVIRONMENT, js_policy, policy_for, python_policy
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.sandbox.backends.bwrap import BwrapBackend
from mcp_sandbox.sandbox.cgroups import CgroupSupport
from settings_helpers import bwrap_pieces

_WORKSPACE = Path("/srv/ws")


@pytest.mark.parametrize("runtime", ["bun", "deno"])
def test_a_js_policy_is_the_python_sandbox_with_its_own_command(runtime: str, tmp_path: Path) -> None:
    # A runtime directory without setup's bundle of the runner: the runner's sources run (see
    # tests/engine/test_js_runs.py for the bundle).
    settings = load_settings(env={}, flags={"js_runtime": runtime, "memory": "400m", "js_runtime_dir": str(tmp_path)})
    js = js_policy(EngineSettings.of(settings), language="typescript", workspace=_WORKSPACE, timeout=5)
    python = python_policy(EngineSettings.of(settings), workspace=_WORKSPACE, timeout=5)

    assert js.command[0] == f"/opt/mcp-sandbox/{runtime}/{runtime}"
    assert js.environment["PATH"] == f"/opt/mcp-sandbox/{runtime}:{BASE_ENVIRONMENT['PATH']}"
    assert js.command[-2:] == (f"/opt/mcp-sandbox/typescript/{runtime}.ts", "typescript")
    assert (js.network, js.uid, js.gid, js.workspace, js.cwd) == (False, 65534, 65534, _WORKSPACE, "/workspace")
    assert js.limits.address_space is False and python.limits.address_space is True
    for name in ("memory", "pids", "cpus", "cpu_seconds", "tmp_size", "file_size", "open_files"):
        assert getattr(js.limits, name) == getattr(python.limits, name), name
    targets = {mount.target: mount for mount in js.mounts}
    assert not any(mount.writable for mount in js.mounts)
    assert "/opt/mcp-sandbox/typescript" in targets and f"/opt/mcp-sandbox/{runtime}" in targets
    # The runtime's packages, read-only, where a bare import from the code's file finds them.
    assert targets["/node_modules"].source == settings.paths.js_runtime_dir / "node_modules"
    heap = str(int((400 << 20) * 0.75) >> 20)
    if runtime == "deno":
        assert f"--v8-flags=--max-old-space-size={heap}" in js.command
        assert not any(flag.startswith("--allow-net") or flag == "-A" for flag in js.command)
    else:
        assert js.environment["BUN_JSC_forceRAMSize"] == str(int(heap) << 20)
        assert "--no-env-file" in js.command


def test_policy_for_picks_the_runtime_by_language() -> None:
    settings = load_settings(env={}, flags={})
    assert (
        policy_for(EngineSettings.of(settings), "javascript", workspace=_WORKSPACE, timeout=5).command[-1]
        == "javascript"
    )
    assert (
        policy_for(EngineSettings.of(settings), "python", workspace=_WORKSPACE, timeout=5)
        .command[-1]
        .endswith("boot.py")
    )
    with pytest.raises(ValueError):
        js_policy(EngineSettings.of(settings), language="python", workspace=_WORKSPACE, timeout=5)


def test_js_runtime_is_a_setting_with_an_environment_variable() -> None:
    assert load_settings(env={"MCP_SANDBOX_JS_RUNTIME": "deno"}, flags={}).sandbox.js_runtime == "deno"
    with pytest.raises(ConfigError):
        load_settings(env={}, flags={"js_runtime": "node"})


def test_rlimit_as_never_stands_in_for_memory_under_a_js_runtime() -> None:
    settings = load_settings(env={}, flags={})
    backend = BwrapBackend(*bwrap_pieces(settings))
    backend._cgroups = CgroupSupport(version=None, reason="none here")  # no memory cgroup on this "host"
    js = js_policy(EngineSettings.of(settings), language="typescript", workspace=_WORKSPACE, timeout=5)
    python = python_policy(EngineSettings.of(settings), workspace=_WORKSPACE, timeout=5)

    js_limits = dict(backend.launch_spec(js, None).rlimits)
    python_limits = dict(backend.launch_spec(python, None).rlimits)

    assert resource.RLIMIT_AS not in js_limits
    assert python_limits[resource.RLIMIT_AS] == settings.limits.memory
    assert js_limits[resource.RLIMIT_CPU] == python_limits[resource.RLIMIT_CPU]


@pytest.mark.parametrize(("cpus", "timeout"), [(1.0, 2.0), (1.0, 30.0), (2.0, 5.0), (0.5, 1.5)])
def test_the_cpu_rlimit_leaves_the_wall_clock_timeout_to_end_a_spin(cpus: float, timeout: float) -> None:
    """A spin's SIGXCPU (at the soft limit, one second below the hard one) must not race the timeout's kill."""
    settings = load_settings(env={}, flags={"cpus": cpus})
    hard = python_policy(EngineSettings.of(settings), workspace=_WORKSPACE, timeout=timeout).limits.cpu_seconds
    assert hard - 1 >= timeout * max(1.0, cpus) + 1
