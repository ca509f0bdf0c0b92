"""Kafka wiring of the synthesizer: baton.workflow in; tasks, responses (and inner requests and
their results, for conductor steps) out.

Crash safety: a partition's offset is committed only up to the oldest workflow still running on it.
After a restart or rebalance the new owner re-reads from there, folding the history into state
without acting on it, then, once it reaches the end it found, resumes every unfinished workflow:
steps already completed are not run again, missing ones are dispatched with the same task ids.
While a partition's history is being read its workflows are not timed out: a result recorded after
the deadline passed may be in the part not yet read, and the run would fail falsely. A workflow
whose response was published before the crash but not committed is not answered again: before
resuming, the new owner reads the responses published since its runs began and ends those that
have one (otherwise the client and the episode dataset would get the answer twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from opentelemetry import context as otel_context
from opentelemetry import trace

from baton.v1 import feedback_pb2, requests_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.config import PROVIDERS
from baton_platform.consumer import Record
from baton_platform.kafka import client_options, read_since
from baton_platform.messages import PoisonMessage
from baton_platform.service import Service
from baton_platform.telemetry import start_span
from baton_platform.workerpool import WorkerPool
from baton_synthesizer.metrics import SynthesizerMetrics
from baton_synthesizer.runs import Action, Dispatch, Finish, Notify, Rate, Replan, Return, Run, Runs
from baton_workflow import CONDUCTOR
from baton_workflow.errors import WorkflowError

log = logging.getLogger(__name__)


class RunConsumer:
    """Reads baton.workflow, folds each event into its run (`Runs`, which does no I/O) and carries out
    the actions that returns: steps to the executors, answers to the gateway, ratings, inner calls."""

    def __init__(self, service: Service, workflows: Runs, workers: WorkerPool) -> None:
        self.service = service
        self.workflows = workflows
        self._workers = workers  # the pool `workflows` looks workers up in: refreshed here, where I/O belongs
        # Per partition: the end offset found when it was assigned; records before it are history.
        self._catchup_end: dict[TopicPartition, int] = {}
        self._last: Run | None = None  # the run the record being handled folded into
        # Each running workflow's `invoke_workflow baton` span (GenAI conventions), by request id: the
        # parent of its steps' spans, from its first action here to its end.
        self._spans: dict[str, trace.Span] = {}
        self._tracer = service.tracer_provider.get_tracer("baton.synthesizer")
        self._metrics = SynthesizerMetrics(service.registry)
        out = service.publisher
        self._tasks = {p: out(topics.tasks_topic(p), tasks_pb2.Task, f"Steps for the {p} executors.")
                       for p in PROVIDERS}
        self._replies = out(topics.RESPONSES, responses_pb2.Response, "Progress and final answers for the gateway.")
        self._ratings = out(topics.FEEDBACK, feedback_pb2.Feedback,
                            "A judge's rating of an answer.")
        self._inner = out(topics.REQUESTS, requests_pb2.ChatRequest, "Inner calls of conductor steps.")
        self._workflow = out(topics.WORKFLOW, workflow_pb2.WorkflowEvent,
                             "Inner calls' results and exploration candidates' reports.")
        self.consumer = service.consumer(
            topics.WORKFLOW, workflow_pb2.WorkflowEvent, self.handle, group=topics.GROUP_SYNTHESIZER, tracked=True,
            keep=True, on_assigned=self.assigned, on_revoked=self.revoked, after_each=self.advance,
            description="Plans and step results.")
        self.consumer.every(0.25, self.tick)

    async def tick(self) -> None:
        """Time out late steps and deadlines, except on partitions whose history is still being read."""
        for run, actions in self.workflows.expired(skip=self._replaying):
            await self._execute(run, actions)

    def _replaying(self, run: Run) -> bool:
        return self._catchup_end.get(run.origin[0], 0) > 0

    async def assigned(self, tps: set[TopicPartition]) -> None:
        """Each partition's history: from the group's committed offset to the end found now. A
        partition its last owner committed to the end has none, so its records are new plans acted on
        at once, without the read-back of responses that resuming costs (half a second a partition,
        one after another: seconds of new traffic held after every restart). Unknown here (in memory,
        or the broker did not say): found at the partition's first record instead."""
        try:
            ends = await self.consumer.end_offsets(tps)
            for tp, end in ends.items():
                committed = await self.consumer.committed(tp)
                self._catchup_end[tp] = 0 if committed is not None and committed >= end else end
        except Exception as e:  # noqa: BLE001 - the first record finds the history's end instead
            log.warning("end offsets of %s unknown (%s); found at each partition's first record", sorted(tps), e)

    async def revoked(self, tps: set[TopicPartition]) -> None:
        for rid, run in list(self.workflows.runs.items()):
            if run.origin[0] in tps:
                self.workflows.forget(rid)
                self._end_span(rid, "moved")  # its partition's next owner runs it on, in a span of its own
        for tp in tps:
            self._catchup_end.pop(tp, None)
        self._metrics.running.set(len(self.workflows.runs))

    # -- records -------------------------------------------------------------------------------

    async def handle(self, event: workflow_pb2.WorkflowEvent, record: Record) -> None:
        self._last = self._fold(event, record.tp, record.offset)

    async def advance(self, record: Record) -> None:
        """After every record, folded or dead-lettered: act on it, or, at the end of a partition's
        history, resume the partition's unfinished workflows."""
        tp, offset = record.tp, record.offset
        run, self._last = self._last, None
        if tp not in self._catchup_end:
            self._catchup_end[tp] = self.consumer.end_offset(tp) or 0
        replaying = offset + 1 < self._catchup_end[tp]
        if run is None or not run.origin == (tp, offset):
            self.consumer.finish(record)  # only a plan keeps its partition's commit back
        if not replaying:
            if self._catchup_end[tp] > 0:
                # The partition counts as replaying until its runs are resumed: the resume waits on
                # a read of baton.responses, and a tick meanwhile would time out a run past its
                # deadline whose result the history already holds.
                await self._resume(tp)
                self._catchup_end[tp] = 0
            elif run is not None:
                await self._execute(run, self.workflows.advance(run))
        self._metrics.running.set(len(self.workflows.runs))

    def _fold(self, event: workflow_pb2.WorkflowEvent, tp: TopicPartition, offset: int) -> Run | None:
        kind = event.WhichOneof("event")
        if kind == "planned":
            if not event.planned.request.request_id or not event.planned.plan.steps:
                raise PoisonMessage("WorkflowPlanned without a request id or without steps")
            run = self.workflows.on_planned(event.planned, origin=(tp, offset),
                                            trace_context=otel_context.get_current())
            if run is not None and self._workers.lacks(w for w in run.plan.workers if w != CONDUCTOR):
                self._workers.refresh()  # a router restarted with a worker added to the file plans for it
            if run is not None and event.planned.HasField("handed_over"):
                # Its executor ran the step and it failed: the run goes on from there, to the fallback.
                # (A failure naming no step of the plan is ignored: the run then starts from the beginning.)
                return self.workflows.on_failed(run.request.request_id, event.planned.handed_over) or run
            return run
        if kind == "step_completed":
            return self.workflows.on_completed(event.request_id, event.step_completed)
        if kind == "step_failed":
            return self.workflows.on_failed(event.request_id, event.step_failed)
        if kind == "candidate_finished":
            return self.workflows.on_candidate(event.request_id, event.candidate_finished)
        raise PoisonMessage("WorkflowEvent with no event set")

    async def _resume(self, tp: TopicPartition) -> None:
        resumed = [r for r in self.workflows.runs.values() if r.origin[0] == tp and not r.finished]
        if not resumed:
            return
        answered = await self.answered([r for r in resumed if not r.request.HasField("parent")])
        log.info("resuming %d workflow(s) on %s (%d already answered)", len(resumed) - len(answered), tp,
                 len(answered))
        for run in resumed:
            if run.request.request_id in answered:
                run.finished = True
                self._ended(run)
            else:
                await self._execute(run, self.workflows.advance(run))

    async def answered(self, runs: list[Run]) -> set[str]:
        """Which of these runs already have a final response on baton.responses (published by an
        owner that crashed before committing). Bounded: on failure, none (they are answered again)."""
        if not runs:
            return set()
        try:
            return await asyncio.wait_for(self._scan_responses(runs), timeout=30)
        except Exception:  # noqa: BLE001 - answering twice is better than never answering
            log.exception("could not read back published responses; resumed workflows may answer twice")
            return set()

    async def _scan_responses(self, runs: list[Run]) -> set[str]:
        wanted = {r.request.request_id for r in runs}
        # Records carry the publisher's clock; allow for skew between the gateway and the synthesizer.
        since = min(r.request.created_unix_ms or r.started_ms for r in runs) - 10_000
        parts = [TopicPartition(topics.RESPONSES, p) for p in sorted({r.request.reply_partition for r in runs})]
        probe = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                 **client_options(self.service.kafka))
        await probe.start()
        try:
            found: set[str] = set()
            async for r in read_since(probe, parts, since):
                if r.key is None or r.key.decode(errors="replace") not in wanted:
                    continue
                with contextlib.suppress(Exception):
                    response = responses_pb2.Response.FromString(r.value)
                    if response.WhichOneof("outcome") in ("answer", "error"):
                        found.add(response.request_id)
            return found
        finally:
            await probe.stop()

    def _ended(self, run: Run, origin: Record | None = None, outcome: str = "answered before",
               error: str = "") -> None:
        """The run's outcome is published: its partition may commit past its start once the broker
        has acknowledged what `origin` collected (the sends that ended it)."""
        self.consumer.finish(origin or Record(*run.origin, b""))
        self.workflows.forget(run.request.request_id)
        self._end_span(run.request.request_id, outcome, error)

    def _workflow_span(self, run: Run) -> trace.Span:
        rid = run.request.request_id
        span = self._spans.get(rid)
        if span is None:
            span = start_span(self._tracer, "invoke_workflow baton", context=run.trace_context, attributes={
                "gen_ai.operation.name": "invoke_workflow", "gen_ai.agent.name": "baton", "baton.request_id": rid,
                "baton.plan.backend": run.plan_proto.backend, "baton.plan.steps": len(run.plan_proto.steps),
                "baton.plan.workers": [s.worker for s in run.plan_proto.steps]})
            self._spans[rid] = span
        return span

    def _end_span(self, request_id: str, outcome: str, error: str = "") -> None:
        span = self._spans.pop(request_id, None)
        if span is not None:
            span.set_attribute("baton.outcome", outcome)
            if error:
                span.set_attribute("error.type", error)
                span.set_status(trace.StatusCode.ERROR)
            span.end()

    async def _execute(self, run: Run, actions: list[Action]) -> None:
        # Every send is queued as part of the run's plan record, which the run's end finishes; the
        # sends before the end need no acknowledgement of their own: until the end, a restart
        # re-reads the plan and the results after it and sends again whatever is missing.
        origin = Record(*run.origin, b"")
        # Act inside the workflow's span, in the trace it started in, whatever record or timer triggered it.
        token = otel_context.attach(trace.set_span_in_context(self._workflow_span(run), run.trace_context))
        try:
            for action in actions:
                if isinstance(action, Dispatch):
                    await self._tasks[action.provider].send(action.task, key=action.task.request_id, record=origin)
                    self._metrics.dispatched.labels(action.provider).inc()
                elif isinstance(action, Notify):
                    await self._replies.send(action.response, key=action.response.request_id,
                                             partition=action.reply_partition, record=origin)
                elif isinstance(action, Rate):
                    await self._ratings.send(action.feedback, key=action.feedback.response_id, record=origin)
                elif isinstance(action, Replan):
                    await self._inner.send(action.request, key=action.request.request_id, record=origin)
                    self._metrics.dispatched.labels("conductor").inc()
                elif isinstance(action, Finish):
                    await self._replies.send(action.response, key=action.response.request_id,
                                             partition=action.reply_partition, record=origin)
                    outcome = action.response.WhichOneof("outcome")
                    self._metrics.responses.labels(outcome).inc()
                    ended = action.response.error.code if outcome == "error" else outcome
                    if ended == WorkflowError.DEADLINE_EXCEEDED:
                        self._metrics.expired.inc()
                    log.info("request %s ended (%s) after %d step(s)", action.response.request_id, ended,
                             len(action.response.episode.steps))
                    if action.report is not None:
                        # Keyed by the group: it reaches the replica running the client's candidate.
                        await self._workflow.send(action.report, key=action.report.request_id, record=origin)
                    self._ended(run, origin, outcome, error=ended if outcome == "error" else "")
                elif isinstance(action, Return):
                    # Keyed by the parent: its partition, and so the replica running it, gets the result.
                    await self._workflow.send(action.event, key=action.event.request_id, record=origin)
                    self._metrics.responses.labels("returned").inc()
                    self._ended(run, origin, "returned")
        finally:
            otel_context.detach(token)
