"""The sandbox's gate (``sandbox/gate.c``) compiled at setup, by the host's C compiler.

``make runtime`` (``python -m mcp_sandbox.provision.gate DIR``) and ``mcp-sandbox setup`` build it
into ``<gate_dir>/<digest>/mcp-sandbox-gate`` (see :mod:`mcp_sandbox.sandbox.gate`): statically
linked, so it needs ``cc`` and the C library's static archive (Debian: ``gcc`` and
``libc6-dev``). Without them setup says so and goes on: sandboxes then start through ``sh`` and
``setpriv``, about 1.2 ms more CPU each.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from mcp_sandbox.config import load_settings
from mcp_sandbox.provision.python import SetupError, run_step
from mcp_sandbox.sandbox import gate

__all__ = ["NO_COMPILER", "build_gate", "find_compiler"]

NO_COMPILER = (
    "no C compiler (cc): sandboxes start through sh and setpriv, about 1.2 ms more CPU each; "
    "install one (Debian: apt install gcc libc6-dev) and run setup again"
)
_BUILD_TIMEOUT = 120.0
_DIGEST = re.compile(r"[0-9a-f]{16}")


def find_compiler() -> str | None:
    """The host's C compiler, or None."""
    return shutil.which("cc") or shutil.which("gcc")


def build_gate(directory: Path, *, log: Callable[[str], None] = print) -> Path:
    """Compile the gate into ``directory`` unless a current build is there; return its path.

    Raises:
        SetupError: no C compiler, the build failed, or ``directory`` cannot be written.
    """
    final = gate.built_path(directory)
    if gate.refusal(directory) is None:
        _prune(directory, keep=final.parent)
        log(f"sandbox gate: {final} is current")
        return final
    compiler = find_compiler()
    if compiler is None:
        raise SetupError(NO_COMPILER)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)  # the server runs it: writable by nobody else, whatever the umask
        building = directory / f".building-{os.getpid()}-{uuid.uuid4().hex}"
        building.mkdir(mode=0o755)
        try:
            argv = [compiler, *gate.CFLAGS, "-o", str(building / gate.NAME), str(gate.SOURCE)]
            done = subprocess.run(
                argv, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, stdin=subprocess.DEVNULL,
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SetupError(
                    f"{compiler} could not build the sandbox's gate (exit {done.returncode}; a static build needs "
                    f"the C library's static archive, Debian: libc6-dev): {done.stderr.strip()}"
                )
            (building / gate.NAME).chmod(0o755)
            building.chmod(0o755)
            shutil.rmtree(final.parent, ignore_errors=True)  # a directory of that name without a usable gate
            try:
                building.rename(final.parent)
            except OSError:
                if gate.refusal(directory) is not None:  # else another build got there first
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    except subprocess.TimeoutExpired as error:
        raise SetupError(f"{compiler} did not build the sandbox's gate within {error.timeout:.0f} s") from error
    except OSError as error:
        raise SetupError(f"cannot write the sandbox's gate in {directory}: {error}") from error
    problem = gate.refusal(directory)
    if problem is not None:
        raise SetupError(f"the sandbox's gate was built but is not usable: {problem}")
    _prune(directory, keep=final.parent)
    log(f"sandbox gate: built {final}")
    return final


def _prune(directory: Path, keep: Path) -> None:
    """Remove the builds of other sources (earlier versions) from ``directory``."""
    for stale in directory.iterdir():
        if stale != keep and _DIGEST.fullmatch(stale.name):
            shutil.rmtree(stale, ignore_errors=True)


def main() -> int:
    """``python -m mcp_sandbox.provision.gate [DIR]`` (``make runtime``): build the gate in DIR (default: gate_dir)."""
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else load_settings().paths.gate_dir
    return run_step(lambda: build_gate(directory))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
