"""Controlled network, attacked for real: sandboxes reach test hosts only through the egress proxy, as its rules say.

Each test runs code in a real sandbox granted network; the proxy resolves the test names to the
test host in its own network namespace (see conftest.py). Refusals are checked by their rule
(the 403's body and the audit line), never by prose.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from mcp_sandbox.egress.audit import LINES_PER_RUN
from mcp_sandbox.server.metrics import Metrics

from .conftest import EgressEngine, HostNet, audit_lines, execute, granted

pytestmark = [pytest.mark.anyio]

ALLOW = "web.test,*.web.test"


def private(test_net: HostNet) -> str:
    return f"{test_net.address}/32"


FETCH = """
import http.client, json, ssl, urllib.error, urllib.request
def fetch(url, **extra):
    context = ssl.create_default_context(cadata={ca!r})
    try:
        with urllib.request.urlopen(url, timeout=10, context=context, **extra) as answer:
            return [answer.status, answer.read().decode()]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode()]
    except (OSError, http.client.HTTPException) as error:
        return ["failed", str(getattr(error, "reason", error))]
"""


def fetching(test_net: HostNet, body: str) -> str:
    return FETCH.format(ca=test_net.ca) + textwrap.dedent(body)


async def test_an_allowed_name_is_reached_over_http_and_https_from_python(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    async with egress_engine(egress_allow=ALLOW, egress_allow_private=private(test_net)) as (engine, egress):
        result = await execute(
            engine,
            fetching(test_net, 'print(json.dumps([fetch("http://web.test/"), fetch("https://api.web.test/")]))'),
            granted(egress),
        )
    assert result.status == "success", result
    assert json.loads(result.stdout) == [[200, "hello from web.test"], [200, "hello from api.web.test"]]
    lines = audit_lines(engine)
    assert {(line["host"], line["port"], line["verdict"]) for line in lines} == {
        ("web.test", 80, "allowed"),
        ("api.web.test", 443, "allowed"),
    }
    assert all(line["address"] == test_net.address and line["received"] > 0 for line in lines)


@pytest.mark.parametrize("backend", ["podman", "docker"])
async def test_container_backends_reach_an_allowed_name_through_the_proxy(
    egress_engine: EgressEngine, test_net: HostNet, backend: str
) -> None:
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net)}
    async with egress_engine(backend, **flags) as (engine, egress):
        code = 'print(json.dumps([fetch("https://web.test/"), fetch("http://other.test/")[0]]))'
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    assert json.loads(result.stdout) == [[200, "hello from web.test"], 403]


@pytest.mark.parametrize("js_runtime", ["bun", "deno"])
async def test_a_typescript_run_ends_while_its_fetch_keeps_a_connection_open(
    egress_engine: EgressEngine, test_net: HostNet, js_runtime: str
) -> None:
    # bun's fetch pools the connection (through the relay) for a next request: that idle
    # connection must not keep the finished run alive until its timeout.
    ca = json.dumps(test_net.ca)
    options = (
        f"{{ tls: {{ ca: {ca} }} }}"
        if js_runtime == "bun"
        else f"{{ client: Deno.createHttpClient({{ caCerts: [{ca}] }}) }}"
    )
    code = f"""
        const answer = await fetch("https://api.web.test/keep-alive", {options});
        console.log(answer.status, await answer.text());
    """
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net), "js_runtime": js_runtime}
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, code, granted(egress), language="typescript")
    assert (result.status, result.stdout) == ("success", "200 hello from api.web.test\n"), result


@pytest.mark.parametrize("backend", ["bwrap", "podman", "docker"])
@pytest.mark.parametrize("js_runtime", ["bun", "deno"])
async def test_an_allowed_name_is_reached_from_typescript(
    egress_engine: EgressEngine, test_net: HostNet, js_runtime: str, backend: str
) -> None:
    ca = json.dumps(test_net.ca)
    options = (
        f"{{ tls: {{ ca: {ca} }} }}"
        if js_runtime == "bun"
        else f"{{ client: Deno.createHttpClient({{ caCerts: [{ca}] }}) }}"
    )
    code = f"""
        const plain = await fetch("http://web.test/");
        const secure = await fetch("https://api.web.test/", {options});
        const refused = await fetch("http://other.test/");
        console.log(JSON.stringify([plain.status, await plain.text(), secure.status, await secure.text(),
          refused.status, await refused.text()]));
    """
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net), "js_runtime": js_runtime}
    async with egress_engine(backend, **flags) as (engine, egress):
        result = await execute(engine, code, granted(egress), language="typescript")
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    assert answers[:4] == [200, "hello from web.test", 200, "hello from api.web.test"]
    assert answers[4] == 403
    assert "(rule: egress_allow)" in answers[5]


async def test_names_not_allowed_or_denied_get_a_403_naming_the_rule(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    flags = {"egress_allow": ALLOW, "egress_deny": "denied.web.test", "egress_allow_private": private(test_net)}
    code = 'print(json.dumps([fetch("http://other.test/"), fetch("http://denied.web.test/"), fetch("https://other.test/")]))'
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    plain, denied, tunnel = json.loads(result.stdout)
    assert plain[0] == 403 and plain[1].endswith("(rule: egress_allow)\n")
    assert denied[0] == 403 and denied[1].endswith("(rule: egress_deny)\n")
    assert tunnel[0] == "failed" and "403" in tunnel[1]  # urllib reports the CONNECT's 403 this way
    rules = sorted((line["host"], line["rule"]) for line in audit_lines(engine) if line["verdict"] == "refused")
    assert rules == [("denied.web.test", "egress_deny"), ("other.test", "egress_allow"), ("other.test", "egress_allow")]
    # Refused names were never resolved: no address in their lines.
    assert all(line["address"] is None for line in audit_lines(engine))


async def test_an_allowed_name_resolving_to_a_private_address_is_refused_unless_its_range_is_allowed(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    code = 'print(json.dumps(fetch("http://web.test/")))'
    async with egress_engine(egress_allow=ALLOW) as (engine, egress):
        refused = await execute(engine, fetching(test_net, code), granted(egress))
    assert refused.status == "success", refused
    status, body = json.loads(refused.stdout)
    assert status == 403 and body.endswith("(rule: egress_allow_private)\n")
    async with egress_engine(egress_allow=ALLOW, egress_allow_private="10.0.0.0/8") as (engine, egress):
        allowed = await execute(engine, fetching(test_net, code), granted(egress))
    assert json.loads(allowed.stdout) == [200, "hello from web.test"]


async def test_a_host_given_as_an_ip_address_is_refused_unless_its_range_is_allowed(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    code = f'print(json.dumps(fetch("http://{test_net.address}/")))'
    async with egress_engine(egress_allow="*") as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    status, body = json.loads(result.stdout)
    assert status == 403 and body.endswith("(rule: ip_literal)\n")


async def test_a_list_of_patterns_narrows_what_the_run_reaches(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = 'print(json.dumps([fetch("http://api.web.test/")[0], fetch("http://web.test/")[0]]))'
    async with egress_engine(egress_allow=ALLOW, egress_allow_private=private(test_net)) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress, ["api.web.test"]))
    assert json.loads(result.stdout) == [200, 403]


RAW = """
import json, socket, ssl
def proxy(request, then=None):
    connection = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    connection.sendall(request)
    answer = connection.recv(4096)
    if then is not None:
        try:
            answer += then(connection)
        except (OSError, ssl.SSLError) as error:
            answer += f" then {type(error).__name__}".encode()
    connection.close()
    return answer.decode("latin-1")
