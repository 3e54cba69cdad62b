"""The web playground at ``/``: a page and its bundled assets, served from the package's ``static/``.

The page is one more MCP client: it holds no secret (it asks for the token and keeps it in the
browser's session storage), loads nothing from another host, and talks to ``/mcp`` and
``/upload`` with the bearer token like any client. The assets are built from ``web/`` by
``make web`` (esbuild, CodeMirror 6) into ``static/``, which the wheel ships as package data.

A strict Content-Security-Policy keeps it that way: scripts only from this origin and no inline
script, nothing fetched from elsewhere, no framing. Style elements need a nonce, fresh for each
page: the editor (CodeMirror) makes its style sheets at run time and tags them with it.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["STATIC_DIR", "page_policy", "playground_routes"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"  # server/static: the Makefile and package-data name it
STATIC_PATH = "/static"

_NONCE_PLACEHOLDER = "__CSP_NONCE__"
_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# The script and the style sheet are not documents: nothing in them may load anything.
_STATIC_HEADERS = {**_COMMON_HEADERS, "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'"}


def page_policy(nonce: str) -> str:
    """The page's Content-Security-Policy, with the style nonce of this response."""
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            f"style-src 'self' 'nonce-{nonce}'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


_NOT_BUILT = (
    "The playground is not built into this installation: run `make web` in the repository "
    "(it bundles web/ into src/mcp_sandbox/server/static/).\n"
)


class _SecurityHeaders:
    """Add the static files' security headers to every response of ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [
                    (name.lower().encode(), value.encode())
                    for name, value in _STATIC_HEADERS.items()
                    if name.lower().encode() not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, with_headers)


def playground_routes(static_dir: Path = STATIC_DIR) -> list[BaseRoute]:
    """``GET /`` (the page) and ``/static/...`` (its script and style sheet)."""
    index = static_dir / "index.html"
    if not index.is_file():
        logger.warning("the web playground is not built (%s is missing): `GET /` answers 503; run `make web`", index)

    async def page(request: Request) -> Response:
        try:
            html = (await anyio.Path(index).read_text(encoding="utf-8")) if index.is_file() else None
        except OSError:
            html = None
        if html is None:
            return PlainTextResponse(_NOT_BUILT, status_code=503, headers=_STATIC_HEADERS)
        nonce = secrets.token_urlsafe(18)
        headers = {
            **_COMMON_HEADERS,
            "Content-Security-Policy": page_policy(nonce),
            "Cache-Control": "no-store",
        }
        return HTMLResponse(html.replace(_NONCE_PLACEHOLDER, nonce), headers=headers)

    return [
        Route("/", endpoint=page, methods=["GET", "HEAD"]),
        Mount(STATIC_PATH, app=_SecurityHeaders(StaticFiles(directory=static_dir, check_dir=False))),
    ]
