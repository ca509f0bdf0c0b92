"""One task, one provider call: retries for what is retryable, bounded by attempts and the deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from opentelemetry.trace import SpanKind, Tracer
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from baton.v1 import common_pb2, tasks_pb2, workflow_pb2
from baton_executor.answers import check_reply, finish_reason, logprobs_proto, spec_of, tool_calls_proto
from baton_executor.deltas import DeltaBatcher
from baton_executor.limits import WorkerLimits, estimate_tokens
from baton_executor.metrics import ExecutorMetrics
from baton_executor.providers.base import Provider, ProviderCall, ProviderError, ProviderReply
from baton_executor.providers.sim import SimProvider
from baton_platform.config import WorkerConfig
from baton_platform.telemetry import span
from baton_workflow import turn
from baton_workflow.errors import WorkflowError
from baton_workflow.steps import past_deadline

log = logging.getLogger(__name__)

# How often a held call looks again whether the group has confirmed this replica.
_HOLD_POLL_S = 0.1


def _retryable(e: BaseException) -> bool:
    return isinstance(e, ProviderError) and e.retryable


def _wait(state: RetryCallState) -> float:
    """Exponential backoff with jitter, but never sooner than the provider's Retry-After."""
    base = wait_random_exponential(multiplier=0.25, max=10)(state)
    e = state.outcome.exception() if state.outcome else None
    hint = e.retry_after_s if isinstance(e, ProviderError) and e.retry_after_s else 0.0
    return max(base, hint)



class _Expired(ProviderError):
    """The request's deadline passed before the provider was called."""

    def __init__(self) -> None:
        super().__init__("the request's deadline passed before the call", retryable=False)