"""


async def test_hostile_proxy_requests_are_refused(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = (
        RAW
        + f"""
def other_name(connection):
    context = ssl.create_default_context(cadata={test_net.ca!r})
    with context.wrap_socket(connection, server_hostname="other.test") as tls:  # a name the cert also holds
        tls.sendall(b"GET / HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
        return tls.recv(4096)
def plain(connection):
    connection.sendall(b"GET / HTTP/1.1\\r\\nHost: web.test\\r\\n\\r\\n")
    return connection.recv(4096)
print(json.dumps({{
    "nul": proxy(b"CONNECT web.test\\x00.other.test:443 HTTP/1.1\\r\\n\\r\\n"),
    "control": proxy(b"GET http://web.test\\x01/ HTTP/1.1\\r\\n\\r\\n"),
    "percent": proxy(b"CONNECT web.test%00.other.test:443 HTTP/1.1\\r\\n\\r\\n"),
    "port": proxy(b"CONNECT web.test:22 HTTP/1.1\\r\\n\\r\\n"),
    "loopback": proxy(b"CONNECT 127.0.0.1:3128 HTTP/1.1\\r\\n\\r\\n"),
    "sni": proxy(b"CONNECT web.test:443 HTTP/1.1\\r\\n\\r\\n", other_name),
    "not_tls": proxy(b"CONNECT web.test:443 HTTP/1.1\\r\\n\\r\\n", plain),
    "userinfo": proxy(b"GET http://user:pw@web.test/ HTTP/1.1\\r\\n\\r\\n"),
}}))
"""
    )
    async with egress_engine(egress_allow=ALLOW, egress_allow_private=private(test_net)) as (engine, egress):
        result = await execute(engine, code, granted(egress))
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    assert answers["nul"].startswith("HTTP/1.1 400")
    assert answers["control"].startswith("HTTP/1.1 400")
    assert answers["percent"].startswith("HTTP/1.1 403") and "(rule: host_syntax)" in answers["percent"]
    assert answers["port"].startswith("HTTP/1.1 403") and "(rule: egress_ports)" in answers["port"]
    assert answers["loopback"].startswith("HTTP/1.1 403") and "(rule: egress_ports)" in answers["loopback"]
    assert answers["userinfo"].startswith("HTTP/1.1 400")
    for name in ("sni", "not_tls"):  # the tunnel opened, then closed before anything reached the host
        assert answers[name].startswith("HTTP/1.1 200"), answers[name]
        assert "hello from" not in answers[name]
    refused = {line["rule"] for line in audit_lines(engine) if line["verdict"] == "refused"}
    assert {"tls_sni", "tls_required", "host_syntax", "egress_ports"} <= refused


async def test_a_connect_to_the_servers_own_address_is_refused_even_where_loopback_is_allowed(
    egress_engine: EgressEngine,
) -> None:
    flags = {"egress_allow": "*", "egress_allow_private": "127.0.0.0/8", "egress_ports": "80,443,8765", "port": 8765}
    code = RAW + 'print(proxy(b"CONNECT 127.0.0.1:8765 HTTP/1.1\\r\\n\\r\\n"))'
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, code, granted(egress))
    assert result.stdout.startswith("HTTP/1.1 403"), result
    assert "(rule: proxy_itself)" in result.stdout


async def test_a_program_that_ignores_the_proxy_reaches_nothing(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = f"""
        import errno, json, socket
        out = {{}}
        def attempt(name, action):
            try:
                action()
                out[name] = "ok"
            except OSError as error:
                known = error.errno is not None and error.errno > 0
                out[name] = errno.errorcode[error.errno] if known else type(error).__name__
        attempt("tcp", lambda: socket.create_connection(("{test_net.address}", 80), timeout=3))
        attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
        attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
        attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
        attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
        attempt("dns", lambda: socket.getaddrinfo("web.test", 80))
        out["interfaces"] = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
        print(json.dumps(out))
    """
    async with egress_engine(egress_allow=ALLOW, egress_allow_private=private(test_net)) as (engine, egress):
        result = await execute(engine, code, granted(egress))
    assert result.status == "success", result.stderr
    out = json.loads(result.stdout)
    assert out.pop("interfaces") == ["lo"]
    assert out["tcp"] == "ENETUNREACH"
    assert out["udp"] == out["udp6"] == out["raw"] == "EPROTONOSUPPORT"
    assert out["packet"] == out["netlink"] == "EAFNOSUPPORT"
    assert out["dns"] == "gaierror"
    assert audit_lines(engine) == []  # nothing of it reached the proxy either


async def test_the_byte_cap_ends_a_download(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = 'result = fetch("http://web.test/big")\nprint(json.dumps([result[0], len(result[1])]))'
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net), "egress_max_bytes": "256k"}
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    status, size = json.loads(result.stdout)
    assert status == "failed" or size < 4 << 20  # cut: an error, or a short body
    (line,) = audit_lines(engine)
    assert (line["verdict"], line["rule"]) == ("cut", "egress_max_bytes")
    assert line["received"] <= 256 << 10


async def test_the_connection_cap_refuses_connections_past_it(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = 'print(json.dumps([fetch("http://web.test/")[0] for _ in range(5)]))'
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net), "egress_max_connections": 2}
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert json.loads(result.stdout) == [200, 200, 403, "failed", "failed"]
    lines = audit_lines(engine)  # past the cap, one line only: a run cannot flood the log
    # An allowed connection's line is written when it closes, so it may follow the refusal.
    assert sorted(line["rule"] for line in lines) == ["egress_allow", "egress_allow", "egress_max_connections"]


async def test_a_run_writes_a_bounded_number_of_audit_lines_and_sums_the_rest(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    code = """
        refused = [fetch(f"http://other.test/{index}")[0] for index in range(LINES + 8)]
        print(json.dumps([refused.count(403), fetch("http://web.test/")[0]]))
    """.replace("LINES", str(LINES_PER_RUN))
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net)}
    async with egress_engine(**flags) as (engine, egress):
        result = await execute(engine, fetching(test_net, code), granted(egress, conversation="conv-9"))
        assert json.loads(result.stdout) == [LINES_PER_RUN + 8, 200]  # refusing and serving go on past the cap
        lines = audit_lines(engine)
        assert len(lines) == LINES_PER_RUN + 1
        assert all(line["verdict"] == "refused" for line in lines[:LINES_PER_RUN])
        assert lines[-1]["unlogged"] == {"allowed": 1, "refused": 8}
        assert (lines[-1]["tenant"], lines[-1]["conversation"], lines[-1]["run"]) == (
            "default",
            "conv-9",
            lines[0]["run"],
        )
        again = await execute(engine, fetching(test_net, 'print(fetch("http://web.test/")[0])'), granted(egress))
        assert again.stdout == "200\n"  # the next run has lines of its own
        assert audit_lines(engine)[-1]["verdict"] == "allowed"


async def test_audit_lines_name_the_run_and_hold_no_secret(egress_engine: EgressEngine, test_net: HostNet) -> None:
    code = """
        headers = {"Authorization": "Bearer SECRET-HEADER-7f3a"}
        fetch(urllib.request.Request("http://web.test/?token=SECRET-QUERY-91bc", headers=headers))
        fetch(urllib.request.Request("https://api.web.test/SECRET-PATH-55de", headers=headers))
        fetch("http://other.test/SECRET-REFUSED-0a0a")
    """
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net)}
    async with egress_engine(**flags) as (engine, egress):
        grant = granted(egress, conversation="conv-1")
        result = await execute(engine, fetching(test_net, code), grant)
    assert result.status == "success", result
    text = (engine.settings.paths.state_dir / "logs" / "egress.log").read_text()
    assert "SECRET" not in text
    lines = audit_lines(engine)
    assert len(lines) == 3
    expected = {"time", "tenant", "conversation", "run", "host", "port", "address", "sent", "received", "verdict"}
    for line in lines:
        assert set(line) == expected | {"rule", "method"}
        assert (line["tenant"], line["conversation"]) == ("default", "conv-1")
    assert len({line["run"] for line in lines}) == 1
    assert (engine.settings.paths.state_dir / "logs" / "egress.log").stat().st_mode & 0o777 == 0o600


async def test_a_session_gets_network_for_its_granted_runs_only_and_keeps_its_variables(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    flags = {"egress_allow": ALLOW, "egress_allow_private": private(test_net)}
    probe = 'print(json.dumps([kept, fetch("http://web.test/")[0], "HTTPS_PROXY" in os.environ]))'
    async with egress_engine(**flags) as (engine, egress):
        first = await execute(engine, fetching(test_net, "import os\nkept = 41"), None, session="s")
        without = await execute(engine, "kept += 1\n" + probe, None, session="s")
        granted_run = await execute(engine, "kept += 1\n" + probe, granted(egress), session="s")
        after = await execute(engine, "kept += 1\n" + probe, None, session="s")
    assert (first.session, without.session, granted_run.session, after.session) == ("new", "kept", "kept", "kept")
    assert json.loads(without.stdout) == [42, "failed", False]
    assert json.loads(granted_run.stdout) == [43, 200, True]
    assert json.loads(after.stdout) == [44, "failed", False]


async def test_the_metrics_count_each_connection_by_verdict_and_rule_and_its_bytes(
    egress_engine: EgressEngine, test_net: HostNet
) -> None:
    flags = {"egress_allow": ALLOW, "egress_deny": "denied.web.test", "egress_allow_private": private(test_net)}
    code = 'print(json.dumps([fetch("http://web.test/"), fetch("http://denied.web.test/")]))'
    metrics = Metrics(dict, dict)
    async with egress_engine(**flags) as (engine, egress):
        engine.events.subscribe(metrics.observe)
        result = await execute(engine, fetching(test_net, code), granted(egress))
    assert result.status == "success", result
    assert [answer[0] for answer in json.loads(result.stdout)] == [200, 403]
    text = metrics.render().decode()
    counted = r'mcp_sandbox_egress_connections_total\{rule="%s",tenant="default",verdict="%s"\} 1\.0'
    assert re.search(counted % ("egress_allow", "allowed"), text), text
    assert re.search(counted % ("egress_deny", "refused"), text), text
    received = re.search(r'mcp_sandbox_egress_bytes_total\{direction="in"\} (\S+)', text)
    assert received is not None and float(received.group(1)) > len("hello from web.test"), text
