"""What ``list_runners`` reports: each language, its runtime and version, its installed packages."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from mcp_sandbox.config import Settings

__all__ = ["describe_runners"]

# Run by the runtime's own interpreter on the host (our build, not user code): its version and
# the distributions installed in it, as the sandbox will see them.
_PROBE = (
    "import sys, json, importlib.metadata as m\n"
    "found = {(d.metadata['Name'] or '?', d.version) for d in m.distributions()}\n"
    "packages = sorted(found, key=lambda p: p[0].lower())\n"
    "print(json.dumps({'implementation': sys.implementation.name, 'version': sys.version.split()[0], "
    "'packages': packages}))"
)


def describe_runners(settings: Settings) -> list[dict[str, Any]]:
    """The runners this server offers. Blocking (it runs the interpreter once): call from a thread."""
    interpreter = str(settings.python_interpreter)
    try:
        done = subprocess.run([interpreter, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=30, check=True)
        found = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return [{"language": "python", "runtime": interpreter, "version": None, "packages": [], "error": str(exc)}]
    runtime = {"cpython": "CPython"}.get(found["implementation"], found["implementation"])
    return [
        {
            "language": "python",
            "runtime": runtime,
            "version": found["version"],
            "packages": [{"name": name, "version": version} for name, version in found["packages"]],
        }
    ]
