"""Static bearer tokens on HTTP: the 401 that says so, and no OAuth discovery that would mislead.

This server has no OAuth authorization server: its tokens are configured, not issued. So it
serves no RFC 9728 protected-resource metadata and its ``WWW-Authenticate`` challenge carries no
``resource_metadata``. A client that probes for OAuth anyway (Claude Code and mcp-use look for
``/.well-known/oauth-*`` and then try dynamic client registration at ``/register``) gets a 404
whose body is an OAuth-style JSON error saying what to do, which such clients show to the user
instead of failing on a body they cannot parse.
"""

from __future__ import annotations

import json

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BEARER_REQUIRED", "RequireBearer", "oauth_discovery_routes"]

BEARER_REQUIRED = "bearer token required"
_HINT = "this server takes a static token: send Authorization: Bearer <token>; it has no OAuth authorization server"


class RequireBearer:
    """Answer 401 ``WWW-Authenticate: Bearer`` unless the authentication middleware found a valid token."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(scope.get("user"), AuthenticatedUser):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": "invalid_token", "error_description": BEARER_REQUIRED}).encode()
        challenge = f'Bearer realm="mcp-sandbox", error="invalid_token", error_description="{BEARER_REQUIRED}"'
        response = Response(
            body, status_code=401, media_type="application/json", headers={"WWW-Authenticate": challenge}
        )
        await response(scope, receive, send)


async def _no_oauth(request: Request) -> Response:
    return JSONResponse({"error": "invalid_request", "error_description": f"{BEARER_REQUIRED}: {_HINT}"}, 404)


def oauth_discovery_routes() -> list[BaseRoute]:
    """JSON 404s where OAuth clients look for an authorization server (RFC 8414, 9728, 7591)."""
    return [
        Route("/.well-known/{path:path}", _no_oauth, methods=["GET"]),
        Route("/register", _no_oauth, methods=["POST"]),
    ]
