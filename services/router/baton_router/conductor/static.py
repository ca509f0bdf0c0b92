"""The baseline conductor: the same configured plan for every query."""

from __future__ import annotations

from baton.v1 import requests_pb2
from baton_platform.config import StaticPlan
from baton_router.conductor.base import KEEP, Proposal
from baton_workflow import Plan


class StaticConductor:
    name = "static"

    def __init__(self, plan: StaticPlan, inner_plan: StaticPlan | None = None) -> None:
        self._plan = Plan(workers=plan.workers, subtasks=plan.subtasks, access=plan.access)
        # Called as a step (the conductor worker): the configured inner plan, else keep the answer.
        self._inner = KEEP if inner_plan is None else Plan(workers=inner_plan.workers, subtasks=inner_plan.subtasks,
                                                           access=inner_plan.access)

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        # Deterministic, so the propensity of the chosen plan is 1.
        plan = self._inner if request.HasField("parent") else self._plan
        return Proposal(plan=plan, policy_version="static", propensity=1.0)

    async def aclose(self) -> None:
        return None
