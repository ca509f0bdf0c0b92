"""The router's consumers, each scenario run in memory and on the real broker (the `bus` fixture)."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from testbed import default_config_data, header

from baton.v1 import common_pb2, dead_letter_pb2, requests_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_router.main import create_app


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = setup_tracing("baton-router", set_global=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def inner_request(rid: str, depth: int = 1) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(
        request_id=f"{rid}:1:1", messages=[common_pb2.ChatMessage(role="user", content="2+2?")],
        parent=requests_pb2.Parent(request_id=rid, task_id=f"{rid}:1:1", step=1, attempt=1, depth=depth,
                                   last_answer="4", steps=[requests_pb2.PriorStep(worker="gemini-pro", output="4")]))


async def test_a_request_becomes_a_valid_plan_on_the_workflow_topic(bus, traced):
    provider, exporter = traced
    app = create_app(bus.config(), tracer_provider=provider)
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, policy="baton",
                                       messages=[common_pb2.ChatMessage(role="user", content="2+2?")])
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.REQUESTS, rid, request.SerializeToString())
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
    event = workflow_pb2.WorkflowEvent.FromString(record.value)
    assert event.request_id == rid
    plan = event.planned.plan
    assert [s.worker for s in plan.steps] == ["gemini-flash", "gemini-pro"]
    assert list(plan.steps[1].access.steps) == [0] and not plan.fallback and plan.propensity == 1.0
    traceparent = header(record, "traceparent")
    assert traceparent, "trace context travels in Kafka headers"
    spans = [s for s in exporter.get_finished_spans() if s.name == "plan"
             and s.attributes["baton.request_id"] == rid]
    assert spans[0].attributes["baton.plan.steps"] == 2
    assert spans[0].context.trace_id == int(traceparent.split("-")[1], 16)


async def test_malformed_requests_are_dead_lettered_with_their_reason(bus, traced):
    app = create_app(bus.config(), tracer_provider=traced[0])
    k1, k2 = uuid.uuid4().hex, uuid.uuid4().hex
    async with bus.running(app, topics.WORKFLOW, topics.DLQ) as seen:
        await bus.publish(app, topics.REQUESTS, k1, b"\x08\x96\x01garbage\xff")
        await bus.publish(app, topics.REQUESTS, k2, requests_pb2.ChatRequest().SerializeToString())
        (first,) = await seen[topics.DLQ].wait(lambda r: r.key == k1.encode())
        (second,) = await seen[topics.DLQ].wait(lambda r: r.key == k2.encode())
        assert await seen[topics.WORKFLOW].wait(lambda r: r.key in (k1.encode(), k2.encode()), timeout=1) == []
    assert "not a valid baton.v1.ChatRequest" in header(first, topics.DLQ_REASON_HEADER)
    assert header(second, topics.DLQ_REASON_HEADER) == "ChatRequest without request_id"
    letter = dead_letter_pb2.DeadLetter.FromString(first.value)
    assert letter.source_topic == topics.REQUESTS and letter.value.startswith(b"\x08\x96") and letter.service == "baton-router"


async def test_an_inner_call_that_keeps_the_answer_completes_the_parents_step(bus, traced):
    app = create_app(bus.config(), tracer_provider=traced[0])
    rid = uuid.uuid4().hex
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.REQUESTS, f"{rid}:1:1", inner_request(rid).SerializeToString())
        # Keyed by the parent, so the synthesizer replica running the parent workflow receives it.
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
    event = workflow_pb2.WorkflowEvent.FromString(record.value)
    assert event.request_id == rid
    done = event.step_completed
    assert (done.task_id, done.step, done.attempt, done.worker, done.output) == (f"{rid}:1:1", 1, 1, "conductor", "4")
    assert len(done.inner_plan.steps) == 0 and not done.inner_plan.fallback


async def test_an_inner_call_with_a_corrective_plan_starts_a_workflow(bus, traced):
    data = default_config_data()
    data["conductor"]["inner_plan"] = {"workers": ["llama-70b"], "subtasks": ["Fix it."], "access": [[]]}
    app = create_app(bus.config(data=data), tracer_provider=traced[0])
    rid = uuid.uuid4().hex
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.REQUESTS, f"{rid}:1:1", inner_request(rid).SerializeToString())
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == f"{rid}:1:1".encode())
    event = workflow_pb2.WorkflowEvent.FromString(record.value)
    assert event.request_id == f"{rid}:1:1" and event.planned.request.parent.request_id == rid
    assert [s.worker for s in event.planned.plan.steps] == ["llama-70b"]
