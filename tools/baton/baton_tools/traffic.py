"""Task traffic straight onto a provider's tasks topic, for executor tests and benchmarks."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from baton.v1 import common_pb2, requests_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_workflow import Plan, to_proto


def make_task(request_id: str, worker: str, text: str, deadline_s: float = 300,
              direct: bool = False) -> tasks_pb2.Task:
    """A one-step task whose single user message is `text` (a marker the provider stand-in echoes): a
    synthesizer's step, whose result goes to baton.workflow, or with `direct` the whole one-step workflow
    as the router sends it (router.direct_single_step), which the executor answers on baton.responses."""
    deadline_ms = int((time.time() + deadline_s) * 1000)
    messages = [common_pb2.ChatMessage(role="user", content=text)]
    task = tasks_pb2.Task(task_id=f"{request_id}:0:1", request_id=request_id, step=0, attempt=1, worker=worker,
                          messages=messages, max_tokens=8, deadline_unix_ms=deadline_ms)
    if direct:
        request = requests_pb2.ChatRequest(request_id=request_id, messages=messages, deadline_unix_ms=deadline_ms)
        plan = to_proto(Plan(workers=[worker], subtasks=[text], access=[[]]), backend="static")
        task.workflow.CopyFrom(workflow_pb2.WorkflowPlanned(request=request, plan=plan,
                                                            planned_unix_ms=int(time.time() * 1000)))
    return task


async def offer(bootstrap: str, provider: str, tasks: list[tasks_pb2.Task], rate: float) -> None:
    """Publish `tasks` at `rate` per second (open loop), keyed by request id."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await producer.start()
    try:
        start = time.monotonic()
        for i, t in enumerate(tasks):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await producer.send(topics.tasks_topic(provider), t.SerializeToString(), key=t.request_id.encode())
        await producer.flush()
    finally:
        await producer.stop()
