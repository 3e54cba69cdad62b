"""``mcp-sandbox doctor``: which backends work here, what each enforces, the runtimes and the metadata index,
and the versions of the sandbox programs and the kernel, with the escape advisories that hit them."""

from __future__ import annotations

import http.server
import os
import platform
import re
import sys
import threading
from typing import TextIO

import anyio

from mcp_sandbox import __version__
from mcp_sandbox.bridge.discovery import discover
from mcp_sandbox.config import Settings
from mcp_sandbox.egress import EgressGrant, EgressRules, hosts_resolver
from mcp_sandbox.engine import ExecutionRequest
from mcp_sandbox.engine.disk import GROWING_SECONDS, WATCH_SECONDS, WRITE_GAP
from mcp_sandbox.engine.runtimes import js_binary
from mcp_sandbox.engine.startup import backend_for, engine_for, tenant_egress
from mcp_sandbox.errors import ConfigError, SandboxError
from mcp_sandbox.provision import FIX_COMMAND, js_status, python_status
from mcp_sandbox.provision.bundles import current_bundle
from mcp_sandbox.sandbox import gate
from mcp_sandbox.sandbox.backends import BackendProbe, available_backends
from mcp_sandbox.sandbox.host_versions import host_versions
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import check_tenant_uids
from mcp_sandbox.volume import IMAGE_FILE, VOLUME_DIR, can_reflink
from mcp_sandbox.workspace.database import describe_url, redact
from mcp_sandbox.workspace.schema import MIGRATIONS

__all__ = ["doctor"]

# A check run's timeout, the sandbox's start included: roomy, so a slow host is not reported as a
# broken runtime (a container starts in 10-30 s under emulation, `make vm-test`'s guest).
_CHECK_SECONDS = 180

_RUNTIME_CHECK = """
import importlib, sys
print("python", sys.version.split()[0])
for name in ("numpy", "pandas", "matplotlib", "requests"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:
        print(name, "MISSING:", type(error).__name__, error)
"""


def _report_backend(probe: BackendProbe, out: TextIO) -> None:
    state = "available" if probe.available else "UNAVAILABLE"
    out.write(f"\nbackend {probe.name}: {state}")
    out.write(f"  [{probe.version}]\n" if probe.version else "\n")
    if not probe.available:
        out.write(f"  reason: {probe.reason}\n")
    for capability in probe.capabilities:
        mark = "ok  " if capability.enforced else "WEAK"
        out.write(f"  {mark} {capability.name:<18} {capability.detail}\n")


def _report_gate(settings: Settings, out: TextIO) -> None:
    """Which program a bwrap sandbox's first process is (see ``sandbox/gate.py``)."""
    problem = gate.refusal(settings.paths.gate_dir)
    if problem is None:
        out.write(f"\nsandbox gate: {gate.built_path(settings.paths.gate_dir)}\n")
        return
    out.write(
        f"\nsandbox gate: sh and setpriv\n  SLOWER start: no gate of ours to run ({problem}), about 1.2 ms more "
        f"CPU per sandbox; run `{FIX_COMMAND}` (in a checkout: `make runtime`), with a C compiler installed\n"
    )


def _check_runtime(settings: Settings, out: TextIO) -> bool:
    out.write(f"\npython runtime: {settings.paths.python_runtime} ({settings.paths.python_interpreter})\n")
    status = python_status(settings.paths, settings.sandbox)
    if status.missing:
        out.write(f"  MISSING: {status.advice()}\n")
        return False
    if status.problem is not None:
        out.write(f"  OUT OF DATE: {status.advice()}\n")
    engine = engine_for(settings, backend_for(settings))
    try:
        result = anyio.run(engine.execute, ExecutionRequest(code=_RUNTIME_CHECK, timeout=_CHECK_SECONDS))
    except SandboxError as exc:
        out.write(f"  FAILED to start a sandbox: {exc}\n")
        return False
    for line in result.stdout.splitlines():
        out.write(f"  {line}\n")
    if result.status != "success":
        out.write(f"  FAILED: {result.error or result.stderr.strip()}\n")
        return False
    return "MISSING" not in result.stdout


