"""The conversations list: ``POST /conversations`` with the owner's token, for the playground.

The metadata index keeps conversations by key (a keyed hash of tenant and id), never their raw
ids, so the server cannot name them: the client says which ids it knows (``{"conversationIds":
[...]}``) and gets, for each that this tenant has, its times, file count and bytes from the index,
most recently used first, and ``others``, how many more conversations the tenant has. An id of
another tenant names a different conversation (the key differs), so it is never reached.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, request_response
from starlette.types import ASGIApp

from mcp_sandbox.errors import UnavailableError, ValidationError, WorkspaceError
from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.service import Service
from mcp_sandbox.workspace import check_conversation_id

__all__ = ["CONVERSATIONS_PATH", "MAX_IDS", "conversation_routes"]

CONVERSATIONS_PATH = "/conversations"
MAX_IDS = 100
_MAX_BODY = 64 << 10  # MAX_IDS ids of 256 characters, JSON-escaped, fit with room to spare
_HEADERS = {"Cache-Control": "no-store"}


def _problem(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=_HEADERS)


async def _body(request: Request) -> bytes:
    """The request's body, refused past ``_MAX_BODY`` bytes (declared or streamed).

    Raises:
        ValidationError: the body is too large.
    """
    too_large = ValidationError("body", f"is larger than {_MAX_BODY} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _MAX_BODY:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_BODY:
            raise too_large
    return bytes(body)


def _ids(body: bytes) -> list[str]:
    """The checked, distinct ``conversationIds`` of a JSON body, in their order.

    Raises:
        ValidationError: naming what was wrong.
    """
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ValidationError("body", 'is not JSON (expected {"conversationIds": [...]})') from None
    if not isinstance(parsed, dict) or set(parsed) != {"conversationIds"}:
        raise ValidationError("body", 'must be an object with one field, {"conversationIds": [...]}')
    ids = parsed["conversationIds"]
    if not isinstance(ids, list):
        raise ValidationError("conversationIds", "must be a list of conversation ids")
    if len(ids) > MAX_IDS:
        raise ValidationError("conversationIds", f"names {len(ids)} conversations; at most {MAX_IDS} at once")
    checked = []
    for index, value in enumerate(ids):
        try:
            checked.append(check_conversation_id(value))
        except ValidationError as exc:
            raise ValidationError(f"conversationIds[{index}]", exc.message) from None
    return list(dict.fromkeys(checked))


def _list(service: Service) -> Callable[[Request], Any]:
    async def listing(request: Request) -> Response:
        tenant = tenant_of(request)
        try:
            ids = _ids(await _body(request))
            rows = await service.storage.conversations_of(tenant)
        except ValidationError as exc:
            return _problem(400, str(exc))
        except UnavailableError:
            raise  # answered 503 by the app, with Retry-After
        except WorkspaceError as exc:
            return _problem(503, str(exc))
        except ClientDisconnect:
            return Response(status_code=400)
        named = {service.workspaces.key(tenant, conversation): conversation for conversation in ids}
        found = [
            {
                "conversationId": named[row.key],
                "created": row.created,
                "lastUsed": row.last_used,
                "files": row.files,
                "bytes": row.bytes,
            }
            for row in rows
            if row.key in named
        ]
        return JSONResponse({"conversations": found, "others": len(rows) - len(found)}, headers=_HEADERS)

    return listing


def conversation_routes(service: Service, guard: Callable[[ASGIApp], ASGIApp]) -> list[BaseRoute]:
    """The conversations list, behind ``guard`` (the bearer check)."""
    return [Route(CONVERSATIONS_PATH, endpoint=guard(request_response(_list(service))), methods=["POST"])]
