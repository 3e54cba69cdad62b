"""The built wheel works without the checkout: install it in a fresh venv, ``setup``, run pandas.

What a user of ``pipx install`` / ``uvx`` does, for real: the wheel is built from a copy of the
sources (so nothing of the checkout leaks in), installed with its dependencies into a new venv
of the system's Python, and every command runs with its working directory elsewhere. ``setup``
builds the sandbox's Python runtime from the package indexes (pip's cache makes a second run
quick) into a data directory of its own; the JavaScript runtimes are left out (``--no-js``):
they are npm's download, tested by ``make``'s own build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest

from mcp_sandbox.workspace import remove_tree
from mcp_test_helpers import http_server, private_tmpdir

# slow: builds the wheel and installs it into a venv of its own (a minute and more).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
RUNTIME_PACKAGE = "tabulate==0.9.0"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    data_dir: Path
    state_dir: Path
    elsewhere: Path
    setup_output: str

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_SANDBOX_", "VIRTUAL_ENV", "PYTHON"))}
        env.update(
            {
                "MCP_SANDBOX_DATA_DIR": str(self.data_dir),
                "MCP_SANDBOX_STATE_DIR": str(self.state_dir),
                "HOME": str(self.elsewhere),
                # One small package more, installed by setup on the host side.
                "MCP_SANDBOX_RUNTIME_PACKAGES": RUNTIME_PACKAGE,
            }
        )
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "mcp-sandbox"), *args],
            cwd=self.elsewhere,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _step(what: str, argv: list[str], **kwargs: object) -> str:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900, **kwargs)  # type: ignore[call-overload]
    print(f"{what}: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, f"{what} failed:\n{done.stdout}\n{done.stderr}"
    return f"{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    # Reachable by the sandbox's uid when root (tmp_path's parent is 0700): the runtime lives here.
    # Not under /tmp: the gate setup builds is run only where no parent is writable by others.
    root = private_tmpdir("test-wheel-")
    root.chmod(0o711)
    try:
        source = root / "source"
        shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, source / name)
        wheels = root / "wheels"
        _step(
            "build the wheel",
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)],
        )
        [wheel] = wheels.glob("mcp_sandbox-*.whl")
        shutil.rmtree(source)  # nothing of the sources is left to lean on
        venv = root / "venv"
        _step("create the venv", [str(SYSTEM_PYTHON), "-m", "venv", str(venv)])
        _step("install the wheel", [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
        elsewhere = root / "elsewhere"
        elsewhere.mkdir()
        partial = Installed(wheel, venv, root / "data", root / "state", elsewhere, "")
        started = time.monotonic()
        setup = partial.run("setup", "--no-js", timeout=900)
        print(f"mcp-sandbox setup: {time.monotonic() - started:.1f} s")
        assert setup.returncode == 0, f"setup failed:\n{setup.stdout}\n{setup.stderr}"
        yield Installed(wheel, venv, partial.data_dir, partial.state_dir, elsewhere, setup.stdout + setup.stderr)
    finally:
        # Our own trees go fast; the state directory (sandboxes wrote there) the careful way.
        for tree in ("venv", "data", "wheels", "source"):
            shutil.rmtree(root / tree, ignore_errors=True)
        remove_tree(root)


def test_the_wheel_ships_the_pins_and_the_runners(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for name in (
        "mcp_sandbox/provision/pins/python-requirements.txt",
        "mcp_sandbox/provision/pins/js/package.json",
        "mcp_sandbox/provision/pins/js/package-lock.json",
        "mcp_sandbox/runners/python/boot.py",
        "mcp_sandbox/runners/typescript/bun.ts",
        "mcp_sandbox/sandbox/gate.c",
        # the playground, committed built (Makefile, `web`): no node or `make web` for a wheel's user
        "mcp_sandbox/server/static/index.html",
        "mcp_sandbox/server/static/playground.js",
        "mcp_sandbox/server/static/playground.css",
    ):
        assert name in names


def test_the_installed_wheel_serves_the_playground(installed: Installed) -> None:
    async def load() -> tuple[httpx2.Response, httpx2.Response]:
        env = {**installed.env(), "PYTHONPATH": ""}  # the venv's package, not the checkout's src
        program = [str(installed.venv / "bin" / "mcp-sandbox")]
        async with (
            http_server(installed.state_dir, env=env, program=program) as url,
            httpx2.AsyncClient(base_url=url, timeout=30) as web,
        ):
            with anyio.fail_after(60):
                page = await web.get("/")
                script = await web.get("/static/playground.js")
        return page, script

    page, script = anyio.run(load)
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html") and "playground.js" in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert len(script.content) > 100_000  # the bundle, CodeMirror included


def test_setup_explains_the_system_interpreter_and_stamps_the_runtime(installed: Installed) -> None:
    assert "/usr/bin/python3" in installed.setup_output and "sees only the host's /usr" in installed.setup_output
    assert (installed.data_dir / "python" / ".mcp-sandbox-setup.json").exists()
    assert (installed.data_dir / "python" / "bin" / "python3").resolve().is_relative_to("/usr")
    # and the sandbox's gate, from the wheel's gate.c, with the host's compiler (`make sysdeps` installs gcc)
    assert f"sandbox gate: built {installed.data_dir / 'gate'}/" in installed.setup_output, installed.setup_output
    # and the runner every sandbox binds, compiled for the sandbox's interpreter (it cannot write __pycache__)
    where = "import pathlib, mcp_sandbox.runners as r; print(pathlib.Path(r.__file__).parent / 'python')"
    found = subprocess.run([str(installed.venv / "bin" / "python"), "-c", where], capture_output=True, text=True)
    runner = Path(found.stdout.strip())
    assert found.returncode == 0 and (runner / "boot.py").exists(), found.stderr
    uncompiled = (
        "import importlib.util, pathlib, sys;"
        "print([str(f) for f in pathlib.Path(sys.argv[1]).rglob('*.py')"
        " if not pathlib.Path(importlib.util.cache_from_source(str(f))).exists()])"
    )
    runtime_python = installed.data_dir / "python" / "bin" / "python3"
    done = subprocess.run([str(runtime_python), "-c", uncompiled, str(runner)], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_the_installed_package_runs_pandas_in_a_sandbox(installed: Installed) -> None:
    code = (
        "import os, pandas, sys, tabulate; "
        f"print(pandas.__version__, sys.prefix, tabulate.__version__, os.path.exists({str(installed.data_dir)!r}))"
    )
    done = installed.run("run", "-c", code)
    assert done.returncode == 0, done.stderr
    version, prefix, added, host_path_seen = done.stdout.split()
    # The data dir's runtime, seen at its fixed place inside: the host's path (a home) is not shown.
    assert prefix == "/opt/mcp-sandbox/venv" and version.startswith(("2.", "3."))
    assert host_path_seen == "False"
    assert added == "0.9.0"  # runtime_packages
    assert "runtime_packages" not in done.stderr  # the stamp says they are installed: no warning


def test_the_installed_package_is_not_the_checkout(installed: Installed) -> None:
    code = "import mcp_sandbox; print(mcp_sandbox.__file__)"
    where = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", code],
        cwd=installed.elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed.venv) and not Path(where).is_relative_to(REPO)


def test_install_names_the_installed_executable(installed: Installed) -> None:
    done = installed.run("install", "claude-code", "--print")
    assert done.returncode == 0, done.stderr
    assert f'"command": "{installed.venv}/bin/mcp-sandbox"' in done.stdout


def test_serve_without_setup_names_the_command_that_fixes_it(installed: Installed, tmp_path: Path) -> None:
    env_dir = tmp_path / "empty-data"
    done = subprocess.run(
        [str(installed.venv / "bin" / "mcp-sandbox"), "serve"],
        cwd=installed.elsewhere,
        env={**installed.env(), "MCP_SANDBOX_DATA_DIR": str(env_dir)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "run `mcp-sandbox setup`" in done.stderr and str(env_dir / "python") in done.stderr


def test_setup_installs_the_javascript_runtimes_with_npm_and_typescript_runs(installed: Installed) -> None:
    # npm is the system's here (`make test` installs it); setup says what to install where there is none.
    assert shutil.which("npm") is not None, "npm is needed (scripts/install-system-deps.sh installs it)"
    started = time.monotonic()
    setup = installed.run("setup", "--no-python", timeout=600)
    print(f"mcp-sandbox setup --no-python: {time.monotonic() - started:.1f} s")
    assert setup.returncode == 0, f"{setup.stdout}\n{setup.stderr}"
    assert (installed.data_dir / "js" / ".mcp-sandbox-setup.json").exists()
    # The runner bundled for each runtime, from the sources the wheel shipped (provision/bundles.py).
    bundles = sorted(
        path.relative_to(installed.data_dir / "js" / "runners").parts
        for path in (installed.data_dir / "js" / "runners").glob("*/*.js")
    )
    assert [(directory.partition("-")[0], name) for directory, name in bundles] == [
        ("bun", "bun.js"),
        ("deno", "deno.js"),
    ]
    done = installed.run("run", "--language", "typescript", "-c", "const n: number = 6 * 7; console.log(n)")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr
