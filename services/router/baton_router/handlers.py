"""Kafka wiring of the router: baton.requests in, WorkflowPlanned out on baton.workflow (or, for a
one-step workflow with router.direct_single_step, its task straight to the executor); policy updates
from baton.policy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from baton.v1 import policy_pb2, requests_pb2, tasks_pb2, workflow_pb2
from baton_platform import topics
from baton_platform.config import DEFAULT_POLICY_NAME, RouterConfig, WorkerConfig
from baton_platform.consumer import Record
from baton_platform.messages import PoisonMessage
from baton_platform.service import Service
from baton_platform.telemetry import span
from baton_router.exploration import candidates, explores
from baton_router.metrics import PlanningMetrics, PolicyMetrics
from baton_router.planning import Planner
from baton_workflow import CONDUCTOR, from_proto
from baton_workflow.steps import past_deadline, step_task

log = logging.getLogger(__name__)


def kept_answer(request: requests_pb2.ChatRequest, plan: workflow_pb2.Plan, seconds: float) -> workflow_pb2.WorkflowEvent:
    """An inner call that keeps the answer so far: its step of the parent workflow is done, with that
    answer as its output. Keyed by the parent, so it reaches the synthesizer running that workflow."""
    parent = request.parent
    return workflow_pb2.WorkflowEvent(request_id=parent.request_id, step_completed=workflow_pb2.StepCompleted(
        task_id=parent.task_id, step=parent.step, attempt=parent.attempt, worker=CONDUCTOR,
        output=parent.last_answer, latency_ms=seconds * 1000, model=plan.policy_version or plan.backend,
        inner_plan=plan))


def direct_task(request: requests_pb2.ChatRequest, plan: workflow_pb2.Plan,
                workers: Mapping[str, WorkerConfig]) -> tasks_pb2.Task | None:
    """The task that runs this workflow whole at the executor (router.direct_single_step), or None when
    it needs the synthesizer: more than one step, the conductor as its step, a streaming client (its
    progress and deltas), an inner call (its result returns to a parent) or a candidate of an exploration
    group (its outcome may be judged with the others). A step on a worker with a fallback goes too: if it
    fails, its executor hands the workflow to the synthesizer, which moves it to the fallback."""
    if len(plan.steps) != 1 or request.stream or request.HasField("parent") or request.group_size > 1:
        return None
    worker = workers.get(plan.steps[0].worker)
    if worker is None:
        return None
    task = step_task(request, from_proto(plan), 0, 1, worker.name, {})
    task.workflow.CopyFrom(workflow_pb2.WorkflowPlanned(request=request, plan=plan,
                                                        planned_unix_ms=int(time.time() * 1000)))
    return task


def register(service: Service, settings: RouterConfig, planner: Planner, backend=None,
             workers: Sequence[WorkerConfig] = ()) -> None:
    metrics = PlanningMetrics(service.registry)
    tracer = service.tracer_provider.get_tracer("baton.router")
    workflow = service.publisher(topics.WORKFLOW, workflow_pb2.WorkflowEvent, "Plans, and inner calls' kept answers.")
    by_name = {w.name: w for w in workers} if settings.direct_single_step else {}
    tasks = {p: service.publisher(topics.tasks_topic(p), tasks_pb2.Task, f"One-step workflows for the {p} executors.")
             for p in sorted({w.provider for w in by_name.values()})}

    async def plan_request(request: requests_pb2.ChatRequest, record: Record) -> None:
        if not request.request_id:
            raise PoisonMessage("ChatRequest without request_id")
        if past_deadline(request.deadline_unix_ms):
            # Its client already has its 504 (the gateway answers at the deadline): planning it would
            # spend the conductor on an answer nobody waits for, and lengthen a backlog's drain.
            metrics.expired.inc()
            log.info("request %s not planned: its deadline had passed", request.request_id)
            return
        inner = request.HasField("parent")
        explore = not inner and explores(request.request_id, settings.explore_share)
        group = candidates(request, settings.explore_group_size) if explore else [request]
        for candidate in group:
            started = time.perf_counter()
            with span(tracer, "plan") as current:
                result = await planner.plan(candidate)
                current.set_attribute("baton.request_id", candidate.request_id)
                current.set_attribute("baton.plan.steps", len(result.plan.steps))
                current.set_attribute("baton.plan.valid", result.valid)
                current.set_attribute("baton.plan.backend", planner.backend_name)
                if explore:
                    current.set_attribute("baton.group_id", candidate.group_id)
                log.info("request %s planned by %s: %s%s", candidate.request_id, planner.backend_name,
                         " -> ".join(s.worker for s in result.plan.steps) or "no steps",
                         "" if result.valid else " (the conductor's plan was refused: fallback plan)")
            metrics.latency.observe(time.perf_counter() - started)
            metrics.plans.labels(planner.backend_name, "valid" if result.valid else "fallback").inc()
            task = direct_task(candidate, result.plan, by_name) if by_name else None
            if task is not None:
                provider = by_name[task.worker].provider
                await tasks[provider].send(task, key=task.request_id, record=record)
                metrics.direct.labels(provider).inc()
                continue
            if inner and not result.plan.steps:
                event = kept_answer(candidate, result.plan, time.perf_counter() - started)
            else:
                event = workflow_pb2.WorkflowEvent(
                    request_id=candidate.request_id,
                    planned=workflow_pb2.WorkflowPlanned(request=candidate, plan=result.plan,
                                                         planned_unix_ms=int(time.time() * 1000)),
                )
            await workflow.send(event, key=event.request_id, record=record)

    # Offsets are committed in batches (at most every 200 ms), once the plan is acknowledged: one
    # commit round trip per request would cost the router more than planning a static plan.
    service.consumer(topics.REQUESTS, requests_pb2.ChatRequest, plan_request, group=topics.GROUP_ROUTER,
                     tracked=True, commit_every_s=0.2, description="Chat requests to plan.")
    register_policies(service, backend, settings.policy_name, settings.policy_store)


def register_policies(service: Service, backend, name: str, store: str | None = None) -> None:
    """Every router replica reads the whole (small, compacted) policy topic: a published policy is
    served by all of them without a restart; a rollback is an update naming an older one. Updates of
    the other kind are for the other backend ("fast": the policy conductor, "lora": vLLM). A version is
    loaded from a fresh local copy, only when that copy matches the update's digest and, with a
    configured `store`, only from inside it: anything on the bus could have written the record."""
    # Exported by every router, so dashboards and alerts find them; without children when its backend
    # serves no published policy.
    metrics = PolicyMetrics(service.registry)
    kind = getattr(backend, "policy_kind", None)
    if not kind:
        return

    copies: dict[str, str] = {}  # digest -> the verified local copy (a rollback names one seen before)

    async def on_policy(update: policy_pb2.PolicyUpdate, record: Record) -> None:
        if update.kind != kind or (update.name or DEFAULT_POLICY_NAME) != name:
            return
        from baton_policy import verified_copy  # the backends that serve policies install it

        try:
            if update.digest not in copies:
                copies[update.digest] = str(await asyncio.to_thread(verified_copy, update.uri, update.digest, store))
            await backend.serve_policy(copies[update.digest], update.version)
        except Exception as e:  # noqa: BLE001 - a bad artefact must not stop planning with the current one
            log.error("policy %s (%s) not loaded; still serving the previous one: %s", update.version, kind, e)
            metrics.failed.labels(kind).inc()
            raise PoisonMessage(f"policy {update.version} could not be loaded: {e}") from None
        metrics.loaded.labels(update.version, "rollback" if update.rollback else "update").inc()

    service.consumer(topics.POLICY, policy_pb2.PolicyUpdate, on_policy, description="Policy versions to serve.")