class _OutOfTime(stop_base):
    """Stops retrying when the next attempt would start after the step's deadline."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.deadline is not None and time.time() + _wait(retry_state) >= self.deadline

class StepRunner:
    def __init__(self, workers: dict[str, Provider], configs: dict[str, WorkerConfig], limits: dict[str, WorkerLimits],
                 tracer: Tracer, metrics: ExecutorMetrics, max_attempts: int) -> None:
        self._workers = workers
        self._configs = configs
        self._limits = limits
        self._tracer = tracer
        self._metrics = metrics
        self._provider_name = metrics.provider
        self._max_attempts = max_attempts
        # Tasks whose provider call has begun (admitted by the limits). A task still waiting for its
        # turn has cost nothing yet, so a replica losing its partition may drop it at once.
        self.calling: set[str] = set()
        # Whether this replica's consumer group still confirms it as the owner of its partitions
        # (`Consumer.in_group`; the Kafka wiring sets it). No call starts while it says no.
        self.in_group: Callable[[], bool] = lambda: True

    async def run(self, task: tasks_pb2.Task, deltas: DeltaBatcher | None = None) -> workflow_pb2.WorkflowEvent:
        try:
            return await self._run_step(task, deltas)
        finally:
            self.calling.discard(task.task_id)

    async def _run_step(self, task: tasks_pb2.Task, deltas: DeltaBatcher | None) -> workflow_pb2.WorkflowEvent:
        """The step's result. With `deltas` (a streaming request's answering task) the answer's text
        also goes there as it comes; a provider that does not stream gives it all at once at the end."""
        started = time.perf_counter()
        event = workflow_pb2.WorkflowEvent(request_id=task.request_id)
        worker = self._configs.get(task.worker)
        try:
            if worker is None or task.worker not in self._workers:
                raise ProviderError(f"worker {task.worker!r} is not served by this executor", retryable=False)
            if past_deadline(task.deadline_unix_ms):
                raise _Expired()
            reply = await self._call_with_retries(task, worker, deltas)
        except ProviderError as e:
            code = WorkflowError.PROVIDER_ERROR
            if isinstance(e, _Expired):
                code = WorkflowError.DEADLINE_EXCEEDED
                self._metrics.expired.labels(self._provider_name, task.worker).inc()
            event.step_failed.CopyFrom(workflow_pb2.StepFailed(
                task_id=task.task_id, step=task.step, attempt=task.attempt, worker=task.worker,
                error=common_pb2.Error(code=code, message=e.reason), retryable=e.retryable,
                latency_ms=(time.perf_counter() - started) * 1000))
            return event
        usage = common_pb2.Usage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                                 cost_usd=worker.price.cost(reply.input_tokens, reply.output_tokens), calls=1)
        event.step_completed.CopyFrom(workflow_pb2.StepCompleted(
            task_id=task.task_id, step=task.step, attempt=task.attempt, worker=task.worker, output=reply.text,
            usage=usage, latency_ms=(time.perf_counter() - started) * 1000, model=reply.model,
            tool_calls=tool_calls_proto(reply), finish_reason=finish_reason(reply), logprobs=logprobs_proto(reply)))
        return event

    async def _owned(self, task: tasks_pb2.Task) -> None:
        """Return once the call may start: the deadline has not passed (a task may wait its turn under
        the limits past it) and the group confirms this replica still owns the task's partition. While
        it does not (the broker away, or this replica dropped from the group and not told yet), another
        replica may be running the same task, so the call waits: for a confirmation, or for the
        revocation that cancels it, leaving the task to its new owner."""
        held = False
        while True:
            if past_deadline(task.deadline_unix_ms):
                raise _Expired()
            if self.in_group():
                return
            if not held:
                held = True
                self._metrics.held.labels(self._provider_name).inc()
                log.warning("task %s held: the consumer group has not confirmed this replica lately", task.task_id)
            await asyncio.sleep(_HOLD_POLL_S)

    async def _call_with_retries(self, task: tasks_pb2.Task, worker: WorkerConfig,
                                 deltas: DeltaBatcher | None) -> ProviderReply:
        deadline = task.deadline_unix_ms / 1000 if task.deadline_unix_ms else None

        retrying = AsyncRetrying(retry=retry_if_exception(_retryable), wait=_wait, reraise=True,
                                 stop=stop_any(stop_after_attempt(self._max_attempts), _OutOfTime(deadline)))
        async for attempt in retrying:
            with attempt:
                return await self._call_once(task, worker, deadline, deltas)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _call_once(self, task: tasks_pb2.Task, worker: WorkerConfig, deadline: float | None,
                         deltas: DeltaBatcher | None) -> ProviderReply:
        messages = [turn(m) for m in task.messages]
        max_tokens = task.max_tokens or None
        limits, m, name = self._limits[worker.name], self._metrics, worker.name
        estimate = estimate_tokens(messages, max_tokens)
        m.limit_wait.labels(self._provider_name, name).observe(await limits.admit(estimate))
        try:
            await self._owned(task)
        except BaseException:  # expired, or cancelled because the partition moved: nothing was spent
            limits.settle(estimate, 0)
            raise
        self.calling.add(task.task_id)
        call = ProviderCall(model=worker.model, messages=messages, max_tokens=max_tokens,
                            temperature=task.temperature if task.HasField("temperature") else None,
                            timeout_s=60.0 if deadline is None else max(0.1, deadline - time.time()),
                            on_delta=deltas.add if deltas is not None else None, spec=spec_of(task))
        if deltas is not None:
            deltas.new_call()
        m.requests.labels(self._provider_name, name).inc()
        actual = estimate
        try:
            reply = await self._traced_call(task, worker, call)
            actual = reply.input_tokens + reply.output_tokens
            check_reply(call.spec, reply)
            if deltas is not None:
                deltas.finish(reply.text)
            return reply
        except ProviderError as e:
            if e.status == 429:
                m.rate_limited.labels(self._provider_name, name).inc()
                # The provider says it is over its limit: stop all calls to this worker for a while.
                limits.back_off(e.retry_after_s if e.retry_after_s else 1.0)
            raise
        finally:
            limits.settle(estimate, actual)

    async def _traced_call(self, task: tasks_pb2.Task, worker: WorkerConfig, call: ProviderCall) -> ProviderReply:
        """The provider call as a `chat {model}` client span with the GenAI semantic conventions'
        attributes (v1.41.0), and their client metrics. Prompt and answer text stay off the span."""
        labels = ("chat", self._provider_name, worker.model)
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": self._provider_name,
                      "gen_ai.request.model": worker.model, "baton.worker": worker.name, "baton.task_id": task.task_id}
        if call.max_tokens:
            attributes["gen_ai.request.max_tokens"] = call.max_tokens
        if call.temperature is not None:
            attributes["gen_ai.request.temperature"] = call.temperature
        started = time.perf_counter()
        first_chunk: list[float] = []
        if call.on_delta is not None:
            emit = call.on_delta

            def on_delta(text: str) -> None:
                if not first_chunk:
                    first_chunk.append(time.perf_counter() - started)
                emit(text)

            call = dataclasses.replace(call, on_delta=on_delta)
        with span(self._tracer, f"chat {worker.model}", kind=SpanKind.CLIENT, attributes=attributes) as current:
            provider = self._workers[task.worker]
            try:
                if isinstance(provider, SimProvider):
                    reply = await provider.complete(call, query=task.query, candidates=task.candidates)
                else:
                    reply = await provider.complete(call)
            except ProviderError as e:
                error = str(e.status) if e.status else "provider_error"
                current.set_attribute("error.type", error)
                self._metrics.gen_ai_duration.labels(*labels, error).observe(time.perf_counter() - started)
                raise
            m = self._metrics
            m.gen_ai_duration.labels(*labels, "").observe(time.perf_counter() - started)
            m.gen_ai_tokens.labels(*labels, "input").observe(reply.input_tokens)
            m.gen_ai_tokens.labels(*labels, "output").observe(reply.output_tokens)
            current.set_attribute("gen_ai.response.model", reply.model)
            current.set_attribute("gen_ai.usage.input_tokens", reply.input_tokens)
            current.set_attribute("gen_ai.usage.output_tokens", reply.output_tokens)
            if reply.finish_reason:
                current.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
            if first_chunk:
                current.set_attribute("gen_ai.response.time_to_first_chunk", first_chunk[0])
                m.gen_ai_first_chunk.labels(*labels).observe(first_chunk[0])
            return reply
