"""The synthesizer's handlers on a real broker, including a restart in the middle of a workflow."""

from __future__ import annotations

import uuid

import pytest
from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from faststream import TestApp

from baton_platform import topics
from baton_synthesizer.main import create_app
from baton_workflow import Plan, to_proto
from integration.helpers import Tap, config_for, ensure_topics, publish, tracer

pytestmark = pytest.mark.kafka


def planned_event(rid: str) -> bytes:
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       reply_partition=2)
    plan = to_proto(Plan(workers=["gemini-flash", "gemini-pro"], subtasks=["draft", "check"], access=[[], [0]]),
                    backend="static")
    return workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(
        request=request, plan=plan)).SerializeToString()


def completed(rid: str, step: int, output: str) -> bytes:
    return workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
        task_id=f"{rid}:{step}:1", step=step, attempt=1, output=output,
        usage=common_pb2.Usage(calls=1))).SerializeToString()


async def test_a_restart_mid_workflow_resumes_without_rerunning_completed_steps(kafka_bootstrap, write_config):
    await ensure_topics(kafka_bootstrap)
    config = config_for(write_config, kafka_bootstrap)
    rid = uuid.uuid4().hex

    def task_of(step):
        return lambda r: r.key == rid.encode() and tasks_pb2.Task.FromString(r.value).step == step

    async with Tap(kafka_bootstrap, topics.tasks_topic("sim")) as tasks, Tap(kafka_bootstrap, topics.RESPONSES) as responses:
        async with TestApp(create_app(config, tracer_provider=tracer())):
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, planned_event(rid))
            (t0,) = await tasks.wait(task_of(0))
            assert tasks_pb2.Task.FromString(t0.value).task_id == f"{rid}:0:1"
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 0, "DRAFT-OUTPUT"))
            (t1,) = await tasks.wait(task_of(1))
            assert "DRAFT-OUTPUT" in tasks_pb2.Task.FromString(t1.value).messages[0].content
        # A new instance takes over the partition: it re-reads the running workflow and re-sends only
        # the step that had not completed, with the same task id.
        async with TestApp(create_app(config, tracer_provider=tracer())):
            resent = await tasks.wait(task_of(1), count=2)
            assert len(resent) == 2 and len({r.value for r in resent}) == 1
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 1, "FINAL"))
            (resp,) = await responses.wait(lambda r: r.key == rid.encode())
        assert len(await tasks.wait(task_of(0), count=2, timeout=1)) == 1, "step 0 was never run again"
    response = responses_pb2.Response.FromString(resp.value)
    assert resp.partition == 2, "the response goes to the partition the asking gateway reads"
    assert response.answer == "FINAL" and [s.output for s in response.episode.steps] == ["DRAFT-OUTPUT", "FINAL"]
