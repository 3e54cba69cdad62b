"""Is each sandbox runtime built and current? And the one command that fixes it when not.

``mcp-sandbox setup`` leaves a stamp (``STAMP``) in each runtime it builds, naming what it was
built from: the pins' digest and, for Python, ``runtime_packages``. A runtime ``make`` built in a
checkout has no stamp; it is current by ``make``'s own rules, unless ``runtime_packages`` asks for
more than ``make`` installs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config import PathSettings, SandboxSettings
from mcp_sandbox.provision.pins import JS_FILES, PYTHON_REQUIREMENTS, digest

__all__ = [
    "FIX_COMMAND",
    "STAMP",
    "SYSTEM_PYTHON",
    "RuntimeStatus",
    "is_system_prefix",
    "js_status",
    "python_status",
    "read_stamp",
    "write_stamp",
]

FIX_COMMAND = "mcp-sandbox setup"
# The interpreter the sandbox's Python runtime is a venv of (see .python for why a system one).
SYSTEM_PYTHON = Path("/usr/bin/python3")
STAMP = ".mcp-sandbox-setup.json"


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """``problem`` is None when the runtime is usable as configured; ``missing``: not there at all."""

    name: str
    path: Path
    problem: str | None = None
    missing: bool = False

    def advice(self) -> str:
        """One line: what is wrong and the command that fixes it."""
        return f"{self.name} runtime at {self.path}: {self.problem}; run `{FIX_COMMAND}` to build it"


def read_stamp(runtime: Path) -> dict[str, object] | None:
    try:
        data = json.loads((runtime / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_stamp(runtime: Path, values: dict[str, object]) -> None:
    (runtime / STAMP).write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    os.chmod(runtime / STAMP, 0o644)


def is_system_prefix(runtime: Path) -> bool:
    """``python_runtime`` names the system's own interpreter (``/usr``), not a runtime of ours."""
    return runtime.resolve() in (Path("/usr"), Path("/usr/local"))


def python_digest(sandbox: SandboxSettings) -> str:
    return digest(PYTHON_REQUIREMENTS, extra=sandbox.runtime_packages)


def js_digest() -> str:
    return digest(*JS_FILES)


def python_status(paths: PathSettings, sandbox: SandboxSettings) -> RuntimeStatus:
    """Whether the sandbox's Python runtime is there and built from the current pins and packages."""
    runtime = paths.python_runtime
    if is_system_prefix(runtime):
        # The system's interpreter, configured on purpose (a container image has its packages).
        problem = (
            "runtime_packages are installed by setup into a runtime of its own" if sandbox.runtime_packages else None
        )
        return RuntimeStatus("python", runtime, problem)
    if not paths.python_interpreter.exists():
        return RuntimeStatus("python", runtime, "not built (no bin/python3)", missing=True)
    stamp = read_stamp(runtime)
    if stamp is None:
        if sandbox.runtime_packages:
            return RuntimeStatus("python", runtime, "runtime_packages are configured but were never installed")
        return RuntimeStatus("python", runtime)  # built by `make`: current by make's own rules
    if stamp.get("digest") != python_digest(sandbox):
        return RuntimeStatus("python", runtime, "out of date (the pins or runtime_packages changed since setup)")
    return RuntimeStatus("python", runtime)


def js_status(paths: PathSettings) -> RuntimeStatus:
    """Whether the JavaScript runtimes (bun, deno) are installed from the current lockfile."""
    runtime = paths.js_runtime_dir
    if not (runtime / "node_modules").is_dir():
        return RuntimeStatus("javascript", runtime, "not installed", missing=True)
    stamp = read_stamp(runtime)
    if stamp is not None and stamp.get("digest") != js_digest():
        return RuntimeStatus("javascript", runtime, "out of date (the lockfile changed since setup)")
    return RuntimeStatus("javascript", runtime)
