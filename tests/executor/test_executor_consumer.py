"""The executor's task consumer, each scenario run in memory and on the real broker: a sim task in,
a StepCompleted out; redeliveries run once; a worker it does not serve fails the step clearly; a
streaming request's answering task sends its text to baton.responses as Delta responses (on the
request's reply partition) before the step's result; a result the broker refuses is sent again, and
an unexpected error ends the step, before the partition commits past the task."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from aiokafka import TopicPartition
from testbed import default_config_data, first_question

import baton_executor.main as executor
from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_executor.handlers import TaskConsumer
from baton_executor.main import create_app
from baton_executor.step_runner import StepRunner
from baton_platform import topics
from baton_platform.consumer import Publisher
from baton_platform.telemetry import setup_tracing
from baton_tools.standins.server import run_standin
from baton_workflow.steps import handed_over


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


async def run_task(bus, provider: str, task: tasks_pb2.Task, data: dict | None = None):
    """What the executor published for `task`: its Delta responses and its step's result."""
    app = create_app(bus.config(data=data), provider, tracer_provider=setup_tracing("t", set_global=False))

    def mine(r) -> bool:
        return r.key == task.request_id.encode()

    async with bus.running(app, topics.WORKFLOW, topics.RESPONSES) as seen:
        await bus.publish(app, topics.tasks_topic(provider), task.request_id, task.SerializeToString())
        await seen[topics.WORKFLOW].wait(mine)
        # Deltas are on the broker before the result is sent: whatever is on baton.responses now is all of them.
        deltas = await seen[topics.RESPONSES].wait(mine, count=10_000, timeout=1)
        (result,) = await seen[topics.WORKFLOW].wait(mine, count=2, timeout=0.5)
    assert all(d.timestamp <= result.timestamp for d in deltas), "every delta goes out before the step's result"
    assert all(d.partition == task.reply_partition for d in deltas), "on the partition the asking gateway reads"
    return [responses_pb2.Response.FromString(d.value) for d in deltas], workflow_pb2.WorkflowEvent.FromString(result.value)


def sim_task(rid: str, query: str, stream: bool) -> tasks_pb2.Task:
    return tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro", stream=stream,
                          reply_partition=1, query=query, messages=[common_pb2.ChatMessage(role="user", content=query)])


async def test_a_streaming_task_on_a_provider_that_streams_sends_its_text_in_pieces(bus):
    rid = uuid.uuid4().hex
    with run_standin("openai", chunk_delay_ms=10) as url:
        data = default_config_data()
        data["workers"].append({"name": "local-llm", "provider": "openai_compatible", "model": "local-model",
                                "base_url": url})
        task = tasks_pb2.Task(task_id=f"{rid}:1:1", request_id=rid, step=1, attempt=1, worker="local-llm",
                              stream=True, reply_partition=1,
                              messages=[common_pb2.ChatMessage(role="user", content="w " * 80)])
        deltas, result = await run_task(bus, "openai_compatible", task, data)
    output = result.step_completed.output
    assert output.startswith("[local-model] saw:")
    assert len(deltas) > 1 and all(d.request_id == rid and d.delta.task_id == f"{rid}:1:1" for d in deltas)
    assert "".join(d.delta.text for d in deltas) == output
    assert [d.delta.offset for d in deltas][0] == 0


async def test_a_streaming_task_on_a_provider_that_does_not_stream_sends_one_delta(bus):
    deltas, result = await run_task(bus, "sim", sim_task(uuid.uuid4().hex, first_question()["prompt"], stream=True))
    output = result.step_completed.output
    assert output and [(d.delta.offset, d.delta.text) for d in deltas] == [(0, output)]


async def test_a_task_that_does_not_stream_sends_no_delta(bus):
    deltas, result = await run_task(bus, "sim", sim_task(uuid.uuid4().hex, "q", stream=False))
    assert deltas == [] and result.WhichOneof("event") in ("step_completed", "step_failed")


