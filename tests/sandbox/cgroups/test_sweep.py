"""A new server removes what a dead one left mid-run, and never what a live one is using."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine.startup import backend_for, engine_for
from mcp_sandbox.sandbox.cgroups import detect_cgroups, sweep_stale


def _dead_pid() -> int:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(pid_max - 1, 1, -1) if not Path(f"/proc/{pid}").exists())


def test_scratch_workspaces_of_a_dead_server_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(tmp_path / "state")})
    engine = engine_for(settings, backend_for(settings, "bwrap"))
    engine.prepare()
    runs = settings.paths.state_dir / "runs"
    left = runs / f"{_dead_pid()}-0123456789abcdef"
    (left / "deep" / "er").mkdir(parents=True)
    ours = runs / f"{os.getpid()}-fedcba9876543210"
    ours.mkdir()

    assert engine.sweep() == 1

    assert not left.exists()
    assert ours.exists()


def test_cgroups_of_a_dead_server_are_swept_and_a_live_ones_kept() -> None:
    support = detect_cgroups()
    if not support.bases:
        pytest.skip(f"no usable cgroups here: {support.reason}")
    base = next(iter(support.bases.values()))
    left = base / f"mcp-sandbox-{_dead_pid()}-0123456789ab"
    ours = base / f"mcp-sandbox-{os.getpid()}-ba9876543210"
    left.mkdir()
    ours.mkdir()
    try:
        assert sweep_stale(support) >= 1

        assert not left.exists()
        assert ours.exists()
    finally:
        for directory in (left, ours):
            if directory.exists():
                directory.rmdir()
