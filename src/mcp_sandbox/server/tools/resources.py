"""The server's resources (``resources/list``, ``resources/read``): the code-mode manual and runs' views.

Clients that list resources (the earlier bridge's users read it through ``listMcpResources``)
get the same text that ``runtime.capability_summary()`` prints inside the sandbox, at the URI
the earlier bridge served it at.

Clients that render MCP Apps (the ``io.modelcontextprotocol/ui`` extension) read the run view
(``text/html;profile=mcp-app``): ``ui://mcp-sandbox/run``, the page the tools name, which
shows the result the host hands it; ``ui://mcp-sandbox/run/<id>``, the same page with run
``<id>``'s state in it; and ``ui://mcp-sandbox/run/<id>/state``, that state as JSON, which the
page polls while the run lasts. The page is built from ``web/`` (``make web``), self-contained:
its script and style are inline, allowed by their hashes in its own Content-Security-Policy,
and it declares that it fetches nothing (an empty ``csp`` in its ``_meta.ui``). A run's id
reads only for its tenant (:mod:`.run_views`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from mcp_sandbox.protocol import CAPABILITIES, CAPABILITIES_URI
from mcp_sandbox.server.tools.run_views import VIEW_URI, RunViews, UnknownView

__all__ = ["RESOURCE_NOT_FOUND", "VIEW_MIME", "list_resources", "read_resource", "view_page"]

RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for an unknown resource URI
VIEW_MIME = "text/html;profile=mcp-app"  # ext-apps' RESOURCE_MIME_TYPE
_MIME = "text/markdown"
_PAGE = Path(__file__).resolve().parents[1] / "static" / "run-view.html"  # built by `make web`
_DATA_PLACEHOLDER = "/*RUN_DATA*/null"
# The page fetches nothing and frames nothing: the host applies no more than this.
_VIEW_META = {"ui": {"csp": {"connectDomains": [], "resourceDomains": []}, "prefersBorder": True}}

_CAPABILITIES = types.Resource(
    name="code-execution-capabilities",
    title="Code mode helpers",
    description="How sandboxed code finds and calls other MCP servers' tools (runtime.capability_summary()).",
    uri=CAPABILITIES_URI,
    mime_type=_MIME,
    size=len(CAPABILITIES.encode()),
)
_VIEW = types.Resource(
    name="run-view",
    title="Run",
    description="A run's output, plots, files, status and time (MCP Apps), live while it lasts.",
    uri=VIEW_URI,
    mime_type=VIEW_MIME,
)


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[_CAPABILITIES, _VIEW])


@functools.cache
def _template() -> str:
    return _PAGE.read_text(encoding="utf-8")


def view_page(state: dict[str, Any] | None) -> str:
    """The view's page, with ``state`` (a run's, or None: the host hands it the result) in it."""
    # Inside a <script type="application/json">: no "<" may end it early.
    data = json.dumps(state, separators=(",", ":")).replace("<", "\\u003c")
    return _template().replace(_DATA_PLACEHOLDER, data, 1)


def _unknown(uri: str) -> MCPError:
    return MCPError(RESOURCE_NOT_FOUND, f"no resource {uri} (this server has {CAPABILITIES_URI} and {VIEW_URI})")


async def read_resource(
    ctx: Any, params: types.ReadResourceRequestParams, views: RunViews, tenant: str
) -> types.ReadResourceResult:
    """The manual, or the run view (``views``' runs as ``tenant`` sees them).

    Raises:
        MCPError: no such resource, or a run id ``tenant`` has not (-32002, the same for both).
    """
    uri = str(params.uri)
    if uri == CAPABILITIES_URI:
        contents = types.TextResourceContents(uri=CAPABILITIES_URI, mime_type=_MIME, text=CAPABILITIES)
        return types.ReadResourceResult(contents=[contents])
    if uri == VIEW_URI:
        return _page(uri, None)
    if not uri.startswith(VIEW_URI + "/"):
        raise _unknown(uri)
    view_id, _, rest = uri.removeprefix(VIEW_URI + "/").partition("/")
    try:
        view = views.get(tenant, view_id)
    except UnknownView:  # another tenant's run reads exactly like one never made
        raise MCPError(RESOURCE_NOT_FOUND, f"unknown run {view_id!r} ({uri})") from None
    if rest == "state":
        text = json.dumps(view.state(), separators=(",", ":"))
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
        )
    if rest:
        raise _unknown(uri)
    return _page(uri, view.state())


def _page(uri: str, state: dict[str, Any] | None) -> types.ReadResourceResult:
    try:
        text = view_page(state)
    except FileNotFoundError:
        raise MCPError(RESOURCE_NOT_FOUND, f"{uri}: the view is not built (run `make web`)") from None
    contents = types.TextResourceContents(uri=uri, mime_type=VIEW_MIME, text=text, _meta=_VIEW_META)
    return types.ReadResourceResult(contents=[contents])
