"""A run reaches a service on the host's loopback through the proxy when, and only when, the rules allow it.

The earlier code runner's ``network: true`` example fetched a local service. Its runs here get
``NO_PROXY=localhost,127.0.0.1,::1``, which sends those names to the sandbox's own loopback (where
nothing listens): unless ``egress_allow_private`` holds a loopback range and a pattern allows
``localhost``, which lets the proxy reach the host's, so the names go through the proxy there.
The test service is an HTTP server the test starts on the host's loopback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from mcp_test_helpers import hello_server

from .conftest import EgressEngine, audit_lines, execute, granted

pytestmark = [pytest.mark.anyio]

LOCALHOST = {"localhost": ["127.0.0.1"]}  # the proxy's resolver table knows only the tests' names


@pytest.fixture
def local_port() -> Iterator[int]:
    with hello_server("127.0.0.1", BODY.encode()) as port:
        yield port


PYTHON = """
import json, os, urllib.error, urllib.request
import requests

def by_urllib(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return [answer.status, answer.read().decode()]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode()]
    except OSError as error:
        return ["failed", str(getattr(error, "reason", error))]

def by_requests(url, **extra):
    try:
        answer = requests.get(url, timeout=10, **extra)
        return [answer.status_code, answer.text]
    except requests.RequestException as error:
        return ["failed", str(error)]

url = "http://localhost:{port}/"
proxy = os.environ["HTTP_PROXY"]
print(json.dumps({{
    "urllib": by_urllib(url),
    "requests": by_requests(url),
    "literal": by_requests("http://127.0.0.1:{port}/"),
    "through_proxy": by_requests(url, proxies={{"http": proxy}}),
}}))
"""

TYPESCRIPT = """
const answers: unknown[] = [];
for (const url of ["http://localhost:{port}/", "http://127.0.0.1:{port}/"]) {{
  try {{
    const answer = await fetch(url);
    answers.push([answer.status, await answer.text()]);
  }} catch (error) {{
    answers.push(["failed", String(error)]);
  }}
}}
console.log(JSON.stringify(answers));
"""

BODY = "hello from the host's loopback"
HELLO = [200, BODY]


def loopback_flags(port: int, allow: str = "localhost", private: str = "127.0.0.0/8") -> dict[str, str]:
    return {"egress_allow": allow, "egress_allow_private": private, "egress_ports": f"80,443,{port}"}


async def test_python_reaches_a_local_service_through_the_proxy_when_loopback_is_allowed(
    egress_engine: EgressEngine, local_port: int
) -> None:
    async with egress_engine(hosts=LOCALHOST, **loopback_flags(local_port)) as (engine, egress):
        result = await execute(engine, PYTHON.format(port=local_port), granted(egress))
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    assert answers == {"urllib": HELLO, "requests": HELLO, "literal": HELLO, "through_proxy": HELLO}
    lines = audit_lines(engine)
    assert {(line["host"], line["verdict"]) for line in lines} == {("localhost", "allowed"), ("127.0.0.1", "allowed")}


@pytest.mark.parametrize("js_runtime", ["bun", "deno"])
async def test_typescript_fetch_reaches_a_local_service_when_loopback_is_allowed(
    egress_engine: EgressEngine, local_port: int, js_runtime: str
) -> None:
    flags = {**loopback_flags(local_port), "js_runtime": js_runtime}
    async with egress_engine(hosts=LOCALHOST, **flags) as (engine, egress):
        code = TYPESCRIPT.format(port=local_port)
        result = await execute(engine, code, granted(egress), language="typescript")
    assert result.status == "success", result
    assert json.loads(result.stdout) == [HELLO, HELLO]


@pytest.mark.parametrize(
    ("allow", "private"),
    [("web.test", "127.0.0.0/8"), ("localhost", "10.0.0.0/8")],
    ids=["localhost-not-in-egress_allow", "loopback-not-in-egress_allow_private"],
)
async def test_without_the_allowance_a_local_service_is_not_reached(
    egress_engine: EgressEngine, local_port: int, allow: str, private: str
) -> None:
    async with egress_engine(hosts=LOCALHOST, **loopback_flags(local_port, allow, private)) as (engine, egress):
        result = await execute(engine, PYTHON.format(port=local_port), granted(egress))
    assert result.status == "success", result
    answers = json.loads(result.stdout)
    # As before: NO_PROXY keeps the names in the sandbox (no `localhost` there, nothing listening
    # on its loopback), or the client goes to the proxy anyway: then a 403 naming the rule.
    for how in ("urllib", "requests", "literal", "through_proxy"):
        outcome, text = answers[how]
        assert outcome == "failed" or (outcome == 403 and "(rule: egress_allow" in text), answers
    assert answers["through_proxy"][0] == 403, answers
    assert all(line["verdict"] == "refused" for line in audit_lines(engine))
