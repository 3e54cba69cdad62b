"""In-sandbox runtimes, shipped as package data and bound read-only into each sandbox.

Each ``runners/<language>/`` directory is mounted at ``/opt/mcp-sandbox/<language>`` and
is real, linted, type-checked source; user code and metadata travel to it as channel frames.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["JS_LANGUAGES", "LANGUAGES", "RUNTIME_MOUNT", "runner_dir"]

RUNTIME_MOUNT = "/opt/mcp-sandbox"

# The languages code can be submitted in: the one list the tools, the CLI and the engine share.
LANGUAGES = ("python", "typescript", "javascript")
# Those the JavaScript runtime runs (it transpiles TypeScript itself); Python has its own runtime.
JS_LANGUAGES = ("typescript", "javascript")


def runner_dir(language: str) -> Path:
    """The host directory holding the runtime for ``language`` (e.g. ``"python"``)."""
    return Path(__file__).resolve().parent / language
