"""The `policy` conductor: a learned CPU policy (query → workflow) from the trainer, hot-swappable.

Until a policy is loaded it plans like a logging policy should: one step on a worker chosen
uniformly at random, with propensity 1/K, so the first traffic already teaches the trainer.
A policy's choice (a worker, a vote or panel of workers, an escalation) becomes a plan: one step
per worker reading nothing, plus a final step by the first worker that reads them all.

The configuration may differ from what the policy was trained on. A configured worker the policy
does not know gets traffic from the first request and is learned online from the graded episodes on
baton.rewards (:mod:`baton_policy.newcomers`); a worker taken out of the configuration gets none.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from baton.v1 import requests_pb2, rewards_pb2
from baton_platform.config import PolicyConductorConfig, WorkerConfig
from baton_workflow import Plan, policy_query, query_text

if TYPE_CHECKING:  # scikit-learn and scipy load only when a policy does
    from baton_policy.fastpolicy import Policy
    from baton_policy.newcomers import Newcomers

from baton_router.conductor.base import KEEP, Proposal

log = logging.getLogger(__name__)

ANSWER = "Answer the question. End with the final answer."
COMBINE = "Several answers to the question are above. Give the answer most of them support, in the same format."


# Rewards kept to teach the heads of a policy loaded later (a restart replays the topic into it).
RECENT_REWARDS = 50_000


@dataclass
class Loaded:
    version: str
    uri: str
    policy: Policy
    newcomers: Newcomers | None = None  # when the workers differ from those the policy was trained on


class PolicyConductor:
    name = "policy"
    policy_kind = "fast"  # the PolicyUpdate kind this backend serves

    def __init__(self, settings: PolicyConductorConfig, workers: Sequence[WorkerConfig],
                 rng: random.Random | None = None) -> None:
        self._workers = [w.name for w in workers]
        # The trainer names models as the outcome data does (a sim worker's matrix column).
        self._by_model = {(w.sim.column if w.sim and w.sim.column else w.model): w.name for w in workers}
        self._model_of = {name: model for model, name in self._by_model.items()}
        self._epsilon = settings.epsilon
        self._share = settings.new_worker_share
        price = {w.name: w.price.per_mtok for w in workers}
        self._price = {model: price[name] for model, name in self._by_model.items()}
        self._recent: deque[rewards_pb2.Reward] = deque(maxlen=RECENT_REWARDS)
        self._rng = rng or random.Random()
        self._np_rng = np.random.default_rng(self._rng.getrandbits(64))
        self._current: Loaded | None = None
        self.history: list[Loaded] = []
        if settings.path:
            self.load(str(settings.path), settings.version or "initial")

    @property
    def version(self) -> str:
        return self._current.version if self._current else "uniform"

    def load(self, uri: str, version: str) -> None:
        """Load a published policy and serve it from the next request on."""
        from baton_policy import local_copy
        from baton_policy.fastpolicy import Policy

        policy = Policy.load(local_copy(uri))
        loaded = Loaded(version, uri, policy, self._newcomers(policy, version))
        self._current = loaded
        self.history.append(loaded)
        if loaded.newcomers is not None:
            # Loads run in a thread while rewards keep arriving: a copy to read, and an episode
            # that both paths apply counts once (Newcomers.update is idempotent per episode).
            for reward in list(self._recent):
                self._apply(loaded, reward)
        log.info("serving policy %s from %s", version, uri)

    def _newcomers(self, policy, version: str):
        from baton_policy.newcomers import Newcomers

        trained = {m for w in policy.workflows for m in w.workers}
        removed = sorted(trained - set(self._by_model))
        if all(set(w.workers) & set(removed) for w in policy.workflows):
            raise ValueError(f"policy {version} uses models no configured worker serves: {removed}")
        new = [m for m in self._by_model if m not in trained]
        if not new and not removed:
            return None
        costs = {m: self._cost_in_policy_units(policy, m) for m in new}
        log.info("policy %s: learning new workers %s online; removed workers %s get no traffic", version, new, removed)
        return Newcomers(policy, costs, share=self._share, removed=removed)

    def _cost_in_policy_units(self, policy, model: str) -> float:
        """A new worker's configured price, in the units of the policy's costs (its training data's):
        scaled by the known workers' ratio of policy cost to configured price."""
        singles = {w.workers[0]: float(policy.mean_costs[a]) for a, w in enumerate(policy.workflows) if w.kind == "single"}
        ratios = [c / self._price[m] for m, c in singles.items() if self._price.get(m, 0) > 0 and c > 0]
        if ratios:
            return self._price[model] * float(np.median(ratios))
        return float(np.median(list(singles.values()))) if singles else 0.0

    def learn(self, reward: rewards_pb2.Reward) -> bool:
        """Take one graded episode from baton.rewards; True when it taught a new worker's head."""
        self._recent.append(reward)
        current = self._current
        return current is not None and current.newcomers is not None and self._apply(current, reward)

    @staticmethod
    def _apply(loaded: Loaded, reward: rewards_pb2.Reward) -> bool:
        assert loaded.newcomers is not None
        return loaded.newcomers.update(reward.query, reward.eval_name or None, reward.action, reward.quality,
                                       reward.request_id)

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
        answer = request.answer
        query = policy_query(query_text([{"role": m.role, "content": m.content} for m in request.messages]),
                             [t.name for t in answer.tools], answer.response_format)
        eval_name = request.metadata.get("eval_name") or None
        if current.newcomers is not None:
            choice = await asyncio.to_thread(current.newcomers.choose, query, eval_name, epsilon=self._epsilon,
                                             rng=self._np_rng)
        else:
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
