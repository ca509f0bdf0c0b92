"""The gateway's streaming path in memory: the responses a workflow would send for a streaming request
are played back through the broker, and the client's SSE events are checked."""

from __future__ import annotations

import json

import httpx
import pytest
from faststream.kafka import KafkaMessage, TestKafkaBroker

import baton_gateway.main as gateway
from baton.v1 import common_pb2, requests_pb2, responses_pb2
from baton_gateway.replies import Replies
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing


class AssignedReplies(Replies):
    """The in-memory broker assigns no partitions; this replica owns partition 0 of baton.responses."""

    def __init__(self) -> None:
        super().__init__()
        self._partitions = [0]


def delta(text: str, offset: int, task_id: str = "t:1:1") -> responses_pb2.Response:
    return responses_pb2.Response(delta=responses_pb2.Delta(text=text, offset=offset, task_id=task_id))


def final(answer: str) -> responses_pb2.Response:
    episode = responses_pb2.Episode(total=common_pb2.Usage(input_tokens=7, output_tokens=5))
    return responses_pb2.Response(answer=answer, episode=episode)


async def stream_with(write_config, monkeypatch, script: list[responses_pb2.Response], body: dict | None = None):
    """POST a streaming request; the 'workflow' answers it with `script`. Returns the SSE data payloads."""
    monkeypatch.setattr(gateway, "Replies", AssignedReplies)
    app = gateway.create_app(load_config(write_config()), tracer_provider=setup_tracing("t", set_global=False))
    broker = app.state.service.broker
    seen: list[requests_pb2.ChatRequest] = []

    @broker.subscriber(topics.REQUESTS)
    async def workflow(msg: KafkaMessage):
        request = requests_pb2.ChatRequest.FromString(msg.body)
        seen.append(request)
        for response in script:
            response.request_id = request.request_id
            await broker.publish(response.SerializeToString(), topics.RESPONSES, key=request.request_id.encode())

    async with TestKafkaBroker(broker):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            r = await client.post("/v1/chat/completions", json=body or {
                "model": "baton", "stream": True, "messages": [{"role": "user", "content": "Q?"}]})
    assert seen and seen[0].stream and seen[0].reply_partition == 0
    lines = [line for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def contents(events) -> list[str]:
    return [e["choices"][0]["delta"]["content"] for e in events
            if e.get("choices") and e["choices"][0]["delta"].get("content")]


async def test_deltas_become_content_chunks_and_the_answer_completes_them(write_config, monkeypatch):
    progress = responses_pb2.Response(progress=responses_pb2.Progress(step=1, steps=2, worker="w", state="started"))
    events = await stream_with(write_config, monkeypatch, [
        progress, delta("The ", 0), delta("cat ", 4), delta("The c", 0), delta("dog", 0, task_id="t:1:2"),
        final("The cat sat.")],
        body={"model": "baton", "stream": True, "stream_options": {"include_usage": True},
              "messages": [{"role": "user", "content": "Q?"}]})
    assert contents(events) == ["The ", "cat ", "sat."]
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "stop"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 12


async def test_an_answer_that_does_not_extend_the_streamed_text_ends_in_an_error(write_config, monkeypatch):
    events = await stream_with(write_config, monkeypatch, [delta("The cat ", 0), final("A dog barked.")])
    assert contents(events) == ["The cat "]
    assert events[-1]["error"]["code"] == "stream_diverged"
    assert "A dog" not in json.dumps(events), "the other answer is never sent"


@pytest.mark.parametrize("script", [[final("Whole answer.")], [delta("Whole answer.", 0), final("Whole answer.")]])
async def test_without_deltas_or_with_all_of_them_the_text_is_the_answer(write_config, monkeypatch, script):
    events = await stream_with(write_config, monkeypatch, script)
    assert "".join(contents(events)) == "Whole answer." and "usage" not in events[-1]


async def test_a_reply_that_does_not_decode_is_dead_lettered_and_counted(write_config):
    app = gateway.create_app(load_config(write_config()), tracer_provider=setup_tracing("t", set_global=False))
    broker = app.state.service.broker
    letters: list[KafkaMessage] = []

    @broker.subscriber(topics.DLQ)
    async def dlq(msg: KafkaMessage):
        letters.append(msg)

    async with TestKafkaBroker(broker) as br:
        await br.publish(b"\xff not a response", topics.RESPONSES, key=b"r")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            metrics = (await client.get("/metrics")).text
    (letter,) = letters
    assert "not a valid baton.v1.Response" in letter.headers[topics.DLQ_REASON_HEADER]
    assert 'baton_dlq_messages_total{topic="baton.responses"} 1.0' in metrics
