"""The runs an MCP Apps view can show: ``ui://mcp-sandbox/run/<id>``, each bound to its tenant.

Every ``run_python``/``run_code`` call gets a view id (128 random bits) when it starts; its
result links the view (:func:`view_meta`), and a client that renders MCP Apps
(``io.modelcontextprotocol/ui``) reads the view's page and its state through
``resources/read`` (:mod:`.resources`). While the run lasts its state carries the last lines
of output; once it ends, the result as the tool answered it. The view's Stop asks for the run's
end with ``_meta["mcp-sandbox/stop"]`` on a ``tools/call`` (:func:`stop_request`): the tool
path a view can reach through every host, with the caller's tenant checked like any call.

With replicas, a view's id names the replica that holds it, and the others ask that one
(:mod:`.remote_views`). Views are kept in memory, per server process: the last :data:`PER_TENANT` runs of each tenant,
none longer than :data:`KEEP_SECONDS` (a task's default time to live), their results (output and
images) at most :data:`TENANT_BYTES` together: a run may return a MiB of output and four images
of a MiB each, and 32 of those would hold 200 MB. A view is a window on a
recent run, not its record: the executions table is that. An id of another tenant, an
evicted one or one never made all read the same: unknown.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio

if TYPE_CHECKING:
    from mcp_sandbox.engine import OutputListener

__all__ = [
    "ENDED_UNANSWERED",
    "KEEP_SECONDS",
    "LIVE_LINES",
    "OPENED",
    "PER_TENANT",
    "STOPPED_FROM_VIEW",
    "STOP_META",
    "TENANT_BYTES",
    "VIEW_URI",
    "RunView",
    "RunViews",
    "UnknownView",
    "listening",
    "stop_request",
    "view_meta",
]

VIEW_URI = "ui://mcp-sandbox/run"  # the tools' view; a run's is VIEW_URI/<id>
STOP_META = "mcp-sandbox/stop"  # a tools/call's _meta key naming the view id of a run to stop
STOPPED_FROM_VIEW = "stopped from the run's view; its sandbox was killed"
ENDED_UNANSWERED = "the call ended without a result (its client cancelled it, or the server failed)"
PER_TENANT = 32
KEEP_SECONDS = 3600.0
TENANT_BYTES = 16 << 20
LIVE_LINES = 200
_MAX_LINE = 1000  # characters of one live line kept (a longer line is cut)
_MAX_PARTIAL = 64 << 10
# What Run again may repeat; `environment` is left out (its values may be secrets) and so are
# `reset` and `forkFrom`, which would not mean the same a second time.
_REPEATED = ("code", "language", "conversationId", "servers", "timeout", "network", "outputMode")


class UnknownView(LookupError):
    """No view of the caller's tenant has that id (never made, another tenant's, or gone)."""


@dataclass
class RunView:
    """One run as its view shows it."""

    id: str
    tenant: str
    tool: str
    arguments: dict[str, Any]
    started: float = field(default_factory=time.time)
    clock: float = field(default_factory=time.monotonic)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    hop: anyio.CancelScope | None = None  # the call forwarded to the replica running it, while it is
    lines: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LIVE_LINES))
    seen: int = 0  # lines printed so far (more than `lines` keeps)
    result: dict[str, Any] | None = None  # the tool result (wire form), once the run ended
    weight: int = 0  # the result's output and images, in characters
    _partial: dict[str, bytes] = field(default_factory=lambda: {"stdout": b"", "stderr": b""})

    @property
    def uri(self) -> str:
        return f"{VIEW_URI}/{self.id}"

    def feed(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        """Take a chunk of the run's output (an :data:`~mcp_sandbox.engine.OutputListener`)."""
        *complete, rest = (self._partial[stream] + data.replace(b"\r\n", b"\n")).split(b"\n")
        if len(rest) > _MAX_PARTIAL:
            complete.append(rest)
            rest = b""
        self._partial[stream] = rest
        self.seen += len(complete)
        for line in complete[-LIVE_LINES:]:
            text = line.decode("utf-8", errors="replace")
            self.lines.append(text if len(text) <= _MAX_LINE else text[:_MAX_LINE] + "…")

    def state(self) -> dict[str, Any]:
        """What the view's page shows (no token, no secret: the arguments it may repeat, the result)."""
        state: dict[str, Any] = {
            "id": self.id,
            "tool": self.tool,
            "arguments": self.arguments,
            "startedAt": int(self.started * 1000),
            "status": "running" if self.result is None else "ended",
        }
        if self.result is None:
            state["elapsedMs"] = int((time.monotonic() - self.clock) * 1000)
            state["lines"] = list(self.lines)
            state["skipped"] = self.seen - len(self.lines)
        else:
            state["result"] = self.result
        return state


# A view opened before its run starts (a task's, linked in the CreateTaskResult): the run takes it.
OPENED: contextvars.ContextVar[RunView | None] = contextvars.ContextVar("mcp_sandbox_run_view", default=None)


