"""Kafka wiring of an executor: many calls at once, offsets committed in order, nothing run twice.

- Concurrency: each task runs as its own asyncio task; the handler returns as soon as the call has
  started, so the next record is read. When the worker's concurrency slots are full the handler
  waits, and so the consumer stops fetching: memory stays bounded under any backlog.
- Commits: a partition is committed only up to its oldest unfinished task.
- Limits: the replica's share of each limit follows its share of the topic's partitions, and lends
  and borrows spare share with the other replicas over `baton.limits.<provider>` (see limits.py).
- Recovery: when partitions are assigned (a start, a rebalance, a replica that died), the tasks
  past the committed offset may include some whose results were already published. Before running
  any of them the replica reads the results written since the oldest such task, and skips those
  tasks: a step that completed is never run again.
- Fencing: no provider call starts, and no result is published, while the group has not confirmed
  this replica lately (`Consumer.in_group`, asked by the step runner and before each publish):
  another replica may own the task by then. A revocation that finds this replica out of the group
  (a broker that restarted without it) drops every task of the revoked partitions, calls in
  progress too: their new owner may already have read back what was published.
- A record's offset is finished only once its task's result is published. A redelivered copy of a
  task whose call is still running here (its partition came back to this replica) waits on that
  call instead of being finished at once, so a crash before the publish re-reads it. A result that
  cannot be published (the broker is away) is published again with backoff for as long as this
  replica still owns one of the task's records; once it owns none, the new owner runs the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from baton.v1 import common_pb2, responses_pb2, tasks_pb2, workflow_pb2
from baton_executor.deltas import DeltaBatcher
from baton_executor.limits import WorkerLimits
from baton_executor.metrics import ExecutorMetrics
from baton_executor.sharing import ShareExchange
from baton_executor.step_runner import StepRunner
from baton_platform import topics
from baton_platform.consumer import Record
from baton_platform.kafka import client_options, partition_ids, read_since
from baton_platform.messages import PoisonMessage
from baton_platform.service import Service
from baton_workflow.errors import WorkflowError
from baton_workflow.steps import episode_results, handed_over, one_step_response, past_deadline

log = logging.getLogger(__name__)

# On an assignment, results published this long ago or later count as done (see TaskConsumer._recover).
RECENT_S = 60.0
# How often a finished call's result, held while the group has not confirmed this replica, looks again.
_CONFIRM_POLL_S = 0.05


class RecentIds:
    """Task ids whose results are known to be published, bounded."""

    def __init__(self, size: int = 200_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._ids

    def add(self, task_id: str) -> None:
        self._ids[task_id] = None
        self._ids.move_to_end(task_id)
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)


class TaskConsumer:
    def __init__(self, service: Service, provider: str, runner: StepRunner, limits: dict[str, WorkerLimits],
                 metrics: ExecutorMetrics, drain_timeout_s: float, direct_steps: bool = False,
                 added_workers: Callable[[], dict[str, WorkerLimits]] | None = None,
                 fallback_of: Callable[[str], str | None] = lambda worker: None) -> None:
        self.service = service
        # Looks for workers of this provider added to the configuration since (a task names one this
        # replica does not know): they start serving at once, with their limits shared as usual.
        self.added_workers = added_workers
        # router.direct_single_step: some tasks here answer the client, and recovery reads those answers back.
        self.direct_steps = direct_steps
        # A worker's configured fallback: such a one-step workflow whose step fails here is handed to the
        # synthesizer, which moves the step to it, instead of answering the client with the failure.
        self.fallback_of = fallback_of
        self.drain_timeout_s = drain_timeout_s
        self.provider = provider
        self.topic = topics.tasks_topic(provider)
        self.group = topics.executor_group(provider)
        self.runner = runner
        self.limits = limits
        self.metrics = metrics
        self.done = RecentIds()
        self.in_flight: dict[TopicPartition, set[asyncio.Task]] = {}
        # Task id -> the records (partition, offset) that its running call answers: the first delivery,
        # plus any copy redelivered to this replica while the call was still in flight.
        self.running: dict[str, list[tuple[TopicPartition, int]]] = {}
        self.publish_retry_s = 0.1  # first wait before publishing a result again; doubles up to 5 s
        # How many times each partition was taken from this replica: a record read before the last
        # time is its new owner's, even once the partition comes back (it is read again then).
        self.revocations: dict[TopicPartition, int] = {}
        self.stopping = False  # set by drain: no new task starts; the next owner runs it
        self.results = service.publisher(topics.WORKFLOW, workflow_pb2.WorkflowEvent,
                                         "Steps' results, and one-step workflows handed over for their worker's fallback.")
        self.answers = service.publisher(topics.RESPONSES, responses_pb2.Response,
                                         "Answer text as it comes, for streaming clients; the answers of one-step "
                                         "workflows the router sent straight here.")
        # No task of a new assignment runs before its recovery knows the results published for it.
        self._recovery: asyncio.Task | None = None
        self.consumer = service.consumer(
            self.topic, tasks_pb2.Task, self.handle, group=self.group, tracked=True, keep=True, commit_every_s=0.2,
            on_assigned=self.assigned, on_revoked=self.revoked, on_stop=self.drain,
            description=f"Steps for the {provider} workers.")
        self.tracker = self.consumer.tracker
        runner.in_group = self.consumer.in_group  # no call starts on a task another replica may own
        metrics.lag.labels(provider, self.topic).set_function(self._lag)
        self.exchange = ShareExchange(service, provider, limits, backlog=lambda: int(self._lag()),
                                      on_share=metrics.share.labels(provider).set)

    # -- records -------------------------------------------------------------------------------

    async def handle(self, task: tasks_pb2.Task, record: Record) -> None:
        tp, offset = record.tp, record.offset
        revocations = self.revocations.get(tp, 0)
        if not (task.task_id and task.request_id and task.worker):
            raise PoisonMessage("Task without task_id, request_id or worker")
        if past_deadline(task.deadline_unix_ms) and not task.HasField("workflow"):
            # A synthesizer's step whose request's deadline has passed: the synthesizer ends its workflow
            # at the deadline itself (the client already has its 504), so a result would only be one more
            # record to publish here and fold there. Dropped and counted: a backlog left by an overload
            # drains at the speed of reading it. (A one-step workflow sent here whole is answered below,
            # with DEADLINE_EXCEEDED: no synthesizer would log its episode.)
            self.metrics.expired.labels(self.provider, task.worker).inc()
            self.consumer.finish(record)
            return
        while self._recovery is not None and not self._recovery.done():
            await asyncio.wait({self._recovery})  # a newer assignment may replace it meanwhile: look again
        if task.task_id in self.done:
            self.consumer.finish(record)  # already answered
            return
        if task.task_id in self.running:
            # A redelivered copy of a call still in progress here: its record is finished when that
            # call's result is published, not now (a crash before then must re-read it).
            self.running[task.task_id].append((tp, offset))
            for job in [j for js in self.in_flight.values() for j in js if j.get_name() == task.task_id]:
                self.in_flight.setdefault(tp, set()).add(job)
            return
        if self.stopping:
            return  # left uncommitted: the partition's next owner runs it
        if task.worker not in self.limits and self.added_workers is not None:
            for name, lim in self.added_workers().items():
                await self.exchange.add(name, lim)
        # An expired task takes no slot: it is answered at once with DEADLINE_EXCEEDED, so a backlog
        # left by an overload drains at the speed of the bus, not of the provider's limits.
        limits = None if past_deadline(task.deadline_unix_ms) else self.limits.get(task.worker)
        if limits is not None:
            await limits.slots.acquire()  # full: wait here, and so stop fetching
        if self.revocations.get(tp, 0) != revocations:
            # The partition was taken from this replica while the record waited its turn here: another
            # replica may be running the task now. Left unfinished; read again if the partition returns.
            if limits is not None:
                await limits.slots.release()
            log.info("task %s dropped: its partition was revoked while it waited", task.task_id)
            return
        self.running[task.task_id] = [(tp, offset)]
        job = asyncio.create_task(self._run(task, tp, offset, limits), name=task.task_id)
        self.in_flight.setdefault(tp, set()).add(job)
        self.metrics.in_flight.labels(self.provider).inc()

    async def _run(self, task: tasks_pb2.Task, tp: TopicPartition, offset: int, limits: WorkerLimits | None) -> None:
        deltas = self._deltas(task)
        try:
            try:
                event = await self.runner.run(task, deltas)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a bug here must end the step clearly, not hold the offset
                log.exception("task %s failed in the executor", task.task_id)
                event = workflow_pb2.WorkflowEvent(request_id=task.request_id, step_failed=workflow_pb2.StepFailed(
                    task_id=task.task_id, step=task.step, attempt=task.attempt, worker=task.worker,
                    error=common_pb2.Error(code=WorkflowError.EXECUTOR_ERROR, message=f"the executor failed: {type(e).__name__}"),
                    retryable=False))
            if deltas is not None:
                try:
                    # Every delta lands before the step's result, so the gateway sees them before the answer.
                    await deltas.close()
                    self.metrics.stream_records.labels(self.provider).inc(deltas.records)
                except Exception:  # noqa: BLE001 - the final response still carries the whole answer
                    log.exception("answer deltas of task %s could not be published", task.task_id)
            if await self._publish_result(task, event):
                self.done.add(task.task_id)
                self._observe(task, event)
                for position in self.running.get(task.task_id, [(tp, offset)]):
                    self.tracker.finish(*position)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - left unfinished: the offset is not committed and the task is retried
            log.exception("task %s could not be completed; it will be retried", task.task_id)
        finally:
            if deltas is not None:
                deltas.abort()
            for position_tp, _ in self.running.pop(task.task_id, [(tp, offset)]):
                self.in_flight.get(position_tp, set()).discard(asyncio.current_task())
            self.metrics.in_flight.labels(self.provider).dec()
            if limits is not None:
                await limits.slots.release()
        await self.consumer.commit(soon=True)

    async def _publish_result(self, task: tasks_pb2.Task, event: workflow_pb2.WorkflowEvent) -> bool:
        """Publish the step's result, again and again while the broker refuses, for as long as this
        replica owns a record of the task; False once it owns none (the new owner runs the task)."""
        delay = self.publish_retry_s
        hand_over = task.HasField("workflow") and self._hands_over(task, event)
        while True:
            if not await self._still_owned(task):
                log.warning("result of task %s not published: its partition moved on while the group "
                            "had not confirmed this replica", task.task_id)
                return False
            try:
                if hand_over:
                    await self.results.send(handed_over(task.workflow, event.step_failed), key=task.request_id)
                elif task.HasField("workflow"):
                    # The client request's whole workflow (router.direct_single_step): answer the client.
                    planned = task.workflow
                    await self.answers.send(one_step_response(planned, event, int(time.time() * 1000)),
                                            key=task.request_id, partition=planned.request.reply_partition)
                else:
                    await self.results.send(event, key=task.request_id)
                return True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a broker away for a while: keep the result and try again
                if not self._holds_a_record(task):
                    log.warning("result of task %s not published (%s); its partition moved on", task.task_id, e)
                    return False
                log.warning("result of task %s not published (%s); retrying in %.2f s", task.task_id, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _still_owned(self, task: tasks_pb2.Task) -> bool:
        """Wait until the group confirms this replica again, if it does not now; False once this
        replica holds none of the task's records. A result is published only while the replica is
        confirmed: one whose call ended while the broker was away may belong to another replica by
        the time the broker is back, and the group says which (a revocation, or a new confirmation)."""
        while not self.consumer.in_group():
            if not self._holds_a_record(task):
                return False
            await asyncio.sleep(_CONFIRM_POLL_S)
        return True

    def _holds_a_record(self, task: tasks_pb2.Task) -> bool:
        """Whether this replica still owns one of the records of `task` its running call answers."""
        return any(self.tracker.holds(*p) for p in self.running.get(task.task_id, ()))

    def _hands_over(self, task: tasks_pb2.Task, event: workflow_pb2.WorkflowEvent) -> bool:
        """Whether a one-step workflow's failed step goes on to its worker's fallback, through the
        synthesizer: not once the request's deadline has passed, when the synthesizer would end it too."""
        if event.WhichOneof("event") != "step_failed" or past_deadline(task.deadline_unix_ms):
            return False
        if self.fallback_of(task.worker) is None:
            return False
        log.info("task %s failed on %s: its workflow goes to the synthesizer for the fallback",
                 task.task_id, task.worker)
        self.metrics.handed_over.labels(self.provider, task.worker).inc()
        return True

    def _deltas(self, task: tasks_pb2.Task) -> DeltaBatcher | None:
        """For a streaming request's answering task: its text, published as it comes to the partition
        of baton.responses that the client's gateway replica reads."""
        if not task.stream:
            return None

        async def publish(response: responses_pb2.Response) -> None:
            await self.answers.send(response, key=task.request_id, partition=task.reply_partition)

        return DeltaBatcher(task.request_id, task.task_id, publish)

    def _observe(self, task: tasks_pb2.Task, event: workflow_pb2.WorkflowEvent) -> None:
        m, p, w = self.metrics, self.provider, task.worker
        if event.WhichOneof("event") == "step_completed":
            done = event.step_completed
            m.steps.labels(p, w, "completed").inc()
            m.tokens.labels(p, w, "input").inc(done.usage.input_tokens)
            m.tokens.labels(p, w, "output").inc(done.usage.output_tokens)
            m.cost.labels(p, w).inc(done.usage.cost_usd)
            m.latency.labels(p).observe(done.latency_ms / 1000)
            log.info("task %s on %s completed: %d+%d tokens in %d ms", task.task_id, w, done.usage.input_tokens,
                     done.usage.output_tokens, done.latency_ms)
        else:
            m.steps.labels(p, w, "failed").inc()
            failed = event.step_failed
            log.info("task %s on %s failed: %s%s", task.task_id, w, failed.error.code,
                     " (retryable)" if failed.retryable else "")

    # -- rebalance -----------------------------------------------------------------------------

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self.revocations[tp] = self.revocations.get(tp, 0) + 1
        jobs = [j for tp in revoked for j in self.in_flight.get(tp, ())]
        if not self.consumer.in_group():
            # Dropped from the group (the coordinator lost, or it no longer knows this replica): the
            # partitions may be another replica's already, and it may have read back the results
            # published so far. A result published from here now could be a second one for the same
            # task, so every task of theirs is dropped, its record left to the new owner.
            if jobs:
                log.info("partitions revoked after this replica left the group: %d task(s) dropped", len(jobs))
            await self._drop(jobs)
            return
        # Let calls in flight finish (bounded) so the next owner does not repeat them. Tasks still
        # waiting for their turn under the limits are dropped at once (their records stay uncommitted,
        # so the next owner runs them): waiting for them would outlast the group's rebalance timeout
        # under a backlog, and a replica dropped from the group mid-call is what repeats calls.
        await self._finish_or_drop(jobs)

    async def _finish_or_drop(self, jobs: list[asyncio.Task]) -> None:
        calling = getattr(self.runner, "calling", None)
        if calling is not None:
            for job in [j for j in jobs if j.get_name() not in calling]:
                job.cancel()
        if jobs:
            await asyncio.wait(jobs, timeout=self.drain_timeout_s)

    @staticmethod
    async def _drop(jobs: list[asyncio.Task]) -> None:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        total = self.consumer.partition_count()
        mine = {tp.partition for tp in assigned if tp.topic == self.topic}
        await self.exchange.assigned(mine, total)
        log.info("assigned %d of %d partitions of %s: base share %.3f of each limit", len(mine), total, self.topic,
                 len(mine) / total if total else 0.0)
        if assigned:
            # Not here: aiokafka sends no heartbeat until this callback returns, so a scan longer than the
            # session timeout (a long history to read) would have the group drop this replica and
            # rebalance, and the next assignment would start the scan again, for ever. Tasks wait for it
            # in `handle` instead.
            if self._recovery is not None:
                self._recovery.cancel()
            self._recovery = asyncio.create_task(self._recover_bounded(list(assigned)), name="recovery")

    async def _recover_bounded(self, assigned: list[TopicPartition]) -> None:
        try:
            await asyncio.wait_for(self._recover(assigned), timeout=60)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - without the scan a finished task may run again; never lose one
            log.exception("could not read back published results; redelivered tasks will run again")

    async def _recover(self, assigned: list[TopicPartition]) -> None:
        """Mark as done every task whose result was published after the oldest uncommitted task, or in
        the last RECENT_S, whichever is earlier. The second covers a task its previous owner finished
        and committed just before the move, which a synthesizer that moved at the same time (a broker
        restart moves every group) sends again with the same id, not having read that result yet."""
        probe = AIOKafkaConsumer(group_id=self.group, enable_auto_commit=False,
                                 **client_options(self.service.kafka))
        await probe.start()
        try:
            oldest = await self._oldest_uncommitted_timestamp(probe, assigned)
            recent = int((time.time() - RECENT_S) * 1000)
            found = await self._published_since(probe, recent if oldest is None else min(oldest, recent))
            for task_id in found:
                self.done.add(task_id)
            log.info("recovery: %d result(s) published since the oldest uncommitted task or in the last %g s",
                     len(found), RECENT_S)
        finally:
            await probe.stop()

    async def _oldest_uncommitted_timestamp(self, probe, assigned) -> int | None:
        probe.assign(assigned)
        ends = await probe.end_offsets(assigned)
        pending = []
        for tp in assigned:
            committed = await probe.committed(tp)
            if committed is None:
                await probe.seek_to_beginning(tp)
            else:
                probe.seek(tp, committed)
            if await probe.position(tp) < ends[tp]:
                pending.append(tp)
        oldest = None
        for tp in pending:
            # The first uncommitted record of each partition; a fetch may come back empty, so ask again.
            while True:
                batch = await probe.getmany(tp, timeout_ms=1000, max_records=1)
                records = batch.get(tp, [])
                if records:
                    ts = records[0].timestamp
                    oldest = ts if oldest is None else min(oldest, ts)
                    break
        return oldest

    async def _published_since(self, probe, since_ms: int) -> set[str]:
        """Tasks whose results were published since `since_ms`: steps completed on baton.workflow, and,
        with direct steps, the one-step workflows handed over there and the steps of final responses on
        baton.responses (one-step workflows answered from here). Without them that busier topic is not read."""
        options = client_options(self.service.kafka)
        read = (topics.WORKFLOW, topics.RESPONSES) if self.direct_steps else (topics.WORKFLOW,)
        parts = [TopicPartition(topic, p) for topic in read for p in await partition_ids(options, topic)]
        found: set[str] = set()
        async for r in read_since(probe, parts, since_ms):  # bounded by the caller's timeout
            with contextlib.suppress(Exception):
                if r.topic == topics.WORKFLOW:
                    event = workflow_pb2.WorkflowEvent.FromString(r.value)
                    if event.WhichOneof("event") == "step_completed":
                        found.add(event.step_completed.task_id)
                    elif event.WhichOneof("event") == "planned" and event.planned.HasField("handed_over"):
                        found.add(event.planned.handed_over.task_id)  # the synthesizer has taken it over
                    continue
                found.update(tid for tid, _ in episode_results(responses_pb2.Response.FromString(r.value)))
        return found

    # -- metrics -------------------------------------------------------------------------------

    def _lag(self) -> float:
        lag = 0
        for tp in self.consumer.assignment():
            high = self.consumer.end_offset(tp)
            committed = self.tracker.committable().get(tp)
            if high is not None and committed is not None:
                lag += max(0, high - committed)
        return float(lag)

    async def drain(self) -> None:
        """At shutdown: let calls in flight finish (bounded) and drop the rest, as on a revocation;
        the consumer then commits. A task left running would fail when the provider clients close
        after this, and its error would end the client's request, where the next owner can run it."""
        self.stopping = True
        if self._recovery is not None:
            self._recovery.cancel()
        await self._finish_or_drop([j for js in self.in_flight.values() for j in js])
        await self._drop([j for js in self.in_flight.values() for j in js if not j.done()])
