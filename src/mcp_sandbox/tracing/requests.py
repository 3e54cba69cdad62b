"""The span of each message the server takes: the MCP SDK's own span, made for less.

The MCP SDK wraps every request and notification in a span (its ``OpenTelemetryMiddleware``,
first on ``Server.middleware``, which the SDK says to drop from that list to opt out). This
middleware makes the same span in its place (name, kind, attributes, the client's ``traceparent``
continued, the status of a failure) for less: nothing at all while no tracer provider is
installed, where the SDK's makes an empty span every time; one span started and made current
where the SDK's goes through three nested context managers on every call; and, as this server's
other spans, no exception's message (the SDK records it as an event and in the status, and a
message can quote the code). Its span is the one a run is told on (:func:`mcp_sandbox.tracing.step`).
"""

from __future__ import annotations

from typing import Any, Final

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import ValidationError

from mcp_sandbox.tracing import failed, remote_parent, start

__all__ = ["RequestSpans"]

_INVALID_PARAMS: Final = str(INVALID_PARAMS)


class RequestSpans:
    """Server middleware: a span (kind server) around each message taken, continuing its ``_meta.traceparent``."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return await call_next(ctx)  # tracing is off
        method = ctx.method
        name = ctx.params.get("name") if ctx.params else None
        target = name if isinstance(name, str) else None
        attributes: dict[str, Any] = {"mcp.method.name": method, "mcp.protocol.version": ctx.protocol_version}
        if ctx.request_id is not None:
            attributes["jsonrpc.request.id"] = str(ctx.request_id)
        if method == "tools/call":
            attributes["gen_ai.operation.name"] = "execute_tool"
            if target is not None:
                attributes["gen_ai.tool.name"] = target
        elif method == "prompts/get" and target is not None:
            attributes["gen_ai.prompt.name"] = target
        opened = start(
            f"{method} {target}" if target else method,
            remote_parent(ctx.meta) if ctx.meta else None,
            SpanKind.SERVER,
            attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(opened))
        try:
            result = await call_next(ctx)
        except MCPError as exc:
            code = str(exc.error.code)
            opened.set_attributes({"error.type": code, "rpc.response.status_code": code})
            opened.set_status(StatusCode.ERROR, exc.error.message)  # what the client is answered
            raise
        except ValidationError:  # answered as the SDK does; pydantic's messages quote the input
            opened.set_attributes({"error.type": _INVALID_PARAMS, "rpc.response.status_code": _INVALID_PARAMS})
            opened.set_status(StatusCode.ERROR, "Invalid request parameters")
            raise
        except BaseException as exc:
            failed(opened, type(exc))
            raise
        else:
            if method == "tools/call" and _tool_error(result) and opened.is_recording():
                # A step told on this span may have named its failure already (the placement's exception).
                if "error.type" not in (getattr(opened, "attributes", None) or {}):
                    opened.set_attribute("error.type", "tool_error")
                opened.set_status(StatusCode.ERROR)
            return result
        finally:
            otel_context.detach(token)
            opened.end()


def _tool_error(result: HandlerResult) -> bool:
    """Whether a ``tools/call`` result reaches the wire as an error (the model's field or the wire's key)."""
    match result:
        case CallToolResult(is_error=True) | {"isError": True}:
            return True
        case _:
            return False