def _check_js_runtime(settings: Settings, memory_cgroup: bool, out: TextIO) -> None:
    """Run TypeScript once on the configured runtime. Reported only: Python works without it."""
    binary = js_binary(settings.paths, settings.sandbox.js_runtime)
    out.write(f"\njavascript runtime: {settings.sandbox.js_runtime} ({binary})\n")
    status = js_status(settings.paths)
    if status.missing or not os.access(binary, os.X_OK):
        out.write(f"  MISSING: typescript/javascript runs fail; {status.advice()}\n")
        return
    if status.problem is not None:
        out.write(f"  OUT OF DATE: {status.advice()}\n")
    if current_bundle(settings.paths, settings.sandbox) is None:
        out.write(
            f"  SLOWER start: the runner is not bundled for these sources (2-3.5 ms more CPU per sandbox); "
            f"run `{FIX_COMMAND}` (in a checkout: `make runtime`)\n"
        )
    if not memory_cgroup:
        out.write("  WEAK memory limit: no memory cgroup here, only the runtime's heap limit (never RLIMIT_AS)\n")
    engine = engine_for(settings, backend_for(settings))
    request = ExecutionRequest(
        code="const n: number = 6 * 7;\nconsole.log(n);", timeout=_CHECK_SECONDS, language="typescript"
    )
    try:
        result = anyio.run(engine.execute, request)
    except SandboxError as exc:
        out.write(f"  FAILED to start a sandbox: {exc}\n")
        return
    ok = result.status == "success" and result.stdout == "42\n"
    out.write("  ok: ran TypeScript in a sandbox\n" if ok else f"  FAILED: {result.error or result.stderr.strip()}\n")


_EGRESS_NAME = "doctor.egress.invalid"
_EGRESS_CHECK = """
import urllib.error, urllib.request
print(urllib.request.urlopen("http://{name}:{port}/").read().decode())
try:
    urllib.request.urlopen("http://other.{name}:{port}/")
except urllib.error.HTTPError as error:
    print(error.code)
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"egress-ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _check_egress(settings: Settings, out: TextIO) -> None:
    """Run once with network through the egress proxy, to a server of the doctor's own on loopback."""
    try:
        summary = tenant_egress(settings).summary("default")
    except ConfigError as exc:
        out.write(f"\nnetwork: FAILED, the egress settings are wrong: {exc}\n")
        return
    out.write(f"\nnetwork (egress proxy): network: true reaches {summary}\n")
    for spec in settings.egress.secrets:  # a short hash of each value, never the value
        where = ", ".join(spec.hosts)
        out.write(f"  secret {spec.name} (tenant {spec.tenant}): {spec.header} to {where}, value {spec.value.digest}\n")
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello) as server:
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            rules = EgressRules.build([_EGRESS_NAME], [], [port], ["127.0.0.1/32"], "doctor: ")
            grant = EgressGrant(rules, tenant="doctor", max_bytes=1 << 20, max_connections=4)
            engine = engine_for(
                settings,
                backend_for(settings),
                egress_resolver=hosts_resolver({_EGRESS_NAME: ["127.0.0.1"]}),
            )
            code = _EGRESS_CHECK.format(name=_EGRESS_NAME, port=port)
            request = ExecutionRequest(code=code, timeout=_CHECK_SECONDS, egress=grant)
            result = anyio.run(engine.execute, request)
        except SandboxError as exc:
            out.write(f"  FAILED to start a sandbox with network: {exc}\n")
            return
        finally:
            server.shutdown()
    if result.status == "success" and result.stdout == "egress-ok\n403\n":
        out.write("  ok: a run reached an allowed host through the relay and the proxy; another was refused\n")
    else:
        out.write(f"  FAILED: {result.error or result.stderr.strip() or result.stdout.strip()}\n")


def _report_tenancy(settings: Settings, out: TextIO) -> None:
    """Say which downstream servers (code mode) tenants share: one process, its credentials and state."""
    servers = discover(settings.code_mode, settings.config_read or settings.config_file).servers
    if not servers:
        return
    out.write("code mode: downstream servers and who shares them\n")
    for alias, spec in servers.items():
        who = "every tenant" if spec.tenants is None else "tenants " + ", ".join(sorted(spec.tenants))
        shared = "one process shared: its credentials and any state it keeps are common to them"
        if spec.per_tenant is None and spec.tenants is None:
            how = "one process per tenant when the server has several (per_tenant not set)"
        else:
            how = "one process per tenant" if spec.separate(2) else shared
        out.write(f"  {alias}: {who}; {how}\n")


