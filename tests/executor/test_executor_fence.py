"""Fencing: an executor replica starts no provider call while its consumer group has not confirmed it
lately (the broker away, or the replica dropped from the group and not told yet), since another
replica may own the task's partition by then and run the same task. `Consumer.in_group` says so,
from the group's own answers: checked here on a broker of its own, paused and resumed, and killed.
Nor does it publish a result while unconfirmed, and a revocation that finds it out of the group
drops every task of those partitions: their new owner may already have read back the results."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from testbed import Bus, first_question, wait_for

from baton.v1 import common_pb2, requests_pb2, tasks_pb2
from baton_executor.handlers import TaskConsumer
from baton_executor.main import worker_limits
from baton_executor.metrics import ExecutorMetrics
from baton_executor.providers.registry import build_workers
from baton_executor.step_runner import StepRunner
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.consumer import Record
from baton_platform.service import Service
from baton_platform.telemetry import setup_tracing
from baton_tools import procs
from baton_tools.kafka import LocalKafka
from baton_workflow.errors import WorkflowError


def sim_runner(write_config) -> tuple[StepRunner, ExecutorMetrics, dict]:
    config = load_config(write_config())
    configs = {w.name: w for w in config.workers if w.provider == "sim"}
    limits = {w.name: worker_limits(w) for w in configs.values()}
    metrics = ExecutorMetrics(CollectorRegistry(), "sim")
    tracer = setup_tracing("t", set_global=False).get_tracer("t")
    runner = StepRunner(build_workers(config.workers, "sim", None), configs, limits, tracer, metrics, max_attempts=1)
    return runner, metrics, limits


def sim_task() -> tasks_pb2.Task:
    query, rid = first_question()["prompt"], uuid.uuid4().hex
    return tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro", query=query,
                          messages=[common_pb2.ChatMessage(role="user", content=query)],
                          deadline_unix_ms=int(time.time() * 1000) + 60_000)


def requests_consumer(service: Service):
    """A consumer of baton.requests in a group of its own that does nothing with what it reads."""
    async def handle(request: requests_pb2.ChatRequest, record) -> None:
        return None

    return service.consumer(topics.REQUESTS, requests_pb2.ChatRequest, handle,
                            group=f"fence-{uuid.uuid4().hex[:8]}", tracked=True)


@contextlib.asynccontextmanager
async def consumer_on_a_broker(write_config, tmp_path):
    """A broker of its own, and a running `requests_consumer` on it: session timeout 6 s, a heartbeat
    a second, so confirmed for 5 s at a time."""
    with LocalKafka(data_dir=tmp_path / "kafka", log_file=tmp_path / "kafka.log") as broker:
        bus = Bus("kafka", write_config, broker.bootstrap_servers)
        service = Service.create("baton-fence-test", bus.config().kafka)
        consumer = requests_consumer(service)
        async with bus.running(service.asgi_app()):
            yield broker, consumer


def calls(metrics: ExecutorMetrics) -> float:
    return metrics.requests.labels("sim", "gemini-pro")._value.get()


async def test_a_call_waits_until_the_group_confirms_the_replica(write_config):
    runner, metrics, _ = sim_runner(write_config)
    confirmed = False
    runner.in_group = lambda: confirmed
    task = sim_task()
    job = asyncio.create_task(runner.run(task))
    await asyncio.sleep(0.5)
    assert not job.done() and calls(metrics) == 0 and task.task_id not in runner.calling
    assert metrics.held.labels("sim")._value.get() == 1
    confirmed = True
    event = await asyncio.wait_for(job, 5)
    assert event.WhichOneof("event") == "step_completed" and calls(metrics) == 1


async def test_a_held_call_cancelled_by_a_revocation_spends_nothing(write_config, monkeypatch):
    runner, metrics, limits = sim_runner(write_config)
    runner.in_group = lambda: False
    settled = []
    gemini = limits["gemini-pro"]
    monkeypatch.setattr(gemini, "settle", lambda estimate, actual: settled.append((estimate, actual)))
    job = asyncio.create_task(runner.run(sim_task()))
    await asyncio.sleep(0.3)
    job.cancel()  # what the executor's revocation does to a task whose call has not begun
    with pytest.raises(asyncio.CancelledError):
        await job
    assert calls(metrics) == 0
    assert len(settled) == 1 and settled[0][1] == 0, "the tokens it was admitted with go back to the limits"


async def test_a_held_call_past_its_deadline_ends_as_expired(write_config):
    runner, metrics, _ = sim_runner(write_config)
    runner.in_group = lambda: False
    task = sim_task()
    task.deadline_unix_ms = int(time.time() * 1000) + 300
    event = await asyncio.wait_for(runner.run(task), 5)
    assert event.step_failed.error.code == WorkflowError.DEADLINE_EXCEEDED
    assert calls(metrics) == 0 and metrics.expired.labels("sim", "gemini-pro")._value.get() == 1


async def test_a_record_whose_partition_was_revoked_while_it_waited_for_a_slot_is_not_run(write_config):
    """The race `make chaos` found with the broker killed: a task waiting for a concurrency slot when
    its partition was revoked started its call once the slot freed (and the group confirmed the
    replica again), while the replica that had taken the partition meanwhile ran it too."""
    from aiokafka import TopicPartition

    runner, metrics, limits = sim_runner(write_config)
    config = load_config(write_config())
    service = Service.create("baton-executor-sim", config.kafka)
    consumer = TaskConsumer(service, "sim", runner, limits, metrics, drain_timeout_s=1.0)
    slots = limits["gemini-pro"].slots
    await slots.resize(0)  # every slot taken: the record waits its turn
    tp = TopicPartition(topics.tasks_topic("sim"), 0)
    task = sim_task()
    waiting = asyncio.create_task(consumer.handle(task, Record(tp, 7, task.request_id.encode())))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await consumer.revoked({tp})
    await slots.resize(4)
    await asyncio.wait_for(waiting, 5)
    await asyncio.sleep(0.3)
    assert task.task_id not in consumer.running and not consumer.in_flight.get(tp)
    assert calls(metrics) == 0 and slots.used == 0, "no call, and the slot it took is given back"


async def test_membership_lapses_while_the_broker_is_paused_and_comes_back_with_it(write_config, tmp_path):
    async with consumer_on_a_broker(write_config, tmp_path) as (broker, consumer):
        assert consumer.in_group()
        await asyncio.sleep(7)
        assert consumer.in_group(), "heartbeats the coordinator answered keep it confirmed past the join"
        procs.signal_group(broker.pid, signal.SIGSTOP)
        try:
            paused = time.monotonic()
            assert await asyncio.to_thread(wait_for, lambda: not consumer.in_group(), 10)
            lapsed_after = time.monotonic() - paused
        finally:
            procs.signal_group(broker.pid, signal.SIGCONT)
        assert lapsed_after < 6, f"lapsed {lapsed_after:.1f} s after the broker paused, within a session timeout"
        assert await asyncio.to_thread(wait_for, consumer.in_group, 40), "confirmed again once the broker is back"


def fenced_consumer(write_config) -> tuple[TaskConsumer, ExecutorMetrics, list, dict]:
    """A TaskConsumer on the sim worker whose group confirmation the test sets (`state["confirmed"]`),
    and whose results are collected instead of sent."""
    runner, metrics, limits = sim_runner(write_config)
    config = load_config(write_config())
    consumer = TaskConsumer(Service.create("baton-executor-sim", config.kafka), "sim", runner, limits, metrics,
                            drain_timeout_s=5.0)
    state = {"confirmed": True}
    consumer.consumer.in_group = lambda: state["confirmed"]
    runner.in_group = consumer.consumer.in_group
    published: list = []

    async def send(message, **_) -> None:
        published.append(message)

    consumer.results.send = send  # type: ignore[method-assign]
    consumer.answers.send = send  # type: ignore[method-assign]
    return consumer, metrics, published, state


def slow(runner: StepRunner, seconds: float = 1.0) -> None:
    """Make the sim worker's calls last `seconds`, long enough to revoke one in progress."""
    runner._workers["gemini-pro"]._latency_s = seconds


