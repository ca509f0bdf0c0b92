"""The executor does not call a provider for a task whose request's deadline has passed, on either
broker (the `bus` fixture): it answers the step with DEADLINE_EXCEEDED at once and counts it. On the
real broker, where the replica holds its share of the worker's one request a minute, the expired
task also does not wait its turn behind the live one."""

from __future__ import annotations

import time
import uuid

import httpx
from testbed import default_config_data, first_question

from baton.v1 import common_pb2, tasks_pb2, workflow_pb2
from baton_executor.main import create_app
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_workflow.errors import WorkflowError


def task(rid: str, deadline_ms: int) -> bytes:
    query = first_question()["prompt"]
    return tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro", query=query,
                          messages=[common_pb2.ChatMessage(role="user", content=query)],
                          deadline_unix_ms=deadline_ms).SerializeToString()


async def test_an_expired_task_is_answered_at_once_without_a_provider_call_and_counted(bus):
    data = default_config_data()
    for w in data["workers"]:
        if w["name"] == "gemini-pro":
            w["limits"] = {**w.get("limits", {}), "rpm": 1}  # one call a minute: the live task takes it
    app = create_app(bus.config(data=data), "sim", tracer_provider=setup_tracing("t", set_global=False))
    now_ms = int(time.time() * 1000)
    live, late = uuid.uuid4().hex, uuid.uuid4().hex
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(live, now_ms + 120_000))
        await bus.publish(app, topics.tasks_topic("sim"), "k", task(late, now_ms - 1000))
        started = time.monotonic()
        results = await seen[topics.WORKFLOW].wait(lambda r: r.key in (live.encode(), late.encode()), count=2,
                                                   timeout=15)
        answered_in = time.monotonic() - started
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://executor") as client:
            metrics = (await client.get("/metrics")).text
    events = {r.key.decode(): workflow_pb2.WorkflowEvent.FromString(r.value) for r in results}
    assert set(events) == {live, late}, f"both answered, the late one without waiting a minute ({answered_in:.1f} s)"
    assert events[live].WhichOneof("event") == "step_completed"
    failed = events[late].step_failed
    assert failed.error.code == WorkflowError.DEADLINE_EXCEEDED and not failed.retryable
    assert 'baton_executor_expired_total{provider="sim",worker="gemini-pro"} 1.0' in metrics
    assert 'baton_executor_requests_total{provider="sim",worker="gemini-pro"} 1.0' in metrics, "only the live one called"
