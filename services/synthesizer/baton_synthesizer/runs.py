"""Workflow execution as a state machine: events in, actions out. Knows nothing of Kafka.

A step is dispatched once every step its access list names is done; its context holds exactly those
steps. The answer is the last step's output once all steps are done. A step that fails (after its
executor's retries, and after the worker's fallback if one is configured) or is not answered in time
ends the request with a clear error, never a hang.

Recursion: a step given to the worker `conductor` goes to no executor. It becomes an inner request
(`Replan`, back to the router) carrying the steps it may read and their last answer. The router either
keeps that answer (and completes the step itself) or plans a corrective workflow, which runs here like
any other; when it ends, its answer or error returns to the parent as that step's result (`Return`).

Judging (synthesizer.group_answer: judge): the other candidates of an exploration group report
their outcome to the client's candidate (`Finish.report`, keyed by the group id). Once its own answer is
ready it waits for theirs (up to judge.wait_s), then asks the judge worker to score them all (an
extra task, numbered after the plan's steps). The client gets the best-scored answer; every score
goes to the reward logger as feedback (`Rate`). A judge that fails or answers nonsense leaves the
client its own candidate's answer.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baton.v1 import common_pb2, feedback_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_platform.config import JudgeConfig, SynthesizerConfig
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.judge import best, judge_messages, parse_scores
from baton_workflow import CONDUCTOR, Plan, from_proto, query_text, readable_steps, ready_steps, turn
from baton_workflow.errors import WorkflowError
from baton_workflow.steps import (
    answer_options,
    copy_answer_fields,
    past_deadline,
    record_step,
    step_failure,
    step_task,
    task_id,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dispatch:
    provider: str
    task: tasks_pb2.Task


@dataclass(frozen=True)
class Finish:
    response: responses_pb2.Response
    reply_partition: int
    # An exploration candidate judged with its group: its outcome for the group's client candidate.
    report: workflow_pb2.WorkflowEvent | None = None


@dataclass(frozen=True)
class Replan:
    """Ask the conductor to keep or correct the answer so far: a conductor step's inner request."""

    request: requests_pb2.ChatRequest


@dataclass(frozen=True)
class Return:
    """An inner workflow ended: its result, as the parent workflow's conductor step result."""

    event: workflow_pb2.WorkflowEvent


@dataclass(frozen=True)
class Rate:
    """The judge's score of a candidate's answer, as feedback on its response."""

    feedback: feedback_pb2.Feedback


@dataclass(frozen=True)
class Notify:
    """A non-final progress response, for clients that stream."""

    response: responses_pb2.Response
    reply_partition: int


Action = Dispatch | Replan | Finish | Return | Rate | Notify


def _tightest(*limits: float) -> float:
    """The smallest limit that is set (zero means unset)."""
    set_ = [x for x in limits if x > 0]
    return min(set_) if set_ else 0


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Run:
    request: requests_pb2.ChatRequest
    plan_proto: workflow_pb2.Plan
    plan: Plan
    started_ms: int
    # Opaque to this module: the Kafka layer keeps where the run began and its trace context here.
    origin: Any = None
    trace_context: Any = None
    started: set[int] = field(default_factory=set)
    done: dict[int, workflow_pb2.StepCompleted] = field(default_factory=dict)
    workers: dict[int, str] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    dispatched_ms: dict[int, int] = field(default_factory=dict)
    errors: dict[int, common_pb2.Error] = field(default_factory=dict)
    newly_done: list[int] = field(default_factory=list)
    finished: bool = False
    # Judging an exploration group (on the client's candidate only): the others' outcomes by candidate
    # number, when its own answer was ready, and the judge's reply or why there is none.
    candidates: dict[int, workflow_pb2.CandidateFinished] = field(default_factory=dict)
    ready_ms: int | None = None
    judge_order: list[str] = field(default_factory=list)
    judged: workflow_pb2.StepCompleted | None = None
    judge_error: str = ""
    own_error: common_pb2.Error | None = None  # its own workflow failed: the others may still answer

    @property
    def conversation(self) -> list[dict]:
        return [turn(m) for m in self.request.messages]


