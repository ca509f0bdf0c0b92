"""The synthesizer's Kafka wiring re-reading a partition after a crash, with a fake broker: the
watchdog leaves replayed workflows alone until their history is read, and a workflow already
answered before the crash is not answered again."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from aiokafka import TopicPartition
from baton.v1 import common_pb2, requests_pb2, responses_pb2, workflow_pb2
from prometheus_client import CollectorRegistry

from baton_platform import topics
from baton_platform.config import load_config
from baton_synthesizer.handlers import SynthesizerWiring
from baton_synthesizer.workflows import Workflows
from baton_workflow import Plan, to_proto

TP = TopicPartition(topics.WORKFLOW, 0)


class Broker:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, body, topic, key=None, partition=None):
        self.published.append((topic, body))

    def responses(self) -> list[responses_pb2.Response]:
        return [responses_pb2.Response.FromString(b) for t, b in self.published if t == topics.RESPONSES]


def wiring(write_config) -> tuple[SynthesizerWiring, Broker]:
    broker = Broker()
    config = load_config(write_config())
    service = SimpleNamespace(broker=broker, config=config, registry=CollectorRegistry(), dead_letters=None)
    return SynthesizerWiring(service, Workflows(config)), broker


def history(rid: str, deadline_ms: int) -> list[workflow_pb2.WorkflowEvent]:
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       created_unix_ms=deadline_ms - 5000, deadline_unix_ms=deadline_ms)
    plan = to_proto(Plan(workers=["gemini-flash"], subtasks=["answer"], access=[[]]), backend="static")
    return [workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(request=request, plan=plan)),
            workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
                task_id=f"{rid}:0:1", step=0, attempt=1, output="ANSWER", usage=common_pb2.Usage(calls=1)))]


def record(offset: int, event: workflow_pb2.WorkflowEvent, end: int) -> SimpleNamespace:
    raw = SimpleNamespace(topic=TP.topic, partition=TP.partition, offset=offset)
    return SimpleNamespace(raw_message=raw, body=event.SerializeToString(),
                           consumer=SimpleNamespace(highwater=lambda tp: end))


async def test_a_replayed_workflow_past_its_deadline_is_not_failed_before_its_results_are_read(write_config):
    w, broker = wiring(write_config)
    w.answered = _none_answered
    events = history("r1", deadline_ms=int(time.time() * 1000) - 1000)  # the deadline passed while it was down
    await w.start_timers()
    try:
        await w.handle(record(0, events[0], end=2))
        await asyncio.sleep(0.6)  # the watchdog runs while the rest of the partition is still unread
        await w.handle(record(1, events[1], end=2))
    finally:
        await w.stop_timers()
    (response,) = broker.responses()
    assert response.WhichOneof("outcome") == "answer" and response.answer == "ANSWER", response


async def test_a_workflow_answered_before_the_crash_is_not_answered_again(write_config):
    w, broker = wiring(write_config)

    async def answered(runs):
        return {r.request.request_id for r in runs}

    w.answered = answered
    events = history("r2", deadline_ms=int(time.time() * 1000) + 60_000)
    await w.handle(record(0, events[0], end=2))
    await w.handle(record(1, events[1], end=2))
    assert broker.responses() == [], "its response is already on baton.responses"
    assert w.tracker.committable()[TP] == 2, "and its partition commits past it"
    assert "r2" not in w.workflows.runs


async def _none_answered(runs):
    return set()
