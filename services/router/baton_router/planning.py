"""Turning a request into a valid plan: ask the conductor, check the plan, fall back when it is invalid."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from baton.v1 import requests_pb2, workflow_pb2
from baton_conductor import copies_example
from baton_platform.config import ConductorConfig, WorkerConfig
from baton_router.conductor import ConductorBackend, ConductorOutputError
from baton_router.conductor.base import KEEP
from baton_workflow import CONDUCTOR, Plan, plan_problems, to_proto

log = logging.getLogger(__name__)

# Why a plan that copied the prompt's worked example is refused; the eval table counts copies by it.
COPIED_EXAMPLE = "the plan copies the prompt's worked example instead of planning for the question"


@dataclass(frozen=True)
class PlanResult:
    plan: workflow_pb2.Plan
    valid: bool


class Planner:
    """Plans user requests and inner calls (a step handed to the conductor, `ChatRequest.parent`).

    A plan may name the conductor while the request is shallower than `conductor.max_depth`. An inner
    call may answer with no steps (keep the answer so far); when its plan is invalid, the answer is
    kept too, rather than running the safe plan over a workflow that already has an answer.

    While the prompt shows its worked example, a plan that copies it is refused like any invalid plan:
    its workers would be told to do the example's arithmetic, which answers no user's question (small
    conductors do this; SmolLM2-135M untrained in most plans)."""

    def __init__(self, conductor: ConductorConfig, workers: Sequence[WorkerConfig], backend: ConductorBackend) -> None:
        self._backend = backend
        self._workers = [w.name for w in workers]
        self._max_steps = conductor.max_steps
        self._max_depth = conductor.max_depth
        self._example_shown = conductor.prompt_example
        safe = conductor.safe_plan(workers)
        self._safe = Plan(workers=safe.workers, subtasks=safe.subtasks, access=safe.access)

    @property
    def backend_name(self) -> str:
        return self._backend.name

    async def plan(self, request: requests_pb2.ChatRequest) -> PlanResult:
        inner = request.HasField("parent")
        try:
            proposal = await self._backend.propose(request)
        except ConductorOutputError as e:
            # The model wrote something that is not a plan: keep what it sampled (reward 0 later).
            return self._fallback(f"unparseable plan: {e}", e.policy_version, e.token_logprobs, e.propensity,
                                  e.log_propensity, inner=inner)
        except Exception as e:  # noqa: BLE001 - a broken conductor must not stop the request
            log.exception("conductor %s failed for %s", self._backend.name, request.request_id)
            return self._fallback(f"conductor error: {type(e).__name__}: {e}", policy_version="", inner=inner)
        depth = request.parent.depth if inner else 0
        problems = plan_problems(proposal.plan, [*self._workers, CONDUCTOR], self._max_steps, allow_empty=inner)
        if CONDUCTOR in proposal.plan.workers and depth >= self._max_depth:
            problems.append(f"the conductor may call itself at most {self._max_depth} level(s) deep")
        if self._example_shown and copies_example(proposal.plan.subtasks):
            problems.append(COPIED_EXAMPLE)
        if problems:
            return self._fallback("; ".join(problems), proposal.policy_version, proposal.token_logprobs,
                                  proposal.propensity, proposal.log_propensity, inner=inner)
        plan = to_proto(proposal.plan, backend=self._backend.name, policy_version=proposal.policy_version,
                        token_logprobs=proposal.token_logprobs, propensity=proposal.propensity,
                        log_propensity=proposal.log_propensity,
                        action=proposal.action)
        return PlanResult(plan=plan, valid=True)

    def _fallback(self, reason: str, policy_version: str, token_logprobs=(), propensity: float = 0.0,
                  log_propensity: float | None = None, *, inner: bool = False) -> PlanResult:
        # The episode keeps the invalid plan's log-probs and reason: it earns reward 0 in training.
        plan = to_proto(KEEP if inner else self._safe, backend=self._backend.name, policy_version=policy_version,
                        fallback=True, invalid_reason=reason, token_logprobs=token_logprobs, propensity=propensity,
                        log_propensity=log_propensity)
        return PlanResult(plan=plan, valid=False)