async def started(consumer: TaskConsumer, task: tasks_pb2.Task, tp, offset: int = 7) -> None:
    """Hand `task` to the consumer as its record at `offset` of `tp` would be, and wait for its call."""
    consumer.tracker.begin(tp, offset)
    await consumer.handle(task, Record(tp, offset, task.request_id.encode()))
    assert await asyncio.to_thread(wait_for, lambda: task.task_id in consumer.runner.calling, 5)


async def test_a_revocation_after_the_replica_left_the_group_drops_its_calls_and_publishes_nothing(write_config):
    """What `make chaos` found with the broker killed: the broker came back without this replica in
    the group, another replica took its partitions and read back the results published so far, and
    this one, let finish its calls in progress as in an ordinary rebalance, published them after:
    two answers for one task."""
    from aiokafka import TopicPartition

    consumer, metrics, published, state = fenced_consumer(write_config)
    slow(consumer.runner)
    tp = TopicPartition(topics.tasks_topic("sim"), 0)
    task = sim_task()
    await started(consumer, task, tp)
    state["confirmed"] = False  # the coordinator no longer knows this replica
    await asyncio.wait_for(consumer.revoked({tp}), 2)
    assert task.task_id not in consumer.running and not consumer.in_flight.get(tp)
    await asyncio.sleep(1.0)
    assert published == [] and consumer.tracker.holds(tp, 7), "no result, and the record left to the new owner"


