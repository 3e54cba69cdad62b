"""A web page rebinding its name to a tokenless loopback server (issue 35, items 5 and 6).

Every route refuses a foreign ``Host`` (421) or ``Origin`` (403), the file links and their
renewal too; the names the server is reached by (loopback, ``public_url``) still work; health
answers any Host, metrics needs its token. Forged download links, which anyone can send, are
counted and summed into the audit log, not written a line each.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, http_server, new_conversation, upload

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

PUBLIC = "sandbox.example.test"
METRICS = "metrics-token-0123456789abcdef"
FOREIGN = "rebound.example"
FORGED = 2000


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    path = module_state_dir.parent / f"hosts-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(
        textwrap.dedent(f"""
        public_url = "https://{PUBLIC}"
        metrics_token = "{METRICS}"
        pool_size = 1
        pool_min = 0
        pool_preload = []
        """)
    )
    return path


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def _stored_file(base: str) -> tuple[str, str]:
    """A file of the default tenant: its conversation and its download link's path."""
    conversation = new_conversation()
    stored = await upload(base, None, conversation, "secret.txt", b"the default tenant's file")  # type: ignore[arg-type]
    assert stored.status_code == 201, stored.text
    url = stored.json()["files"][0]["url"]
    assert url.startswith(f"https://{PUBLIC}/files/")
    return conversation, urlsplit(url).path


async def test_every_route_refuses_a_foreign_host_and_a_foreign_origin(base: str) -> None:
    conversation, link = await _stored_file(base)
    mcp_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    requests = [
        ("GET", "/", {}),
        ("GET", "/static/playground.css", {}),
        ("POST", "/mcp", {"json": mcp_body}),
        ("GET", "/sse", {}),
        ("POST", "/messages/?session_id=0123", {"json": mcp_body}),
        ("POST", f"/upload?conversationId={conversation}&filename=planted.txt", {"content": b"x"}),
        ("GET", f"/files/renew?conversationId={conversation}", {}),
        ("POST", "/conversations", {"json": {"conversationIds": [conversation]}}),
        ("GET", link, {}),
        ("HEAD", link, {}),
        ("GET", "/.well-known/oauth-protected-resource", {}),
        ("POST", "/register", {"json": {}}),
        ("GET", "/no-such-route", {}),
    ]
    port = urlsplit(base).port
    async with httpx2.AsyncClient(base_url=base, timeout=CALL_BOUND) as web:
        for method, path, extra in requests:
            for host in (FOREIGN, f"{FOREIGN}:{port}"):
                refused = await web.request(method, path, headers={"Host": host}, **extra)  # type: ignore[arg-type]
                assert refused.status_code == 421, (method, path, host, refused.status_code)
                assert b"the default tenant" not in refused.content
            origin = await web.request(method, path, headers={"Origin": f"http://{FOREIGN}"}, **extra)  # type: ignore[arg-type]
            assert origin.status_code == 403, (method, path, origin.status_code)
        listing = await web.get("/files/renew", params={"conversationId": conversation})
        assert [entry["name"] for entry in listing.json()["files"]] == ["secret.txt"]  # nothing was planted


async def test_the_names_the_server_is_reached_by_still_work(base: str) -> None:
    conversation, link = await _stored_file(base)
    port = urlsplit(base).port
    async with httpx2.AsyncClient(base_url=base, timeout=CALL_BOUND) as web:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", PUBLIC):
            headers = {"Host": host}
            assert (await web.get(link, headers=headers)).content == b"the default tenant's file", host
            renewed = await web.get("/files/renew", params={"conversationId": conversation}, headers=headers)
            assert renewed.status_code == 200, (host, renewed.text)
            assert (await web.get("/", headers=headers)).status_code == 200, host
            listed = await web.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={**headers, "Accept": "application/json, text/event-stream"},
            )
            assert listed.status_code == 200, (host, listed.text)
        same_origin = await web.get(link, headers={"Origin": f"https://{PUBLIC}", "Host": PUBLIC})
        assert same_origin.status_code == 200


async def test_health_answers_any_host_and_metrics_still_needs_its_token(base: str) -> None:
    async with httpx2.AsyncClient(base_url=base, timeout=CALL_BOUND) as web:
        pod_address = {"Host": "10.1.2.3:8080"}
        health = await web.get("/healthz", headers=pod_address)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = await web.get("/readyz", headers=pod_address)
        assert ready.status_code in (200, 503) and set(ready.json()) == {"status"}
        assert (await web.get("/metrics", headers=pod_address)).status_code == 401
        scraped = await web.get("/metrics", headers={**pod_address, "Authorization": f"Bearer {METRICS}"})
        assert scraped.status_code == 200 and "mcp_sandbox_downloads_total" in scraped.text


def _audit(state: Path) -> list[dict[str, object]]:
    lines: list[dict[str, object]] = []
    for path in sorted((state / "logs").glob("audit.jsonl*")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


async def _refused_downloads(web: httpx2.AsyncClient) -> float:
    text = (await web.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"})).text
    for line in text.splitlines():
        if line.startswith('mcp_sandbox_downloads_total{outcome="invalid"} '):
            return float(line.split()[-1])
    return 0.0


async def test_a_burst_of_forged_links_is_counted_and_summed_not_logged_a_line_each(
    state_dir: Path, sandbox_runtime: Path | None, config: Path
) -> None:
    async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        conversation, link = await _stored_file(url)
        parts = link.split("/")  # /files/<key>/<expires>/<signature>/<name>
        async with httpx2.AsyncClient(base_url=url, timeout=CALL_BOUND) as web:
            sent = 0

            async def forge(worker: int) -> None:
                nonlocal sent
                for index in range(worker, FORGED, 20):
                    forged = "/".join([*parts[:4], f"f.{index:064x}"[: len(parts[4])], parts[5]])
                    assert (await web.get(forged)).status_code == 403
                    sent += 1

            with anyio.fail_after(CALL_BOUND * 4):
                async with anyio.create_task_group() as group:
                    for worker in range(20):
                        group.start_soon(forge, worker)
            assert sent == FORGED
            assert await _refused_downloads(web) == FORGED
            during = [line for line in _audit(state_dir) if str(line["event"]).startswith("download")]
            assert len(during) <= 2, during  # the burst's first refusal, and perhaps one summary
            assert (await web.get(link)).status_code == 200  # a genuine download is still audited one by one
            genuine = [line for line in _audit(state_dir) if line["event"] == "download"]
            assert len(genuine) == 1 and genuine[0]["outcome"] == "ok" and genuine[0]["size"] == 25
    lines = _audit(state_dir)
    summaries = [line for line in lines if line["event"] == "download_refused"]
    assert sum(int(str(line["count"])) for line in summaries) == FORGED
    assert len(summaries) <= 3 and all(line["outcome"] == "invalid" for line in summaries)
    assert conversation not in json.dumps(summaries)
