"""``GET /metrics``: Prometheus text, behind a bearer token of its own (``metrics_token``).

Without ``metrics_token`` the route answers 404, as if it did not exist.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mcp_sandbox.server.metrics import Metrics

__all__ = ["METRICS_PATH", "metrics_route"]

METRICS_PATH = "/metrics"


def _bearer(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def metrics_route(token: Callable[[], str | None], metrics: Metrics) -> Route:
    """``GET /metrics``: 404 while ``token()`` is None; 401 without it; the text format with it."""

    async def endpoint(request: Request) -> Response:
        expected = token()
        if expected is None:
            return Response("Not Found", status_code=404, media_type="text/plain")
        given = _bearer(request)
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            return Response(
                "unauthorized", status_code=401, headers={"WWW-Authenticate": "Bearer"}, media_type="text/plain"
            )
        body = await anyio.to_thread.run_sync(metrics.render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return Route(METRICS_PATH, endpoint=endpoint, methods=["GET"])
