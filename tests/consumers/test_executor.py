"""The executor's task consumer, each scenario run in memory and on the real broker: a sim task in,
a StepCompleted out; redeliveries run once; a worker it does not serve fails the step clearly."""

from __future__ import annotations

import asyncio
import uuid

from testbed import first_question

from baton.v1 import common_pb2, tasks_pb2, workflow_pb2
from baton_executor.main import create_app
from baton_platform import topics
from baton_platform.telemetry import setup_tracing


async def test_a_sim_task_is_answered_once_even_when_redelivered(bus):
    config = bus.config()
    app = create_app(config, "sim", tracer_provider=setup_tracing("t", set_global=False))
    row = first_question()
    rid = uuid.uuid4().hex
    task = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro",
                          query=row["prompt"], messages=[common_pb2.ChatMessage(role="user", content=row["prompt"])])
    def mine(r) -> bool:
        return r.key == rid.encode()

    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        await seen[topics.WORKFLOW].wait(mine)
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        await asyncio.sleep(0.3)
        out = await seen[topics.WORKFLOW].wait(mine, count=2, timeout=2)
    assert len(out) == 1
    done = workflow_pb2.WorkflowEvent.FromString(out[0].value).step_completed
    assert done.task_id == f"{rid}:0:1" and done.model == "gemini-1.5-pro-002"
    assert done.output == f"The answer is ({row['gemini-1.5-pro-002|answer']})."
    price = config.worker("gemini-pro").price
    assert done.usage.cost_usd == price.cost(done.usage.input_tokens, done.usage.output_tokens) > 0


async def test_a_task_for_a_worker_this_executor_does_not_serve_fails_clearly(bus):
    app = create_app(bus.config(), "sim", tracer_provider=setup_tracing("t", set_global=False))
    rid = uuid.uuid4().hex
    task = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, worker="gpt-9")
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
    failed = workflow_pb2.WorkflowEvent.FromString(record.value).step_failed
    assert "'gpt-9' is not served by this executor" in failed.error.message and not failed.retryable
