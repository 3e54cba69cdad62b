"""Exporting traces: the OpenTelemetry SDK's tracer provider and an OTLP exporter, for one process's life.

Only imported where ``otel_endpoint`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``) is set: without it the
SDK is never loaded and :mod:`mcp_sandbox.tracing` makes no spans. The SDK and the exporters come
with the ``otel`` extra (``pip install 'mcp-sandbox[otel]'``). The provider is process-wide (the
MCP SDK's spans find it through the OpenTelemetry API's global), so it is installed by the command
that serves, around the whole server. This server's own spans become the SDK's off the event loop
(:mod:`.records`); spans leave in batches from the SDK's own thread; leaving the block flushes
what is pending, waiting at most :data:`SHUTDOWN_BOUND`.

The standard ``OTEL_*`` variables the SDK reads still apply: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the resource), ``OTEL_TRACES_SAMPLER`` (the sampler),
``OTEL_EXPORTER_OTLP_HEADERS``, ``..._CERTIFICATE`` and ``..._TIMEOUT`` (the exporter).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Final
from urllib.parse import urlsplit

from mcp_sandbox.errors import ConfigError

__all__ = ["PROTOCOLS", "SHUTDOWN_BOUND", "exporting", "traces_url"]

PROTOCOLS: Final = ("grpc", "http/protobuf")
# How long the exit waits for the last spans to leave.
SHUTDOWN_BOUND: Final = 2.0


def traces_url(endpoint: str, protocol: str) -> str:
    """Where the exporter sends: ``endpoint`` as the OTLP base URL (``http://collector:4318`` gets
    ``/v1/traces`` for http/protobuf, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` does; gRPC takes it as is).

    Raises:
        ConfigError: it is no http(s) URL, or ``protocol`` is none of :data:`PROTOCOLS`.
    """
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"otel_endpoint: {endpoint!r} is not an http:// or https:// URL")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"otel_protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if protocol == "grpc" or parts.path.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


@contextlib.contextmanager
def exporting(endpoint: str, protocol: str, version: str) -> Iterator[None]:
    """Export this process's spans to the OTLP collector at ``endpoint`` for this block.

    Raises:
        ConfigError: the endpoint or protocol is wrong, or the ``otel`` extra is not installed.
    """
    url = traces_url(endpoint, protocol)
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

        exporter: SpanExporter
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            exporter = GrpcExporter(endpoint=url, insecure=urlsplit(url).scheme == "http")
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            exporter = HttpExporter(endpoint=url)
        from mcp_sandbox.tracing import SCOPE
        from mcp_sandbox.tracing.records import OffLoop
    except ImportError as exc:
        raise ConfigError(
            f"otel_endpoint is set but the OpenTelemetry SDK is not installed ({exc.name} is missing):"
            " install mcp-sandbox[otel]"
        ) from exc
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, where set, win over these defaults.
    resource = Resource({"service.name": "mcp-sandbox", "service.version": version}).merge(
        OTELResourceDetector().detect()
    )
    # This server's spans reach the processors off the event loop (tracing.records); shut down below, bounded.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False, active_span_processor=OffLoop(SCOPE))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield
    finally:
        # Flushes the spans still queued; a collector that is down (the exporter retries for its
        # timeout) must not hold up the server's exit: the thread is left to die with the process.
        closing = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
        closing.start()
        closing.join(SHUTDOWN_BOUND)
