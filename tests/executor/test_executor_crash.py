"""The executor's record bookkeeping across rebalances: a redelivered copy of a running task, a result
not out when its partition moves, and a task still waiting for its turn must never let the partition
commit past a task whose result is not out. Each revokes a partition while a call is held at a chosen
point, which no broker stages on cue: they drive the consumer's rebalance listener with records at
chosen offsets. (Refused results and executor errors run on both brokers: test_executor_consumer.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition

from baton.v1 import tasks_pb2, workflow_pb2
from baton_executor.handlers import TaskConsumer
from baton_executor.metrics import ExecutorMetrics
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.service import Service
from baton_platform.telemetry import setup_tracing

TP = TopicPartition(topics.tasks_topic("sim"), 0)


class Broker:
    """The consumer's results publisher, refusing the first `failures` sends."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.published: list[bytes] = []

    async def send(self, message, *, key, partition=None):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("broker away")
        self.published.append(message.SerializeToString())


class Runner:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def run(self, task, deltas=None):
        self.calls += 1
        await self.release.wait()
        return workflow_pb2.WorkflowEvent(request_id=task.request_id, step_completed=workflow_pb2.StepCompleted(
            task_id=task.task_id, step=task.step, attempt=task.attempt, output="ok"))


@pytest.fixture
def consumer(write_config):
    def make(broker: Broker, runner: Runner) -> TaskConsumer:
        service = Service.create("baton-executor-sim", load_config(write_config()).kafka,
                                 setup_tracing("t", set_global=False))
        c = TaskConsumer(service, "sim", runner, {}, ExecutorMetrics(service.registry, "sim"), drain_timeout_s=0.05)
        c.results = broker
        c.publish_retry_s = 0.01
        return c

    return make


def record(offset: int, task_id: str = "r:0:1") -> SimpleNamespace:
    """A task record at `offset` (FastStream's in-memory records all have offset 0)."""
    body = tasks_pb2.Task(task_id=task_id, request_id="r", step=0, attempt=1, worker="gemini-pro").SerializeToString()
    raw = SimpleNamespace(topic=TP.topic, partition=TP.partition, offset=offset, headers=(), key=b"r", value=body)
    return SimpleNamespace(raw_message=raw, body=body)


async def eventually(predicate, timeout=3.0):
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


# Listener-driven: a revocation while the call is held, which no broker stages on cue.
async def test_a_copy_redelivered_while_its_call_runs_is_not_committed_before_the_result(consumer):
    broker, runner = Broker(), Runner()
    c = consumer(broker, runner)
    await c.consumer.consume(record(5))
    # The partition leaves and comes back to this replica while the call is still running.
    await c.consumer.on_partitions_revoked([TP])
    await c.consumer.consume(record(5))
    assert c.tracker.committable()[TP] == 5, "the redelivered copy waits for its call's result"
    assert runner.calls == 1, "the call is not started twice"
    runner.release.set()
    assert await eventually(lambda: c.tracker.committable()[TP] == 6)
    assert len(broker.published) == 1


# Listener-driven: a revocation while the call is held, which no broker stages on cue.
async def test_a_result_not_published_before_its_partition_moves_is_left_to_the_new_owner(consumer):
    broker, runner = Broker(failures=10_000), Runner()
    runner.release.set()
    c = consumer(broker, runner)
    await c.consumer.consume(record(3))
    await asyncio.sleep(0.05)
    await c.consumer.on_partitions_revoked([TP])
    assert await eventually(lambda: not c.running), "it stops retrying once it owns no record of the task"
    assert "r:0:1" not in c.done and not broker.published


class WaitingRunner(Runner):
    """A runner whose tasks wait for their turn under the limits until told their call began."""

    def __init__(self) -> None:
        super().__init__()
        self.calling: set[str] = set()


# Listener-driven: a revocation while the call is held, which no broker stages on cue.
async def test_a_revoked_task_still_waiting_for_its_turn_is_dropped_not_drained(consumer):
    broker, runner = Broker(), WaitingRunner()
    c = consumer(broker, runner)
    c.drain_timeout_s = 30  # a drain would outlast the test's patience
    await c.consumer.consume(record(4, "r:0:1"))
    await c.consumer.consume(record(5, "r:1:1"))
    runner.calling.add("r:1:1")  # this one's provider call has begun
    revoke = asyncio.create_task(c.consumer.on_partitions_revoked([TP]))
    assert await eventually(lambda: "r:0:1" not in c.running), "the waiting task is dropped at once"
    assert not revoke.done(), "the task whose call began is drained"
    runner.release.set()
    await asyncio.wait_for(revoke, 3)
    published = [workflow_pb2.WorkflowEvent.FromString(b).step_completed.task_id for b in broker.published]
    assert published == ["r:1:1"], "only the call that had begun answers; the next owner runs the other"
    assert "r:0:1" not in c.done


# Driven like the others: a shutdown while a call is held past the drain's bound.
async def test_at_shutdown_a_call_that_outlasts_the_drain_is_dropped_and_no_new_task_starts(consumer):
    broker, runner = Broker(), WaitingRunner()
    c = consumer(broker, runner)
    await c.consumer.consume(record(4, "r:0:1"))
    runner.calling.add("r:0:1")  # its provider call has begun, and does not end within the drain
    await c.drain()
    assert not c.running, "nothing is left to fail once the provider clients close"
    await c.consumer.consume(record(5, "r:1:1"))
    assert runner.calls == 1, "no task starts once the executor stops"
    assert c.tracker.committable()[TP] == 4 and not broker.published, "the next owner runs both"