@pytest.fixture
def task_consumers(monkeypatch) -> list[TaskConsumer]:
    """The TaskConsumers the executor apps of a test make, to read their bookkeeping."""
    made: list[TaskConsumer] = []

    class Kept(TaskConsumer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.publish_retry_s = 0.01
            made.append(self)

    monkeypatch.setattr(executor, "TaskConsumer", Kept)
    return made


async def committed_past(c: TaskConsumer, record, timeout: float = 5.0) -> bool:
    """Whether the task's partition commits past its record (within the timeout)."""
    tp = TopicPartition(record.topic, record.partition)
    for _ in range(int(timeout / 0.02)):
        if c.tracker.committable().get(tp) == record.offset + 1:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_result_the_broker_refuses_is_published_again_and_then_committed(bus, task_consumers, monkeypatch):
    app = create_app(bus.config(), "sim", tracer_provider=setup_tracing("t", set_global=False))
    (c,) = task_consumers
    refusals = [ConnectionError("broker away")] * 3
    send = Publisher.send

    async def refusing(publisher, message, **kwargs):
        if publisher.topic == topics.WORKFLOW and refusals:
            raise refusals.pop()
        return await send(publisher, message, **kwargs)

    monkeypatch.setattr(Publisher, "send", refusing)
    rid = uuid.uuid4().hex
    async with bus.running(app, topics.tasks_topic("sim"), topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, sim_task(rid, first_question()["prompt"], False)
                          .SerializeToString())
        (record,) = await seen[topics.tasks_topic("sim")].wait(lambda r: r.key == rid.encode())
        published = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
        assert published, "the result is retried until the broker takes it"
        assert await committed_past(c, record), "the partition's commits move on"
        assert f"{rid}:0:1" in c.done and not c.running
    assert refusals == []
    (result,) = published
    assert workflow_pb2.WorkflowEvent.FromString(result.value).step_completed.task_id == f"{rid}:0:1"


async def test_an_unexpected_executor_error_ends_the_step_instead_of_holding_the_partition(bus, task_consumers,
                                                                                          monkeypatch):
    async def broken(runner, task, deltas=None):
        raise RuntimeError("bug")

    monkeypatch.setattr(StepRunner, "run", broken)
    app = create_app(bus.config(), "sim", tracer_provider=setup_tracing("t", set_global=False))
    (c,) = task_consumers
    rid = uuid.uuid4().hex
    async with bus.running(app, topics.tasks_topic("sim"), topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, sim_task(rid, "q", False).SerializeToString())
        (record,) = await seen[topics.tasks_topic("sim")].wait(lambda r: r.key == rid.encode())
        (result,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode())
        assert await committed_past(c, record)
    failed = workflow_pb2.WorkflowEvent.FromString(result.value).step_failed
    assert failed.error.code == "executor_error" and not failed.retryable


async def test_a_one_step_workflow_sent_straight_here_is_answered_to_the_client_once(bus):
    """router.direct_single_step: the task carries its workflow; the executor publishes the client's
    final response, episode included, on the request's reply partition, and nothing on baton.workflow.
    On the real broker, a replica that finds the response already published (its owner crashed before
    committing) does not run the task again."""
    config = bus.config(router={"direct_single_step": True})
    row = first_question()
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, reply_partition=1, created_unix_ms=1,
                                       messages=[common_pb2.ChatMessage(role="user", content=row["prompt"])])
    plan = workflow_pb2.Plan(steps=[workflow_pb2.PlanStep(worker="gemini-pro", instruction="Answer.")], backend="static")
    task = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro",
                          query=row["prompt"], messages=request.messages,
                          workflow=workflow_pb2.WorkflowPlanned(request=request, plan=plan))

    def mine(r) -> bool:
        return r.key == rid.encode()

    app = create_app(config, "sim", tracer_provider=setup_tracing("t", set_global=False))
    async with bus.running(app, topics.RESPONSES, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        (record,) = await seen[topics.RESPONSES].wait(mine)
        assert await seen[topics.WORKFLOW].wait(mine, timeout=1) == []
    response = responses_pb2.Response.FromString(record.value)
    assert record.partition == 1 and response.answer == f"The answer is ({row['gemini-1.5-pro-002|answer']})."
    assert [(s.worker, s.output) for s in response.episode.steps] == [("gemini-pro", response.answer)]
    assert response.episode.request == request and response.episode.plan == plan
    if bus.kind != "kafka":
        return
    # The same task again, uncommitted, with its answer already out: a new executor must skip it.
    again = uuid.uuid4().hex
    task.request_id = task.workflow.request.request_id = again
    task.task_id = f"{again}:0:1"
    response.request_id = again
    app = create_app(config, "sim", tracer_provider=setup_tracing("t", set_global=False))
    await bus.publish(app, topics.tasks_topic("sim"), again, task.SerializeToString())
    await bus.publish(app, topics.RESPONSES, again, response.SerializeToString(), partition=1)
    async with bus.running(app, topics.RESPONSES) as seen:
        rerun = await seen[topics.RESPONSES].wait(lambda r: r.key == again.encode(), timeout=5)
    assert rerun == [], "a task whose answer was already published ran again"


@pytest.mark.parametrize("fallback", ["llama-70b", None])
async def test_a_one_step_workflow_whose_step_fails_goes_to_the_synthesizer_when_its_worker_has_a_fallback(
        bus, fallback, task_consumers, monkeypatch):
    """A step sent whole (router.direct_single_step) that fails, here on a question the sim matrix
    lacks: with a fallback configured for its worker, the workflow is handed to the synthesizer (one
    WorkflowPlanned record carrying the failed attempt), and the client is not answered from here; without
    one, the client gets the failure at once. The broker refuses the first two sends: the hand-over is
    still decided and counted once."""
    data = default_config_data()
    if fallback:
        next(w for w in data["workers"] if w["name"] == "gemini-pro")["fallback"] = fallback
    config = bus.config(data=data)
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, reply_partition=1, created_unix_ms=1,
                                       messages=[common_pb2.ChatMessage(role="user", content="Who wrote Hamlet?")])
    plan = workflow_pb2.Plan(steps=[workflow_pb2.PlanStep(worker="gemini-pro", instruction="Answer.")], backend="static")
    task = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro",
                          query="Who wrote Hamlet?", messages=request.messages,
                          workflow=workflow_pb2.WorkflowPlanned(request=request, plan=plan))

    def mine(r) -> bool:
        return r.key == rid.encode()

    refusals = [ConnectionError("broker away")] * 2
    send = Publisher.send

    async def refusing(publisher, message, **kwargs):
        if kwargs.get("key") == rid and refusals:
            raise refusals.pop()
        return await send(publisher, message, **kwargs)

    monkeypatch.setattr(Publisher, "send", refusing)
    app = create_app(config, "sim", tracer_provider=setup_tracing("t", set_global=False))
    handed, answered = (topics.WORKFLOW, topics.RESPONSES) if fallback else (topics.RESPONSES, topics.WORKFLOW)
    async with bus.running(app, topics.RESPONSES, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        (record,) = await seen[handed].wait(mine)
        assert await seen[answered].wait(mine, timeout=1) == []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://executor") as client:
            metrics = (await client.get("/metrics")).text
    assert refusals == []
    counted = 'baton_executor_handed_over_total{provider="sim",worker="gemini-pro"} 1.0'
    assert (counted in metrics) == bool(fallback), "each hand-over is counted once, and only a hand-over"
    if fallback is None:
        response = responses_pb2.Response.FromString(record.value)
        assert response.WhichOneof("outcome") == "error" and record.partition == 1
        return
    planned = workflow_pb2.WorkflowEvent.FromString(record.value).planned
    assert planned.request == request and planned.plan == plan
    failed = planned.handed_over
    assert (failed.task_id, failed.step, failed.attempt, failed.worker) == (f"{rid}:0:1", 0, 1, "gemini-pro")
    assert failed.error.message
    if bus.kind != "kafka":
        return
    # The same task again, uncommitted, already handed over: a new executor leaves it to the synthesizer.
    again = uuid.uuid4().hex
    task.request_id = task.workflow.request.request_id = again
    task.task_id = failed.task_id = f"{again}:0:1"
    app = create_app(config, "sim", tracer_provider=setup_tracing("t", set_global=False))
    await bus.publish(app, topics.tasks_topic("sim"), again, task.SerializeToString())
    await bus.publish(app, topics.WORKFLOW, again, handed_over(task.workflow, failed).SerializeToString())
    async with bus.running(app, topics.WORKFLOW) as seen:
        rerun = await seen[topics.WORKFLOW].wait(lambda r: r.key == again.encode(), timeout=5)
    assert rerun == [], "a task already handed over ran again"


@pytest.mark.parametrize("bus", ["kafka"], indirect=True)
async def test_a_recovery_longer_than_the_session_timeout_neither_drops_the_replica_nor_loses_the_task(bus, monkeypatch):
    """Reading back what was published after an assignment can take longer than the group's session
    timeout (6 s here) on a long history. The consumer must keep its place in the group meanwhile, and
    run the task once the read is done; a replica that read inside the rebalance callback sent no
    heartbeat, was dropped, and started the read again at each new assignment, for ever."""
    recoveries: list[float] = []

    async def slow_recovery(self, assigned):
        recoveries.append(asyncio.get_running_loop().time())
        await asyncio.sleep(8)

    monkeypatch.setattr(TaskConsumer, "_recover", slow_recovery)
    app = create_app(bus.config(), "sim", tracer_provider=setup_tracing("t", set_global=False))
    row = first_question()
    rid = uuid.uuid4().hex
    task = tasks_pb2.Task(task_id=f"{rid}:0:1", request_id=rid, step=0, attempt=1, worker="gemini-pro",
                          query=row["prompt"], messages=[common_pb2.ChatMessage(role="user", content=row["prompt"])])
    async with bus.running(app, topics.WORKFLOW) as seen:
        await bus.publish(app, topics.tasks_topic("sim"), rid, task.SerializeToString())
        (record,) = await seen[topics.WORKFLOW].wait(lambda r: r.key == rid.encode(), timeout=30)
    assert workflow_pb2.WorkflowEvent.FromString(record.value).step_completed.task_id == f"{rid}:0:1"
    assert len(recoveries) == 1, f"the group assigned partitions {len(recoveries)} times: the replica was dropped"
