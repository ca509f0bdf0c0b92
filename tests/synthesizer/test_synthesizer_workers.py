"""Workers added to the configuration file while the synthesizer runs: its Kafka wiring (on
FastStream's in-memory broker) reads the file again when a plan names a worker it lacks, skips a
half-written file, and sends the new worker its steps; the workflow core only looks workers up."""

from __future__ import annotations

import os
from types import SimpleNamespace

import yaml
from faststream.kafka import TestKafkaBroker
from testbed import MMLU_PRO, default_config_data

from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.config import ConfigWatch, load_config
from baton_platform.service import Service
from baton_platform.telemetry import setup_tracing
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.handlers import RunConsumer
from baton_synthesizer.runs import Runs
from baton_workflow import Plan, to_proto

NEW = {"name": "qwen-110b", "provider": "sim", "model": "Qwen1.5-110B", "sim": {"dataset": str(MMLU_PRO)},
       "price": {"input_per_mtok": 0.9, "output_per_mtok": 0.9}}


def planned(offset: int, request_id: str) -> SimpleNamespace:
    """A record of partition 0 planning one step on the new worker."""
    request = requests_pb2.ChatRequest(request_id=request_id, messages=[common_pb2.ChatMessage(role="user", content="Q?")])
    plan = to_proto(Plan(workers=[NEW["name"]], subtasks=["a"], access=[[]]), backend="static")
    body = workflow_pb2.WorkflowEvent(request_id=request_id, planned=workflow_pb2.WorkflowPlanned(
        request=request, plan=plan)).SerializeToString()
    raw = SimpleNamespace(topic=topics.WORKFLOW, partition=0, offset=offset, headers=(), key=b"", value=body)
    return SimpleNamespace(raw_message=raw, body=body)


async def test_a_worker_added_to_the_file_is_served_once_a_plan_names_it(write_config):
    data = default_config_data()
    path = write_config(data=data)
    config = load_config(path)
    service = Service.create("baton-synthesizer", config.kafka, setup_tracing("t", set_global=False))
    workers = WorkerPool(config.workers, ConfigWatch(path))
    w = RunConsumer(service, Runs(config.synthesizer, workers, max_steps=config.conductor.max_steps), workers)
    w.consumer.end_offset = lambda tp: 0  # nothing to replay
    errors: list[str] = []
    tasks: list[str] = []

    @service.broker.subscriber(topics.RESPONSES)
    async def on_response(body: bytes):
        errors.append(responses_pb2.Response.FromString(body).error.code)

    @service.broker.subscriber(topics.tasks_topic("sim"))
    async def on_task(body: bytes):
        tasks.append(tasks_pb2.Task.FromString(body).worker)

    def rewrite(text: str, stamp_s: int) -> None:
        path.write_text(text)
        os.utime(path, ns=(stamp_s * 10**9, stamp_s * 10**9))  # a new modification time, however coarse the clock

    async with TestKafkaBroker(service.broker):
        await w.consumer.consume(planned(0, "r1"))
        assert (errors, tasks) == (["unknown_worker"], []), "the file has not changed"
        data["workers"].append(NEW)
        full = yaml.safe_dump(data)
        rewrite(full[: len(full) // 2] + "\n  - [", 1_000)
        await w.consumer.consume(planned(1, "r2"))
        assert (errors, tasks) == (["unknown_worker"] * 2, []), "a file that does not load is skipped"
        rewrite(full, 2_000)
        await w.consumer.consume(planned(2, "r3"))
    assert tasks == [NEW["name"]] and NEW["name"] in workers
