"""The executor's handlers in memory: a sim task in, a StepCompleted out; redeliveries run once."""

from __future__ import annotations

import csv
import sys

import asyncio

from baton.v1 import common_pb2, tasks_pb2, workflow_pb2
from faststream.kafka import KafkaMessage, TestKafkaBroker

from baton_executor.main import create_app
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.telemetry import setup_tracing
from testbed import MMLU_PRO


async def wait_for(predicate, timeout=5.0):
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)


async def test_a_sim_task_is_answered_once_even_when_redelivered(write_config):
    app = create_app(load_config(write_config()), "sim", tracer_provider=setup_tracing("t", set_global=False))
    out: list[KafkaMessage] = []

    @app.broker.subscriber(topics.WORKFLOW)
    async def workflow(msg: KafkaMessage):
        out.append(msg)

    csv.field_size_limit(sys.maxsize)
    row = next(csv.DictReader(MMLU_PRO.open(newline="")))
    task = tasks_pb2.Task(task_id="r:0:1", request_id="r", step=0, attempt=1, worker="gemini-pro", query=row["prompt"],
                          messages=[common_pb2.ChatMessage(role="user", content=row["prompt"])])
    async with TestKafkaBroker(app.broker) as br:
        await br.publish(task.SerializeToString(), topics.tasks_topic("sim"), key=b"r")
        await br.publish(task.SerializeToString(), topics.tasks_topic("sim"), key=b"r")
        await wait_for(lambda: out)
        await br.publish(task.SerializeToString(), topics.tasks_topic("sim"), key=b"r")
        await asyncio.sleep(0.3)
    assert len(out) == 1
    done = workflow_pb2.WorkflowEvent.FromString(out[0].body).step_completed
    assert done.task_id == "r:0:1" and done.model == "gemini-1.5-pro-002"
    assert done.output == f"The answer is ({row['gemini-1.5-pro-002|answer']})."
    config = load_config(write_config())
    price = config.worker("gemini-pro").price
    assert done.usage.cost_usd == price.cost(done.usage.input_tokens, done.usage.output_tokens) > 0


async def test_a_task_for_a_worker_this_executor_does_not_serve_fails_clearly(write_config):
    app = create_app(load_config(write_config()), "sim", tracer_provider=setup_tracing("t", set_global=False))
    out: list[KafkaMessage] = []

    @app.broker.subscriber(topics.WORKFLOW)
    async def workflow(msg: KafkaMessage):
        out.append(msg)

    task = tasks_pb2.Task(task_id="r:0:1", request_id="r", worker="gpt-9")
    async with TestKafkaBroker(app.broker) as br:
        await br.publish(task.SerializeToString(), topics.tasks_topic("sim"), key=b"r")
        await wait_for(lambda: out)
    failed = workflow_pb2.WorkflowEvent.FromString(out[0].body).step_failed
    assert "'gpt-9' is not served by this executor" in failed.error.message and not failed.retryable