class Runs:
    """The workflows this replica is running (a `Run` each, by request id): events in, actions out."""

    def __init__(self, settings: SynthesizerConfig, workers: WorkerPool, *, max_steps: int,
                 judge: JudgeConfig | None = None, clock: Callable[[], int] = _now_ms) -> None:
        self._settings = settings
        # Looked up only: the wiring refreshes the pool from the file when a plan names a worker it lacks.
        self._workers = workers
        if settings.group_answer == "judge" and judge is None:
            raise ValueError("synthesizer.group_answer 'judge' needs a judge")
        self._judge_worker = judge.worker if judge else ""
        self._clock = clock
        self._step_timeout_ms = int(settings.step_timeout_s * 1000)
        # A conductor step plans and runs a whole inner workflow: planning plus up to max_steps steps.
        self._conductor_timeout_ms = self._step_timeout_ms * (max_steps + 1)
        self._judge_wait_ms = int(judge.wait_s * 1000) if judge else 0
        self.runs: dict[str, Run] = {}
        # Recently finished requests: a plan delivered again (the router re-read its input after a
        # crash) must not run a finished workflow a second time.
        self._finished: OrderedDict[str, None] = OrderedDict()

    # -- events --------------------------------------------------------------------------------

    def on_planned(self, planned: workflow_pb2.WorkflowPlanned, origin: Any = None, trace_context: Any = None) -> Run | None:
        """Start a run (a redelivered plan for a known run is ignored). Returns the new run."""
        rid = planned.request.request_id
        if rid in self.runs or rid in self._finished:
            return None
        run = Run(request=planned.request, plan_proto=planned.plan, plan=from_proto(planned.plan),
                  started_ms=self._clock(), origin=origin, trace_context=trace_context)
        self.runs[rid] = run
        return run

    def on_candidate(self, group_id: str, finished: workflow_pb2.CandidateFinished) -> Run | None:
        """Another candidate of the group finished: the client's candidate keeps its outcome for the judge."""
        run = self.runs.get(group_id)
        if run is None or run.finished or not self._judges(run) or not 0 < finished.candidate < run.request.group_size:
            return None
        run.candidates[finished.candidate] = finished
        return run

    def on_completed(self, request_id: str, completed: workflow_pb2.StepCompleted) -> Run | None:
        if (run := self._judging(request_id, completed.step)) is not None:
            if run.judged is not None or run.judge_error:
                return None
            run.judged = completed
            return run
        run = self._current(request_id, completed.step, completed.attempt)
        if run is None:
            return None
        self._note_attempt(run, completed.step, completed.attempt, completed.worker)
        run.done[completed.step] = completed
        run.newly_done.append(completed.step)
        return run

    def on_failed(self, request_id: str, failed: workflow_pb2.StepFailed) -> Run | None:
        if (run := self._judging(request_id, failed.step)) is not None:
            if run.judged is not None or run.judge_error:
                return None
            run.judge_error = f"the judge failed: {failed.error.message}"
            return run
        run = self._current(request_id, failed.step, failed.attempt)
        if run is None:
            return None
        self._note_attempt(run, failed.step, failed.attempt, failed.worker)
        run.errors[failed.step] = failed.error
        return run

    def _current(self, request_id: str, step: int, attempt: int) -> Run | None:
        """The run a step result belongs to, unless the result is a duplicate, late, or superseded."""
        run = self.runs.get(request_id)
        if run is None or run.finished or step in run.done or not 0 <= step < run.plan.steps:
            return None
        if attempt < run.attempts.get(step, 0):
            return None  # an older attempt, already replaced (e.g. by a fallback)
        return run

    @staticmethod
    def _note_attempt(run: Run, step: int, attempt: int, worker: str) -> None:
        # When a partition is re-read after a restart, results arrive for dispatches this instance
        # never made; the result itself says which attempt and worker it was.
        run.started.add(step)
        run.attempts[step] = attempt
        run.workers[step] = worker or run.workers.get(step) or run.plan.workers[step]
        run.errors.pop(step, None)

    # -- decisions -----------------------------------------------------------------------------

    def advance(self, run: Run) -> list[Action]:
        """Everything the run needs now: failed steps retried on a fallback or the request ended,
        ready steps dispatched, or the answer once every step is done."""
        if run.finished:
            return []
        notes = self._progress(run, [(i, "completed") for i in run.newly_done])
        run.newly_done.clear()
        return notes + self._decide(run)

    def _decide(self, run: Run) -> list[Action]:
        if run.own_error is not None:
            return self._judge(run, None)
        for step, error in sorted(run.errors.items()):
            fallback = None if run.workers[step] == CONDUCTOR else self._workers[run.workers[step]].fallback
            if fallback and fallback != run.workers[step] and run.attempts[step] < 2 and not self._past_deadline(run):
                del run.errors[step]
                return [self._dispatch(run, step, fallback, run.attempts[step] + 1)] + self._decide(run)
            failure = step_failure(step, run.workers[step], error)
            if self._judges(run):
                run.own_error = failure
                return self._judge(run, None)
            return [self._finish(run, error=failure)]
        unknown = self._workers.lacks(w for w in run.plan.workers if w != CONDUCTOR)
        if unknown:
            return [self._finish(run, error=common_pb2.Error(code=WorkflowError.UNKNOWN_WORKER, message=(
                f"the plan names {', '.join(map(repr, unknown))}, which the synthesizer's configuration does not "
                "list")))]
        if len(run.done) == run.plan.steps:
            answer = run.done[run.plan.steps - 1].output
            return self._judge(run, answer) if self._judges(run) else [self._finish(run, answer=answer)]
        ready = ready_steps(run.plan, set(run.done), run.started)
        if ready and self._past_deadline(run):
            # Its client already has its 504: a plan that waited past the deadline in a backlog,
            # or a run resumed after a restart, dispatches nothing more and pays no provider.
            return [self._finish(run, error=common_pb2.Error(
                code=WorkflowError.DEADLINE_EXCEEDED, message="the request's deadline passed before its steps ran"))]
        over = self._over_budget(run, len(ready))
        if over:
            return [self._finish(run, error=common_pb2.Error(code=WorkflowError.BUDGET_EXCEEDED, message=over))]
        dispatches = [self._dispatch(run, i, run.plan.workers[i], 1) for i in ready]
        return dispatches + self._progress(run, [(i, "started") for i in ready])

    def _progress(self, run: Run, changes: list[tuple[int, str]]) -> list[Action]:
        if not run.request.stream:
            return []
        rid = run.request.request_id
        return [Notify(responses_pb2.Response(request_id=rid, progress=responses_pb2.Progress(
            step=i, steps=run.plan.steps, worker=run.workers.get(i, run.plan.workers[i]), state=state)),
            run.request.reply_partition) for i, state in changes]

    def _streams(self, run: Run, step: int) -> bool:
        """Whether the step's output goes to the client token by token: the last step of a streaming
        request, unless a judge may pick another candidate's answer (then nothing is known until the
        judge decides). A conductor step's inner workflow does not stream: its answer arrives whole."""
        return run.request.stream and step == run.plan.steps - 1 and not self._judges(run)

    def _budget(self, run: Run) -> tuple[float, float, int, float]:
        """The request's call and cost limits (0: none), and the calls made and USD spent so far."""
        return (_tightest(self._settings.max_calls, run.request.budget.max_calls),
                _tightest(self._settings.max_cost_usd, run.request.budget.max_cost_usd),
                sum(run.attempts.values()), sum(c.usage.cost_usd for c in run.done.values()))

    def _over_budget(self, run: Run, new_calls: int) -> str | None:
        """Why dispatching `new_calls` more steps would break the request's budget, if it would."""
        if not new_calls:
            return None
        max_calls, max_cost, calls, spent = self._budget(run)
        if max_calls and calls + new_calls > max_calls:
            return f"the workflow needs more than its budget of {max_calls} provider calls"
        if max_cost and spent >= max_cost:
            return f"the workflow spent ${spent:.6f}, reaching its budget of ${max_cost:.6f}, with steps still to run"
        return None

    def expired(self, skip: Callable[[Run], bool] | None = None) -> list[tuple[Run, list[Action]]]:
        """Runs with a step unanswered past the step timeout or past the request's deadline. `skip`
        leaves out runs whose history is still being read: a result may be in what is left of it."""
        now = self._clock()
        out = []
        for run in list(self.runs.values()):
            if run.finished or (skip is not None and skip(run)):
                continue
            if run.ready_ms is not None:
                judge_late = run.plan.steps in run.dispatched_ms and now - run.dispatched_ms[run.plan.steps] > self._step_timeout_ms
                if judge_late and run.judged is None and not run.judge_error:
                    run.judge_error = f"the judge did not answer within {self._step_timeout_ms / 1000:g} s"
                if judge_late or now - run.ready_ms > self._judge_wait_ms:
                    out.append((run, self._decide(run)))
                continue
            late = [i for i, t in run.dispatched_ms.items() if i not in run.done and now - t > self._timeout_ms(run, i)]
            if late:
                i = late[0]
                error = common_pb2.Error(code=WorkflowError.STEP_TIMEOUT, message=(
                    f"step {i + 1} ({run.workers[i]}) was not answered within {self._timeout_ms(run, i) / 1000:g} s"))
            elif self._past_deadline(run):
                error = common_pb2.Error(code=WorkflowError.DEADLINE_EXCEEDED, message="the request's deadline passed")
            else:
                continue
            if late and self._judges(run):
                run.own_error = error  # the group's other candidates may still answer the client
                out.append((run, self._judge(run, None)))
                continue
            out.append((run, [self._finish(run, error=error)]))
        return out

    def _past_deadline(self, run: Run) -> bool:
        return past_deadline(run.request.deadline_unix_ms, self._clock())

    def _timeout_ms(self, run: Run, step: int) -> int:
        return self._conductor_timeout_ms if run.workers.get(step) == CONDUCTOR else self._step_timeout_ms

    def forget(self, request_id: str) -> None:
        run = self.runs.pop(request_id, None)
        if run is not None and run.finished:
            self._finished[request_id] = None
            if len(self._finished) > 100_000:
                self._finished.popitem(last=False)

    # -- building messages ---------------------------------------------------------------------

    def _dispatch(self, run: Run, step: int, worker_name: str, attempt: int) -> Dispatch | Replan:
        if worker_name == CONDUCTOR:
            return self._replan(run, step, attempt)
        worker = self._workers[worker_name]
        task = step_task(run.request, run.plan, step, attempt, worker.name, {i: c.output for i, c in run.done.items()})
        if self._streams(run, step):
            task.stream = True
            task.reply_partition = run.request.reply_partition
        run.started.add(step)
        run.workers[step] = worker.name
        run.attempts[step] = attempt
        run.dispatched_ms[step] = self._clock()
        return Dispatch(provider=worker.provider, task=task)

    def _replan(self, run: Run, step: int, attempt: int) -> Replan:
        """The inner request of a conductor step: the user's request, the steps this one may read
        (the workflow so far) and the latest of their outputs, with what is left of the budget."""
        rid = run.request.request_id
        inner_id = task_id(rid, step, attempt)
        readable = readable_steps(run.plan.access[step], step)
        parent = requests_pb2.Parent(
            request_id=rid, task_id=inner_id, step=step, attempt=attempt,
            depth=(run.request.parent.depth if run.request.HasField("parent") else 0) + 1,
            steps=[requests_pb2.PriorStep(worker=run.workers[j], instruction=run.plan.subtasks[j],
                                          output=run.done[j].output) for j in readable],
            last_answer=run.done[readable[-1]].output if readable else "",
        )
        inner = requests_pb2.ChatRequest(
            request_id=inner_id, policy=run.request.policy, messages=run.request.messages,
            metadata=run.request.metadata, deadline_unix_ms=run.request.deadline_unix_ms,
            created_unix_ms=self._clock(), parent=parent)
        if step == run.plan.steps - 1:
            answer_options(run.request, inner)  # the inner workflow's last step answers the client
        run.started.add(step)
        run.workers[step] = CONDUCTOR
        run.attempts[step] = attempt
        run.dispatched_ms[step] = self._clock()
        # Calls so far include this step's own; the inner workflow gets what is left (at least one).
        max_calls, max_cost, calls, spent = self._budget(run)
        if max_calls:
            inner.budget.max_calls = max(int(max_calls) - calls, 1)
        if max_cost:
            inner.budget.max_cost_usd = max(max_cost - spent, 1e-9)
        return Replan(request=inner)

    def _finish(self, run: Run, *, answer: str | None = None, error: common_pb2.Error | None = None,
                judgement: responses_pb2.Judgement | None = None) -> Finish | Return:
        run.finished = True
        episode = responses_pb2.Episode(request=run.request, plan=run.plan_proto,
                                        latency_ms=float(self._clock() - run.request.created_unix_ms))
        total = episode.total
        for i in sorted(run.started):
            record_step(episode, i, run.workers[i], run.attempts[i], run.plan.subtasks[i], completed=run.done.get(i),
                        error=run.errors.get(i))
        if run.request.HasField("parent"):
            return self._return(run, episode, answer, error)
        if judgement is not None:
            episode.judge.CopyFrom(judgement)
            total.input_tokens += judgement.usage.input_tokens
            total.output_tokens += judgement.usage.output_tokens
            total.cost_usd += judgement.usage.cost_usd
            total.calls += judgement.usage.calls
        response = responses_pb2.Response(request_id=run.request.request_id, episode=episode,
                                          completed_unix_ms=self._clock())
        if error is not None:
            response.error.CopyFrom(error)
        else:
            response.answer = answer or ""
            own = judgement is None or not judgement.request_ids or \
                judgement.request_ids[judgement.chosen] == run.request.request_id
            final = run.done.get(run.plan.steps - 1)
            if own and final is not None:
                copy_answer_fields(response, final)
        report = None
        if self._reports_to_group(run):
            report = workflow_pb2.WorkflowEvent(request_id=run.request.group_id, candidate_finished=workflow_pb2.CandidateFinished(
                request_id=run.request.request_id, candidate=run.request.candidate, answer=response.answer,
                error=error))
        return Finish(response=response, reply_partition=run.request.reply_partition, report=report)

    def _return(self, run: Run, episode: responses_pb2.Episode, answer: str | None,
                error: common_pb2.Error | None) -> Return:
        """An inner workflow's result as its parent's conductor step result: the answer (or the error)
        with the inner workflow's total usage, and the plan it ran."""
        parent = run.request.parent
        event = workflow_pb2.WorkflowEvent(request_id=parent.request_id)
        if error is None:
            event.step_completed.CopyFrom(workflow_pb2.StepCompleted(
                task_id=parent.task_id, step=parent.step, attempt=parent.attempt, worker=CONDUCTOR,
                output=answer or "", usage=episode.total, latency_ms=episode.latency_ms,
                model=run.plan_proto.policy_version or run.plan_proto.backend, inner_plan=run.plan_proto))
            if (final := run.done.get(run.plan.steps - 1)) is not None:
                copy_answer_fields(event.step_completed, final)
        else:
            event.step_failed.CopyFrom(workflow_pb2.StepFailed(
                task_id=parent.task_id, step=parent.step, attempt=parent.attempt, worker=CONDUCTOR,
                error=common_pb2.Error(code=error.code, message=f"the corrective workflow failed: {error.message}"),
                latency_ms=episode.latency_ms))
        return Return(event=event)

    # -- judging -------------------------------------------------------------------------------

    def _judged_group(self, run: Run) -> bool:
        return (self._settings.group_answer == "judge" and run.request.group_size > 1
                and not run.request.HasField("parent"))

    def _judges(self, run: Run) -> bool:
        """Whether this run's answer is chosen by the judge: the client's candidate of a judged group."""
        return self._judged_group(run) and run.request.candidate == 0

    def _reports_to_group(self, run: Run) -> bool:
        return self._judged_group(run) and run.request.candidate > 0

    def _judging(self, request_id: str, step: int) -> Run | None:
        """The run whose judge task a result with this step index answers (it is numbered after the plan)."""
        run = self.runs.get(request_id)
        if run is None or run.finished or not self._judges(run) or step != run.plan.steps:
            return None
        return run

    def _judge(self, run: Run, own: str | None) -> list[Action]:
        """The client's candidate is done (`own` is its answer, None when its workflow failed): wait for
        the others, ask the judge, answer with the best; with no answer at all, fail as it failed."""
        now = self._clock()
        if run.ready_ms is None:
            run.ready_ms = now
        if run.judged is not None or run.judge_error:
            return self._judged(run, own)
        if run.plan.steps in run.dispatched_ms:
            return []  # the judge is scoring
        waited_out = now - run.ready_ms > self._judge_wait_ms
        if len(run.candidates) < run.request.group_size - 1 and not waited_out:
            return []
        answers = ([(run.request.request_id, own)] if own is not None else []) + [
            (c.request_id, c.answer) for _, c in sorted(run.candidates.items()) if c.answer]
        run.judge_order = [rid for rid, _ in answers]
        if not answers:
            return [self._finish(run, error=run.own_error)]
        if len(answers) == 1:
            run.judge_error = "no other candidate answered in time" if own is not None else "one candidate answered"
            return self._judged(run, own)
        judge = self._workers[self._judge_worker]
        step, rid = run.plan.steps, run.request.request_id
        task = tasks_pb2.Task(
            task_id=task_id(rid, step, 1), request_id=rid, step=step, attempt=1, worker=judge.name,
            messages=[common_pb2.ChatMessage(**m) for m in judge_messages(query_text(run.conversation),
                                                                         [a for _, a in answers])],
            deadline_unix_ms=run.request.deadline_unix_ms, query=query_text(run.conversation),
            candidates=[a for _, a in answers])
        run.workers[step] = judge.name
        run.dispatched_ms[step] = now
        return [Dispatch(provider=judge.provider, task=task)]

    def _judged(self, run: Run, own: str | None) -> list[Action]:
        """Finish with the answer the judge's scores choose (else the first: the own one when there is
        one), and rate every candidate."""
        judgement = responses_pb2.Judgement(worker=self._judge_worker, own_answer=own or "",
                                            request_ids=run.judge_order, own_error=run.own_error)
        answers = ({run.request.request_id: own} if own is not None else {}) | {
            c.request_id: c.answer for c in run.candidates.values()}
        rates: list[Action] = []
        if run.judged is not None and not run.judge_error:
            judgement.usage.CopyFrom(run.judged.usage)
            try:
                scores = parse_scores(run.judged.output, len(judgement.request_ids))
            except ValueError as e:
                judgement.error = str(e)
            else:
                judgement.scores.extend(scores)
                judgement.chosen = best(scores)
                now = self._clock()
                rates = [Rate(feedback_pb2.Feedback(response_id=rid, score=score, source="judge", created_unix_ms=now,
                                                    tenant=run.request.tenant,
                                                    comment=f"scored by {judgement.worker} among {len(scores)} answers"))
                         for rid, score in zip(judgement.request_ids, scores)]
        else:
            judgement.error = run.judge_error
        answer = answers[judgement.request_ids[judgement.chosen]]
        return rates + [self._finish(run, answer=answer, judgement=judgement)]
