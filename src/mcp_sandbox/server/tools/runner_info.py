"""What ``list_runners`` reports: each language, its runtime and version, its installed packages."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from mcp_sandbox.config import PathSettings, SandboxSettings
from mcp_sandbox.engine.runtimes import js_binary
from mcp_sandbox.runners import JS_LANGUAGES

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


def describe_runners(paths: PathSettings, sandbox: SandboxSettings) -> list[dict[str, Any]]:
    """The runners this server offers. Blocking (it runs each runtime once): call from a thread."""
    return [*_python_runners(paths), *_js_runners(paths, sandbox.js_runtime)]


# The runtime's own packages (the binaries), not packages for user code.
_JS_RUNTIME_SCOPES = ("@oven/", "@deno/")


def _js_packages(paths: PathSettings) -> list[dict[str, str]]:
    """The packages user code can import: the runtime's ``dependencies``, with their installed versions."""
    root = paths.js_runtime_dir
    try:
        declared = json.loads((root / "package.json").read_text(encoding="utf-8")).get("dependencies", {})
    except (OSError, ValueError):
        return []
    packages = []
    for name in sorted(declared):
        if name.startswith(_JS_RUNTIME_SCOPES):
            continue
        try:
            version = json.loads((root / "node_modules" / name / "package.json").read_text(encoding="utf-8"))["version"]
        except (OSError, ValueError, KeyError):
            continue  # declared but not installed: not importable
        packages.append({"name": name, "version": str(version)})
    return packages


def _js_runners(paths: PathSettings, js_runtime: str) -> list[dict[str, Any]]:
    """TypeScript and JavaScript on the configured runtime: its version and the packages code can import."""
    binary = js_binary(paths, js_runtime)
    # deno runs with --no-npm: bare imports of npm packages are bun's alone.
    packages = _js_packages(paths) if js_runtime == "bun" else []
    entry: dict[str, Any] = {"runtime": js_runtime, "version": None, "packages": packages}
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True)
        # bun prints "1.4.5"; deno "deno 2.9.6 (stable, ...)" and then its V8's and TypeScript's.
        entry["version"] = done.stdout.split()[1] if js_runtime == "deno" else done.stdout.strip()
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        entry["error"] = f"{js_runtime} is not installed at {binary} (run make): {exc}"
    return [{"language": language, **entry} for language in JS_LANGUAGES]


def _python_runners(paths: PathSettings) -> list[dict[str, Any]]:
    interpreter = str(paths.python_interpreter)
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
