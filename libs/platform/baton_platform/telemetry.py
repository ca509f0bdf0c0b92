"""OpenTelemetry set-up from the standard OTEL_* environment variables.

Export is on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set, over the protocol in
OTEL_EXPORTER_OTLP_PROTOCOL (`grpc`, the default, or `http/protobuf`). OTEL_SERVICE_NAME overrides
the service name; OTEL_TRACES_EXPORTER=none turns export off. With export off, no span is recorded.
With export on, a tenth of new traces is recorded whole (`parentbased_traceidratio`, 0.1) unless
OTEL_TRACES_SAMPLER (and OTEL_TRACES_SAMPLER_ARG) say otherwise.

`span` is how the services open a span: in a trace that is not sampled it makes none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.util.types import Attributes

# The share of new traces recorded when spans are exported and OTEL_TRACES_SAMPLER is unset.
DEFAULT_TRACE_SAMPLE = 0.1


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
    sampler: Sampler | None = ALWAYS_OFF
    if chosen is not None:
        # None: the SDK builds the sampler OTEL_TRACES_SAMPLER names.
        sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else ParentBased(TraceIdRatioBased(DEFAULT_TRACE_SAMPLE))
    provider = TracerProvider(resource=resource, sampler=sampler)
    if chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def _follows_parent(tracer: trace.Tracer) -> bool:
    """Whether `tracer` records no span under a parent that is not sampled: the SDK's parent-based
    samplers (every OTEL_TRACES_SAMPLER but always_on and traceidratio) and always-off."""
    sampler = getattr(tracer, "sampler", None)
    return isinstance(sampler, ParentBased) or sampler is ALWAYS_OFF


def _unsampled_parent(tracer: trace.Tracer, context: otel_context.Context | None) -> trace.Span | None:
    """The parent span in `context` (else the current one) when its trace is not sampled and `tracer`
    would therefore record no child of it; None when a span is to be made."""
    parent = trace.get_current_span(context)
    flags = parent.get_span_context()
    if flags.is_valid and not flags.trace_flags.sampled and _follows_parent(tracer):
        return parent
    return None


@contextlib.contextmanager
def span(tracer: trace.Tracer, name: str, *, context: otel_context.Context | None = None,
         kind: trace.SpanKind = trace.SpanKind.INTERNAL, attributes: Attributes = None) -> Iterator[trace.Span]:
    """`tracer.start_as_current_span(name, ...)`, under `context` (else the current one), except in a
    trace that is not sampled, where the sampler would record nothing: there no span is made, and the
    parent's context is current for the block as it is, so what is sent from inside carries the same
    trace on. The block gets the parent's non-recording span, on which every call does nothing."""
    parent = _unsampled_parent(tracer, context)
    if parent is not None:
        token = otel_context.attach(context) if context is not None else None
        try:
            yield parent
        finally:
            if token is not None:
                otel_context.detach(token)
        return
    with tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes) as made:
        yield made


def start_span(tracer: trace.Tracer, name: str, *, context: otel_context.Context | None = None,
               attributes: Attributes = None) -> trace.Span:
    """`tracer.start_span` for a span the caller ends itself, or, in a trace that is not sampled (see
    `span`), the parent's non-recording span: ending it does nothing."""
    parent = _unsampled_parent(tracer, context)
    if parent is not None:
        return parent
    return tracer.start_span(name, context=context, attributes=attributes)
