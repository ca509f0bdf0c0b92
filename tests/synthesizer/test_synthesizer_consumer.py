"""The synthesizer's workflow consumer, run in memory and on the real broker: a plan's steps are
dispatched in order, each with what its access list names, and the answer goes to the partition of
baton.responses that the asking gateway reads. A plan read after its request's deadline dispatches nothing. (Restarts mid-workflow:
test_synthesizer_kafka.py.)"""

from __future__ import annotations

import time
import uuid

import httpx
from testbed import completed, default_config_data, planned_event

from baton.v1 import responses_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.telemetry import setup_tracing
from baton_synthesizer.main import create_app


async def test_a_plan_runs_step_by_step_to_an_answer_on_the_reply_partition(bus):
    app = create_app(bus.config(), tracer_provider=setup_tracing("t", set_global=False))
    rid = uuid.uuid4().hex

    def task_of(step):
        return lambda r: r.key == rid.encode() and tasks_pb2.Task.FromString(r.value).step == step

    def final(r):
        return r.key == rid.encode() and responses_pb2.Response.FromString(r.value).WhichOneof("outcome") == "answer"

    async with bus.running(app, topics.tasks_topic("sim"), topics.RESPONSES) as seen:
        tasks = seen[topics.tasks_topic("sim")]
        await bus.publish(app, topics.WORKFLOW, rid, planned_event(rid))
        (t0,) = await tasks.wait(task_of(0))
        assert tasks_pb2.Task.FromString(t0.value).task_id == f"{rid}:0:1"
        assert await tasks.wait(task_of(1), timeout=0.5) == [], "step 1 waits for the step it reads"
        await bus.publish(app, topics.WORKFLOW, rid, completed(rid, 0, "DRAFT-OUTPUT"))
        (t1,) = await tasks.wait(task_of(1))
        assert "DRAFT-OUTPUT" in tasks_pb2.Task.FromString(t1.value).messages[0].content
        await bus.publish(app, topics.WORKFLOW, rid, completed(rid, 1, "FINAL"))
        (answer,) = await seen[topics.RESPONSES].wait(final)
    response = responses_pb2.Response.FromString(answer.value)
    assert answer.partition == 2, "the response goes to the partition the asking gateway reads"
    assert response.answer == "FINAL" and [s.output for s in response.episode.steps] == ["DRAFT-OUTPUT", "FINAL"]


async def test_a_one_step_workflow_handed_over_by_its_executor_goes_on_to_the_fallback(bus):
    """router.direct_single_step: the executor ran the one step, it failed, and the worker has a
    fallback. The synthesizer starts from that failed attempt: it dispatches the fallback as attempt 2,
    never the failed step again, and answers with the fallback's output and attempt, as on its own path."""
    from baton.v1 import common_pb2, requests_pb2
    from baton_workflow import Plan, to_proto
    from baton_workflow.steps import handed_over

    data = default_config_data()
    next(w for w in data["workers"] if w["name"] == "gemini-pro")["fallback"] = "llama-70b"
    app = create_app(bus.config(data=data), tracer_provider=setup_tracing("t", set_global=False))
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")],
                                       reply_partition=2)
    plan = to_proto(Plan(workers=["gemini-pro"], subtasks=["Answer."], access=[[]]), backend="static")
    failed = workflow_pb2.StepFailed(task_id=f"{rid}:0:1", step=0, attempt=1, worker="gemini-pro",
                                     error=common_pb2.Error(code="provider_error", message="not in the matrix"))
    event = handed_over(workflow_pb2.WorkflowPlanned(request=request, plan=plan), failed)

    async with bus.running(app, topics.tasks_topic("sim"), topics.RESPONSES) as seen:
        tasks = seen[topics.tasks_topic("sim")]
        await bus.publish(app, topics.WORKFLOW, rid, event.SerializeToString())
        (dispatched,) = await tasks.wait(lambda r: r.key == rid.encode())
        task = tasks_pb2.Task.FromString(dispatched.value)
        assert (task.task_id, task.worker, task.attempt) == (f"{rid}:0:2", "llama-70b", 2)
        done = workflow_pb2.WorkflowEvent(request_id=rid, step_completed=workflow_pb2.StepCompleted(
            task_id=task.task_id, step=0, attempt=2, worker="llama-70b", output="FALLBACK"))
        await bus.publish(app, topics.WORKFLOW, rid, done.SerializeToString())
        (answer,) = await seen[topics.RESPONSES].wait(lambda r: r.key == rid.encode())
        assert [r for r in tasks.records if r.key == rid.encode()] == [dispatched], "the failed step ran again"
    response = responses_pb2.Response.FromString(answer.value)
    assert response.answer == "FALLBACK" and answer.partition == 2
    assert [(s.worker, s.attempt) for s in response.episode.steps] == [("llama-70b", 2)]


