"""The synthesizer on a real broker across restarts: each scenario needs a partition re-read from the
group's committed offsets, which the in-memory broker does not keep (its consumer scenarios run on
both brokers in test_synthesizer_consumer.py)."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaProducer
from faststream import TestApp
from testbed import Tap, completed, config_for, ensure_topics, planned_event, publish, skip_backlog, tracer

from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_synthesizer.main import create_app
from baton_workflow import Plan, to_proto


# Real broker only: the new instance re-reads the partition from the group's committed offsets.
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


# Real broker only: the new instance re-reads the partition from the group's committed offsets.
async def test_a_restart_while_a_conductor_step_runs_resends_its_inner_request_and_takes_its_result(
        kafka_bootstrap, write_config):
    await ensure_topics(kafka_bootstrap)
    config = config_for(write_config, kafka_bootstrap)
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       reply_partition=1)
    plan = to_proto(Plan(workers=["gemini-flash", "conductor"], subtasks=["draft", "check"], access=[[], [0]]),
                    backend="static")
    planned = workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(request=request, plan=plan))

    def inner(r):
        return r.key == f"{rid}:1:1".encode()

    async with Tap(kafka_bootstrap, topics.REQUESTS) as requests, Tap(kafka_bootstrap, topics.RESPONSES) as responses:
        async with TestApp(create_app(config, tracer_provider=tracer())):
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, planned.SerializeToString())
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 0, "DRAFT"))
            (first,) = await requests.wait(inner)
        async with TestApp(create_app(config, tracer_provider=tracer())):
            # The new owner re-reads the workflow and asks the conductor again, with the same id.
            again = await requests.wait(inner, count=2)
            sent, resent = (requests_pb2.ChatRequest.FromString(r.value) for r in again)
            assert resent.parent == sent.parent and resent.messages == sent.messages
            assert sent.parent.last_answer == "DRAFT" and sent.parent.request_id == rid
            # The router kept the answer: the parent's step completes with it.
            kept = workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
                task_id=f"{rid}:1:1", step=1, attempt=1, worker="conductor", output="DRAFT",
                inner_plan=workflow_pb2.Plan(backend="static")))
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, kept.SerializeToString())
            (resp,) = await responses.wait(lambda r: r.key == rid.encode())
    response = responses_pb2.Response.FromString(resp.value)
    assert response.answer == "DRAFT" and [s.worker for s in response.episode.steps] == ["gemini-flash", "conductor"]
    assert response.episode.steps[1].HasField("inner_plan")


# Real broker only: the new instance re-reads the partition from the group's committed offsets.
async def test_a_restart_while_the_judge_scores_resends_the_judge_task_and_answers_with_the_best(
        kafka_bootstrap, write_config):
    await ensure_topics(kafka_bootstrap)
    config = config_for(write_config, kafka_bootstrap, synthesizer={"group_answer": "judge"},
                        judge={"worker": "gemini-pro"})
    gid = uuid.uuid4().hex
    plan = to_proto(Plan(workers=["gemini-flash"], subtasks=["answer"], access=[[]]), backend="static")

    def planned(k):
        rid = gid if k == 0 else f"{gid}.{k}"
        request = requests_pb2.ChatRequest(request_id=rid, group_id=gid, candidate=k, group_size=2, reply_partition=1,
                                           messages=[common_pb2.ChatMessage(role="user", content="Q")])
        return rid, workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(
            request=request, plan=plan)).SerializeToString()

    def judge_task(r):
        return r.key == gid.encode() and tasks_pb2.Task.FromString(r.value).step == 1

    async with Tap(kafka_bootstrap, topics.tasks_topic("sim")) as tasks, \
            Tap(kafka_bootstrap, topics.RESPONSES) as responses, Tap(kafka_bootstrap, topics.FEEDBACK) as feedback:
        async with TestApp(create_app(config, tracer_provider=tracer())):
            for k in (0, 1):
                rid, event = planned(k)
                await publish(kafka_bootstrap, topics.WORKFLOW, rid, event)
                await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 0, f"answer {k}"))
            (first,) = await tasks.wait(judge_task)
            assert list(tasks_pb2.Task.FromString(first.value).candidates) == ["answer 0", "answer 1"]
        async with TestApp(create_app(config, tracer_provider=tracer())):
            # The group's reports are on the client candidate's partition: the judge is asked again, alike.
            again = await tasks.wait(judge_task, count=2)
            assert again[1].value == first.value
            scored = workflow_pb2.WorkflowEvent(request_id=gid, step_completed=workflow_pb2.StepCompleted(
                task_id=f"{gid}:1:1", step=1, attempt=1, output='{"scores": [3, 8]}'))
            await publish(kafka_bootstrap, topics.WORKFLOW, gid, scored.SerializeToString())
            (resp,) = await responses.wait(lambda r: r.key == gid.encode() and
                                           responses_pb2.Response.FromString(r.value).WhichOneof("outcome") == "answer")
            rates = await feedback.wait(lambda r: True, count=2)
    assert responses_pb2.Response.FromString(resp.value).answer == "answer 1"
    assert sorted(r.key for r in rates) == sorted([gid.encode(), f"{gid}.1".encode()])


# Real broker only: the new instance re-reads the partition from the group's committed offsets.
async def test_a_workflow_answered_just_before_a_crash_is_not_answered_again(kafka_bootstrap, write_config):
    await ensure_topics(kafka_bootstrap)
    config = config_for(write_config, kafka_bootstrap)
    rid = uuid.uuid4().hex
    async with Tap(kafka_bootstrap, topics.RESPONSES) as responses:
        # The last owner published the answer, then died before committing: the partition still
        # holds the whole workflow past its committed offset, and baton.responses holds its answer.
        await publish(kafka_bootstrap, topics.WORKFLOW, rid, planned_event(rid))
        await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 0, "DRAFT"))
        await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 1, "FINAL"))
        answer = responses_pb2.Response(request_id=rid, answer="FINAL")
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topics.RESPONSES, answer.SerializeToString(), key=rid.encode(), partition=2)
        finally:
            await producer.stop()
        async with TestApp(create_app(config, tracer_provider=tracer())):
            again = await responses.wait(lambda r: r.key == rid.encode(), count=2, timeout=8)
    assert len(again) == 1, "the workflow was answered once, before the crash"


# Real broker only: the new instance re-reads the partition from the group's committed offsets.
async def test_a_replayed_workflow_past_its_deadline_is_answered_from_its_history(kafka_bootstrap, write_config):
    import time

    await ensure_topics(kafka_bootstrap)
    config = config_for(write_config, kafka_bootstrap)
    rid = uuid.uuid4().hex
    now_ms = int(time.time() * 1000)
    # The deadline passed while no synthesizer ran; the step's result was already in.
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       created_unix_ms=now_ms - 6000, deadline_unix_ms=now_ms - 1000)
    plan = to_proto(Plan(workers=["gemini-flash"], subtasks=["answer"], access=[[]]), backend="static")
    planned = workflow_pb2.WorkflowEvent(request_id=rid, planned=workflow_pb2.WorkflowPlanned(request=request, plan=plan))
    async with Tap(kafka_bootstrap, topics.RESPONSES) as responses:
        await publish(kafka_bootstrap, topics.WORKFLOW, rid, planned.SerializeToString())
        await publish(kafka_bootstrap, topics.WORKFLOW, rid, completed(rid, 0, "ANSWER"))
        async with TestApp(create_app(config, tracer_provider=tracer())):
            (resp,) = await responses.wait(lambda r: r.key == rid.encode())
            assert len(await responses.wait(lambda r: r.key == rid.encode(), count=2, timeout=2)) == 1
    response = responses_pb2.Response.FromString(resp.value)
    assert response.WhichOneof("outcome") == "answer" and response.answer == "ANSWER", response


# Real broker only: whether a partition has history depends on the group's committed offsets.
async def test_a_partition_committed_to_its_end_acts_on_new_plans_without_reading_back_responses(
        kafka_bootstrap, write_config, monkeypatch):
    from baton_synthesizer.handlers import RunConsumer

    await ensure_topics(kafka_bootstrap)
    await skip_backlog(kafka_bootstrap, topics.GROUP_SYNTHESIZER, topics.WORKFLOW)  # as a clean stop leaves it
    scans = []
    scan = RunConsumer._scan_responses

    async def counted(self, runs):
        scans.append([r.request.request_id for r in runs])
        return await scan(self, runs)

    monkeypatch.setattr(RunConsumer, "_scan_responses", counted)
    config = config_for(write_config, kafka_bootstrap)
    rid = uuid.uuid4().hex
    async with Tap(kafka_bootstrap, topics.tasks_topic("sim")) as tasks:
        async with TestApp(create_app(config, tracer_provider=tracer())):
            await publish(kafka_bootstrap, topics.WORKFLOW, rid, planned_event(rid))
            (task,) = await tasks.wait(lambda r: r.key == rid.encode())
    assert tasks_pb2.Task.FromString(task.value).task_id == f"{rid}:0:1"
    assert scans == [], "a new plan is no history: nothing to read back before acting on it"
