"""The executor in memory, for a streaming request's answering task: its text goes to baton.responses
as Delta responses (on the request's reply partition) before the step's result."""

from __future__ import annotations

import asyncio
import csv
import sys

from faststream.kafka import KafkaMessage, TestKafkaBroker
from testbed import MMLU_PRO, default_config_data

from baton.v1 import common_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_executor.main import create_app
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing
from baton_tools.standins.server import run_standin


async def run_task(config_path, provider: str, task: tasks_pb2.Task) -> list[tuple[str, KafkaMessage]]:
    """Everything the executor published for `task`, in order, as (topic, message)."""
    app = create_app(load_config(config_path), provider, tracer_provider=setup_tracing("t", set_global=False))
    out: list[tuple[str, KafkaMessage]] = []

    @app.broker.subscriber(topics.WORKFLOW)
    async def workflow(msg: KafkaMessage):
        out.append((topics.WORKFLOW, msg))

    @app.broker.subscriber(topics.RESPONSES)
    async def responses(msg: KafkaMessage):
        out.append((topics.RESPONSES, msg))

    async with TestKafkaBroker(app.broker) as br:
        await br.publish(task.SerializeToString(), topics.tasks_topic(provider), key=task.request_id.encode())
        for _ in range(400):
            if any(t == topics.WORKFLOW for t, _ in out):
                break
            await asyncio.sleep(0.05)
    return out


def split(out):
    deltas = [responses_pb2.Response.FromString(m.body) for t, m in out if t == topics.RESPONSES]
    (result,) = [workflow_pb2.WorkflowEvent.FromString(m.body) for t, m in out if t == topics.WORKFLOW]
    assert out[-1][0] == topics.WORKFLOW, "every delta goes out before the step's result"
    return deltas, result


async def test_a_streaming_task_on_a_provider_that_streams_sends_its_text_in_pieces(write_config):
    with run_standin("openai", chunk_delay_ms=10) as url:
        data = default_config_data()
        data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                                "base_url": url})
        task = tasks_pb2.Task(task_id="r:1:1", request_id="r", step=1, attempt=1, worker="local-llm", stream=True,
                              reply_partition=0, messages=[common_pb2.ChatMessage(role="user", content="w " * 80)])
        out = await run_task(write_config(data=data), "openai_compatible", task)
    deltas, result = split(out)
    output = result.step_completed.output
    assert output.startswith("[local-model] saw:")
    assert len(deltas) > 1 and all(d.request_id == "r" and d.delta.task_id == "r:1:1" for d in deltas)
    assert "".join(d.delta.text for d in deltas) == output
    assert [d.delta.offset for d in deltas][0] == 0


async def test_a_streaming_task_on_a_provider_that_does_not_stream_sends_one_delta(write_config):
    csv.field_size_limit(sys.maxsize)
    question = next(csv.DictReader(MMLU_PRO.open(newline="")))["prompt"]
    task = tasks_pb2.Task(task_id="r:0:1", request_id="r", step=0, attempt=1, worker="gemini-pro", stream=True,
                          reply_partition=0, query=question,
                          messages=[common_pb2.ChatMessage(role="user", content=question)])
    deltas, result = split(await run_task(write_config(), "sim", task))
    output = result.step_completed.output
    assert output and [(d.delta.offset, d.delta.text) for d in deltas] == [(0, output)]


async def test_a_task_that_does_not_stream_sends_no_delta(write_config):
    task = tasks_pb2.Task(task_id="r:0:1", request_id="r", step=0, attempt=1, worker="gemini-pro", query="q",
                          messages=[common_pb2.ChatMessage(role="user", content="q")])
    deltas, result = split(await run_task(write_config(), "sim", task))
    assert deltas == [] and result.WhichOneof("event") in ("step_completed", "step_failed")
