"""The TypeScript runner bundled into one JavaScript file per runtime, built at setup.

A sandbox's runtime loads the runner (``runners/typescript``: nine TypeScript modules) on every
start, before READY. From sources, bun and deno each resolve and transpile every module anew: a
sandbox's caches live in its own fresh ``/tmp``. One pre-built JavaScript file per runtime
(``bun build``; for bun, its ``// @bun`` header tells bun the file needs no transpiling) takes
that work off every start: the CPU that bounds TypeScript runs back to back (bench/README.md
has the figures).

bun's bundler builds both (no build tool of ours), at setup: ``make`` (``make runtime``) and
``mcp-sandbox setup`` run :func:`build_bundles`. Each bundle lives in
``<js_runtime_dir>/runners/<runtime>-<digest>/``, beside a copy of every runner file (the worker
scripts the runner starts by a path relative to itself, the runtime's config files), and is
bound at the runner's usual place. The digest covers the runner's sources, bun's version and
this module's format, so a bundle is never used for other sources. With none current (sources
changed since setup, a runtime directory setup could not write), sandboxes run the runner from
its sources: as correctly, only slower to start.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from mcp_sandbox.config import JS_RUNTIMES, PathSettings, SandboxSettings, load_settings
from mcp_sandbox.provision.pins import JS_BINARIES, JS_PACKAGES
from mcp_sandbox.provision.python import SetupError, run_step
from mcp_sandbox.runners import runner_dir

__all__ = ["BUNDLES", "ENTRIES", "build_bundles", "bundle_digest", "current_bundle"]

# Each runtime's entry module (in runners/typescript) and the bundle built from it.
ENTRIES: Mapping[str, str] = {"bun": "bun.ts", "deno": "deno.ts"}
BUNDLES: Mapping[str, str] = {"bun": "bun.js", "deno": "deno.js"}
# bun bundles for both runtimes: deno's own bundler fetches esbuild from the npm registry on first
# use, and bun is installed with deno in any case (runtime/js/package.json holds both).
_BUNDLER = "bun"
_TARGETS: Mapping[str, tuple[str, ...]] = {"bun": ("--target=bun",), "deno": ("--target=node", "--format=esm")}
_FORMAT = "1"  # bump when the build commands change what a bundle holds
_BUILD_TIMEOUT = 120.0


def _bundler_version(runtime_dir: Path) -> str:
    """bun's version in ``runtime_dir``, or "" when it is not installed."""
    try:
        package = json.loads((runtime_dir / JS_PACKAGES[_BUNDLER] / "package.json").read_text(encoding="utf-8"))
        version = package["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return str(version)


def bundle_digest(sources: Path, runtime: str, bundler_version: str) -> str:
    """The name of the bundle of ``sources`` (the runner's directory) for ``runtime``, by bun ``bundler_version``."""
    digest = hashlib.sha256(f"{_FORMAT}\0{runtime}\0{bundler_version}\0".encode())
    for path in sorted(sources.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{runtime}-{digest.hexdigest()[:20]}"


@functools.cache
def _bundle_dir(runtime_dir: Path, runtime: str) -> Path | None:
    version = _bundler_version(runtime_dir)
    if not version:
        return None
    return runtime_dir / "runners" / bundle_digest(runner_dir("typescript"), runtime, version)


def current_bundle(paths: PathSettings, sandbox: SandboxSettings) -> Path | None:
    """The directory holding the current bundle of the configured runtime, or None (run from sources)."""
    directory = _bundle_dir(paths.js_runtime_dir, sandbox.js_runtime)
    if directory is None or not (directory / BUNDLES[sandbox.js_runtime]).is_file():
        return None
    return directory


def _build_one(paths: PathSettings, runtime: str, log: Callable[[str], None]) -> Path | None:
    runtime_dir = paths.js_runtime_dir
    bundler, version = runtime_dir / JS_BINARIES[_BUNDLER], _bundler_version(runtime_dir)
    if not (runtime_dir / JS_BINARIES[runtime]).is_file() or not bundler.is_file() or not version:
        log(f"  {runtime}: not installed (or bun, which bundles, is not), no bundle")
        return None
    sources = runner_dir("typescript")
    final = runtime_dir / "runners" / bundle_digest(sources, runtime, version)
    if (final / BUNDLES[runtime]).is_file():
        _prune(final, runtime)
        log(f"  {runtime}: {final} is current")
        return final
    final.parent.mkdir(exist_ok=True)
    final.parent.chmod(0o755)  # the sandbox uid traverses it, whatever the umask
    building = final.parent / f".building-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        shutil.copytree(sources, building, ignore=shutil.ignore_patterns("__pycache__"))
        with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bundle-") as home:
            outfile, entry = building / BUNDLES[runtime], building / ENTRIES[runtime]
            argv = [str(bundler), "build", *_TARGETS[runtime], f"--outfile={outfile}", str(entry)]
            env = {"PATH": "/usr/bin:/bin", "HOME": home, "NO_COLOR": "1", "DO_NOT_TRACK": "1"}
            done = subprocess.run(
                argv, cwd=building, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                text=True, timeout=_BUILD_TIMEOUT, check=False,
            )  # fmt: skip
        if done.returncode != 0 or not (building / BUNDLES[runtime]).is_file():
            raise SetupError(
                f"bun could not bundle the runner for {runtime} (exit {done.returncode}): {done.stderr.strip()}"
            )
        for directory, _, files in os.walk(building):
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(os.path.join(directory, name), 0o644)
        shutil.rmtree(final, ignore_errors=True)  # a directory of that name without its bundle: broken
        try:
            building.rename(final)
        except OSError:
            if not (final / BUNDLES[runtime]).is_file():  # else another build got there first
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    _prune(final, runtime)
    log(f"  {runtime}: built {final}")
    return final


def _prune(current: Path, runtime: str) -> None:
    """Remove ``runtime``'s bundles other than ``current`` (of earlier sources or versions)."""
    for stale in current.parent.glob(f"{runtime}-*"):
        if stale != current:
            shutil.rmtree(stale, ignore_errors=True)


def build_bundles(paths: PathSettings, *, log: Callable[[str], None] = print) -> list[Path]:
    """Build the runner's bundle of each runtime in ``paths.js_runtime_dir``; return their directories.

    A runtime that is not installed is skipped; a current bundle is kept.

    Raises:
        SetupError: bun failed to bundle the runner (or took two minutes), or the runtime
            directory cannot be written.
    """
    log(f"typescript runner bundles: {paths.js_runtime_dir / 'runners'}")
    try:
        return [directory for runtime in JS_RUNTIMES if (directory := _build_one(paths, runtime, log)) is not None]
    except subprocess.TimeoutExpired as error:
        raise SetupError(f"bun did not bundle the runner within {error.timeout:.0f} s") from error
    except OSError as error:
        raise SetupError(f"cannot write the runner's bundles in {paths.js_runtime_dir}: {error}") from error
    finally:
        _bundle_dir.cache_clear()


def main() -> int:
    """``python -m mcp_sandbox.provision.bundles`` (``make runtime``): build the configured directory's bundles."""
    return run_step(lambda: build_bundles(load_settings().paths))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
