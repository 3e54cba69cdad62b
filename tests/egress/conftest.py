"""Fixtures of the egress suite: test hosts in a network namespace of their own, and engines whose proxy knows them.

The test network is a namespace with a veth pair to the host (``10.231.N.0/24``, the host end
``.1``, the test host ``.2``), serving HTTP and HTTPS (a certificate of the tests' own CA, made
with the openssl CLI). Names reach the proxy through a resolver table (``hosts_resolver``), never
DNS. Traffic goes only there: the test host's address is private, so every test that reaches it
allows exactly that address in ``egress_allow_private``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from container_helpers import backend_flags
from mcp_sandbox.config import load_settings
from mcp_sandbox.egress import EgressGrant, TenantEgress, hosts_resolver
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.startup import backend_for, engine_for, tenant_egress

SERVER = Path(__file__).with_name("host_server.py")
NAMES = ("web.test", "api.web.test", "other.test", "denied.web.test")


@dataclass(frozen=True)
class HostNet:
    address: str  # the test host's
    host_end: str  # the host's end of the veth pair
    ca: str  # PEM of the CA that signed the HTTPS certificate

    @property
    def hosts(self) -> dict[str, list[str]]:
        return {name: [self.address] for name in NAMES}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _certificates(directory: Path, address: str) -> tuple[Path, Path, str]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=directory)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=egress-test-ca")
    openssl("req", *curve, "-keyout", "host.key", "-out", "host.csr", "-subj", "/CN=web.test")
    names = [f"DNS:{name}" for name in NAMES] + [f"IP:{address}"]  # by address: for a server resolving by DNS
    (directory / "san.ext").write_text("subjectAltName=" + ",".join(names) + "\n")
    openssl(
        "x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "host.pem", "-days", "2", "-extfile", "san.ext",
    )  # fmt: skip
    return directory / "host.pem", directory / "host.key", (directory / "ca.pem").read_text()


@pytest.fixture(scope="session")
def test_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostNet]:
    if os.geteuid() != 0:
        pytest.skip("the egress tests make network namespaces: they run as root")
    if shutil.which("ip") is None or shutil.which("openssl") is None:
        pytest.skip("the egress tests need iproute2 (ip) and openssl")
    tag = secrets.token_hex(3)
    namespace, host_end, inner_end = f"mcpeg-{tag}", f"eg{tag}h", f"eg{tag}n"
    subnet = f"10.231.{secrets.randbelow(250) + 1}"
    cert, key, ca = _certificates(tmp_path_factory.mktemp("egress-ca"), f"{subnet}.2")
    _ip("netns", "add", namespace)
    server: subprocess.Popen[str] | None = None
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
        _ip("link", "set", inner_end, "netns", namespace)
        _ip("addr", "add", f"{subnet}.1/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{subnet}.2/24", "dev", inner_end)
        _ip("-n", namespace, "link", "set", inner_end, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, str(SERVER), str(cert), str(key)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        yield HostNet(address=f"{subnet}.2", host_end=host_end, ca=ca)
    finally:
        if server is not None:
            assert server.stdin is not None
            server.stdin.close()
            assert server.stdout is not None
            server.stdout.close()
            server.kill()
            server.wait(timeout=10)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_end)
        _ip("netns", "del", namespace)


EgressEngine = Callable[..., contextlib.AbstractAsyncContextManager[tuple[Engine, TenantEgress]]]


@pytest.fixture
def egress_engine(
    request: pytest.FixtureRequest, state_dir: Path, sandbox_runtime: Path | None, test_net: HostNet
) -> EgressEngine:
    """``async with egress_engine(backend="bwrap", hosts=None, env=None, config=None, **flags) as (engine, egress)``.

    Its proxy resolves the test names, and ``hosts`` (name to addresses) besides; ``env`` is the
    environment its settings are read from (secrets); ``config``, a config file's TOML (tenants' tables).
    """

    @contextlib.asynccontextmanager
    async def make(
        backend: str = "bwrap",
        hosts: dict[str, list[str]] | None = None,
        env: dict[str, str] | None = None,
        config: str | None = None,
        **flags: Any,
    ) -> AsyncIterator[tuple[Engine, TenantEgress]]:
        if backend == "docker":
            request.getfixturevalue("docker_engine")  # the tests' own docker engine, started once
        values: dict[str, Any] = {"state_dir": str(state_dir), "memory": "256m", "pids": 64, "backend": backend}
        values.update(backend_flags(backend))
        if sandbox_runtime is not None:
            values["python_runtime"] = str(sandbox_runtime)
        values.update(flags)
        config_file = None
        if config is not None:
            config_file = state_dir.parent / "egress-config.toml"
            config_file.write_text(config)
        settings = load_settings(env=env or {}, flags=values, config_file=config_file)
        chosen = backend_for(settings, backend)
        probe = chosen.probe()
        if not probe.available:
            if backend in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
                pytest.fail(f"{backend} is required but unavailable: {probe.reason}")
            pytest.skip(f"{backend} is unavailable here: {probe.reason}")
        engine = engine_for(settings, chosen, egress_resolver=hosts_resolver({**test_net.hosts, **(hosts or {})}))
        engine.prepare()
        async with engine.running():
            yield engine, tenant_egress(settings)

    return make


def granted(egress: TenantEgress, network: bool | list[str] = True, conversation: str | None = None) -> EgressGrant:
    grant = egress.grant("default", network, conversation)
    assert grant is not None
    return grant


async def execute(engine: Engine, code: str, grant: EgressGrant | None, **fields: Any) -> ExecutionResult:
    """Run dedented ``code`` with network ``grant``; the wait is bounded."""
    request = ExecutionRequest(code=textwrap.dedent(code), timeout=30, egress=grant, **fields)
    with anyio.fail_after(90):
        return await engine.execute(request)


def audit_lines(engine: Engine) -> list[dict[str, Any]]:
    path = engine.settings.paths.state_dir / "logs" / "egress.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
