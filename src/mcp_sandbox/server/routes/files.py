"""File routes: authenticated uploads (``POST /upload``), beside the signed downloads of :mod:`.downloads`.

Uploads stream the body into the conversation's workspace, atomically and within its quota
(reserved as it streams, checked again at commit).

A slow upload must not freeze anyone else: the body is read on the event loop, and only the
disk writes go to threads, ``upload_workers`` of them kept for uploads alone (runs never wait
for them); each tenant streams at most ``tenant_uploads`` uploads at once (more are answered
``429``); the server's :class:`~mcp_sandbox.server.transport.limits.SlowBodyGuard` cuts a body that is too slow.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_sandbox.errors import BusyError, QuotaExceededError, UnavailableError, ValidationError, WorkspaceError
from mcp_sandbox.events import FileStored
from mcp_sandbox.replicas.files import stored_by_owner, upload_arguments
from mcp_sandbox.replicas.forward import Forwarded, Here
from mcp_sandbox.replicas.refusals import http_status
from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.routes.downloads import CHUNK, download_route, problem
from mcp_sandbox.server.service import Service
from mcp_sandbox.workspace import check_conversation_id, check_filename

__all__ = ["file_routes"]


def _conversation_of(value: object) -> str:
    if value is None:
        raise ValidationError("conversationId", "is required (the conversation to store the files in)")
    return check_conversation_id(value)


def _check_utf8_query(request: Request, *fields: str) -> None:
    """Refuse a field of the query string whose percent-encoded bytes are not UTF-8.

    Starlette decodes them with replacement characters, which would become part of the name.

    Raises:
        ValidationError: naming the field.
    """
    query = request.scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True, encoding="latin-1"):
        if key in fields:
            try:
                value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError(key, "is not valid UTF-8 (percent-encode the name's UTF-8 bytes)") from None


class _TooLarge(Exception):
    pass


class _BodyLimit:
    """Answer 413 once a request body passes ``limit`` bytes, declared or streamed (chunked)."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int]) -> None:
        self._app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self._limit()
        too_large = problem(413, f"the upload is larger than {limit} bytes")
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await too_large(scope, receive, send)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise _TooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self._app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await too_large(scope, receive, send)


class _Uploads:
    """Uploads in progress per tenant, and the threads that write them (theirs alone)."""

    def __init__(self, per_tenant: int, workers: int) -> None:
        self.per_tenant = per_tenant
        self.workers = anyio.CapacityLimiter(workers)
        self._active: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        """Count one upload of ``tenant`` for the block.

        Raises:
            BusyError: the tenant already streams ``per_tenant`` uploads.
        """
        if self._active[tenant] >= self.per_tenant:
            raise BusyError(
                f"this tenant already streams {self._active[tenant]} uploads, the most one tenant may; "
                "retry when one has finished"
            )
        self._active[tenant] += 1
        try:
            yield
        finally:
            self._active[tenant] -= 1
            if not self._active[tenant]:
                del self._active[tenant]


async def _batched(stream: AsyncIterator[bytes], size: int = CHUNK) -> AsyncIterator[bytes]:
    """Coalesce a body's chunks (one byte each, from a slow client) into writes of ``size`` bytes."""
    buffer = bytearray()
    async for chunk in stream:
        buffer += chunk
        if len(buffer) >= size:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


async def _once(content: bytes) -> AsyncIterator[bytes]:
    yield content


