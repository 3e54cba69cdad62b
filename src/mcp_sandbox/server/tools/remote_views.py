"""Run views with replicas: an id that names the replica holding the view, and the hop to it.

With replicas (``replica_url``) a run's view lives in the memory of the replica that ran it
(:mod:`.run_views`), but a client's next request (the view's ``resources/read``, its Stop) may
land on any replica. A view id minted on a replica carries that replica's URL sealed with
AES-GCM (``cryptography``'s AEAD, :class:`ViewIds`) under a key derived from the replicas'
shared secret, with the tenant as associated data: only a replica can make one, nobody reads
the URL out of it or points it elsewhere, and an id sealed for one tenant opens for no other, so
another tenant's id reads as unknown before anything is asked, on every replica.

A replica that does not hold the view asks the one that does (:class:`RemoteViews`) over the
internal route that answers another replica's task requests (``op`` ``view-read`` or
``view-stop`` on :data:`~mcp_sandbox.replicas.forward.TASK_PATH`: signed, over mutual TLS with
``internal_port``); the holder answers for the tenant the request names from its own views only
(:func:`serve_views`), as it answers its own clients, so a request makes one hop at most. A holder
that died or does not answer within :data:`ASK_SECONDS` reads as :class:`ViewUnreachable`, a
clear error, never a hang; one restarted since (the same URL, a new process) has no views: unknown.

A view opened here whose run is forwarded to the conversation's owner (a task's: its
``CreateTaskResult`` links the view before the run is placed) stays here (:func:`watched_hop`):
its Stop cancels the hop, which the owner takes as a client's cancel (it kills the run's
sandbox), and it ends with the owner's answer. Its live output is not shown: the hop carries none.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from mcp.shared.exceptions import MCPError

from mcp_sandbox.replicas.forward import Forwarded, Here
from mcp_sandbox.replicas.internal_route import ServeTask
from mcp_sandbox.replicas.peers import PeerError, Reply
from mcp_sandbox.server.tools.resources import RESOURCE_NOT_FOUND, read_resource
from mcp_sandbox.server.tools.run_views import STOPPED_FROM_VIEW, VIEW_URI, RunView, RunViews, UnknownView

__all__ = ["ASK_SECONDS", "VIEW_KEY", "RemoteViews", "ViewIds", "ViewUnreachable", "serve_views", "watched_hop"]

VIEW_KEY = "run-view-id"  # derive_key's purpose for the key that seals view ids
ASK_SECONDS = 10.0  # a holder that has not answered by then is taken for gone
_NONCE = 12
_TAG = 16
_MAX_ID = 512  # characters: a longer id is none of ours, and is not decoded

Ask = Callable[[str, dict[str, Any]], Awaitable[Reply]]


class ViewUnreachable(Exception):
    """The replica holding a view did not answer (it stopped, died or is stuck)."""


class ViewIds:
    """View ids that carry the URL of the replica ``me`` that minted them, sealed for their tenant."""

    def __init__(self, key: bytes, me: str) -> None:
        self._aead = AESGCM(key)
        self.me = me

    def mint(self, tenant: str) -> str:
        """A new id for a view of ``tenant``'s held by this replica."""
        nonce = os.urandom(_NONCE)
        sealed = self._aead.encrypt(nonce, self.me.encode("utf-8"), tenant.encode("utf-8"))
        return base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")

    def holder(self, tenant: str, view_id: str) -> str | None:
        """The replica that minted ``view_id`` for ``tenant``; None when it is not such an id
        (another tenant's, altered, or never made)."""
        if len(view_id) > _MAX_ID:
            return None
        try:
            raw = base64.urlsafe_b64decode(view_id + "=" * (-len(view_id) % 4))
            if len(raw) <= _NONCE + _TAG:
                return None
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], tenant.encode("utf-8")).decode("utf-8")
        except (ValueError, InvalidTag):  # binascii.Error and UnicodeDecodeError are ValueErrors
            return None


