"""Tracing set-up: spans are recorded only where something exports them, a tenth of traces by default,
and trace context travels either way; a trace that is not sampled makes no span objects."""

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


def test_with_an_exporter_and_every_trace_sampled_spans_are_recorded(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    exporter = InMemorySpanExporter()
    provider = setup_tracing("t", exporter=exporter, set_global=False)
    recording, traceparent = _traceparent(provider)
    provider.force_flush()
    assert recording and int(traceparent.split("-")[3], 16) & 1
    assert [s.name for s in exporter.get_finished_spans()] == ["work"]


def test_with_an_exporter_a_tenth_of_new_traces_is_sampled_unless_the_environment_says(monkeypatch):
    from opentelemetry.sdk.trace.sampling import ParentBased

    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    provider = setup_tracing("t", exporter=InMemorySpanExporter(), set_global=False)
    assert isinstance(provider.sampler, ParentBased) and "TraceIdRatioBased{0.1}" in provider.sampler.get_description()
    sampled = sum(_traceparent(provider)[0] for _ in range(2000))
    assert 120 < sampled < 280, f"{sampled} of 2000 new traces sampled"
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    assert _traceparent(setup_tracing("t", exporter=InMemorySpanExporter(), set_global=False))[0]


def _remote(sampled: bool):
    flags = "01" if sampled else "00"
    carrier = {"traceparent": f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"}
    return TraceContextTextMapPropagator().extract(carrier)


def test_in_a_trace_not_sampled_no_span_is_made_and_the_context_travels_on(monkeypatch):
    from baton_platform.telemetry import span, start_span

    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    exporter = InMemorySpanExporter()
    provider = setup_tracing("t", exporter=exporter, set_global=False)
    tracer = provider.get_tracer("t")
    made = []
    start = tracer.start_span
    monkeypatch.setattr(tracer, "start_span", lambda *a, **k: made.append(a) or start(*a, **k))
    headers: dict[str, str] = {}
    with span(tracer, "orders process", context=_remote(False), attributes={"a": 1}) as current:
        current.set_attribute("b", 2)  # a no-op on the parent's non-recording span
        with span(tracer, "chat model"):
            TraceContextTextMapPropagator().inject(headers)
    start_span(tracer, "invoke_workflow baton", context=_remote(False)).end()
    assert made == [], "no span object for a trace that is not sampled"
    assert headers["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", \
        "the sender's context goes on as it came"

    with span(tracer, "orders process", context=_remote(True)) as current, span(tracer, "chat model"):
        TraceContextTextMapPropagator().inject(headers)
    provider.force_flush()
    assert sorted(s.name for s in exporter.get_finished_spans()) == ["chat model", "orders process"] and len(made) == 2
    trace_id, parent = headers["traceparent"].split("-")[1:3]
    assert trace_id == "0af7651916cd43dd8448eb211c80319c" and parent != "b7ad6b7169203331"
