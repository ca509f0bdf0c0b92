"""A step as the executor receives it, and a step's outcome as the episode records it: one definition
for the synthesizer, which runs workflows of any shape, and for the router and executor, which run a
one-step workflow between them (`router.direct_single_step`)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from baton.v1 import common_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_workflow.context import query_text, step_messages, turn
from baton_workflow.errors import WorkflowError
from baton_workflow.plan import Plan


def past_deadline(deadline_unix_ms: int, now_ms: float | None = None) -> bool:
    """Whether a request's deadline (0: none) has come: its client has had the gateway's 504, so work
    for it now pays for an answer nobody reads. Every hop asks this before spending anything on it."""
    now = time.time() * 1000 if now_ms is None else now_ms
    return bool(deadline_unix_ms) and now >= deadline_unix_ms


def answer_options(request: requests_pb2.ChatRequest, into: tasks_pb2.Task | requests_pb2.ChatRequest) -> None:
    """The client's limits, sampling, tools and format, for what answers it (a plan's last step)."""
    into.max_tokens = request.max_tokens
    if request.HasField("temperature"):
        into.temperature = request.temperature
    if request.HasField("answer"):
        into.answer.CopyFrom(request.answer)


def task_id(request_id: str, step: int, attempt: int) -> str:
    """The id of one attempt of one step: what executors and the synthesizer deduplicate on."""
    return f"{request_id}:{step}:{attempt}"


def episode_results(response: responses_pb2.Response) -> list[tuple[str, bool]]:
    """(task id, completed) of each step in a final response's episode; none for a stream's deltas or
    a progress note. Where a one-step workflow's executor answers the client itself, these are its results."""
    if response.WhichOneof("outcome") not in ("answer", "error"):
        return []
    return [(task_id(response.request_id, s.step, s.attempt), not s.HasField("error")) for s in response.episode.steps]


def step_task(request: requests_pb2.ChatRequest, plan: Plan, step: int, attempt: int, worker: str,
              outputs: Mapping[int, str]) -> tasks_pb2.Task:
    """The task for one step: the messages its access list allows (`outputs`: the earlier steps'
    outputs), and on the last step the client's answer options."""
    conversation = [turn(m) for m in request.messages]
    prior = [(s.instruction, s.output) for s in request.parent.steps]
    answering = step == plan.steps - 1
    messages = step_messages(plan, step, conversation, outputs, prior,
                             native_tools=answering and bool(request.answer.tools))
    rid = request.request_id
    task = tasks_pb2.Task(
        task_id=task_id(rid, step, attempt), request_id=rid, step=step, attempt=attempt, worker=worker,
        messages=[common_pb2.ChatMessage(**m) for m in messages], deadline_unix_ms=request.deadline_unix_ms,
        query=query_text(conversation))
    if answering:
        # Earlier steps run on the workers' defaults: a draft cut to the client's max_tokens would starve the answer.
        answer_options(request, task)
    return task


def record_step(episode: responses_pb2.Episode, step: int, worker: str, attempt: int, instruction: str,
                completed: workflow_pb2.StepCompleted | None = None, error: common_pb2.Error | None = None) -> None:
    """A started step in the episode: its output and usage (added to the totals) or its error."""
    record = episode.steps.add(step=step, worker=worker, attempt=attempt, instruction=instruction)
    if completed is not None:
        record.model, record.output, record.latency_ms = completed.model, completed.output, completed.latency_ms
        record.usage.CopyFrom(completed.usage)
        total = episode.total
        total.input_tokens += completed.usage.input_tokens
        total.output_tokens += completed.usage.output_tokens
        total.cost_usd += completed.usage.cost_usd
        total.calls += completed.usage.calls
        if completed.HasField("inner_plan"):
            record.inner_plan.CopyFrom(completed.inner_plan)
    elif error is not None:
        record.error.CopyFrom(error)


def step_failure(step: int, worker: str, error: common_pb2.Error) -> common_pb2.Error:
    """The request's error when a step failed for good (no fallback left). A step not run because
    the request's deadline passed ends the request with that code (a 504), not STEP_FAILED."""
    code = WorkflowError.DEADLINE_EXCEEDED if error.code == WorkflowError.DEADLINE_EXCEEDED else WorkflowError.STEP_FAILED
    return common_pb2.Error(code=code, message=f"step {step + 1} ({worker}) failed: {error.message}")


def copy_answer_fields(into: responses_pb2.Response | workflow_pb2.StepCompleted,
                       final: workflow_pb2.StepCompleted) -> None:
    """What the answering step returned beside its text: tool calls, finish reason, log-probs."""
    into.tool_calls.extend(final.tool_calls)
    into.finish_reason = final.finish_reason
    into.logprobs.extend(final.logprobs)


def handed_over(planned: workflow_pb2.WorkflowPlanned, failed: workflow_pb2.StepFailed) -> workflow_pb2.WorkflowEvent:
    """A one-step workflow the executor ran whole, for the synthesizer to go on with after its step
    failed: the plan, with that failed attempt, as one record (the synthesizer's run starts from it)."""
    out = workflow_pb2.WorkflowPlanned()
    out.CopyFrom(planned)
    out.handed_over.CopyFrom(failed)
    return workflow_pb2.WorkflowEvent(request_id=planned.request.request_id, planned=out)


def one_step_response(planned: workflow_pb2.WorkflowPlanned, result: workflow_pb2.WorkflowEvent,
                      now_ms: int) -> responses_pb2.Response:
    """The client's final response for a one-step workflow, from its only step's result: what the
    synthesizer answers for the same workflow."""
    request, step = planned.request, planned.plan.steps[0]
    episode = responses_pb2.Episode(request=request, plan=planned.plan,
                                    latency_ms=float(now_ms - request.created_unix_ms))
    response = responses_pb2.Response(request_id=request.request_id, completed_unix_ms=now_ms)
    if result.WhichOneof("event") == "step_completed":
        done = result.step_completed
        record_step(episode, 0, done.worker or step.worker, done.attempt, step.instruction, completed=done)
        response.answer = done.output
        copy_answer_fields(response, done)
    else:
        failed = result.step_failed
        worker = failed.worker or step.worker
        record_step(episode, 0, worker, failed.attempt, step.instruction, error=failed.error)
        response.error.CopyFrom(step_failure(0, worker, failed.error))
    response.episode.CopyFrom(episode)
    return response
