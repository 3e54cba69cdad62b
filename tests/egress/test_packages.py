"""Real `pip install` and `bun add` through the egress proxy into a conversation's workspace, imported by a later run.

The tests that leave loopback and the test namespaces, because the issue asks for a real
install: they reach the package index this machine's pip is configured with, read from pip's
own configuration now (``pip config list``, else pip's built-in default), and the host its
download links name, read from the index's page now; for bun, the registry npm is configured
with (``npm config get registry``) and the host of the package's tarball, read from the
registry's metadata now. No registry host is written here. Where
the host's resolver answers with a non-public address (a local mirror, an intercepting proxy),
exactly those addresses are allowed, as an operator would with ``egress_allow_private``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.engine import ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for, tenant_egress

pytestmark = [pytest.mark.anyio, pytest.mark.sandbox]

PACKAGE = "tomli-w"  # small, pure Python, not in the sandbox's runtime
MODULE = "tomli_w"
NPM_PACKAGE = "is-number"  # small, pure JavaScript, not in the sandbox's runtime


def _pip_config() -> dict[str, str]:
    shown = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
    )
    config: dict[str, str] = {}
    for line in shown.stdout.splitlines():
        key, _, value = line.partition("=")
        config[key.rpartition(".")[2]] = value.strip().strip("'\"")
    return config


def _index() -> tuple[str, str | None]:
    """The index URL pip uses here, and the CA bundle it is told to trust (if any)."""
    config = _pip_config()
    index = os.environ.get("PIP_INDEX_URL") or config.get("index-url")
    if not index:
        from pip._internal.models.index import PyPI  # pip's own default, not a name of ours

        index = PyPI.simple_url
    return index.rstrip("/"), os.environ.get("PIP_CERT") or config.get("cert")


def _hosts(index: str, cert: str | None) -> list[str]:
    """The index's host and the hosts its links to ``PACKAGE`` name."""
    context = ssl.create_default_context(cafile=cert) if cert else None
    with urllib.request.urlopen(f"{index}/{PACKAGE}/", timeout=60, context=context) as page:
        html = page.read().decode()
    links = {urlsplit(link).hostname for link in re.findall(r'href="(https://[^"]+)"', html)}
    return sorted({urlsplit(index).hostname or "", *(host for host in links if host)} - {""})


def _npm_config(key: str) -> str | None:
    npm = shutil.which("npm")
    if npm is None:
        return None
    shown = subprocess.run([npm, "config", "get", key], capture_output=True, text=True, timeout=60, check=False)
    value = shown.stdout.strip()
    return value if shown.returncode == 0 and value not in ("", "null", "undefined") else None


def _npm_hosts(registry: str, cafile: str | None) -> list[str]:
    """The registry's host and the host of ``NPM_PACKAGE``'s latest tarball."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    with urllib.request.urlopen(f"{registry}/{NPM_PACKAGE}/latest", timeout=60, context=context) as page:
        tarball = json.loads(page.read())["dist"]["tarball"]
    return sorted({urlsplit(registry).hostname or "", urlsplit(tarball).hostname or ""} - {""})


def _non_public(hosts: list[str]) -> list[str]:
    ranges = set()
    for host in hosts:
        for info in socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM):
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                ranges.add(f"{address}/{address.max_prefixlen}")
    return sorted(ranges)


async def test_pip_install_goes_to_the_workspace_and_a_later_run_imports_it(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs with the other egress tests, as root")
    index, cert = _index()
    if not index.startswith("https://"):
        pytest.skip(f"pip's index here is not an https index ({index})")
    try:
        hosts = _hosts(index, cert)
    except OSError as exc:
        pytest.skip(f"the package index {index} is not reachable from this host: {exc}")
    flags: dict[str, object] = {
        "state_dir": str(state_dir),
        "egress_allow": ",".join(hosts),
        "egress_allow_private": ",".join(_non_public(hosts)),
    }
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    engine = engine_for(settings, backend_for(settings, "bwrap"))
    engine.prepare()
    workspace = state_dir.parent / "conversation"
    workspace.mkdir(mode=0o700)
    os.chown(workspace, settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)
    environment = {"PIP_INDEX_URL": index, **({"PIP_CERT": cert} if cert else {})}
    install = f"""