async def test_a_hand_over_naming_no_step_of_its_plan_runs_the_plan_from_the_start(bus):
    """A record on the bus is not trusted: a handed-over failure for a step the plan lacks neither
    stalls the workflow nor moves anything to a fallback; the plan's step is dispatched as attempt 1."""
    from baton.v1 import common_pb2, requests_pb2
    from baton_workflow import Plan, to_proto
    from baton_workflow.steps import handed_over

    app = create_app(bus.config(), tracer_provider=setup_tracing("t", set_global=False))
    rid = uuid.uuid4().hex
    request = requests_pb2.ChatRequest(request_id=rid, messages=[common_pb2.ChatMessage(role="user", content="Q")])
    plan = to_proto(Plan(workers=["gemini-pro"], subtasks=["Answer."], access=[[]]), backend="static")
    bogus = workflow_pb2.StepFailed(task_id=f"{rid}:5:1", step=5, attempt=1, worker="gemini-pro")
    async with bus.running(app, topics.tasks_topic("sim")) as seen:
        await bus.publish(app, topics.WORKFLOW, rid,
                          handed_over(workflow_pb2.WorkflowPlanned(request=request, plan=plan), bogus).SerializeToString())
        (dispatched,) = await seen[topics.tasks_topic("sim")].wait(lambda r: r.key == rid.encode())
    task = tasks_pb2.Task.FromString(dispatched.value)
    assert (task.task_id, task.worker, task.attempt) == (f"{rid}:0:1", "gemini-pro", 1)


async def test_an_event_that_is_not_a_workflow_event_is_dead_lettered_and_the_next_one_is_handled(bus):
    app = create_app(bus.config(), tracer_provider=setup_tracing("t", set_global=False))
    rid = uuid.uuid4().hex
    async with bus.running(app, topics.tasks_topic("sim"), topics.DLQ) as seen:
        await bus.publish(app, topics.WORKFLOW, rid, b"\xff\xfe not protobuf")
        await bus.publish(app, topics.WORKFLOW, rid, workflow_pb2.WorkflowEvent(request_id=rid).SerializeToString())
        await bus.publish(app, topics.WORKFLOW, rid, planned_event(rid))
        (task,) = await seen[topics.tasks_topic("sim")].wait(lambda r: r.key == rid.encode())
        letters = await seen[topics.DLQ].wait(lambda r: r.key == rid.encode(), count=2)
    reasons = sorted(dict(r.headers)[topics.DLQ_REASON_HEADER].decode() for r in letters)
    assert reasons[0] == "WorkflowEvent with no event set" and "not a valid baton.v1.WorkflowEvent" in reasons[1]
    assert tasks_pb2.Task.FromString(task.value).task_id == f"{rid}:0:1"


async def test_a_plan_read_after_its_deadline_is_ended_without_a_task_and_counted(bus):
    app = create_app(bus.config(), tracer_provider=setup_tracing("t", set_global=False))
    late, live = uuid.uuid4().hex, uuid.uuid4().hex
    now_ms = int(time.time() * 1000)
    async with bus.running(app, topics.tasks_topic("sim"), topics.RESPONSES) as seen:
        # One key, so one partition in this order: the live plan is handled after the late one.
        await bus.publish(app, topics.WORKFLOW, "k", planned_event(late, deadline_unix_ms=now_ms - 1000))
        await bus.publish(app, topics.WORKFLOW, "k", planned_event(live, deadline_unix_ms=now_ms + 60_000))
        (ended,) = await seen[topics.RESPONSES].wait(lambda r: r.key == late.encode())
        await seen[topics.tasks_topic("sim")].wait(lambda r: r.key == live.encode())
        dispatched = [r.key.decode() for r in seen[topics.tasks_topic("sim")].records]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://synthesizer") as client:
            metrics = (await client.get("/metrics")).text
    assert responses_pb2.Response.FromString(ended.value).error.code == "deadline_exceeded"
    assert late not in dispatched, "no provider is paid for an answer nobody waits for"
    assert "baton_synthesizer_expired_total 1.0" in metrics
