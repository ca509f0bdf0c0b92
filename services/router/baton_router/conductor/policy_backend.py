"""The `policy` conductor: a learned CPU policy (query → workflow) from the trainer, hot-swappable.

Until a policy is loaded it plans like a logging policy should: one step on a worker chosen
uniformly at random, with propensity 1/K, so the first traffic already teaches the trainer.
A policy's choice (a worker, a vote or panel of workers, an escalation) becomes a plan: one step
per worker reading nothing, plus a final step by the first worker that reads them all.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from baton.v1 import requests_pb2
from baton_platform.config import BatonConfig
from baton_workflow import Plan, query_text

from baton_router.conductor.base import KEEP, Proposal

log = logging.getLogger(__name__)

ANSWER = "Answer the question. End with the final answer."
COMBINE = "Several answers to the question are above. Give the answer most of them support, in the same format."


@dataclass
class Loaded:
    version: str
    uri: str
    policy: object  # baton_policy.fastpolicy.Policy; imported lazily (numpy/scikit-learn)


class PolicyConductor:
    name = "policy"
    policy_kind = "fast"  # the PolicyUpdate kind this backend serves

    def __init__(self, config: BatonConfig, rng: random.Random | None = None) -> None:
        self._workers = [w.name for w in config.workers]
        # The trainer names models as the outcome data does (a sim worker's matrix column).
        self._by_model = {(w.sim.column if w.sim and w.sim.column else w.model): w.name for w in config.workers}
        self._model_of = {name: model for model, name in self._by_model.items()}
        self._epsilon = config.conductor.policy.epsilon
        self._rng = rng or random.Random()
        self._current: Loaded | None = None
        self.history: list[Loaded] = []
        if config.conductor.policy.path:
            self.load(str(config.conductor.policy.path), config.conductor.policy.version or "initial")

    @property
    def version(self) -> str:
        return self._current.version if self._current else "uniform"

    def load(self, uri: str, version: str) -> None:
        """Load a published policy and serve it from the next request on."""
        from baton_policy.fastpolicy import Policy
        from baton_policy import local_copy

        policy = Policy.load(local_copy(uri))
        missing = sorted({m for w in policy.workflows for m in w.workers} - set(self._by_model))
        if missing:
            raise ValueError(f"policy {version} uses models no configured worker serves: {missing}")
        self._current = Loaded(version, uri, policy)
        self.history.append(self._current)
        log.info("serving policy %s from %s", version, uri)

    async def serve_policy(self, uri: str, version: str) -> None:
        await asyncio.to_thread(self.load, uri, version)

    async def propose(self, request: requests_pb2.ChatRequest) -> Proposal:
        if request.HasField("parent"):
            # The learned policy chooses whole workflows and never names the conductor; a static
            # plan that does gets the answer kept.
            return Proposal(plan=KEEP, policy_version="keep", propensity=1.0)
        current = self._current
        if current is None:
            worker = self._rng.choice(self._workers)
            plan = Plan(workers=[worker], subtasks=[ANSWER], access=[[]])
            # The action is named as a learned policy names it: by the worker's model.
            return Proposal(plan=plan, policy_version="uniform", propensity=1 / len(self._workers),
                            action=self._model_of[worker])
        query = query_text([{"role": m.role, "content": m.content} for m in request.messages])
        eval_name = request.metadata.get("eval_name") or None
        choice = await asyncio.to_thread(current.policy.choose, query, eval_name, epsilon=self._epsilon)
        names = [self._by_model[m] for m in choice.workers]
        return Proposal(plan=plan_for(names), policy_version=current.version, propensity=choice.propensity,
                        action=choice.workflow)

    async def aclose(self) -> None:
        return None


def plan_for(workers: list[str]) -> Plan:
    if len(workers) == 1:
        return Plan(workers=workers, subtasks=[ANSWER], access=[[]])
    n = len(workers)
    return Plan(workers=[*workers, workers[0]], subtasks=[ANSWER] * n + [COMBINE], access=[[]] * n + ["all"])
