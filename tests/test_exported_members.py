"""The public Python API: tests that fail when it changes by accident.

In the manner of httpx's ``tests/test_exported_members.py``: ``__all__`` names exactly the public
names the package defines, and the list itself is pinned here, so adding or dropping one is a
deliberate edit of this file.
"""

from __future__ import annotations
import __future__

from types import ModuleType

import mcp_sandbox
import mcp_sandbox.errors

# The exceptions a caller of the engine or the server meets, besides the base class.
CALLER_FACING_ERRORS = {"BusyError", "WorkspaceError", "QuotaExceededError", "DownstreamError", "ToolCallDenied"}


def _defined_public_names() -> set[str]:
    """Public names bound in ``mcp_sandbox/__init__.py``: not submodules (bound as a side effect of
    importing them) and not the ``from __future__ import annotations`` feature."""
    return {
        name
        for name, value in vars(mcp_sandbox).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and value is not __future__.annotations
    }


def test_the_public_surface_is_exactly_the_documented_names() -> None:
    assert sorted(mcp_sandbox.__all__) == [
        "BackendUnavailableError",
        "BusyError",
        "ChannelError",
        "ConfigError",
        "DiskFullError",
        "DownstreamError",
        "Engine",
        "ExecutionRequest",
        "ExecutionResult",
        "FrameError",
        "LeaseLostError",
        "QuotaExceededError",
        "SandboxError",
        "SandboxStartError",
        "Settings",
        "ToolCallDenied",
        "UnavailableError",
        "ValidationError",
        "WorkspaceError",
        "__version__",
        "load_settings",
    ]


def test_every_name_in_all_exists() -> None:
    missing = [name for name in mcp_sandbox.__all__ if not hasattr(mcp_sandbox, name)]

    assert missing == []


def test_every_public_name_the_package_defines_is_in_all() -> None:
    assert _defined_public_names() <= set(mcp_sandbox.__all__)


def test_all_has_no_duplicates_and_is_sorted() -> None:
    assert mcp_sandbox.__all__ == sorted(set(mcp_sandbox.__all__))


def test_the_exceptions_callers_meet_are_exported_and_are_sandbox_errors() -> None:
    assert set(mcp_sandbox.__all__) >= CALLER_FACING_ERRORS
    for name in CALLER_FACING_ERRORS:
        assert issubclass(getattr(mcp_sandbox, name), mcp_sandbox.SandboxError)


def test_the_whole_exception_tree_is_exported() -> None:
    assert set(mcp_sandbox.errors.__all__) <= set(mcp_sandbox.__all__)
    for name in mcp_sandbox.errors.__all__:
        assert getattr(mcp_sandbox, name) is getattr(mcp_sandbox.errors, name)