def _report_disk_quota(settings: Settings, out: TextIO) -> None:
    """Say how a conversation's quota is enforced here, and why not by a kernel quota (see engine/disk.py)."""
    out.write(
        f"conversation quota ({settings.workspaces.quota_bytes} bytes, {settings.workspaces.quota_files} entries):"
        " each file by the"
        " kernel (a run's RLIMIT_FSIZE is what the quota has left); in total by measuring the workspace when"
        f" inotify reports writes (at most every {WRITE_GAP:g} s), else every {GROWING_SECONDS:g} s while it"
        f" grows ({WATCH_SECONDS:g} s otherwise), and stopping the run: a run writing many files fast can pass"
        " it by what it writes between two measures (see docs/security.md, limits of the model)\n"
    )
    out.write(
        "  no kernel quota is used: project quotas need root, a filesystem mounted with them and a kernel"
        " built with quota formats (the development hosts' kernel refuses prjquota and XFS pquota mounts)\n"
    )


def _report_versions(out: TextIO) -> None:
    """The sandbox programs' and the kernel's versions, and a warning per escape advisory that hits one."""
    found = host_versions()
    shown = []
    for item in found:
        if item.shown is None:
            shown.append(f"{item.component} not installed")
            continue
        token = re.search(r"\d+\.\d+\S*", item.shown)
        text = f"{item.component} {token[0] if token else item.shown}"
        shown.append(text + (f" (package {item.package})" if item.package else ""))
    out.write(f"versions: {', '.join(shown)}\n")
    warned = False
    for item in found:
        for advisory in item.advisories:
            warned = True
            out.write(f"  WARNING {item.component}: {advisory.ids}, fixed in {advisory.fixed_in}: {advisory.what}\n")
    if warned:
        out.write(
            "  (a distribution's patched build may carry a fix under an older version: check its security"
            " tracker; see docs/security.md, the host's escape history)\n"
        )


def _report_tenant_uids(settings: Settings, out: TextIO) -> None:
    """Whether tenants share one host uid, and with it the kernel's per-user counters."""
    shared = "tenants share one host uid and its per-user kernel counters (inotify, pipe buffers, processes)"
    if os.geteuid() != 0:
        out.write(f"tenant uids: {shared}: the server is not root, so it cannot give each its own\n")
        return
    if not settings.sandbox.tenant_uids:
        out.write(f"tenant uids: {shared}: tenant_uid_range is off\n")
        return
    try:
        check_tenant_uids(settings.sandbox, settings.tenant_count)
    except ConfigError as exc:
        out.write(f"tenant uids: refused, the server will not start: {exc}\n")
        return
    out.write(
        f"tenant uids: each tenant but `default` runs as its own host uid of {settings.sandbox.tenant_uid_range} "
        f"(`default`: {settings.sandbox.sandbox_uid})\n"
    )


def _report_metadata(settings: Settings, out: TextIO) -> bool:
    """Say where the metadata index is, whether it answers and its schema version; never create it."""
    url, known = settings.replicas.database_url, len(MIGRATIONS)
    try:
        if url is None:
            from mcp_sandbox.workspace.sqlite_db import read_version as read_sqlite

            path = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).metadata
            out.write(f"metadata index: SQLite {path}")
            if not path.exists():
                out.write(" (made at the first start)\n")
                return True
            version = read_sqlite(path)
        else:
            from mcp_sandbox.workspace.postgres_db import read_version as read_postgres

            out.write(f"metadata index: PostgreSQL {describe_url(url)}")
            version = read_postgres(url)
    except Exception as exc:  # the driver's errors, or sqlite3's: reported, never raised
        out.write(f"\n  FAILED: cannot be reached or read: {redact(' '.join(str(exc).split()), url)}\n")
        return False
    out.write(f", reachable, schema version {version} of {known}" if url else f", schema version {version} of {known}")
    if version > known:
        out.write("\n  FAILED: written by a newer mcp-sandbox; the server will refuse it\n")
        return False
    out.write(" (migrated at the next start)\n" if version < known else "\n")
    return True


