"""The public Python API: a test that fails when it changes by accident (STYLE point 5)."""

from __future__ import annotations

import mcp_sandbox


def test_the_public_surface_is_exactly_the_documented_names() -> None:
    assert sorted(mcp_sandbox.__all__) == [
        "BackendUnavailableError",
        "ChannelError",
        "ConfigError",
        "Engine",
        "ExecutionRequest",
        "ExecutionResult",
        "FrameError",
        "SandboxError",
        "SandboxStartError",
        "Settings",
        "ValidationError",
        "__version__",
        "load_settings",
    ]
    for name in mcp_sandbox.__all__:
        assert hasattr(mcp_sandbox, name)
