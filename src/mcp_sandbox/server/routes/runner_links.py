"""The earlier code runner's permanent links, ``/files/{digest}/{name}``, for the data imported from it.

Those links were unsigned and never expired: whoever holds one downloads the file, with no token,
as there. They answer only for files imported from that runner's ``SANDBOX_ROOT`` (before and after
their conversation adopts them, and only while unchanged: :mod:`~mcp_sandbox.workspace.runner_names`),
never for a file written since nor for a workspace of this server's own, and the route exists only
where runner data is configured; other files are reached by signed links (:mod:`.files`). A
refusal is audited through the service's tally (one line a minute), never a line per request.
With an object store, a replica that has not the adopted files (or not the current copy) reads
them from the store, as signed links do, and serves the imported ones only
(:mod:`~mcp_sandbox.replicas.runner_records`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from mcp_sandbox.errors import UnavailableError, ValidationError, WorkspaceError
from mcp_sandbox.events import FileServed
from mcp_sandbox.replicas.files import local_is_current
from mcp_sandbox.replicas.runner_records import linked, linked_names
from mcp_sandbox.server.routes.downloads import file_response
from mcp_sandbox.server.service import Service
from mcp_sandbox.workspace import OpenFile, check_filename

__all__ = ["runner_link_routes"]


def _serve(service: Service) -> Callable[[Request], Any]:
    async def serve(request: Request) -> Response:
        started = time.perf_counter()
        data = service.runner_data
        digest, name = str(request.path_params["digest"]), str(request.path_params["name"])
        opened: OpenFile | None
        try:
            if data is None:
                raise WorkspaceError("no such file")
            key = await anyio.to_thread.run_sync(data.key_of, digest)
            if key is not None and not local_is_current(service.mirror, service.router, key):
                raise WorkspaceError("another replica runs this conversation")
            opened = await anyio.to_thread.run_sync(data.open_file, digest, name)
        except UnavailableError:
            raise  # answered 503 by the app, with Retry-After
        except (ValidationError, WorkspaceError, OSError):
            opened = await _from_store(service, digest, name)
        if opened is None:
            service.events.emit(FileServed(None, "missing", 0, time.perf_counter() - started, 404))
            return JSONResponse({"error": "no such file"}, status_code=404)
        response = file_response(request, opened, name)
        size = int(response.headers.get("content-length", 0)) if request.method == "GET" else 0
        service.events.emit(FileServed(None, "ok", size, time.perf_counter() - started, response.status_code))
        return response

    return serve


async def _from_store(service: Service, digest: str, name: str) -> OpenFile | None:
    """File ``name`` of the conversation that adopted ``digest``'s files (on any replica), read from
    the object store; None without a store, or when no such link or file is there."""
    mirror = service.mirror
    if mirror is None:
        return None
    try:
        check_filename(name)
        names = await anyio.to_thread.run_sync(linked_names, mirror.objects, digest)
        if names is None or name not in names.files:
            return None
        key = await anyio.to_thread.run_sync(linked, mirror.objects, service.workspaces, digest)
        if key is None:
            return None
        opened = await anyio.to_thread.run_sync(mirror.open_remote, key, name)
    except UnavailableError:
        raise
    except (ValidationError, WorkspaceError, OSError):
        return None
    try:
        if await anyio.to_thread.run_sync(names.serves, opened):
            return opened
    except OSError:
        pass
    opened.close()
    return None


def runner_link_routes(service: Service) -> list[BaseRoute]:
    """The route of the runner's links (after the signed links' route, which has more segments); none
    where no runner data is configured (``runner_data`` and ``runner_secret``, or ``runner_secret``
    alone on a replica of an object store, which serves them from there): nothing of this
    server's own is reached by such a link."""
    from_store = service.mirror is not None and service.migration.runner_secret is not None
    if service.runner_data is None and not from_store:
        return []
    return [Route("/files/{digest}/{name:path}", endpoint=_serve(service), methods=["GET", "HEAD"])]