def _report_replicas(settings: Settings, out: TextIO) -> None:
    """Where the other replicas reach this one, and whether ``/internal/`` has a port of its own."""
    http = settings.http
    if settings.replicas.replica_url is None:
        return
    out.write(f"replica: reached by the others at {settings.replicas.replica_url}")
    if http.internal_port is None:
        out.write(
            "\n  WARNING: no internal_port: the public port serves the replicas' /internal/ route too;"
            " set internal_port (and internal_cert for TLS), or keep /internal/ off the balancer\n"
        )
        return
    tls = "mutual TLS" if http.internal_cert and http.replica_ca and http.internal_verify_clients else "TLS"
    kind = tls if http.internal_cert else "plain HTTP"
    out.write(f"; /internal/ on port {http.internal_port} only ({kind})\n")


def _report_forks(settings: Settings, out: TextIO) -> None:
    """Whether a fork shares its source's blocks (reflinks) or copies every byte (see ``volume.py``)."""
    root = settings.paths.state_dir
    size = settings.workspaces.volume_bytes
    if size:
        mounted = os.path.ismount(root / VOLUME_DIR)
        out.write(
            f"forks: reflinked, on the XFS volume {root / IMAGE_FILE} ({size} bytes, "
            f"{'mounted' if mounted else 'mounted at the next start'})\n"
        )
        if os.geteuid() != 0:
            out.write("  FAILED: workspaces.volume_bytes needs the server to run as root\n")
        return
    place = next((path for path in (root, *root.parents) if path.is_dir()), root)
    if can_reflink(place):
        out.write("forks: reflinked (the state directory's filesystem shares blocks)\n")
        return
    out.write("forks: COPIED, every byte: the state directory's filesystem has no reflinks")
    if os.geteuid() == 0:
        out.write("; set workspaces.volume_bytes for a reflink volume (needs xfsprogs)\n")
    else:
        out.write("; a reflink volume needs the server to run as root\n")


def doctor(settings: Settings, out: TextIO) -> int:
    """Print the report; return 0 when the configured backend works, else 1."""
    out.write(f"mcp-sandbox {__version__} on {platform.platform()}, Python {sys.version.split()[0]}\n")
    out.write(f"server uid {os.geteuid()}; sandbox host uid ")
    out.write(f"{settings.sandbox.sandbox_uid}\n" if os.geteuid() == 0 else "the server's own (not root)\n")
    _report_versions(out)
    _report_tenant_uids(settings, out)
    out.write(f"state dir: {settings.paths.state_dir}\n")
    _report_forks(settings, out)
    metadata_ok = _report_metadata(settings, out)
    _report_replicas(settings, out)
    probes = available_backends(
        sandbox=settings.sandbox,
        paths=settings.paths,
        limits=settings.limits,
        layout=StateLayout.of(settings.paths, settings.sandbox, settings.workspaces),
    )
    for probe in probes:
        _report_backend(probe, out)
    configured = next((p for p in probes if p.name == settings.sandbox.backend), None)
    if configured is None or not configured.available:
        out.write(f"\nconfigured backend {settings.sandbox.backend!r} does not work here\n")
        return 1
    if settings.sandbox.backend == "bwrap":
        _report_gate(settings, out)
    runtime_ok = _check_runtime(settings, out)
    _report_tenancy(settings, out)
    _report_disk_quota(settings, out)
    memory = next((c for c in configured.capabilities if c.name.startswith("memory")), None)
    _check_js_runtime(settings, memory is not None and memory.enforced, out)
    _check_egress(settings, out)
    weak = configured.missing()
    if weak and not settings.sandbox.accept_weaker_isolation:
        out.write(
            "\nthe server will refuse to start: the policy cannot be fully enforced here "
            "(or start it with --accept-weaker-isolation)\n"
        )
        return 1
    return 0 if runtime_ok and metadata_ok else 1
