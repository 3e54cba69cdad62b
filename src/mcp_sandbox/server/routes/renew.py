"""Renewing download links: ``GET /files/renew?conversationId=…[&name=…]`` with the owner's token.

Download links expire (``url_ttl``, an hour by default); the earlier code runner's were permanent.
The owner of a conversation (the tenant whose bearer token asks) gets freshly signed links for
one file or for every file of it, as ``{"files": [{"name", "size", "url", "expires"}]}``. Another
tenant's conversation of the same id is a different conversation, so it is never reached. A
model renews links without this route: any run in the conversation returns fresh ``files`` links.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, request_response
from starlette.types import ASGIApp

from mcp_sandbox.errors import UnavailableError, ValidationError, WorkspaceError
from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.service import Service
from mcp_sandbox.server.urls import FILES_PATH
from mcp_sandbox.workspace import check_conversation_id, check_filename

__all__ = ["RENEW_PATH", "renew_routes"]

RENEW_PATH = FILES_PATH + "/renew"
_HEADERS = {"Cache-Control": "no-store"}


def _problem(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=_HEADERS)


def _renew(service: Service) -> Callable[[Request], Any]:
    async def renew(request: Request) -> Response:
        try:
            conversation = check_conversation_id(request.query_params.get("conversationId"))
            name = request.query_params.get("name")
            if name is not None:
                name = check_filename(name, "name")
            key = service.workspaces.key(tenant_of(request), conversation)
            listing = await service.storage.list_files(key)
        except ValidationError as exc:
            return _problem(400, str(exc))
        except UnavailableError:
            raise  # answered 503 by the app, with Retry-After
        except WorkspaceError as exc:
            return _problem(409, str(exc))
        files = [entry for entry in listing.files if name is None or entry.name == name]
        if name is not None and not files:
            return _problem(404, f"no file {name!r} in conversation {conversation!r}")
        now = time.time()
        expires = math.ceil(now + service.http_settings.url_ttl)
        renewed = [
            {
                "name": entry.name,
                "size": entry.size,
                "url": service.urls.file_url(key, entry.name, now),
                "expires": expires,
            }
            for entry in files
        ]
        return JSONResponse({"files": renewed}, headers=_HEADERS)

    return renew


def renew_routes(service: Service, guard: Callable[[ASGIApp], ASGIApp]) -> list[BaseRoute]:
    """The renewal route, behind ``guard`` (the bearer check)."""
    return [Route(RENEW_PATH, endpoint=guard(request_response(_renew(service))), methods=["GET"])]
