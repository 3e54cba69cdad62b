"""Defaults that depend on the host (state and data directories, the sandbox's ids, the runtimes
``make`` builds), and the values a few settings choose among.

Computed when a :class:`~mcp_sandbox.config.settings.Settings` is made, never at import.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, get_args

__all__ = [
    "JS_RUNTIMES",
    "OUTPUT_MODES",
    "SANDBOX_USER",
    "TOOL_RESULTS",
    "OutputMode",
    "ToolResults",
    "default_data_dir",
    "default_gate_dir",
    "default_js_runtime_dir",
    "default_python_runtime",
    "default_sandbox_ids",
    "default_state_dir",
]

OutputMode = Literal["compact", "json", "toon", "runner"]
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)
ToolResults = Literal["value", "raw"]
TOOL_RESULTS: tuple[str, ...] = get_args(ToolResults)


def default_state_dir(env: Mapping[str, str]) -> Path:
    """Where state lives unless configured: a system directory for root, XDG state otherwise."""
    # Root's home is 0700, and the sandbox (run as an unprivileged uid) must reach workspaces.
    if os.geteuid() == 0:
        return Path("/var/lib/mcp-sandbox")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mcp-sandbox"


SANDBOX_USER = "mcp-sandbox"
_NOBODY = 65534


def default_sandbox_ids() -> tuple[int, int]:
    """The dedicated ``mcp-sandbox`` system user's uid/gid (``make`` creates it), else nobody's."""
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        return _NOBODY, _NOBODY
    return entry.pw_uid, entry.pw_gid


# --- where the sandbox's runtimes live (issue 15: `mcp-sandbox setup`) -----------------------


def default_data_dir(env: Mapping[str, str]) -> Path:
    """Where ``mcp-sandbox setup`` builds the sandbox's runtimes unless configured.

    Root: a system directory, since the sandbox's uid must read the runtime and root's home is
    0700. Anyone else: ``$XDG_DATA_HOME/mcp-sandbox``, else ``~/.local/share/mcp-sandbox``.
    """
    if os.geteuid() == 0:
        return Path("/usr/local/lib/mcp-sandbox")
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-sandbox"


def _checkout_runtime() -> Path:
    # `make` builds the sandbox's runtimes in the checkout, next to the server's venv.
    return Path(sys.prefix).resolve().parent / ".runtime"


def default_python_runtime(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/python`` when ``make`` built one (and ``checkout``), else ``data_dir/python``."""
    built = _checkout_runtime() / "python"
    return built if checkout and (built / "bin" / "python3").exists() else data_dir / "python"


def default_js_runtime_dir(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/js`` when ``make`` built one (and ``checkout``), else ``data_dir/js``."""
    built = _checkout_runtime() / "js"
    return built if checkout and (built / "node_modules").is_dir() else data_dir / "js"


def default_gate_dir(data_dir: Path, *, checkout: bool = True) -> Path:
    """The checkout's ``.runtime/gate`` when ``make`` built the gate (and ``checkout``), else ``data_dir/gate``."""
    built = _checkout_runtime() / "gate"
    return built if checkout and built.is_dir() else data_dir / "gate"


JS_RUNTIMES = ("bun", "deno")