def _upload(service: Service) -> Callable[[Request], Any]:
    uploads = _Uploads(service.http_settings.tenant_uploads, service.http_settings.upload_workers)

    async def store(
        tenant: str, conversation: str, filename: str, stream: AsyncIterator[bytes], declared: int = 0
    ) -> dict[str, Any]:
        """Store one file; ``declared``: the body's Content-Length, reserved against the quota at once."""
        key = service.workspaces.key(tenant, conversation)
        if (router := service.router) is None:
            return await store_here(tenant, conversation, key, filename, stream, declared)
        with router.calling(key):  # the lease is kept from the claim until the file is stored
            if isinstance(await router.place(key), Here):
                return await store_here(tenant, conversation, key, filename, stream, declared)
            # Another replica runs this conversation: the file goes there, read whole first.
            content = b"".join([chunk async for chunk in stream])
            where = await router.route(key, "upload_file", upload_arguments(conversation, filename, content), tenant)
            if isinstance(where, Forwarded):
                return stored_by_owner(where)
            return await store_here(tenant, conversation, key, filename, _once(content), 0)  # taken over meanwhile

    async def store_here(
        tenant: str, conversation: str, key: str, filename: str, stream: AsyncIterator[bytes], declared: int
    ) -> dict[str, Any]:
        workers = uploads.workers
        started = time.perf_counter()
        # Among replicas, what it records is fenced by the lease it holds now: a replica stalled past
        # its lease meanwhile (another took it over) records nothing (workspace/fencing.py).
        fence, limits = service.storage.fence(key), service.workspace_settings
        admit = service.metadata.admitting(key, fence, limits.quota_bytes, limits.quota_files)
        try:
            with service.using(key):
                await service.storage.touch(key, tenant, conversation)
                pending = await anyio.to_thread.run_sync(
                    service.workspaces.begin_write, key, filename, tenant, limiter=workers
                )
                try:
                    if declared:
                        pending.expect(declared)
                    async for chunk in _batched(stream):
                        await anyio.to_thread.run_sync(pending.write, chunk, limiter=workers)
                    entry = await anyio.to_thread.run_sync(pending.commit, admit, limiter=workers)
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(pending.abort, limiter=workers)
                await service.storage.refresh_files(key, fence)
                # In the object store before it is acknowledged.
                if entry.name in await service.storage.write_back(key, fence):
                    raise WorkspaceError(f"{entry.name}: the object store did not take the file; upload it again")
        except (QuotaExceededError, WorkspaceError, ClientDisconnect) as exc:
            outcome = {QuotaExceededError: "quota", ClientDisconnect: "disconnected"}.get(type(exc), "refused")
            service.events.emit(FileStored(tenant, key, "http", outcome, 0, time.perf_counter() - started))
            raise
        service.events.emit(FileStored(tenant, key, "http", "ok", entry.size, time.perf_counter() - started))
        return {"name": entry.name, "size": entry.size, "url": service.file_url(key, entry.name)}

    async def upload(request: Request) -> Response:
        tenant = tenant_of(request)
        try:
            service.lifecycle.refuse_when_draining()
        except BusyError as exc:
            return problem(503, str(exc))
        try:
            with uploads.hold(tenant):
                content_type = request.headers.get("content-type", "")
                if content_type.startswith("multipart/form-data"):
                    return await _multipart(request, tenant, store)
                _check_utf8_query(request, "conversationId", "filename")
                conversation = _conversation_of(request.query_params.get("conversationId"))
                filename = check_filename(request.query_params.get("filename") or "", "filename")
                length = request.headers.get("content-length", "")
                declared = int(length) if length.isdigit() else 0
                stored = await store(tenant, conversation, filename, request.stream(), declared)
                return JSONResponse({"files": [stored]}, status_code=201)
        except BusyError as exc:
            return problem(429, str(exc))
        except ValidationError as exc:
            return problem(400, str(exc))
        except UnavailableError:
            raise  # answered 503 by the app, with Retry-After
        except WorkspaceError as exc:  # the quota 413, a full disk 507, the lease lost 503 (retry), else 409
            return problem(http_status(exc), str(exc))
        except ClientDisconnect:
            return Response(status_code=400)

    return upload


async def _multipart(request: Request, tenant: str, store: Callable[..., Any]) -> Response:
    """``multipart/form-data``: a ``conversationId`` field and one or more file parts."""
    try:
        await request.form(max_files=100, max_fields=10)  # parsed once, kept by the request
    except HTTPException as exc:  # Starlette's answer to a body it cannot parse, in plain text
        raise ValidationError("body", f"not valid multipart/form-data: {exc.detail}") from None
    async with request.form(max_files=100, max_fields=10) as form:
        conversation = _conversation_of(form.get("conversationId"))
        stored = []
        for field, value in form.multi_items():
            if isinstance(value, str):
                if field not in ("conversationId",):
                    raise ValidationError(field, "unknown form field (expected conversationId and file parts)")
                continue
            filename = check_filename(value.filename or "", "filename")

            async def chunks(upload: Any = value) -> AsyncIterator[bytes]:
                while chunk := await upload.read(CHUNK):
                    yield chunk

            stored.append(await store(tenant, conversation, filename, chunks()))
        if not stored:
            raise ValidationError("file", "no file part in the form")
    return JSONResponse({"files": stored}, status_code=201)


def file_routes(service: Service, guard: Callable[[ASGIApp], ASGIApp]) -> list[BaseRoute]:
    """The download route (signed URL, :mod:`.downloads`) and the upload route (behind ``guard``, the bearer check);
    the app checks Host and Origin on both, as on every route."""
    upload_app = request_response(_upload(service))

    def limit() -> int:
        # Slack for multipart framing; the store enforces the quota byte by byte.
        return service.workspace_settings.quota_bytes + (1 << 20)

    return [
        download_route(service),
        Route("/upload", endpoint=guard(_BodyLimit(upload_app, limit)), methods=["POST"]),
    ]
