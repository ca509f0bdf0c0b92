"""The router's handlers on FastStream's in-memory broker, with an in-memory span exporter."""

from __future__ import annotations

import asyncio

import pytest
from baton.v1 import common_pb2, dead_letter_pb2, requests_pb2, workflow_pb2
from faststream.kafka import KafkaMessage, TestKafkaBroker
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing
from baton_router.main import create_app


@pytest.fixture
def router(write_config):
    exporter = InMemorySpanExporter()
    provider = setup_tracing("baton-router", set_global=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(load_config(write_config()), tracer_provider=provider)
    seen: dict[str, list] = {"workflow": [], "dlq": []}

    @app.broker.subscriber(topics.WORKFLOW)
    async def workflow(msg: KafkaMessage):
        seen["workflow"].append(msg)

    @app.broker.subscriber(topics.DLQ)
    async def dlq(msg: KafkaMessage):
        seen["dlq"].append(msg)

    return app, seen, exporter


async def test_a_request_becomes_a_valid_plan_on_the_workflow_topic(router):
    app, seen, exporter = router
    request = requests_pb2.ChatRequest(request_id="abc", policy="baton",
                                       messages=[common_pb2.ChatMessage(role="user", content="2+2?")])
    async with TestKafkaBroker(app.broker) as br:
        await br.publish(request.SerializeToString(), topics.REQUESTS, key=b"abc")
        await asyncio.sleep(0)
    (msg,) = seen["workflow"]
    event = workflow_pb2.WorkflowEvent.FromString(msg.body)
    assert event.request_id == "abc" and msg.raw_message.key == b"abc"
    plan = event.planned.plan
    assert [s.worker for s in plan.steps] == ["gemini-flash", "gemini-pro"]
    assert list(plan.steps[1].access.steps) == [0] and not plan.fallback and plan.propensity == 1.0
    assert "traceparent" in msg.headers, "trace context travels in Kafka headers"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["plan"].attributes["baton.plan.steps"] == 2
    assert spans["plan"].context.trace_id == int(msg.headers["traceparent"].split("-")[1], 16)


async def test_malformed_requests_are_dead_lettered_with_their_reason(router):
    app, seen, _ = router
    async with TestKafkaBroker(app.broker) as br:
        await br.publish(b"\x08\x96\x01garbage\xff", topics.REQUESTS, key=b"k")
        await br.publish(requests_pb2.ChatRequest().SerializeToString(), topics.REQUESTS, key=b"k2")
    assert seen["workflow"] == []
    reasons = [m.headers[topics.DLQ_REASON_HEADER] for m in seen["dlq"]]
    assert "not a valid baton.v1.ChatRequest" in reasons[0]
    assert reasons[1] == "ChatRequest without request_id"
    letter = dead_letter_pb2.DeadLetter.FromString(seen["dlq"][0].body)
    assert letter.source_topic == topics.REQUESTS and letter.value.startswith(b"\x08\x96") and letter.service == "baton-router"


async def test_an_invalid_plan_falls_back_and_is_marked(write_config):
    from baton_router.conductor import Proposal
    from baton_router.planning import Planner
    from baton_workflow import Plan

    class Wild:
        name = "wild"

        async def propose(self, request):
            return Proposal(plan=Plan(workers=["gemini-pro", "ghost"], subtasks=["a", "b"], access=[[1], []]),
                            token_logprobs=[-0.5, -1.0], propensity=0.25)

        async def aclose(self):
            pass

    planner = Planner(load_config(write_config()), Wild())
    result = await planner.plan(requests_pb2.ChatRequest(request_id="x"))
    assert not result.valid and result.plan.fallback
    assert "unknown worker 'ghost'" in result.plan.invalid_reason and "not an earlier step" in result.plan.invalid_reason
    assert [s.worker for s in result.plan.steps] == ["gemini-pro"], "the safe plan: first worker, one step"
    assert list(result.plan.token_logprobs) == [-0.5, -1.0], "kept so training can give the plan reward 0"


async def test_an_unparseable_plan_keeps_its_log_probs_in_the_fallback(write_config):
    from baton_router.conductor import ConductorOutputError
    from baton_router.planning import Planner

    class Babbler:
        name = "babbler"

        async def propose(self, request):
            raise ConductorOutputError("not JSON", text="{{", token_logprobs=[-2.0], propensity=0.1,
                                       policy_version="v3")

        async def aclose(self):
            pass

    result = await Planner(load_config(write_config()), Babbler()).plan(requests_pb2.ChatRequest(request_id="x"))
    assert not result.valid and "unparseable plan: not JSON" in result.plan.invalid_reason
    assert list(result.plan.token_logprobs) == [-2.0] and result.plan.policy_version == "v3"


def inner_request(depth: int = 1) -> requests_pb2.ChatRequest:
    return requests_pb2.ChatRequest(
        request_id="p:1:1", messages=[common_pb2.ChatMessage(role="user", content="2+2?")],
        parent=requests_pb2.Parent(request_id="p", task_id="p:1:1", step=1, attempt=1, depth=depth,
                                   last_answer="4", steps=[requests_pb2.PriorStep(worker="gemini-pro", output="4")]))


async def test_an_inner_call_that_keeps_the_answer_completes_the_parents_step(router):
    app, seen, _ = router
    async with TestKafkaBroker(app.broker) as br:
        await br.publish(inner_request().SerializeToString(), topics.REQUESTS, key=b"p:1:1")
        await asyncio.sleep(0)
    (msg,) = seen["workflow"]
    event = workflow_pb2.WorkflowEvent.FromString(msg.body)
    # Keyed by the parent, so the synthesizer replica running the parent workflow receives it.
    assert event.request_id == "p" and msg.raw_message.key == b"p"
    done = event.step_completed
    assert (done.task_id, done.step, done.attempt, done.worker, done.output) == ("p:1:1", 1, 1, "conductor", "4")
    assert len(done.inner_plan.steps) == 0 and not done.inner_plan.fallback


async def test_an_inner_call_with_a_corrective_plan_starts_a_workflow(write_config):
    from testbed import default_config_data

    data = default_config_data()
    data["conductor"]["inner_plan"] = {"workers": ["llama-70b"], "subtasks": ["Fix it."], "access": [[]]}
    app = create_app(load_config(write_config(data=data)))
    seen = []

    @app.broker.subscriber(topics.WORKFLOW)
    async def workflow(msg: KafkaMessage):
        seen.append(workflow_pb2.WorkflowEvent.FromString(msg.body))

    async with TestKafkaBroker(app.broker) as br:
        await br.publish(inner_request().SerializeToString(), topics.REQUESTS, key=b"p:1:1")
    (event,) = seen
    assert event.request_id == "p:1:1" and event.planned.request.parent.request_id == "p"
    assert [s.worker for s in event.planned.plan.steps] == ["llama-70b"]


async def test_recursion_stops_at_the_depth_limit_by_keeping_the_answer(write_config):
    from baton_router.conductor import Proposal
    from baton_router.planning import Planner
    from baton_workflow import Plan

    class Recursive:
        name = "recursive"

        async def propose(self, request):
            return Proposal(plan=Plan(workers=["gemini-pro", "conductor"], subtasks=["a", "b"], access=[[], "all"]))

        async def aclose(self):
            pass

    planner = Planner(load_config(write_config()), Recursive())
    top = await planner.plan(requests_pb2.ChatRequest(request_id="x"))
    assert top.valid and [s.worker for s in top.plan.steps] == ["gemini-pro", "conductor"]
    deep = await planner.plan(inner_request(depth=1))
    assert not deep.valid and deep.plan.fallback and len(deep.plan.steps) == 0, "at the limit: keep the answer"
    assert "at most 1 level(s) deep" in deep.plan.invalid_reason
    off = Planner(load_config(write_config({"conductor": {**load_config(write_config()).conductor.model_dump(
        mode="json", exclude_none=True), "max_depth": 0}})), Recursive())
    assert not (await off.plan(requests_pb2.ChatRequest(request_id="y"))).valid, "max_depth 0 turns recursion off"