async def test_a_result_waits_for_the_group_to_confirm_the_replica_and_is_dropped_if_the_partition_moves(
        write_config):
    from aiokafka import TopicPartition

    consumer, metrics, published, state = fenced_consumer(write_config)
    slow(consumer.runner)
    tp = TopicPartition(topics.tasks_topic("sim"), 0)
    first, second = sim_task(), sim_task()
    await started(consumer, first, tp, 7)
    state["confirmed"] = False  # the broker went away during the call
    assert await asyncio.to_thread(wait_for, lambda: first.task_id not in consumer.runner.calling, 5)
    await asyncio.sleep(0.3)
    assert published == [], "a finished call's result waits while the replica is not confirmed"
    state["confirmed"] = True
    assert await asyncio.to_thread(wait_for, lambda: len(published) == 1, 5), "published once confirmed again"

    await started(consumer, second, tp, 8)
    state["confirmed"] = False
    assert await asyncio.to_thread(wait_for, lambda: second.task_id not in consumer.runner.calling, 5)
    consumer.tracker.forget({tp})  # the partition went to another replica
    assert await asyncio.to_thread(wait_for, lambda: second.task_id not in consumer.running, 5)
    assert len(published) == 1, "a result is not published for a partition this replica no longer holds"


async def test_membership_is_void_as_soon_as_the_coordinator_is_lost(write_config, tmp_path):
    """A broker killed and started again may load the group without this member (its restart took
    longer than the session), and give its partitions to the first member to join: so losing the
    coordinator voids the confirmation at once, instead of a session timeout after the last one."""
    async with consumer_on_a_broker(write_config, tmp_path) as (broker, consumer):
        await asyncio.sleep(2)
        assert consumer.in_group()
        broker.kill()
        killed = time.monotonic()
        assert await asyncio.to_thread(wait_for, lambda: not consumer.in_group(), 10)
        lapsed_after = time.monotonic() - killed
        assert lapsed_after < 3, f"void {lapsed_after:.1f} s after the kill: within a heartbeat or two"
        await asyncio.to_thread(broker.start)
        assert await asyncio.to_thread(wait_for, consumer.in_group, 60), "confirmed again once it rejoins"


async def test_a_heartbeat_answered_while_the_coordinator_loads_the_group_confirms_nothing(write_config):
    """What `make chaos` found next: a broker started again answers every heartbeat "no error" while it
    loads the group (Kafka answers blindly then), also from a member it has dropped. A replica whose
    heartbeat landed in that window took itself for confirmed and ran, and published, tasks whose
    partitions another replica had just been given. After a lost coordinator, a heartbeat confirms
    only once the coordinator has answered an offset fetch for the group with no error, which it does
    once loaded."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    class LoadingCoordinator:
        member_id, generation = "replica-a", 4
        loading = True

        async def _do_heartbeat(self) -> bool:
            return True  # the blind answer

        async def _send_req(self, request) -> SimpleNamespace:
            # An offset fetch: while loading, the group-level error COORDINATOR_LOAD_IN_PROGRESS (14),
            # with partitions that read "nothing committed" (which AIOKafkaConsumer.committed returns).
            error = 14 if self.loading else 0
            return SimpleNamespace(error_code=error, topics=[(tp.topic, [(tp.partition, -1, "", 0)])])

        def coordinator_dead(self) -> None:
            pass

        def reset_generation(self) -> None:
            pass

    tp = TopicPartition(topics.REQUESTS, 0)
    kafka_consumer = AIOKafkaConsumer.__new__(AIOKafkaConsumer)  # the parts the membership watch uses
    kafka_consumer._coordinator = LoadingCoordinator()
    kafka_consumer.assignment = lambda: {tp}
    config = load_config(write_config({"kafka": {**load_config(write_config()).kafka.model_dump(),
                                                 "heartbeat_interval_ms": 200}}))

    consumer = requests_consumer(Service.create("baton-fence-test", config.kafka))
    consumer.subscriber.consumer = kafka_consumer
    coordinator = kafka_consumer._coordinator
    await consumer.on_partitions_assigned({tp})
    assert consumer.in_group(), "a join confirms"
    coordinator.coordinator_dead()  # the broker went away
    assert not consumer.in_group()
    assert await coordinator._do_heartbeat() is True
    assert not consumer.in_group(), "a heartbeat answered while the group may still be loading confirms nothing"
    coordinator.loading = False
    assert await coordinator._do_heartbeat() is True
    assert consumer.in_group(), "one sent once the coordinator answers for the group's offsets does"
    coordinator.reset_generation()  # the coordinator no longer knows this member
    assert not consumer.in_group()
