"""Task traffic straight onto a provider's tasks topic, for executor tests and benchmarks."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from baton.v1 import common_pb2, tasks_pb2
from baton_platform import topics


def make_task(request_id: str, worker: str, text: str, deadline_s: float = 300) -> tasks_pb2.Task:
    """A one-step task whose single user message is `text` (a marker the provider stand-in echoes)."""
    return tasks_pb2.Task(task_id=f"{request_id}:0:1", request_id=request_id, step=0, attempt=1, worker=worker,
                          messages=[common_pb2.ChatMessage(role="user", content=text)],
                          max_tokens=8, deadline_unix_ms=int((time.time() + deadline_s) * 1000))


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
