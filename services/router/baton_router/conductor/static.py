"""The baseline conductor: the same configured plan for every query."""

from __future__ import annotations

from baton.v1 import requests_pb2
from baton_platform.config import StaticPlan
from baton_workflow import Plan

from baton_router.conductor.base import Proposal


class StaticConductor:
    name = "static"

    def __init__(self, plan: StaticPlan) -> None:
        self._plan = Plan(workers=plan.workers, subtasks=plan.subtasks, access=plan.access)

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        # Deterministic, so the propensity of the chosen plan is 1.
        return Proposal(plan=self._plan, policy_version="static", propensity=1.0)

    async def aclose(self) -> None:
        return None