def view_meta(view: RunView) -> dict[str, Any]:
    """The ``_meta`` of a result (or task) that links ``view``: ext-apps' ``ui.resourceUri``."""
    return {"ui": {"resourceUri": view.uri}}


def stop_request(params: Mapping[str, Any] | None) -> str | None:
    """The view id a ``tools/call``'s ``_meta`` asks to stop, or None."""
    meta = params.get("_meta") if params is not None else None
    wanted = meta.get(STOP_META) if isinstance(meta, dict) else None
    return wanted if isinstance(wanted, str) else None


def _weight(result: Mapping[str, Any]) -> int:
    """What keeping ``result`` costs, near enough: its output and images (base64), in characters."""
    data = result.get("structuredContent") or {}
    weight = len(str(data.get("stdout", ""))) + len(str(data.get("stderr", "")))
    for block in result.get("content", []):
        weight += len(str(block.get("text", ""))) + len(str(block.get("data", "")))
    return weight


def _repeatable(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    return {name: raw[name] for name in _REPEATED if raw is not None and raw.get(name) is not None}


class RunViews:
    """The views of recent runs: per tenant, the last :data:`PER_TENANT`, each for :data:`KEEP_SECONDS`."""

    def __init__(
        self,
        per_tenant: int = PER_TENANT,
        keep_seconds: float = KEEP_SECONDS,
        tenant_bytes: int = TENANT_BYTES,
        mint: Callable[[str], str] | None = None,
    ) -> None:
        self._mint = mint or (lambda tenant: secrets.token_urlsafe(16))  # a tenant's new view id
        self._per_tenant = per_tenant
        self._keep = keep_seconds
        self._bytes = tenant_bytes
        self._views: dict[str, collections.OrderedDict[str, RunView]] = {}

    def open(self, tenant: str, tool: str, raw: Mapping[str, Any] | None) -> RunView:
        """A new view of a run of ``tool`` for ``tenant`` (or the one :data:`OPENED` for this run); the
        oldest of the tenant's go past the bound."""
        if (opened := OPENED.get()) is not None and opened.tenant == tenant:
            OPENED.set(None)
            return opened
        views = self._views.setdefault(tenant, collections.OrderedDict())
        self._expire(views)
        view = RunView(self._mint(tenant), tenant, tool, _repeatable(raw))
        views[view.id] = view
        while len(views) > self._per_tenant:
            views.popitem(last=False)
        return view

    def finish(self, view: RunView, result: dict[str, Any]) -> None:
        """``view``'s run ended with ``result``; the tenant's oldest ended views go past the bytes bound."""
        view.result, view.weight = result, _weight(result)
        views = self._views.get(view.tenant, collections.OrderedDict())
        kept = sum(other.weight for other in views.values())
        for other in list(views.values()):
            if kept <= self._bytes:
                break
            if other is not view and other.result is not None:
                kept -= other.weight
                del views[other.id]

    @contextlib.contextmanager
    def ending(self, view: RunView) -> Iterator[RunView]:
        """The block runs ``view``'s run; leaving it without a result (a client's cancel, a failure)
        ends the view too, so that its page stops waiting."""
        try:
            yield view
        finally:
            if view.result is None:
                data = {"status": "error", "exitCode": None, "stdout": "", "stderr": "", "durationMs": 0}
                data.update(truncated=False, error=ENDED_UNANSWERED)
                text = {"type": "text", "text": ENDED_UNANSWERED}
                self.finish(view, {"content": [text], "structuredContent": data, "isError": True})

    def get(self, tenant: str, view_id: str) -> RunView:
        """``tenant``'s view ``view_id``.

        Raises:
            UnknownView: the tenant has no such view (whoever else may have it).
        """
        views = self._views.get(tenant)
        if views is not None:
            self._expire(views)
            if (view := views.get(view_id)) is not None:
                return view
        raise UnknownView(view_id)

    def stop(self, tenant: str, view_id: str) -> bool:
        """Stop ``tenant``'s run ``view_id``; False when it had already ended.

        Raises:
            UnknownView: the tenant has no such view.
        """
        view = self.get(tenant, view_id)
        if view.result is not None:
            return False
        view.scope.cancel()
        if view.hop is not None:  # the holder ends the run as on a client's cancel
            view.hop.cancel()
        return True

    def _expire(self, views: collections.OrderedDict[str, RunView]) -> None:
        horizon = time.monotonic() - self._keep
        while views and (oldest := next(iter(views.values()))).clock < horizon and oldest.result is not None:
            views.popitem(last=False)


def listening(view: RunView, listener: OutputListener | None) -> OutputListener:
    """An output listener feeding ``view`` and ``listener`` (progress notifications) alike."""
    if listener is None:
        return view.feed

    def both(stream: Literal["stdout", "stderr"], data: bytes) -> None:
        view.feed(stream, data)
        listener(stream, data)

    return both
