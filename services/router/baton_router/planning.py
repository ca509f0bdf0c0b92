"""Turning a request into a valid plan: ask the conductor, check the plan, fall back when it is invalid."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from baton.v1 import requests_pb2, workflow_pb2
from baton_platform.config import BatonConfig
from baton_workflow import Plan, plan_problems, to_proto

from baton_router.conductor import ConductorBackend, ConductorOutputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanResult:
    plan: workflow_pb2.Plan
    valid: bool


class Planner:
    def __init__(self, config: BatonConfig, backend: ConductorBackend) -> None:
        self._backend = backend
        self._workers = [w.name for w in config.workers]
        self._max_steps = config.conductor.max_steps
        safe = config.safe_plan()
        self._safe = Plan(workers=safe.workers, subtasks=safe.subtasks, access=safe.access)

    @property
    def backend_name(self) -> str:
        return self._backend.name

    async def plan(self, request: requests_pb2.ChatRequest) -> PlanResult:
        try:
            proposal = await self._backend.propose(request)
        except ConductorOutputError as e:
            # The model wrote something that is not a plan: keep what it sampled (reward 0 later).
            return self._fallback(f"unparseable plan: {e}", e.policy_version, e.token_logprobs, e.propensity)
        except Exception as e:  # noqa: BLE001 - a broken conductor must not stop the request
            log.exception("conductor %s failed for %s", self._backend.name, request.request_id)
            return self._fallback(f"conductor error: {type(e).__name__}: {e}", policy_version="")
        problems = plan_problems(proposal.plan, self._workers, self._max_steps)
        if problems:
            return self._fallback("; ".join(problems), proposal.policy_version, proposal.token_logprobs,
                                  proposal.propensity)
        plan = to_proto(proposal.plan, backend=self._backend.name, policy_version=proposal.policy_version,
                        token_logprobs=proposal.token_logprobs, propensity=proposal.propensity,
                        action=proposal.action)
        return PlanResult(plan=plan, valid=True)

    def _fallback(self, reason: str, policy_version: str, token_logprobs=(), propensity: float = 0.0) -> PlanResult:
        # The episode keeps the invalid plan's log-probs and reason: it earns reward 0 in training.
        plan = to_proto(self._safe, backend=self._backend.name, policy_version=policy_version, fallback=True,
                        invalid_reason=reason, token_logprobs=token_logprobs, propensity=propensity)
        return PlanResult(plan=plan, valid=False)
