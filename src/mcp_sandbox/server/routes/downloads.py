"""Signed downloads (``GET /files/<conversation>/<expires>/<signature>/<name>``) and the file reply.

Downloads need no token (the signed URL is the credential) and serve regular files only, opened
without following any symlink the sandbox made (see ``workspace/files.py``), from the open
file descriptor, with ranges. A link another replica made is served from the object store.
"""

from __future__ import annotations

import mimetypes
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_sandbox.errors import UnavailableError, ValidationError, WorkspaceError
from mcp_sandbox.events import FileServed
from mcp_sandbox.replicas.files import local_is_current
from mcp_sandbox.server.service import Service
from mcp_sandbox.server.urls import FILES_PATH
from mcp_sandbox.workspace import OpenFile, check_filename

__all__ = ["CHUNK", "download_route", "file_response", "problem"]

CHUNK = 256 << 10  # what a read or write of a file route moves at once
_INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "text/plain", "application/pdf"})
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
# Files a browser may display rather than download; nothing that runs script on our origin.
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
    "Cache-Control": "private, max-age=0",
    "Referrer-Policy": "no-referrer",
}


def problem(status: int, message: str) -> JSONResponse:
    """A JSON error of the file routes, with their security headers."""
    return JSONResponse({"error": message}, status_code=status, headers=_SECURITY_HEADERS)


def _disposition(name: str, media_type: str) -> str:
    base = name.rsplit("/", 1)[-1]
    fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", base) or "file"
    kind = "inline" if media_type in _INLINE_TYPES else "attachment"
    return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(base, safe='')}"


def _byte_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """The (start, end inclusive) of a single-range request; None for the whole file; "bad" if unsatisfiable."""
    if header is None:
        return None
    match = _RANGE_RE.match(header.strip())
    if match is None:
        return None  # several ranges or another unit: answering with the whole file is allowed
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            return "bad"
        return max(0, size - length), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        return "bad"
    return start, end


async def _read(opened: OpenFile, start: int, end: int) -> AsyncIterator[bytes]:
    try:
        position = start
        while position <= end:
            chunk = await anyio.to_thread.run_sync(os.pread, opened.fd, min(CHUNK, end + 1 - position), position)
            if not chunk:
                break  # the file shrank while we read it: stop, the client sees a short body
            position += len(chunk)
            yield chunk
    finally:
        opened.close()


def _download(service: Service) -> Callable[[Request], Any]:
    async def download(request: Request) -> Response:
        started = time.perf_counter()
        response = await answer(request)
        outcome = {200: "ok", 206: "ok", 410: "expired", 403: "invalid", 404: "missing"}.get(
            response.status_code, "bad"
        )
        key = request.path_params["conversation"] if outcome in ("ok", "missing") else None  # a signed key only
        size = int(response.headers.get("content-length", 0)) if outcome == "ok" and request.method == "GET" else 0
        service.events.emit(FileServed(key, outcome, size, time.perf_counter() - started, response.status_code))
        return response

    async def answer(request: Request) -> Response:
        params = request.path_params
        name = str(params["name"])
        verdict = service.urls.check(params["conversation"], params["expires"], params["signature"], name, time.time())
        if verdict.verdict == "expired":
            return problem(
                410,
                "this download link has expired: run code in the conversation again, or ask "
                "GET /files/renew?conversationId=<id>&name=<file> with your bearer token, for a new one",
            )
        if not verdict.ok:
            return problem(403, "invalid download link")
        key = params["conversation"]
        try:
            check_filename(name)
            if not local_is_current(service.mirror, service.router, key):
                raise WorkspaceError("another replica runs this conversation")
            opened = await anyio.to_thread.run_sync(service.workspaces.open_file, key, name)
        except UnavailableError:
            raise  # answered 503 by the app (transport/outages.py): the file may well exist
        except (ValidationError, WorkspaceError, OSError):
            if service.mirror is None:
                return problem(404, "no such file")
            try:  # a link another replica made: its conversation's files are in the object store
                opened = await anyio.to_thread.run_sync(service.mirror.open_remote, key, name)
            except UnavailableError:
                raise
            except (ValidationError, WorkspaceError, OSError):
                return problem(404, "no such file")
        return file_response(request, opened, name)

    return download


def file_response(request: Request, opened: OpenFile, name: str) -> Response:
    """``opened``, file ``name``, as the reply to ``request`` (a GET or HEAD, with its ``Range``); it closes it."""
    media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    headers = {
        **_SECURITY_HEADERS,
        "Accept-Ranges": "bytes",
        "Content-Disposition": _disposition(name, media_type),
        "Last-Modified": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(opened.mtime)),
    }
    span = _byte_range(request.headers.get("range"), opened.size)
    if span == "bad":
        opened.close()
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{opened.size}"})
    status, (start, end) = (206, span) if isinstance(span, tuple) else (200, (0, opened.size - 1))
    headers["Content-Length"] = str(end + 1 - start)
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end}/{opened.size}"
    if request.method == "HEAD":
        opened.close()
        return Response(status_code=status, headers=headers, media_type=media_type)
    return StreamingResponse(_read(opened, start, end), status_code=status, headers=headers, media_type=media_type)


def download_route(service: Service) -> Route:
    """The signed download route (GET and HEAD)."""
    return Route(
        FILES_PATH + "/{conversation}/{expires}/{signature}/{name:path}",
        endpoint=_download(service),
        methods=["GET", "HEAD"],
    )