class RemoteViews:
    """Views held by other replicas, asked with ``ask`` (:meth:`.Router.ask`), each answer awaited ``bound`` seconds."""

    def __init__(self, ids: ViewIds, ask: Ask, bound: float = ASK_SECONDS) -> None:
        self._ids = ids
        self._ask = ask
        self._bound = bound

    def elsewhere(self, tenant: str, view_id: str) -> str | None:
        """The other replica holding ``tenant``'s view ``view_id``; None when it is none of another's."""
        holder = self._ids.holder(tenant, view_id)
        return holder if holder is not None and holder != self._ids.me else None

    async def read(self, holder: str, tenant: str, view_id: str, uri: str) -> types.ReadResourceResult:
        """``resources/read`` of ``uri`` (view ``view_id``'s page or state) as ``holder`` answers it.

        Raises:
            MCPError: the holder has no such view (its answer, word for word). ViewUnreachable.
        """
        status, body = await self._request(holder, {"op": "view-read", "tenant": tenant, "view": view_id, "uri": uri})
        if status == 404:
            raise MCPError(RESOURCE_NOT_FOUND, str(json.loads(body).get("message")))
        if status != 200:
            raise ViewUnreachable(f"HTTP {status}")
        return types.ReadResourceResult.model_validate_json(body)

    async def stop(self, holder: str, tenant: str, view_id: str) -> bool:
        """Stop view ``view_id``'s run on ``holder``; False when it had already ended.

        Raises:
            UnknownView: the holder has no such view. ViewUnreachable.
        """
        status, body = await self._request(holder, {"op": "view-stop", "tenant": tenant, "view": view_id})
        if status == 404:
            raise UnknownView(view_id)
        if status != 200:
            raise ViewUnreachable(f"HTTP {status}")
        return bool(json.loads(body).get("stopping"))

    async def _request(self, holder: str, request: dict[str, Any]) -> tuple[int, bytes]:
        with anyio.move_on_after(self._bound):
            try:
                reply = await self._ask(holder, request)
            except PeerError as exc:
                raise ViewUnreachable(str(exc)) from exc
            return reply.status, reply.body
        raise ViewUnreachable(f"no answer in {self._bound:g} s")


def serve_views(views: RunViews, rest: ServeTask) -> ServeTask:
    """The holder's side: another replica's ``view-read`` or ``view-stop`` answered from ``views``
    (for the tenant the signed request names); any other request is ``rest``'s."""

    async def serve(request: dict[str, Any]) -> tuple[int, bytes]:
        op, tenant, view_id = (request.get(name) for name in ("op", "tenant", "view"))
        if op not in ("view-read", "view-stop"):
            return await rest(request)
        if not (isinstance(tenant, str) and isinstance(view_id, str)):
            return 400, b"{}"
        if op == "view-stop":
            try:
                stopping = views.stop(tenant, view_id)
            except UnknownView:
                return 404, b"{}"
            return 200, json.dumps({"stopping": stopping}).encode("utf-8")
        uri = request.get("uri")
        if not (isinstance(uri, str) and uri.removeprefix(f"{VIEW_URI}/").partition("/")[0] == view_id):
            return 400, b"{}"
        try:
            result = await read_resource(None, types.ReadResourceRequestParams(uri=uri), views, tenant)
        except MCPError as exc:
            return 404, json.dumps({"message": exc.error.message}).encode("utf-8")
        return 200, result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")

    return serve


async def watched_hop(
    views: RunViews, view: RunView | None, route: Callable[[], Awaitable[Here | Forwarded]]
) -> Here | Forwarded:
    """``route()``'s placement of a run; while it is forwarded, ``view`` (opened here for the run, if
    any) stops it by cancelling the hop, and ends with the answer."""
    if view is None or view.result is not None:
        return await route()
    started = time.monotonic()
    try:
        with anyio.CancelScope() as hop:
            view.hop = hop
            try:
                where = await route()
            finally:
                view.hop = None
    except BaseException:
        with views.ending(view):  # the page stops waiting
            raise
    if hop.cancelled_caught:
        lasted = int((time.monotonic() - started) * 1000)
        data: dict[str, Any] = {"status": "error", "exitCode": None, "stdout": "", "stderr": ""}
        data.update(durationMs=lasted, truncated=False, error=STOPPED_FROM_VIEW)
        text = types.TextContent(type="text", text=STOPPED_FROM_VIEW)
        where = Forwarded("", types.CallToolResult(content=[text], structured_content=data, is_error=True))
    if isinstance(where, Forwarded):
        answer = where.result.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"result_type"})
        views.finish(view, answer)
    return where
