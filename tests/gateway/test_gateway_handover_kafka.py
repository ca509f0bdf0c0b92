"""Two gateway replicas on the real broker: a replica joining the group takes some of baton.responses'
partitions while the first replica still waits on requests whose replies go there. The first one
still answers every one of them (baton_gateway.handover), as a rolling upgrade needs."""

from __future__ import annotations

import asyncio
import time

import httpx
from testbed import Bus

import baton_gateway.main as gateway
from baton.v1 import requests_pb2, responses_pb2
from baton_platform import topics
from baton_platform.telemetry import setup_tracing

CHAT = {"model": "baton", "messages": [{"role": "user", "content": "Q?"}]}
REQUESTS = 4  # one per partition: the gateway asks on its partitions in turn


def replies_consumer(app):
    (consumer,) = [c for c in app.state.service.consumers if c.topic == topics.RESPONSES]
    return consumer


async def test_requests_waiting_on_partitions_a_rebalance_moves_are_still_answered(kafka_bootstrap, write_config):
    bus = Bus("kafka", write_config, kafka_bootstrap)
    config = bus.config(gateway={"auth": "none", "request_timeout_s": 60})
    first = gateway.create_app(config, tracer_provider=setup_tracing("t", set_global=False))
    second = gateway.create_app(config, tracer_provider=setup_tracing("t", set_global=False))
    async with bus.running(first, topics.REQUESTS) as taps:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://gw") as client:
            posts = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, timeout=90))
                     for _ in range(REQUESTS)]
            records = await taps[topics.REQUESTS].wait(count=REQUESTS)
            asked = [requests_pb2.ChatRequest.FromString(r.value) for r in records]
            assert len({r.reply_partition for r in asked}) == REQUESTS, [r.reply_partition for r in asked]
            async with bus.running(second):
                deadline = time.monotonic() + 30
                while len(replies_consumer(first).assignment()) == REQUESTS:
                    assert time.monotonic() < deadline, "the first replica kept every partition"
                    await asyncio.sleep(0.2)
                kept = {tp.partition for tp in replies_consumer(first).assignment()}
                moved = [r for r in asked if r.reply_partition not in kept]
                assert moved, "no waiting request's partition went to the second replica"
                for r in asked:
                    answer = responses_pb2.Response(request_id=r.request_id, answer=f"answer {r.request_id}")
                    await bus.publish(first, topics.RESPONSES, r.request_id, answer.SerializeToString(),
                                      partition=r.reply_partition)
                answers = await asyncio.gather(*posts)
    assert [reply.status_code for reply in answers] == [200] * REQUESTS, [reply.text for reply in answers]
    # The requests were read in the order they reached the broker, not the order they were posted.
    got = {reply.headers["x-baton-request-id"]: reply.json()["choices"][0]["message"]["content"] for reply in answers}
    assert got == {r.request_id: f"answer {r.request_id}" for r in asked}
    print(f"{len(moved)} of {REQUESTS} waiting requests' partitions moved; all {REQUESTS} answered")
