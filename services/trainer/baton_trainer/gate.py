"""The gate: a candidate policy is published only if it beats the current one off-policy.

Both are scored on held-back logged episodes by inverse propensity scoring: an episode counts for a
policy when that policy would have made the logged choice, weighted by 1/propensity. The two
estimates share their episodes, so the decision uses the paired difference and its normal
confidence bound: publish when the lower bound of (candidate − current) is above zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from baton_policy.fastpolicy import Episode

# The probability that a policy takes the logged action of an episode (1 or 0 for a greedy policy).
ActionProbability = Callable[[Episode], float]


@dataclass(frozen=True)
class GateResult:
    candidate: float
    current: float
    difference: float
    lower: float
    upper: float
    episodes: int
    publish: bool

    def as_dict(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def ips_values(episodes: Sequence[Episode], prob: ActionProbability, cost_weight: float = 0.0,
               clip: float = 0.01) -> np.ndarray:
    """Per-episode IPS terms: reward × P(policy takes the logged action) / logged propensity."""
    out = np.zeros(len(episodes))
    for i, e in enumerate(episodes):
        p = prob(e)
        if p > 0:
            out[i] = p * (e.reward - cost_weight * (e.cost or 0.0)) / max(e.propensity, clip)
    return out


def greedy(policy) -> ActionProbability:
    return lambda e: float(policy.choose(e.prompt, e.eval_name, epsilon=0.0).workflow == e.action)


def uniform(actions: int) -> ActionProbability:
    return lambda e: 1.0 / actions


def compare(episodes: Sequence[Episode], candidate: ActionProbability, current: ActionProbability, *,
            cost_weight: float = 0.0, z: float = 1.96) -> GateResult:
    if not episodes:
        raise ValueError("the gate needs held-back episodes")
    c = ips_values(episodes, candidate, cost_weight)
    b = ips_values(episodes, current, cost_weight)
    d = c - b
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
    diff = float(d.mean())
    lower, upper = diff - z * se, diff + z * se
    return GateResult(float(c.mean()), float(b.mean()), diff, lower, upper, len(d), publish=lower > 0)