import subprocess, sys
command = [sys.executable, "-m", "pip", "install", "--no-input", "{PACKAGE}"]
done = subprocess.run(command, capture_output=True, text=True)
print(done.returncode)
print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
"""
    grant = tenant_egress(settings).grant("default", True, "conversation")
    with anyio.fail_after(200):
        installed = await engine.execute(
            ExecutionRequest(code=install, timeout=110, workspace=workspace, environment=environment, egress=grant)
        )
    assert installed.status == "success" and installed.stdout == "0\n", installed.stderr
    assert any((workspace / ".packages" / "python").glob(f"{MODULE}/__init__.py"))
    use = f"import {MODULE}\nprint({MODULE}.__file__)\nprint({MODULE}.dumps({{'a': 1}}), end='')"
    with anyio.fail_after(60):
        imported = await engine.execute(ExecutionRequest(code=use, timeout=30, workspace=workspace))
    assert imported.status == "success", imported.stderr
    assert imported.stdout == f"/workspace/.packages/python/{MODULE}/__init__.py\na = 1\n"


async def test_bun_add_goes_to_the_workspace_and_a_later_run_imports_it(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs with the other egress tests, as root")
    registry = _npm_config("registry")
    if registry is None or not registry.startswith("https://"):
        pytest.skip(f"npm's registry here is not an https registry ({registry})")
    registry = registry.rstrip("/")
    cafile = _npm_config("cafile")
    try:
        hosts = _npm_hosts(registry, cafile)
    except OSError as exc:
        pytest.skip(f"the npm registry {registry} is not reachable from this host: {exc}")
    flags: dict[str, object] = {
        "state_dir": str(state_dir),
        "js_runtime": "bun",
        "egress_allow": ",".join(hosts),
        "egress_allow_private": ",".join(_non_public(hosts)),
    }
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    engine = engine_for(settings, backend_for(settings, "bwrap"))
    engine.prepare()
    workspace = state_dir.parent / "conversation"
    workspace.mkdir(mode=0o700)
    os.chown(workspace, settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)
    environment = {"REGISTRY": registry, **({"CAFILE": cafile} if cafile else {})}
    # spawnSync blocks the runner's main thread for the whole install: the relay must not need it.
    install = f"""
const flags = ["--registry", process.env.REGISTRY!, ...(process.env.CAFILE ? ["--cafile", process.env.CAFILE] : [])];
const done = Bun.spawnSync([process.execPath, "add", ...flags, "{NPM_PACKAGE}"], {{ cwd: "/workspace" }});
console.log(done.exitCode);
console.error(done.stdout.toString().slice(-2000), done.stderr.toString().slice(-2000));
"""
    grant = tenant_egress(settings).grant("default", True, "conversation")
    with anyio.fail_after(200):
        installed = await engine.execute(
            ExecutionRequest(
                code=install,
                language="typescript",
                timeout=110,
                workspace=workspace,
                environment=environment,
                egress=grant,
            )
        )
    assert installed.status == "success" and installed.stdout == "0\n", installed.stderr
    assert (workspace / "node_modules" / NPM_PACKAGE / "package.json").is_file()
    assert NPM_PACKAGE in json.loads((workspace / "package.json").read_text())["dependencies"]
    use = f"""
import isNumber from "{NPM_PACKAGE}";
console.log(import.meta.resolve("{NPM_PACKAGE}"), isNumber(5), isNumber("x"));
"""
    with anyio.fail_after(60):
        imported = await engine.execute(
            ExecutionRequest(code=use, language="typescript", timeout=30, workspace=workspace)
        )
    assert imported.status == "success", imported.stderr
    assert imported.stdout == f"file:///workspace/node_modules/{NPM_PACKAGE}/index.js true false\n"
