"""The gateway's replies consumer, each scenario run in memory and on the real broker: the responses a
workflow would send for a request are played back through the broker, and the client's answer (SSE
events for a streaming request) is checked; a reply that does not decode is dead-lettered; a broker
slow to take the request does not push the answer past the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from testbed import gateway_metrics, header

import baton_gateway.main as gateway
from baton.v1 import common_pb2, requests_pb2, responses_pb2
from baton_gateway.replies import Replies
from baton_platform import topics
from baton_platform.consumer import Publisher
from baton_platform.telemetry import setup_tracing

CHAT = {"model": "baton", "messages": [{"role": "user", "content": "Q?"}]}


class AssignedReplies(Replies):
    """The in-memory broker assigns no partitions; this replica owns partition 0 of baton.responses."""

    def __init__(self) -> None:
        super().__init__()
        self._partitions = [0]


@pytest.fixture
def gateway_on(bus, monkeypatch):
    """The gateway on the bus, running, with an HTTP client; yields (app, client, taps)."""

    @contextlib.asynccontextmanager
    async def run(*tapped: str, **sections):
        if bus.bootstrap is None:
            monkeypatch.setattr(gateway, "Replies", AssignedReplies)
        app = gateway.create_app(bus.config(**sections), tracer_provider=setup_tracing("t", set_global=False))
        async with bus.running(app, *tapped) as taps:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
                yield app, client, taps

    return run


def delta(text: str, offset: int, task_id: str = "t:1:1") -> responses_pb2.Response:
    return responses_pb2.Response(delta=responses_pb2.Delta(text=text, offset=offset, task_id=task_id))


def final(answer: str) -> responses_pb2.Response:
    episode = responses_pb2.Episode(total=common_pb2.Usage(input_tokens=7, output_tokens=5))
    return responses_pb2.Response(answer=answer, episode=episode)


async def stream_with(bus, gateway_on, script: list[responses_pb2.Response], body: dict | None = None):
    """POST a streaming request; the 'workflow' answers it with `script` on the partition the request
    names. Returns the SSE data payloads."""
    async with gateway_on(topics.REQUESTS) as (app, client, taps):
        post = asyncio.create_task(client.post("/v1/chat/completions", json=body or {**CHAT, "stream": True},
                                               timeout=30))
        (record,) = await taps[topics.REQUESTS].wait()
        request = requests_pb2.ChatRequest.FromString(record.value)
        for response in script:
            response.request_id = request.request_id
            await bus.publish(app, topics.RESPONSES, request.request_id, response.SerializeToString(),
                              partition=request.reply_partition)
        r = await post
        (replies,) = [c for c in app.state.service.consumers if c.topic == topics.RESPONSES]
        owned = {tp.partition for tp in replies.assignment()} or {0}  # in memory: AssignedReplies' partition
    assert request.stream and request.reply_partition in owned
    lines = [line for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def contents(events) -> list[str]:
    return [e["choices"][0]["delta"]["content"] for e in events
            if e.get("choices") and e["choices"][0]["delta"].get("content")]


async def test_deltas_become_content_chunks_and_the_answer_completes_them(bus, gateway_on):
    progress = responses_pb2.Response(progress=responses_pb2.Progress(step=1, steps=2, worker="w", state="started"))
    events = await stream_with(bus, gateway_on, [
        progress, delta("The ", 0), delta("cat ", 4), delta("The c", 0), delta("dog", 0, task_id="t:1:2"),
        final("The cat sat.")],
        body={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert contents(events) == ["The ", "cat ", "sat."]
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 12


async def test_an_answer_that_does_not_extend_the_streamed_text_ends_in_an_error(bus, gateway_on):
    events = await stream_with(bus, gateway_on, [delta("The cat ", 0), final("A dog barked.")])
    assert contents(events) == ["The cat "]
    assert events[-1]["error"]["code"] == "stream_diverged"
    assert "A dog" not in json.dumps(events), "the other answer is never sent"


@pytest.mark.parametrize("script", [[final("Whole answer.")], [delta("Whole answer.", 0), final("Whole answer.")]])
async def test_without_deltas_or_with_all_of_them_the_text_is_the_answer(bus, gateway_on, script):
    events = await stream_with(bus, gateway_on, script)
    assert "".join(contents(events)) == "Whole answer." and "usage" not in events[-1]


async def test_a_reply_that_does_not_decode_is_dead_lettered_and_counted(bus, gateway_on):
    async with gateway_on(topics.DLQ) as (app, client, taps):
        await bus.publish(app, topics.RESPONSES, "r", b"\xff not a response")
        (letter,) = await taps[topics.DLQ].wait(lambda r: r.key == b"r")
        # Counted once the broker acknowledged the letter, which a reader may see a moment sooner.
        counted = 'baton_dlq_messages_total{topic="baton.responses"} 1.0'
        for _ in range(100):
            metrics = await gateway_metrics(app)
            if counted in metrics:
                break
            await asyncio.sleep(0.05)
    assert "not a valid baton.v1.Response" in header(letter, topics.DLQ_REASON_HEADER)
    assert counted in metrics


async def test_a_broker_slow_to_take_the_request_does_not_push_the_answer_past_the_deadline(bus, gateway_on,
                                                                                           monkeypatch):
    async with gateway_on(gateway={"request_timeout_s": 1, "auth": "none"}) as (_, client, _taps):
        send = Publisher.send

        async def slow_send(*args, **kwargs):
            await asyncio.sleep(4)  # a broker restarting: the send waits for it
            return await send(*args, **kwargs)

        monkeypatch.setattr(Publisher, "send", slow_send)
        assert (await client.get("/health/ready")).status_code == 200, "the deadline, not readiness, answers"
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json=CHAT, timeout=30)
        elapsed = time.monotonic() - started
    assert r.status_code in (503, 504), r.text
    assert elapsed < 3, f"answered after {elapsed:.1f} s, past the 1 s deadline"
