"""``/healthz`` (the process answers) and ``/readyz`` (it can serve runs), unauthenticated.

Both answer a bare ``{"status": ...}`` and nothing else: no version, no backend name, no
counts, so an unauthenticated caller learns only up or down. ``/readyz`` is 200 when the
backend passed its probe at start (the server does not start otherwise), the warm pool has a
sandbox up (when there is a pool to have), and the server is not draining; 503 otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["HEALTH_PATH", "READY_PATH", "health_routes"]

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"

_HEADERS = {"Cache-Control": "no-store"}


def health_routes(ready: Callable[[], bool]) -> list[Route]:
    """The two routes; ``ready()`` says whether runs can be served now."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=_HEADERS)

    async def readyz(request: Request) -> Response:
        if ready():
            return JSONResponse({"status": "ready"}, headers=_HEADERS)
        return JSONResponse({"status": "unavailable"}, status_code=503, headers=_HEADERS)

    return [
        Route(HEALTH_PATH, endpoint=healthz, methods=["GET", "HEAD"]),
        Route(READY_PATH, endpoint=readyz, methods=["GET", "HEAD"]),
    ]
