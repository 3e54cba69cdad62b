"""The server's one resource: the code-mode helper manual (``resources/list``, ``resources/read``).

Clients that list resources (the earlier bridge's users read it through ``listMcpResources``)
get the same text that ``runtime.capability_summary()`` prints inside the sandbox, at the URI
the earlier bridge served it at.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from mcp_sandbox.protocol import CAPABILITIES, CAPABILITIES_URI

__all__ = ["RESOURCE_NOT_FOUND", "list_resources", "read_resource"]

RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for an unknown resource URI
_MIME = "text/markdown"

_CAPABILITIES = types.Resource(
    name="code-execution-capabilities",
    title="Code mode helpers",
    description="How sandboxed code finds and calls other MCP servers' tools (runtime.capability_summary()).",
    uri=CAPABILITIES_URI,
    mime_type=_MIME,
    size=len(CAPABILITIES.encode()),
)


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[_CAPABILITIES])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    """The manual.

    Raises:
        MCPError: the URI is not the manual's (-32002).
    """
    if str(params.uri) != CAPABILITIES_URI:
        raise MCPError(RESOURCE_NOT_FOUND, f"no resource {params.uri} (this server has {CAPABILITIES_URI})")
    contents = types.TextResourceContents(uri=CAPABILITIES_URI, mime_type=_MIME, text=CAPABILITIES)
    return types.ReadResourceResult(contents=[contents])
