"""The sandbox's Python runtime: a venv of the system interpreter with the pinned data stack.

Why the system interpreter (``/usr/bin/python3``) and not the one running the server: the
sandbox binds only the host's system directories (``/usr`` and its links) read-only, and a venv's
``bin/python3`` is a link to its base interpreter, so the base must live under ``/usr``. An
interpreter in a home directory (uv's, pyenv's, pipx's) is not in the sandbox at all, and root's
home (0700) is closed to the sandbox's unprivileged uid in any case.

Packages are installed from the host side, never from inside a sandbox: the pins shipped in the
wheel plus ``runtime_packages``, with pip (the server's own, run against the venv's interpreter
with ``pip --python``), else ``uv pip``, else the venv's own pip (``ensurepip``). Then everything
is pre-compiled (the sandbox cannot write ``__pycache__``) and made world-readable.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from mcp_sandbox.config import PathSettings, SandboxSettings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.provision.pins import PYTHON_REQUIREMENTS
from mcp_sandbox.provision.status import SYSTEM_PYTHON, is_system_prefix, python_digest, write_stamp
from mcp_sandbox.runners import runner_dir

__all__ = ["SYSTEM_PYTHON", "SetupError", "build_python_runtime", "check_base_interpreter", "run_step"]

# What the pinned stack must give the sandbox's code (the import check after the build).
_IMPORTS = "import numpy, pandas, matplotlib, requests"

Log = Callable[[str], None]


class SetupError(ConfigError):
    """A step of ``setup`` failed (the message says which, and why)."""


def run_step(build: Callable[[], object]) -> int:
    """A setup step as a ``python -m`` command (``make runtime``): 0, or 1 with its error on stderr."""
    try:
        build()
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def check_base_interpreter(base: Path) -> str:
    """The version of ``base`` after checking the sandbox can run it; raise SetupError if not."""
    if not base.exists():
        raise SetupError(
            f"{base} not found: the sandbox's runtime is built on the system's Python 3 "
            "(Debian/Ubuntu: apt install python3; pick another with --python /usr/bin/python3.X)"
        )
    real = base.resolve()
    if not real.is_relative_to("/usr"):
        raise SetupError(
            f"{base} is {real}, outside /usr: the sandbox sees only the host's /usr (read-only), so the "
            "runtime's base interpreter must be a system one such as /usr/bin/python3"
        )
    done = subprocess.run(
        [str(base), "-c", "import sys, venv; print('%d.%d.%d' % sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SetupError(
            f"{base} cannot create a venv: {done.stderr.strip()} (Debian/Ubuntu: apt install python3-venv)"
        )
    version = done.stdout.strip()
    if tuple(int(part) for part in version.split(".")[:2]) < (3, 11):
        raise SetupError(f"{base} is Python {version}; the pinned stack needs >= 3.11 (--python picks another)")
    return version


def _run(argv: Sequence[str], what: str, *, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(list(argv), env=env, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SetupError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}")


def _installer(venv_python: Path, base: Path, runtime: Path, log: Log) -> tuple[list[str], list[str]]:
    """Create the venv; return the argv prefixes that install into it and that check it (pip check)."""
    if importlib.util.find_spec("pip") is not None:
        _run([str(base), "-m", "venv", "--without-pip", str(runtime)], "creating the venv")
        log(f"  installing with this environment's pip ({sys.executable} -m pip --python {venv_python})")
        pip = [sys.executable, "-m", "pip", "--python", str(venv_python)]
        return [*pip, "install"], [*pip, "check"]
    uv = shutil.which("uv")
    if uv is not None:
        _run([str(base), "-m", "venv", "--without-pip", str(runtime)], "creating the venv")
        log(f"  installing with {uv} pip")
        return [uv, "pip", "install", "--python", str(venv_python)], [uv, "pip", "check", "--python", str(venv_python)]
    _run([str(base), "-m", "venv", str(runtime)], "creating the venv with pip (needs python3-venv's ensurepip)")
    log("  installing with the venv's own pip")
    return [str(venv_python), "-m", "pip", "install"], [str(venv_python), "-m", "pip", "check"]


def _check_as_sandbox_uid(venv_python: Path, sandbox: SandboxSettings, log: Log) -> None:
    """As root: prove the sandbox's uid can import the stack from where it will be bound."""
    uid, gid = sandbox.sandbox_uid, sandbox.sandbox_gid
    with tempfile.TemporaryDirectory() as mpl:
        os.chown(mpl, uid, gid)  # matplotlib wants a writable config dir (the sandbox gives one too)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "MPLCONFIGDIR": mpl}
        done = subprocess.run(
            [str(venv_python), "-B", "-c", _IMPORTS],
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise SetupError(
            f"the sandbox's uid {uid} cannot import the runtime from {venv_python}: {done.stderr.strip()[-400:]} "
            "(is a directory on the way closed to it? data_dir must be reachable by that uid)"
        )
    log(f"uid {uid} (the sandbox's) can import it")


def build_python_runtime(
    paths: PathSettings,
    sandbox: SandboxSettings,
    *,
    base: Path = SYSTEM_PYTHON,
    index_args: Sequence[str] = (),
    log: Log = print,
) -> Path:
    """(Re)build ``paths.python_runtime`` from scratch; return its interpreter.

    ``index_args``: pip's options for where packages come from (``--no-index``, ``--find-links``).

    Raises:
        SetupError: the base interpreter is unsuitable, or a step failed (named in the message).
    """
    runtime = paths.python_runtime
    if is_system_prefix(runtime):
        raise SetupError(
            f"python_runtime is {runtime}, a system directory: setup builds a runtime of its own; "
            "unset python_runtime (or point it at a new directory)"
        )
    if runtime.is_symlink():
        raise SetupError(f"python_runtime {runtime} is a symbolic link; setup does not replace what it points at")
    version = check_base_interpreter(base)
    log(
        f"python runtime: {runtime}\n"
        f"  base interpreter {base} (Python {version}): the sandbox sees only the host's /usr, read-only,\n"
        "  so its Python must be a system one; a uv, pyenv or pipx interpreter under a home directory\n"
        "  is invisible to it (and root's home is closed to the sandbox's uid)"
    )
    if runtime.exists():
        if not (runtime / "pyvenv.cfg").exists():
            raise SetupError(f"python_runtime {runtime} exists and is not a venv; setup replaces only a venv")
        shutil.rmtree(runtime)
    runtime.parent.mkdir(parents=True, exist_ok=True)
    venv_python = runtime / "bin" / "python3"
    install, check = _installer(venv_python, base, runtime, log)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    packages = list(sandbox.runtime_packages)
    extra = f" and {', '.join(packages)}" if packages else ""
    log(f"  installing the pinned stack ({PYTHON_REQUIREMENTS.name}){extra}")
    _run([*install, "--quiet", *index_args, "-r", str(PYTHON_REQUIREMENTS), *packages], "installing packages", env=env)
    _run(check, "checking the installed packages' dependencies", env=env)
    log("  pre-compiling bytecode (the sandbox cannot write __pycache__)")
    _run([str(venv_python), "-m", "compileall", "-q", "-j", "0", str(runtime / "lib")], "compileall")
    _compile_runner(venv_python, log)
    _make_readable(runtime)
    _run([str(venv_python), "-c", _IMPORTS], "the import check")
    if os.geteuid() == 0:
        _check_as_sandbox_uid(venv_python, sandbox, log)
    write_stamp(
        runtime,
        {
            "digest": python_digest(sandbox),
            "base": str(base),
            "python": version,
            "runtime_packages": packages,
            "platform": platform.machine(),
        },
    )
    return venv_python


def _compile_runner(venv_python: Path, log: Log) -> None:
    """Pre-compile the Python runner with the sandbox's interpreter, where its directory is writable.

    The runner is bound into every sandbox, which cannot write ``__pycache__``: uncompiled, each
    sandbox compiles it anew (about 20 ms of CPU per start). pip compiled it with the server's
    interpreter, whose bytecode the sandbox's can use only if it is the same version.
    """
    runner = runner_dir("python")
    done = subprocess.run(
        [str(venv_python), "-m", "compileall", "-q", str(runner)],
        check=False,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    if done.returncode != 0:
        log(f"  note: the runner at {runner} could not be pre-compiled; each sandbox compiles it as it starts")


def _make_readable(root: Path) -> None:
    """chmod -R a+rX: readable by all, searchable where someone may already execute."""
    for directory, dirs, files in os.walk(root):
        os.chmod(directory, os.stat(directory).st_mode | 0o555)
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, mode | 0o444 | (0o111 if mode & 0o111 else 0))
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(directory, d))]
