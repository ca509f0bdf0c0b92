"""The synthesizer's Kafka wiring re-reading a partition after a crash, with a fake broker: the
watchdog leaves replayed workflows alone until their history is read, and a workflow already
answered before the crash is not answered again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

from aiokafka import TopicPartition
from faststream.kafka import TestKafkaBroker

from baton.v1 import common_pb2, requests_pb2, responses_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.config import load_config
from baton_platform.service import Service
from baton_platform.telemetry import setup_tracing
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.handlers import RunConsumer
from baton_synthesizer.runs import Runs
from baton_workflow import Plan, to_proto

TP = TopicPartition(topics.WORKFLOW, 0)


@contextlib.asynccontextmanager
async def wiring(write_config):
    """The wiring on FastStream's in-memory broker; yields it and the responses it publishes."""
    config = load_config(write_config())
    service = Service.create("baton-synthesizer", config.kafka, setup_tracing("t", set_global=False))
    workers = WorkerPool(config.workers)
    w = RunConsumer(service, Runs(config.synthesizer, workers, max_steps=config.conductor.max_steps), workers)
    responses: list[responses_pb2.Response] = []

    @service.broker.subscriber(topics.RESPONSES)
    async def tap(body: bytes):
        responses.append(responses_pb2.Response.FromString(body))

    async with TestKafkaBroker(service.broker):
        yield w, responses, service


def history(rid: str, deadline_ms: int) -> list[workflow_pb2.WorkflowEvent]:
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       created_unix_ms=deadline_ms - 5000, deadline_unix_ms=deadline_ms)
    plan = to_proto(Plan(workers=["gemini-flash"], subtasks=["answer"], access=[[]]), backend="static")
    return [workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(request=request, plan=plan)),
            workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
                task_id=f"{rid}:0:1", step=0, attempt=1, output="ANSWER", usage=common_pb2.Usage(calls=1)))]


def record(offset: int, event: workflow_pb2.WorkflowEvent) -> SimpleNamespace:
    """A record at `offset` of partition 0 (FastStream's in-memory records all have offset 0)."""
    body = event.SerializeToString()
    raw = SimpleNamespace(topic=TP.topic, partition=TP.partition, offset=offset, headers=(), key=b"", value=body)
    return SimpleNamespace(raw_message=raw, body=body)


def history_read_to(w: RunConsumer, end: int) -> None:
    """The partition's end offset as the Kafka consumer would report it after a restart."""
    w.consumer.end_offset = lambda tp: end


# A restart's replay staged record by record (end offset, answered check): the real one is in test_synthesizer_kafka.py.
async def test_a_replayed_workflow_past_its_deadline_is_not_failed_before_its_results_are_read(write_config):
    async with wiring(write_config) as (w, responses, service):
        w.answered = _none_answered
        history_read_to(w, 2)
        events = history("r1", deadline_ms=int(time.time() * 1000) - 1000)  # the deadline passed while it was down
        await service.start_consumers()
        try:
            await w.consumer.consume(record(0, events[0]))
            await asyncio.sleep(0.6)  # the watchdog runs while the rest of the partition is still unread
            await w.consumer.consume(record(1, events[1]))
        finally:
            await service.stop_consumers()
    (response,) = responses
    assert response.WhichOneof("outcome") == "answer" and response.answer == "ANSWER", response


# A restart's replay staged record by record (end offset, answered check): the real one is in test_synthesizer_kafka.py.
async def test_a_workflow_answered_before_the_crash_is_not_answered_again(write_config):
    async def answered(runs):
        return {r.request.request_id for r in runs}

    async with wiring(write_config) as (w, responses, _):
        w.answered = answered
        history_read_to(w, 2)
        events = history("r2", deadline_ms=int(time.time() * 1000) + 60_000)
        await w.consumer.consume(record(0, events[0]))
        await w.consumer.consume(record(1, events[1]))
    assert responses == [], "its response is already on baton.responses"
    assert w.consumer.tracker.committable()[TP] == 2, "and its partition commits past it"
    assert "r2" not in w.workflows.runs


async def _none_answered(runs):
    return set()
