"""The gate: a candidate policy is published only if it beats the current one off-policy.

Both are scored on held-back logged episodes by the doubly robust estimator: a reward model
predicts every action's reward on each episode, a policy is credited with the prediction for the
actions it would take, and the prediction's error on the logged action is added back weighted by
P(policy takes it) / logged propensity. The added-back term keeps the estimate unbiased whatever
the model's errors (the propensities are the logging policy's own), and a model that explains
part of the reward removes that part from the noise. Without a model it is plain inverse
propensity scoring. The reward model must not have seen the held-back episodes; the candidate's
own heads, fitted on the others, serve.

Both estimates share their episodes, so the decision uses the paired difference and its normal
confidence bound: publish when the lower bound of (candidate − current) is above zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from baton_policy.fastpolicy import Episode

# What a policy does on each episode: the probability of every action, [episodes, actions] in the
# order of the action names given. A row may sum to less than 1 where the policy takes an action
# outside them (a worker no longer configured): that share earns nothing.
ActionProbabilities = Callable[[Sequence[Episode], Sequence[str]], np.ndarray]


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


def dr_values(episodes: Sequence[Episode], actions: Sequence[str], probs: np.ndarray,
              predicted: np.ndarray | None = None, cost_weight: float = 0.0, clip: float = 0.01) -> np.ndarray:
    """Per-episode doubly robust terms: Σ_a π(a)·r̂(a) + π(logged)·(r − r̂(logged)) / propensity,
    with r = reward − cost_weight × cost; ``predicted`` r̂ is [episodes, actions] (None: 0, i.e. IPS)."""
    index = {a: j for j, a in enumerate(actions)}
    r_hat = np.zeros((len(episodes), len(actions))) if predicted is None else np.asarray(predicted, dtype=float)
    out = (probs * r_hat).sum(1)
    for i, e in enumerate(episodes):
        j = index.get(e.action)
        if j is not None and probs[i, j] > 0:
            r = e.reward - cost_weight * (e.cost or 0.0)
            out[i] += probs[i, j] * (r - r_hat[i, j]) / max(e.propensity, clip)
    return out


def greedy(policy) -> ActionProbabilities:
    """The policy's own choice (exploration off) on each episode."""
    def probs(episodes: Sequence[Episode], actions: Sequence[str]) -> np.ndarray:
        values = policy.values([e.prompt for e in episodes], [e.eval_name for e in episodes])
        index = {a: j for j, a in enumerate(actions)}
        out = np.zeros((len(episodes), len(actions)))
        for i, a in enumerate(policy.choose_index(values)):
            j = index.get(policy.workflows[a].name)
            if j is not None:
                out[i, j] = 1.0
        return out
    return probs


def uniform(n_actions: int) -> ActionProbabilities:
    return lambda episodes, actions: np.full((len(episodes), len(actions)), 1.0 / n_actions)


def compare(episodes: Sequence[Episode], candidate: ActionProbabilities, current: ActionProbabilities, *,
            actions: Sequence[str] | None = None, predicted: np.ndarray | None = None,
            cost_weight: float = 0.0, z: float = 1.96) -> GateResult:
    """Candidate against current on ``episodes``; ``actions`` names the columns (default: the logged
    actions) and ``predicted`` is the reward model's [episodes, actions] prediction, if any."""
    if not episodes:
        raise ValueError("the gate needs held-back episodes")
    if actions is None:
        if predicted is not None:
            raise ValueError("a reward model's predictions need the action names of their columns")
        actions = sorted({e.action for e in episodes})
    c = dr_values(episodes, actions, candidate(episodes, actions), predicted, cost_weight)
    b = dr_values(episodes, actions, current(episodes, actions), predicted, cost_weight)
    d = c - b
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
    diff = float(d.mean())
    lower, upper = diff - z * se, diff + z * se
    return GateResult(float(c.mean()), float(b.mean()), diff, lower, upper, len(d), publish=lower > 0)
