"""OpenTelemetry set-up from the standard OTEL_* environment variables.

Export is on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set, over the protocol in
OTEL_EXPORTER_OTLP_PROTOCOL (`grpc`, the default, or `http/protobuf`). OTEL_SERVICE_NAME overrides
the service name; OTEL_TRACES_EXPORTER=none turns export off. With export off, no span is recorded.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF


def _otlp_exporter() -> SpanExporter | None:
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    ).strip().lower()
    # The exporters read endpoint, headers, timeout and TLS settings from the same variables.
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported; use grpc or http/protobuf")


def setup_tracing(service_name: str, *, exporter: SpanExporter | None = None, set_global: bool = True) -> TracerProvider:
    """Build the process's tracer provider. Tests pass their own exporter and set_global=False."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
    chosen = exporter if exporter is not None else _otlp_exporter()
    # With nothing to export to, spans are not recorded (recording them cost CPU on every record
    # for nothing); trace ids are still made and travel in headers, unsampled.
    provider = TracerProvider(resource=resource, sampler=None if chosen is not None else ALWAYS_OFF)
    if chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider
