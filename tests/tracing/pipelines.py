"""The two ways a span of this server is made, for the in-process tracing tests to run each script under both.

The SDK's tracer makes them under a provider of the SDK's own (any one an application installs);
:mod:`mcp_sandbox.tracing.spans` makes them where the provider's span processor is
:class:`mcp_sandbox.tracing.records.OffLoop` (the pipeline ``otel_endpoint`` installs). The scripts
build their provider as ``provider = TracerProvider()`` and flush it before reading what was exported.
"""

from __future__ import annotations

from typing import Final

import pytest

__all__ = ["PIPELINES", "under"]

PIPELINES: Final = pytest.mark.parametrize("pipeline", ["sdk", "own"])

_PROVIDERS: Final = {
    "sdk": "TracerProvider()",
    "own": "TracerProvider(active_span_processor=__import__('mcp_sandbox.tracing.records').tracing.records.OffLoop("
    "'mcp_sandbox'))",
}


def under(script: str, pipeline: str) -> str:
    """``script`` with its tracer provider built for ``pipeline`` (``sdk`` or ``own``)."""
    assert script.count("provider = TracerProvider()") == 1
    return script.replace("provider = TracerProvider()", f"provider = {_PROVIDERS[pipeline]}")
