"""Tracing set-up: spans are recorded only where something exports them, and trace context travels either way."""

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from baton_platform.telemetry import setup_tracing


def _traceparent(provider) -> tuple[bool, str]:
    headers: dict[str, str] = {}
    with provider.get_tracer("t").start_as_current_span("work") as span:
        TraceContextTextMapPropagator().inject(headers)
        return span.is_recording(), headers.get("traceparent", "")


def test_without_an_exporter_spans_are_not_recorded_but_a_trace_id_still_travels(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)
    recording, traceparent = _traceparent(setup_tracing("t", set_global=False))
    assert not recording
    version, trace_id, span_id, flags = traceparent.split("-")
    assert int(trace_id, 16) and int(span_id, 16) and not int(flags, 16) & 1  # the sampled flag is off


def test_with_an_exporter_spans_are_recorded_and_sampled(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    exporter = InMemorySpanExporter()
    provider = setup_tracing("t", exporter=exporter, set_global=False)
    recording, traceparent = _traceparent(provider)
    provider.force_flush()
    assert recording and int(traceparent.split("-")[3], 16) & 1
    assert [s.name for s in exporter.get_finished_spans()] == ["work"]
