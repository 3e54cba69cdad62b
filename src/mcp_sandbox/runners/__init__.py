"""In-sandbox runtimes, shipped as package data and bound read-only into each sandbox.

Each ``runners/<language>/`` directory is mounted at ``/opt/mcp-sandbox/<language>`` and
is real, linted, type-checked source; user code and metadata travel to it as channel frames.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["RUNTIME_MOUNT", "runner_dir"]

RUNTIME_MOUNT = "/opt/mcp-sandbox"


def runner_dir(language: str) -> Path:
    """The host directory holding the runtime for ``language`` (e.g. ``"python"``)."""
    return Path(__file__).resolve().parent / language
