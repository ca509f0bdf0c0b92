"""Kafka wiring of an executor: baton.tasks.<provider> in, step results out on baton.workflow."""

from __future__ import annotations

from collections import OrderedDict

from baton.v1 import tasks_pb2
from faststream import AckPolicy
from faststream.kafka import KafkaMessage
from prometheus_client import Counter, Histogram

from baton_platform import topics
from baton_platform.kafka import consumer_options
from baton_platform.messages import PoisonMessage, decode, encode
from baton_platform.service import Service

from baton_executor.calls import StepRunner


class RecentIds:
    """Task ids this replica answered lately, so a redelivered task is not run twice."""

    def __init__(self, size: int = 50_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._ids

    def add(self, task_id: str) -> None:
        self._ids[task_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)


def register(service: Service, provider: str, runner: StepRunner) -> None:
    reg = service.registry
    steps = Counter("baton_executor_steps", "Steps answered", ["provider", "worker", "outcome"], registry=reg)
    tokens = Counter("baton_executor_tokens", "Tokens used", ["provider", "worker", "direction"], registry=reg)
    cost = Counter("baton_executor_cost_usd", "Cost of provider calls", ["provider", "worker"], registry=reg)
    latency = Histogram("baton_executor_step_seconds", "Step latency", ["provider"], registry=reg)
    recent = RecentIds()

    @service.broker.subscriber(topics.tasks_topic(provider), group_id=topics.executor_group(provider),
                               ack_policy=AckPolicy.ACK, **consumer_options(service.config.kafka))
    async def on_task(msg: KafkaMessage) -> None:
        try:
            task = decode(tasks_pb2.Task, msg.body)
            if not (task.task_id and task.request_id and task.worker):
                raise PoisonMessage("Task without task_id, request_id or worker")
        except PoisonMessage as e:
            await service.dead_letters.send(msg, str(e))
            return
        if task.task_id in recent:
            return
        event = await runner.run(task)
        await service.broker.publish(encode(event), topics.WORKFLOW, key=task.request_id.encode())
        recent.add(task.task_id)
        kind = event.WhichOneof("event")
        steps.labels(provider, task.worker, "completed" if kind == "step_completed" else "failed").inc()
        if kind == "step_completed":
            done = event.step_completed
            tokens.labels(provider, task.worker, "input").inc(done.usage.input_tokens)
            tokens.labels(provider, task.worker, "output").inc(done.usage.output_tokens)
            cost.labels(provider, task.worker).inc(done.usage.cost_usd)
            latency.labels(provider).observe(done.latency_ms / 1000)
