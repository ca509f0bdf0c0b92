"""The router does not plan a request whose deadline passed while it waited in baton.requests, on
either broker (the `bus` fixture)."""

from __future__ import annotations

import time
import uuid

import httpx

from baton.v1 import common_pb2, requests_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_router.main import create_app


async def test_an_expired_request_is_skipped_and_counted_and_a_live_one_is_planned(bus):
    app = create_app(bus.config(), tracer_provider=setup_tracing("baton-router", set_global=False))
    now_ms = int(time.time() * 1000)
    late, live = uuid.uuid4().hex, uuid.uuid4().hex

    def request(rid: str, deadline_ms: int) -> bytes:
        return requests_pb2.ChatRequest(request_id=rid, policy="baton", deadline_unix_ms=deadline_ms, messages=[
            common_pb2.ChatMessage(role="user", content="2+2?")]).SerializeToString()

    async with bus.running(app, topics.WORKFLOW) as seen:
        # Same key, so the same partition and order: the live request is handled after the late one.
        await bus.publish(app, topics.REQUESTS, "k", request(late, now_ms - 1000))
        await bus.publish(app, topics.REQUESTS, "k", request(live, now_ms + 60_000))
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == live.encode())
        planned_for = [workflow_pb2.WorkflowEvent.FromString(r.value).request_id for r in seen[topics.WORKFLOW].records]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as client:
            metrics = (await client.get("/metrics")).text
    assert workflow_pb2.WorkflowEvent.FromString(record.value).planned.plan.steps
    assert late not in planned_for
    assert "baton_router_expired_total 1.0" in metrics
