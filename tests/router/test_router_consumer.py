"""The router's consumers, each scenario run in memory and on the real broker (the `bus` fixture):
requests become plans, bad ones dead letters, inner calls keep answers or start workflows, and a
router serving the policy conductor follows baton.policy (rollout and rollback, no restart)."""

from __future__ import annotations

import asyncio
import random
import uuid
from argparse import Namespace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from testbed import default_config_data, header, tracer

from baton.v1 import common_pb2, dead_letter_pb2, requests_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_policy import artefact_digest
from baton_policy.fastpolicy import Episode, Policy
from baton_policy.templates import single
from baton_router.main import create_app
from baton_trainer import train_fast
from baton_trainer.store import PolicyStore, Stored, announce, update


@pytest.fixture
def traced(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")  # every trace, not the default tenth
    exporter = InMemorySpanExporter()
    provider = setup_tracing("baton-router", exporter=exporter, set_global=False)
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
    provider.force_flush()
    spans = [s for s in exporter.get_finished_spans() if s.name == "plan"
             and s.attributes["baton.request_id"] == rid]
    assert spans[0].attributes["baton.plan.steps"] == 2
    assert spans[0].context.trace_id == int(traceparent.split("-")[1], 16)


@pytest.mark.parametrize("direct", [None, False])
async def test_a_one_step_plan_goes_straight_to_its_executor_unless_turned_off(bus, traced, direct):
    """router.direct_single_step, on by default: a one-step plan on a worker without a fallback is the
    executor's whole workflow (the task carries it); turned off, it is a plan for the synthesizer."""
    data = default_config_data()  # its sim workers have no fallback
    data["conductor"]["plan"] = {"workers": ["llama-70b"], "subtasks": ["Answer it."], "access": [[]]}
    if direct is not None:
        data["router"] = {"direct_single_step": direct}
    app = create_app(bus.config(data=data), tracer_provider=traced[0])
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="2+2?")])
    to_executor, to_synthesizer = topics.tasks_topic("sim"), topics.WORKFLOW
    expected, other = (to_synthesizer, to_executor) if direct is False else (to_executor, to_synthesizer)
    async with bus.running(app, to_executor, to_synthesizer) as seen:
        await bus.publish(app, topics.REQUESTS, rid, request.SerializeToString())
        (record,) = await seen[expected].wait(lambda r: r.key == rid.encode())
        assert await seen[other].wait(lambda r: r.key == rid.encode(), timeout=1) == []
    if direct is False:
        plan = workflow_pb2.WorkflowEvent.FromString(record.value).planned.plan
    else:
        task = tasks_pb2.Task.FromString(record.value)
        assert task.worker == "llama-70b" and task.workflow.request.request_id == rid
        plan = task.workflow.plan
    assert [s.worker for s in plan.steps] == ["llama-70b"]


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


MODELS = ["gemini-1.5-pro-002", "gemini-1.5-flash-002", "Meta-Llama-3_1-70B-Instruct"]


def trained(favourite: str, seed: int) -> Policy:
    rng = random.Random(seed)
    eps = [Episode(f"question {i}", m, float(m == favourite), 1 / 3)
           for i in range(300) for m in [rng.choice(MODELS)]]
    return Policy.fit_logged(eps, [single(m) for m in MODELS])


async def test_routers_load_published_policies_and_roll_back(bus, tmp_path, monkeypatch):
    # A name of its own: the shared broker's compacted baton.policy keeps these versions for later
    # tests, whose routers and gateways serve only the default name.
    name = f"baton-{uuid.uuid4().hex[:6]}"
    # Every plan on baton.workflow, one step or more (direct_single_step would send one-step plans to the executor).
    config = bus.config(conductor={"backend": "policy", "policy": {"epsilon": 0.0}},
                        router={"policy_name": name, "policy_store": str(tmp_path / "store"),
                                "direct_single_step": False})
    app = create_app(config, tracer_provider=tracer())
    store = PolicyStore(str(tmp_path / "store"))
    uris = {}
    for i, (version, favourite) in enumerate((("v1", MODELS[0]), ("v2", MODELS[1]))):
        saved = trained(favourite, i).save(tmp_path / version)
        uris[version] = store.put(name, version, saved, {"version": version, "uri": store.uri(name, version),
                                                         "published_unix_ms": i})
    rolled_back = []
    if bus.bootstrap is None:
        # The trainer's CLI writes to Kafka itself: in memory, its update is handed to the broker here.
        monkeypatch.setattr(train_fast, "announce_sync", lambda kafka, message: rolled_back.append(message))

    async def publish_policy(message) -> None:
        if bus.bootstrap is None:
            await bus.publish(app, topics.POLICY, message.name, message.SerializeToString())
        else:
            await announce(config.kafka, message)

    async with bus.running(app, topics.WORKFLOW, topics.DLQ) as seen:
        async def planned_version() -> tuple[str, list[str]]:
            rid = uuid.uuid4().hex
            req = requests_pb2.ChatRequest(request_id=rid,
                                           messages=[common_pb2.ChatMessage(role="user", content="question 7")])
            await bus.publish(app, topics.REQUESTS, rid, req.SerializeToString())
            (rec,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
            plan = workflow_pb2.WorkflowEvent.FromString(rec.value).planned.plan
            return plan.policy_version, [s.worker for s in plan.steps]

        async def wait_version(version, timeout=30):
            for _ in range(int(timeout / 0.5)):
                got = await planned_version()
                if got[0] == version:
                    return got
                await asyncio.sleep(0.5)
            raise AssertionError(f"router never served {version}; last {got}")

        version, _ = await planned_version()
        assert version in ("uniform", "v1", "v2")  # whatever the compacted topic held before
        await publish_policy(update(name, "v1", uris["v1"]))
        assert await wait_version("v1") == ("v1", ["gemini-pro"])
        # Records anyone on the bus could write: a version from outside the store (its digest right), and
        # one whose digest is not its content's. Both are refused, with the reason, and v1 stays.
        outside = trained(MODELS[2], 5).save(tmp_path / "elsewhere")
        forged = [update(name, "outside", Stored(str(outside), artefact_digest(outside))),
                  update(name, "tampered", Stored(uris["v1"].uri, uris["v2"].digest))]
        for message in forged:
            await publish_policy(message)
        letters = await seen[topics.DLQ].wait(lambda r: r.key == name.encode(), count=2)
        reasons = sorted(header(r, topics.DLQ_REASON_HEADER) for r in letters)
        assert "is not inside the policy store" in reasons[0] and "not the published sha256:" in reasons[1], reasons
        assert await planned_version() == ("v1", ["gemini-pro"])
        await publish_policy(update(name, "v2", uris["v2"]))
        assert await wait_version("v2") == ("v2", ["gemini-flash"])
        out = await asyncio.to_thread(train_fast.rollback, Namespace(config=str(bus.config_path), store=store.root,
                                                                    name=name, to=None))
        assert {k: out[k] for k in ("rolled_back", "version", "uri")} == {"rolled_back": True, "version": "v1",
                                                                           "uri": uris["v1"].uri}
        assert [(m.version, m.rollback) for m in rolled_back] == ([("v1", True)] if bus.bootstrap is None else [])
        for message in rolled_back:
            await publish_policy(message)
        assert await wait_version("v1") == ("v1", ["gemini-pro"])
