"""OTLP receivers on loopback for the tracing tests, built on the collector's official service definitions.

:func:`grpc_receiver` serves ``opentelemetry.proto.collector.trace.v1.TraceService`` with grpcio and
the servicer generated from ``opentelemetry-proto`` (what an OpenTelemetry Collector's OTLP receiver
serves); :func:`http_receiver` takes OTLP/HTTP's ``POST /v1/traces`` and decodes the body with the
same generated ``ExportTraceServiceRequest``. No OpenTelemetry Collector binary is to be had on
these machines (no Debian or PyPI package; its Go module builds too slowly for a test), so a test
is its own collector. Both keep every request received, whole, for the test to read.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["Received", "grpc_receiver", "http_receiver"]


@dataclass
class Received:
    """Every export request a receiver took, and a way to wait for a span."""

    requests: list[trace_service_pb2.ExportTraceServiceRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def spans(self) -> list[Span]:
        """Every span received so far, from every resource and scope."""
        with self._lock:
            return [
                span
                for request in self.requests
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]

    def wire(self) -> bytes:
        """Every request received, as the bytes of the wire format (to grep for what must not be there)."""
        with self._lock:
            return b"".join(request.SerializeToString() for request in self.requests)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self._received = received

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._received.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/gRPC receiver on a free loopback port for this block; yields its endpoint URL and what it receives."""
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The generated module has no type annotations.
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(received), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None).wait(timeout=10)


@contextlib.contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP (protobuf) receiver on a free loopback port for this block; yields its base URL and what it
    receives."""
    received = Received()

    class Traces(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Traces)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
