"""The executor does not call a provider for a task whose request's deadline has passed, on either
broker (the `bus` fixture), and counts it. A step of the synthesizer's is dropped without a result (the
synthesizer ends the workflow at its deadline itself); a one-step workflow the router sent straight
here (router.direct_single_step) is answered with DEADLINE_EXCEEDED, so that its episode is logged. On
the real broker, where the replica holds its share of the worker's one request a minute, the expired
task also does not wait its turn behind the live one, and its record is committed."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
from testbed import default_config_data, first_question

from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_executor.main import create_app
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_workflow import Plan, to_proto
from baton_workflow.errors import WorkflowError


def task(rid: str, deadline_ms: int, direct: bool = False) -> bytes:
    query = first_question()["prompt"]
    out = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro", query=query,
                         messages=[common_pb2.ChatMessage(role="user", content=query)], deadline_unix_ms=deadline_ms)
    if direct:  # the whole workflow, as the router sends a one-step plan with router.direct_single_step
        request = requests_pb2.ChatRequest(request_id=rid, messages=out.messages, deadline_unix_ms=deadline_ms)
        plan = to_proto(Plan(workers=["gemini-pro"], subtasks=["Answer."], access=[[]]), backend="static")
        out.workflow.CopyFrom(workflow_pb2.WorkflowPlanned(request=request, plan=plan))
    return out.SerializeToString()


def slow_pro(data: dict) -> dict:
    for w in data["workers"]:
        if w["name"] == "gemini-pro":
            w["limits"] = {**w.get("limits", {}), "rpm": 1}  # one call a minute: the live task takes it
    return data


async def test_an_expired_step_is_dropped_at_once_without_a_provider_call_or_a_result_and_counted(bus):
    app = create_app(bus.config(data=slow_pro(default_config_data())), "sim",
                     tracer_provider=setup_tracing("t", set_global=False))
    now_ms = int(time.time() * 1000)
    live, late = uuid.uuid4().hex, uuid.uuid4().hex
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(live, now_ms + 120_000))
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(late, now_ms - 1000))
        await seen[topics.WORKFLOW].wait(lambda r: r.key == live.encode(), timeout=15)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://executor") as client:
            assert await wait_for_async(lambda: expired_count(client), 10), "the late task was never counted"
            metrics = (await client.get("/metrics")).text
        results = [r.key.decode() for r in seen[topics.WORKFLOW].records]
    assert results == [live], "the late step was answered: the synthesizer ends its workflow at the deadline itself"
    assert 'baton_executor_requests_total{provider="sim",worker="gemini-pro"} 1.0' in metrics, "only the live one called"
    assert 'baton_consumer_lag{provider="sim",topic="baton.tasks.sim"} 0.0' in metrics, "both records done"


async def test_an_expired_one_step_workflow_is_answered_with_deadline_exceeded(bus):
    data = slow_pro(default_config_data())
    data["router"] = {"direct_single_step": True}
    app = create_app(bus.config(data=data), "sim", tracer_provider=setup_tracing("t", set_global=False))
    now_ms = int(time.time() * 1000)
    live, late = uuid.uuid4().hex, uuid.uuid4().hex
    async with bus.running(app, topics.RESPONSES) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(live, now_ms + 120_000, direct=True))
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(late, now_ms - 1000, direct=True))
        started = time.monotonic()
        answers = await seen[topics.RESPONSES].wait(lambda r: r.key in (live.encode(), late.encode()), count=2,
                                                    timeout=15)
        answered_in = time.monotonic() - started
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://executor") as client:
            metrics = (await client.get("/metrics")).text
    replies = {r.key.decode(): responses_pb2.Response.FromString(r.value) for r in answers}
    assert set(replies) == {live, late}, f"both answered, the late one without waiting a minute ({answered_in:.1f} s)"
    assert replies[live].answer
    assert replies[late].error.code == WorkflowError.DEADLINE_EXCEEDED
    assert [s.worker for s in replies[late].episode.steps] == ["gemini-pro"], "its episode is whole"
    assert 'baton_executor_expired_total{provider="sim",worker="gemini-pro"} 1.0' in metrics
    assert 'baton_executor_requests_total{provider="sim",worker="gemini-pro"} 1.0' in metrics, "only the live one called"


async def expired_count(client: httpx.AsyncClient) -> bool:
    metrics = (await client.get("/metrics")).text
    return 'baton_executor_expired_total{provider="sim",worker="gemini-pro"} 1.0' in metrics


async def wait_for_async(check, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False
