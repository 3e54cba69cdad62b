"""The HTTP answer to an outage of the metadata database or the object store: 503 with ``Retry-After``.

Every route lets :class:`~mcp_sandbox.errors.UnavailableError` through, and the app answers it
here, once: a client told 404 (no such file) would think an acknowledged file gone, one told
409 would not send its upload again; 503 names the service that is down and when to retry.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mcp_sandbox.errors import UnavailableError

__all__ = ["answer_unavailable"]


async def answer_unavailable(request: Request, exc: Exception) -> Response:
    """503, the service named, ``Retry-After`` (Starlette's exception handler for UnavailableError)."""
    message = str(exc) if isinstance(exc, UnavailableError) else "a service the server needs is unavailable"
    headers = {
        "Retry-After": str(UnavailableError.RETRY_SECONDS),
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
    }
    return JSONResponse({"error": message}, status_code=503, headers=headers)
