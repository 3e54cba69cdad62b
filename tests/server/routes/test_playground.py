"""The playground's routes on their own: the page with a fresh style nonce, its assets, and a clear 503 unbuilt."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
from starlette.applications import Starlette

from mcp_sandbox.server.routes.playground import page_policy, playground_routes

pytestmark = pytest.mark.anyio

PAGE = '<!doctype html><meta name="csp-nonce" content="__CSP_NONCE__"><script type="module" src="static/a.js"></script>'


def _client(static: Path) -> httpx2.AsyncClient:
    app = Starlette(routes=playground_routes(static))
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1")


async def test_an_unbuilt_playground_answers_503_naming_the_command(tmp_path: Path) -> None:
    async with _client(tmp_path / "static") as web:
        answer = await web.get("/")
    assert answer.status_code == 503
    assert "make web" in answer.text


async def test_each_page_gets_its_own_nonce_in_the_policy_and_the_page(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(PAGE)
    async with _client(tmp_path) as web:
        first, second = await web.get("/"), await web.get("/")
    nonces = []
    for answer in (first, second):
        assert answer.status_code == 200
        nonce = re.search(r"'nonce-([A-Za-z0-9_-]{20,})'", answer.headers["content-security-policy"])
        assert nonce is not None
        assert answer.headers["content-security-policy"] == page_policy(nonce.group(1))
        assert f'content="{nonce.group(1)}"' in answer.text and "__CSP_NONCE__" not in answer.text
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"
        nonces.append(nonce.group(1))
    assert nonces[0] != nonces[1]


async def test_assets_are_served_with_nosniff_and_nothing_outside_static(tmp_path: Path) -> None:
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text(PAGE)
    (static / "a.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("not served")
    async with _client(static) as web:
        script = await web.get("/static/a.js")
        outside = await web.get("/static/../secret.txt")
        encoded = await web.get("/static/%2e%2e/secret.txt")
    assert script.status_code == 200
    assert script.headers["x-content-type-options"] == "nosniff"
    assert script.headers["content-security-policy"].startswith("default-src 'none'")
    assert outside.status_code == 404 and encoded.status_code == 404
    assert "not served" not in outside.text + encoded.text
